// The x86 kernels, written once over 256-bit registers and compiled twice:
// dot_avx2.cpp and dot_avx512.cpp each define the few instruction-set
// primitives below, then include this file (the one-token kernels) and
// dot_x86_tokens.h (the multi-token kernels and the path's table), so the two
// paths share every unpacking and combining step and differ only in how bytes
// are multiplied.
//
// Primitives the including file defines (static inline):
//   __m256i mul_sum_u8s8(__m256i u, __m256i s)
//       lane i = sum over bytes 4i..4i+3 of u (unsigned, <= 128) * s (signed)
//   __m256i mul_sum_u8s8_acc(__m256i acc, __m256i u, __m256i s)
//       acc + mul_sum_u8s8(u, s)
//   __m256i mul_sum4_u8s8(const __m256i* u, const __m256i* s)
//       sum of mul_sum_u8s8(u[i], s[i]) over i < 4, exact while u <= 32
//   __m256i expand_bits32(uint32_t bits, char value)
//       byte j = value where bit j of bits is set, else 0
//   __m256i select_bit(__m256i v, int bit, char value)
//       byte j = value where bit `bit` of byte j of v is set, else 0
//
// Each kernel reproduces the scalar reference (dot_scalar.cpp) bit for bit:
// integer sums are exact, and the float terms are formed and added in the
// same order, lane b % 8 holding block b (dot_internal.h).
//
// Not a public header; everything is in an unnamed namespace.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/dot_internal.h"

namespace tern::quant::detail {
namespace {

// ---- shared helpers -------------------------------------------------------

inline __m256i load_a(const block_q8a& a) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs)); }
inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }

// Signed weights times signed activations: move the sign onto the activation.
inline __m256i mul_sum_s8s8(__m256i w, __m256i a) {
    return mul_sum_u8s8(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w));
}

// As above, each half of 16 bytes weighted by its int16 scale: sc16 holds the
// first half's scale in its low eight int16 lanes, the second's in the high.
inline __m256i mul_sum_u8s8_sc16(__m256i u, __m256i a, __m256i sc16) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, a), sc16);
}
inline __m256i mul_sum_s8s8_sc16(__m256i w, __m256i a, __m256i sc16) {
    return mul_sum_u8s8_sc16(_mm256_abs_epi8(w), _mm256_sign_epi8(a, w), sc16);
}

// Lane j of the result = sum of the eight lanes of p[j].
inline __m256i reduce8(const __m256i* p) {
    const __m256i t0 = _mm256_hadd_epi32(p[0], p[1]);
    const __m256i t1 = _mm256_hadd_epi32(p[2], p[3]);
    const __m256i t2 = _mm256_hadd_epi32(p[4], p[5]);
    const __m256i t3 = _mm256_hadd_epi32(p[6], p[7]);
    const __m256i u0 = _mm256_hadd_epi32(t0, t1);
    const __m256i u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20),
                            _mm256_permute2x128_si256(u0, u1, 0x31));
}

inline int32_t hsum_i32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

// The lane fold of lanes8_total: ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
inline float fold8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

// d and sum of eight consecutive activation blocks (40 bytes apart).
inline __m256 act_d8(const block_q8a* a) {
    return _mm256_setr_ps(a[0].d, a[1].d, a[2].d, a[3].d, a[4].d, a[5].d, a[6].d, a[7].d);
}
inline __m256i act_sum8(const block_q8a* a) {
    return _mm256_setr_epi32(a[0].sum, a[1].sum, a[2].sum, a[3].sum, a[4].sum, a[5].sum, a[6].sum, a[7].sum);
}

// A decode step reads each weight byte once, from memory. Every kernel here
// that streams weights (one token or several, integer or float) asks for the
// bytes kPrefetchAhead past those it reads, which keeps enough misses in
// flight for a core to stream near its share of the bandwidth; the hardware
// prefetcher alone left one-token decode at about two thirds of that
// (docs/perf/LOG.md c18, c20, c21).
constexpr int64_t kPrefetchAhead = 2048;

template <size_t Bytes>
inline void prefetch_ahead(const void* p) {
    const char* q = static_cast<const char*>(p) + kPrefetchAhead;
#pragma GCC unroll 8
    for (size_t off = 0; off < Bytes; off += 64) _mm_prefetch(q + off, _MM_HINT_T0);
}

