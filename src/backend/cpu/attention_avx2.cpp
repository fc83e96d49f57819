// The CPU attention on AVX2 vectors: the arithmetic of the portable forms in
// ops.cpp, lane for lane (each product rounded, then each sum; this file is
// built without fused multiply-adds, and e^ is expf_glibc in both), so every
// token gets the same bits. What changes is the schedule.
//
// A prefill tile (attention_tile_avx2):
//   - the q·k sums of several query heads and positions run side by side,
//     independent chains where the portable form waits on one at a time;
//   - the V update runs eight floats to a vector;
//   - a position that leaves a token's running maximum where it was skips
//     the rescaling: exp(m - m) is exactly 1, and a product by 1 is exact.
// One token (attention_one_token_avx2, every decode step):
//   - K rows are taken sixteen positions at a time and transposed, so that
//     each position's q·k is one lane of a vector, summed in element order;
//   - the running maximum steps through the block in position order, then
//     the block's weights and rescalings come from vector exponentials;
//   - the V update keeps a head's numerator in registers for the block.
// Compiled with -mavx2 -mfma -mf16c -ffp-contract=off and called only where the
// CPU has AVX2 (cpu::attention_tile and cpu::attention_kv_group pick it).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/expf.h"
#include "backend/cpu/ops.h"

namespace tern::backend::cpu::detail {
namespace {

constexpr int T = kAttentionTileTokens;
static_assert(T == 8, "a head's tile of tokens is one vector of eight floats");

// dots[(p * NB + b) * T + t] = q·k of head b of the block (qt: [b][i][T]) and
// position p of the block (kf: [p][i]), token t: NB * PB sums, each in element order.
template <int NB, int PB>
void block_dots(const float* qt, const float* kf, size_t hd, float* dots) {
    __m256 acc[PB][NB];
    for (int p = 0; p < PB; ++p)
        for (int b = 0; b < NB; ++b) acc[p][b] = _mm256_setzero_ps();
    for (size_t i = 0; i < hd; ++i) {
        __m256 q[NB];
        for (int b = 0; b < NB; ++b) q[b] = _mm256_loadu_ps(qt + (size_t(b) * hd + i) * T);
        for (int p = 0; p < PB; ++p) {
            const __m256 k = _mm256_set1_ps(kf[size_t(p) * hd + i]);
            for (int b = 0; b < NB; ++b) acc[p][b] = _mm256_add_ps(acc[p][b], _mm256_mul_ps(q[b], k));
        }
    }
    for (int p = 0; p < PB; ++p)
        for (int b = 0; b < NB; ++b) _mm256_storeu_ps(dots + (p * NB + b) * T, acc[p][b]);
}

using BlockDots = void (*)(const float*, const float*, size_t, float*);

template <int NB>
BlockDots dots_for(int positions) {
    switch (positions) {
        case 1: return block_dots<NB, 1>;
        case 2: return block_dots<NB, 2>;
        case 3: return block_dots<NB, 3>;
        default: return block_dots<NB, 4>;
    }
}
// heads 1..4, positions 1..4.
BlockDots dots_for(int heads, int positions) {
    switch (heads) {
        case 1: return dots_for<1>(positions);
        case 2: return dots_for<2>(positions);
        case 3: return dots_for<3>(positions);
        default: return dots_for<4>(positions);
    }
}

// Heads and positions a block takes: about eight chains, enough to hide the
// adds' latency, within the sixteen vector registers.
struct Blocking {
    int heads, positions;
};
Blocking blocking(int n_heads) {
    switch (std::min(n_heads, 4)) {
        case 1: return {1, 4};
        case 2: return {2, 4};
        case 3: return {3, 2};
        default: return {4, 2};
    }
}

// acc = acc * correction + w * v, as the portable form computes it.
void rescale_add(float* acc, float correction, float w, const float* v, size_t hd) {
    const __m256 wv = _mm256_set1_ps(w);
    size_t i = 0;
    if (correction == 1.0f) {
        for (; i + 8 <= hd; i += 8)
            _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_mul_ps(wv, _mm256_loadu_ps(v + i))));
    } else {
        const __m256 c = _mm256_set1_ps(correction);
        for (; i + 8 <= hd; i += 8)
            _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(acc + i), c),
                                                    _mm256_mul_ps(wv, _mm256_loadu_ps(v + i))));
    }
    for (; i < hd; ++i) acc[i] = acc[i] * correction + w * v[i];
}

}  // namespace

