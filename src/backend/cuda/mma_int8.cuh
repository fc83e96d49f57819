// Integer tensor-core products (mma.sync, s8 x s8 -> s32) of one warp, from
// zero, or added to c (mma_k32_acc): c = A B for a 16 x 32 (k32) or 16 x 16
// (k16) slice of A, row-major, and B col-major with 8 columns. Fragments (PTX
// ISA, mma.m16n8k32 .s8): lane (g = lane / 4, tig = lane % 4) holds in a[0]
// row g, bytes 4tig..4tig+3; in a[1] row g + 8, the same bytes; in a[2] and
// a[3] bytes 16 + 4tig.. of those rows; in b0 column g, bytes 4tig..; in b1
// column g, bytes 16 + 4tig..; and receives c[0], c[1] = row g, columns 2tig,
// 2tig + 1, c[2], c[3] the same of row g + 8. k16 takes a[0], a[1] and b0
// alone.
#pragma once

#include <cuda_runtime.h>

namespace tern::cuda {

// c += A B (k32).
__device__ __forceinline__ void mma_k32_acc(int (&c)[4], const int (&a)[4], int b0, int b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_k32(int (&c)[4], const int (&a)[4], int b0, int b1) {
    c[0] = c[1] = c[2] = c[3] = 0;
    mma_k32_acc(c, a, b0, b1);
}

__device__ __forceinline__ void mma_k16(int (&c)[4], int a0, int a1, int b0) {
    c[0] = c[1] = c[2] = c[3] = 0;
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0));
}

}  // namespace tern::cuda