// Where a kernel finds the scales and sums of eight activation blocks from
// block b on: gathered from the blocks themselves (one row), or loaded from
// planes made once for all the rows of a one-token matmul (dot_rows below),
// which every row would otherwise gather again.
struct BlockActs {
    const block_q8a* a;
    __m256 d8(int64_t b) const { return act_d8(a + b); }
    __m256i sum8(int64_t b) const { return act_sum8(a + b); }
};
struct PlanarActs {
    const float* d;
    const int32_t* sum;
    __m256 d8(int64_t b) const { return _mm256_loadu_ps(d + b); }
    __m256i sum8(int64_t b) const { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum + b)); }
};

inline float half1(uint16_t h) { return _cvtsh_ss(h); }

// Eight halves `stride` bytes apart, starting at `first`.
inline __m256 half8(const uint16_t* first, size_t stride) {
    const auto* p = reinterpret_cast<const uint8_t*>(first);
    auto at = [&](int i) {
        uint16_t h;
        std::memcpy(&h, p + size_t(i) * stride, 2);
        return short(h);
    };
    return _mm256_cvtph_ps(_mm_setr_epi16(at(0), at(1), at(2), at(3), at(4), at(5), at(6), at(7)));
}

// Scale pair for 32-block i (0..3) of a 128-element half: s8 holds that
// half's eight int16 scales in both 128-bit lanes; the result has scale 2i in
// the low eight int16 lanes and 2i+1 in the high eight.
inline __m256i pair16(__m256i s8, int i) {
    const short lo = short(0x0100 + 0x0404 * i), hi = short(0x0302 + 0x0404 * i);
    return _mm256_shuffle_epi8(s8, _mm256_setr_m128i(_mm_set1_epi16(lo), _mm_set1_epi16(hi)));
}

// 16 int16 scales -> {scales 0..7 in both lanes, scales 8..15 in both lanes}.
inline void split_scales16(__m256i s16, __m256i* out) {
    out[0] = _mm256_permute2x128_si256(s16, s16, 0x00);
    out[1] = _mm256_permute2x128_si256(s16, s16, 0x11);
}

// 32 nibbles of a 16-byte run: low nibbles are elements 0..15, high 16..31.
// (Both halves from one broadcast load, the upper shifted by 4: no lane shuffle.)
inline __m256i nibbles32(const uint8_t* qs) {
    const __m256i x = _mm256_broadcastsi128_si256(load16(qs));
    const __m256i shifted = _mm256_srlv_epi64(x, _mm256_setr_epi64x(0, 0, 4, 4));
    return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}

// ---- 32-element types -----------------------------------------------------
//
// raw(): per-lane partial sums of sum q*a with q as stored (unsigned for the
// nibble types); kOffsetShift turns that into sum (q - 2^shift) * a using
// the activation block's sum; kMin types add the (mw * da) * S term.

struct Q4_0 {
    using Block = block_q4_0;
    static constexpr int kOffsetShift = 3;  // q - 8
    static constexpr bool kMin = false;
    static __m256i raw(const Block& w, __m256i a) { return mul_sum_u8s8(nibbles32(w.qs), a); }
};

struct Q4_1 {
    using Block = block_q4_1;
    static constexpr int kOffsetShift = 0;
    static constexpr bool kMin = true;
    static __m256i raw(const Block& w, __m256i a) { return mul_sum_u8s8(nibbles32(w.qs), a); }
};

struct Q5_0 {
    using Block = block_q5_0;
    static constexpr int kOffsetShift = 4;  // q - 16
    static constexpr bool kMin = false;
    static __m256i raw(const Block& w, __m256i a) {
        const __m256i q = _mm256_or_si256(nibbles32(w.qs), expand_bits32(load_u32(w.qh), 0x10));
        return mul_sum_u8s8(q, a);
    }
};

struct Q5_1 {
    using Block = block_q5_1;
    static constexpr int kOffsetShift = 0;
    static constexpr bool kMin = true;
    static __m256i raw(const Block& w, __m256i a) {
        const __m256i q = _mm256_or_si256(nibbles32(w.qs), expand_bits32(load_u32(w.qh), 0x10));
        return mul_sum_u8s8(q, a);
    }
};

