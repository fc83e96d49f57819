// Asynchronous global-to-shared copies (cp.async, sm_80+): 16 bytes a copy,
// cached in L2 only; a short source fills the rest of the 16 bytes with
// zeros. The caller commits groups and waits for all but the newest N.
#pragma once

#include <cuda_runtime.h>

namespace tern::cuda {

// Copies src_bytes (0..16) from src to the 16-byte aligned shared address dst
// and zeros the rest of its 16 bytes.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, int src_bytes = 16) {
    const unsigned d = unsigned(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

}  // namespace tern::cuda
