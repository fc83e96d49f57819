// See ops.h. Accumulations that feed a normalisation run in double so the CPU
// stays the accurate side of every CPU-vs-GPU comparison.
#include "backend/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/expf.h"
#include "backend/cpu/parallel.h"
#include "base/fp16.h"
#include "quant/simd_path.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tern::backend::cpu {

// Elementwise work below this many values is not worth waking threads for:
// a decode step runs hundreds of these small ops per token.
constexpr int64_t kParallelMin = 1 << 15;

void rms_norm(const float* x, const float* w, float eps, float* out, int64_t rows, int64_t cols) {
    parallel_for(rows, rows * cols >= kParallelMin, [&](int64_t r) {
        const float* xr = x + r * cols;
        float* o = out + r * cols;
        double ss = 0.0;
        for (int64_t i = 0; i < cols; ++i) ss += double(xr[i]) * double(xr[i]);
        const float inv = float(1.0 / std::sqrt(ss / double(cols) + double(eps)));
        for (int64_t i = 0; i < cols; ++i) o[i] = xr[i] * inv * (w ? w[i] : 1.0f);
    });
}

void rope_table(const int32_t* pos, int64_t rows, const RopeParams& rope, const float* freq_factors, RopeTable& out) {
    const int half = rope.n_dims / 2;
    // inv_freq[i] = base^(-2i/n_dims) / factor[i]
    std::vector<double> inv_freq(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) {
        inv_freq[size_t(i)] = std::pow(double(rope.freq_base), -2.0 * i / double(rope.n_dims));
        if (freq_factors) inv_freq[size_t(i)] /= double(freq_factors[i]);
    }
    out.half = half;
    out.cos.resize(size_t(rows) * size_t(half));
    out.sin.resize(size_t(rows) * size_t(half));
    parallel_for(rows, rows * half >= kParallelMin / 8, [&](int64_t t) {
        const double p = double(pos[t]) * double(rope.freq_scale);
        float* c = out.cos.data() + t * half;
        float* s = out.sin.data() + t * half;
        for (int i = 0; i < half; ++i) {
            const double a = p * inv_freq[size_t(i)];
            c[i] = float(std::cos(a) * double(rope.attn_factor));
            s[i] = float(std::sin(a) * double(rope.attn_factor));
        }
    });
}

void rope_apply(float* x, int64_t rows, int n_heads, int head_dim, bool neox, const RopeTable& table) {
    const int half = table.half;
    parallel_for(rows, rows * n_heads * head_dim >= kParallelMin, [&](int64_t t) {
        const float* c = table.cos.data() + t * half;
        const float* s = table.sin.data() + t * half;
        for (int h = 0; h < n_heads; ++h) {
            float* v = x + t * int64_t(n_heads) * head_dim + int64_t(h) * head_dim;
            for (int i = 0; i < half; ++i) {
                // interleaved pairs (2i, 2i+1), or NeoX pairs (i, i + n_dims/2)
                const int a = neox ? i : 2 * i;
                const int b = neox ? i + half : 2 * i + 1;
                const float x0 = v[a], x1 = v[b];
                v[a] = x0 * c[i] - x1 * s[i];
                v[b] = x0 * s[i] + x1 * c[i];
            }
        }
    });
}

void rope(float* x, int64_t rows, int n_heads, int head_dim, const int32_t* pos, const RopeParams& rope,
          const float* freq_factors) {
    RopeTable table;
    rope_table(pos, rows, rope, freq_factors, table);
    rope_apply(x, rows, n_heads, head_dim, rope.neox, table);
}

namespace {

void swiglu_portable(float* gate, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        gate[i] = g / (1.0f + expf_glibc(-g)) * up[i];
    }
}

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void swiglu_avx2(float* gate, const float* up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 e = expf_glibc_avx2(_mm256_xor_ps(g, sign));
        _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
    }
    swiglu_portable(gate + i, up + i, n - i);
}
#endif

