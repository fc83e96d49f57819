// Prefill matmul on int8 tensor cores (mma.sync m16n8k32, s8 x s8 -> s32).
// A CTA computes a 128-row x 64-token tile with eight warps (4 x 2, each 32
// rows x 32 tokens); per k step it stages one chunk (eight 32-element blocks:
// eight legacy blocks or one K-quant super-block) of weights, decoded to int8
// by block_decode.cuh, and of quantized activations into shared memory. Each
// block's integer sums come from one mma (two m16n8k16 for q6_K, whose
// 16-element halves have their own scales). Legacy types then form a float
// term per block and sum them in chunks; K-quants add sc * H as integers over
// the super-block and form one term per super-block. Both follow the order
// kernels.h documents, so the result has mmvq's bits and the CPU twin's.
// An expert's tiles (mmq_experts) are the same tiles over its routed rows,
// gathered from the activations and scattered to the output by a token map,
// so each row's arithmetic is unchanged.
#include <cstdlib>
#include <type_traits>

#include "backend/cuda/block_decode.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ldmatrix.cuh"
#include "backend/cuda/mma_int8.cuh"

namespace tern::cuda {
namespace {

// Rows per tile: 128 (eight warps) for prefill; 32 (two warps) when all the
// tokens fit one token tile (decode steps of many sequences), where a
// 128-row tile would leave most SMs idle (4096 rows: 32 CTAs). The tile never
// changes an output's arithmetic. TERN_MMQ_ROWS=64 selects the four-warp
// tile for every call, for A/B measurements (docs/perf/LOG.md).
constexpr int kTileTokens = 64;
constexpr int kPitch = 256 + 16;       // bytes per staged row: a chunk plus padding against bank conflicts

// Shared memory of one k step. Legacy types (no integer scales): per row and
// block the scale and min, per block and token the activation's. K-quants:
// per row the super-block's d and dmin, per row and block the integer scales,
// per row the eight mins and per token the eight block sums as dp2a operands,
// per token the group's scale.
template <int kTileRows>
struct StageLegacy {
    int8_t w[kTileRows][kPitch];
    int8_t x[kTileTokens][kPitch];
    // Per row and block (one padding column: a warp's eight rows read distinct banks).
    float2 wdm[kTileRows][9];           // d, m
    // Per block and token: a lane's two adjacent tokens are one 8-byte load; the
    // pitch puts the eight blocks of four tokens that a warp stores in distinct banks.
    float xd[8][kTileTokens + 4];
    int xsum[8][kTileTokens + 4];
};

template <int kTileRows>
struct StageK {
    int8_t w[kTileRows][kPitch];
    int8_t x[kTileTokens][kPitch];
    int sc[2][kTileRows][9];            // block j's scale (q6_K: of elements 0..15, then 16..31); padded as above
    int mn[kTileRows][2];               // the eight 6-bit mins, one byte each (q4_K, q5_K)
    float2 dm[kTileRows];               // the super-block's d and dmin
    int xs[kTileTokens][4];             // the eight block sums as int16 pairs
    float xd[kTileTokens];              // the group's scale
};

// Where the CTA's tile sits in the output (first row and token), and a warp
// and its lane in the tile: 4 x 2 warps of 32 rows x 32 tokens; an mma's
// accumulators hold rows g, g + 8 and tokens 2tig, 2tig + 1.
struct WarpPlace {
    int64_t row0, tok0;
    int tid, lane, g, tig, wr, wt;
    __device__ WarpPlace(int64_t first_row, int64_t first_token) {
        row0 = first_row;
        tok0 = first_token;
        tid = threadIdx.x;
        const int warp = tid >> 5;
        lane = tid & 31;
        g = lane >> 2;
        tig = lane & 3;
        wr = (warp >> 1) * 32;
        wt = (warp & 1) * 32;
    }
};

// Staging hands each thread whole units: kTileRows * 8 weight units and
// kTileTokens * 8 activation units over kThreads threads.
__host__ __device__ constexpr bool staging_divides(int tile_rows, int threads) {
    return tile_rows * 8 % threads == 0 && kTileTokens * 8 % threads == 0;
}

// Weight unit u = (row r, block j) of the k step: eight consecutive threads
// read one row's chunk. Units past the matrix (rows past the last, blocks past
// the row's end) decode a block that exists, the tile's first row's block 0:
// no result reads them (their rows and tokens are not written, their blocks
// are past nb), and every load is unconditional, so the compiler issues all of
// a thread's loads before its first decode. Writes the values; returns them.
template <WType T, bool WIDE>
__device__ __forceinline__ BlockVals stage_weight_block(const DevWeight& w, int64_t row0, int64_t kc, int nb, int r,
                                                        int j, int8_t* dst_row) {
    const bool valid = row0 + r < w.rows && j < nb;
    const uint8_t* chunk = chunk_ptr<T>(w.data + (valid ? row0 + r : row0) * w.row_stride, kc, w.block_stride);
    const BlockVals v = decode_block<T, WIDE>(chunk, valid ? j : 0);
    int4* dst = reinterpret_cast<int4*>(dst_row + j * 32);
    dst[0] = make_int4(v.q[0], v.q[1], v.q[2], v.q[3]);
    dst[1] = make_int4(v.q[4], v.q[5], v.q[6], v.q[7]);
    return v;
}

// Which activation row and output row the tile's token i is: the same for a
// plain matmul; for an expert's tile, the routed rows of its group.
struct DenseTokens {
    __device__ int64_t act(int64_t i) const { return i; }
    __device__ int64_t out(int64_t i) const { return i; }
};
struct RoutedTokens {
    const int32_t* pairs;  // the expert's routed rows, in order
    int per;               // routed rows per activation row
    __device__ int64_t act(int64_t i) const { return pairs[i] / per; }
    __device__ int64_t out(int64_t i) const { return pairs[i]; }
};

// Activation unit u = (token t, block j), likewise; returns the block's index
// in the activation planes (0 for units past the matrix).
template <class Tokens>
__device__ __forceinline__ int64_t stage_act_block(const DevAct& a, const Tokens& tk, int64_t n_tokens, int64_t tok0,
                                                   int64_t kc, int nb, int t, int j, int8_t* dst_row) {
    const bool valid = tok0 + t < n_tokens && j < nb;
    const int64_t ab = valid ? tk.act(tok0 + t) * a.blocks + kc * 8 + j : 0;
    const int4* src = reinterpret_cast<const int4*>(a.qs + ab * 32);
    int4* dst = reinterpret_cast<int4*>(dst_row + j * 32);
    dst[0] = src[0];
    dst[1] = src[1];
    return ab;
}

// This lane's A fragments of block j for the warp's two 16-row slices (rows g,
// g + 8 of each; matrices: rows 0-7 / 8-15 x bytes 0-15 / 16-31), and B
// fragments for its four 8-token tiles (bytes 4tig.. of the block's halves;
// bf[np] covers tiles 2np, 2np + 1).
__device__ __forceinline__ void load_fragments(const int8_t (*w)[kPitch], const int8_t (*x)[kPitch], const WarpPlace& p,
                                               int j, int (&af)[2][4], int (&bf)[2][4]) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
        ldmatrix_x4(af[mi], &w[p.wr + mi * 16 + (p.lane & 7) + 8 * ((p.lane >> 3) & 1)][j * 32 + 16 * (p.lane >> 4)]);
#pragma unroll
    for (int np = 0; np < 2; ++np)
        ldmatrix_x4(bf[np], &x[p.wt + np * 16 + (p.lane & 7) + 8 * (p.lane >> 4)][j * 32 + 16 * ((p.lane >> 3) & 1)]);
}

// acc[mi][ni][e] is row wr + 16mi + g (+ 8 for e >= 2), token wt + 8ni + 2tig (+ 1 for odd e).
template <class Tokens>
__device__ __forceinline__ void store_tile(const float (&acc)[2][4][4], const WarpPlace& p, const Tokens& tk,
                                           int64_t rows, int64_t n_tokens, float* __restrict__ y, int64_t y_stride) {
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < 4; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int64_t row = p.row0 + p.wr + mi * 16 + p.g + (e >= 2 ? 8 : 0);
                const int64_t tok = p.tok0 + p.wt + ni * 8 + p.tig * 2 + (e & 1);
                if (row < rows && tok < n_tokens) y[tk.out(tok) * y_stride + row] = acc[mi][ni][e];
            }
}

