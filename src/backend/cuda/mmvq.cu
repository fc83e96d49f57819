// Decode matmul (1..8 tokens), and its routed forms for experts (one token row
// per CTA column, its expert's matrix; gate and up with their SwiGLU in one
// pass; down with the weighted combine of a token's experts in one pass): one
// warp per weight row. A warp takes four
// chunks (eight 32-element blocks each: a K-quant super-block, or eight legacy
// blocks) per round, one block per lane, so consecutive lanes read consecutive
// bytes of the row and of the activations. The lanes of a chunk combine their
// blocks, and the chunks are added in order: the order kernels.h documents,
// the same bits as mmq.
#include "backend/cuda/block_decode.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/row_ops.cuh"

#include <type_traits>

namespace tern::cuda {
namespace {

constexpr int kWarps = 4;
constexpr unsigned kAll = 0xffffffffu;

// This lane's block against token t's activations: the integer sums of its
// halves (elements 0..15 and 16..31).
__device__ __forceinline__ void block_sums(const BlockVals& v, const DevAct& a, int t, int64_t b, int& H0, int& H1) {
    int x[8];
    load32_aligned(reinterpret_cast<const uint8_t*>(a.qs + (int64_t(t) * a.blocks + b) * 32), x);
    H0 = H1 = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        H0 = __dp4a(v.q[i], x[i], H0);
        H1 = __dp4a(v.q[i + 4], x[i + 4], H1);
    }
}

// Legacy types: each lane's block term; a chunk's terms summed left to right
// across its eight lanes, then the round's chunks added in order.
template <WType T, int NT>
__device__ __forceinline__ void legacy_round(const uint8_t* rowp, int block_stride, const DevAct& a, int64_t ci,
                                             int64_t b, int j, int nb, int n_here, float (&acc)[NT]) {
    const int grp = (threadIdx.x & 31) >> 3;
    float term[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) term[t] = 0.0f;
    if (j < nb) {
        const BlockVals v = decode_block<T, false>(chunk_ptr<T>(rowp, ci, block_stride), j);
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int H0, H1;
            block_sums(v, a, t, b, H0, H1);
            const int64_t ab = int64_t(t) * a.blocks + b;
            term[t] = block_term<BlockInfo<T>::kind>(v.d, v.m, H0 + H1, a.d[ab], a.sum[ab]);
        }
    }
    // Chunk sums, left to right over the group's lanes (every lane of a
    // group ends with its group's sum).
    float c[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) c[t] = __shfl_sync(kAll, term[t], grp * 8);
#pragma unroll
    for (int jj = 1; jj < 8; ++jj)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float o = __shfl_sync(kAll, term[t], grp * 8 + jj);
            if (jj < nb) c[t] = __fadd_rn(c[t], o);
        }
    // Then the round's chunks in order.
#pragma unroll
    for (int g2 = 0; g2 < 4; ++g2)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float o = __shfl_sync(kAll, c[t], g2 * 8);
            if (g2 < n_here) acc[t] = __fadd_rn(acc[t], o);
        }
}

// K-quants: each lane's block as integers (sc * H and mn * S); the
// super-block's totals by a butterfly over its eight lanes (integer sums:
// exact in any order); then the round's super-blocks in order, each as
// acc = fma(D, inner, acc).
template <WType T, bool WIDE, int NT>
__device__ __forceinline__ void kquant_round(const uint8_t* rowp, int block_stride, const DevAct& a, int64_t ci,
                                             int64_t b, bool valid, int n_here, float (&acc)[NT]) {
    constexpr bool has_min = BlockInfo<T>::kind == TermKind::min;
    int sa[NT], sx[NT];
    float wd = 0.0f, wm = 0.0f, D[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) sa[t] = sx[t] = 0, D[t] = 0.0f;
    if (valid) {
        const BlockVals v = decode_block<T, WIDE>(chunk_ptr<T>(rowp, ci, block_stride), int(b & 7));
        wd = v.d;
        wm = v.m;
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            int H0, H1;
            block_sums(v, a, t, b, H0, H1);
            const int64_t ab = int64_t(t) * a.blocks + b;
            sa[t] = has_min ? v.sc0 * (H0 + H1) : v.sc0 * H0 + v.sc1 * H1;
            if (has_min) sx[t] = v.mn * a.sum[ab];
            D[t] = a.d[ab];
        }
    }
#pragma unroll
    for (int o = 1; o < 8; o <<= 1)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            sa[t] += __shfl_xor_sync(kAll, sa[t], o);
            if (has_min) sx[t] += __shfl_xor_sync(kAll, sx[t], o);
        }
    float inner[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t)
        inner[t] = has_min ? kquant_inner_min(wd, wm, sa[t], sx[t]) : kquant_inner_scale(wd, sa[t]);