// gate = act(gate) * up in pieces of kPiece values on the threads, each by
// the AVX2 form where `path` allows it (avx2_form null: none).
using GatedForm = void (*)(float* gate, const float* up, int64_t n);
void gated_in_pieces(float* gate, const float* up, int64_t n, quant::SimdPath path, GatedForm portable,
                     GatedForm avx2_form) {
    const bool avx2 = avx2_form && path != quant::SimdPath::scalar &&
                      quant::simd_path_available(quant::SimdPath::avx2);
    const GatedForm form = avx2 ? avx2_form : portable;
    constexpr int64_t kPiece = 4096;  // values a thread takes at once
    const int64_t pieces = (n + kPiece - 1) / kPiece;
    parallel_for(pieces, n >= kParallelMin, [&](int64_t c) {
        const int64_t i = c * kPiece;
        form(gate + i, up + i, std::min(kPiece, n - i));
    });
}

#if defined(__x86_64__)
constexpr GatedForm kSwigluAvx2 = swiglu_avx2, kGegluAvx2 = detail::geglu_avx2;
#else
constexpr GatedForm kSwigluAvx2 = nullptr, kGegluAvx2 = nullptr;
#endif

}  // namespace

void swiglu(float* gate, const float* up, int64_t n, quant::SimdPath path) {
    gated_in_pieces(gate, up, n, path, swiglu_portable, kSwigluAvx2);
}

void geglu(float* gate, const float* up, int64_t n, quant::SimdPath path) {
    gated_in_pieces(gate, up, n, path, detail::geglu_portable, kGegluAvx2);
}

void scale(float* x, float s, int64_t n) {
    parallel_for(n, n >= kParallelMin, [&](int64_t i) { x[i] *= s; });
}

void route_top_k(const float* logits, int n_expert, int k, int32_t* ids, float* weights) {
    auto key = [&](int e) { return std::isnan(logits[e]) ? -INFINITY : logits[e]; };
    uint64_t taken[(kMaxExperts + 63) / 64] = {};
    for (int j = 0; j < k; ++j) {
        int best = -1;
        for (int e = 0; e < n_expert; ++e) {
            if (taken[e >> 6] >> (e & 63) & 1) continue;
            if (best < 0 || key(e) > key(best)) best = e;  // strictly greater: ties keep the lower index
        }
        taken[best >> 6] |= uint64_t(1) << (best & 63);
        ids[j] = best;
    }
    // A NaN logit weighs as -inf too: an expert chosen only because fewer than
    // k logits are numbers gets weight 0 instead of making the token NaN.
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) sum += (weights[j] = std::exp(key(ids[j]) - key(ids[0])));
    for (int j = 0; j < k; ++j) weights[j] /= sum;
}

namespace {

int64_t argmax_first_portable(const float* x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i)
        if (x[i] > -INFINITY && (best < 0 || x[i] > x[best])) best = i;  // strictly greater: the first wins
    return best;
}

#if defined(__x86_64__)
// Gemma 3's 262,144 logits in about 22 us where the loop above, one
// dependent compare an entry, takes 210 (Gemma 3 270M decodes a token in
// about 1,400 us on an H200).
__attribute__((target("avx2"))) int64_t argmax_first_avx2(const float* x, int64_t n) {
    // max(v, m) returns m where v is NaN, so NaN never becomes the maximum.
    const __m256 none = _mm256_set1_ps(-INFINITY);
    __m256 m0 = none, m1 = none, m2 = none, m3 = none;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
        m1 = _mm256_max_ps(_mm256_loadu_ps(x + i + 8), m1);
        m2 = _mm256_max_ps(_mm256_loadu_ps(x + i + 16), m2);
        m3 = _mm256_max_ps(_mm256_loadu_ps(x + i + 24), m3);
    }
    for (; i + 8 <= n; i += 8) m0 = _mm256_max_ps(_mm256_loadu_ps(x + i), m0);
    alignas(32) float lane[8];
    _mm256_store_ps(lane, _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3)));
    float best = -INFINITY;
    for (float v : lane) best = v > best ? v : best;
    for (; i < n; ++i) best = x[i] > best ? x[i] : best;
    if (!(best > -INFINITY)) return -1;
    // +0 and -0 compare equal here as in the loop: the first of either wins.
    const __m256 b = _mm256_set1_ps(best);
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        if (const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + j), b, _CMP_EQ_OQ)))
            return j + __builtin_ctz(unsigned(hit));
    for (; j < n; ++j)
        if (x[j] == best) return j;
    return -1;  // not reached: best is one of the values
}
#endif

}  // namespace

