// The device kernels of the CUDA backend, as plain launch functions. The
// backend (cuda_backend.cpp) owns memory and streams and calls these; the GPU
// tests and the kernel sandbox (bench/cuda) call them directly against their
// CPU twins. Every launcher only enqueues work on `stream`; the caller checks
// cudaGetLastError() at its sync points.
//
// Layouts
// - Activations: f32, row-major, one row per token, `cols` floats per row.
// - Quantized activations (DevAct): the CPU's block_q8a split into planes so
//   that 32-byte runs of qs stay 16-byte aligned: block b of token t has its
//   qs at qs + (t * blocks + b) * 32, its scale at d[t * blocks + b] and its
//   integer sum at sum[t * blocks + b]. With group 8, sum_split (where not
//   null) also holds each group's eight block sums s as sixteen f16 values,
//   s >> 6 of blocks 0..7, then s & 63 of blocks 0..7 (so s = 64 hi + lo,
//   every value exact in f16; quant::split_block_sums is the CPU twin): the
//   operand of mmq_wgmma's product of the K-quant mins, token t's at
//   sum_split + t * quant::split_sum_count(blocks). With group 1, the values of
//   quant::quantize_act_row (one scale per block); with group 8, those of
//   quant::quantize_act_row_grouped (one scale per 256 elements, repeated in
//   each block), which the K-quant kernels require (act_group).
// - Weights (DevWeight): GGUF blocks as registered. q6_K is registered either
//   raw (210-byte blocks, as in the file) or padded to 224 bytes so that every
//   16-byte load is aligned; kernels read block_stride and take the wide-load
//   path only when it is a multiple of 16.
//
// Arithmetic order of the integer matmuls (mmvq, mmq_batch and mmq give the same bits;
// quant::dot_row_chunked() is the CPU twin of the whole result):
// - legacy types: every 32-element block b yields the float term t_b of
//   quant::dot_block_terms (the CPU kernels' term, docs/cpu-kernels.md); terms
//   are summed in chunks of eight consecutive blocks, c = t_8i + t_8i+1 + ...
//   left to right, and the chunks are added in order to an accumulator that
//   starts at +0.0;
// - K-quants: a super-block's integer sums are added as integers (exact), and
//   each super-block adds r = fma(D, inner, r) in order from +0.0, D being the
//   activations' group scale and inner quant/dot_internal.h's kquant_inner_*.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tern::cuda {

