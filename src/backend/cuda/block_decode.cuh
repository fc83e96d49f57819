// Device-side decoding of one 32-element weight block into int8 values and
// integer scales, and the block's float term against one activation block.
// mmvq and mmq both read weights through this file, so the two kernels (and
// both q6_K layouts) cannot drift apart; the arithmetic is the CPU's
// (docs/cpu-kernels.md): exact integer sums, then one fixed float formula per
// type for legacy blocks, and for K-quants the per-super-block form
// quant/dot_internal.h documents (kquant_inner_*).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace tern::cuda {

// A weight block as the kernels use it: 32 signed values, four per int
// (element 4i+b in byte b of q[i]), integer scales of elements 0..15 and
// 16..31, the integer min multiplier of K-quants, and the float scale d and
// min m (q4_1/q5_1 min, K-quant dmin).
struct BlockVals {
    int q[8];
    int sc0, sc1;
    int mn;
    float d, m;
};

// How a type's float term is formed (dot_internal.h term_scale / term_offset / term_min).
enum class TermKind { scale, offset, min };

template <WType T> struct BlockInfo;
template <> struct BlockInfo<WType::Q4_0> { static constexpr int bytes = 18, per_chunk_bytes = 8 * 18; static constexpr TermKind kind = TermKind::scale; static constexpr bool kquant = false; };
template <> struct BlockInfo<WType::Q4_1> { static constexpr int bytes = 20, per_chunk_bytes = 8 * 20; static constexpr TermKind kind = TermKind::offset; static constexpr bool kquant = false; };
template <> struct BlockInfo<WType::Q5_0> { static constexpr int bytes = 22, per_chunk_bytes = 8 * 22; static constexpr TermKind kind = TermKind::scale; static constexpr bool kquant = false; };
template <> struct BlockInfo<WType::Q5_1> { static constexpr int bytes = 24, per_chunk_bytes = 8 * 24; static constexpr TermKind kind = TermKind::offset; static constexpr bool kquant = false; };
template <> struct BlockInfo<WType::Q8_0> { static constexpr int bytes = 34, per_chunk_bytes = 8 * 34; static constexpr TermKind kind = TermKind::scale; static constexpr bool kquant = false; };
template <> struct BlockInfo<WType::Q4_K> { static constexpr int bytes = 144, per_chunk_bytes = 144; static constexpr TermKind kind = TermKind::min; static constexpr bool kquant = true; };
template <> struct BlockInfo<WType::Q5_K> { static constexpr int bytes = 176, per_chunk_bytes = 176; static constexpr TermKind kind = TermKind::min; static constexpr bool kquant = true; };
template <> struct BlockInfo<WType::Q6_K> { static constexpr int bytes = 210, per_chunk_bytes = 210; static constexpr TermKind kind = TermKind::scale; static constexpr bool kquant = true; };

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

__device__ __forceinline__ float f16_at(const uint8_t* p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}
// 4 bytes from a 2-byte aligned address.
__device__ __forceinline__ int u32_at2(const uint8_t* p) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
    return int(uint32_t(h[0]) | uint32_t(h[1]) << 16);
}
__device__ __forceinline__ int u32_at4(const uint8_t* p) { return *reinterpret_cast<const int*>(p); }

// Bit b (0..3) of nib4 moved to bit 4 of byte b: the fifth bit of four q5 values.
__device__ __forceinline__ int spread_bits_to_bit4(uint32_t nib4) {
    return int(((nib4 & 1u) << 4) | ((nib4 & 2u) << 11) | ((nib4 & 4u) << 18) | ((nib4 & 8u) << 25));
}

// Block j (0..7) of a chunk: for 32-element types the chunk is eight
// consecutive blocks and block j starts at chunk + j * bytes; for K-quants the
// chunk is one super-block and j its 32-element sub-block. WIDE: the block
// start is 16-byte aligned (q6_K padded layout), so 16-byte loads are legal.
template <WType T, bool WIDE>
__device__ __forceinline__ BlockVals decode_block(const uint8_t* chunk, int j);

template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q4_0, false>(const uint8_t* chunk, int j) {
    const uint8_t* b = chunk + j * 18;
    BlockVals v;
    v.d = f16_at(b);
    v.m = 0.0f;
    v.sc0 = v.sc1 = 1;
    v.mn = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int w = u32_at2(b + 2 + 4 * i);
        v.q[i] = __vsub4(w & 0x0F0F0F0F, 0x08080808);
        v.q[i + 4] = __vsub4((w >> 4) & 0x0F0F0F0F, 0x08080808);
    }
    return v;
}

template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q4_1, false>(const uint8_t* chunk, int j) {
    const uint8_t* b = chunk + j * 20;
    BlockVals v;
    v.d = f16_at(b);
    v.m = f16_at(b + 2);
    v.sc0 = v.sc1 = 1;
    v.mn = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int w = u32_at4(b + 4 + 4 * i);
        v.q[i] = w & 0x0F0F0F0F;
        v.q[i + 4] = (w >> 4) & 0x0F0F0F0F;
    }
    return v;
}

