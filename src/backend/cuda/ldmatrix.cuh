// ldmatrix: four 8x8 matrices of 16-bit elements from shared memory into the
// register layout of the mma.sync fragments. Lanes 8i..8i+7 give the row
// addresses of matrix i (16 bytes each, 16-byte aligned); each lane receives,
// in r[i], elements 2*(lane%4) and 2*(lane%4)+1 of row lane/4 of matrix i, or
// with kTrans the same elements of the transposed matrix. For int8 data a
// "16-bit element" is a byte pair: row lane/4, bytes 4*(lane%4)..+3.
#pragma once

#include <cuda_runtime.h>

namespace tern::cuda {

template <bool kTrans = false, class R>
__device__ __forceinline__ void ldmatrix_x4(R (&r)[4], const void* smem) {
    static_assert(sizeof(R) == 4, "one 32-bit register per matrix");
    const unsigned addr = unsigned(__cvta_generic_to_shared(smem));
    unsigned* u = reinterpret_cast<unsigned*>(r);
    if constexpr (kTrans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3])
                     : "r"(addr)
                     : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                     : "=r"(u[0]), "=r"(u[1]), "=r"(u[2]), "=r"(u[3])
                     : "r"(addr)
                     : "memory");
}

}  // namespace tern::cuda
