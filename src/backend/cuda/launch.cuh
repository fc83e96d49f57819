// Kernel launches with Hopper's programmatic dependent launch (PDL).
//
// A decode step is some 600 short kernels. Without PDL each one's CTAs are
// placed on the SMs only after the kernel before it has drained. With PDL
// (sm_90+) a kernel's grid is launched while the previous kernel still runs:
// its CTAs become resident and stop at `wait_for_prior_grids()` until every
// earlier grid has completed and its writes are visible, so the launch and
// placement are off the critical path (LOG g37: one-sequence decode +12%).
//
// The rule for every kernel launched through `launch()`: call
// `wait_for_prior_grids()` before reading anything an earlier kernel wrote
// and before writing anything an earlier kernel may still read (in practice:
// first). `allow_dependent_launch()` lets the next grid be placed; called
// right after the wait, it keeps the lookahead to one kernel.
//
// What no kernel writes during a step may be read before the wait, while the
// kernel before still runs: weights, and the batch's positions, slots and KV
// page tables, which the host copies before the step's first kernel (every
// grid of the step is placed after that copy has completed). Kernels that
// do so take it out of their chain of dependent loads (LOG g50, g52).
//
// The tensor-core matmuls (mmq, mmq_batch) wait but never allow an early
// launch: their grids often fill only part of the GPU, and the next grid,
// placed early, would crowd its CTAs onto the few idle SMs and run unevenly
// (64-sequence decode lost 5% that way). Without the call, the next grid is
// placed once all their CTAs have exited.
//
// The order of operations and every bit of every result are the same with
// and without PDL: it only moves when a kernel's CTAs are placed.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <type_traits>
#include <utility>

namespace tern::cuda {

__device__ __forceinline__ void wait_for_prior_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_dependent_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Both, for kernels with nothing to do before the wait.
__device__ __forceinline__ void after_prior_grids() {
    wait_for_prior_grids();
    allow_dependent_launch();
}

// True where the environment sets `name` to "0" (switched_off) or "1"
// (switched_on): how the measurement switches of docs/cuda.md turn a path
// off, or an older one back on, for A/B runs. Callers read them once.
bool switched_off(const char* name);
bool switched_on(const char* name);

// Whether kernels that can read the step's host-copied arrays before the wait
// do (above); TERN_CUDA_EARLY_READS=0 turns it off for A/B runs.
bool early_reads_on();

// The current device's streaming multiprocessors (0 where it cannot be asked).
int current_sm_count();

// probe(device) for the current device, asked once per device and
// remembered in `known` (0: not asked yet, 1: true, 2: false); false where
// there is no current device.
struct PerDeviceAnswers {
    static constexpr int kDevices = 64;
    std::atomic<int> known[kDevices];
};
bool ask_once_per_device(PerDeviceAnswers& answers, bool (*probe)(int device));

// True where code compiled for sm_90 or newer runs on the current device
// (machine code, or PTX of compute_90 or newer compiled for it); cached per
// device.
bool sm90_code_runs_here();

// True where kernels are launched with PDL: sm90_code_runs_here(), unless the
// environment sets TERN_CUDA_PDL=0.
bool pdl_enabled();

// f(std::bool_constant<flag>{}): a run-time flag as a kernel's template argument.
template <class F>
void with_flag(bool flag, F&& f) {
    if (flag)
        f(std::true_type{});
    else
        f(std::false_type{});
}

// A launch with (early) or without PDL; launch() and launch_in_order() below.
template <typename... Params, typename... Args>
void launch_placed(bool early, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   Args&&... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = attr;
    cfg.numAttrs = early && pdl_enabled() ? 1 : 0;
    cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// kernel<<<grid, block, smem, stream>>>(args...), with PDL where enabled. The
// kernel must follow the rule at the top of this file. A failed launch sets
// the error cudaGetLastError() reports, as <<<>>> does (kernels.h).
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
    launch_placed(true, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// The same without PDL: the grid is placed once the previous kernel has
// completed, spread over the idle SMs. For kernels whose CTAs, placed early
// while the previous kernel still holds some SMs, would pile two to an SM on
// the others and leave the first idle (mmq_batch's streamed kernel, LOG g43).
template <typename... Params, typename... Args>
void launch_in_order(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                     Args&&... args) {
    launch_placed(false, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

}  // namespace tern::cuda
