// One warp quantizes one 32-element activation block (lane i holds element i):
// the bytes of the CPU's block_q8a (docs/cpu-kernels.md). Shared by the
// quantize_act kernel and the kernels that produce a matmul input and
// quantize it in the same pass (rms_norm, swiglu).
#pragma once

#include "backend/cuda/kernels.h"

namespace tern::cuda {

__device__ __forceinline__ int round_clamp_q8(float t) {
    if (!(t >= -127.0f)) t = -127.0f;
    if (t > 127.0f) t = 127.0f;
    int q = __float2int_rz(t);
    const float frac = __fsub_rn(t, __int2float_rn(q));
    if (frac >= 0.5f) q += 1;
    if (frac <= -0.5f) q -= 1;
    return q;
}

// Block gb of the planes (token t, block b: gb = t * blocks + b). All 32 lanes must call.
__device__ __forceinline__ void quantize_block_warp(float v, int lane, const DevAct& out, int64_t gb) {
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

}  // namespace tern::cuda
