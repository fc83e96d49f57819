// The x86 multi-token kernels (prefill), and the table of every kernel this
// path exports. Included by dot_avx2.cpp and dot_avx512.cpp right after
// dot_x86_body.h, whose helpers they reuse.
//
// A one-token kernel unpacks every weight block for every token, and reduces
// each block's eight partial-sum lanes horizontally. These kernels read the
// activations packed by pack_act_tokens (quant/dot.h): word 8s + j of a
// group's 256 bytes is elements 4s..4s+3 of block j, so a 32-byte vector
// holds four elements of each of eight blocks, lane j belonging to block j.
// Per group of eight 32-blocks (one super-block for the K-quants) the weight
// row is unpacked once into eight such "step" vectors (a transpose of the
// blocks' bytes), then every token's eight steps are multiplied and summed
// lane-wise: lane j ends with block j's exact integer sums, no horizontal
// reduction. The float terms are then formed and added exactly as the
// one-token kernels form and add them, so each token gets the same bits.
//
// Not a public header; everything is in an unnamed namespace.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "quant/dot_internal.h"

namespace tern::quant::detail {
namespace {
namespace tokens {

// ---- steps: lane j of step s holds elements 4s..4s+3 of block j -------------

// Signed weights: the magnitude (<= 128) is the unsigned factor and the sign
// moves onto the activation (as mul_sum_s8s8); kept apart so the magnitude is
// taken once per group rather than once per token.
struct SignedBytes {
    __m256i mag, sign;
};
inline SignedBytes signed_bytes(__m256i w) { return {_mm256_abs_epi8(w), w}; }

inline __m256i load_step(const int8_t* a, int s) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 32 * s));
}

// The unsigned factor of a step and the activation step it multiplies.
inline __m256i magnitude(__m256i u) { return u; }
inline __m256i magnitude(const SignedBytes& w) { return w.mag; }
inline __m256i signed_step(__m256i, __m256i a) { return a; }
inline __m256i signed_step(const SignedBytes& w, __m256i a) { return _mm256_sign_epi8(a, w.sign); }

// Integer sums of one token's group: lane j of lo is the sum over block j's
// elements 0..15 (steps 0..3), of hi over elements 16..31 (steps 4..7).
// kSmall: every unsigned factor is <= 32 (all types but q8_0), which lets
// the AVX2 path add four steps' products as int16 (mul_sum4_u8s8).
template <bool kSmall, class W>
inline void group_sums(const W* w, const int8_t* a, __m256i& lo, __m256i& hi) {
    __m256i u[8], x[8];
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
        u[s] = magnitude(w[s]);
        x[s] = signed_step(w[s], load_step(a, s));
    }
    if constexpr (kSmall) {
        lo = mul_sum4_u8s8(u, x);
        hi = mul_sum4_u8s8(u + 4, x + 4);
    } else {
        lo = hi = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) {
            lo = mul_sum_u8s8_acc(lo, u[s], x[s]);
            hi = mul_sum_u8s8_acc(hi, u[s + 4], x[s + 4]);
        }
    }
}

// Word j of out[s] = word s of the 32 bytes at p[j] (an 8 x 8 transpose).
inline void steps_from_rows32(const uint8_t* const* p, __m256i* out) {
    __m256i t[8], u[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j += 2) {
        const __m256i r0 = load32(p[j]), r1 = load32(p[j + 1]);
        t[j] = _mm256_unpacklo_epi32(r0, r1);      // r0[0] r1[0] r0[1] r1[1] | r0[4] ...
        t[j + 1] = _mm256_unpackhi_epi32(r0, r1);  // r0[2] r1[2] r0[3] r1[3] | r0[6] ...
    }
#pragma GCC unroll 8
    for (int j = 0; j < 8; j += 4) {
        u[j] = _mm256_unpacklo_epi64(t[j], t[j + 2]);  // word 0 of four rows | word 4
        u[j + 1] = _mm256_unpackhi_epi64(t[j], t[j + 2]);
        u[j + 2] = _mm256_unpacklo_epi64(t[j + 1], t[j + 3]);
        u[j + 3] = _mm256_unpackhi_epi64(t[j + 1], t[j + 3]);
    }
#pragma GCC unroll 8
    for (int s = 0; s < 4; ++s) {
        out[s] = _mm256_permute2x128_si256(u[s], u[s + 4], 0x20);
        out[s + 4] = _mm256_permute2x128_si256(u[s], u[s + 4], 0x31);
    }
}