void attention_tile_avx2(const AttentionTile& a, const KvRows& k, const KvRows& v, int kv_head, int head_dim,
                         float scale) {
    const size_t hd = size_t(head_dim), nq = size_t(a.n_q);
    TileSoftmax st(a, head_dim);
    const Blocking full = blocking(a.n_q);
    const int max_positions = full.positions;
    std::vector<float> kf(size_t(max_positions) * hd), vf(size_t(max_positions) * hd);
    std::vector<float> dots(size_t(max_positions) * size_t(full.heads) * T);
    for (int p0 = st.lo; p0 <= st.hi; p0 += max_positions) {
        const int np = std::min(max_positions, st.hi + 1 - p0);
        for (int p = 0; p < np; ++p) {
            fp16_row_to_fp32(k.row(p0 + p) + int64_t(kv_head) * head_dim, kf.data() + size_t(p) * hd, head_dim);
            fp16_row_to_fp32(v.row(p0 + p) + int64_t(kv_head) * head_dim, vf.data() + size_t(p) * hd, head_dim);
        }
        for (size_t j0 = 0; j0 < nq; j0 += size_t(full.heads)) {
            const int nb = int(std::min(nq - j0, size_t(full.heads)));
            dots_for(nb, np)(st.qt.data() + j0 * hd * T, kf.data(), hd, dots.data());
            // The softmax steps in position order, as the portable form takes them.
            for (int p = 0; p < np; ++p) {
                const int pos = p0 + p;
                for (int b = 0; b < nb; ++b) {
                    const size_t j = j0 + size_t(b);
                    const float* dot = dots.data() + size_t(p * nb + b) * T;
                    for (int t = 0; t < a.n_t; ++t) {
                        if (pos < a.first[t] || pos > a.last[t]) continue;
                        const size_t jt = j * T + size_t(t);
                        const float s = dot[t] * scale;
                        const float m_new = std::max(st.m[jt], s);
                        const float correction =
                            m_new == st.m[jt] && std::isfinite(m_new) ? 1.0f : expf_glibc(st.m[jt] - m_new);
                        const float w = expf_glibc(s - m_new);
                        st.l[jt] = st.l[jt] * correction + w;
                        rescale_add(st.acc.data() + jt * hd, correction, w, vf.data() + size_t(p) * hd, hd);
                        st.m[jt] = m_new;
                    }
                }
            }
        }
    }
    st.write(a, head_dim);
}

