// The AVX-512 kernels over the interleaved layout (interleave.h): sixteen
// rows at a time, lane r of every register belonging to row r.
//
// Per block, the group's quants are four (q8_0: eight) 64-byte loads, each
// word w of sixteen rows; a nibble load gives two steps (low nibbles:
// elements 4w..4w+3, high: 16+4w..16+4w+3), and the high bits of q5 and q6
// types come from one or two more loads, a shift and a bitwise select per
// step. Each step meets the token's matching activation word, broadcast, in
// one vpdpbusd, in two chains (elements 0..15 and 16..31), so a block's
// integer sums of every row take eight instructions and no horizontal sum.
// Then the row kernels' integers (docs/cpu-kernels.md): offsets taken out
// with the activations' sums (q4_0's q - 8, q5_0's q - 16, q8_0's bytes
// stored plus 128, q6_K's q - 32 per half), K-quant sub-block scales and mins
// multiplied in; the float term formed as the row kernels form it and added
// into the block's lane. The blocks come lane by lane (the layout's order),
// so one accumulator per token serves a lane, and the eight lanes are folded
// as every path folds them. Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni -mf16c (src/CMakeLists.txt); without them it exports no
// kernels.
#include "quant/interleave.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__F16C__)

#include <immintrin.h>

#include <cassert>

#include <cstring>

#include "quant/dot.h"
#include "quant/interleave_layout.h"

namespace tern::quant::detail {
namespace {

// How a block's integers become the row kernels' A and X.
enum class Ints {
    offset,    // A = sum q*a - (sum a << shift); X = sum a where the type has a min
    k_min,     // q4_K, q5_K: A = sc * sum q*a, X = mn * sum a
    k_halves,  // q6_K: A = sc0 * sum_0..15 (q-32)*a + sc1 * sum_16..31 (q-32)*a
};

template <TensorType kT, Ints kI, int kShift = 0>
struct Type {
    static constexpr Ints kInts = kI;
    static constexpr int kOffsetShift = kShift;
    static constexpr LayoutKind kind() {
        LayoutKind k;
        layout_kind(kT, k);
        return k;
    }
};

using Q4_0 = Type<TensorType::Q4_0, Ints::offset, 3>;  // q - 8
using Q4_1 = Type<TensorType::Q4_1, Ints::offset>;
using Q5_0 = Type<TensorType::Q5_0, Ints::offset, 4>;  // q - 16
using Q5_1 = Type<TensorType::Q5_1, Ints::offset>;
using Q8_0 = Type<TensorType::Q8_0, Ints::offset, 7>;  // stored q + 128
using Q4_K = Type<TensorType::Q4_K, Ints::k_min>;
using Q5_K = Type<TensorType::Q5_K, Ints::k_min>;
using Q6_K = Type<TensorType::Q6_K, Ints::k_halves>;

// Step s's high bits moved to bit 4 (q5 types: bit s of each byte of the
// spread word) or bits 4..5 (q6_K: bits 2s'..2s'+1 of word s / 4, s' = s % 4)
// and or-ed into its nibbles (interleave.cpp, spread_high).
template <int kHighWords, int s>
inline __m512i with_high_bits(__m512i nibbles, const __m512i* high) {
    if constexpr (kHighWords == 1) {
        const __m512i moved = s <= 4 ? _mm512_slli_epi32(high[0], 4 - s) : _mm512_srli_epi32(high[0], s - 4);
        return _mm512_ternarylogic_epi32(nibbles, moved, _mm512_set1_epi8(0x10), 0xF8);  // a | (b & c)
    } else {
        constexpr int sp = s % 4;
        const __m512i w = high[s / 4];
        const __m512i moved = sp < 2 ? _mm512_slli_epi32(w, 4 - 2 * sp) : _mm512_srli_epi32(w, 2 * sp - 4);
        return _mm512_ternarylogic_epi32(nibbles, moved, _mm512_set1_epi8(0x30), 0xF8);
    }
}

template <int kHighWords>
inline void add_high_bits(__m512i* step, const __m512i* high) {
    step[0] = with_high_bits<kHighWords, 0>(step[0], high);
    step[1] = with_high_bits<kHighWords, 1>(step[1], high);
    step[2] = with_high_bits<kHighWords, 2>(step[2], high);
    step[3] = with_high_bits<kHighWords, 3>(step[3], high);
    step[4] = with_high_bits<kHighWords, 4>(step[4], high);
    step[5] = with_high_bits<kHighWords, 5>(step[5], high);
    step[6] = with_high_bits<kHighWords, 6>(step[6], high);
    step[7] = with_high_bits<kHighWords, 7>(step[7], high);
}

// Bytes asked for ahead of those read: a one-token step streams the weights
// from memory (docs/cpu-kernels.md, "prefetch").
constexpr int64_t kAhead = 2048;

inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p + kAhead), _MM_HINT_T0); }

