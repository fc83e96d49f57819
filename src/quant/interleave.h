// The CPU's registration layout for rows of 32-element blocks (q4_0, q4_1,
// q5_0, q5_1, q8_0): rows in groups of sixteen, each block's bytes interleaved across the
// group's rows, so that one 512-bit register holds four bytes of each of
// sixteen rows, lane r belonging to row r.
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
// Layout of a group of kGroupRows rows, nb = cols / 32 blocks. The blocks are
// stored lane by lane (blocks 0, 8, 16, ..., then 1, 9, 17, ..., up to 7, 15,
// ...), the order in which the kernels add them, so a group streams forward:
//   qs: nb units, one per block: for word w of the block's quants (4 for the
//       nibble types, 8 for q8_0), the 16 rows' word w (4 bytes each); q8_0's
//       bytes are stored plus 128 (as unsigned: q ^ 0x80);
//   qh: q5_0 and q5_1 only, nb units of the 16 rows' 32 high bits, each
//       row's rearranged so that byte c, bit s holds element 4s + c's bit
//       (the four bytes a kernel's step s reads);
//   d:  nb units of the 16 rows' f16 scales;
//   m:  q4_1 and q5_1 only, nb units of the 16 rows' f16 mins;
// then zero bytes up to a multiple of 64. Rows past the matrix's last, in its
// last group, hold zero blocks.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "gguf/tensor_type.h"
#include "quant/act_quant.h"
#include "quant/simd_path.h"

namespace tern::quant {

constexpr int kGroupRows = 16;

// Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0.
bool interleaved_type(TensorType type);

// Bytes of one group of rows of cols elements; 0 for another type or cols that
// is not a positive multiple of 32.
size_t interleaved_group_bytes(TensorType type, int64_t cols);

// Bytes of rows x cols in the layout (rows rounded up to a multiple of 16).
size_t interleaved_bytes(TensorType type, int64_t rows, int64_t cols);

// Writes `rows` GGUF rows (row r at src + r * src_stride) into dst, which holds
// interleaved_bytes(type, rows, cols).
Status interleave_rows(TensorType type, const void* src, size_t src_stride, int64_t rows, int64_t cols, void* dst);

// Row r's GGUF blocks (row_bytes(type, cols) bytes) read back from the layout.
Status deinterleave_row(TensorType type, const void* src, int64_t cols, int64_t r, void* row);

// For t < n_tokens (1..kDotMaxTokens) and r < n_rows (1..16), with row r the
// group's r-th row and a_t = a + t * (k / 32):
//   out[t * out_stride + r] = DotRowFn(row r, a_t, k), bit for bit.
using DotGroupFn = void (*)(const void* group, const block_q8a* a, int n_tokens, int64_t k, float* out,
                            int64_t out_stride, int n_rows);

// The kernel of (type, path): AVX-512 runs over the layout; the other paths
// read each row back and run their row kernel. nullptr for another type or a
// path this CPU lacks.
DotGroupFn dot_group_kernel(TensorType type, SimdPath path);

}  // namespace tern::quant
