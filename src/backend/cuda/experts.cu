// Mixture-of-experts kernels other than the integer expert matmuls (those are
// mmvq.cu's and mmq.cu's, with a routed token map): the routing of each token
// to its top-k experts, the grouping of the routed rows by expert for the
// prefill matmul, and the weighted combine. (The float-weight expert matmul
// is matmul_float.cu's.)
// Nothing here uses atomics: the groups list each expert's rows in row order,
// so what feeds the logits is the same whatever the launch timing.
#include <climits>

#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace tern::cuda {
namespace {

constexpr unsigned kAll = 0xffffffffu;
constexpr int kMaxSlots = 8;  // logits per lane: 32 x 8 = 256 experts

// One warp per token: lane L holds experts L, L + 32, ...; each of the k
// rounds takes the best unchosen expert of every lane, then of the warp (a
// larger logit, or an equal one of lower index; NaN as -inf), as
// cpu::route_top_k does. The weights are its softmax over the chosen logits.
__global__ void route_kernel(const float* __restrict__ logits, int64_t n_tokens, int n_expert, int k,
                             int32_t* __restrict__ ids, float* __restrict__ weights) {
    after_prior_grids();
    const int64_t t = int64_t(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (t >= n_tokens) return;  // uniform per warp
    const int lane = threadIdx.x & 31;
    const float* row = logits + t * n_expert;
    float v[kMaxSlots];
#pragma unroll
    for (int i = 0; i < kMaxSlots; ++i) {
        const int e = lane + 32 * i;
        const float x = e < n_expert ? row[e] : -INFINITY;
        v[i] = isnan(x) ? -INFINITY : x;
    }
    unsigned taken = 0;  // bit i: expert lane + 32 i chosen (or past n_expert)
#pragma unroll
    for (int i = 0; i < kMaxSlots; ++i)
        if (lane + 32 * i >= n_expert) taken |= 1u << i;
    for (int j = 0; j < k; ++j) {
        float best = -INFINITY;
        int bidx = INT_MAX;
#pragma unroll
        for (int i = 0; i < kMaxSlots; ++i)
            if (!(taken >> i & 1) && (v[i] > best || bidx == INT_MAX)) best = v[i], bidx = lane + 32 * i;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ob = __shfl_xor_sync(kAll, best, o);
            const int oi = __shfl_xor_sync(kAll, bidx, o);
            if (ob > best || (ob == best && oi < bidx)) best = ob, bidx = oi;
        }
        if (bidx % 32 == lane) taken |= 1u << (bidx / 32);
        if (lane == 0) ids[t * k + j] = bidx;
    }
    if (lane == 0) {
        auto key = [&](int j) { const float x = row[ids[t * k + j]]; return isnan(x) ? -INFINITY : x; };
        float sum = 0.0f;
        for (int j = 0; j < k; ++j) sum += expf(key(j) - key(0));
        for (int j = 0; j < k; ++j) weights[t * k + j] = expf(key(j) - key(0)) / sum;
    }
}

// The grouping: one CTA, a thread per expert: counts of each expert's rows,
// their starts (a prefix sum), then each expert's rows in order and its
// 64-row tiles.
constexpr int kGroupThreads = 256, kChunk = 4096;

// Calls visit(p) for each routed row p of this thread's expert (threadIdx.x),
// in row order. ids are staged in shared memory a chunk at a time, one byte
// each, and scanned four at a time; every thread of the CTA calls it (it
// synchronises).
template <class Visit>
__device__ __forceinline__ void for_each_row_of_mine(const int32_t* __restrict__ ids, int n_pairs, int n_expert,
                                                     uint8_t* s_ids, Visit visit) {
    const uint32_t mine = uint32_t(threadIdx.x & 0xff) * 0x01010101u;
    for (int c0 = 0; c0 < n_pairs; c0 += kChunk) {
        const int n = min(kChunk, n_pairs - c0);
        __syncthreads();  // the previous chunk's scan is done
        for (int i = threadIdx.x; i < kChunk; i += kGroupThreads) s_ids[i] = i < n ? uint8_t(ids[c0 + i]) : 0xff;
        __syncthreads();
        if (int(threadIdx.x) >= n_expert) continue;
        const uint32_t* w = reinterpret_cast<const uint32_t*>(s_ids);
        for (int i = 0; i < (n + 3) / 4; ++i)
            for (uint32_t eq = __vcmpeq4(w[i], mine); eq;) {
                const int b = (__ffs(eq) - 1) / 8;
                eq &= ~(0xffu << (8 * b));
                if (4 * i + b < n) visit(c0 + 4 * i + b);  // bytes past n hold 0xff, expert 255's id
            }
    }
}

__global__ void __launch_bounds__(kGroupThreads) group_kernel(const int32_t* __restrict__ ids, int n_pairs,
                                                              int n_expert, ExpertGroups g, int max_tiles) {
    after_prior_grids();
    __shared__ __align__(16) uint8_t s_ids[kChunk];
    __shared__ int s_count[kGroupThreads], s_start[kGroupThreads + 1], s_tile[kGroupThreads + 1];
    const int e = threadIdx.x;
    int count = 0;
    for_each_row_of_mine(ids, n_pairs, n_expert, s_ids, [&](int) { ++count; });
    s_count[e] = e < n_expert ? count : 0;
    __syncthreads();
    if (threadIdx.x == 0) {
        s_start[0] = s_tile[0] = 0;
        for (int x = 0; x < kGroupThreads; ++x) {
            s_start[x + 1] = s_start[x] + s_count[x];
            s_tile[x + 1] = s_tile[x] + (s_count[x] + kExpertTileRows - 1) / kExpertTileRows;
        }
    }
    __syncthreads();
    if (e < n_expert) g.start[e] = s_start[e];
    if (threadIdx.x == 0) g.start[n_expert] = s_start[n_expert];
    if (e < n_expert)
        for (int i = 0; i < s_tile[e + 1] - s_tile[e]; ++i) g.tiles[s_tile[e] + i] = make_int2(e, i * kExpertTileRows);
    for (int i = s_tile[kGroupThreads] + threadIdx.x; i < max_tiles; i += kGroupThreads) g.tiles[i] = make_int2(-1, 0);
    // Each expert's rows, in row order.
    int at = s_start[e];
    for_each_row_of_mine(ids, n_pairs, n_expert, s_ids, [&](int p) { g.pairs[at++] = p; });
}

__global__ void combine_kernel(const float* __restrict__ y, const float* __restrict__ weights, int64_t n_tokens,
                               int k, int64_t cols, float* __restrict__ out) {
    after_prior_grids();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * cols) return;
    const int64_t t = i / cols, c = i % cols;
    float acc = __fmul_rn(weights[t * k], y[(t * k) * cols + c]);
    for (int j = 1; j < k; ++j) acc = __fmaf_rn(weights[t * k + j], y[(t * k + j) * cols + c], acc);
    out[i] = acc;
}

}  // namespace