struct Q8_0 {
    using Block = block_q8_0;
    static constexpr int kOffsetShift = 0;
    static constexpr bool kMin = false;
    static __m256i raw(const Block& w, __m256i a) {
        return mul_sum_s8s8(load32(reinterpret_cast<const uint8_t*>(w.qs)), a);
    }
};

// w_sum (A) and x_sum (S) of eight consecutive blocks, lane j = block j.
// (The unroll pragmas matter at -O2: without them GCC keeps these eight-step
// loops as loops and round-trips every partial sum through the stack.)
template <class T, class Acts>
inline void legacy_sums8(const typename T::Block* w, const block_q8a* a, const Acts& acts, int64_t b, __m256i& A,
                         __m256i& S) {
    __m256i p[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) p[j] = T::raw(w[j], load_a(a[j]));
    A = reduce8(p);
    S = _mm256_setzero_si256();
    if constexpr (T::kMin || T::kOffsetShift != 0) S = acts.sum8(b);
    if constexpr (T::kOffsetShift != 0) A = _mm256_sub_epi32(A, _mm256_slli_epi32(S, T::kOffsetShift));
    if constexpr (!T::kMin) S = _mm256_setzero_si256();
}

template <class T>
inline void legacy_sums1(const typename T::Block& w, const block_q8a& a, int32_t& A, int32_t& S) {
    A = hsum_i32(T::raw(w, load_a(a)));
    if constexpr (T::kOffsetShift != 0) A -= a.sum * (1 << T::kOffsetShift);
    S = T::kMin ? a.sum : 0;
}

// Lane j of the result = sum of the eight lanes of p[j], j < N (2 or 4).
template <int N>
inline __m128i reduce_n(const __m256i* p) {
    if constexpr (N == 4) {
        const __m256i u = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        return _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
    } else {
        const __m256i u = _mm256_hadd_epi32(p[0], p[1]);
        const __m128i h = _mm_add_epi32(_mm256_castsi256_si128(u), _mm256_extracti128_si256(u, 1));
        return _mm_hadd_epi32(h, h);
    }
}

// N (4 or 2) blocks of a row's ragged tail as one vector step, into lanes
// 0..N-1 of acc's low half (or, with high, of its high half), the other
// lanes kept as they are; each lane's term formed as in the eight-block step
// (term_scale / term_offset). Rows of 576 or 640 elements (SmolLM2, Gemma 3
// 270M: 18 or 20 blocks) spent a fifth of their time in a block-by-block
// tail.
template <class T, int N>
inline __m256 legacy_tail(const typename T::Block* w, const block_q8a* a, __m256 acc, bool high) {
    static_assert(N == 2 || N == 4);
    __m256i p[N];
#pragma GCC unroll 4
    for (int j = 0; j < N; ++j) p[j] = T::raw(w[j], load_a(a[j]));
    __m128i A = reduce_n<N>(p);
    // (Lanes past N read nothing: the conditions are constant.)
    const __m128i S = _mm_setr_epi32(a[0].sum, a[1].sum, N > 2 ? a[2].sum : 0, N > 3 ? a[3].sum : 0);
    if constexpr (T::kOffsetShift != 0) A = _mm_sub_epi32(A, _mm_slli_epi32(S, T::kOffsetShift));
    const __m128 da = _mm_setr_ps(a[0].d, a[1].d, N > 2 ? a[2].d : 0.0f, N > 3 ? a[3].d : 0.0f);
    const __m128 dw =
        _mm_setr_ps(half1(w[0].d), half1(w[1].d), N > 2 ? half1(w[2].d) : 0.0f, N > 3 ? half1(w[3].d) : 0.0f);
    __m128 t = _mm_mul_ps(_mm_mul_ps(dw, da), _mm_cvtepi32_ps(A));
    if constexpr (T::kMin) {
        const __m128 mw =
            _mm_setr_ps(half1(w[0].m), half1(w[1].m), N > 2 ? half1(w[2].m) : 0.0f, N > 3 ? half1(w[3].m) : 0.0f);
        t = _mm_add_ps(t, _mm_mul_ps(_mm_mul_ps(mw, da), _mm_cvtepi32_ps(S)));
    }
    constexpr int kLanes = N == 4 ? 0xF : 0x3;
    if (high) {
        const __m128 h = _mm256_extractf128_ps(acc, 1);
        return _mm256_insertf128_ps(acc, _mm_blend_ps(h, _mm_add_ps(h, t), kLanes), 1);
    }
    const __m128 l = _mm256_castps256_ps128(acc);
    return _mm256_insertf128_ps(acc, _mm_blend_ps(l, _mm_add_ps(l, t), kLanes), 0);
}

