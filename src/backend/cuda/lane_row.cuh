// One weight row's K-quant super-block as an mma lane needs it: lane (g,
// tig) of a warp holds, for its row, the words with elements 4tig..4tig+3
// (half 0) and 16+4tig..16+4tig+3 (half 1) of each 32-element sub-block,
// which are the A fragment of an int8 mma (m16n8k32) and of a warpgroup's
// wgmma alike. mmq_batch and mmq_wgmma read super-blocks through this file.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/block_decode.cuh"

namespace tern::cuda {

template <bool kAligned4>
__device__ __forceinline__ int word_at(const uint8_t* p) {
    return kAligned4 ? u32_at4(p) : u32_at2(p);
}

// One row's super-block as lane (g, tig) needs it: the words holding
// elements 4tig..4tig+3 (half 0) and 16+4tig..16+4tig+3 (half 1) of each of
// the eight 32-element sub-blocks, the scales and the float scales. vals(j,
// half) is those four elements as int8; scale(j, half) their integer scale.
template <WType T, bool WIDE>
struct LaneRow;

// q4_K / q5_K: header words (d, dmin; scales and mins packed as
// quant/kquant_scales.h), then per 32-byte run r the low nibbles of sub-block
// 2r and the high nibbles of 2r + 1. The header is unpacked once a
// super-block, the eight 6-bit scales and the eight mins a byte each in two
// words apiece (a handful of word operations for all sixteen, where unpacking
// sub-block by sub-block took several per value); a sub-block then takes its
// scale, and its min repeated in every byte, with one byte operation each.
struct K4Header {
    int dm;     // d (low half) and dmin (high half), f16
    int sc[2];  // scale of sub-block j in byte j % 4 of sc[j / 4]
    int mn[2];  // min of sub-block j, likewise
    __device__ void load(const uint8_t* sb) {
        const int4 v = *reinterpret_cast<const int4*>(sb);  // 144 / 176-byte blocks keep 16-byte alignment
        dm = v.x;
        // j < 4: the low six bits of bytes j (scales) and 4 + j (mins). j >= 4:
        // the nibbles of byte 8 + j - 4 below, the top two bits of bytes j - 4
        // (scales) and j (mins) above.
        sc[0] = v.y & 0x3F3F3F3F;
        mn[0] = v.z & 0x3F3F3F3F;
        sc[1] = (v.w & 0x0F0F0F0F) | ((v.y >> 2) & 0x30303030);
        mn[1] = ((v.w >> 4) & 0x0F0F0F0F) | ((v.z >> 2) & 0x30303030);
    }
    __device__ float d() const { return __half2float(__ushort_as_half(uint16_t(dm & 0xFFFF))); }
    __device__ float dmin() const { return __half2float(__ushort_as_half(uint16_t(uint32_t(dm) >> 16))); }
    __device__ int scale(int j) const { return (sc[j >> 2] >> (8 * (j & 3))) & 0xFF; }
    // The scale of sub-block j as 8 high + low, each in 0..7: a value (at
    // most 31) times either stays within a byte, so four values multiply at
    // once in one word.
    __device__ int scale_high(int j) const { return (sc[j >> 2] >> (8 * (j & 3) + 3)) & 7; }
    __device__ int scale_low(int j) const { return (sc[j >> 2] >> (8 * (j & 3))) & 7; }
    // The min of sub-block j in every byte: one more int8 mma operand.
    __device__ int min_bytes(int j) const { return int(__byte_perm(uint32_t(mn[j >> 2]), 0u, 0x1111u * uint32_t(j & 3))); }
    // The eight mins, a byte each, for __dp2a against the block sums.
    __device__ int2 mins() const { return make_int2(mn[0], mn[1]); }
    // The row's part of an f16 product (k 16) against the tokens' split block
    // sums (DevAct::sum_split: s >> 6 of sub-blocks 0..7, then s & 63), whose
    // f32 outputs are the mins' total X = sum_j m_j s_j exactly: k j holds
    // 64 m_j, k 8 + j holds m_j. Lane tig's pairs (k 2tig, 2tig + 1 and k
    // 2tig + 8, 2tig + 9) are `scaled` and `plain`: the mins' bytes become
    // halves 1024 + m (0x64 above each byte), less 1024, all exact.
    struct MinsF16 {
        uint32_t scaled, plain;
    };
    __device__ MinsF16 mins_f16(int tig) const {
        const uint32_t word = uint32_t((tig & 2) ? mn[1] : mn[0]);
        const uint32_t bits = __byte_perm(word, 0x64u, (tig & 1) ? 0x4342u : 0x4140u);
        const __half2 m = __hsub2(*reinterpret_cast<const __half2*>(&bits), __float2half2_rn(1024.0f));
        const __half2 m64 = __hmul2(m, __float2half2_rn(64.0f));
        return {*reinterpret_cast<const uint32_t*>(&m64), *reinterpret_cast<const uint32_t*>(&m)};
    }
};

template <>
struct LaneRow<WType::Q4_K, false> {
    K4Header hd;
    int qs[4][2];  // [run][half]
    __device__ void load(const uint8_t* sb, int tig) {
        hd.load(sb);
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) qs[r][h] = u32_at4(sb + 16 + 32 * r + 16 * h + 4 * tig);
    }
    __device__ int vals(int j, int half) const { return (qs[j >> 1][half] >> (4 * (j & 1))) & 0x0F0F0F0F; }
    __device__ int scale(int j, int) const { return hd.scale(j); }
};