template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q5_0, false>(const uint8_t* chunk, int j) {
    const uint8_t* b = chunk + j * 22;
    BlockVals v;
    v.d = f16_at(b);
    v.m = 0.0f;
    v.sc0 = v.sc1 = 1;
    v.mn = 0;
    const uint32_t qh = uint32_t(u32_at2(b + 2));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int w = u32_at2(b + 6 + 4 * i);
        const int lo = (w & 0x0F0F0F0F) | spread_bits_to_bit4((qh >> (4 * i)) & 0xFu);
        const int hi = ((w >> 4) & 0x0F0F0F0F) | spread_bits_to_bit4((qh >> (16 + 4 * i)) & 0xFu);
        v.q[i] = __vsub4(lo, 0x10101010);
        v.q[i + 4] = __vsub4(hi, 0x10101010);
    }
    return v;
}

template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q5_1, false>(const uint8_t* chunk, int j) {
    const uint8_t* b = chunk + j * 24;
    BlockVals v;
    v.d = f16_at(b);
    v.m = f16_at(b + 2);
    v.sc0 = v.sc1 = 1;
    v.mn = 0;
    const uint32_t qh = uint32_t(u32_at4(b + 4));
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int w = u32_at4(b + 8 + 4 * i);
        v.q[i] = (w & 0x0F0F0F0F) | spread_bits_to_bit4((qh >> (4 * i)) & 0xFu);
        v.q[i + 4] = ((w >> 4) & 0x0F0F0F0F) | spread_bits_to_bit4((qh >> (16 + 4 * i)) & 0xFu);
    }
    return v;
}

template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q8_0, false>(const uint8_t* chunk, int j) {
    const uint8_t* b = chunk + j * 34;
    BlockVals v;
    v.d = f16_at(b);
    v.m = 0.0f;
    v.sc0 = v.sc1 = 1;
    v.mn = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) v.q[i] = u32_at2(b + 2 + 4 * i);
    return v;
}

// q4_K / q5_K sub-block j: 6-bit scale and min packed in 12 bytes
// (quant/kquant_scales.h), given as three little-endian words. Unpacked
// without branches: j differs between the lanes of a warp.
__device__ __forceinline__ void k4_scale_min(int s0, int s1, int s2, int j, int& sc, int& mn) {
    const int sh = 8 * (j & 3);
    // j < 4: b0 = s[j], b1 = s[j + 4]; j >= 4: b0 = s[j - 4], b1 = s[j], b2 = s[j + 4].
    const int b0 = (s0 >> sh) & 0xFF, b1 = (s1 >> sh) & 0xFF, b2 = (s2 >> sh) & 0xFF;
    sc = j < 4 ? b0 & 63 : (b2 & 0xF) | ((b0 >> 6) << 4);
    mn = j < 4 ? b1 & 63 : (b2 >> 4) | ((b1 >> 6) << 4);
}

// The first 16 bytes of a q4_K / q5_K super-block (d, dmin, the 12 scale
// bytes) in one load: the blocks (144 / 176 bytes) keep 16-byte alignment.
__device__ __forceinline__ void k4_header(const uint8_t* sb, int j, BlockVals& v) {
    const int4 h = *reinterpret_cast<const int4*>(sb);
    v.d = __half2float(__ushort_as_half(uint16_t(h.x & 0xFFFF)));
    v.m = __half2float(__ushort_as_half(uint16_t(uint32_t(h.x) >> 16)));
    int sc, mn;
    k4_scale_min(h.y, h.z, h.w, j, sc, mn);
    v.sc0 = v.sc1 = sc;
    v.mn = mn;
}

// 32 bytes from a 16-byte aligned address as eight ints.
__device__ __forceinline__ void load32_aligned(const uint8_t* p, int (&w)[8]) {
    const int4 a = *reinterpret_cast<const int4*>(p);
    const int4 b = *reinterpret_cast<const int4*>(p + 16);
    w[0] = a.x; w[1] = a.y; w[2] = a.z; w[3] = a.w;
    w[4] = b.x; w[5] = b.y; w[6] = b.z; w[7] = b.w;
}
// The same from a 2-byte aligned address.
__device__ __forceinline__ void load32_align2(const uint8_t* p, int (&w)[8]) {
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = u32_at2(p + 4 * i);
}

template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q4_K, false>(const uint8_t* sb, int j) {
    BlockVals v;
    k4_header(sb, j, v);
    int w[8];
    load32_aligned(sb + 16 + 32 * (j >> 1), w);  // 144-byte blocks keep 16-byte alignment
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) v.q[i] = (w[i] >> shift) & 0x0F0F0F0F;
    return v;
}

template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q5_K, false>(const uint8_t* sb, int j) {
    BlockVals v;
    k4_header(sb, j, v);
    int w[8], h[8];
    load32_aligned(sb + 48 + 32 * (j >> 1), w);  // 176-byte blocks keep 16-byte alignment
    load32_aligned(sb + 16, h);
    const int shift = 4 * (j & 1);
#pragma unroll
    for (int i = 0; i < 8; ++i) v.q[i] = ((w[i] >> shift) & 0x0F0F0F0F) | (((h[i] >> j) & 0x01010101) << 4);
    return v;
}

