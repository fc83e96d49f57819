// Float-weight matmul (F32, F16, BF16 files), its routed form for float
// experts, and the small weight helpers:
// which types have integer kernels and which activation grouping they read
// (quant::dot_grouped_type's), and the q6_K padding repack used at
// registration. (Block geometry is the GGUF type table's, gguf/tensor_type.h.)
// Float weights are rare in deployed models, so the matmul is a tiled f32
// kernel fed by cp.async and checked by tolerance; few-row matrices
// (mixture-of-experts routers, kept f32 in quantized files) at decode take
// four threads per output, fed through shared memory. Every kernel sums an
// output in one order (kChains, below), so a token's bits do not depend on
// the kernel or the batch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>
#include <utility>

#include "backend/cuda/block_decode.cuh"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "quant/dot.h"

namespace tern::cuda {

bool int_type(WType t) {
    switch (t) {
        case WType::Q4_0: case WType::Q4_1: case WType::Q5_0: case WType::Q5_1: case WType::Q8_0:
        case WType::Q4_K: case WType::Q5_K: case WType::Q6_K: return true;
        default: return false;
    }
}

int act_group(WType t) { return int_type(t) && quant::dot_grouped_type(TensorType(uint32_t(t))) ? 8 : 1; }

namespace {

template <WType T>
__device__ __forceinline__ float weight_at(const uint8_t* row, int64_t k) {
    if (T == WType::F32) return reinterpret_cast<const float*>(row)[k];
    if (T == WType::F16) return __half2float(reinterpret_cast<const __half*>(row)[k]);
    return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(row)[k]);
}

// Bytes a stored weight of a float type takes.
__host__ __device__ constexpr int weight_bytes(WType t) { return t == WType::F32 ? 4 : 2; }

// Weights k .. k + 3 of a row, k a multiple of 4 (one 16- or 8-byte load).
template <WType T>
__device__ __forceinline__ float4 weights4_at(const uint8_t* row, int64_t k) {
    if (T == WType::F32) return reinterpret_cast<const float4*>(row)[k / 4];
    const uint2 u = reinterpret_cast<const uint2*>(row)[k / 4];
    if (T == WType::F16) {
        const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
        const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
        return make_float4(a.x, a.y, b.x, b.y);
    }
    const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.x));
    const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

// The order of every output's sum: column k joins chain (k / 4) % kChains, each
// chain an fma chain in column order from zero, and the output is
// (c0 + c1) + (c2 + c3). Four chains cut the dependent fmas of a row to a
// quarter, which bounds the few-row kernel at decode (LOG g44); chains of
// whole groups of four columns let one thread load its chain's columns as
// one vector.
constexpr int kChains = 4;
__device__ __forceinline__ float chains_total(const float (&c)[kChains]) {
    return __fadd_rn(__fadd_rn(c[0], c[1]), __fadd_rn(c[2], c[3]));
}

constexpr int kTile = 64, kDepth = 16;  // kDepth: kChains groups of four columns
// Up to this many rows and tokens: the few-row kernel (matmul_float_rows_kernel).
// A 512-token batch was slower that way than tiled (a Qwen3-30B-A3B prefill
// lost a fifth, docs/perf/LOG.md g30), so prefill keeps the tiles.
constexpr int64_t kFewRows = 256, kFewTokens = kMmvqMaxTokens;

