// Activation quantization on the device: one warp per 32-element block, the
// same bytes as quant::quantize_act_row (act_quant.cuh).
#include "backend/cuda/act_quant.cuh"
#include "backend/cuda/kernels.h"

namespace tern::cuda {
namespace {

__global__ void quantize_act_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n_blocks_total,
                                    int64_t blocks, DevAct out) {
    const int64_t gb = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gb >= n_blocks_total) return;  // uniform per warp
    const int64_t t = gb / blocks, b = gb % blocks;
    quantize_block_warp(x[t * x_stride + b * 32 + lane], lane, out, gb);
}

}  // namespace

void quantize_act(const float* x, int64_t x_stride, int64_t n_tokens, int64_t cols, DevAct out,
                  cudaStream_t stream) {
    const int64_t total = n_tokens * (cols / 32);
    if (total <= 0) return;
    const int threads = 256;
    const int64_t grid = (total * 32 + threads - 1) / threads;
    quantize_act_kernel<<<unsigned(grid), threads, 0, stream>>>(x, x_stride, total, cols / 32, out);
}

}  // namespace tern::cuda
