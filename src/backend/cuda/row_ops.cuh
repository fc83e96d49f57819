// Device steps that more than one kernel performs with the same arithmetic:
// rms_norm's scale, rope's angles and rotation, the KV cache's cell of a
// token, SwiGLU's product, the experts' weighted combine. Kept in one place so
// that a fused kernel gives the bits of the kernels it stands for.
#pragma once

#include "backend/cuda/ops.h"

namespace tern::cuda {

// silu(g) * u = g / (1 + exp(-g)) * u. Full-precision expf (not __expf): the
// CPU's std::exp is within an ulp.
__device__ __forceinline__ float silu_times(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// Term j of a token's combine of its experts' rows: w_0 y_0 rounded, then
// fma(w_j, y_j, sum) in order.
__device__ __forceinline__ float combine_step(int j, float w, float y, float sum) {
    return j == 0 ? __fmul_rn(w, y) : __fmaf_rn(w, y, sum);
}

// float(1 / sqrt(total / cols + eps)), every step correctly rounded, as the CPU.
__device__ __forceinline__ float rms_inverse(double total, int64_t cols, float eps) {
    const double mean_eps = __dadd_rn(__ddiv_rn(total, double(cols)), double(eps));
    return float(__ddiv_rn(1.0, __dsqrt_rn(mean_eps)));
}

// trig[i] = cos of pair i's angle at `position`, trig[half + i] its sin (both
// times attn_factor), for i < n_dims/2, shared by the CTA's threads. Angles in
// double, as the CPU computes them: base^(-2i/n_dims) / factor[i], times
// position * freq_scale.
__device__ __forceinline__ void rope_trig(const RopeArgs& args, int32_t position, float* trig) {
    const int half = args.n_dims / 2;
    const double p = double(position) * double(args.freq_scale);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        double inv_freq;
        if (args.inv_freq) {
            inv_freq = args.inv_freq[i];  // the host's table (the CPU's exact values)
        } else {
            inv_freq = pow(double(args.freq_base), __ddiv_rn(-2.0 * i, double(args.n_dims)));
            if (args.freq_factors) inv_freq = __ddiv_rn(inv_freq, double(args.freq_factors[i]));
        }
        const double a = __dmul_rn(p, inv_freq);
        double sn, cs;
        sincos(a, &sn, &cs);
        trig[i] = float(__dmul_rn(cs, double(args.attn_factor)));
        trig[half + i] = float(__dmul_rn(sn, double(args.attn_factor)));
    }
}

// Pair i of a head: elements (2i, 2i+1), or NeoX's (i, i + n_dims/2).
__device__ __forceinline__ int rope_first(const RopeArgs& args, int i) { return args.neox ? i : 2 * i; }
__device__ __forceinline__ int rope_second(const RopeArgs& args, int i) {
    return args.neox ? i + args.n_dims / 2 : 2 * i + 1;
}

// The pair (x0, x1) rotated by the angle whose cos is c and sin is s.
__device__ __forceinline__ void rope_rotate(float& x0, float& x1, float c, float s) {
    const float a = x0, b = x1;
    x0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
    x1 = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
}

// The cache row of (slot, pos) in a layer's pool, or -1 where the token is
// not a cache cell (slot or pos outside the cache, or its page unmapped).
__device__ __forceinline__ int64_t kv_row(const KvLayer& kv, int32_t slot, int32_t pos) {
    if (slot < 0 || slot >= kv.n_slots || pos < 0 || pos >= kv.n_ctx) return -1;
    const int32_t page = kv.pages[int64_t(slot) * kv.pages_per_slot + pos / kv.page_size];
    if (page < 0) return -1;
    return int64_t(page) * kv.page_size + pos % kv.page_size;
}

}  // namespace tern::cuda