// Word j of out[s] = word s of the 16 bytes at p[j], s < 4.
inline void steps_from_rows16(const uint8_t* const* p, __m256i* out) {
    __m256i r[4];
#pragma GCC unroll 8
    for (int j = 0; j < 4; ++j)
        r[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(load16(p[j])), load16(p[j + 4]), 1);
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    out[0] = _mm256_unpacklo_epi64(t0, t2);
    out[1] = _mm256_unpackhi_epi64(t0, t2);
    out[2] = _mm256_unpacklo_epi64(t1, t3);
    out[3] = _mm256_unpackhi_epi64(t1, t3);
}

// Word j of out[s] = word s of chunk idx[j] of the four 32-byte chunks at p
// (idx[j] in 0..3).
inline void steps_from_chunks4(const uint8_t* p, __m256i idx, __m256i* out) {
    const __m256i c0 = load32(p), c1 = load32(p + 32), c2 = load32(p + 64), c3 = load32(p + 96);
    const __m256i t0 = _mm256_unpacklo_epi32(c0, c1), t1 = _mm256_unpackhi_epi32(c0, c1);
    const __m256i t2 = _mm256_unpacklo_epi32(c2, c3), t3 = _mm256_unpackhi_epi32(c2, c3);
    // u[s]: word s of chunks 0..3 | word s + 4 of chunks 0..3
    const __m256i u[4] = {_mm256_unpacklo_epi64(t0, t2), _mm256_unpackhi_epi64(t0, t2),
                          _mm256_unpacklo_epi64(t1, t3), _mm256_unpackhi_epi64(t1, t3)};
    const __m256i idx_hi = _mm256_add_epi32(idx, _mm256_set1_epi32(4));
#pragma GCC unroll 8
    for (int s = 0; s < 4; ++s) {
        out[s] = _mm256_permutevar8x32_epi32(u[s], idx);
        out[s + 4] = _mm256_permutevar8x32_epi32(u[s], idx_hi);
    }
}

// Word j of out[s] = word s of chunk j / 4, two 32-byte chunks at p.
inline void steps_from_chunks2(const uint8_t* p, __m256i* out) {
    const __m256i h0 = load32(p), h1 = load32(p + 32);
    // g[0]: h0[0] h1[0] h0[1] h1[1] | h0[4] h1[4] h0[5] h1[5];  g[1]: words 2, 3 | 6, 7
    const __m256i g[2] = {_mm256_unpacklo_epi32(h0, h1), _mm256_unpackhi_epi32(h0, h1)};
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) {
        const int o = 2 * (s & 1) + 4 * (s >> 2);
        const __m256i idx = _mm256_setr_epi32(o, o, o, o, o + 1, o + 1, o + 1, o + 1);
        out[s] = _mm256_permutevar8x32_epi32(g[(s >> 1) & 1], idx);
    }
}

// Byte i of word j = value where bit 4s + i of word j of h is set (i < 4).
inline __m256i expand_word_bits(__m256i h, int s, char value) {
    const __m256i x = _mm256_srlv_epi32(h, _mm256_set1_epi32(4 * s));
    const __m256i spread = _mm256_shuffle_epi8(
        x, _mm256_setr_epi8(0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12,
                            0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12));
    const __m256i bit = _mm256_set1_epi32(0x08040201);
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(value));
}

// Byte i of word j = value where bit j of byte i of w is set.
inline __m256i expand_lane_bits(uint32_t w, char value) {
    const __m256i v = _mm256_set1_epi32(int(w));
    const __m256i bit = _mm256_setr_epi32(0x01010101, 0x02020202, 0x04040404, 0x08080808, 0x10101010, 0x20202020,
                                          0x40404040, int(0x80808080u));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit), _mm256_set1_epi8(value));
}

