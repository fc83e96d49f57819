// Decode-batch matmul for the K-quants (q4_K, q5_K, q6_K): 1..64 tokens, the
// decode step of many sequences. At these token counts the weights are the
// cost, and a matrix has too few rows to keep the GPU busy one row tile per
// CTA (mmq's 32-row tile left 4096-row matrices at 6% of the copy rate). So
// the super-blocks of a row tile are split across the warps of its CTA: each
// warp reads one super-block of 32 rows (two while the tokens are few) straight
// into registers (no shared staging, no barrier per super-block), takes its
// integer sums from int8 mma (rows as M, tokens as N) and forms the
// super-block's inner term per output (kernels.h). The CTA then chains the
// terms in super-block order, r = fma(D, inner, r) from +0.0: the order of
// mmvq, mmq and the CPU twin, so the same bits, for any token count and any
// batch. At 24, 32 and 64 tokens a second kernel (below) stages the tokens'
// blocks in shared memory instead of reading them from L2 sub-block by
// sub-block; its terms and chain are the same. On sm_90 from 16 tokens a
// third streams weights and tokens through a ring of stages by tensor copies
// while its warps compute (LOG g43); the first two serve the rest and where
// the third cannot run (unpadded q6_K, older GPUs).
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "backend/cuda/block_decode.cuh"
#include "backend/cuda/bulk_copy.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/lane_row.cuh"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/ldmatrix.cuh"
#include "backend/cuda/mma_f16.cuh"
#include "backend/cuda/mma_int8.cuh"
#include "backend/cuda/super_block_ring.cuh"
#include "backend/cuda/tensor_map.h"

namespace tern::cuda {
namespace {

constexpr int kRows = 32;   // rows per CTA: a warp's two 16-row mma slices
constexpr int kWarps = 8;   // super-blocks in flight per CTA (a window)
constexpr int kThreads = kWarps * 32;

// One warp's super-block results, per (token, row) of the CTA's tile, and
// the tokens' sums and scales it read; NT tokens (a multiple of 8).
template <int NT>
struct Part {
    float inner[NT][kRows + 4];  // padded: a warp's stores of one mma's outputs hit distinct banks
    int xs[NT][4];               // the eight block sums as int16 pairs (q4_K, q5_K)
    float xd[NT];                // the group scale
};

// Lane (g, tig)'s part of super-block kc of rows row0 + 16mi + g (+ 8), the
// rows clamped to the matrix (rows past it are computed, never stored).
template <WType T, bool WIDE>
__device__ __forceinline__ void load_rows(const DevWeight& w, int64_t row0, int64_t kc, LaneRow<T, WIDE> (&rw)[2][2]) {
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int64_t row = min64(row0 + 16 * mi + g + 8 * h, w.rows - 1);
            rw[mi][h].load(w.data + row * w.row_stride + kc * w.block_stride, tig);
        }
}

// Super-block kc of the rows in rw ([slice][row g, row g + 8]) against
// tokens 0..NT-1 (those from n on repeat token n - 1: computed, never stored).
template <WType T, bool WIDE, int NT>
__device__ __forceinline__ void super_block(const LaneRow<T, WIDE> (&rw)[2][2], const DevAct& a, int n, int64_t kc,
                                            Part<NT>& part) {
    constexpr bool has_min = T != WType::Q6_K;
    constexpr int NN = NT / 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;

    for (int u = lane; u < NT * 8; u += 32) {
        const int t = u >> 3, j = u & 7;
        const int64_t ab = int64_t(min(t, n - 1)) * a.blocks + kc * 8 + j;
        if (has_min) reinterpret_cast<int16_t*>(part.xs[t])[j] = int16_t(a.sum[ab]);
        if (j == 0) part.xd[t] = a.d[ab];
    }

    int ia[2][NN][4];  // A per output: sum over the sub-blocks of scale * H
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int ni = 0; ni < NN; ++ni)
#pragma unroll
            for (int e = 0; e < 4; ++e) ia[mi][ni][e] = 0;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int b[NN][2];
#pragma unroll
        for (int ni = 0; ni < NN; ++ni) {
            const int8_t* xp = a.qs + (int64_t(min(8 * ni + g, n - 1)) * a.blocks + kc * 8 + j) * 32;
            b[ni][0] = *reinterpret_cast<const int*>(xp + 4 * tig);
            b[ni][1] = *reinterpret_cast<const int*>(xp + 16 + 4 * tig);
        }
#pragma unroll
        for (int mi = 0; mi < 2; ++mi) {
            const int af[4] = {rw[mi][0].vals(j, 0), rw[mi][1].vals(j, 0), rw[mi][0].vals(j, 1),
                               rw[mi][1].vals(j, 1)};
            const int sc[2][2] = {{rw[mi][0].scale(j, 0), rw[mi][0].scale(j, 1)},
                                  {rw[mi][1].scale(j, 0), rw[mi][1].scale(j, 1)}};  // [row g, g + 8][half]
#pragma unroll
            for (int ni = 0; ni < NN; ++ni) {
                int h0[4];
                if constexpr (T == WType::Q6_K) {
                    int h1[4];
                    mma_k16(h0, af[0], af[1], b[ni][0]);
                    mma_k16(h1, af[2], af[3], b[ni][1]);
#pragma unroll
                    for (int e = 0; e < 4; ++e) ia[mi][ni][e] += sc[e >> 1][0] * h0[e] + sc[e >> 1][1] * h1[e];
                } else {
                    mma_k32(h0, af, b[ni][0], b[ni][1]);
#pragma unroll
                    for (int e = 0; e < 4; ++e) ia[mi][ni][e] += sc[e >> 1][0] * h0[e];
                }
            }
        }
    }
    __syncwarp();  // the staged sums and scales are visible to every lane

    // The inner term per output: rows 16mi + g (+ 8), tokens 8ni + 2tig (+ 1).
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const LaneRow<T, WIDE>& r = rw[mi][h];
            const int row = 16 * mi + g + 8 * h;
            int2 mn = make_int2(0, 0);
            if constexpr (has_min) mn = r.hd.mins();
