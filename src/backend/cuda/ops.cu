// Element-wise, normalisation, rotary and KV-store kernels of the CUDA backend
// (ops.h). Each does its CPU twin's arithmetic in the same order; the float
// operations are written with __fmul_rn/__fadd_rn/__fdiv_rn so that nvcc cannot
// fuse a multiply into an add (it does by default) and fast-math flags cannot
// approximate them, which keeps most results bit-identical to the CPU's.
#include <cuda_fp16.h>

#include "backend/cuda/launch.cuh"
#include "backend/cuda/ops.h"
#include "backend/cuda/row_ops.cuh"

namespace tern::cuda {
namespace {

constexpr int kThreads = 256;  // threads per CTA of every kernel here (a power of two)
constexpr int64_t kMaxGridStrideBlocks = 32768;  // fills any current GPU many times over

// CTAs for a grid-stride loop over n > 0 items.
unsigned grid_for(int64_t n) {
    const int64_t blocks = (n + kThreads - 1) / kThreads;
    return unsigned(blocks < kMaxGridStrideBlocks ? blocks : kMaxGridStrideBlocks);
}

__device__ int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

// --- rms_norm: one CTA per row -------------------------------------------------

// A thread's elements are i = tid, tid + kThreads, ...; it takes them kBatch at a
// time, all loads first, so one memory latency covers a batch (a decode step's
// 4096-element row is a single batch) instead of one latency per element.
constexpr int kBatch = 16;

// v[k] = p[base + k * step] where that index is below n, else fill; every load
// is issued before any value is used.
__device__ __forceinline__ void load_batch(const float* p, int64_t base, int64_t step, int64_t n, float fill,
                                           float (&v)[kBatch]) {
#pragma unroll
    for (int k = 0; k < kBatch; ++k) {
        const int64_t i = base + int64_t(k) * step;
        v[k] = i < n ? p[i] : fill;
    }
}

// out = x / rms(x) * w, or with Add, out += that (a block's normalised output
// added to the residual stream: Gemma's post-norms), the bits of rms_norm then
// add. A row of up to one batch a thread (kBatch * kThreads = 4,096 elements:
// the hidden size of the 7-8B shapes and below) is loaded once and kept in
// registers through the sum, and its weights, never written during a step,
// are loaded before the wait, while the kernel before still runs. Longer rows
// read x again after the sum, as do rms_norm's rows under
// TERN_CUDA_NORM_HELD=0 (held 0, for A/B; add_rms_norm always holds its rows
// and has TERN_CUDA_ADD_NORM=0 instead).
constexpr int64_t kRowBatch = int64_t(kBatch) * kThreads;

template <bool Add>
__global__ void rms_norm_kernel(const float* x, const float* w, float eps, float* out, int64_t cols, int64_t held) {
    const bool one_batch = cols <= held;
    float g[kBatch];
    if (w && one_batch) load_batch(w, threadIdx.x, kThreads, cols, 1.0f, g);
    after_prior_grids();
    __shared__ double partial[kThreads / 32];
    const int64_t row = blockIdx.x;
    const float* xr = x + row * cols;
    float* o = out + row * cols;

    // The square of a float is exact in double, so a fused multiply-add here
    // rounds exactly as a multiply then an add would. Elements past the row
    // add +0.0, which leaves the sum unchanged: the order is the thread's
    // elements in turn, as it always was.
    float v[kBatch], r[kBatch];
    double ss = 0.0;
    for (int64_t base = threadIdx.x; base < cols; base += kRowBatch) {
        load_batch(xr, base, kThreads, cols, 0.0f, v);
        if (Add && one_batch) load_batch(o, base, kThreads, cols, 0.0f, r);
#pragma unroll
        for (int k = 0; k < kBatch; ++k) ss += double(v[k]) * double(v[k]);
    }
    // Fixed reduction tree (butterfly within each warp, then the warps in
    // order): the same sum bits on every run, with one barrier.
    for (int offset = 16; offset > 0; offset >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, offset);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = ss;
    __syncthreads();
    double total = partial[0];
    for (int i = 1; i < kThreads / 32; ++i) total += partial[i];
    const float inv = rms_inverse(total, cols, eps);

    // Every element is read before the barrier above (one batch) or by the
    // thread that rewrites it below, so out may alias x.
    for (int64_t base = threadIdx.x; base < cols; base += kRowBatch) {
        if (!one_batch) {
            load_batch(xr, base, kThreads, cols, 0.0f, v);
            if (w) load_batch(w, base, kThreads, cols, 1.0f, g);
            if (Add) load_batch(o, base, kThreads, cols, 0.0f, r);
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int64_t i = base + int64_t(k) * kThreads;
            const float n = w ? __fmul_rn(__fmul_rn(v[k], inv), g[k]) : __fmul_rn(v[k], inv);
            if (i < cols) o[i] = Add ? __fadd_rn(r[k], n) : n;
        }
    }
}

// --- rope: one CTA per row; the angles of the row are computed once ------------

__global__ void rope_kernel(float* x, const int32_t* pos, RopeArgs args) {
    after_prior_grids();
    extern __shared__ float trig[];  // cos of pair i at [i], its sin at [half + i]
    const int half = args.n_dims / 2;
    const int64_t row = blockIdx.x;

    rope_trig(args, pos[row], trig);
    __syncthreads();

    // kBatch elements per thread at a time, loads first (as in rms_norm).
    float* xr = x + row * int64_t(args.n_heads) * args.head_dim;
    const int n = args.n_heads * half;
    for (int base = threadIdx.x; base < n; base += kBatch * int(blockDim.x)) {
        float x0[kBatch], x1[kBatch];
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int e = base + k * int(blockDim.x);
            const int i = e % half;
            const float* v = xr + int64_t(e / half) * args.head_dim;
            x0[k] = e < n ? v[rope_first(args, i)] : 0.0f;
            x1[k] = e < n ? v[rope_second(args, i)] : 0.0f;
        }
#pragma unroll
        for (int k = 0; k < kBatch; ++k) {
            const int e = base + k * int(blockDim.x);
            if (e >= n) break;
            const int i = e % half;
            float* v = xr + int64_t(e / half) * args.head_dim;
            rope_rotate(x0[k], x1[k], trig[i], trig[half + i]);
            v[rope_first(args, i)] = x0[k];
            v[rope_second(args, i)] = x1[k];
        }
    }
}

// --- element-wise ----------------------------------------------------------------

__global__ void swiglu_kernel(float* gate, const float* up, int64_t n) {
    after_prior_grids();
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        gate[i] = silu_times(gate[i], up[i]);
    }
}