inline __m512i word(const block_q8a& x, int w) {
    int32_t v;
    std::memcpy(&v, x.qs + 4 * w, 4);
    return _mm512_set1_epi32(v);
}

// The sum of an activation block's first sixteen quanta.
inline int32_t first_half_sum(const block_q8a& x) {
    const __m128i biased = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x.qs)),
                                         _mm_set1_epi8(char(0x80)));  // q + 128, unsigned
    const __m128i s = _mm_sad_epu8(biased, _mm_setzero_si128());
    return _mm_cvtsi128_si32(s) + _mm_extract_epi16(s, 4) - 16 * 128;
}

inline __m512 half16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// GCC 12's own 512-bit intrinsics pass an _mm512_undefined_*() operand that
// trips this warning wherever they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <class T, int kTokens>
void dot_group(const void* w, int64_t n_groups, int64_t gi, const block_q8a* a, int64_t k, float* out,
               int64_t out_stride, int n_rows) {
    constexpr LayoutKind kKind = T::kind();
    constexpr int64_t kUnit = kKind.words * 64, kHighUnit = kKind.high_words * 64;
    const int64_t nb = k / 32;
    const GroupPlanes p = group_planes(kKind, nb, n_groups, gi);
    const auto* base = static_cast<const uint8_t*>(w);
    const uint8_t *qs = base + p.qs, *qh = base + p.qh, *d = base + p.d, *m = base + p.m, *sc = base + p.sc,
                  *mn = base + p.mn;
    const __m512i low4 = _mm512_set1_epi8(0x0F);
    __m512 lanes[kTokens][8];
    int64_t u = 0;  // units in the layout's order
    for (int j = 0; j < 8; ++j) {
        __m512 acc[kTokens];
        for (int t = 0; t < kTokens; ++t) acc[t] = _mm512_setzero_ps();
        for (int64_t b = j; b < nb; b += 8, ++u) {
            const uint8_t* q = qs + u * kUnit;
#pragma GCC unroll 8
            for (int64_t off = 0; off < kUnit; off += 64) prefetch(q + off);
            __m512i step[8];
            if constexpr (kKind.words == 4) {
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
            if constexpr (kKind.high_words > 0) {
                __m512i high[2];
                for (int h = 0; h < kKind.high_words; ++h) {
                    high[h] = _mm512_loadu_si512(qh + u * kHighUnit + 64 * h);
                }
                add_high_bits<kKind.high_words>(step, high);
            }
            // Scales and mins: per block, or per super-block (K-quants).
            const int64_t su = kKind.k_quant ? b / 8 : u;
            const __m512 dw = half16(d + su * 32);
            __m512 mw = _mm512_setzero_ps();
            if constexpr (kKind.has_min) mw = half16(m + su * 32);
            __m512i sc0 = _mm512_setzero_si512(), sc1 = sc0, mnv = sc0;
            if constexpr (T::kInts == Ints::k_min) {
                sc0 = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + u * 16)));
                mnv = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + u * 16)));
            } else if constexpr (T::kInts == Ints::k_halves) {
                sc0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + u * 32)));
                sc1 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + u * 32 + 16)));
            }