#pragma unroll
            for (int ni = 0; ni < NN; ++ni)
#pragma unroll
                for (int tk = 0; tk < 2; ++tk) {
                    const int t = 8 * ni + 2 * tig + tk, A = ia[mi][ni][2 * h + tk];
                    float inner;
                    if constexpr (has_min) {
                        const int4 xs = *reinterpret_cast<const int4*>(part.xs[t]);
                        int X = __dp2a_lo(xs.x, mn.x, 0);
                        X = __dp2a_hi(xs.y, mn.x, X);
                        X = __dp2a_lo(xs.z, mn.y, X);
                        X = __dp2a_hi(xs.w, mn.y, X);
                        inner = kquant_inner_min(r.hd.d(), r.hd.dmin(), A, X);
                    } else {
                        inner = kquant_inner_scale(r.d, A);
                    }
                    part.inner[t][row] = inner;
                }
        }
}

// A thread's outputs are o = threadIdx.x + i * kThreads: row o % 32, token
// o / 32. The chain step of a window: acc[i] = fma(scale(s, t), term(s, t,
// row), acc[i]) for its parts s < here, in super-block order.
template <int PT, int KW, class Scale, class Term>
__device__ __forceinline__ void chain_window(float (&acc)[PT], int here, Scale scale, Term term) {
#pragma unroll
    for (int i = 0; i < PT; ++i) {
        const int o = int(threadIdx.x) + i * kThreads, row = o % kRows, t = o / kRows;
#pragma unroll
        for (int s = 0; s < KW; ++s)
            if (s < here) acc[i] = __fmaf_rn(scale(s, t), term(s, t, row), acc[i]);
    }
}

template <int PT>
__device__ __forceinline__ void store_outputs(const float (&acc)[PT], int n, int64_t row0, int64_t rows, float* y,
                                              int64_t y_stride) {
#pragma unroll
    for (int i = 0; i < PT; ++i) {
        const int o = int(threadIdx.x) + i * kThreads, row = o % kRows, t = o / kRows;
        if (t < n && row0 + row < rows) y[int64_t(t) * y_stride + row0 + row] = acc[i];
    }
}

// Super-blocks a warp takes per window: two while the tokens are few (their
// weight loads in flight together: the wait on memory is the cost there),
// one where the accumulators need the registers.
template <int NT>
struct PerWarp {
    static constexpr int value = NT <= 16 ? 2 : 1;
};