#pragma unroll
    for (int g2 = 0; g2 < 4; ++g2)
#pragma unroll
        for (int t = 0; t < NT; ++t) {
            const float d = __shfl_sync(kAll, D[t], g2 * 8), in = __shfl_sync(kAll, inner[t], g2 * 8);
            if (g2 < n_here) acc[t] = __fmaf_rn(d, in, acc[t]);
        }
}

// a's row t as a one-row activation.
__device__ __forceinline__ DevAct act_row(DevAct a, int64_t t) {
    a.qs += t * a.blocks * 32;
    a.d += t * a.blocks;
    a.sum += t * a.blocks;
    return a;
}

// Rows rowp[0..NR) of W's shape against tokens 0..NT-1 of a[i]: acc[i][t].
// The rows' rounds share each loop step, so their loads are in flight together.
template <WType T, bool WIDE, int NT, int NR>
__device__ __forceinline__ void row_dots(const uint8_t* const (&rowp)[NR], const DevWeight& w, const DevAct (&a)[NR],
                                         float (&acc)[NR][NT]) {
    const int lane = threadIdx.x & 31, grp = lane >> 3, j = lane & 7;
    const int64_t nblocks = w.cols / 32;
    const int64_t nchunks = (nblocks + 7) / 8;
#pragma unroll
    for (int i = 0; i < NR; ++i)
#pragma unroll
        for (int t = 0; t < NT; ++t) acc[i][t] = 0.0f;

#pragma unroll 4
    for (int64_t base = 0; base < nchunks; base += 4) {
        const int64_t ci = base + grp;        // this lane's chunk
        const int64_t b = ci * 8 + j;         // and block
        const int nb = ci < nchunks ? int(min64(8, nblocks - ci * 8)) : 0;
        const int n_here = int(min64(4, nchunks - base));
#pragma unroll
        for (int i = 0; i < NR; ++i) {
            if constexpr (BlockInfo<T>::kquant)
                kquant_round<T, WIDE, NT>(rowp[i], w.block_stride, a[i], ci, b, j < nb, n_here, acc[i]);
            else
                legacy_round<T, NT>(rowp[i], w.block_stride, a[i], ci, b, j, nb, n_here, acc[i]);
        }
    }
}

// Where the outputs are added to y: lane t < NT's token t value of y before
// the row's dots (loaded while the weights stream, after the wait), else 0.
template <int NT>
__device__ __forceinline__ float prior_of(bool add, int64_t row, const float* __restrict__ y, int64_t y_stride) {
    const int lane = threadIdx.x & 31;
    return add && lane < NT ? y[int64_t(lane) * y_stride + row] : 0.0f;
}

// Lane t < NT writes token t's value v[t] to y[t * y_stride + row], or with
// add prior + v[t]: the bits of the add kernel after the product.
template <int NT>
__device__ __forceinline__ void store_tokens(const float (&v)[NT], int64_t row, float* __restrict__ y,
                                             int64_t y_stride, bool add = false, float prior = 0.0f) {
    const int lane = threadIdx.x & 31;
    if (lane < NT) {
        float mine = v[0];
#pragma unroll
        for (int t = 1; t < NT; ++t)
            if (lane == t) mine = v[t];
        y[int64_t(lane) * y_stride + row] = add ? __fadd_rn(prior, mine) : mine;
    }
}

// Row `row` of W against tokens 0..NT-1 of a, into (or, with add, added to)
// y[t * y_stride + row].
template <WType T, bool WIDE, int NT>
__device__ __forceinline__ void mmvq_row(const DevWeight& w, const DevAct& a, int64_t row, float* __restrict__ y,
                                         int64_t y_stride, bool add = false) {
    if (row >= w.rows) return;  // uniform per warp
    const float prior = prior_of<NT>(add, row, y, y_stride);
    const uint8_t* const rowp[1] = {w.data + row * w.row_stride};
    const DevAct as[1] = {a};
    float acc[1][NT];
    row_dots<T, WIDE, NT, 1>(rowp, w, as, acc);
    store_tokens<NT>(acc[0], row, y, y_stride, add, prior);
}

// The parts of one launch: part i's rows are CTAs first_cta[i] .. first_cta[i + 1) - 1.
struct Parts {
    MatmulPart p[kMmvqMaxParts];
    unsigned first_cta[kMmvqMaxParts + 1];
    int n;
};