void route_experts(const float* logits, int64_t n_tokens, int n_expert, int k, int32_t* ids, float* weights,
                   cudaStream_t s) {
    if (n_tokens < 1) return;
    constexpr int kWarps = 4;
    launch(route_kernel, unsigned((n_tokens + kWarps - 1) / kWarps), kWarps * 32, 0, s, logits, n_tokens, n_expert, k,
           ids, weights);
}

int expert_max_tiles(int64_t n_pairs, int n_expert) {
    return int((n_pairs + kExpertTileRows - 1) / kExpertTileRows + (n_pairs < n_expert ? n_pairs : n_expert));
}

void group_experts(const int32_t* ids, int64_t n_pairs, int n_expert, ExpertGroups g, cudaStream_t s) {
    if (n_pairs < 1) return;
    launch(group_kernel, 1, kGroupThreads, 0, s, ids, int(n_pairs), n_expert, g, expert_max_tiles(n_pairs, n_expert));
}

void combine_experts(const float* y, const float* weights, int64_t n_tokens, int k, int64_t cols, float* out,
                     cudaStream_t s) {
    const int64_t n = n_tokens * cols;
    if (n < 1) return;
    launch(combine_kernel, unsigned((n + 255) / 256), 256, 0, s, y, weights, n_tokens, k, cols, out);
}

}  // namespace tern::cuda