// One CTA: rows blockIdx.x * 32.., every token. Per window of kWarps *
// PerWarp super-blocks, warp i loads super-blocks w0 + i (and w0 + kWarps +
// i) and computes them; then each thread chains its outputs' terms in
// super-block order.
template <WType T, bool WIDE, int NT>
__global__ void __launch_bounds__(kThreads) mmq_batch_kernel(DevWeight w, DevAct a, int n, float* __restrict__ y,
                                                             int64_t y_stride) {
    wait_for_prior_grids();  // no early launch of the next grid (launch.cuh)
    extern __shared__ __align__(16) unsigned char smem[];
    Part<NT>* parts = reinterpret_cast<Part<NT>*>(smem);  // one per super-block of a window
    constexpr int SB = PerWarp<NT>::value, kWindow = kWarps * SB;
    constexpr int per_thread = kRows * NT / kThreads;  // outputs: row o % 32, token o / 32
    const int warp = threadIdx.x >> 5;
    const int64_t row0 = int64_t(blockIdx.x) * kRows;
    const int64_t nsb = w.cols / 256;
    float acc[per_thread];
#pragma unroll
    for (int i = 0; i < per_thread; ++i) acc[i] = 0.0f;
    for (int64_t w0 = 0; w0 < nsb; w0 += kWindow) {
        LaneRow<T, WIDE> rw[SB][2][2];
#pragma unroll
        for (int s = 0; s < SB; ++s)
            if (w0 + s * kWarps + warp < nsb) load_rows(w, row0, w0 + s * kWarps + warp, rw[s]);  // uniform per warp
#pragma unroll
        for (int s = 0; s < SB; ++s)
            if (w0 + s * kWarps + warp < nsb)
                super_block<T, WIDE, NT>(rw[s], a, n, w0 + s * kWarps + warp, parts[s * kWarps + warp]);
        __syncthreads();
        chain_window<per_thread, kWindow>(
            acc, int(min64(kWindow, nsb - w0)), [&](int s, int t) { return parts[s].xd[t]; },
            [&](int s, int t, int row) { return parts[s].inner[t][row]; });
        __syncthreads();  // the parts are rewritten in the next window
    }
    store_outputs(acc, n, row0, w.rows, y, y_stride);
}

// ---- past 16 tokens: the tokens' blocks staged in shared memory --------------
//
// Past 16 tokens the loop above waits on memory again and again (the block
// sums a few at a time, then each sub-block's token fragments from L2) with
// every register taken by the accumulators. Here a warp issues its weight
// loads, then bulk copies of its super-block's token blocks and scales into
// its own shared buffer (a few copies a lane, counted by an mbarrier), and
// waits once: one round trip a window. It takes the tokens in passes of up to
// 32 (half the accumulators), the fragments by ldmatrix. The mins' term X =
// sum over j of mn_j * S_j needs no block sums: it is the tokens against a
// row whose sub-block j is mn_j throughout, one more int8 mma chained over the
// sub-blocks (exact integers, the same X). The inner terms of a pass are
// written over the token rows it has consumed, so the buffer is the part the
// CTA chains from; the chain and its order are unchanged.

// Sub-block jx of rows g and g + 8 (r0, r1) as lane (g, tig) feeds the
// tensor cores: the A fragment, the integer scales per 16-element half, and
// with kMins (q4_K / q5_K) the mins in every byte of a row, for the mins'
// term X as one more mma against the tokens (tile_mins). The streamed kernel
// leaves kMins off: it takes X from one f16 product a super-block instead.
template <WType T, bool WIDE, bool kMins = T != WType::Q6_K>
struct SubBlockRows {
    static_assert(!kMins || T != WType::Q6_K, "q6_K has no mins");
    int af[4];
    int sc[2][2];  // [row g, g + 8][half]
    int mf[4];
    __device__ __forceinline__ SubBlockRows(const LaneRow<T, WIDE>& r0, const LaneRow<T, WIDE>& r1, int jx)
        : af{r0.vals(jx, 0), r1.vals(jx, 0), r0.vals(jx, 1), r1.vals(jx, 1)} {
        if constexpr (T != WType::Q6_K) {
            sc[0][0] = sc[0][1] = r0.hd.scale(jx);
            sc[1][0] = sc[1][1] = r1.hd.scale(jx);
            if constexpr (kMins) {
                mf[0] = mf[2] = r0.hd.min_bytes(jx);  // row g: its min in every byte
                mf[1] = mf[3] = r1.hd.min_bytes(jx);  // row g + 8
            }
        } else {
            sc[0][0] = r0.scale(jx, 0), sc[0][1] = r0.scale(jx, 1);
            sc[1][0] = r1.scale(jx, 0), sc[1][1] = r1.scale(jx, 1);
        }
    }
    // One tile of 8 tokens (b0, b1: the sub-block's halves): A += scale * H
    // per output.
    __device__ __forceinline__ void tile_sums(int b0, int b1, int (&ia)[4]) const {
        int h0[4];
        if constexpr (T == WType::Q6_K) {
            int h1[4];
            mma_k16(h0, af[0], af[1], b0);
            mma_k16(h1, af[2], af[3], b1);
#pragma unroll
            for (int e = 0; e < 4; ++e) ia[e] += sc[e >> 1][0] * h0[e] + sc[e >> 1][1] * h1[e];
        } else {
            mma_k32(h0, af, b0, b1);
#pragma unroll
            for (int e = 0; e < 4; ++e) ia[e] += sc[e >> 1][0] * h0[e];
        }
    }
    // The same tile's X += the mins' products.
    __device__ __forceinline__ void tile_mins(int b0, int b1, int (&ix)[4]) const {
        static_assert(kMins, "the rows were decoded without their mins");
        mma_k32_acc(ix, mf, b0, b1);
    }
};