// ADD: every part's add is set (a template argument, so the kernels that
// write keep their registers).
template <WType T, bool WIDE, int NT, bool ADD>
__global__ void __launch_bounds__(kWarps * 32) mmvq_kernel(Parts parts, DevAct a) {
    after_prior_grids();
    // This CTA's part, by selects (no indexing into the parameters).
    unsigned first = 0;
    MatmulPart part = parts.p[0];
#pragma unroll
    for (int i = 1; i < kMmvqMaxParts; ++i)
        if (i < parts.n && blockIdx.x >= parts.first_cta[i]) part = parts.p[i], first = parts.first_cta[i];
    mmvq_row<T, WIDE, NT>(part.w, a, int64_t(blockIdx.x - first) * kWarps + (threadIdx.x >> 5), part.y,
                          part.y_stride, ADD);
}

// Routed row p = blockIdx.y: its expert's matrix against activation row p / per.
template <WType T, bool WIDE>
__global__ void __launch_bounds__(kWarps * 32) mmvq_experts_kernel(const uint8_t* const* __restrict__ experts,
                                                                   DevWeight w, DevAct a,
                                                                   const int32_t* __restrict__ ids, int per,
                                                                   float* __restrict__ y, int64_t y_stride) {
    after_prior_grids();
    const int64_t p = blockIdx.y;
    w.data = experts[ids[p]];
    mmvq_row<T, WIDE, 1>(w, act_row(a, p / per), int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5),
                         y + p * y_stride, y_stride);
}

// Token t = blockIdx.y: out row t = the combine of its k routed rows' products
// with their experts' matrices (activation rows t * k + j), kCombineGroup rows a
// round in one warp: the bits of mmvq_experts and combine_experts.
// ADD: out row t += that instead (a template argument, as mmvq_kernel's).
constexpr int kCombineGroup = 4;
template <WType T, bool WIDE, bool ADD>
__global__ void __launch_bounds__(kWarps * 32)
    mmvq_experts_combine_kernel(const uint8_t* const* __restrict__ experts, DevWeight w, DevAct a,
                                const int32_t* __restrict__ ids, const float* __restrict__ weights, int k,
                                float* __restrict__ out, int64_t out_stride) {
    after_prior_grids();
    const int64_t t = blockIdx.y, row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (row >= w.rows) return;  // uniform per warp
    const float prior = prior_of<1>(ADD, row, out + t * out_stride, out_stride);
    float sum = 0.0f;
    for (int j0 = 0; j0 < k; j0 += kCombineGroup) {
        const int here = min(kCombineGroup, k - j0);
        const uint8_t* rowp[kCombineGroup];
        DevAct as[kCombineGroup];
#pragma unroll
        for (int i = 0; i < kCombineGroup; ++i) {
            const int64_t p = t * k + j0 + min(i, here - 1);  // past the last: its row again, not used
            rowp[i] = experts[ids[p]] + row * w.row_stride;
            as[i] = act_row(a, p);
        }
        float acc[kCombineGroup][1];
        row_dots<T, WIDE, 1, kCombineGroup>(rowp, w, as, acc);
#pragma unroll
        for (int i = 0; i < kCombineGroup; ++i) {
            if (i < here) sum = combine_step(j0 + i, weights[t * k + j0 + i], acc[i][0], sum);
        }
    }
    const float v[1] = {sum};
    store_tokens<1>(v, row, out + t * out_stride, out_stride, ADD, prior);
}

// Routed row p = blockIdx.y: silu(gate) * up of its expert's rows of both
// sets against activation row p / per, a warp computing a gate row and its up
// row together: the bits of mmvq_experts on each set, then swiglu.
template <WType T, bool WIDE>
__global__ void __launch_bounds__(kWarps * 32)
    mmvq_experts_swiglu_kernel(const uint8_t* const* __restrict__ gate_exps, const uint8_t* const* __restrict__ up_exps,
                               DevWeight w, DevAct a, const int32_t* __restrict__ ids, int per, float* __restrict__ y,
                               int64_t y_stride) {
    after_prior_grids();
    const int64_t p = blockIdx.y, t = p / per, row = int64_t(blockIdx.x) * kWarps + (threadIdx.x >> 5);
    if (row >= w.rows) return;  // uniform per warp
    const int e = ids[p];
    const DevAct at = act_row(a, t);
    const uint8_t* const rowp[2] = {gate_exps[e] + row * w.row_stride, up_exps[e] + row * w.row_stride};
    const DevAct as[2] = {at, at};
    float acc[2][1];
    row_dots<T, WIDE, 1, 2>(rowp, w, as, acc);
    const float v[1] = {silu_times(acc[0][0], acc[1][0])};
    store_tokens<1>(v, row, y + p * y_stride, y_stride);
}