namespace {

constexpr int kBlock = 16;  // positions a one-token block takes: two vectors of lanes

// dots[b][p] = q·k of head b (q + b * hd) and position p of the block
// (kt: [i][kBlock]), each lane summed in element order from zero.
template <int NB>
void one_token_dots(const float* q, const float* kt, size_t hd, float* dots) {
    __m256 acc[NB][2];
    for (int b = 0; b < NB; ++b) acc[b][0] = acc[b][1] = _mm256_setzero_ps();
    for (size_t i = 0; i < hd; ++i) {
        const __m256 k0 = _mm256_loadu_ps(kt + i * kBlock), k1 = _mm256_loadu_ps(kt + i * kBlock + 8);
        for (int b = 0; b < NB; ++b) {
            const __m256 qb = _mm256_set1_ps(q[size_t(b) * hd + i]);
            acc[b][0] = _mm256_add_ps(acc[b][0], _mm256_mul_ps(qb, k0));
            acc[b][1] = _mm256_add_ps(acc[b][1], _mm256_mul_ps(qb, k1));
        }
    }
    for (int b = 0; b < NB; ++b) {
        _mm256_storeu_ps(dots + b * kBlock, acc[b][0]);
        _mm256_storeu_ps(dots + b * kBlock + 8, acc[b][1]);
    }
}

void one_token_dots(int heads, const float* q, const float* kt, size_t hd, float* dots) {
    switch (heads) {
        case 1: return one_token_dots<1>(q, kt, hd, dots);
        case 2: return one_token_dots<2>(q, kt, hd, dots);
        case 3: return one_token_dots<3>(q, kt, hd, dots);
        default: return one_token_dots<4>(q, kt, hd, dots);
    }
}

// kt[i][p] = kf[p][i] for p < kBlock, i < hd: 8 x 8 transposes, then the
// columns past the last eight one by one.
void transpose_block(const float* kf, size_t hd, float* kt) {
    size_t i0 = 0;
    for (; i0 + 8 <= hd; i0 += 8)
        for (int p0 = 0; p0 < kBlock; p0 += 8) {
            __m256 r[8];
            for (int p = 0; p < 8; ++p) r[p] = _mm256_loadu_ps(kf + size_t(p0 + p) * hd + i0);
            __m256 t[8], u[8];
            for (int p = 0; p < 8; p += 2) {
                t[p] = _mm256_unpacklo_ps(r[p], r[p + 1]);
                t[p + 1] = _mm256_unpackhi_ps(r[p], r[p + 1]);
            }
            for (int h = 0; h < 8; h += 4) {
                u[h] = _mm256_shuffle_ps(t[h], t[h + 2], 0x44);
                u[h + 1] = _mm256_shuffle_ps(t[h], t[h + 2], 0xee);
                u[h + 2] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0x44);
                u[h + 3] = _mm256_shuffle_ps(t[h + 1], t[h + 3], 0xee);
            }
            for (int c = 0; c < 4; ++c) {
                _mm256_storeu_ps(kt + (i0 + size_t(c)) * kBlock + p0, _mm256_permute2f128_ps(u[c], u[c + 4], 0x20));
                _mm256_storeu_ps(kt + (i0 + size_t(c) + 4) * kBlock + p0,
                                 _mm256_permute2f128_ps(u[c], u[c + 4], 0x31));
            }
        }
    for (; i0 < hd; ++i0)
        for (int p = 0; p < kBlock; ++p) kt[i0 * kBlock + size_t(p)] = kf[size_t(p) * hd + i0];
}

// acc[i] = acc[i] * c[p] + w[p] * v[p][i] for p = 0..np-1 in order, over
// NV vectors of acc held in registers (c[p] == 1: the product by 1 skipped,
// which leaves the bits as they are).
template <int NV>
void accumulate_v(float* acc, const float* c, const float* w, const float* vf, size_t hd, int np) {
    __m256 a[NV];
    for (int j = 0; j < NV; ++j) a[j] = _mm256_loadu_ps(acc + 8 * j);
    for (int p = 0; p < np; ++p) {
        const float* vp = vf + size_t(p) * hd;
        const __m256 wv = _mm256_set1_ps(w[p]);
        if (c[p] == 1.0f) {
            for (int j = 0; j < NV; ++j) a[j] = _mm256_add_ps(a[j], _mm256_mul_ps(wv, _mm256_loadu_ps(vp + 8 * j)));
        } else {
            const __m256 cv = _mm256_set1_ps(c[p]);
            for (int j = 0; j < NV; ++j)
                a[j] = _mm256_add_ps(_mm256_mul_ps(a[j], cv), _mm256_mul_ps(wv, _mm256_loadu_ps(vp + 8 * j)));
        }
    }
    for (int j = 0; j < NV; ++j) _mm256_storeu_ps(acc + 8 * j, a[j]);
}

void accumulate_v(float* acc, const float* c, const float* w, const float* vf, size_t hd, int np) {
    size_t i0 = 0;
    for (; i0 + 64 <= hd; i0 += 64) accumulate_v<8>(acc + i0, c, w, vf + i0, hd, np);
    switch ((hd - i0) / 8) {
        case 7: accumulate_v<7>(acc + i0, c, w, vf + i0, hd, np); break;
        case 6: accumulate_v<6>(acc + i0, c, w, vf + i0, hd, np); break;
        case 5: accumulate_v<5>(acc + i0, c, w, vf + i0, hd, np); break;
        case 4: accumulate_v<4>(acc + i0, c, w, vf + i0, hd, np); break;
        case 3: accumulate_v<3>(acc + i0, c, w, vf + i0, hd, np); break;
        case 2: accumulate_v<2>(acc + i0, c, w, vf + i0, hd, np); break;
        case 1: accumulate_v<1>(acc + i0, c, w, vf + i0, hd, np); break;
        default: break;
    }
    for (size_t i = i0 + (hd - i0) / 8 * 8; i < hd; ++i)
        for (int p = 0; p < np; ++p) acc[i] = acc[i] * c[p] + w[p] * vf[size_t(p) * hd + i];
}

}  // namespace

