// prepare_attention (ops.h): a layer's q, k and v made ready for attention in
// one launch instead of up to five (per-head norms of q and k, rope of each,
// kv_store). At one token those are kernels of a few hundred elements whose
// cost is their latency; here a warp takes one head through every step
// while it sits in registers and shared memory.
//
// Each step keeps the arithmetic of the kernel it replaces (row_ops.cuh):
// - the norm sums the squares of a head's elements as rms_norm_kernel does
//   with a row of head_dim (at most 256) elements on its 256 threads: warp j
//   of that kernel sums elements 32j..32j+31 by a butterfly, and the warps'
//   sums are added in order, so here lane l butterflies element 32j + l for
//   each j and adds the sums in order of j;
// - rope's angles and rotations, pair by pair;
// - kv_store's rounding to f16 and its cells.
#include <cuda_fp16.h>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/row_ops.cuh"

namespace tern::cuda {
namespace {

constexpr int kWarps = 4;                       // heads per CTA
constexpr int kMaxHeadDim = 256;                // attention_supported()'s limit
constexpr int kMaxPerLane = kMaxHeadDim / 32;

// CTA (t, y): token t, heads y * kWarps ... of the n_heads query heads
// followed by the n_kv_heads key heads; a key head's warp stores its value
// head too. Early: the norm weights, the token's cache row and rope's angles
// (from the host-copied positions and page tables) before the wait, where
// they overlap the kernel before (launch.cuh); else all after it.
template <bool Early>
__global__ void __launch_bounds__(kWarps * 32)
    prepare_attention_kernel(KvLayer kv, float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v,
                             int n_heads, HeadNorms norms, RopeArgs rope, const int32_t* slot, const int32_t* pos) {
    if constexpr (!Early) after_prior_grids();
    __shared__ float trig[kMaxHeadDim];  // rope_trig: half <= head_dim / 2
    __shared__ float staged[kWarps][kMaxHeadDim];
    const int64_t t = blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_kv = kv.n_kv_heads, hd = kv.head_dim, per_lane = hd / 32;
    const int head = int(blockIdx.y) * kWarps + warp;
    const bool active = head < n_heads + n_kv, is_q = head < n_heads;
    const int h = is_q ? head : head - n_heads;
    float* x = is_q ? q + (t * n_heads + h) * hd : k + (t * n_kv + h) * hd;
    const float* g = is_q ? norms.q : norms.k;

    float e[kMaxPerLane], w[kMaxPerLane], ve[kMaxPerLane];
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) w[j] = active && j < per_lane && g ? g[32 * j + lane] : 1.0f;
    const int64_t row = active && !is_q ? kv_row(kv, slot[t], pos[t]) : -1;
    if constexpr (Early) {
        rope_trig(rope, pos[t], trig);
        after_prior_grids();
    }
    // The head's loads go out before the angles are computed (or the barrier),
    // so that one memory latency covers both.
    const float* vh = v + (t * n_kv + h) * hd;
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
        const bool in = active && j < per_lane;
        e[j] = in ? x[32 * j + lane] : 0.0f;
        ve[j] = in && !is_q ? vh[32 * j + lane] : 0.0f;
    }
    if constexpr (!Early) rope_trig(rope, pos[t], trig);
    __syncthreads();
    if (!active) return;

    if (g) {
        // The square of a float is exact in double; see the top of the file for the order.
        double total = 0.0;
#pragma unroll
        for (int j = 0; j < kMaxPerLane; ++j) {
            if (j >= per_lane) break;
            double ss = double(e[j]) * double(e[j]);
            for (int offset = 16; offset > 0; offset >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
            total = j == 0 ? ss : total + ss;
        }
        const float inv = rms_inverse(total, hd, norms.eps);
#pragma unroll
        for (int j = 0; j < kMaxPerLane; ++j)
            if (j < per_lane) e[j] = __fmul_rn(__fmul_rn(e[j], inv), w[j]);
    }

    // Rotate through shared memory: a pair's two elements lie in different
    // lanes or rounds. Each lane rewrites only the pairs it read.
    float* s = staged[warp];
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j)
        if (j < per_lane) s[32 * j + lane] = e[j];
    __syncwarp();
    for (int i = lane; i < rope.n_dims / 2; i += 32) {
        float x0 = s[rope_first(rope, i)], x1 = s[rope_second(rope, i)];
        rope_rotate(x0, x1, trig[i], trig[rope.n_dims / 2 + i]);
        s[rope_first(rope, i)] = x0;
        s[rope_second(rope, i)] = x1;
    }
    __syncwarp();

    const int64_t at = row * int64_t(n_kv) * hd + int64_t(h) * hd;  // this head's first cache element
#pragma unroll
    for (int j = 0; j < kMaxPerLane; ++j) {
        if (j >= per_lane) break;
        const int d = 32 * j + lane;
        x[d] = s[d];
        if (row >= 0) {
            // cvt.rn: IEEE round to nearest even, as fp32_to_fp16 (NaN payloads aside).
            kv.k[at + d] = __half_as_ushort(__float2half_rn(s[d]));
            kv.v[at + d] = __half_as_ushort(__float2half_rn(ve[j]));
        }
    }
}

}  // namespace

bool prepare_attention_supported(int head_dim, const RopeArgs& rope) {
    return head_dim > 0 && head_dim % 32 == 0 && head_dim <= kMaxHeadDim && rope.head_dim == head_dim &&
           rope.n_dims >= 0 && rope.n_dims <= head_dim && rope.n_dims % 2 == 0;
}

void prepare_attention(const KvLayer& kv, float* q, float* k, const float* v, int64_t n_tokens, int n_heads,
                       const HeadNorms& norms, const RopeArgs& rope, const int32_t* slot, const int32_t* pos,
                       cudaStream_t stream) {
    const int heads = n_heads + kv.n_kv_heads;
    if (n_tokens <= 0 || heads <= 0 || !prepare_attention_supported(kv.head_dim, rope)) return;
    const dim3 grid(unsigned(n_tokens), unsigned((heads + kWarps - 1) / kWarps));
    const auto kernel = early_reads_on() ? prepare_attention_kernel<true> : prepare_attention_kernel<false>;
    launch(kernel, grid, kWarps * 32, 0, stream, kv, q, k, v, n_heads, norms, rope, slot, pos);
}

}  // namespace tern::cuda