template <WType T, bool WIDE, bool ADD>
void launch_for(const Parts& parts, const DevAct& a, int n, cudaStream_t s) {
    const unsigned grid = parts.first_cta[parts.n];
    const int threads = kWarps * 32;
    switch (n) {
        case 1: launch(mmvq_kernel<T, WIDE, 1, ADD>, grid, threads, 0, s, parts, a); break;
        case 2: launch(mmvq_kernel<T, WIDE, 2, ADD>, grid, threads, 0, s, parts, a); break;
        case 3: launch(mmvq_kernel<T, WIDE, 3, ADD>, grid, threads, 0, s, parts, a); break;
        case 4: launch(mmvq_kernel<T, WIDE, 4, ADD>, grid, threads, 0, s, parts, a); break;
        case 5: launch(mmvq_kernel<T, WIDE, 5, ADD>, grid, threads, 0, s, parts, a); break;
        case 6: launch(mmvq_kernel<T, WIDE, 6, ADD>, grid, threads, 0, s, parts, a); break;
        case 7: launch(mmvq_kernel<T, WIDE, 7, ADD>, grid, threads, 0, s, parts, a); break;
        default: launch(mmvq_kernel<T, WIDE, 8, ADD>, grid, threads, 0, s, parts, a); break;
    }
}

}  // namespace

void mmvq_experts(const uint8_t* const* experts, const DevWeight& w, const DevAct& a, const int32_t* ids,
                  int64_t n_pairs, int per, float* y, int64_t ys, cudaStream_t s) {
    if (n_pairs < 1 || w.rows < 1) return;
    const dim3 grid(unsigned((w.rows + kWarps - 1) / kWarps), unsigned(n_pairs));
    dispatch_int_type(w.type, w.block_stride, [&](auto tag) {
        using Tag = decltype(tag);
        launch(mmvq_experts_kernel<Tag::type, Tag::wide>, grid, kWarps * 32, 0, s, experts, w, a, ids, per, y, ys);
    });
}

void mmvq_experts_swiglu(const uint8_t* const* gate_exps, const uint8_t* const* up_exps, const DevWeight& w,
                         const DevAct& a, const int32_t* ids, int64_t n_pairs, int per, float* y, int64_t ys,
                         cudaStream_t s) {
    if (n_pairs < 1 || w.rows < 1) return;
    const dim3 grid(unsigned((w.rows + kWarps - 1) / kWarps), unsigned(n_pairs));
    dispatch_int_type(w.type, w.block_stride, [&](auto tag) {
        using Tag = decltype(tag);
        launch(mmvq_experts_swiglu_kernel<Tag::type, Tag::wide>, grid, kWarps * 32, 0, s, gate_exps, up_exps, w, a, ids,
               per, y, ys);
    });
}

void mmvq_experts_combine(const uint8_t* const* experts, const DevWeight& w, const DevAct& a, const int32_t* ids,
                          const float* weights, int64_t n_tokens, int k, float* out, int64_t out_stride,
                          cudaStream_t s, bool add) {
    if (n_tokens < 1 || k < 1 || w.rows < 1) return;
    const dim3 grid(unsigned((w.rows + kWarps - 1) / kWarps), unsigned(n_tokens));
    dispatch_int_type(w.type, w.block_stride, [&](auto tag) {
        using Tag = decltype(tag);
        with_flag(add, [&](auto on) {
            launch(mmvq_experts_combine_kernel<Tag::type, Tag::wide, decltype(on)::value>, grid, kWarps * 32, 0, s,
                   experts, w, a, ids, weights, k, out, out_stride);
        });
    });
}

void mmvq(const DevWeight& w, const DevAct& a, int n, float* y, int64_t ys, cudaStream_t s) {
    const MatmulPart part{w, y, ys};
    mmvq_parts(&part, 1, a, n, s);
}

bool mmvq_parts_compatible(const DevWeight& a, const DevWeight& b) {
    return a.type == b.type && a.block_stride == b.block_stride && a.cols == b.cols;
}

void mmvq_parts(const MatmulPart* parts, int n_parts, const DevAct& a, int n, cudaStream_t s) {
    if (n < 1 || n > kMmvqMaxTokens || n_parts < 1 || n_parts > kMmvqMaxParts) return;
    Parts p{};
    p.first_cta[0] = 0;
    for (int i = 0; i < n_parts; ++i) {
        if (parts[i].w.rows < 1 || !mmvq_parts_compatible(parts[i].w, parts[0].w) || parts[i].add != parts[0].add)
            return;
        p.p[i] = parts[i];
        p.first_cta[i + 1] = p.first_cta[i] + unsigned((parts[i].w.rows + kWarps - 1) / kWarps);
    }
    p.n = n_parts;
    dispatch_int_type(parts[0].w.type, parts[0].w.block_stride, [&](auto tag) {
        using Tag = decltype(tag);
        with_flag(parts[0].add, [&](auto add) { launch_for<Tag::type, Tag::wide, decltype(add)::value>(p, a, n, s); });
    });
}

}  // namespace tern::cuda