constexpr int kActRowBytes = 256 + 16;  // a token's super-block, padded: ldmatrix rows hit distinct banks

template <int NT>
struct Staged {
    // Token rows: the int8 blocks, then (after its pass) that token's 32
    // inner terms inner[row] at the start of its row.
    unsigned char act[NT][kActRowBytes];
    float d[NT][4];       // the group scale in [0] (a 16-byte copy)
    uint64_t full;        // mbarrier: this window's copies have landed
    uint64_t pad;         // each warp's buffer starts 16-byte aligned
    __device__ float* inner(int t) { return reinterpret_cast<float*>(act[t]); }
    __device__ const float* inner(int t) const { return reinterpret_cast<const float*>(act[t]); }
};
static_assert((kRows + 4) * sizeof(float) <= kActRowBytes, "a token's inner terms fit its row");
static_assert(sizeof(Staged<8>) % 16 == 0, "the bulk copies' destinations stay 16-byte aligned");

// The bulk copies, mbarriers and proxy fences are sm_90 instructions: builds
// for older GPUs compile the staged kernel empty, and the launcher never
// picks it there (sm90_code_runs_here).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

// Issue the copies of super-block kc of tokens 0..NT-1 (from n on, token
// n - 1); lane 0 first tells the barrier how many bytes to wait for.
template <int NT>
__device__ __forceinline__ void stage_tokens(const DevAct& a, int n, int64_t kc, Staged<NT>& st) {
    const int lane = threadIdx.x & 31;
    if (lane == 0) mbarrier_expect_bytes(&st.full, NT * (256 + 16));
    __syncwarp();
    for (int t = lane; t < NT; t += 32) {
        const int64_t b0 = int64_t(min(t, n - 1)) * a.blocks + kc * 8;
        bulk_copy(st.act[t], a.qs + b0 * 32, 256, &st.full);
        bulk_copy(st.d[t], a.d + b0, 16, &st.full);
    }
}

// Super-block kc of the rows in rw against the staged tokens (landed).
template <WType T, bool WIDE, int NT>
__device__ __forceinline__ void super_block_staged(const LaneRow<T, WIDE> (&rw)[2][2], Staged<NT>& st) {
    constexpr bool has_min = T != WType::Q6_K;
    constexpr int NN = NT / 8;
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    // ldmatrix: lanes 8m..8m+7 address row (lane & 7) of matrix m = bytes
    // 16m.. of sub-block j (m < 2) or j + 1 (m >= 2) of tokens 8q..8q+7.
    const int lrow = lane & 7, lcol = 16 * (lane >> 3);

#pragma unroll 1  // unrolled, the passes would keep every decoded weight word live
    for (int p = 0; p < (NN + 3) / 4; ++p) {
        int ia[2][4][4], ix[2][4][4];  // A and X per output
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int q = 0; q < 4; ++q)
#pragma unroll
                for (int e = 0; e < 4; ++e) ia[mi][q][e] = ix[mi][q][e] = 0;
#pragma unroll
        for (int j = 0; j < 8; j += 2) {
            int b[4][4];  // [q][sub-block j half 0, half 1, j + 1 half 0, half 1]
#pragma unroll
            for (int q = 0; q < 4; ++q)
                if (4 * p + q < NN) ldmatrix_x4(b[q], &st.act[8 * (4 * p + q) + lrow][32 * j + lcol]);
#pragma unroll
            for (int jj = 0; jj < 2; ++jj)
#pragma unroll
                for (int mi = 0; mi < 2; ++mi) {
                    const SubBlockRows<T, WIDE> sb(rw[mi][0], rw[mi][1], j + jj);
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        if (4 * p + q < NN) {
                            sb.tile_sums(b[q][2 * jj], b[q][2 * jj + 1], ia[mi][q]);
                            if constexpr (has_min) sb.tile_mins(b[q][2 * jj], b[q][2 * jj + 1], ix[mi][q]);
                        }
                }
        }
        __syncwarp();  // every lane is past its reads of this pass's token rows

        // The inner term per output, over the rows just consumed: rows 16mi +
        // g (+ 8), tokens 8(4p + q) + 2tig (+ 1).
#pragma unroll
        for (int mi = 0; mi < 2; ++mi)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int row = 16 * mi + g + 8 * h;
#pragma unroll
                for (int q = 0; q < 4; ++q) {
                    if (4 * p + q >= NN) continue;
#pragma unroll
                    for (int tk = 0; tk < 2; ++tk) {
                        const int t = 8 * (4 * p + q) + 2 * tig + tk, A = ia[mi][q][2 * h + tk];
                        float inner;
                        if constexpr (has_min)
                            inner = kquant_inner_min(rw[mi][h].hd.d(), rw[mi][h].hd.dmin(), A, ix[mi][q][2 * h + tk]);
                        else
                            inner = kquant_inner_scale(rw[mi][h].d, A);
                        st.inner(t)[row] = inner;
                    }
                }
            }
    }
}