template <class A>
__device__ __forceinline__ void fill(A& a, typename std::remove_all_extents<A>::type v) {
    auto* p = reinterpret_cast<typename std::remove_all_extents<A>::type*>(&a);
    const int n = sizeof(A) / sizeof(v);
#pragma unroll
    for (int i = 0; i < n; ++i) p[i] = v;
}

// Legacy types (32-element blocks): each block's float term per output,
// summed in chunks of eight blocks (kernels.h).
template <WType T, int kTileRows, int kThreads, class Tokens>
__device__ __forceinline__ void mmq_legacy_tile(const DevWeight& w, const DevAct& a, const Tokens& tk,
                                                int64_t n_tokens, const WarpPlace& p, float* __restrict__ y,
                                                int64_t y_stride) {
    constexpr TermKind K = BlockInfo<T>::kind;
    static_assert(staging_divides(kTileRows, kThreads), "staging units divide evenly");
    extern __shared__ __align__(16) unsigned char smem[];
    StageLegacy<kTileRows>& s = *reinterpret_cast<StageLegacy<kTileRows>*>(smem);
    const int64_t nblocks = w.cols / 32, nchunks = (nblocks + 7) / 8;

    float acc[2][4][4];
    fill(acc, 0.0f);
    for (int64_t kc = 0; kc < nchunks; ++kc) {
        const int nb = int(min64(8, nblocks - kc * 8));
        __syncthreads();  // the previous chunk's compute is done with the stage
#pragma unroll
        for (int i = 0; i < kTileRows * 8 / kThreads; ++i) {
            const int u = p.tid + i * kThreads, r = u >> 3, j = u & 7;
            const BlockVals v = stage_weight_block<T, false>(w, p.row0, kc, nb, r, j, s.w[r]);
            s.wdm[r][j] = make_float2(v.d, v.m);
        }
#pragma unroll
        for (int i = 0; i < kTileTokens * 8 / kThreads; ++i) {
            const int u = p.tid + i * kThreads, t = u >> 3, j = u & 7;
            const int64_t ab = stage_act_block(a, tk, n_tokens, p.tok0, kc, nb, t, j, s.x[t]);
            s.xd[j][t] = a.d[ab];
            s.xsum[j][t] = a.sum[ab];
        }
        __syncthreads();

        // The chunk's sum starts at -0.0, so the first term enters unchanged
        // (-0 + t == t for every t, signed zeros included).
        float c[2][4][4];
        fill(c, -0.0f);
        for (int j = 0; j < nb; ++j) {
            int af[2][4], bf[2][4];
            load_fragments(s.w, s.x, p, j, af, bf);
            float2 dm[2][2];  // d, m of this lane's rows g and g + 8 of each 16-row slice
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) dm[mi][h] = s.wdm[p.wr + mi * 16 + p.g + 8 * h][j];
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int b0 = bf[ni >> 1][2 * (ni & 1)], b1 = bf[ni >> 1][2 * (ni & 1) + 1];
                const int t0 = p.wt + ni * 8 + p.tig * 2;
                const float2 da = *reinterpret_cast<const float2*>(&s.xd[j][t0]);
                const int2 as = *reinterpret_cast<const int2*>(&s.xsum[j][t0]);
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    int h0[4];
                    mma_k32(h0, af[mi], b0, b1);
                    const float t_[4] = {block_term<K>(dm[mi][0].x, dm[mi][0].y, h0[0], da.x, as.x),
                                         block_term<K>(dm[mi][0].x, dm[mi][0].y, h0[1], da.y, as.y),
                                         block_term<K>(dm[mi][1].x, dm[mi][1].y, h0[2], da.x, as.x),
                                         block_term<K>(dm[mi][1].x, dm[mi][1].y, h0[3], da.y, as.y)};
#pragma unroll
                    for (int e = 0; e < 4; ++e) c[mi][ni][e] = __fadd_rn(c[mi][ni][e], t_[e]);
                }
            }
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int ni = 0; ni < 4; ++ni)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[mi][ni][e] = __fadd_rn(acc[mi][ni][e], c[mi][ni][e]);
    }
    store_tile(acc, p, tk, w.rows, n_tokens, y, y_stride);
}