int64_t argmax_first(const float* x, int64_t n, quant::SimdPath path) {
#if defined(__x86_64__)
    if (path != quant::SimdPath::scalar && quant::simd_path_available(quant::SimdPath::avx2))
        return argmax_first_avx2(x, n);
#endif
    return argmax_first_portable(x, n);
}

namespace {

#if defined(__x86_64__)
// Hardware conversion gives exactly the values fp16_to_fp32 gives, 8 at a time.
__attribute__((target("f16c,avx"))) void fp16_row_to_fp32_f16c(const uint16_t* src, float* dst, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
    for (; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

// Round to nearest even, as fp32_to_fp16; a NaN keeps its sign and top ten
// payload bits and becomes quiet, as fp32_to_fp16 makes it.
__attribute__((target("f16c,avx"))) void fp32_row_to_fp16_f16c(const float* src, uint16_t* dst, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}
#endif

}  // namespace

void detail::fp32_row_to_fp16(const float* src, uint16_t* dst, int64_t n, quant::SimdPath path) {
#if defined(__x86_64__)
    if (path != quant::SimdPath::scalar && quant::simd_path_available(quant::SimdPath::avx2))
        return fp32_row_to_fp16_f16c(src, dst, n);
#endif
    for (int64_t i = 0; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

void detail::fp16_row_to_fp32(const uint16_t* src, float* dst, int n) {
#if defined(__x86_64__)
    static const bool f16c = quant::simd_path_available(quant::SimdPath::avx2);
    if (f16c) return fp16_row_to_fp32_f16c(src, dst, n);
#endif
    for (int i = 0; i < n; ++i) dst[i] = fp16_to_fp32(src[i]);
}

void attention_tile(const AttentionTile& a, const KvRows& k, const KvRows& v, int kv_head, int head_dim, float scale,
                    quant::SimdPath path) {
#if defined(__x86_64__)
    if (path != quant::SimdPath::scalar && quant::simd_path_available(quant::SimdPath::avx2))
        return detail::attention_tile_avx2(a, k, v, kv_head, head_dim, scale);
#endif
    constexpr int T = kAttentionTileTokens;
    const size_t hd = static_cast<size_t>(head_dim), nq = static_cast<size_t>(a.n_q);
    detail::TileSoftmax st(a, head_dim);
    std::vector<float> kf(hd), vf(hd);
    for (int p = st.lo; p <= st.hi; ++p) {
        detail::fp16_row_to_fp32(k.row(p) + int64_t(kv_head) * head_dim, kf.data(), head_dim);
        detail::fp16_row_to_fp32(v.row(p) + int64_t(kv_head) * head_dim, vf.data(), head_dim);
        for (size_t j = 0; j < nq; ++j) {
            float dot[T] = {};
            const float* qj = st.qt.data() + j * hd * T;
            for (size_t i = 0; i < hd; ++i)
                for (int t = 0; t < T; ++t) dot[t] += qj[i * T + size_t(t)] * kf[i];
            for (int t = 0; t < a.n_t; ++t) {
                if (p < a.first[t] || p > a.last[t]) continue;
                const size_t jt = j * T + size_t(t);
                const float s = dot[t] * scale;
                const float m_new = std::max(st.m[jt], s);
                const float correction = expf_glibc(st.m[jt] - m_new);  // exp(-inf) = 0 on the first step
                const float w = expf_glibc(s - m_new);
                st.l[jt] = st.l[jt] * correction + w;
                float* at = st.acc.data() + jt * hd;
                for (size_t i = 0; i < hd; ++i) at[i] = at[i] * correction + w * vf[i];
                st.m[jt] = m_new;
            }
        }
    }
    st.write(a, head_dim);
}

namespace detail {

TileSoftmax::TileSoftmax(const AttentionTile& a, int head_dim) {
    constexpr int T = kAttentionTileTokens;
    const size_t hd = static_cast<size_t>(head_dim), nq = static_cast<size_t>(a.n_q);
    qt.assign(nq * hd * T, 0.0f);
    acc.assign(nq * T * hd, 0.0f);
    m.assign(nq * T, -INFINITY);
    l.assign(nq * T, 0.0f);
    lo = a.first[0], hi = a.last[0];
    for (int t = 0; t < a.n_t; ++t) {
        lo = std::min(lo, a.first[t]);
        hi = std::max(hi, a.last[t]);
        for (size_t j = 0; j < nq; ++j)
            for (size_t i = 0; i < hd; ++i) qt[(j * hd + i) * T + size_t(t)] = a.q[t * a.q_stride + int64_t(j * hd + i)];
    }
}

void TileSoftmax::write(const AttentionTile& a, int head_dim) const {
    constexpr int T = kAttentionTileTokens;
    const size_t hd = static_cast<size_t>(head_dim), nq = static_cast<size_t>(a.n_q);
    for (int t = 0; t < a.n_t; ++t)
        for (size_t j = 0; j < nq; ++j) {
            const size_t jt = j * T + size_t(t);
            const float inv = l[jt] > 0.0f ? 1.0f / l[jt] : 0.0f;
            float* o = a.out + t * a.out_stride + int64_t(j * hd);
            for (size_t i = 0; i < hd; ++i) o[i] = acc[jt * hd + i] * inv;
        }
}

}  // namespace detail

void attention_kv_group(const float* q, int n_q, const KvRows& k, const KvRows& v, int first, int n_pos, int kv_head,
                        int head_dim, float scale, float* out, quant::SimdPath path) {
#if defined(__x86_64__)
    if (n_pos > 0 && path != quant::SimdPath::scalar && quant::simd_path_available(quant::SimdPath::avx2)) {
        const int last = first + n_pos - 1;
        const int64_t row = int64_t(n_q) * head_dim;
        return detail::attention_tile_avx2(AttentionTile{q, row, 1, n_q, &first, &last, out, row}, k, v, kv_head,
                                           head_dim, scale);
    }
#endif
    const size_t hd = static_cast<size_t>(head_dim);
    std::vector<float> kf(hd), vf(hd), acc(hd * size_t(n_q), 0.0f);
    // Per query head: running max m, running denominator l, running numerator acc.
    std::vector<float> m(static_cast<size_t>(n_q), -INFINITY), l(static_cast<size_t>(n_q), 0.0f);
    for (int p = first; p < first + n_pos; ++p) {
        detail::fp16_row_to_fp32(k.row(p) + int64_t(kv_head) * head_dim, kf.data(), head_dim);
        detail::fp16_row_to_fp32(v.row(p) + int64_t(kv_head) * head_dim, vf.data(), head_dim);
        for (int j = 0; j < n_q; ++j) {
            const float* qj = q + size_t(j) * hd;
            float dot = 0.0f;
            for (size_t i = 0; i < hd; ++i) dot += qj[i] * kf[i];
            const float s = dot * scale;
            const float m_new = std::max(m[size_t(j)], s);
            const float correction = expf_glibc(m[size_t(j)] - m_new);  // exp(-inf) = 0 on the first step
            const float w = expf_glibc(s - m_new);
            l[size_t(j)] = l[size_t(j)] * correction + w;
            float* a = acc.data() + size_t(j) * hd;
            for (size_t i = 0; i < hd; ++i) a[i] = a[i] * correction + w * vf[i];
            m[size_t(j)] = m_new;
        }
    }
    for (int j = 0; j < n_q; ++j) {
        const float inv = l[size_t(j)] > 0.0f ? 1.0f / l[size_t(j)] : 0.0f;
        for (size_t i = 0; i < hd; ++i) out[size_t(j) * hd + i] = acc[size_t(j) * hd + i] * inv;
    }
}

}  // namespace tern::backend::cpu
