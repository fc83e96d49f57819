// One struct per GGUF block type, laid out byte for byte as in the file, with
// its size checked at compile time. Scales stored as IEEE half are kept as raw
// uint16_t bits (see base/fp16.h).
#pragma once

#include <cstdint>

namespace tern::quant {

constexpr int QK4_0 = 32, QK4_1 = 32, QK5_0 = 32, QK5_1 = 32, QK8_0 = 32, QK8_1 = 32;
constexpr int QK_K = 256;          // elements in a K-quant super-block
constexpr int K_SCALE_SIZE = 12;   // packed 6-bit scales and mins of q4_K / q5_K

// x = d * (q - 8), q in 0..15; element j in the low nibble of qs[j], j+16 in the high.
struct block_q4_0 {
    uint16_t d;
    uint8_t qs[QK4_0 / 2];
};
static_assert(sizeof(block_q4_0) == 18);

// x = d * q + m, q in 0..15.
struct block_q4_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qs[QK4_1 / 2];
};
static_assert(sizeof(block_q4_1) == 20);

// x = d * (q - 16), q in 0..31; the fifth bits of the 32 elements in qh.
struct block_q5_0 {
    uint16_t d;
    uint8_t qh[4];
    uint8_t qs[QK5_0 / 2];
};
static_assert(sizeof(block_q5_0) == 22);

// x = d * q + m, q in 0..31.
struct block_q5_1 {
    uint16_t d;
    uint16_t m;
    uint8_t qh[4];
    uint8_t qs[QK5_1 / 2];
};
static_assert(sizeof(block_q5_1) == 24);

// x = d * q, q in -127..127.
struct block_q8_0 {
    uint16_t d;
    int8_t qs[QK8_0];
};
static_assert(sizeof(block_q8_0) == 34);

// As q8_0 with s = d * sum(qs), used for activations against q4_1 / q5_1 weights.
struct block_q8_1 {
    uint16_t d;
    uint16_t s;
    int8_t qs[QK8_1];
};
static_assert(sizeof(block_q8_1) == 36);

// 2-bit: 16 sub-blocks of 16; scales holds a 4-bit scale (low) and min (high) each.
struct block_q2_K {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    uint16_t d;
    uint16_t dmin;
};
static_assert(sizeof(block_q2_K) == 84);

// 3-bit: low 2 bits in qs, high bit in hmask, 16 six-bit scales packed in 12 bytes.
struct block_q3_K {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    uint16_t d;
};
static_assert(sizeof(block_q3_K) == 110);

// 4-bit: 8 sub-blocks of 32 with 6-bit scales and mins; x = d*sc*q - dmin*m.
struct block_q4_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q4_K) == 144);

// 5-bit: as q4_K with the fifth bits in qh.
struct block_q5_K {
    uint16_t d;
    uint16_t dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
};
static_assert(sizeof(block_q5_K) == 176);

// 6-bit: 16 sub-blocks of 16 with int8 scales; x = d * sc * (q - 32).
// Byte map: ql 0..127, qh 128..191, scales 192..207, d 208..209.
struct block_q6_K {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    uint16_t d;
};
static_assert(sizeof(block_q6_K) == 210);

// Activations for K-quant dot products: float scale, int8 values, sums of 16.
struct block_q8_K {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
};
static_assert(sizeof(block_q8_K) == 292);

}  // namespace tern::quant