#pragma GCC unroll 8
            for (int t = 0; t < kTokens; ++t) {
                const block_q8a& x = a[t * nb + b];
                // Two chains of four: elements 0..15 and 16..31 (a lone token
                // waits on four products, not eight; q6_K scales each).
                __m512i c0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), step[0], word(x, 0));
                __m512i c1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), step[4], word(x, 4));
#pragma GCC unroll 3
                for (int w = 1; w < 4; ++w) {
                    c0 = _mm512_dpbusd_epi32(c0, step[w], word(x, w));
                    c1 = _mm512_dpbusd_epi32(c1, step[w + 4], word(x, w + 4));
                }
                const __m512i sum = _mm512_set1_epi32(x.sum);
                const __m512 da = _mm512_set1_ps(x.d);
                __m512 term;
                if constexpr (T::kInts == Ints::offset) {
                    __m512i A = _mm512_add_epi32(c0, c1);
                    if constexpr (T::kOffsetShift != 0) A = _mm512_sub_epi32(A, _mm512_slli_epi32(sum, T::kOffsetShift));
                    term = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(A));
                    if constexpr (kKind.has_min)
                        term = _mm512_add_ps(term, _mm512_mul_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(sum)));
                } else if constexpr (T::kInts == Ints::k_min) {
                    const __m512i A = _mm512_mullo_epi32(sc0, _mm512_add_epi32(c0, c1));
                    const __m512i X = _mm512_mullo_epi32(mnv, sum);
                    term = _mm512_sub_ps(_mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(A)),
                                         _mm512_mul_ps(_mm512_mul_ps(mw, da), _mm512_cvtepi32_ps(X)));
                } else {
                    const int32_t s0 = first_half_sum(x);
                    const __m512i lo = _mm512_sub_epi32(c0, _mm512_set1_epi32(32 * s0));
                    const __m512i hi = _mm512_sub_epi32(c1, _mm512_set1_epi32(32 * (x.sum - s0)));
                    const __m512i A = _mm512_add_epi32(_mm512_mullo_epi32(sc0, lo), _mm512_mullo_epi32(sc1, hi));
                    term = _mm512_mul_ps(_mm512_mul_ps(dw, da), _mm512_cvtepi32_ps(A));
                }
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
#pragma GCC diagnostic pop

template <class T>
void dot_group_tokens(const void* w, int64_t rows, int64_t g, const block_q8a* a, int n_tokens, int64_t k,
                      float* out, int64_t out_stride) {
    const int64_t n_groups = (rows + 15) / 16;
    const int n_rows = int(rows - 16 * g < 16 ? rows - 16 * g : 16);
    assert(g >= 0 && n_rows >= 1 && n_tokens >= 1 && n_tokens <= kDotMaxTokens);
    switch (n_tokens) {
        case 1: return dot_group<T, 1>(w, n_groups, g, a, k, out, out_stride, n_rows);
        case 2: return dot_group<T, 2>(w, n_groups, g, a, k, out, out_stride, n_rows);
        case 3: return dot_group<T, 3>(w, n_groups, g, a, k, out, out_stride, n_rows);
        case 4: return dot_group<T, 4>(w, n_groups, g, a, k, out, out_stride, n_rows);
        case 5: return dot_group<T, 5>(w, n_groups, g, a, k, out, out_stride, n_rows);
        case 6: return dot_group<T, 6>(w, n_groups, g, a, k, out, out_stride, n_rows);
        case 7: return dot_group<T, 7>(w, n_groups, g, a, k, out, out_stride, n_rows);
        case 8: return dot_group<T, 8>(w, n_groups, g, a, k, out, out_stride, n_rows);
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
        case TensorType::Q4_K: return dot_group_tokens<Q4_K>;
        case TensorType::Q5_K: return dot_group_tokens<Q5_K>;
        case TensorType::Q6_K: return dot_group_tokens<Q6_K>;
        default: return nullptr;
    }
}

}  // namespace tern::quant::detail

#else

namespace tern::quant::detail {
DotGroupFn group_kernel_avx512(TensorType) { return nullptr; }
}  // namespace tern::quant::detail

#endif