// Bytes (x >> shift_j) & mask, shift_j per word j.
inline __m256i field(__m256i x, __m256i shift, char mask) {
    return _mm256_and_si256(_mm256_srlv_epi32(x, shift), _mm256_set1_epi8(mask));
}

// The sixteen per-16-element scales of a K-quant super-block, bytes at s16
// (scale 2j + h scales half h of block j): lane j of lo / hi.
inline void half_scales_u8(__m128i s16, __m256i& lo, __m256i& hi) {
    const __m128i split = _mm_shuffle_epi8(s16, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    lo = _mm256_cvtepu8_epi32(split);
    hi = _mm256_cvtepu8_epi32(_mm_srli_si128(split, 8));
}
inline void half_scales_s8(__m128i s16, __m256i& lo, __m256i& hi) {
    const __m128i split = _mm_shuffle_epi8(s16, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    lo = _mm256_cvtepi8_epi32(split);
    hi = _mm256_cvtepi8_epi32(_mm_srli_si128(split, 8));
}

// ---- 32-element types: a group is eight blocks -------------------------------

// A group's eight blocks, by address: the blocks of a row, or at its ragged
// end the row's last blocks and zero blocks (read where they lie: a tail
// copied into a buffer first made every load of it wait on the copy's stores).
template <class Block>
using Blocks8 = const Block* const*;

template <class Block>
inline void nibble_steps(Blocks8<Block> w, __m256i* out) {
    const uint8_t* rows[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) rows[j] = w[j]->qs;
    __m256i words[4];
    steps_from_rows16(rows, words);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 8
    for (int s = 0; s < 4; ++s) {
        out[s] = _mm256_and_si256(words[s], m4);                             // elements 4s..4s+3
        out[s + 4] = _mm256_and_si256(_mm256_srli_epi16(words[s], 4), m4);  // elements 16+4s..
    }
}

template <class Block>
inline void nibble5_steps(Blocks8<Block> w, __m256i* out) {
    nibble_steps(w, out);
    const __m256i h = _mm256_setr_epi32(int(load_u32(w[0]->qh)), int(load_u32(w[1]->qh)), int(load_u32(w[2]->qh)),
                                        int(load_u32(w[3]->qh)), int(load_u32(w[4]->qh)), int(load_u32(w[5]->qh)),
                                        int(load_u32(w[6]->qh)), int(load_u32(w[7]->qh)));
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) out[s] = _mm256_or_si256(out[s], expand_word_bits(h, s, 0x10));
}

// Step weights (unsigned or SignedBytes) and the offset / min handling of
// each type, as in the one-token kernels (dot_x86_body.h).
struct Q4_0 {
    using Block = block_q4_0;
    using W = __m256i;
    static constexpr int kOffsetShift = 3;
    static constexpr bool kMin = false;
    static constexpr bool kSmall = true;
    static void steps(Blocks8<Block> w, W* out) { nibble_steps(w, out); }
};
struct Q4_1 {
    using Block = block_q4_1;
    using W = __m256i;
    static constexpr int kOffsetShift = 0;
    static constexpr bool kMin = true;
    static constexpr bool kSmall = true;
    static void steps(Blocks8<Block> w, W* out) { nibble_steps(w, out); }
};
struct Q5_0 {
    using Block = block_q5_0;
    using W = __m256i;
    static constexpr int kOffsetShift = 4;
    static constexpr bool kMin = false;
    static constexpr bool kSmall = true;
    static void steps(Blocks8<Block> w, W* out) { nibble5_steps(w, out); }
};
struct Q5_1 {
    using Block = block_q5_1;
    using W = __m256i;
    static constexpr int kOffsetShift = 0;
    static constexpr bool kMin = true;
    static constexpr bool kSmall = true;
    static void steps(Blocks8<Block> w, W* out) { nibble5_steps(w, out); }
};
struct Q8_0 {
    using Block = block_q8_0;
    using W = SignedBytes;
    static constexpr int kOffsetShift = 0;
    static constexpr bool kMin = false;
    static constexpr bool kSmall = false;  // magnitudes up to 128
    static void steps(Blocks8<Block> w, W* out) {
        const uint8_t* rows[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) rows[j] = reinterpret_cast<const uint8_t*>(w[j]->qs);
        __m256i v[8];
        steps_from_rows32(rows, v);
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) out[s] = signed_bytes(v[s]);
    }
};

