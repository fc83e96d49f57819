// attention_tile on AVX2 vectors: the arithmetic of the portable form in
// ops.cpp, lane for lane (each product rounded, then each sum; this file is
// built without fused multiply-adds), so every token gets the same bits.
// What changes is the schedule:
//   - the q·k sums of several query heads and positions run side by side,
//     independent chains where the portable form waits on one at a time;
//   - the V update runs eight floats to a vector;
//   - a position that leaves a token's running maximum where it was skips
//     the rescaling: exp(m - m) is exactly 1, and a product by 1 is exact.
// Compiled with -mavx2 -mf16c -ffp-contract=off and called only where the
// CPU has AVX2 (cpu::attention_tile picks it).
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

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
                            m_new == st.m[jt] && std::isfinite(m_new) ? 1.0f : std::exp(st.m[jt] - m_new);
                        const float w = std::exp(s - m_new);
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

}  // namespace tern::backend::cpu::detail
#endif  // __x86_64__
