// Dot products of one weight row (GGUF blocks, as stored in the file) with
// activations: integer dot products against block_q8a activations for the
// quantized types, and float dot products for F32 / F16 / BF16 rows. Each
// kernel exists per SimdPath; the caller picks one kernel per matrix and
// calls it per (row, token), so results never depend on batch composition.
// The multi-token kernels (prefill) take one row and up to kDotMaxTokens
// tokens, unpack each weight block once, and return for every token the bits
// of the one-token kernel on that token alone.
//
// Contract (docs/cpu-kernels.md): for every 32-element block the integer sums
// are exact and identical on every path; the float combination follows one
// fixed order, so every path returns the same bits as the scalar reference.
#pragma once

#include <cstdint>

#include "gguf/tensor_type.h"
#include "quant/act_quant.h"
#include "quant/simd_path.h"

namespace tern::quant {

// sum_k w[k] * a[k] over k elements (a multiple of the type's block size);
// w_row points at the row's first block, a at k/32 activation blocks.
using DotRowFn = float (*)(const void* w_row, const block_q8a* a, int64_t k);

// The exact integer parts of the same dot product, one pair per 32-element
// block b: w_sum[b] and x_sum[b] (meaning per type in docs/cpu-kernels.md),
// so tests can compare paths integer for integer.
using DotIntSumsFn = void (*)(const void* w_row, const block_q8a* a, int64_t k, int32_t* w_sum,
                              int32_t* x_sum);

// sum_k w[k] * x[k] for an F32, F16 or BF16 row and f32 activations; any k.
using DotFloatFn = float (*)(const void* w_row, const float* x, int64_t k);

// ---- several tokens per call --------------------------------------------------

constexpr int kDotMaxTokens = 8;

// The quantized activations of up to kDotMaxTokens tokens, k/32 blocks each,
// as the multi-token kernels read them. Token t's blocks start at
// q + t * stride; the d and sum of those blocks are repeated, contiguous, at
// d + t * stride and sum + t * stride (act_token_planes), so a kernel loads
// eight of them at once instead of gathering them from 40-byte blocks.
struct ActTokens {
    const block_q8a* q = nullptr;
    const float* d = nullptr;
    const int32_t* sum = nullptr;
    int64_t stride = 0;  // blocks from one token to the next, >= k / 32
};

// d[i] = q[i].d and sum[i] = q[i].sum for i < n.
void act_token_planes(const block_q8a* q, int64_t n, float* d, int32_t* sum);

// For t < n_tokens (1..kDotMaxTokens):
//   out[t * out_stride] = DotRowFn(w_row, a.q + t * a.stride, k), bit for bit.
using DotTokensFn = void (*)(const void* w_row, const ActTokens& a, int n_tokens, int64_t k, float* out,
                             int64_t out_stride);

// For t < n_tokens (1..kDotMaxTokens):
//   out[t * out_stride] = DotFloatFn(w_row, x + t * x_stride, k), bit for bit.
using DotFloatTokensFn = void (*)(const void* w_row, const float* x, int64_t x_stride, int n_tokens, int64_t k,
                                  float* out, int64_t out_stride);

// Types with an integer dot product: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K.
bool dot_int_type(TensorType type);
// F32, F16, BF16.
bool dot_float_type(TensorType type);

// Kernels for (type, path); nullptr when the type has no such kernel or the
// path is not available on this CPU.
DotRowFn dot_row_kernel(TensorType type, SimdPath path);
DotIntSumsFn dot_int_sums_kernel(TensorType type, SimdPath path);
DotFloatFn dot_float_kernel(TensorType type, SimdPath path);
DotTokensFn dot_tokens_kernel(TensorType type, SimdPath path);
DotFloatTokensFn dot_float_tokens_kernel(TensorType type, SimdPath path);

}  // namespace tern::quant