// K-quants: per output, the super-block's integer totals A (sc * H per block,
// from the mma) and X (the mins against the block sums, four dp2a), then one
// inner term and one fused multiply-add by the group scale (kernels.h): a few
// instructions per output and super-block where the legacy order needs five
// per output and block.
template <WType T, bool WIDE, int kTileRows, int kThreads, class Tokens>
__device__ __forceinline__ void mmq_kquant_tile(const DevWeight& w, const DevAct& a, const Tokens& tk,
                                                int64_t n_tokens, const WarpPlace& p, float* __restrict__ y,
                                                int64_t y_stride) {
    constexpr bool two_scales = T == WType::Q6_K;
    constexpr bool has_min = BlockInfo<T>::kind == TermKind::min;
    static_assert(staging_divides(kTileRows, kThreads), "staging units divide evenly");
    extern __shared__ __align__(16) unsigned char smem[];
    StageK<kTileRows>& s = *reinterpret_cast<StageK<kTileRows>*>(smem);
    const int64_t nchunks = w.cols / 256;  // whole super-blocks

    float acc[2][4][4];
    fill(acc, 0.0f);
    for (int64_t kc = 0; kc < nchunks; ++kc) {
        __syncthreads();  // the previous super-block's compute is done with the stage
#pragma unroll
        for (int i = 0; i < kTileRows * 8 / kThreads; ++i) {
            const int u = p.tid + i * kThreads, r = u >> 3, j = u & 7;
            const BlockVals v = stage_weight_block<T, WIDE>(w, p.row0, kc, 8, r, j, s.w[r]);
            s.sc[0][r][j] = v.sc0;
            if (two_scales) s.sc[1][r][j] = v.sc1;
            if (has_min) reinterpret_cast<uint8_t*>(s.mn[r])[j] = uint8_t(v.mn);
            if (j == 0) s.dm[r] = make_float2(v.d, v.m);
        }
#pragma unroll
        for (int i = 0; i < kTileTokens * 8 / kThreads; ++i) {
            const int u = p.tid + i * kThreads, t = u >> 3, j = u & 7;
            const int64_t ab = stage_act_block(a, tk, n_tokens, p.tok0, kc, 8, t, j, s.x[t]);
            if (has_min) reinterpret_cast<int16_t*>(s.xs[t])[j] = int16_t(a.sum[ab]);
            if (j == 0) s.xd[t] = a.d[ab];
        }
        __syncthreads();

        int ia[2][4][4];  // A per output: sum over the blocks of sc * H
        fill(ia, 0);
        // Not unrolled: hoisting the next blocks' fragments spills (ptxas -v).
#pragma unroll 1
        for (int j = 0; j < 8; ++j) {
            int af[2][4], bf[2][4];
            load_fragments(s.w, s.x, p, j, af, bf);
            int sc[2][2][2];  // [slice][row g, g + 8][half]
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int r = p.wr + mi * 16 + p.g + 8 * h;
                    sc[mi][h][0] = s.sc[0][r][j];
                    sc[mi][h][1] = two_scales ? s.sc[1][r][j] : 0;
                }
#pragma unroll
            for (int ni = 0; ni < 4; ++ni) {
                const int b0 = bf[ni >> 1][2 * (ni & 1)], b1 = bf[ni >> 1][2 * (ni & 1) + 1];
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    int h0[4];
                    if (two_scales) {
                        int h1[4];
                        mma_k16(h0, af[mi][0], af[mi][1], b0);
                        mma_k16(h1, af[mi][2], af[mi][3], b1);
#pragma unroll
                        for (int e = 0; e < 4; ++e)
                            ia[mi][ni][e] += sc[mi][e >> 1][0] * h0[e] + sc[mi][e >> 1][1] * h1[e];
                    } else {
                        mma_k32(h0, af[mi], b0, b1);
#pragma unroll
                        for (int e = 0; e < 4; ++e) ia[mi][ni][e] += sc[mi][e >> 1][0] * h0[e];
                    }
                }
            }
        }

        // The super-block's term per output, added in order.
        float2 dm[2][2];
        int2 mn[2][2];
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = p.wr + mi * 16 + p.g + 8 * h;
                dm[mi][h] = s.dm[r];
                mn[mi][h] = has_min ? *reinterpret_cast<const int2*>(s.mn[r]) : make_int2(0, 0);
            }
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) {
            const int t0 = p.wt + ni * 8 + p.tig * 2;
            const float2 D = *reinterpret_cast<const float2*>(&s.xd[t0]);
            int4 xs[2];
            if (has_min) {
                xs[0] = *reinterpret_cast<const int4*>(s.xs[t0]);
                xs[1] = *reinterpret_cast<const int4*>(s.xs[t0 + 1]);
            }
#pragma unroll
            for (int mi = 0; mi < 2; ++mi)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int h = e >> 1, tk = e & 1;
                    float inner;
                    if (has_min) {
                        const int2 m = mn[mi][h];
                        int X = __dp2a_lo(xs[tk].x, m.x, 0);
                        X = __dp2a_hi(xs[tk].y, m.x, X);
                        X = __dp2a_lo(xs[tk].z, m.y, X);
                        X = __dp2a_hi(xs[tk].w, m.y, X);
                        inner = kquant_inner_min(dm[mi][h].x, dm[mi][h].y, ia[mi][ni][e], X);
                    } else {
                        inner = kquant_inner_scale(dm[mi][h].x, ia[mi][ni][e]);
                    }
                    acc[mi][ni][e] = __fmaf_rn(tk ? D.y : D.x, inner, acc[mi][ni][e]);
                }
        }
    }
    store_tile(acc, p, tk, w.rows, n_tokens, y, y_stride);
}

