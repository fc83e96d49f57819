// The greedy pick of each logits row on the device (ops.h argmax_rows), so a
// step whose sequences all draw greedily copies back one index a row instead
// of the rows themselves (64 rows of a 32,000-entry vocabulary are 8 MiB).
//
// The pick is the CPU twin's, backend::cpu::argmax_first: the first index of
// the row's largest value, NaN read as -inf, -1 when no value is above -inf.
// A thread keeps the first largest of its share of the row (its indices rise
// as it reads); the shares meet in a tree whose comparison is a total order
// (the larger value, on equal values the lower index: +0 and -0 are equal, as
// on the CPU), so the result does not depend on the order of the meetings.
#include <cuda_runtime.h>

#include <cmath>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"

namespace tern::cuda {
namespace {

constexpr int kThreads = 1024;  // a CTA a row: 32,000 entries are eight float4 a thread
constexpr int kWarps = kThreads / 32;

struct Best {
    float value;
    int32_t index;  // -1: nothing above -inf seen
};

// Whether a ranks before b: a value beats nothing, a larger value beats a
// smaller one, and of two equal values the lower index wins.
__device__ __forceinline__ bool ranks_before(Best a, Best b) {
    if (a.index < 0) return false;
    if (b.index < 0) return true;
    return a.value > b.value || (a.value == b.value && a.index < b.index);
}

// Entry `index` of value v read after the thread's earlier (lower) indices:
// only a strictly larger value replaces the best, so the first one stays.
__device__ __forceinline__ void see(Best& best, float v, int32_t index) {
    if (v > -INFINITY && (best.index < 0 || v > best.value)) best = {v, index};
}

__device__ __forceinline__ Best warp_best(Best b) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const Best other{__shfl_down_sync(0xffffffffu, b.value, offset),
                         __shfl_down_sync(0xffffffffu, b.index, offset)};
        if (ranks_before(other, b)) b = other;
    }
    return b;
}

// vec4: cols is a multiple of 4 and x 16-byte aligned, so each row is read as float4.
template <bool vec4>
__global__ void __launch_bounds__(kThreads) argmax_rows_kernel(const float* x, int64_t cols, int32_t* out) {
    after_prior_grids();
    const float* row = x + int64_t(blockIdx.x) * cols;
    Best best{-INFINITY, -1};
    if constexpr (vec4) {
        const float4* row4 = reinterpret_cast<const float4*>(row);
        for (int64_t c = threadIdx.x; c < cols / 4; c += kThreads) {
            const float4 v = row4[c];
            const int32_t i = int32_t(4 * c);
            see(best, v.x, i);
            see(best, v.y, i + 1);
            see(best, v.z, i + 2);
            see(best, v.w, i + 3);
        }
    } else {
        for (int64_t c = threadIdx.x; c < cols; c += kThreads) see(best, row[c], int32_t(c));
    }
    __shared__ Best warps[kWarps];
    best = warp_best(best);
    const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
    if (lane == 0) warps[warp] = best;
    __syncthreads();
    if (warp == 0) {
        best = warp_best(warps[lane]);
        if (lane == 0) out[blockIdx.x] = best.index;
    }
}

}  // namespace

void argmax_rows(const float* x, int64_t rows, int64_t cols, int32_t* out, cudaStream_t stream) {
    if (rows <= 0) return;
    const bool vec4 = cols % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
    if (vec4)
        launch(argmax_rows_kernel<true>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, cols, out);
    else
        launch(argmax_rows_kernel<false>, dim3(unsigned(rows)), dim3(kThreads), 0, stream, x, cols, out);
}

}  // namespace tern::cuda
