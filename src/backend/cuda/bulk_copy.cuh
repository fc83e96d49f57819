// Hopper's bulk asynchronous copies (cp.async.bulk, sm_90): one instruction
// moves a run of bytes (a multiple of 16, 16-byte aligned at both ends) from
// global to shared memory without registers, and an mbarrier in shared memory
// counts the bytes as they land. A warp can keep many kilobytes in flight this
// way where its own loads would hold a few hundred bytes of registers.
//
// They exist only where the device code is for sm_90 or newer: a kernel
// that uses them guards its body the same way, and its launcher picks it
// only where such code runs (launch.cuh's sm90_code_runs_here(), or for the
// sm_90a kernels their own check).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace tern::cuda {

__device__ __forceinline__ unsigned smem_addr(const void* p) { return unsigned(__cvta_generic_to_shared(p)); }

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

// An mbarrier that completes a phase on `arrivals` arrivals plus the bytes
// they announce (mbarrier_expect_bytes is one arrival).
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, unsigned arrivals = 1) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(arrivals) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// The arrival of this phase, announcing the bytes its copies will bring.
__device__ __forceinline__ void mbarrier_expect_bytes(uint64_t* bar, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// One arrival, announcing no bytes.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// bytes (a multiple of 16) from src to dst, both 16-byte aligned, counted by bar.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, int bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(smem_addr(bar))
                 : "memory");
}

// Until phase `phase` (0 or 1) of bar has completed.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, unsigned phase) {
    unsigned done = 0;
    while (!done)
        asm volatile(
            "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(smem_addr(bar)), "r"(phase)
            : "memory");
}

// Orders this thread's earlier shared-memory reads before later bulk copies
// into the same bytes (the copies write through the async proxy).
__device__ __forceinline__ void fence_shared_for_bulk_copies() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// A 2-D box of the tensor map at column x, row y into dst, counted by bar.
__device__ __forceinline__ void tensor_copy(void* dst, const CUtensorMap& map, int x, int y, uint64_t* bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(&map)), "r"(x), "r"(y), "r"(smem_addr(bar))
        : "memory");
}

#endif  // sm_90

}  // namespace tern::cuda
