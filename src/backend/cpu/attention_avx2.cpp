// The CPU attention on AVX2 vectors: the arithmetic of the portable forms in
// ops.cpp, lane for lane (each product rounded, then each sum: this file is
// built with -ffp-contract=off, and its only fused steps are expf_glibc's own,
// which the portable form takes too), so every token gets the same bits.
// What changes is the schedule. A tile of tokens
// (one, at every decode step) walks the positions in blocks of sixteen:
//   - the block's K rows are converted and transposed once for the tile, so
//     that each position's q·k is one lane of a vector, summed in element
//     order like the portable form's scalar chain;
//   - for each token and head, the running maximum steps through the block's
//     positions the token sees, in order; then the block's weights and
//     rescalings come from vector exponentials;
//   - the V update runs in position order with the numerator held in
//     registers for the block, sixty-four floats at a time, and skips the
//     rescaling wherever it is exactly 1 (a product by 1 is exact).
// Compiled with -mavx2 -mfma -mf16c -ffp-contract=off and called only where
// the CPU has AVX2 (cpu::attention_tile and cpu::attention_kv_group pick it).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/expf.h"
#include "backend/cpu/ops.h"

namespace tern::backend::cpu::detail {
namespace {

constexpr int kBlock = 16;  // positions a block takes: two vectors of lanes
// dots[b][p] = q·k of one token's head b (q + b * hd) and position p of the
// block (kt: [i][kBlock]), each lane summed in element order from zero.
template <int NB>
void block_dots(const float* q, const float* kt, size_t hd, float* dots) {
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

void block_dots(int heads, const float* q, const float* kt, size_t hd, float* dots) {
    switch (heads) {
        case 1: return block_dots<1>(q, kt, hd, dots);
        case 2: return block_dots<2>(q, kt, hd, dots);
        case 3: return block_dots<3>(q, kt, hd, dots);
        default: return block_dots<4>(q, kt, hd, dots);
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

void attention_tile_avx2(const AttentionTile& a, const KvRows& k, const KvRows& v, int kv_head, int head_dim,
                         float scale) {
    const size_t hd = size_t(head_dim), nq = size_t(a.n_q), nt = size_t(a.n_t);
    int lo = a.first[0], hi = a.last[0];
    for (int t = 1; t < a.n_t; ++t) lo = std::min(lo, a.first[t]), hi = std::max(hi, a.last[t]);
    // Scratch kept by each thread: calls come once a layer, tile and KV head.
    // Only the running state starts from set values; the block buffers are
    // written before they are read.
    thread_local std::vector<float> scratch;
    const size_t need = nt * nq * (hd + 2) + 3 * kBlock * hd + nq * kBlock;
    if (scratch.size() < need) scratch.resize(need);
    float* acc = scratch.data();          // [token][head][hd] numerators
    float* m = acc + nt * nq * hd;        // [token][head] running maxima
    float* l = m + nt * nq;               // [token][head] denominators
    float* kf = l + nt * nq;              // [kBlock][hd] the block's K rows
    float* kt = kf + kBlock * hd;         // [hd][kBlock] transposed
    float* vf = kt + kBlock * hd;         // [kBlock][hd] the block's V rows
    float* dots = vf + kBlock * hd;       // [head][kBlock] one token's
    std::fill(acc, acc + nt * nq * hd, 0.0f);
    std::fill(m, m + nt * nq, -INFINITY);
    std::fill(l, l + nt * nq, 0.0f);
    const __m256 scale_v = _mm256_set1_ps(scale);
    for (int p0 = lo; p0 <= hi; p0 += kBlock) {
        const int np = std::min(kBlock, hi + 1 - p0);
        for (int p = 0; p < np; ++p) {
            fp16_row_to_fp32(k.row(p0 + p) + int64_t(kv_head) * head_dim, kf + size_t(p) * hd, head_dim);
            fp16_row_to_fp32(v.row(p0 + p) + int64_t(kv_head) * head_dim, vf + size_t(p) * hd, head_dim);
        }
        std::fill(kf + size_t(np) * hd, kf + kBlock * hd, 0.0f);  // lanes past the block: finite, unused
        transpose_block(kf, hd, kt);
        for (size_t t = 0; t < nt; ++t) {
            // The block's positions this token sees: lanes b0..b1-1.
            const int b0 = std::max(a.first[t], p0) - p0, b1 = std::min(a.last[t] + 1, p0 + np) - p0;
            if (b0 >= b1) continue;
            const float* q = a.q + int64_t(t) * a.q_stride;
            for (size_t j0 = 0; j0 < nq; j0 += 4)
                block_dots(int(std::min<size_t>(4, nq - j0)), q + j0 * hd, kt, hd, dots + j0 * kBlock);
            for (size_t j = 0; j < nq; ++j) {
                const size_t jt = t * nq + j;
                // The scores, each running maximum before and after its
                // position, then w = e^(s - m_new) and the rescaling
                // e^(m_old - m_new) for the block (lanes outside b0..b1: e^0).
                alignas(32) float s[kBlock], before[kBlock], after[kBlock], w[kBlock], c[kBlock];
                for (int h = 0; h < kBlock; h += 8)
                    _mm256_store_ps(s + h, _mm256_mul_ps(_mm256_loadu_ps(dots + j * kBlock + size_t(h)), scale_v));
                float mj = m[jt];
                for (int p = 0; p < kBlock; ++p) {
                    if (p < b0 || p >= b1) {
                        s[p] = before[p] = after[p] = 0.0f;
                        continue;
                    }
                    before[p] = mj;
                    mj = std::max(mj, s[p]);
                    after[p] = mj;
                }
                m[jt] = mj;
                for (int h = 0; h < kBlock; h += 8) {
                    const __m256 am = _mm256_load_ps(after + h);
                    _mm256_store_ps(w + h, expf_glibc_avx2(_mm256_sub_ps(_mm256_load_ps(s + h), am)));
                    _mm256_store_ps(c + h, expf_glibc_avx2(_mm256_sub_ps(_mm256_load_ps(before + h), am)));
                }
                float lj = l[jt];
                for (int p = b0; p < b1; ++p) lj = lj * c[p] + w[p];
                l[jt] = lj;
                accumulate_v(acc + jt * hd, c + b0, w + b0, vf + size_t(b0) * hd, hd, b1 - b0);
            }
        }
    }
    for (size_t t = 0; t < nt; ++t)
        for (size_t j = 0; j < nq; ++j) {
            const size_t jt = t * nq + j;
            const float inv = l[jt] > 0.0f ? 1.0f / l[jt] : 0.0f;
            float* o = a.out + int64_t(t) * a.out_stride + int64_t(j * hd);
            for (size_t i = 0; i < hd; ++i) o[i] = acc[jt * hd + i] * inv;
        }
}

}  // namespace tern::backend::cpu::detail
#endif  // __x86_64__