// Weight formats the kernels read; the values are GGUF type ids.
enum class WType : int {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
    Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

struct DevWeight {
    WType type = WType::F32;
    int64_t rows = 0, cols = 0;
    const uint8_t* data = nullptr;  // device memory, 256-byte aligned
    int block_stride = 0;           // bytes per block as registered (q6_K: 210 or 224)
    int64_t row_stride = 0;         // bytes per row
};

struct DevAct {
    int8_t* qs = nullptr;
    float* d = nullptr;
    int32_t* sum = nullptr;  // each block's sum of qs (mmq_batch's staged kernel sums qs itself instead)
    int64_t blocks = 0;  // blocks per token (cols / 32)
    int group = 1;       // consecutive blocks that share one scale: 1, or 8 (quantize_act_row_grouped)
    uint16_t* sum_split = nullptr;  // group 8: the block sums as f16 (64 hi + lo), 16 a group; optional
};

// Types with integer (quantized-activation) kernels.
bool int_type(WType t);

// The activation group the integer kernels of a weight type read: 8 for the
// K-quants (quant::dot_grouped_type), 1 for the legacy types.
int act_group(WType t);

// x: n_tokens rows of cols floats (row stride x_stride), cols a multiple of
// 32, quantized with out.group blocks to a scale (a shorter last group when
// the row's blocks are not a multiple of it). Group 8 reads x in 16-byte
// loads: x 16-byte aligned and x_stride a multiple of 4.
void quantize_act(const float* x, int64_t x_stride, int64_t n_tokens, int64_t cols, DevAct out,
                  cudaStream_t stream);

// y[t][r] = dot(W row r, token t) for t < n_tokens, row stride y_stride.
// mmvq: 1..kMmvqMaxTokens tokens, reads each weight once per call (decode).
constexpr int kMmvqMaxTokens = 8;
void mmvq(const DevWeight& w, const DevAct& a, int n_tokens, float* y, int64_t y_stride, cudaStream_t stream);
// Up to kMmvqMaxParts matrices of one type and layout that read the same
// activations (q, k and v; gate and up) in one launch over all their rows:
// each part's outputs are the bits mmvq gives it alone. Launches nothing when
// the parts are not mmvq_parts_compatible with the first, a part has no rows,
// their `add`s differ, or there are more than kMmvqMaxParts.
constexpr int kMmvqMaxParts = 3;
struct MatmulPart {
    DevWeight w;
    float* y = nullptr;
    int64_t y_stride = 0;
    bool add = false;  // y += the product (the bits of the product then add), instead of y = it
};
bool mmvq_parts_compatible(const DevWeight& a, const DevWeight& b);
void mmvq_parts(const MatmulPart* parts, int n_parts, const DevAct& a, int n_tokens, cudaStream_t stream);
// mmq_batch: 1..kMmqBatchMaxTokens tokens of the K-quants (mmq_batch_type),
// int8 tensor cores with a row tile's super-blocks split across warps, or
// streamed through a ring of shared-memory stages (the decode step of many
// sequences).
constexpr int kMmqBatchMaxTokens = 64;
bool mmq_batch_type(WType t);
// True where mmq_batch runs n tokens of w on its streamed kernel (sm_90,
// 16 tokens and more, q6_K padded). Matrices of many rows then stay on it
// past 32 tokens: in the 7B step that beat sending them to mmq (LOG g43).
bool mmq_batch_streams(const DevWeight& w, int n_tokens);
void mmq_batch(const DevWeight& w, const DevAct& a, int n_tokens, float* y, int64_t y_stride, cudaStream_t stream);
// mmq: any number of tokens, int8 tensor cores (prefill): mmq_wgmma where it
// runs, else mmq_mma_sync. Both give the bits of the order above.
void mmq(const DevWeight& w, const DevAct& a, int64_t n_tokens, float* y, int64_t y_stride, cudaStream_t stream);
// The warp-level kernel (mma.sync, sm_80+), every integer type.
void mmq_mma_sync(const DevWeight& w, const DevAct& a, int64_t n_tokens, float* y, int64_t y_stride,
                  cudaStream_t stream);
// Hopper's warpgroup kernel (wgmma, sm_90a code on compute capability 9.0):
// q4_K, q5_K and padded q6_K with 16-byte aligned weights and activations
// (for q4_K and q5_K, sum_split among them).
// TERN_MMQ_WGMMA=0 turns it off (A/B runs). mmq_wgmma launches nothing and
// returns false where it does not run.
bool mmq_wgmma_runs(const DevWeight& w, const DevAct& a, int64_t n_tokens);
bool mmq_wgmma(const DevWeight& w, const DevAct& a, int64_t n_tokens, float* y, int64_t y_stride,
               cudaStream_t stream);

// ---- mixture of experts (Backend::route_experts and what follows it) ----
// A routed row ("pair") p = t*k + j is token t's j-th expert, ids[p].

// Per token t < n_tokens (logits row t, n_expert <= 256 floats): ids and
// weights of its k experts at t*k.., the rule of cpu::route_top_k (the
// weights within a few ulp of it: expf).
void route_experts(const float* logits, int64_t n_tokens, int n_expert, int k, int32_t* ids, float* weights,
                   cudaStream_t stream);

// The routed rows grouped by expert, for mmq_experts: expert e's rows are
// pairs[start[e] .. start[e+1]) in increasing order; tiles lists (e, first)
// for each kExpertTileRows rows of an expert's list, then (-1, 0) up to
// expert_max_tiles.
constexpr int kExpertTileRows = 64;
struct ExpertGroups {
    int32_t* start = nullptr;  // n_expert + 1
    int32_t* pairs = nullptr;  // n_pairs
    int2* tiles = nullptr;     // expert_max_tiles(n_pairs, n_expert)
    int32_t* count = nullptr;  // n_expert: each expert's rows (the grouping's own scratch)
};
int expert_max_tiles(int64_t n_pairs, int n_expert);
void group_experts(const int32_t* ids, int64_t n_pairs, int n_expert, ExpertGroups groups, cudaStream_t stream);

// y row p = dot(expert ids[p]'s rows, activation row p / per): experts[e] is
// expert e's data, w its type, shape and strides (data unused). The bits of
// mmvq / mmq on that row alone.
// mmvq_experts: each routed row on its own (decode: a few tokens).
void mmvq_experts(const uint8_t* const* experts, const DevWeight& w, const DevAct& a, const int32_t* ids,
                  int64_t n_pairs, int per, float* y, int64_t y_stride, cudaStream_t stream);
// y row p = silu(g) * u, g and u mmvq_experts' rows p of the gate and up sets
// (one type and shape, w): the bits of both calls and swiglu, in one pass.
void mmvq_experts_swiglu(const uint8_t* const* gate_exps, const uint8_t* const* up_exps, const DevWeight& w,
                         const DevAct& a, const int32_t* ids, int64_t n_pairs, int per, float* y, int64_t y_stride,
                         cudaStream_t stream);
// out row t = combine_experts of mmvq_experts' rows t * k + j (activation row
// t * k + j, weights[t * k + j]): the bits of both calls, in one pass. With
// add, out row t += that instead (the bits of the combine then add).
void mmvq_experts_combine(const uint8_t* const* experts, const DevWeight& w, const DevAct& a, const int32_t* ids,
                          const float* weights, int64_t n_tokens, int k, float* out, int64_t out_stride,
                          cudaStream_t stream, bool add = false);
// mmq_experts: each expert's rows as the token tiles of its matrix (prefill).
void mmq_experts(const uint8_t* const* experts, const DevWeight& w, const DevAct& a, const ExpertGroups& groups,
                 int64_t n_pairs, int n_expert, int per, float* y, int64_t y_stride, cudaStream_t stream);
// Float experts: x rows of w.cols floats, matmul_float's arithmetic.
void matmul_float_experts(const uint8_t* const* experts, const DevWeight& w, const float* x, const int32_t* ids,
                          int64_t n_pairs, int per, float* y, cudaStream_t stream);

// out[t] = w_0 y_0 rounded, then fma(w_j, y_j, .) for j = 1..k-1 (rows t*k + j of y).
void combine_experts(const float* y, const float* weights, int64_t n_tokens, int k, int64_t cols, float* out,
                     cudaStream_t stream);

// F32 / F16 / BF16 weights: y[t][r] = sum_k W[r][k] * x[t][k] in f32, every
// kernel in one order: four fma chains (column k in chain (k / 4) % 4), then
// (c0 + c1) + (c2 + c3).
void matmul_float(const DevWeight& w, const float* x, int64_t n_tokens, float* y, cudaStream_t stream);

// q6_K raw (210-byte) blocks to the padded 224-byte layout, on the device.
void pad_q6_K(const uint8_t* raw, uint8_t* padded, int64_t n_blocks, cudaStream_t stream);

}  // namespace tern::cuda
