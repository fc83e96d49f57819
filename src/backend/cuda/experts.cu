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
#include "backend/cuda/row_ops.cuh"

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

// The grouping, a CTA per expert in two launches: count_kernel counts each
// expert's rows; place_kernel takes its expert's start and first tile from
// the counts of the experts before it and lists the expert's rows in row
// order, each warp a segment of the rows (counted, offset by the warps
// before it, then written by ballot ranks), so no atomics and no order that
// depends on timing. (One CTA walking every expert's rows took 254 us a
// layer at 512 tokens: docs/perf/LOG.md g44.)
constexpr int kGroupThreads = 1024, kGroupWarps = kGroupThreads / 32;

__device__ __forceinline__ int warp_sum(int v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kAll, v, o);
    return v;
}

// The sum of v over the CTA, in every thread (s: kGroupWarps ints).
__device__ __forceinline__ int cta_sum(int v, int* s) {
    v = warp_sum(v);
    __syncthreads();  // s may hold an earlier sum still being read
    if ((threadIdx.x & 31) == 0) s[threadIdx.x / 32] = v;
    __syncthreads();
    int total = 0;
#pragma unroll
    for (int w = 0; w < kGroupWarps; ++w) total += s[w];
    return total;
}

__global__ void __launch_bounds__(kGroupThreads) count_kernel(const int32_t* __restrict__ ids, int n_pairs,
                                                              int32_t* __restrict__ count) {
    after_prior_grids();
    __shared__ int s[kGroupWarps];
    const int e = blockIdx.x;
    int c = 0;
    for (int p = threadIdx.x; p < n_pairs; p += kGroupThreads) c += ids[p] == e;
    c = cta_sum(c, s);
    if (threadIdx.x == 0) count[e] = c;
}

__global__ void __launch_bounds__(kGroupThreads) place_kernel(const int32_t* __restrict__ ids, int n_pairs,
                                                              int n_expert, const int32_t* __restrict__ count,
                                                              ExpertGroups g, int max_tiles) {
    after_prior_grids();
    __shared__ int s[kGroupWarps], s_seg[kGroupWarps];
    const int e = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    // This expert's start (rows of the experts before it) and first tile.
    int rows_before = 0, tiles_before = 0;
    for (int x = threadIdx.x; x < e; x += kGroupThreads) {
        const int c = count[x];
        rows_before += c;
        tiles_before += (c + kExpertTileRows - 1) / kExpertTileRows;
    }
    rows_before = cta_sum(rows_before, s);
    tiles_before = cta_sum(tiles_before, s);
    const int mine = count[e], my_tiles = (mine + kExpertTileRows - 1) / kExpertTileRows;
    if (threadIdx.x == 0) g.start[e] = rows_before;
    if (threadIdx.x == 0 && e == n_expert - 1) g.start[n_expert] = rows_before + mine;
    for (int i = threadIdx.x; i < my_tiles; i += kGroupThreads)
        g.tiles[tiles_before + i] = make_int2(e, i * kExpertTileRows);
    if (e == n_expert - 1)  // the tiles past the last expert's
        for (int i = tiles_before + my_tiles + threadIdx.x; i < max_tiles; i += kGroupThreads)
            g.tiles[i] = make_int2(-1, 0);

    // The expert's rows in row order: warp w takes rows [seg * w, seg * (w + 1)).
    const int seg = (n_pairs + kGroupWarps - 1) / kGroupWarps;
    const int lo = min(n_pairs, seg * warp), hi = min(n_pairs, lo + seg);
    int n_mine = 0;
    for (int p = lo + lane; p < hi; p += 32) n_mine += ids[p] == e;
    n_mine = warp_sum(n_mine);
    if (lane == 0) s_seg[warp] = n_mine;
    __syncthreads();
    int at = rows_before;
    for (int w = 0; w < warp; ++w) at += s_seg[w];
    for (int p0 = lo; p0 < hi; p0 += 32) {
        const int p = p0 + lane;
        const bool hit = p < hi && ids[p] == e;
        const unsigned ballot = __ballot_sync(kAll, hit);
        if (hit) g.pairs[at + __popc(ballot & ((1u << lane) - 1))] = p;
        at += __popc(ballot);
    }
}

__global__ void combine_kernel(const float* __restrict__ y, const float* __restrict__ weights, int64_t n_tokens,
                               int k, int64_t cols, float* __restrict__ out) {
    after_prior_grids();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n_tokens * cols) return;
    const int64_t t = i / cols, c = i % cols;
    float acc = 0.0f;
    for (int j = 0; j < k; ++j) acc = combine_step(j, weights[t * k + j], y[(t * k + j) * cols + c], acc);
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
    if (n_pairs < 1 || n_expert < 1) return;
    launch(count_kernel, unsigned(n_expert), kGroupThreads, 0, s, ids, int(n_pairs), g.count);
    launch(place_kernel, unsigned(n_expert), kGroupThreads, 0, s, ids, int(n_pairs), n_expert,
           static_cast<const int32_t*>(g.count), g, expert_max_tiles(n_pairs, n_expert));
}

void combine_experts(const float* y, const float* weights, int64_t n_tokens, int k, int64_t cols, float* out,
                     cudaStream_t s) {
    const int64_t n = n_tokens * cols;
    if (n < 1) return;
    launch(combine_kernel, unsigned((n + 255) / 256), 256, 0, s, y, weights, n_tokens, k, cols, out);
}

}  // namespace tern::cuda
