// The AVX-512 kernels over the interleaved layout (interleave.h): sixteen
// rows at a time, lane r of every register belonging to row r.
//
// Per block, the group's quants are four (q8_0: eight) 64-byte loads, each
// word w of sixteen rows; a nibble load gives two steps (low nibbles:
// elements 4w..4w+3, high: 16+4w..16+4w+3), and q5's fifth bits come from
// one more load, a shift and a bitwise select per step. Each step meets the token's
// matching activation word, broadcast, in one vpdpbusd, so a block's integer
// sum A of every row is eight instructions and needs no horizontal sum.
// Offsets are taken out of A with the activation block's sum (q4_0's q - 8,
// q5_0's q - 16 and q8_0's bytes stored plus 128), then the float term is formed as the row
// kernels form it and added into the block's lane: the blocks come lane by
// lane (the layout's order), so one accumulator per token serves a lane, and
// the eight lanes are folded as every path folds them. Compiled with
// -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mf16c (src/CMakeLists.txt);
// without them it exports no kernels.
#include "quant/interleave.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__F16C__)

// GCC 12's own 512-bit intrinsics pass an _mm512_undefined_*() operand that
// trips this warning wherever they are inlined.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "quant/dot.h"

namespace tern::quant::detail {
namespace {

struct Q4_0 {
    static constexpr int kWords = 4;
    static constexpr int kOffsetShift = 3;  // q - 8
    static constexpr bool kMin = false, kHigh = false;
};
struct Q4_1 {
    static constexpr int kWords = 4;
    static constexpr int kOffsetShift = 0;
    static constexpr bool kMin = true, kHigh = false;
};
struct Q5_0 {
    static constexpr int kWords = 4;
    static constexpr int kOffsetShift = 4;  // q - 16
    static constexpr bool kMin = false, kHigh = true;
};
struct Q5_1 {
    static constexpr int kWords = 4;
    static constexpr int kOffsetShift = 0;
    static constexpr bool kMin = true, kHigh = true;
};
struct Q8_0 {
    static constexpr int kWords = 8;
    static constexpr int kOffsetShift = 7;  // stored q + 128
    static constexpr bool kMin = false, kHigh = false;
};

// Step s's fifth bits (bit s of each byte of the spread high bits,
// interleave.cpp) moved to bit 4 and or-ed into its nibbles.
template <int s>
inline __m512i with_high_bit(__m512i nibbles, __m512i high) {
    const __m512i moved = s <= 4 ? _mm512_slli_epi32(high, 4 - s) : _mm512_srli_epi32(high, s - 4);
    return _mm512_ternarylogic_epi32(nibbles, moved, _mm512_set1_epi8(0x10), 0xF8);  // a | (b & c)
}

// Bytes asked for ahead of those read: a one-token step streams the weights
// from memory (docs/cpu-kernels.md, "prefetch").
constexpr int64_t kAhead = 2048;

inline __m512i word(const block_q8a& x, int w) {
    int32_t v;
    std::memcpy(&v, x.qs + 4 * w, 4);
    return _mm512_set1_epi32(v);
}

template <class T, int kTokens>
void dot_group(const void* group, const block_q8a* a, int64_t k, float* out, int64_t out_stride, int n_rows) {
    constexpr int64_t kUnit = T::kWords * 64;
    const int64_t nb = k / 32;
    const auto* qs = static_cast<const uint8_t*>(group);
    const auto* qh = qs + nb * kUnit;
    const auto* d = qh + (T::kHigh ? nb * 64 : 0);
    const auto* m = d + nb * 32;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 lanes[kTokens][8];
    int64_t u = 0;  // units in the layout's order
    for (int j = 0; j < 8; ++j) {
        __m512 acc[kTokens];
        for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
        for (int64_t b = j; b < nb; b += 8, ++u) {
            const uint8_t* q = qs + u * kUnit;
#pragma GCC unroll 8
            for (int64_t off = 0; off < kUnit; off += 64) _mm_prefetch(reinterpret_cast<const char*>(q + kAhead + off), _MM_HINT_T0);
            _mm_prefetch(reinterpret_cast<const char*>(d + u * 32 + kAhead / 8), _MM_HINT_T0);
            __m512i step[8];
            if constexpr (T::kWords == 4) {
#pragma GCC unroll 4
                for (int w = 0; w < 4; ++w) {
                    const __m512i x = _mm512_loadu_si512(q + 64 * w);
                    step[w] = _mm512_and_si512(x, low4);
                    step[w + 4] = _mm512_and_si512(_mm512_srli_epi16(x, 4), low4);
                }
            } else {
#pragma GCC unroll 8
                for (int w = 0; w < 8; ++w) step[w] = _mm512_loadu_si512(q + 64 * w);
            }
            if constexpr (T::kHigh) {
                const __m512i h = _mm512_loadu_si512(qh + u * 64);
                step[0] = with_high_bit<0>(step[0], h);
                step[1] = with_high_bit<1>(step[1], h);
                step[2] = with_high_bit<2>(step[2], h);
                step[3] = with_high_bit<3>(step[3], h);
                step[4] = with_high_bit<4>(step[4], h);
                step[5] = with_high_bit<5>(step[5], h);
                step[6] = with_high_bit<6>(step[6], h);
                step[7] = with_high_bit<7>(step[7], h);
            }
            const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(d + u * 32)));
            __m512 mw = _mm512_setzero_ps();
            if constexpr (T::kMin) {
                _mm_prefetch(reinterpret_cast<const char*>(m + u * 32 + kAhead / 8), _MM_HINT_T0);
                mw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + u * 32)));
            }
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t) {
                const block_q8a& x = a[t * nb + b];
                // Two chains of four, so that a lone token waits on four products, not eight.
                __m512i c0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), step[0], word(x, 0));
                __m512i c1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), step[4], word(x, 4));