// Eight blocks' steps and scales, then each token's eight float terms formed
// as dot_legacy forms them.
template <class T>
struct LegacyGroup {
    typename T::W w[8];
    __m256 dw, mw;

    explicit LegacyGroup(Blocks8<typename T::Block> blocks) {
        T::steps(blocks, w);
        dw = halves(blocks, &T::Block::d);
        mw = _mm256_setzero_ps();
        if constexpr (T::kMin) mw = halves(blocks, &T::Block::m);
    }

    // Lane j: the f16 field f of block j.
    template <class F>
    static __m256 halves(Blocks8<typename T::Block> b, F T::Block::*f) {
        return _mm256_cvtph_ps(_mm_setr_epi16(short(b[0]->*f), short(b[1]->*f), short(b[2]->*f), short(b[3]->*f),
                                              short(b[4]->*f), short(b[5]->*f), short(b[6]->*f), short(b[7]->*f)));
    }

    __m256 term(const int8_t* a, const float* d, const int32_t* sum) const {
        __m256i lo, hi;
        group_sums<T::kSmall>(w, a, lo, hi);
        __m256i A = _mm256_add_epi32(lo, hi);
        const __m256 da = _mm256_loadu_ps(d);
        __m256i S = _mm256_setzero_si256();
        if constexpr (T::kMin || T::kOffsetShift != 0) S = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum));
        if constexpr (T::kOffsetShift != 0) A = _mm256_sub_epi32(A, _mm256_slli_epi32(S, T::kOffsetShift));
        __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw, da), _mm256_cvtepi32_ps(A));
        if constexpr (T::kMin) t = _mm256_add_ps(t, _mm256_mul_ps(_mm256_mul_ps(mw, da), _mm256_cvtepi32_ps(S)));
        return t;
    }
};

// ---- K-quants: a group is one super-block ------------------------------------

struct Q2_K {
    using Block = block_q2_K;
    __m256i q[8];
    __m256i sc_lo, sc_hi, mn_lo, mn_hi;
    __m256 d, dmin;

    explicit Q2_K(const Block& w) {
        steps_from_chunks2(w.qs, q);
        const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);  // plane j % 4
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) q[s] = field(q[s], shift, 3);
        const __m128i s16 = load16(w.scales), m4 = _mm_set1_epi8(0x0F);
        half_scales_u8(_mm_and_si128(s16, m4), sc_lo, sc_hi);
        half_scales_u8(_mm_and_si128(_mm_srli_epi16(s16, 4), m4), mn_lo, mn_hi);
        d = _mm256_set1_ps(half1(w.d));
        dmin = _mm256_set1_ps(half1(w.dmin));
    }

    __m256 term(const int8_t* a, const float* da_p, const int32_t* sum) const {
        __m256i lo, hi;
        group_sums<true>(q, a, lo, hi);
        const __m256i A = _mm256_add_epi32(_mm256_mullo_epi32(lo, sc_lo), _mm256_mullo_epi32(hi, sc_hi));
        // Activation sums of each block's two halves: the first from the steps, the second by difference.
        __m256i a_lo = _mm256_setzero_si256();
        const __m256i ones = _mm256_set1_epi8(1);
#pragma GCC unroll 4
        for (int s = 0; s < 4; ++s) a_lo = mul_sum_u8s8_acc(a_lo, ones, load_step(a, s));
        const __m256i a_hi = _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum)), a_lo);
        const __m256i X = _mm256_add_epi32(_mm256_mullo_epi32(a_lo, mn_lo), _mm256_mullo_epi32(a_hi, mn_hi));
        const __m256 da = _mm256_loadu_ps(da_p);
        const __m256 p = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(A));
        return _mm256_sub_ps(p, _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(X)));
    }
};