template <>
struct LaneRow<WType::Q5_K, false> {
    K4Header hd;
    int qh[2];     // bit j of byte i: the fifth bit of element i of sub-block j
    int qs[4][2];
    __device__ void load(const uint8_t* sb, int tig) {
        hd.load(sb);
#pragma unroll
        for (int h = 0; h < 2; ++h) qh[h] = u32_at4(sb + 16 + 16 * h + 4 * tig);
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) qs[r][h] = u32_at4(sb + 48 + 32 * r + 16 * h + 4 * tig);
    }
    __device__ int vals(int j, int half) const {
        return ((qs[j >> 1][half] >> (4 * (j & 1))) & 0x0F0F0F0F) | (((qh[half] >> j) & 0x01010101) << 4);
    }
    __device__ int scale(int j, int) const { return hd.scale(j); }
};

// q6_K: ql (low nibbles of sub-blocks 4h + q, q = 0..3, in two 32-byte runs
// per half h), qh (two bits per element), sixteen int8 scales (one per
// 16-element half), d. WIDE: the padded layout, 4-byte loads legal.
template <bool WIDE>
struct LaneRowQ6 {
    int ql[2][2][2];  // [h][q & 1][half]
    int qh[2][2];     // [h][half]
    int sc[4];        // sixteen int8 scales
    float d;
    __device__ void load(const uint8_t* sb, int tig) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
#pragma unroll
                for (int q = 0; q < 2; ++q) ql[h][q][half] = word_at<WIDE>(sb + 64 * h + 32 * q + 16 * half + 4 * tig);
                qh[h][half] = word_at<WIDE>(sb + 128 + 32 * h + 16 * half + 4 * tig);
            }
#pragma unroll
        for (int i = 0; i < 4; ++i) sc[i] = word_at<WIDE>(sb + 192 + 4 * i);
        d = f16_at(sb + 208);
    }
    // The six-bit values as stored (value + 32), and the values.
    __device__ int stored(int j, int half) const {
        const int h = j >> 2, q = j & 3;
        const int lo = (ql[h][q & 1][half] >> (4 * (q >> 1))) & 0x0F0F0F0F;
        const int hi = (qh[h][half] >> (2 * q)) & 0x03030303;
        return lo | (hi << 4);
    }
    __device__ int vals(int j, int half) const { return __vsub4(stored(j, half), 0x20202020); }
    __device__ int scale(int j, int half) const {
        const int i = 2 * j + half;
        return int(int8_t(uint32_t(sc[i >> 2]) >> (8 * (i & 3))));
    }
};
template <>
struct LaneRow<WType::Q6_K, false> : LaneRowQ6<false> {};
template <>
struct LaneRow<WType::Q6_K, true> : LaneRowQ6<true> {};

}  // namespace tern::cuda