#endif  // sm_90

// One CTA: rows blockIdx.x * 32.., every token; per window warp i stages and
// computes super-block w0 + i, then each thread chains its outputs' terms in
// super-block order (as mmq_batch_kernel).
template <WType T, bool WIDE, int NT>
__global__ void __launch_bounds__(kThreads) mmq_batch_staged_kernel(DevWeight w, DevAct a, int n,
                                                                    float* __restrict__ y, int64_t y_stride) {
    wait_for_prior_grids();  // no early launch of the next grid (launch.cuh)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    extern __shared__ __align__(16) unsigned char smem[];
    Staged<NT>* st = reinterpret_cast<Staged<NT>*>(smem);  // one per warp
    constexpr int per_thread = kRows * NT / kThreads;      // outputs: row o % 32, token o / 32
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row0 = int64_t(blockIdx.x) * kRows;
    const int64_t nsb = w.cols / 256;
    if (lane == 0) mbarrier_init(&st[warp].full);
    __syncwarp();
    float acc[per_thread];
#pragma unroll
    for (int i = 0; i < per_thread; ++i) acc[i] = 0.0f;
    for (int64_t w0 = 0; w0 < nsb; w0 += kWarps) {
        const int64_t kc = w0 + warp;
        if (kc < nsb) {  // uniform per warp
            LaneRow<T, WIDE> rw[2][2];
            load_rows(w, row0, kc, rw);
            stage_tokens<NT>(a, n, kc, st[warp]);
            mbarrier_wait(&st[warp].full, unsigned(w0 / kWarps) & 1);
            super_block_staged<T, WIDE, NT>(rw, st[warp]);
        }
        __syncthreads();
        chain_window<per_thread, kWarps>(
            acc, int(min64(kWarps, nsb - w0)), [&](int s, int t) { return st[s].d[t][0]; },
            [&](int s, int t, int row) { return st[s].inner(t)[row]; });
        // The buffers are restaged in the next window, by the async proxy.
        fence_shared_for_bulk_copies();
        __syncthreads();
    }
    store_outputs(acc, n, row0, w.rows, y, y_stride);
#endif
}

// ---- from 16 tokens: weights and tokens streamed through a pipeline --------
//
// The kernels above make every warp wait for its own loads, then compute,
// then meet the others at a barrier to chain the window's terms: a CTA's
// loads and its arithmetic never overlap, and at 64 tokens one CTA an SM fits.
// Here one producer thread streams super-block after super-block into a ring
// of shared-memory stages, each counted by an mbarrier: the row tile's blocks,
// the tokens' two 128-byte halves and their scales, four tensor copies (TMA)
// a stage, while the consumer warps compute on the stages that have landed
// and hand them back. (Copies of a row or a token each, some 160 a stage,
// queued behind one another: 3x slower than the kernels above.) A consumer
// warp owns 16 rows and a fixed share of the tokens for the whole matrix, so
// it chains each output's terms in super-block order in its own registers,
// r = fma(D, inner, r) from +0.0: the order of the kernels above, the same
// bits, with no shared-memory chain and no CTA-wide barrier. Rows past the
// matrix and tokens past n arrive as zeros: computed, never stored.

constexpr int kStreamSmem = 100 * 1024;  // stage ring per CTA: two CTAs an SM