// q3_K and q6_K: signed steps, a scale per 16 elements, no min.
struct SignedHalves {
    SignedBytes v[8];
    __m256i sc_lo, sc_hi;
    __m256 d;

    __m256 term(const int8_t* a, const float* da_p, const int32_t*) const {
        __m256i lo, hi;
        group_sums<true>(v, a, lo, hi);
        const __m256i A = _mm256_add_epi32(_mm256_mullo_epi32(lo, sc_lo), _mm256_mullo_epi32(hi, sc_hi));
        return _mm256_mul_ps(_mm256_mul_ps(d, _mm256_loadu_ps(da_p)), _mm256_cvtepi32_ps(A));
    }
};

struct Q3_K : SignedHalves {
    using Block = block_q3_K;
    explicit Q3_K(const Block& w) {
        __m256i q[8];
        steps_from_chunks2(w.qs, q);
        const __m256i shift = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);  // plane j % 4
        const __m256i four = _mm256_set1_epi8(4);
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
            const __m256i high = expand_lane_bits(load_u32(w.hmask + 4 * s), 4);  // bit j of hmask[l]
            v[s] = signed_bytes(_mm256_sub_epi8(_mm256_or_si256(field(q[s], shift, 3), high), four));
        }
        uint32_t s[4];
        unpack_q3k_scales_words(w.scales, s);
        const __m128i biased = _mm_setr_epi32(int(s[0]), int(s[1]), int(s[2]), int(s[3]));
        half_scales_s8(_mm_sub_epi8(biased, _mm_set1_epi8(32)), sc_lo, sc_hi);
        d = _mm256_set1_ps(half1(w.d));
    }
};

struct Q6_K : SignedHalves {
    using Block = block_q6_K;
    explicit Q6_K(const Block& w) {
        // Block j = 4h + i: low nibble (i < 2) or high nibble of ql[64h + 32(i % 2) + l],
        // bits 2i..2i+1 of qh[32h + l].
        __m256i low[8], high[8];
        steps_from_chunks4(w.ql, _mm256_setr_epi32(0, 1, 0, 1, 2, 3, 2, 3), low);
        steps_from_chunks2(w.qh, high);
        const __m256i nib = _mm256_setr_epi32(0, 0, 4, 4, 0, 0, 4, 4), pair = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
        const __m256i off = _mm256_set1_epi8(32);
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
            const __m256i q = _mm256_or_si256(field(low[s], nib, 0x0F), _mm256_slli_epi32(field(high[s], pair, 3), 4));
            v[s] = signed_bytes(_mm256_sub_epi8(q, off));
        }
        half_scales_s8(load16(w.scales), sc_lo, sc_hi);
        d = _mm256_set1_ps(half1(w.d));
    }
};

// q4_K and q5_K: unsigned steps, a scale and a min per 32-block.
struct UnsignedScaled {
    __m256i q[8];
    __m256i sc, mn;
    __m256 d, dmin;

    __m256 term(const int8_t* a, const float* da_p, const int32_t* sum) const {
        __m256i lo, hi;
        group_sums<true>(q, a, lo, hi);
        const __m256i A = _mm256_mullo_epi32(_mm256_add_epi32(lo, hi), sc);
        const __m256i X = _mm256_mullo_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sum)), mn);
        const __m256 da = _mm256_loadu_ps(da_p);
        const __m256 p = _mm256_mul_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(A));
        return _mm256_sub_ps(p, _mm256_mul_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(X)));
    }
};

// Block j = 2c + h is nibble h of qs[32c + l].
inline void k4_steps(const uint8_t* qs, __m256i* q) {
    steps_from_chunks4(qs, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3), q);
    const __m256i nib = _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4);
#pragma GCC unroll 8
    for (int s = 0; s < 8; ++s) q[s] = field(q[s], nib, 0x0F);
}

struct Q4_K : UnsignedScaled {
    using Block = block_q4_K;
    explicit Q4_K(const Block& w) {
        k4_steps(w.qs, q);
        k4_scales(w.scales, sc, mn);
        d = _mm256_set1_ps(half1(w.d));
        dmin = _mm256_set1_ps(half1(w.dmin));
    }
};

