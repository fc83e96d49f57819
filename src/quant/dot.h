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

#include <cstddef>
#include <cstdint>

#include "base/result.h"
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

// The quantized activations of several tokens in the layout the multi-token
// kernels read, built once per matmul by pack_act_tokens. Per token, the
// blocks are taken eight at a time (a group); a group's 32 * 8 bytes of qs
// are interleaved so that int32 word 8s + j holds elements 4s..4s+3 of block
// j: one 32-byte load then gives four elements of each of eight blocks, lane j
// belonging to block j, and the per-block integer sums need no horizontal
// reduction. d and sum repeat the blocks' scales and sums, eight to a load.
// Blocks past the row's end, up to the next multiple of eight, are zero.
struct ActTokens {
    const int8_t* qs = nullptr;    // token t: qs + t * 32 * stride
    const float* d = nullptr;      // token t: d + t * stride
    const int32_t* sum = nullptr;  // token t: sum + t * stride
    int64_t stride = 0;            // blocks per token, k/32 rounded up to a multiple of 8

    // The same activations from token t on.
    ActTokens from(int64_t t) const { return {qs + t * 32 * stride, d + t * stride, sum + t * stride, stride}; }
};

// Blocks per token in that layout: k/32 rounded up to a multiple of eight.
int64_t act_tokens_stride(int64_t k);

// Packs n_tokens rows of k/32 blocks (token t's at q + t * (k/32)) into qs
// (n_tokens * stride * 32 bytes), d and sum (n_tokens * stride each).
void pack_act_tokens(const block_q8a* q, int64_t n_tokens, int64_t k, int8_t* qs, float* d, int32_t* sum);

// For t < n_tokens (1..kDotMaxTokens), with x_t token t's blocks as block_q8a:
//   out[t * out_stride] = DotRowFn(w_row, x_t, k), bit for bit.
using DotTokensFn = void (*)(const void* w_row, const ActTokens& a, int n_tokens, int64_t k, float* out,
                             int64_t out_stride);

// For t < n_tokens (1..kDotMaxTokens):
//   out[t * out_stride] = DotFloatFn(w_row, x + t * x_stride, k), bit for bit.
using DotFloatTokensFn = void (*)(const void* w_row, const float* x, int64_t x_stride, int n_tokens, int64_t k,
                                  float* out, int64_t out_stride);

// One token against n_rows rows, row r at w + r * row_stride:
//   out[r] = DotRowFn(w + r * row_stride, a, k), bit for bit,
// with the work every row shares (the activations' block scales and sums)
// done once.
using DotRowsFn = void (*)(const void* w, size_t row_stride, int64_t n_rows, const block_q8a* a, int64_t k,
                           float* out);

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
DotRowsFn dot_rows_kernel(TensorType type, SimdPath path);  // nullptr on the scalar path
DotFloatTokensFn dot_float_tokens_kernel(TensorType type, SimdPath path);

// ---- the per-block terms, and the order the CUDA kernels sum them in --------
//
// Every integer dot product is a sum of one float term t_b per 32-element
// block (docs/cpu-kernels.md). The CPU kernels fold them into eight lanes;
// the CUDA kernels (backend/cuda/kernels.h) sum them in another order. These
// give the terms themselves and the CUDA order, so a GPU result can be checked
// bit for bit on the CPU.

// Writes t_b for b < k/32 exactly as the dot kernels form it. Errors for types
// without an integer dot product and for k that is negative or not a whole
// number of the type's blocks.
Status dot_block_terms(TensorType type, const void* w_row, const block_q8a* a, int64_t k, float* terms);

// The chunked order: blocks go eight at a time (the last chunk may be
// shorter); a chunk sums as c = t_8i, c = c + t_8i+1, ... left to right; the
// result starts at +0.0f and adds c_0, c_1, ... in order.
float sum_terms_chunked(const float* terms, int64_t n_blocks);

// Types whose CUDA kernels sum a super-block's integers before any float step
// and so read activations from quantize_act_row_grouped: the K-quants.
bool dot_grouped_type(TensorType type);

// The CUDA kernels' result, bit for bit:
//  - legacy types (32-element blocks): sum_terms_chunked of dot_block_terms;
//  - K-quants: one term per super-block from its integer totals, in the order
//    dot_internal.h documents (kquant_inner_*). `a` must come from
//    quantize_act_row_grouped, so that the eight blocks of a super-block share
//    one scale; the scale of each super-block's first block is the one used.
// NaN where dot_block_terms would return an error.
float dot_row_chunked(TensorType type, const void* w_row, const block_q8a* a, int64_t k);

}  // namespace tern::quant