// The tile of one CTA, either type family.
template <WType T, bool WIDE, int kTileRows, class Tokens>
__device__ __forceinline__ void mmq_tile(const DevWeight& w, const DevAct& a, const Tokens& tk, int64_t n_tokens,
                                         const WarpPlace& p, float* __restrict__ y, int64_t y_stride) {
    if constexpr (BlockInfo<T>::kquant)
        mmq_kquant_tile<T, WIDE, kTileRows, kTileRows * 2>(w, a, tk, n_tokens, p, y, y_stride);
    else
        mmq_legacy_tile<T, kTileRows, kTileRows * 2>(w, a, tk, n_tokens, p, y, y_stride);
}

template <WType T, bool WIDE, int kTileRows>
__global__ void __launch_bounds__(kTileRows * 2, 2) mmq_kernel(DevWeight w, DevAct a, int64_t n_tokens,
                                                              float* __restrict__ y, int64_t y_stride) {
    wait_for_prior_grids();  // no early launch of the next grid (launch.cuh)
    const WarpPlace p(int64_t(blockIdx.x) * kTileRows, int64_t(blockIdx.y) * kTileTokens);
    mmq_tile<T, WIDE, kTileRows>(w, a, DenseTokens{}, n_tokens, p, y, y_stride);
}

// An expert's tile: blockIdx.y names (expert, first routed row) in the groups' tile list.
template <WType T, bool WIDE, int kTileRows>
__global__ void __launch_bounds__(kTileRows * 2, 2) mmq_experts_kernel(const uint8_t* const* __restrict__ experts,
                                                                      DevWeight w, DevAct a, ExpertGroups g, int per,
                                                                      float* __restrict__ y, int64_t y_stride) {
    wait_for_prior_grids();  // no early launch of the next grid (launch.cuh)
    static_assert(kExpertTileRows == kTileTokens, "the groups' tiles are the kernel's token tiles");
    const int2 tile = g.tiles[blockIdx.y];
    if (tile.x < 0) return;  // past the routing's tiles: uniform per CTA
    const int32_t first = g.start[tile.x];
    w.data = experts[tile.x];
    const WarpPlace p(int64_t(blockIdx.x) * kTileRows, tile.y);
    mmq_tile<T, WIDE, kTileRows>(w, a, RoutedTokens{g.pairs + first, per}, g.start[tile.x + 1] - first, p, y, y_stride);
}