template <WType T, bool WIDE, int NT>
struct Stream {
    static constexpr int kTiles = NT / 8;
    // Consumer warps per 16 rows: two, each owning half the token tiles. Each
    // warp decodes its rows' blocks itself, so more warps on the same rows
    // repeat that decode (four of two tiles each lost 12% at 64 tokens, LOG
    // g59), and one alone leaves too few warps to hide the latencies.
    static constexpr int kGroups = 2;
    static constexpr int kTilesPerWarp = (kTiles + kGroups - 1) / kGroups;
    static constexpr int kConsumers = 2 * kGroups;
    static constexpr int kThreads = 32 * (kConsumers + 1);  // and the producer
    static constexpr int kBlockBytes = ring_block_bytes(T);
    static constexpr bool kMins = T != WType::Q6_K;  // the split sums come with each stage
    using Ring = SuperBlockRing<kRows, kBlockBytes, NT, kStreamSmem, kMins>;
};

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900

// A consumer warp's super-block: rows 16mi.. of the stage against its token
// tiles th, th + kGroups; each output's term chained into acc.
template <WType T, bool WIDE, int NT>
__device__ __forceinline__ void stream_super_block(const unsigned char* st, int mi, int th,
                                                   float (&acc)[Stream<T, WIDE, NT>::kTilesPerWarp][4]) {
    using S = Stream<T, WIDE, NT>;
    using R = typename S::Ring;
    constexpr int QW = S::kTilesPerWarp;
    const int lane = threadIdx.x & 31, g = lane >> 2, tig = lane & 3;
    // ldmatrix: lanes 8m..8m+7 address token row (lane & 7) of matrix m,
    // bytes 16m.. of sub-blocks j, j + 1: chunk 2(j % 4) + m of half j / 4.
    const int lrow = lane & 7, lm = lane >> 3;
    const float* scale = reinterpret_cast<const float*>(st + R::kScaleOffset);

    LaneRow<T, WIDE> rw[2];  // rows 16mi + g, 16mi + g + 8
#pragma unroll
    for (int h = 0; h < 2; ++h) rw[h].load(st + R::kWeightOffset + (16 * mi + g + 8 * h) * S::kBlockBytes, tig);

    // Whether tile q of this warp exists: always where the warps split the
    // tiles evenly, and then known at compile time, so the sub-block's
    // decode is shared by the tiles instead of repeated under each test.
    auto has_tile = [th](int q) { return S::kGroups * QW == S::kTiles || th + S::kGroups * q < S::kTiles; };
    int ia[QW][4];    // A per output
    float fx[QW][4];  // X per output, from the f16 product below
#pragma unroll
    for (int q = 0; q < QW; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) ia[q][e] = 0, fx[q][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j += 2) {
        int b[QW][4];  // [tile][sub-block j half 0, half 1, j + 1 half 0, half 1]
        const int chunk = (2 * (j & 3) + lm) ^ lrow;
#pragma unroll
        for (int q = 0; q < QW; ++q)
            if (has_tile(q))
                ldmatrix_x4(b[q], st + (j >> 2) * R::kHalfBytes + (8 * (th + S::kGroups * q) + lrow) * 128 + 16 * chunk);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) {
            const SubBlockRows<T, WIDE, false> sb(rw[0], rw[1], j + jj);
#pragma unroll
            for (int q = 0; q < QW; ++q)
                if (has_tile(q)) sb.tile_sums(b[q][2 * jj], b[q][2 * jj + 1], ia[q]);
        }
    }
    // The mins' total X of every output at once: one f16 product a tile
    // against the tokens' split sums (K4Header::mins_f16). B: token 8 * tile
    // + g's halves 2tig.. (chunk 0) and 8 + 2tig.. (chunk 1), in the 32-byte
    // swizzle (chunk c of token t at c ^ (t / 4 % 2)).
    if constexpr (S::kMins) {
        const K4Header::MinsF16 m0 = rw[0].hd.mins_f16(tig), m1 = rw[1].hd.mins_f16(tig);
        const unsigned am[4] = {m0.scaled, m1.scaled, m0.plain, m1.plain};
#pragma unroll
        for (int q = 0; q < QW; ++q) {
            if (!has_tile(q)) continue;
            const int t = 8 * (th + S::kGroups * q) + g, flip = (t >> 2) & 1;
            const unsigned char* sums = st + R::kSumOffset + 32 * t + 4 * tig;
            mma_f16(fx[q], am, *reinterpret_cast<const unsigned*>(sums + 16 * flip),
                        *reinterpret_cast<const unsigned*>(sums + 16 * (1 - flip)));
        }
    }

    // The terms: rows 16mi + g (+ 8), tokens 8 * tile + 2tig (+ 1).