// q6_K sub-block j: half h = j/4 and quarter j%4 select the ql run (low or
// high nibbles) and the 2-bit field of qh; values are centred by -32.
template <bool WIDE>
__device__ __forceinline__ BlockVals decode_q6_K(const uint8_t* sb, int j) {
    BlockVals v;
    v.d = f16_at(sb + 208);
    v.m = 0.0f;
    v.mn = 0;
    v.sc0 = int(int8_t(sb[192 + 2 * j]));
    v.sc1 = int(int8_t(sb[192 + 2 * j + 1]));
    const int h = j >> 2, quarter = j & 3;
    int l[8], hi[8];
    if (WIDE) {
        load32_aligned(sb + 64 * h + 32 * (quarter & 1), l);
        load32_aligned(sb + 128 + 32 * h, hi);
    } else {
        load32_align2(sb + 64 * h + 32 * (quarter & 1), l);
        load32_align2(sb + 128 + 32 * h, hi);
    }
    const int lshift = 4 * (quarter >> 1), hshift = 2 * quarter;
#pragma unroll
    for (int i = 0; i < 8; ++i)
        v.q[i] = __vsub4(((l[i] >> lshift) & 0x0F0F0F0F) | (((hi[i] >> hshift) & 0x03030303) << 4), 0x20202020);
    return v;
}
template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q6_K, false>(const uint8_t* sb, int j) {
    return decode_q6_K<false>(sb, j);
}
template <>
__device__ __forceinline__ BlockVals decode_block<WType::Q6_K, true>(const uint8_t* sb, int j) {
    return decode_q6_K<true>(sb, j);
}

// The float term of a legacy block (no integer scales) from its scale d and
// min m, the integer sum H of value x activation, and the activation scale da
// and sum asum: the CPU kernels' term (quant/dot_internal.h term_scale,
// term_offset), rounding as they round.
template <TermKind K>
__device__ __forceinline__ float block_term(float d, float m, int H, float da, int asum) {
    static_assert(K != TermKind::min, "K-quants take kquant_inner_* per super-block");
    const float p = __fmul_rn(__fmul_rn(d, da), __int2float_rn(H));
    if (K == TermKind::scale) return p;
    return __fadd_rn(p, __fmul_rn(__fmul_rn(m, da), __int2float_rn(asum)));
}

// A K-quant super-block's inner term from its integer totals A (sum of sc * q
// * a) and X (sum of mn * S): quant/dot_internal.h kquant_inner_min (q4_K,
// q5_K) and kquant_inner_scale (q6_K). The caller adds r = fma(D, inner, r).
// X may come as a float already (the f32 outputs of an f16 product against
// the split block sums, exact: |X| < 2^22).
__device__ __forceinline__ float kquant_inner_min(float d, float dmin, int A, float X) {
    return __fmaf_rn(-dmin, X, __fmul_rn(d, __int2float_rn(A)));
}
__device__ __forceinline__ float kquant_inner_min(float d, float dmin, int A, int X) {
    return kquant_inner_min(d, dmin, A, __int2float_rn(X));
}
__device__ __forceinline__ float kquant_inner_scale(float d, int A) { return __fmul_rn(d, __int2float_rn(A)); }

// Calls f(TypeTag<T, WIDE>{}) for a weight's type and layout (WIDE: q6_K in
// the padded, 16-byte aligned layout): the one place that maps run-time types
// to kernel instantiations. Types without integer kernels call nothing.
template <WType T, bool W>
struct TypeTag {
    static constexpr WType type = T;
    static constexpr bool wide = W;
};
template <class F>
void dispatch_int_type(WType t, int block_stride, F&& f) {
    switch (t) {
        case WType::Q4_0: f(TypeTag<WType::Q4_0, false>{}); break;
        case WType::Q4_1: f(TypeTag<WType::Q4_1, false>{}); break;
        case WType::Q5_0: f(TypeTag<WType::Q5_0, false>{}); break;
        case WType::Q5_1: f(TypeTag<WType::Q5_1, false>{}); break;
        case WType::Q8_0: f(TypeTag<WType::Q8_0, false>{}); break;
        case WType::Q4_K: f(TypeTag<WType::Q4_K, false>{}); break;
        case WType::Q5_K: f(TypeTag<WType::Q5_K, false>{}); break;
        case WType::Q6_K:
            if (block_stride % 16 == 0)
                f(TypeTag<WType::Q6_K, true>{});
            else
                f(TypeTag<WType::Q6_K, false>{});
            break;
        default: break;
    }
}

// The chunk a 32-element block index falls in, as the kernels address it.
template <WType T>
__device__ __forceinline__ const uint8_t* chunk_ptr(const uint8_t* row, int64_t chunk, int block_stride) {
    if (BlockInfo<T>::kquant) return row + chunk * block_stride;
    return row + chunk * 8 * int64_t(BlockInfo<T>::bytes);
}

}  // namespace tern::cuda
