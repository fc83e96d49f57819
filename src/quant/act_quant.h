// Activation quantization for the integer dot products: every matmul input is
// quantized once, per block of 32 consecutive elements, into block_q8a. The
// CUDA path uses the same format and rounding, so the CPU kernels can serve as
// its bit-level reference. Format and rounding: docs/cpu-kernels.md.
#pragma once

#include <cstdint>

#include "quant/simd_path.h"

namespace tern::quant {

constexpr int QK8A = 32;

// x[i] ~= d * qs[i].  d = amax / 127 (amax = max |x| over the block),
// qs[i] = round-half-away-from-zero(x[i] / d) clamped to [-127, 127]
// (0 everywhere when d == 0), sum = exact integer sum of qs.
struct block_q8a {
    float d;
    int32_t sum;
    int8_t qs[QK8A];
};
static_assert(sizeof(block_q8a) == 40, "block_q8a is 4 + 4 + 32 bytes");

// Quantizes k floats (k a multiple of 32) into k/32 blocks. Every path gives
// the same bits; the first form uses simd_path_best(), the second falls back
// to the scalar code when `path` is not available.
void quantize_act_row(const float* x, block_q8a* y, int64_t k);
void quantize_act_row(const float* x, block_q8a* y, int64_t k, SimdPath path);

// The reference for one block, written as the definition above.
void quantize_act_block_ref(const float* x, block_q8a* y);

// The same with one scale per group of kActGroupBlocks consecutive blocks
// (256 elements; the last group is shorter when k/32 is not a multiple of 8):
// d = amax over the group / 127, stored in each of its blocks, which keep their
// own sums. The CUDA backend quantizes the inputs of K-quant matrices this way,
// so that a super-block's integer sums share one activation scale and are
// added as integers (quant::dot_row_chunked, backend/cuda/kernels.h). Scalar
// code only: the CPU kernels keep one scale per block.
constexpr int64_t kActGroupBlocks = 8;
void quantize_act_row_grouped(const float* x, block_q8a* y, int64_t k);

// A row's block sums split for an f16 tensor-core product (the CUDA
// backend's K-quant mins, backend/cuda/kernels.h DevAct::sum_split): per
// group of kActGroupBlocks blocks, kSplitSumsPerGroup f16 values (bits), s >> 6 of each
// block, then s & 63 (s = 64 hi + lo, each exact in f16), zeros for the
// blocks past the row's end. split_sum_count: how many a row of `blocks`
// blocks has.
constexpr int64_t kSplitSumsPerGroup = 2 * kActGroupBlocks;
constexpr int64_t split_sum_count(int64_t blocks) {
    return (blocks + kActGroupBlocks - 1) / kActGroupBlocks * kSplitSumsPerGroup;
}
void split_block_sums(const block_q8a* y, int64_t blocks, uint16_t* out);

}  // namespace tern::quant