// The staged kernels copy rows and tokens in 16-byte pieces.
bool pieces_fit(const DevWeight& w, const float* x) {
    return w.cols % 8 == 0 && w.row_stride % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

// Many tokens, 16-byte pieces: tiles of TR rows x 64 tokens, kStageCols
// columns a stage copied by cp.async into a ring of kTileStages stages, so
// the loads of the next stages overlap this one's fmas. 256 threads in a
// 16 x 16 grid, each TR / 16 rows x 4 tokens (tokens tt + 16 j: a warp's
// reads of the token rows fall on distinct banks), reading four columns (a
// chain's group) as one vector. TR = 16 where 64-row tiles would leave the
// GPU idle: a mixture of experts' 128-row router over a 512-token prompt
// took 285 us a layer on 16 CTAs of the plain tiled kernel (LOG g44).
constexpr int kStageCols = 32, kTileStages = 3, kTileTokens = 64, kTileThreads = 256;

__host__ __device__ constexpr int staged_wpitch(int es) { return kStageCols * es + 16; }
constexpr int kStagedXPitch = kStageCols * 4 + 16;
constexpr size_t staged_smem(int tile_rows, int es) {
    return size_t(kTileStages) * size_t(tile_rows * staged_wpitch(es) + kTileTokens * kStagedXPitch);
}

template <WType T, int TR>
__global__ void __launch_bounds__(kTileThreads) matmul_float_staged_kernel(DevWeight w, const float* __restrict__ x,
                                                                          int64_t n_tokens, float* __restrict__ y) {
    after_prior_grids();
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int es = weight_bytes(T);
    constexpr int wpitch = staged_wpitch(es), rows_per_thread = TR / 16;
    constexpr int stage_bytes = TR * wpitch + kTileTokens * kStagedXPitch;
    const int tid = threadIdx.x, tr = tid / 16, tt = tid % 16;
    const int64_t row0 = int64_t(blockIdx.x) * TR, tok0 = int64_t(blockIdx.y) * kTileTokens;
    const int64_t nsteps = (w.cols + kStageCols - 1) / kStageCols;

    // Stage c's pieces; those past the matrix or the tokens are zeros (src size 0).
    auto issue = [&](int64_t c) {
        uint8_t* st = smem + (c % kTileStages) * stage_bytes;
        const int64_t k0 = c * kStageCols;
        constexpr int w_pieces = kStageCols * es / 16, x_pieces = kStageCols * 4 / 16;
        for (int u = tid; u < TR * w_pieces; u += kTileThreads) {
            const int i = u / w_pieces, q = u % w_pieces;
            const bool in = row0 + i < w.rows && (k0 * es + q * 16) < w.cols * es;
            cp_async16(st + i * wpitch + q * 16, in ? w.data + (row0 + i) * w.row_stride + k0 * es + q * 16 : w.data,
                       in ? 16 : 0);
        }
        for (int u = tid; u < kTileTokens * x_pieces; u += kTileThreads) {
            const int i = u / x_pieces, q = u % x_pieces;
            const bool in = tok0 + i < n_tokens && k0 + q * 4 < w.cols;
            cp_async16(st + TR * wpitch + i * kStagedXPitch + q * 16, in ? x + (tok0 + i) * w.cols + k0 + q * 4 : x,
                       in ? 16 : 0);
        }
    };
    for (int64_t c = 0; c < kTileStages - 1; ++c) {
        if (c < nsteps) issue(c);
        cp_async_commit();
    }
    float acc[kChains][rows_per_thread][4] = {};
    for (int64_t c = 0; c < nsteps; ++c) {
        if (c + kTileStages - 1 < nsteps) issue(c + kTileStages - 1);  // into the stage computed at c - 1
        cp_async_commit();
        cp_async_wait<kTileStages - 1>();
        __syncthreads();
        const uint8_t* st = smem + (c % kTileStages) * stage_bytes;
        const int64_t groups = min64(kStageCols, w.cols - c * kStageCols) / 4;  // cols is a multiple of 8
        // The stage starts at a multiple of kChains groups: group g is in chain g % kChains.
        // Groups past the matrix are skipped, not added as zeros: fma(0, 0, -0)
        // is +0, and the other kernels never see those columns.
#pragma unroll
        for (int g = 0; g < kStageCols / 4; ++g) {
            if (g >= groups) break;
            float4 wv[rows_per_thread], xv[4];
#pragma unroll
            for (int i = 0; i < rows_per_thread; ++i)
                wv[i] = weights4_at<T>(st + (tr * rows_per_thread + i) * wpitch, 4 * g);
#pragma unroll
            for (int j = 0; j < 4; ++j)
                xv[j] = *reinterpret_cast<const float4*>(st + TR * wpitch + (tt + 16 * j) * kStagedXPitch + 16 * g);
#pragma unroll
            for (int i = 0; i < rows_per_thread; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    float a = acc[g % kChains][i][j];
                    a = fmaf(wv[i].x, xv[j].x, a);
                    a = fmaf(wv[i].y, xv[j].y, a);
                    a = fmaf(wv[i].z, xv[j].z, a);
                    a = fmaf(wv[i].w, xv[j].w, a);
                    acc[g % kChains][i][j] = a;
                }
        }
        __syncthreads();  // the stage is refilled at c + 1
    }
#pragma unroll
    for (int i = 0; i < rows_per_thread; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t row = row0 + tr * rows_per_thread + i, tok = tok0 + tt + 16 * j;
            const float c[kChains] = {acc[0][i][j], acc[1][i][j], acc[2][i][j], acc[3][i][j]};
            if (row < w.rows && tok < n_tokens) y[tok * w.rows + row] = chains_total(c);
        }
}

// Any shape (rows or tokens not in 16-byte pieces): a plain tiled kernel,
// 256 threads, each a 4 x 4 block of (row, token) outputs of a 64 x 64 tile.
template <WType T>
__global__ void __launch_bounds__(256) matmul_float_kernel(DevWeight w, const float* __restrict__ x,
                                                           int64_t n_tokens, float* __restrict__ y) {
    after_prior_grids();
    __shared__ float ws[kDepth][kTile + 1];
    __shared__ float xs[kDepth][kTile + 1];
    const int tid = threadIdx.x, tr = tid / 16, tt = tid % 16;
    const int64_t row0 = int64_t(blockIdx.x) * kTile, tok0 = int64_t(blockIdx.y) * kTile;
    float acc[kChains][4][4] = {};  // k0 is a multiple of kDepth: column k0 + kk is in chain kk / 4
    for (int64_t k0 = 0; k0 < w.cols; k0 += kDepth) {
        for (int u = tid; u < kTile * kDepth; u += 256) {
            const int i = u / kDepth, kk = u % kDepth;
            const int64_t k = k0 + kk, row = row0 + i, tok = tok0 + i;
            ws[kk][i] = (row < w.rows && k < w.cols) ? weight_at<T>(w.data + row * w.row_stride, k) : 0.0f;
            xs[kk][i] = (tok < n_tokens && k < w.cols) ? x[tok * w.cols + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < kDepth; ++kk) {
            if (k0 + kk >= w.cols) break;  // not zeros added: see the staged kernel
            float wv[4], xv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wv[i] = ws[kk][tr * 4 + i];
                xv[i] = xs[kk][tt * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[kk / 4][i][j] = fmaf(wv[i], xv[j], acc[kk / 4][i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t row = row0 + tr * 4 + i, tok = tok0 + tt * 4 + j;
            const float c[kChains] = {acc[0][i][j], acc[1][i][j], acc[2][i][j], acc[3][i][j]};
            if (row < w.rows && tok < n_tokens) y[tok * w.rows + row] = chains_total(c);
        }
}

// Few rows and tokens (a mixture of experts' router at decode): a CTA of
// kRowsPerCta rows and up to kFewTokens tokens, four threads per output, one
// per chain, each loading its chain's groups of four columns as one vector.
// Rows and tokens stream through shared memory in chunks of kRowsChunk
// columns by cp.async, every chunk of a 2,048-column router in flight at
// once; the four chains are added by shuffles in chains_total's order. (A
// thread per output reading its own row from global memory waited on every
// load: 184 us for 128 x 2048 on an H200; one fma chain per output fed in
// chunks of 128 columns, 21 us: docs/perf/LOG.md g31, g44.)
constexpr int kRowsPerCta = 2, kRowsChunk = 512, kRowsStages = 4;
constexpr int kRowsThreads = kRowsPerCta * int(kFewTokens) * kChains;
static_assert(kRowsThreads % 32 == 0, "the chains are added by shuffles over whole warps");

// Padded: the rows start on distinct banks.
__host__ __device__ constexpr int rows_wpitch(int es) { return kRowsChunk * es + 16; }
constexpr int kRowsXPitch = kRowsChunk * 4 + 16;
size_t rows_kernel_smem(int es, int64_t n_tokens) {
    return size_t(kRowsStages) * size_t(kRowsPerCta * rows_wpitch(es) + n_tokens * kRowsXPitch);
}

template <WType T>
__global__ void __launch_bounds__(kRowsThreads) matmul_float_rows_kernel(DevWeight w, const float* __restrict__ x,
                                                                        int64_t n_tokens, float* __restrict__ y) {
    after_prior_grids();
    extern __shared__ __align__(16) uint8_t smem[];
    constexpr int es = weight_bytes(T);
    constexpr int wpitch = rows_wpitch(es);
    const int stage_bytes = kRowsPerCta * wpitch + int(n_tokens) * kRowsXPitch;
    const int tid = threadIdx.x, chain = tid % kChains, t = tid / kChains % int(kFewTokens),
              r = tid / (kChains * int(kFewTokens));
    const int64_t row0 = int64_t(blockIdx.x) * kRowsPerCta;
    const int64_t nchunks = (w.cols + kRowsChunk - 1) / kRowsChunk;

    // Chunk c into stage c % kRowsStages: the pieces inside the matrix.
    auto issue = [&](int64_t c) {
        uint8_t* st = smem + (c % kRowsStages) * stage_bytes;
        const int64_t k0 = c * kRowsChunk, len = min64(kRowsChunk, w.cols - k0);
        constexpr int w_pieces = kRowsChunk * es / 16, x_pieces = kRowsChunk * 4 / 16;
        for (int u = tid; u < kRowsPerCta * w_pieces; u += kRowsThreads) {
            const int i = u / w_pieces, q = u % w_pieces;
            if (row0 + i < w.rows && q * 16 < len * es)
                cp_async16(st + i * wpitch + q * 16, w.data + (row0 + i) * w.row_stride + k0 * es + q * 16);
        }
        for (int u = tid; u < int(n_tokens) * x_pieces; u += kRowsThreads) {
            const int i = u / x_pieces, q = u % x_pieces;
            if (q * 16 < len * 4)
                cp_async16(st + kRowsPerCta * wpitch + i * kRowsXPitch + q * 16, x + i * w.cols + k0 + q * 4);
        }
    };
    for (int64_t c = 0; c < kRowsStages - 1; ++c) {
        if (c < nchunks) issue(c);
        cp_async_commit();  // empty groups too: the wait below counts every iteration's group
    }
    const bool mine = t < n_tokens && row0 + r < w.rows;
    float acc = 0.0f;  // chain `chain` of output (row0 + r, t)
    for (int64_t c = 0; c < nchunks; ++c) {
        if (c + kRowsStages - 1 < nchunks) issue(c + kRowsStages - 1);  // into the stage computed at c - 1
        cp_async_commit();
        cp_async_wait<kRowsStages - 1>();  // chunk c has landed
        __syncthreads();
        const uint8_t* st = smem + (c % kRowsStages) * stage_bytes;
        const uint8_t* wr = st + r * wpitch;
        const float* xr = reinterpret_cast<const float*>(st + kRowsPerCta * wpitch + t * kRowsXPitch);
        const int len = int(min64(kRowsChunk, w.cols - c * kRowsChunk));  // a multiple of 8
        if (mine) {
            // The chunk starts at a multiple of kChains * 4 columns, so this
            // thread's chain holds its columns 4 chain + 16 j .. + 3.
#pragma unroll 8
            for (int k = 4 * chain; k < len; k += 4 * kChains) {
                const float4 wv = weights4_at<T>(wr, k), xv = *reinterpret_cast<const float4*>(xr + k);
                acc = fmaf(wv.x, xv.x, acc);
                acc = fmaf(wv.y, xv.y, acc);
                acc = fmaf(wv.z, xv.z, acc);
                acc = fmaf(wv.w, xv.w, acc);
            }
        }
        __syncthreads();  // the stage is refilled at c + 1
    }
    // (c0 + c1) + (c2 + c3): the four chains are neighbouring lanes.
    constexpr unsigned kAll = 0xffffffffu;
    const float pair = __fadd_rn(acc, __shfl_down_sync(kAll, acc, 1));     // chains 0 + 1 and 2 + 3
    const float total = __fadd_rn(pair, __shfl_down_sync(kAll, pair, 2));  // at chain 0
    if (mine && chain == 0) y[t * w.rows + row0 + r] = total;
}

// A thread per (output row, routed row), summing in matmul_float's order.
template <WType T>
__global__ void float_experts_kernel(const uint8_t* const* __restrict__ experts, DevWeight w,
                                     const float* __restrict__ x, const int32_t* __restrict__ ids,
                                     int64_t n_pairs, int per, float* __restrict__ y) {
    after_prior_grids();
    const int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (r >= w.rows) return;
    for (int64_t p = blockIdx.y; p < n_pairs; p += gridDim.y) {
        const uint8_t* row = experts[ids[p]] + r * w.row_stride;
        const float* xr = x + (p / per) * w.cols;
        float acc[kChains] = {};
        for (int64_t k0 = 0; k0 < w.cols; k0 += kDepth)
#pragma unroll
            for (int kk = 0; kk < kDepth; ++kk)
                if (k0 + kk < w.cols) acc[kk / 4] = fmaf(weight_at<T>(row, k0 + kk), xr[k0 + kk], acc[kk / 4]);
        y[p * w.rows + r] = chains_total(acc);
    }
}

__global__ void pad_q6_K_kernel(const uint8_t* __restrict__ raw, uint8_t* __restrict__ padded, int64_t n) {
    after_prior_grids();
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= n * 224) return;
    const int64_t b = i / 224;
    const int o = int(i % 224);
    padded[i] = o < 210 ? raw[b * 210 + o] : 0;
}

// f(tag) with tag::value the float type t (nothing for other types).
template <class F>
void dispatch_float_type(WType t, F&& f) {
    switch (t) {
        case WType::F32: f(std::integral_constant<WType, WType::F32>{}); break;
        case WType::F16: f(std::integral_constant<WType, WType::F16>{}); break;
        case WType::BF16: f(std::integral_constant<WType, WType::BF16>{}); break;
        default: break;
    }
}

// A kernel of dynamic shared memory, allowed past the default 48 KiB where it asks for more.
template <class Kernel, class... Args>
void launch_with_smem(Kernel kernel, dim3 grid, int threads, size_t smem, cudaStream_t s, Args&&... args) {
    if (smem > 48 * 1024) cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
    launch(kernel, grid, threads, smem, s, std::forward<Args>(args)...);
}

}  // namespace

void matmul_float(const DevWeight& w, const float* x, int64_t n, float* y, cudaStream_t s) {
    if (n < 1 || w.rows < 1) return;
    dispatch_float_type(w.type, [&](auto tag) {
        constexpr WType T = decltype(tag)::value;
        if (w.rows <= kFewRows && n <= kFewTokens && pieces_fit(w, x)) {
            const dim3 grid(unsigned((w.rows + kRowsPerCta - 1) / kRowsPerCta));
            launch_with_smem(matmul_float_rows_kernel<T>, grid, kRowsThreads, rows_kernel_smem(weight_bytes(T), n), s,
                             w, x, n, y);
        } else if (pieces_fit(w, x)) {
            const int64_t token_tiles = (n + kTileTokens - 1) / kTileTokens;
            // 64-row tiles where there are enough of them to fill the GPU, else 16.
            const bool wide = (w.rows + 63) / 64 * token_tiles >= 2 * current_sm_count();
            const int tile_rows = wide ? 64 : 16;
            const dim3 grid(unsigned((w.rows + tile_rows - 1) / tile_rows), unsigned(token_tiles));
            launch_with_smem(wide ? matmul_float_staged_kernel<T, 64> : matmul_float_staged_kernel<T, 16>, grid,
                             kTileThreads, staged_smem(tile_rows, weight_bytes(T)), s, w, x, n, y);
        } else {
            const dim3 grid(unsigned((w.rows + kTile - 1) / kTile), unsigned((n + kTile - 1) / kTile));
            launch(matmul_float_kernel<T>, grid, 256, 0, s, w, x, n, y);
        }
    });
}

void matmul_float_experts(const uint8_t* const* experts, const DevWeight& w, const float* x, const int32_t* ids,
                          int64_t n_pairs, int per, float* y, cudaStream_t s) {
    if (n_pairs < 1 || w.rows < 1) return;
    const dim3 grid(unsigned((w.rows + 127) / 128), unsigned(n_pairs < 65535 ? n_pairs : 65535));
    dispatch_float_type(w.type, [&](auto tag) {
        launch(float_experts_kernel<decltype(tag)::value>, grid, 128, 0, s, experts, w, x, ids, n_pairs, per, y);
    });
}

void pad_q6_K(const uint8_t* raw, uint8_t* padded, int64_t n, cudaStream_t s) {
    if (n < 1) return;
    const int64_t total = n * 224;
    launch(pad_q6_K_kernel, unsigned((total + 255) / 256), 256, 0, s, raw, padded, n);
}

}  // namespace tern::cuda