// Shared memory of a tile's stage.
template <WType T, int kTileRows>
int tile_smem() {
    if constexpr (BlockInfo<T>::kquant)
        return int(sizeof(StageK<kTileRows>));
    else
        return int(sizeof(StageLegacy<kTileRows>));
}

template <WType T, bool WIDE, int kTileRows>
void launch_tile(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    const dim3 grid(unsigned((w.rows + kTileRows - 1) / kTileRows), unsigned((n + kTileTokens - 1) / kTileTokens));
    // More than the default 48 KiB of shared memory needs the opt-in (per device;
    // cheap, and prefill launches are few). A failure here fails the launch,
    // which the caller's error check reports.
    const int smem = tile_smem<T, kTileRows>();
    cudaFuncSetAttribute(mmq_kernel<T, WIDE, kTileRows>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    launch(mmq_kernel<T, WIDE, kTileRows>, grid, kTileRows * 2, smem, s, w, a, n, y, ys);
}

int tile_rows() {
    static const int rows = [] {
        const char* e = std::getenv("TERN_MMQ_ROWS");
        return e && std::atoi(e) == 64 ? 64 : 128;
    }();
    return rows;
}

template <WType T, bool WIDE>
void launch_for(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    if (tile_rows() == 64)
        launch_tile<T, WIDE, 64>(w, a, n, y, ys, s);
    else if (n <= kTileTokens)
        launch_tile<T, WIDE, 32>(w, a, n, y, ys, s);
    else
        launch_tile<T, WIDE, 128>(w, a, n, y, ys, s);
}

}  // namespace