void attention_one_token_avx2(const float* q, int n_q, const KvRows& k, const KvRows& v, int first, int n_pos,
                              int kv_head, int head_dim, float scale, float* out) {
    const size_t hd = size_t(head_dim), nq = size_t(n_q);
    // Scratch kept by each thread: the calls come once a layer and KV head.
    thread_local std::vector<float> scratch;
    scratch.assign(nq * hd + 2 * nq + 3 * kBlock * hd + nq * kBlock, 0.0f);
    float* acc = scratch.data();    // [head][hd] numerators
    float* m = acc + nq * hd;       // [head] running maxima
    float* l = m + nq;              // [head] denominators
    float* kf = l + nq;             // [kBlock][hd] the block's K rows
    float* kt = kf + kBlock * hd;   // [hd][kBlock] transposed
    float* vf = kt + kBlock * hd;   // [kBlock][hd] the block's V rows
    float* dots = vf + kBlock * hd; // [head][kBlock]
    for (size_t j = 0; j < nq; ++j) m[j] = -INFINITY;
    const __m256 scale_v = _mm256_set1_ps(scale);
    for (int p0 = first; p0 < first + n_pos; p0 += kBlock) {
        const int np = std::min(kBlock, first + n_pos - p0);
        for (int p = 0; p < np; ++p) {
            fp16_row_to_fp32(k.row(p0 + p) + int64_t(kv_head) * head_dim, kf + size_t(p) * hd, head_dim);
            fp16_row_to_fp32(v.row(p0 + p) + int64_t(kv_head) * head_dim, vf + size_t(p) * hd, head_dim);
        }
        std::fill(kf + size_t(np) * hd, kf + kBlock * hd, 0.0f);  // lanes past the block: finite, unused
        transpose_block(kf, hd, kt);
        for (size_t j0 = 0; j0 < nq; j0 += 4)
            one_token_dots(int(std::min<size_t>(4, nq - j0)), q + j0 * hd, kt, hd, dots + j0 * kBlock);
        for (size_t j = 0; j < nq; ++j) {
            // The scores, each running maximum before and after its position,
            // then w = e^(s - m_new) and the rescaling e^(m_old - m_new)
            // (1 where the maximum stays: e^0 is exactly 1) for the block.
            alignas(32) float s[kBlock], before[kBlock], after[kBlock], w[kBlock], c[kBlock];
            for (int h = 0; h < kBlock; h += 8)
                _mm256_store_ps(s + h, _mm256_mul_ps(_mm256_loadu_ps(dots + j * kBlock + size_t(h)), scale_v));
            float mj = m[j];
            for (int p = 0; p < kBlock; ++p) {
                if (p >= np) {  // lanes past the block: e^0, unused
                    s[p] = before[p] = after[p] = 0.0f;
                    continue;
                }
                before[p] = mj;
                mj = std::max(mj, s[p]);
                after[p] = mj;
            }
            m[j] = mj;
            for (int h = 0; h < kBlock; h += 8) {
                const __m256 a = _mm256_load_ps(after + h);
                _mm256_store_ps(w + h, expf_glibc_avx2(_mm256_sub_ps(_mm256_load_ps(s + h), a)));
                _mm256_store_ps(c + h, expf_glibc_avx2(_mm256_sub_ps(_mm256_load_ps(before + h), a)));
            }
            float lj = l[j];
            for (int p = 0; p < np; ++p) lj = lj * c[p] + w[p];
            l[j] = lj;
            accumulate_v(acc + j * hd, c, w, vf, hd, np);
        }
    }
    for (size_t j = 0; j < nq; ++j) {
        const float inv = l[j] > 0.0f ? 1.0f / l[j] : 0.0f;
        for (size_t i = 0; i < hd; ++i) out[j * hd + i] = acc[j * hd + i] * inv;
    }
}

}  // namespace tern::backend::cpu::detail
#endif  // __x86_64__