#pragma unroll
    for (int q = 0; q < QW; ++q) {
        if (!has_tile(q)) continue;
        const int tile = th + S::kGroups * q;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int h = e >> 1, t = 8 * tile + 2 * tig + (e & 1);
            float inner;
            if constexpr (S::kMins)
                inner = kquant_inner_min(rw[h].hd.d(), rw[h].hd.dmin(), ia[q][e], fx[q][e]);
            else
                inner = kquant_inner_scale(rw[h].d, ia[q][e]);
            acc[q][e] = __fmaf_rn(scale[8 * t], inner, acc[q][e]);
        }
    }
}

#endif  // sm_90

// One CTA: rows blockIdx.x * 32.., every token. The last warp produces, the
// others consume (Stream). The maps: weights (a row's bytes by rows), the
// tokens' int8 blocks (bytes by tokens), their scales (floats by tokens).
// Two CTAs an SM, as the ring is sized: said to the compiler too, which
// otherwise held some instances to 72 registers and spilled (a local store and
// load per super-block).
template <WType T, bool WIDE, int NT>
__global__ void __launch_bounds__(Stream<T, WIDE, NT>::kThreads, 2)
    mmq_batch_stream_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap qmap,
                            const __grid_constant__ CUtensorMap dmap, const __grid_constant__ CUtensorMap smap,
                            int64_t rows, int nsb, int n,
                            float* __restrict__ y, int64_t y_stride) {
    wait_for_prior_grids();  // no early launch of the next grid (launch.cuh)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
    using S = Stream<T, WIDE, NT>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const typename S::Ring ring(smem_raw);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int row0 = int(blockIdx.x) * kRows;
    if (threadIdx.x == 0) ring.init(S::kConsumers);
    __syncthreads();

    if (warp == S::kConsumers) {
        if (lane != 0) return;
        for (int kc = 0; kc < nsb; ++kc) ring.produce(kc, wmap, qmap, dmap, row0, 0, &smap);
        return;
    }

    const int mi = warp & 1, th = warp >> 1;
    float acc[S::kTilesPerWarp][4];
#pragma unroll
    for (int q = 0; q < S::kTilesPerWarp; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[q][e] = 0.0f;
    for (int kc = 0; kc < nsb; ++kc) {
        stream_super_block<T, WIDE, NT>(ring.wait_full(kc), mi, th, acc);
        ring.release(kc);
    }

    const int g = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int q = 0; q < S::kTilesPerWarp; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = 8 * (th + S::kGroups * q) + 2 * tig + (e & 1);
            const int64_t row = row0 + 16 * mi + g + 8 * (e >> 1);
            if (t < n && row < rows) y[int64_t(t) * y_stride + row] = acc[q][e];
        }
#endif
}

// Fewest tokens that take the streamed kernel. From 32 when it came (at 24
// it lost 3% to the staged kernel, LOG g43); since g59 it runs a 16-sequence
// step 22% faster than the kernel above, and a 24-sequence one as fast as the
// staged kernel (LOG g61). TERN_MMQB_STREAM_FROM=N moves it (16 at the least;
// 65: never), for A/B runs.
int stream_from() {
    static const int from = [] {
        const char* v = std::getenv("TERN_MMQB_STREAM_FROM");
        return v ? std::max(16, std::atoi(v)) : 16;
    }();
    return from;
}

// Token counts the streamed kernel runs as the next multiple of 16: its two
// warps of a row group split the 8-token tiles, and an odd count leaves
// each sub-block's decode under a test of the last tile, which cost more
// than a tile of zeros (a 7B step of 40 tokens took 9.4 ms, of 48 7.2 ms,
// LOG g76). TERN_MMQB_ODD_TILES=1 keeps the odd counts, for A/B runs.
bool odd_tiles_on() {
    static const bool on = switched_on("TERN_MMQB_ODD_TILES");
    return on;
}