template <class T, class Acts>
float dot_legacy(const void* wv, const block_q8a* a, int64_t k, const Acts& acts) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    const int64_t nb = k / 32;
    __m256 acc = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        prefetch_ahead<8 * sizeof(typename T::Block)>(w + b);
        __m256i A, S;
        legacy_sums8<T>(w + b, a + b, acts, b, A, S);
        const __m256 da = acts.d8(b);
        const __m256 dw = half8(&w[b].d, sizeof(typename T::Block));
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(A));
        if constexpr (T::kMin) {
            const __m256 mw = half8(&w[b].m, sizeof(typename T::Block));
            t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(S)));
        }
        acc = _mm256_add_ps(acc, t);
    }
    // Ragged tail: four blocks, then two, as vector steps; one left goes alone.
    bool high = false;
    if (b + 4 <= nb) {
        acc = legacy_tail<T, 4>(w + b, a + b, acc, false);
        b += 4;
        high = true;
    }
    if (b + 2 <= nb) {
        acc = legacy_tail<T, 2>(w + b, a + b, acc, high);
        b += 2;
    }
    if (b == nb) return fold8(acc);
    // The last block, added to its lane as the reference does.
    Lanes8 lanes;
    _mm256_storeu_ps(lanes.v, acc);
    for (; b < nb; ++b) {
        int32_t A, S;
        legacy_sums1<T>(w[b], a[b], A, S);
        if constexpr (T::kMin)
            lanes.v[b % 8] += term_offset(half1(w[b].d), half1(w[b].m), a[b].d, A, S);
        else
            lanes.v[b % 8] += term_scale(half1(w[b].d), a[b].d, A);
    }
    return lanes8_total(lanes);
}

template <class T>
float dot_legacy(const void* wv, const block_q8a* a, int64_t k) {
    return dot_legacy<T>(wv, a, k, BlockActs{a});
}

template <class T>
void int_sums_legacy(const void* wv, const block_q8a* a, int64_t k, int32_t* A, int32_t* S) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    const int64_t nb = k / 32;
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        __m256i va, vs;
        legacy_sums8<T>(w + b, a + b, BlockActs{a}, b, va, vs);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(A + b), va);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(S + b), vs);
    }
    for (; b < nb; ++b) legacy_sums1<T>(w[b], a[b], A[b], S[b]);
}

// ---- K-quants: sums() gives A and X of a super-block's eight 32-blocks ----

struct Q2_K {
    using Block = block_q2_K;
    static constexpr bool kMin = true;
    template <class Acts>
    static void sums(const Block& w, const block_q8a* a, const Acts&, int64_t, __m256i& A, __m256i& X) {
        const __m128i s8 = load16(w.scales);
        const __m128i m4 = _mm_set1_epi8(0x0F);
        __m256i sc[2], mn[2];
        split_scales16(_mm256_cvtepu8_epi16(_mm_and_si128(s8, m4)), sc);
        split_scales16(_mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s8, 4), m4)), mn);
        const __m256i m3 = _mm256_set1_epi8(3), ones = _mm256_set1_epi8(1);
        __m256i p[8], pm[8];
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            const __m256i Q = load32(w.qs + 32 * h);
#pragma GCC unroll 4
            for (int plane = 0; plane < 4; ++plane) {
                const int j = 4 * h + plane;
                const __m256i q = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * plane), m3);
                const __m256i aj = load_a(a[j]);
                p[j] = mul_sum_u8s8_sc16(q, aj, pair16(sc[h], plane));
                pm[j] = mul_sum_u8s8_sc16(ones, aj, pair16(mn[h], plane));
            }
        }
        A = reduce8(p);
        X = reduce8(pm);
    }
};