void mmq_experts(const uint8_t* const* experts, const DevWeight& w, const DevAct& a, const ExpertGroups& g,
                 int64_t n_pairs, int n_expert, int per, float* y, int64_t ys, cudaStream_t s) {
    if (n_pairs < 1 || w.rows < 1) return;
    constexpr int kRows = 128;
    const dim3 grid(unsigned((w.rows + kRows - 1) / kRows), unsigned(expert_max_tiles(n_pairs, n_expert)));
    dispatch_int_type(w.type, w.block_stride, [&](auto tag) {
        using Tag = decltype(tag);
        const int smem = tile_smem<Tag::type, kRows>();
        auto* kernel = mmq_experts_kernel<Tag::type, Tag::wide, kRows>;
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        launch(kernel, grid, kRows * 2, smem, s, experts, w, a, g, per, y, ys);
    });
}

void mmq_mma_sync(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    if (n < 1 || w.rows < 1) return;
    dispatch_int_type(w.type, w.block_stride, [&](auto tag) {
        using Tag = decltype(tag);
        launch_for<Tag::type, Tag::wide>(w, a, n, y, ys, s);
    });
}

void mmq(const DevWeight& w, const DevAct& a, int64_t n, float* y, int64_t ys, cudaStream_t s) {
    if (n < 1 || w.rows < 1) return;
    if (!mmq_wgmma(w, a, n, y, ys, s)) mmq_mma_sync(w, a, n, y, ys, s);
}

}  // namespace tern::cuda
