// Float-weight matmul (F32, F16, BF16 files), its routed form for float
// experts, and the small weight helpers:
// which types have integer kernels and which activation grouping they read
// (quant::dot_grouped_type's), and the q6_K padding repack used at
// registration. (Block geometry is the GGUF type table's, gguf/tensor_type.h.) Float weights are rare in deployed models, so
// the matmul is a plain shared-memory tiled f32 kernel checked by tolerance;
// few-row matrices (mixture-of-experts routers, kept f32 in quantized files)
// at decode take a thread per output, fed through shared memory. Both sum each output as one fma chain in
// column order, so a token's bits do not depend on the kernel or the batch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

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

constexpr int kTile = 64, kDepth = 16;
// Up to this many rows and tokens: a thread per output (matmul_float_rows_kernel).
// A 512-token batch was slower that way than tiled (a Qwen3-30B-A3B prefill
// lost a fifth, docs/perf/LOG.md), so prefill keeps the tiles.
constexpr int64_t kFewRows = 256, kFewTokens = kMmvqMaxTokens;

// 256 threads, each a 4 x 4 block of (row, token) outputs of a 64 x 64 tile.
template <WType T>
__global__ void __launch_bounds__(256) matmul_float_kernel(DevWeight w, const float* __restrict__ x,
                                                           int64_t n_tokens, float* __restrict__ y) {
    after_prior_grids();
    __shared__ float ws[kDepth][kTile + 1];
    __shared__ float xs[kDepth][kTile + 1];
    const int tid = threadIdx.x, tr = tid / 16, tt = tid % 16;
    const int64_t row0 = int64_t(blockIdx.x) * kTile, tok0 = int64_t(blockIdx.y) * kTile;
    float acc[4][4] = {};
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
            float wv[4], xv[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                wv[i] = ws[kk][tr * 4 + i];
                xv[i] = xs[kk][tt * 4 + i];
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(wv[i], xv[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int64_t row = row0 + tr * 4 + i, tok = tok0 + tt * 4 + j;
            if (row < w.rows && tok < n_tokens) y[tok * w.rows + row] = acc[i][j];
        }
}

// Few rows and tokens (a mixture of experts' router at decode): a CTA of
// kRowsPerCta rows and up to kFewTokens tokens, a thread per output running
// the fma chain over the columns in order, the tiled kernel's chain (so the
// same bits, whichever kernel a shape gets). Rows and tokens stream through
// shared memory in chunks of kRowsChunk columns by cp.async, kRowsStages - 1
// chunks in flight, so the loads are coalesced and overlap the chains. (A
// thread per output reading its own row from global memory waited on every
// load: 184 us for 128 x 2048 on an H200, docs/perf/LOG.md g31.)
constexpr int kRowsPerCta = 8, kRowsChunk = 128, kRowsStages = 4;

// The staged kernel copies rows and tokens in 16-byte pieces.
bool rows_kernel_fits(const DevWeight& w, const float* x) {
    return w.cols % 8 == 0 && w.row_stride % 16 == 0 && reinterpret_cast<uintptr_t>(w.data) % 16 == 0 &&
           reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

template <WType T>
__global__ void __launch_bounds__(kRowsPerCta * kFewTokens) matmul_float_rows_kernel(DevWeight w,
                                                                                     const float* __restrict__ x,
                                                                                     int64_t n_tokens,
                                                                                     float* __restrict__ y) {
    after_prior_grids();
    constexpr int es = T == WType::F32 ? 4 : 2;  // bytes per weight
    constexpr int wpitch = kRowsChunk * es + 16, xpitch = kRowsChunk * 4 + 16;  // padded: distinct banks per row
    constexpr int stage_bytes = kRowsPerCta * wpitch + kFewTokens * xpitch;
    __shared__ __align__(16) uint8_t smem[kRowsStages * stage_bytes];
    const int tid = threadIdx.x, r = tid % kRowsPerCta, t = tid / kRowsPerCta;
    const int64_t row0 = int64_t(blockIdx.x) * kRowsPerCta;
    const int64_t nchunks = (w.cols + kRowsChunk - 1) / kRowsChunk;

    // Chunk c into stage c % kRowsStages: the pieces inside the matrix.
    auto issue = [&](int64_t c) {
        uint8_t* st = smem + (c % kRowsStages) * stage_bytes;
        const int64_t k0 = c * kRowsChunk, len = min64(kRowsChunk, w.cols - k0);
        constexpr int w_pieces = kRowsChunk * es / 16, x_pieces = kRowsChunk * 4 / 16;
        for (int u = tid; u < kRowsPerCta * w_pieces; u += int(blockDim.x)) {
            const int i = u / w_pieces, q = u % w_pieces;
            if (row0 + i < w.rows && q * 16 < len * es)
                cp_async16(st + i * wpitch + q * 16, w.data + (row0 + i) * w.row_stride + k0 * es + q * 16);
        }
        for (int u = tid; u < kFewTokens * x_pieces; u += int(blockDim.x)) {
            const int i = u / x_pieces, q = u % x_pieces;
            if (i < n_tokens && q * 16 < len * 4)
                cp_async16(st + kRowsPerCta * wpitch + i * xpitch + q * 16, x + i * w.cols + k0 + q * 4);
        }
    };
    for (int64_t c = 0; c < kRowsStages - 1; ++c) {
        if (c < nchunks) issue(c);
        cp_async_commit();  // empty groups too: the wait below counts every iteration's group
    }
    const bool mine = t < n_tokens && row0 + r < w.rows;
    float acc = 0.0f;
    for (int64_t c = 0; c < nchunks; ++c) {
        if (c + kRowsStages - 1 < nchunks) issue(c + kRowsStages - 1);  // into the stage computed at c - 1
        cp_async_commit();
        cp_async_wait<kRowsStages - 1>();  // chunk c has landed
        __syncthreads();
        const uint8_t* st = smem + (c % kRowsStages) * stage_bytes;
        const uint8_t* wr = st + r * wpitch;
        const float* xr = reinterpret_cast<const float*>(st + kRowsPerCta * wpitch + t * xpitch);
        const int len = int(min64(kRowsChunk, w.cols - c * kRowsChunk));
        if (mine) {
#pragma unroll 8
            for (int k = 0; k < len; ++k) acc = fmaf(weight_at<T>(wr, k), xr[k], acc);
        }
        __syncthreads();  // the stage is refilled at c + 1
    }
    if (mine) y[t * w.rows + row0 + r] = acc;
}

// A thread per (output row, routed row): one fma chain over the columns in
// order, the arithmetic of matmul_float's every output.
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
        float acc = 0.0f;
        for (int64_t c = 0; c < w.cols; ++c) acc = fmaf(weight_at<T>(row, c), xr[c], acc);
        y[p * w.rows + r] = acc;
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

}  // namespace

void matmul_float(const DevWeight& w, const float* x, int64_t n, float* y, cudaStream_t s) {
    if (n < 1 || w.rows < 1) return;
    if (w.rows <= kFewRows && n <= kFewTokens && rows_kernel_fits(w, x)) {
        const unsigned blocks = unsigned((w.rows + kRowsPerCta - 1) / kRowsPerCta);
        constexpr int threads = kRowsPerCta * kFewTokens;
        switch (w.type) {
            case WType::F32: launch(matmul_float_rows_kernel<WType::F32>, blocks, threads, 0, s, w, x, n, y); break;
            case WType::F16: launch(matmul_float_rows_kernel<WType::F16>, blocks, threads, 0, s, w, x, n, y); break;
            case WType::BF16: launch(matmul_float_rows_kernel<WType::BF16>, blocks, threads, 0, s, w, x, n, y); break;
            default: break;
        }
        return;
    }
    const dim3 grid(unsigned((w.rows + kTile - 1) / kTile), unsigned((n + kTile - 1) / kTile));
    switch (w.type) {
        case WType::F32: launch(matmul_float_kernel<WType::F32>, grid, 256, 0, s, w, x, n, y); break;
        case WType::F16: launch(matmul_float_kernel<WType::F16>, grid, 256, 0, s, w, x, n, y); break;
        case WType::BF16: launch(matmul_float_kernel<WType::BF16>, grid, 256, 0, s, w, x, n, y); break;
        default: break;
    }
}

void matmul_float_experts(const uint8_t* const* experts, const DevWeight& w, const float* x, const int32_t* ids,
                          int64_t n_pairs, int per, float* y, cudaStream_t s) {
    if (n_pairs < 1 || w.rows < 1) return;
    const dim3 grid(unsigned((w.rows + 127) / 128), unsigned(n_pairs < 65535 ? n_pairs : 65535));
    switch (w.type) {
        case WType::F32:
            launch(float_experts_kernel<WType::F32>, grid, 128, 0, s, experts, w, x, ids, n_pairs, per, y);
            break;
        case WType::F16:
            launch(float_experts_kernel<WType::F16>, grid, 128, 0, s, experts, w, x, ids, n_pairs, per, y);
            break;
        case WType::BF16:
            launch(float_experts_kernel<WType::BF16>, grid, 128, 0, s, experts, w, x, ids, n_pairs, per, y);
            break;
        default: break;
    }
}

void pad_q6_K(const uint8_t* raw, uint8_t* padded, int64_t n, cudaStream_t s) {
    if (n < 1) return;
    const int64_t total = n * 224;
    launch(pad_q6_K_kernel, unsigned((total + 255) / 256), 256, 0, s, raw, padded, n);
}

}  // namespace tern::cuda
