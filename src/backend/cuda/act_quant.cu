// Activation quantization on the device, the same bytes as
// quant::quantize_act_row (group 1) or quant::quantize_act_row_grouped
// (group 8), docs/cpu-kernels.md: amax ignoring NaNs, d = amax / 127 by IEEE
// division, q = x / d clamped to [-127, 127] (NaN -> -127) and rounded half
// away from zero, sum exact per 32-element block (with group 8 also split
// into f16 halves where asked, kernels.h). One warp per group: per
// block, a lane holds one element; per group of eight blocks, a lane holds
// eight consecutive elements (lanes 4b..4b+3 make block b).
#include <cuda_fp16.h>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace tern::cuda {
namespace {

constexpr unsigned kAll = 0xffffffffu;

__device__ __forceinline__ int round_clamp_q8(float t) {
    if (!(t >= -127.0f)) t = -127.0f;
    if (t > 127.0f) t = 127.0f;
    int q = __float2int_rz(t);
    const float frac = __fsub_rn(t, __int2float_rn(q));
    if (frac >= 0.5f) q += 1;
    if (frac <= -0.5f) q -= 1;
    return q;
}

__device__ __forceinline__ float warp_amax(float a) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) a = fmaxf(a, __shfl_xor_sync(kAll, a, o));
    return a;
}

__device__ __forceinline__ float abs_or_zero(float v) {
    const float a = fabsf(v);
    return a > 0.0f ? a : 0.0f;  // a NaN never compares greater: ignored
}

// One warp per 32-element block.
__global__ void quantize_act_block_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n_blocks_total,
                                          int64_t blocks, DevAct out) {
    after_prior_grids();
    const int64_t gb = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gb >= n_blocks_total) return;  // uniform per warp
    const int64_t t = gb / blocks, b = gb % blocks;
    const float v = x[t * x_stride + b * 32 + lane];
    const float d = __fdiv_rn(warp_amax(abs_or_zero(v)), 127.0f);
    const int q = d == 0.0f ? 0 : round_clamp_q8(__fdiv_rn(v, d));
    int sum = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kAll, sum, o);
    out.qs[gb * 32 + lane] = int8_t(q);
    if (lane == 0) {
        out.d[gb] = d;
        out.sum[gb] = sum;
    }
}

// One warp per group of eight blocks (256 elements); the row's last group may
// be shorter, and lanes past the row's end hold zeros and store nothing.
__global__ void quantize_act_group_kernel(const float* __restrict__ x, int64_t x_stride, int64_t n_groups_total,
                                          int64_t groups, int64_t blocks, DevAct out) {
    after_prior_grids();
    const int64_t gg = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (gg >= n_groups_total) return;  // uniform per warp
    const int64_t t = gg / groups, b = (gg % groups) * 8 + (lane >> 2);  // this lane's block
    const bool inside = b < blocks;
    float v[8];
    if (inside) {
        const float4* src = reinterpret_cast<const float4*>(x + t * x_stride + b * 32 + 8 * (lane & 3));
        const float4 lo = src[0], hi = src[1];
        v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = 0.0f;
    }
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) amax = fmaxf(amax, abs_or_zero(v[i]));
    const float d = __fdiv_rn(warp_amax(amax), 127.0f);
    int sum = 0;
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int q = d == 0.0f ? 0 : round_clamp_q8(__fdiv_rn(v[i], d));
        sum += q;
        packed[i >> 2] |= uint32_t(q & 0xFF) << (8 * (i & 3));
    }
    sum += __shfl_xor_sync(kAll, sum, 1);
    sum += __shfl_xor_sync(kAll, sum, 2);
    // The sums split for mmq_wgmma's f16 product: blocks past the row's end
    // (sum 0) are written too, so every group holds sixteen defined values.
    if (out.sum_split && (lane & 3) == 0) {
        uint16_t* split = out.sum_split + gg * 16;
        split[lane >> 2] = __half_as_ushort(__int2half_rn(sum >> 6));
        split[8 + (lane >> 2)] = __half_as_ushort(__int2half_rn(sum & 63));
    }
    if (!inside) return;
    const int64_t ab = t * blocks + b;
    *reinterpret_cast<uint2*>(out.qs + ab * 32 + 8 * (lane & 3)) = make_uint2(packed[0], packed[1]);
    if ((lane & 3) == 0) {
        out.d[ab] = d;
        out.sum[ab] = sum;
    }
}

}  // namespace

void quantize_act(const float* x, int64_t x_stride, int64_t n_tokens, int64_t cols, DevAct out,
                  cudaStream_t stream) {
    const int64_t blocks = cols / 32;
    if (n_tokens <= 0 || blocks <= 0) return;
    const int threads = 256;
    if (out.group == 8) {
        const int64_t groups = (blocks + 7) / 8, total = n_tokens * groups;
        const int64_t grid = (total * 32 + threads - 1) / threads;
        launch(quantize_act_group_kernel, unsigned(grid), threads, 0, stream, x, x_stride, total, groups, blocks, out);
        return;
    }
    const int64_t total = n_tokens * blocks;
    const int64_t grid = (total * 32 + threads - 1) / threads;
    launch(quantize_act_block_kernel, unsigned(grid), threads, 0, stream, x, x_stride, total, blocks, out);
}

}  // namespace tern::cuda