__global__ void geglu_kernel(float* gate, const float* up, int64_t n) {
    after_prior_grids();
    constexpr float kSqrt2OverPi = 0.7978845608028654f;
    for (int64_t i = first_index(); i < n; i += grid_stride()) {
        const float g = gate[i];
        const float inner = __fmul_rn(kSqrt2OverPi, __fadd_rn(g, __fmul_rn(__fmul_rn(__fmul_rn(0.044715f, g), g), g)));
        gate[i] = __fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, tanhf(inner))), up[i]);
    }
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
    after_prior_grids();
    for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = __fmul_rn(x[i], s);
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
    after_prior_grids();
    for (int64_t i = first_index(); i < n; i += grid_stride()) x[i] = __fadd_rn(x[i], y[i]);
}

__global__ void add_bias_kernel(float* y, const float* bias, int64_t rows, int64_t cols) {
    after_prior_grids();
    const int64_t n = rows * cols;
    for (int64_t i = first_index(); i < n; i += grid_stride()) y[i] = __fadd_rn(y[i], bias[i % cols]);
}

__global__ void gather_rows_kernel(const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out) {
    after_prior_grids();
    const int64_t total = n * cols;
    for (int64_t i = first_index(); i < total; i += grid_stride())
        out[i] = x[int64_t(rows[i / cols]) * cols + i % cols];
}