struct Q3_K {
    using Block = block_q3_K;
    static constexpr bool kMin = false;
    template <class Acts>
    static void sums(const Block& w, const block_q8a* a, const Acts&, int64_t, __m256i& A, __m256i& X) {
        uint32_t s[4];
        unpack_q3k_scales_words(w.scales, s);
        const __m128i biased = _mm_setr_epi32(int(s[0]), int(s[1]), int(s[2]), int(s[3]));
        __m256i sc[2];
        split_scales16(_mm256_cvtepi8_epi16(_mm_sub_epi8(biased, _mm_set1_epi8(32))), sc);
        const __m256i H = load32(w.hmask);
        const __m256i m3 = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
        __m256i p[8];
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            const __m256i Q = load32(w.qs + 32 * h);
#pragma GCC unroll 4
            for (int plane = 0; plane < 4; ++plane) {
                const int j = 4 * h + plane;
                const __m256i low = _mm256_and_si256(_mm256_srli_epi16(Q, 2 * plane), m3);
                const __m256i v = _mm256_sub_epi8(_mm256_or_si256(low, select_bit(H, j, 4)), four);
                p[j] = mul_sum_s8s8_sc16(v, load_a(a[j]), pair16(sc[h], plane));
            }
        }
        A = reduce8(p);
        X = _mm256_setzero_si256();
    }
};

// q4_K / q5_K scales and mins as eight int32 lanes each.
inline void k4_scales(const uint8_t* packed, __m256i& sc, __m256i& mn) {
    uint32_t s[2], m[2];
    unpack_k4_scales_words(packed, s, m);
    sc = _mm256_cvtepu8_epi32(_mm_setr_epi32(int(s[0]), int(s[1]), 0, 0));
    mn = _mm256_cvtepu8_epi32(_mm_setr_epi32(int(m[0]), int(m[1]), 0, 0));
}

struct Q4_K {
    using Block = block_q4_K;
    static constexpr bool kMin = true;
    template <class Acts>
    static void sums(const Block& w, const block_q8a* a, const Acts& acts, int64_t b, __m256i& A, __m256i& X) {
        __m256i sc, mn;
        k4_scales(w.scales, sc, mn);
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        __m256i p[8];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
            const __m256i Q = load32(w.qs + 32 * c);
            p[2 * c] = mul_sum_u8s8(_mm256_and_si256(Q, m4), load_a(a[2 * c]));
            p[2 * c + 1] = mul_sum_u8s8(_mm256_and_si256(_mm256_srli_epi16(Q, 4), m4), load_a(a[2 * c + 1]));
        }
        A = _mm256_mullo_epi32(reduce8(p), sc);
        X = _mm256_mullo_epi32(acts.sum8(b), mn);
    }
};

struct Q5_K {
    using Block = block_q5_K;
    static constexpr bool kMin = true;
    template <class Acts>
    static void sums(const Block& w, const block_q8a* a, const Acts& acts, int64_t b, __m256i& A, __m256i& X) {
        __m256i sc, mn;
        k4_scales(w.scales, sc, mn);
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        const __m256i H = load32(w.qh);
        __m256i p[8];
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
            const __m256i Q = load32(w.qs + 32 * c);
            const __m256i lo = _mm256_or_si256(_mm256_and_si256(Q, m4), select_bit(H, 2 * c, 0x10));
            const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(Q, 4), m4),
                                               select_bit(H, 2 * c + 1, 0x10));
            p[2 * c] = mul_sum_u8s8(lo, load_a(a[2 * c]));
            p[2 * c + 1] = mul_sum_u8s8(hi, load_a(a[2 * c + 1]));
        }
        A = _mm256_mullo_epi32(reduce8(p), sc);
        X = _mm256_mullo_epi32(acts.sum8(b), mn);
    }
};