struct Q5_K : UnsignedScaled {
    using Block = block_q5_K;
    explicit Q5_K(const Block& w) {
        k4_steps(w.qs, q);
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) q[s] = _mm256_or_si256(q[s], expand_lane_bits(load_u32(w.qh + 4 * s), 0x10));
        k4_scales(w.scales, sc, mn);
        d = _mm256_set1_ps(half1(w.d));
        dmin = _mm256_set1_ps(half1(w.dmin));
    }
};

// ---- the kernels ----------------------------------------------------------------

// One group (built from the weights once) against every token: token t's
// eight terms go into its accumulator, lane j <- block j, as in the one-token
// kernels. kN > 0: a count known at compile time (the accumulators stay in
// registers); 0: n tokens.
template <int kN, class Group>
inline void group_tokens(const Group& g, const ActTokens& a, int64_t b, int n, __m256* acc) {
    if constexpr (kN > 0) n = kN;
#pragma GCC unroll 8
    for (int t = 0; t < n; ++t) {
        const int64_t at = t * a.stride + b;
        acc[t] = _mm256_add_ps(acc[t], g.term(a.qs + 32 * at, a.d + at, a.sum + at));
    }
}

template <class T, int kN>
void dot_legacy_tokens_n(const void* wv, const ActTokens& a, int n, int64_t k, float* out, int64_t out_stride) {
    if constexpr (kN > 0) n = kN;
    using Block = typename T::Block;
    const auto* w = static_cast<const Block*>(wv);
    const int64_t nb = k / 32;
    __m256 acc[kDotMaxTokens];
    for (int t = 0; t < n; ++t) acc[t] = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b + 8 <= nb; b += 8) {
        prefetch_ahead<8 * sizeof(Block)>(w + b);
        const Block* group[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; ++j) group[j] = w + b + j;
        group_tokens<kN>(LegacyGroup<T>(group), a, b, n, acc);
    }
    if (b < nb) {
        // Ragged tail: zero blocks pad the group. Their lanes (zero weights,
        // zero activations from the packing) add +0.0f, which leaves an
        // accumulator that started at +0.0f unchanged, so lane b % 8 still
        // holds exactly the one-token kernel's sum.
        static const Block zero{};
        const Block* group[8];
        for (int j = 0; j < 8; ++j) group[j] = b + j < nb ? w + b + j : &zero;
        group_tokens<kN>(LegacyGroup<T>(group), a, b, n, acc);
    }
    for (int t = 0; t < n; ++t) out[t * out_stride] = fold8(acc[t]);
}

template <class T, int kN>
void dot_kquant_tokens_n(const void* wv, const ActTokens& a, int n, int64_t k, float* out, int64_t out_stride) {
    if constexpr (kN > 0) n = kN;
    const auto* w = static_cast<const typename T::Block*>(wv);
    __m256 acc[kDotMaxTokens];
    for (int t = 0; t < n; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t i = 0; i < k / QK_K; ++i) {
        prefetch_ahead<sizeof(typename T::Block)>(w + i);
        group_tokens<kN>(T(w[i]), a, 8 * i, n, acc);
    }
    for (int t = 0; t < n; ++t) out[t * out_stride] = fold8(acc[t]);
}

// A full set of tokens (every call of a long prompt but the last) with the
// count fixed at compile time; fewer with it read at run time.
template <class T>
void dot_legacy_tokens(const void* w, const ActTokens& a, int n, int64_t k, float* out, int64_t out_stride) {
    if (n == kDotMaxTokens) return dot_legacy_tokens_n<T, kDotMaxTokens>(w, a, n, k, out, out_stride);
    dot_legacy_tokens_n<T, 0>(w, a, n, k, out, out_stride);
}
template <class T>
void dot_kquant_tokens(const void* w, const ActTokens& a, int n, int64_t k, float* out, int64_t out_stride) {
    if (n == kDotMaxTokens) return dot_kquant_tokens_n<T, kDotMaxTokens>(w, a, n, k, out, out_stride);
    dot_kquant_tokens_n<T, 0>(w, a, n, k, out, out_stride);
}

