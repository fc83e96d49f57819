// Hopper's warpgroup tensor-core products (wgmma.mma_async, sm_90a), int8:
// D (s32, 64 x N) = A B (+ D), A 64 x 32 int8 or uint8 in registers, B N x 32 int8 in
// shared memory (K-major: each of the N rows holds its 32 bytes of k), for the
// four warps of a warpgroup together; and f16 with f32 outputs, A 64 x 16 in
// registers, B N x 16 (32 bytes a row). The instructions run asynchronously:
// wgmma_fence() before the first product that reads registers written since,
// commit_group() after a batch, wait_group<N>() before reading D.
//
// Fragments (PTX ISA, wgmma register fragments, .s8): warp w of the group
// holds rows 16w..16w+15 of A and D. Lane (g = lane / 4, tig = lane % 4): in
// a[0] row g, bytes 4tig..4tig+3; a[1] row g + 8, the same; a[2], a[3] bytes
// 16 + 4tig.. of those rows (the A fragment of mma.m16n8k32). f16: a[0] row g,
// k 2tig and 2tig + 1; a[1] row g + 8, the same; a[2], a[3] k 2tig + 8, 2tig + 9
// of those rows. D, both: d[4i + e] is row g (+ 8 for e >= 2), column
// 8i + 2tig + (e & 1).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/bulk_copy.cuh"

namespace tern::cuda {

// A shared-memory operand in the 128-byte swizzle that a tensor copy with
// CU_TENSOR_MAP_SWIZZLE_128B writes: rows of 128 bytes, 16-byte chunk c of
// row t at chunk c ^ (t % 8), eight rows (1,024 bytes, 1,024-aligned) a
// group. `at` is the first row's byte k0 (k0 a multiple of 32) and the
// instruction reads bytes k0..k0+31 of each row.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(const void* at) {
    const uint64_t addr = smem_addr(at);
    return ((addr & 0x3FFFF) >> 4)          // start address
           | (uint64_t(16 >> 4) << 16)      // leading byte offset (unused by 128-byte swizzled K-major)
           | (uint64_t(1024 >> 4) << 32)    // stride byte offset: eight rows
           | (uint64_t(1) << 62);           // 128-byte swizzle
}

// The same for the 32-byte swizzle (rows of 32 bytes, 16-byte chunk c of row
// t at c ^ (t / 4 % 2), eight rows a 256-byte group, 1,024-aligned): the
// instruction reads all 32 bytes of each row (K 16 of a 16-bit type).
__device__ __forceinline__ uint64_t wgmma_desc_sw32(const void* at) {
    const uint64_t addr = smem_addr(at);
    return ((addr & 0x3FFFF) >> 4)          // start address
           | (uint64_t(16 >> 4) << 16)      // leading byte offset (unused: K fits one swizzle row)
           | (uint64_t(256 >> 4) << 32)     // stride byte offset: eight rows
           | (uint64_t(3) << 62);           // 32-byte swizzle
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit_group() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait_group() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// D = A B, or D += A B where accumulate: N columns (64). A holds signed
// bytes, or with kUnsignedA unsigned ones (0..255); B signed bytes.
template <int N>
struct WgmmaS8;

// The 32 outputs and 4 A words of an m64n64k32 instruction, then its B
// descriptor (%36) and whether it accumulates (%37).
#define TERN_WGMMA_M64N64K32_OPERANDS                                                                            \
    : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3]), "+r"(d[4]), "+r"(d[5]), "+r"(d[6]), "+r"(d[7]), "+r"(d[8]), \
      "+r"(d[9]), "+r"(d[10]), "+r"(d[11]), "+r"(d[12]), "+r"(d[13]), "+r"(d[14]), "+r"(d[15]), "+r"(d[16]),       \
      "+r"(d[17]), "+r"(d[18]), "+r"(d[19]), "+r"(d[20]), "+r"(d[21]), "+r"(d[22]), "+r"(d[23]), "+r"(d[24]),      \
      "+r"(d[25]), "+r"(d[26]), "+r"(d[27]), "+r"(d[28]), "+r"(d[29]), "+r"(d[30]), "+r"(d[31])                    \
    : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(int(accumulate))
#define TERN_WGMMA_M64N64K32(types)                                                                               \
    "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"                                                              \
    " wgmma.mma_async.sync.aligned.m64n64k32.s32." types                                                          \
    " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22,"   \
    " %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p;\n}\n"

template <>
struct WgmmaS8<64> {
    template <bool kUnsignedA = false>
    __device__ __forceinline__ static void run(int (&d)[32], const int (&a)[4], uint64_t b_desc, bool accumulate) {
        if constexpr (kUnsignedA)
            asm volatile(TERN_WGMMA_M64N64K32("u8.s8") TERN_WGMMA_M64N64K32_OPERANDS);
        else
            asm volatile(TERN_WGMMA_M64N64K32("s8.s8") TERN_WGMMA_M64N64K32_OPERANDS);
    }
};

#undef TERN_WGMMA_M64N64K32
#undef TERN_WGMMA_M64N64K32_OPERANDS

// D = A B (f32 outputs, exact where every product and partial sum is an
// integer below 2^24), A f16 pairs in registers, B f16 in shared memory;
// 64 columns, K 16.
__device__ __forceinline__ void wgmma_f16_m64n64k16(float (&d)[32], const uint32_t (&a)[4], uint64_t b_desc) {
    asm volatile(
        "{\n .reg .pred p;\n setp.ne.b32 p, %37, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"
        " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22,"
        " %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
          "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
          "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
          "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b_desc), "r"(0));
}

}  // namespace tern::cuda
