// A warp's f16 tensor-core product with f32 outputs (mma.sync m16n8k16,
// sm_80+): d += A B for a 16 x 16 slice of A, row-major, and B col-major
// with 8 columns. Fragments (PTX ISA, mma.m16n8k16 .f16): lane (g = lane / 4,
// tig = lane % 4) holds in a[0] row g, k 2tig and 2tig + 1 (f16 pairs); in
// a[1] row g + 8, the same; in a[2], a[3] k 2tig + 8, 2tig + 9 of those rows;
// in b0 column g, k 2tig, 2tig + 1; in b1 column g, k 2tig + 8, 2tig + 9; and
// receives d[0], d[1] = row g, columns 2tig, 2tig + 1, d[2], d[3] the same
// of row g + 8.
#pragma once

#include <cuda_runtime.h>

namespace tern::cuda {

__device__ __forceinline__ void mma_f16(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace tern::cuda