// ---- float rows: NT tokens share each converted weight vector ------------------
//
// NT is a compile-time count so the 2 * NT accumulators stay in registers
// (sixteen ymm registers on AVX2: NT <= 4).

template <class T, int NT>
void dot_float_tokens_n(const void* w, const float* x, int64_t x_stride, int64_t k, float* out,
                        int64_t out_stride) {
    __m256 acc0[NT], acc1[NT];
    for (int t = 0; t < NT; ++t) acc0[t] = acc1[t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= k; i += 16) {
        prefetch_ahead<16 * T::kBytes>(static_cast<const char*>(w) + i * int64_t(T::kBytes));
        const __m256 w0 = T::load8(w, i), w1 = T::load8(w, i + 8);
        for (int t = 0; t < NT; ++t) {
            const float* xt = x + t * x_stride + i;
            acc0[t] = _mm256_add_ps(acc0[t], _mm256_mul_ps(w0, _mm256_loadu_ps(xt)));
            acc1[t] = _mm256_add_ps(acc1[t], _mm256_mul_ps(w1, _mm256_loadu_ps(xt + 8)));
        }
    }
    for (int t = 0; t < NT; ++t) {
        if (i == k) {
            out[t * out_stride] = fold8(_mm256_add_ps(acc0[t], acc1[t]));
            continue;
        }
        // Ragged tail, lane by lane as dot_float does.
        const float* xt = x + t * x_stride;
        Lanes16 lanes;
        _mm256_storeu_ps(lanes.v, acc0[t]);
        _mm256_storeu_ps(lanes.v + 8, acc1[t]);
        for (int64_t e = i; e < k; ++e) {
            const float p = T::load1(w, e) * xt[e];
            lanes.v[e % 16] += p;
        }
        out[t * out_stride] = lanes16_total(lanes);
    }
}

template <class T>
void dot_float_tokens(const void* w, const float* x, int64_t x_stride, int n, int64_t k, float* out,
                      int64_t out_stride) {
    for (; n >= 4; n -= 4, x += 4 * x_stride, out += 4 * out_stride)
        dot_float_tokens_n<T, 4>(w, x, x_stride, k, out, out_stride);
    switch (n) {
    case 3: dot_float_tokens_n<T, 3>(w, x, x_stride, k, out, out_stride); break;
    case 2: dot_float_tokens_n<T, 2>(w, x, x_stride, k, out, out_stride); break;
    case 1: dot_float_tokens_n<T, 1>(w, x, x_stride, k, out, out_stride); break;
    default: break;
    }
}

}  // namespace tokens

// ---- this path's table -----------------------------------------------------------

template <class T, class Tokens>
constexpr IntKernel legacy() {
    return {dot_legacy<T>, int_sums_legacy<T>, tokens::dot_legacy_tokens<Tokens>, dot_legacy_rows<T>};
}
template <class T, class Tokens>
constexpr IntKernel kquant() {
    return {dot_kquant<T>, int_sums_kquant<T>, tokens::dot_kquant_tokens<Tokens>, dot_kquant_rows<T>};
}

const PathKernels kX86Kernels = {
    legacy<Q4_0, tokens::Q4_0>(), legacy<Q4_1, tokens::Q4_1>(), legacy<Q5_0, tokens::Q5_0>(),
    legacy<Q5_1, tokens::Q5_1>(), legacy<Q8_0, tokens::Q8_0>(),
    kquant<Q2_K, tokens::Q2_K>(), kquant<Q3_K, tokens::Q3_K>(), kquant<Q4_K, tokens::Q4_K>(),
    kquant<Q5_K, tokens::Q5_K>(), kquant<Q6_K, tokens::Q6_K>(),
    dot_float<F32>, dot_float<F16>, dot_float<BF16>,
    quantize_act_row_x86,
    tokens::dot_float_tokens<F32>, tokens::dot_float_tokens<F16>, tokens::dot_float_tokens<BF16>,
};

}  // namespace
}  // namespace tern::quant::detail