// --- kv_store: element e of the batch is element e % width of token e / width ---

__global__ void kv_store_kernel(KvLayer kv, const float* k, const float* v, int64_t n_tokens, const int32_t* slot,
                                const int32_t* pos) {
    after_prior_grids();
    const int64_t width = int64_t(kv.n_kv_heads) * kv.head_dim;
    const int64_t total = n_tokens * width;
    for (int64_t e = first_index(); e < total; e += grid_stride()) {
        const int64_t t = e / width;
        const int64_t row = kv_row(kv, slot[t], pos[t]);
        if (row < 0) continue;  // not a cache cell
        const int64_t at = row * width + e % width;
        // cvt.rn: IEEE round to nearest even, as fp32_to_fp16 (NaN payloads aside).
        kv.k[at] = __half_as_ushort(__float2half_rn(k[e]));
        kv.v[at] = __half_as_ushort(__float2half_rn(v[e]));
    }
}

// The longest row rms_norm keeps in registers: one batch a thread, or none
// under TERN_CUDA_NORM_HELD=0.
int64_t held_row_max() {
    static const int64_t held = switched_off("TERN_CUDA_NORM_HELD") ? 0 : kRowBatch;
    return held;
}

}  // namespace

void rms_norm(const float* x, const float* w, float eps, float* out, int64_t rows, int64_t cols,
              cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return;
    launch(rms_norm_kernel<false>, unsigned(rows), kThreads, 0, stream, x, w, eps, out, cols, held_row_max());
}

void add_rms_norm(float* x, const float* y, const float* w, float eps, int64_t rows, int64_t cols,
                  cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return;
    launch(rms_norm_kernel<true>, unsigned(rows), kThreads, 0, stream, y, w, eps, x, cols, kRowBatch);
}

void rope(float* x, int64_t rows, const int32_t* pos, const RopeArgs& args, cudaStream_t stream) {
    const int half = args.n_dims / 2;
    if (rows <= 0 || half <= 0 || args.n_heads <= 0) return;
    const size_t smem = 2 * size_t(half) * sizeof(float);
    launch(rope_kernel, unsigned(rows), kThreads, smem, stream, x, pos, args);
}

void swiglu(float* gate, const float* up, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    launch(swiglu_kernel, grid_for(n), kThreads, 0, stream, gate, up, n);
}

void geglu(float* gate, const float* up, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    launch(geglu_kernel, grid_for(n), kThreads, 0, stream, gate, up, n);
}

void scale(float* x, float s, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    launch(scale_kernel, grid_for(n), kThreads, 0, stream, x, s, n);
}

void add(float* x, const float* y, int64_t n, cudaStream_t stream) {
    if (n <= 0) return;
    launch(add_kernel, grid_for(n), kThreads, 0, stream, x, y, n);
}

void add_bias(float* y, const float* bias, int64_t rows, int64_t cols, cudaStream_t stream) {
    if (rows <= 0 || cols <= 0) return;
    launch(add_bias_kernel, grid_for(rows * cols), kThreads, 0, stream, y, bias, rows, cols);
}

void gather_rows(const float* x, int64_t cols, const int32_t* rows, int64_t n, float* out, cudaStream_t stream) {
    if (n <= 0 || cols <= 0) return;
    launch(gather_rows_kernel, grid_for(n * cols), kThreads, 0, stream, x, cols, rows, n, out);
}

void kv_store(const KvLayer& kv, const float* k, const float* v, int64_t n_tokens, const int32_t* slot,
              const int32_t* pos, cudaStream_t stream) {
    const int64_t width = int64_t(kv.n_kv_heads) * kv.head_dim;
    if (n_tokens <= 0 || width <= 0) return;
    launch(kv_store_kernel, grid_for(n_tokens * width), kThreads, 0, stream, kv, k, v, n_tokens, slot, pos);
}

}  // namespace tern::cuda