struct Q6_K {
    using Block = block_q6_K;
    static constexpr bool kMin = false;
    template <class Acts>
    static void sums(const Block& w, const block_q8a* a, const Acts&, int64_t, __m256i& A, __m256i& X) {
        __m256i sc[2];
        split_scales16(_mm256_cvtepi8_epi16(load16(w.scales)), sc);
        const __m256i m4 = _mm256_set1_epi8(0x0F), m30 = _mm256_set1_epi8(0x30);
        const __m256i off = _mm256_set1_epi8(32);
        __m256i p[8];
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
            const __m256i L0 = load32(w.ql + 64 * h), L1 = load32(w.ql + 64 * h + 32);
            const __m256i Hb = load32(w.qh + 32 * h);
            // Quarter i: low nibble (i < 2) or high nibble of L(i % 2), high bits 2i..2i+1 of Hb.
            const __m256i q[4] = {
                _mm256_or_si256(_mm256_and_si256(L0, m4), _mm256_and_si256(_mm256_slli_epi16(Hb, 4), m30)),
                _mm256_or_si256(_mm256_and_si256(L1, m4), _mm256_and_si256(_mm256_slli_epi16(Hb, 2), m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L0, 4), m4), _mm256_and_si256(Hb, m30)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(L1, 4), m4),
                                _mm256_and_si256(_mm256_srli_epi16(Hb, 2), m30)),
            };
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i) {
                const int j = 4 * h + i;
                p[j] = mul_sum_s8s8_sc16(_mm256_sub_epi8(q[i], off), load_a(a[j]), pair16(sc[h], i));
            }
        }
        A = reduce8(p);
        X = _mm256_setzero_si256();
    }
};

template <class T, class Acts>
float dot_kquant(const void* wv, const block_q8a* a, int64_t k, const Acts& acts) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; ++i, a += 8) {
        prefetch_ahead<sizeof(typename T::Block)>(w + i);
        __m256i A, X;
        T::sums(w[i], a, acts, 8 * i, A, X);
        const __m256 da = acts.d8(8 * i);
        const __m256 d = _mm256_set1_ps(half1(w[i].d));
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(A));
        if constexpr (T::kMin) {
            const __m256 dmin = _mm256_set1_ps(half1(w[i].dmin));
            t = _mm256_sub_ps(t, _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(X)));
        }
        acc = _mm256_add_ps(acc, t);
    }
    return fold8(acc);
}

template <class T>
float dot_kquant(const void* wv, const block_q8a* a, int64_t k) {
    return dot_kquant<T>(wv, a, k, BlockActs{a});
}

template <class T>
void int_sums_kquant(const void* wv, const block_q8a* a, int64_t k, int32_t* A, int32_t* X) {
    const auto* w = static_cast<const typename T::Block*>(wv);
    for (int64_t i = 0; i < k / QK_K; ++i) {
        __m256i va, vx;
        T::sums(w[i], a + 8 * i, BlockActs{a}, 8 * i, va, vx);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(A + 8 * i), va);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(X + 8 * i), vx);
    }
}

// ---- one token, many rows -------------------------------------------------
//
// Every row of a one-token matmul reads the same activations, so their
// eight-block scales and sums are gathered into planes once rather than once
// a row (docs/perf/LOG.md c18). out[r] is row r's dot(), bit for bit.

constexpr int64_t kPlaneBlocks = 2048;  // rows of up to 65,536 elements: 16 KiB of planes on the stack

template <class RowFn>
inline void rows_over_planes(const void* w, size_t row_stride, int64_t n_rows, const block_q8a* a, int64_t k,
                             float* out, RowFn row) {
    const auto* base = static_cast<const uint8_t*>(w);
    const int64_t nb = k / 32;
    if (nb > kPlaneBlocks) {
        for (int64_t r = 0; r < n_rows; ++r) out[r] = row(base + size_t(r) * row_stride, BlockActs{a});
        return;
    }
    alignas(32) float d[kPlaneBlocks];
    alignas(32) int32_t sum[kPlaneBlocks];
    for (int64_t b = 0; b < nb; ++b) {
        d[b] = a[b].d;
        sum[b] = a[b].sum;
    }
    const PlanarActs planes{d, sum};
    for (int64_t r = 0; r < n_rows; ++r) out[r] = row(base + size_t(r) * row_stride, planes);
}

template <class T>
void dot_legacy_rows(const void* w, size_t row_stride, int64_t n_rows, const block_q8a* a, int64_t k, float* out) {
    rows_over_planes(w, row_stride, n_rows, a, k, out,
                     [&](const void* row, const auto& acts) { return dot_legacy<T>(row, a, k, acts); });
}

template <class T>
void dot_kquant_rows(const void* w, size_t row_stride, int64_t n_rows, const block_q8a* a, int64_t k, float* out) {
    rows_over_planes(w, row_stride, n_rows, a, k, out,
                     [&](const void* row, const auto& acts) { return dot_kquant<T>(row, a, k, acts); });
}