// The streamed kernel, its maps encoded; false where the driver cannot
// describe them.
template <WType T, bool WIDE, int NT>
bool launch_stream(const DevWeight& w, const DevAct& a, int n, float* y, int64_t ys, cudaStream_t s) {
    using S = Stream<T, WIDE, NT>;
    RingMaps maps{};  // q6_K leaves the sums' map unused (no mins)
    if (S::kMins && !a.sum_split) return false;
    if (!encode_ring_maps(maps, w, kRows, a, n, NT, S::kMins)) return false;
    const unsigned grid = unsigned((w.rows + kRows - 1) / kRows);
    constexpr int smem = S::Ring::kSmem;
    cudaFuncSetAttribute(mmq_batch_stream_kernel<T, WIDE, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    launch_in_order(mmq_batch_stream_kernel<T, WIDE, NT>, grid, S::kThreads, smem, s, maps.w, maps.q, maps.d, maps.s,
                    w.rows, int(w.cols / 256), n, y, ys);
    return true;
}

// Token counts (rounded up to 8) that take the staged kernel: 24 and 32 (one
// pass) and 64 (two passes of four groups of 8). Where the second pass is
// short (40, 48, 56) the one-pass kernel measured as fast or faster (LOG g36).
constexpr bool staged_count(int nt) { return nt == 24 || nt == 32 || nt == 64; }

// The bulk copies need 16-byte aligned sources: the blocks and scales of each
// token's super-blocks (true of the backend's buffers, blocks = cols / 32).
bool staged_aligned(const DevAct& a) {
    return (reinterpret_cast<uintptr_t>(a.qs) | reinterpret_cast<uintptr_t>(a.d)) % 16 == 0 && a.blocks % 4 == 0;
}

template <WType T, bool WIDE, int NT>
void launch_for(const DevWeight& w, const DevAct& a, int n, float* y, int64_t ys, cudaStream_t s) {
    const unsigned grid = unsigned((w.rows + kRows - 1) / kRows);
    if constexpr ((T != WType::Q6_K || WIDE) && NT >= 16) {
        if (staged_aligned(a) && mmq_batch_streams(w, n)) {
            constexpr int kEven = (NT / 8) % 2 ? NT + 8 : NT;
            if (kEven != NT && !odd_tiles_on() ? launch_stream<T, WIDE, kEven>(w, a, n, y, ys, s)
                                               : launch_stream<T, WIDE, NT>(w, a, n, y, ys, s))
                return;
        }
    }
    // Past 48 KiB (32 tokens and more; the staged kernel from 24) the
    // kernels need the opt-in; cheap, and decode steps replay from CUDA
    // graphs. A failure fails the launch, which the caller's error check
    // reports.
    if constexpr (staged_count(NT)) {
        if (staged_aligned(a) && sm90_code_runs_here()) {
            const int smem = kWarps * int(sizeof(Staged<NT>));
            cudaFuncSetAttribute(mmq_batch_staged_kernel<T, WIDE, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 smem);
            launch(mmq_batch_staged_kernel<T, WIDE, NT>, grid, kThreads, smem, s, w, a, n, y, ys);
            return;
        }
    }
    const int smem = kWarps * PerWarp<NT>::value * int(sizeof(Part<NT>));
    cudaFuncSetAttribute(mmq_batch_kernel<T, WIDE, NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    launch(mmq_batch_kernel<T, WIDE, NT>, grid, kThreads, smem, s, w, a, n, y, ys);
}

}  // namespace

bool mmq_batch_type(WType t) { return t == WType::Q4_K || t == WType::Q5_K || t == WType::Q6_K; }

bool mmq_batch_streams(const DevWeight& w, int n) {
    if (!mmq_batch_type(w.type) || n < 1 || n > kMmqBatchMaxTokens) return false;
    return n >= stream_from() && w.block_stride == ring_block_bytes(w.type) && w.row_stride % 16 == 0 &&
           reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && sm90_code_runs_here() && tensor_map_encoder();
}

void mmq_batch(const DevWeight& w, const DevAct& a, int n, float* y, int64_t ys, cudaStream_t s) {
    if (n < 1 || n > kMmqBatchMaxTokens || w.rows < 1 || !mmq_batch_type(w.type)) return;
    dispatch_int_type(w.type, w.block_stride, [&](auto tag) {
        using Tag = decltype(tag);
        if constexpr (BlockInfo<Tag::type>::kquant) {
            switch ((n + 7) / 8) {
                case 1: launch_for<Tag::type, Tag::wide, 8>(w, a, n, y, ys, s); break;
                case 2: launch_for<Tag::type, Tag::wide, 16>(w, a, n, y, ys, s); break;
                case 3: launch_for<Tag::type, Tag::wide, 24>(w, a, n, y, ys, s); break;
                case 4: launch_for<Tag::type, Tag::wide, 32>(w, a, n, y, ys, s); break;
                case 5: launch_for<Tag::type, Tag::wide, 40>(w, a, n, y, ys, s); break;
                case 6: launch_for<Tag::type, Tag::wide, 48>(w, a, n, y, ys, s); break;
                case 7: launch_for<Tag::type, Tag::wide, 56>(w, a, n, y, ys, s); break;
                default: launch_for<Tag::type, Tag::wide, 64>(w, a, n, y, ys, s); break;
            }
        }
    });
}

}  // namespace tern::cuda
