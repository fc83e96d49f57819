// The CPU's registration layout for the integer weight types with 32-element
// blocks or sub-blocks (q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K): rows
// in groups of sixteen, each block's bytes interleaved across the group's
// rows, so that one 512-bit register holds four bytes of each of sixteen
// rows, lane r belonging to row r.
//
// A one-token product over GGUF rows multiplies one row at a time and must
// sum each block's partial products across the register (a horizontal
// reduction per block); over this layout one VNNI instruction multiplies
// sixteen rows by one broadcast activation word, and each lane's sum is its
// row's, so no reduction is needed. The bits are those of the row kernels:
// every row's block terms are formed and added into the same eight lanes in
// the same order (docs/cpu-kernels.md), and the tests hold every path to the
// row kernel of the GGUF rows.
//
// Per group of kGroupRows rows, nb = cols / 32 blocks, stored lane by lane
// (blocks 0, 8, 16, ..., then 1, 9, 17, ..., up to 7, 15, ...: the order in
// which the kernels add them):
//   qs: nb units, one per block: for word w of the block's quanta (4 for the
//       nibble types, 8 for q8_0), the 16 rows' word w (4 bytes each). Nibbles
//       go as in q4_0 (element i low, 16 + i high) whatever the type's own
//       order; q8_0's bytes are stored plus 128 (as unsigned: q ^ 0x80);
//   qh: q5 types, nb units of the 16 rows' 32 fifth bits; q6_K, nb units of
//       two words per row, its two high bits. Rearranged so that a kernel's
//       step s (elements 4s..4s+3) finds its bits at the same place in each of
//       its four bytes (interleave.cpp, spread_high);
//   d:  the 16 rows' f16 scales, per block (K-quants: d per super-block);
//   m:  q4_1 and q5_1: f16 mins per block; q4_K and q5_K: dmin per super-block;
//   sc: K-quants, per block the 16 rows' sub-block scales as int8 (q6_K: two,
//       the 16 rows' first halves', then their second halves');
//   mn: q4_K and q5_K, per block the 16 rows' 6-bit mins.
// Each part lies in a plane of its own across the matrix, the groups' shares
// one after another (interleave_layout.h says why). Rows past the matrix's
// last, in its last group, hold zero blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "gguf/tensor_type.h"
#include "quant/act_quant.h"
#include "quant/simd_path.h"

namespace tern::quant {

constexpr int kGroupRows = 16;

// Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K.
bool interleaved_type(TensorType type);

// Bytes of rows x cols in the layout (rows rounded up to a multiple of 16, the
// total to a multiple of 64); 0 for another type, rows < 1, or cols that are
// not a positive number of the type's blocks.
size_t interleaved_bytes(TensorType type, int64_t rows, int64_t cols);

// Writes `rows` GGUF rows (row r at src + r * src_stride) into dst, which holds
// interleaved_bytes(type, rows, cols); interleave_groups writes groups
// g0..g1-1 only (rows 16 g0 .. 16 g1 - 1), so that threads can share the work.
Status interleave_rows(TensorType type, const void* src, size_t src_stride, int64_t rows, int64_t cols, void* dst);
Status interleave_groups(TensorType type, const void* src, size_t src_stride, int64_t rows, int64_t cols, void* dst,
                         int64_t g0, int64_t g1);

// Row r's GGUF blocks (row_bytes(type, cols) bytes) read back from a matrix of
// `rows` rows in the layout; an error for r outside 0..rows-1.
Status deinterleave_row(TensorType type, const void* src, int64_t rows, int64_t cols, int64_t r, void* row);

// For group g (0 <= 16 g < rows) of a rows x k matrix w in the layout,
// t < n_tokens (1..kDotMaxTokens), the group's rows r < min(16, rows - 16 g),
// and a_t = a + t * (k / 32):
//   out[t * out_stride + r] = DotRowFn(row 16 g + r, a_t, k), bit for bit
// (a NaN is a NaN: its payload may differ, as between the row kernels' paths).
using DotGroupFn = void (*)(const void* w, int64_t rows, int64_t g, const block_q8a* a, int n_tokens, int64_t k,
                            float* out, int64_t out_stride);

// The kernel of (type, path): AVX-512 runs over the layout; the other paths
// read each row back and run their row kernel. nullptr for another type or a
// path this CPU lacks.
DotGroupFn dot_group_kernel(TensorType type, SimdPath path);

}  // namespace tern::quant
