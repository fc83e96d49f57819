// Pieces shared by the per-path kernel files (dot_scalar.cpp, dot_avx2.cpp,
// dot_avx512.cpp) and the dispatcher: the table of kernels each path exports,
// the float combination every path must follow, and block-header decoding.
//
// Everything here is `static inline`: these files are compiled with different
// instruction-set flags, and an ordinary inline function would be emitted in
// each of them under one linkage name, letting the linker keep an AVX-512 copy
// for the scalar path. Internal linkage keeps each file's copy its own.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "quant/act_quant.h"
#include "quant/blocks.h"
#include "quant/dot.h"

namespace tern::quant::detail {

using ActQuantFn = void (*)(const float* x, block_q8a* y, int64_t k);

struct IntKernel {
    DotRowFn row = nullptr;
    DotIntSumsFn int_sums = nullptr;
    DotTokensFn tokens = nullptr;
    DotRowsFn rows = nullptr;  // nullptr: the caller runs row() once a row
};

// What one path provides; a path compiled without its instruction set exports
// no table at all.
struct PathKernels {
    IntKernel q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K;
    DotFloatFn f32 = nullptr, f16 = nullptr, bf16 = nullptr;
    ActQuantFn quantize_act = nullptr;
    DotFloatTokensFn f32_tokens = nullptr, f16_tokens = nullptr, bf16_tokens = nullptr;
};

const PathKernels* path_kernels_scalar();
const PathKernels* path_kernels_avx2();    // nullptr unless built for x86 with the flags
const PathKernels* path_kernels_avx512();  // likewise

// The float term t_b of every 32-element block of a row, in block order: the
// values each path adds into its eight lanes (scalar code, one kernel per
// integer type; nullptr for other types). dot_block_terms() is its public face.
using DotTermsFn = void (*)(const void* w_row, const block_q8a* a, int64_t k, float* terms);
DotTermsFn block_terms_scalar(TensorType type);
// The CUDA kernels' result for a K-quant row (kquant_inner_* below) on
// activations from quantize_act_row_grouped; nullptr for other types.
DotRowFn row_grouped_scalar(TensorType type);

// The scalar activation quantizer (act_quant.cpp), the reference the SIMD
// quantizers reproduce bit for bit.
void quantize_act_row_scalar(const float* x, block_q8a* y, int64_t k);

// ---- float combination (the order every path reproduces) ------------------
//
// Block b of a row (32 elements) contributes one float term t_b, built from
// its exact integer sums; t_b is added into lane b % 8 of eight accumulators,
// starting from +0.0f, and the lanes are summed as
//     ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)),
// which is how a 256-bit register is folded in half three times.

struct Lanes8 {
    float v[8];
};

static inline void lanes8_clear(Lanes8& l) {
    for (float& x : l.v) x = 0.0f;
}

static inline float lanes8_total(const Lanes8& l) {
    const float a0 = l.v[0] + l.v[4], a1 = l.v[1] + l.v[5];
    const float a2 = l.v[2] + l.v[6], a3 = l.v[3] + l.v[7];
    const float b0 = a0 + a2, b1 = a1 + a3;
    return b0 + b1;
}

// q4_0, q5_0, q8_0, q3_K, q6_K:  (dw * da) * A
static inline float term_scale(float dw, float da, int32_t w_sum) { return (dw * da) * float(w_sum); }

// q4_1, q5_1 (x = d*q + m):  (dw * da) * A + (mw * da) * S,  S = sum of the activation block
static inline float term_offset(float dw, float mw, float da, int32_t w_sum, int32_t x_sum) {
    const float p = (dw * da) * float(w_sum);
    const float q = (mw * da) * float(x_sum);
    return p + q;
}

// q2_K, q4_K, q5_K (x = d*sc*q - dmin*m):  (d * da) * A - (dmin * da) * B
static inline float term_min(float d, float dmin, float da, int32_t w_sum, int32_t x_sum) {
    const float p = (d * da) * float(w_sum);
    const float q = (dmin * da) * float(x_sum);
    return p - q;
}

// ---- the CUDA kernels' K-quant order ---------------------------------------
//
// On the GPU a K-quant row is summed one super-block at a time: its eight
// blocks' integer sums A and X (as the terms above define them) are added as
// integers, which is exact, and the super-block contributes
//     r = fma(D, inner, r),   r from +0.0f, super-blocks in order,
// where D is the activations' scale, one per 256 elements
// (quantize_act_row_grouped), and inner is one of these. A tensor-core kernel
// then spends a few instructions per output and super-block instead of five
// per output and block (docs/perf/LOG.md g24).

// q2_K, q4_K, q5_K:  fma(-dmin, X, d * A)
static inline float kquant_inner_min(float d, float dmin, int32_t A, int32_t X) {
    return std::fma(-dmin, float(X), d * float(A));
}

// q3_K, q6_K:  d * A
static inline float kquant_inner_scale(float d, int32_t A) { return d * float(A); }

// Float rows: element k is added (as a product, never fused) into lane k % 16
// of sixteen accumulators, folded as l[i] += l[i+8], then +4, +2, +1.
struct Lanes16 {
    float v[16];
};

static inline float lanes16_total(Lanes16 l) {
    for (int w = 8; w >= 1; w /= 2)
        for (int i = 0; i < w; ++i) l.v[i] = l.v[i] + l.v[i + w];
    return l.v[0];
}

// ---- packed activations (ActTokens) ----------------------------------------

// Block b of token t, back as the block_q8a it was packed from.
static inline block_q8a act_block(const ActTokens& a, int64_t t, int64_t b) {
    block_q8a x;
    x.d = a.d[t * a.stride + b];
    x.sum = a.sum[t * a.stride + b];
    const int8_t* group = a.qs + t * 32 * a.stride + 256 * (b / 8) + 4 * (b % 8);
    for (int s = 0; s < 8; ++s) std::memcpy(x.qs + 4 * s, group + 32 * s, 4);
    return x;
}

// ---- block headers -------------------------------------------------------

static inline uint32_t load_u32(const uint8_t* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;  // little-endian, as the file
}

// q4_K / q5_K: eight 6-bit scales and mins packed in 12 bytes.
static inline void unpack_k4_scales(const uint8_t* s, uint8_t* sc, uint8_t* mn) {
    for (int j = 0; j < 4; ++j) {
        sc[j] = uint8_t(s[j] & 63);
        mn[j] = uint8_t(s[j + 4] & 63);
    }
    for (int j = 4; j < 8; ++j) {
        sc[j] = uint8_t((s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4));
        mn[j] = uint8_t((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
    }
}

// q3_K: sixteen 6-bit scales biased by 32, packed in 12 bytes; out: -32..31.
static inline void unpack_q3k_scales(const uint8_t* s, int8_t* out) {
    for (int j = 0; j < 16; ++j) {
        const int low = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
        const int high = (s[8 + j % 4] >> (2 * (j / 4))) & 3;
        out[j] = int8_t((low | (high << 4)) - 32);
    }
}

// The same two unpackings as word operations, four values per 32-bit word
// (byte i of a word is value i); the SIMD paths use these.
static inline void unpack_k4_scales_words(const uint8_t* s, uint32_t* sc, uint32_t* mn) {
    const uint32_t w0 = load_u32(s), w1 = load_u32(s + 4), w2 = load_u32(s + 8);
    sc[0] = w0 & 0x3f3f3f3fu;
    mn[0] = w1 & 0x3f3f3f3fu;
    sc[1] = (w2 & 0x0f0f0f0fu) | ((w0 >> 2) & 0x30303030u);
    mn[1] = ((w2 >> 4) & 0x0f0f0f0fu) | ((w1 >> 2) & 0x30303030u);
}

// q3_K: the sixteen scales still biased by 32 (0..63).
static inline void unpack_q3k_scales_words(const uint8_t* s, uint32_t* out) {
    const uint32_t w0 = load_u32(s), w1 = load_u32(s + 4), w2 = load_u32(s + 8);
    out[0] = (w0 & 0x0f0f0f0fu) | ((w2 & 0x03030303u) << 4);
    out[1] = (w1 & 0x0f0f0f0fu) | (((w2 >> 2) & 0x03030303u) << 4);
    out[2] = ((w0 >> 4) & 0x0f0f0f0fu) | (((w2 >> 4) & 0x03030303u) << 4);
    out[3] = ((w1 >> 4) & 0x0f0f0f0fu) | (((w2 >> 6) & 0x03030303u) << 4);
}

}  // namespace tern::quant::detail