// ---- float rows: element k into lane k % 16 (two registers of eight) -------

struct F32 {
    static constexpr size_t kBytes = 4;  // a weight's
    static __m256 load8(const void* w, int64_t i) { return _mm256_loadu_ps(static_cast<const float*>(w) + i); }
    static float load1(const void* w, int64_t i) { return static_cast<const float*>(w)[i]; }
};
struct F16 {
    static constexpr size_t kBytes = 2;
    static __m256 load8(const void* w, int64_t i) {
        return _mm256_cvtph_ps(load16(static_cast<const uint16_t*>(w) + i));
    }
    static float load1(const void* w, int64_t i) { return half1(static_cast<const uint16_t*>(w)[i]); }
};
struct BF16 {
    static constexpr size_t kBytes = 2;
    static __m256 load8(const void* w, int64_t i) {
        const __m256i u = _mm256_cvtepu16_epi32(load16(static_cast<const uint16_t*>(w) + i));
        return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
    }
    static float load1(const void* w, int64_t i) {
        const uint32_t u = uint32_t(static_cast<const uint16_t*>(w)[i]) << 16;
        float f;
        std::memcpy(&f, &u, 4);
        return f;
    }
};

template <class T>
float dot_float(const void* w, const float* x, int64_t k) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        prefetch_ahead<16 * T::kBytes>(static_cast<const char*>(w) + i * int64_t(T::kBytes));
        acc0 = _mm256_add_ps(acc0, _mm256_mul_ps(T::load8(w, i), _mm256_loadu_ps(x + i)));
        acc1 = _mm256_add_ps(acc1, _mm256_mul_ps(T::load8(w, i + 8), _mm256_loadu_ps(x + i + 8)));
    }
    if (i == k) return fold8(_mm256_add_ps(acc0, acc1));
    Lanes16 lanes;
    _mm256_storeu_ps(lanes.v, acc0);
    _mm256_storeu_ps(lanes.v + 8, acc1);
    for (; i < k; ++i) {
        const float p = T::load1(w, i) * x[i];
        lanes.v[i % 16] += p;
    }
    return lanes16_total(lanes);
}

// ---- activation quantization: quantize_act_block_ref, eight lanes at a time --

inline void quantize_act_row_x86(const float* x, block_q8a* y, int64_t k) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 lo = _mm256_set1_ps(-127.0f), hi = _mm256_set1_ps(127.0f);
    const __m256 half = _mm256_set1_ps(0.5f), neg_half = _mm256_set1_ps(-0.5f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int64_t b = 0; b < k / QK8A; ++b, x += QK8A) {
        __m256 v[4];
        __m256 mx = _mm256_setzero_ps();
        for (int i = 0; i < 4; ++i) {
            v[i] = _mm256_loadu_ps(x + 8 * i);
            mx = _mm256_max_ps(_mm256_andnot_ps(sign, v[i]), mx);  // a NaN lane keeps mx
        }
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        m = _mm_max_ss(m, _mm_movehdup_ps(m));
        const float d = _mm_cvtss_f32(m) / 127.0f;
        y[b].d = d;
        if (d == 0.0f) {
            std::memset(y[b].qs, 0, sizeof y[b].qs);
            y[b].sum = 0;
            continue;
        }
        const __m256 dv = _mm256_set1_ps(d);
        __m256i q[4];
        for (int i = 0; i < 4; ++i) {
            __m256 t = _mm256_div_ps(v[i], dv);
            t = _mm256_min_ps(_mm256_max_ps(t, lo), hi);  // max(NaN, lo) = lo, as the reference
            const __m256i tz = _mm256_cvttps_epi32(t);
            const __m256 frac = _mm256_sub_ps(t, _mm256_cvtepi32_ps(tz));
            const __m256i up = _mm256_castps_si256(_mm256_cmp_ps(frac, half, _CMP_GE_OQ));
            const __m256i down = _mm256_castps_si256(_mm256_cmp_ps(frac, neg_half, _CMP_LE_OQ));
            q[i] = _mm256_add_epi32(_mm256_sub_epi32(tz, up), down);
        }
        const __m256i s = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(y[b].qs), _mm256_permutevar8x32_epi32(p8, order));
        y[b].sum = hsum_i32(s);
    }
}

}  // namespace
}  // namespace tern::quant::detail
