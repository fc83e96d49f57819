// Activation quantization on the device: one warp per 32-element block, the
// same bytes as quant::quantize_act_row (docs/cpu-kernels.md): amax ignoring
// NaNs, d = amax / 127 by IEEE division, q = x / d clamped to [-127, 127]
// (NaN -> -127) and rounded half away from zero, sum exact.
#include "backend/cuda/kernels.h"

namespace tern::cuda {
namespace {

__device__ __forceinline__ int round_clamp_q8(float t) {
    if (!(t >= -127.0f)) t = -127.0f;
    if (t > 127.0f) t = 127.0f;
    int q = __float2int_rz(t);
    const float frac = __fsub_rn(t, __int2float_rn(q));
    if (frac >= 0.5f) q += 1;
    if (frac <= -0.5f) q -= 1;
    return q;
}

__global__ void quantize_act_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n_blocks_total,
                                    int64_t blocks, DevAct out) {
    const int64_t gb = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gb >= n_blocks_total) return;  // uniform per warp
    const int64_t t = gb / blocks, b = gb % blocks;
    const float v = x[t * x_stride + b * 32 + lane];
    const float a = fabsf(v);
    float amax = a > 0.0f ? a : 0.0f;  // a NaN never compares greater: ignored
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = __fdiv_rn(amax, 127.0f);
    const int q = d == 0.0f ? 0 : round_clamp_q8(__fdiv_rn(v, d));
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    out.qs[gb * 32 + lane] = int8_t(q);
    if (lane == 0) {
        out.d[gb] = d;
        out.sum[gb] = sum;
    }
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