#pragma GCC unroll 3
                for (int w = 1; w < 4; ++w) {
                    c0 = _mm512_dpbusd_epi32(c0, step[w], word(x, w));
                    c1 = _mm512_dpbusd_epi32(c1, step[w + 4], word(x, w + 4));
                }
                __m512i A = _mm512_add_epi32(c0, c1);
                const __m512i sum = _mm512_set1_epi32(x.sum);
                if constexpr (T::kOffsetShift != 0) A = _mm512_sub_epi32(A, _mm512_slli_epi32(sum, T::kOffsetShift));
                const __m512 da = _mm512_set1_ps(x.d);
                __m512 term = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(A));
                if constexpr (T::kMin)
                    term = _mm512_add_ps(term, _mm512_mul_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(sum)));
                acc[t] = _mm512_add_ps(acc[t], term);
            }
        }
        for (int t = 0; t < kTokens; ++t) lanes[t][j] = acc[t];
    }
    const __mmask16 rows = __mmask16((1u << n_rows) - 1);
    for (int t = 0; t < kTokens; ++t) {
        const __m512* l = lanes[t];
        const __m512 left = _mm512_add_ps(_mm512_add_ps(l[0], l[4]), _mm512_add_ps(l[2], l[6]));
        const __m512 right = _mm512_add_ps(_mm512_add_ps(l[1], l[5]), _mm512_add_ps(l[3], l[7]));
        _mm512_mask_storeu_ps(out + t * out_stride, rows, _mm512_add_ps(left, right));
    }
}

template <class T>
void dot_group_tokens(const void* group, const block_q8a* a, int n_tokens, int64_t k, float* out,
                      int64_t out_stride, int n_rows) {
    switch (n_tokens) {
        case 1: return dot_group<T, 1>(group, a, k, out, out_stride, n_rows);
        case 2: return dot_group<T, 2>(group, a, k, out, out_stride, n_rows);
        case 3: return dot_group<T, 3>(group, a, k, out, out_stride, n_rows);
        case 4: return dot_group<T, 4>(group, a, k, out, out_stride, n_rows);
        case 5: return dot_group<T, 5>(group, a, k, out, out_stride, n_rows);
        case 6: return dot_group<T, 6>(group, a, k, out, out_stride, n_rows);
        case 7: return dot_group<T, 7>(group, a, k, out, out_stride, n_rows);
        case 8: return dot_group<T, 8>(group, a, k, out, out_stride, n_rows);
        default: return;
    }
}

static_assert(kDotMaxTokens == 8, "dot_group_tokens instantiates one kernel per token count");

}  // namespace

DotGroupFn group_kernel_avx512(TensorType type) {
    switch (type) {
        case TensorType::Q4_0: return dot_group_tokens<Q4_0>;
        case TensorType::Q4_1: return dot_group_tokens<Q4_1>;
        case TensorType::Q5_0: return dot_group_tokens<Q5_0>;
        case TensorType::Q5_1: return dot_group_tokens<Q5_1>;
        case TensorType::Q8_0: return dot_group_tokens<Q8_0>;
        default: return nullptr;
    }
}

}  // namespace tern::quant::detail

#else

namespace tern::quant::detail {
DotGroupFn group_kernel_avx512(TensorType) { return nullptr; }
}  // namespace tern::quant::detail

#endif
