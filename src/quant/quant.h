// Row-level entry points to the block formats: reference dequantize and
// quantize for every supported type. The block structs are in blocks.h; the
// algorithms are the standard ones GGUF producers use, so a row quantized here
// matches what other tools write for the same input.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/result.h"
#include "gguf/tensor_type.h"

namespace tern::quant {

// Bytes for one row of n elements; 0 if n is not a whole number of blocks or
// the type is unsupported.
size_t row_bytes(TensorType type, int64_t n);

// src holds row_bytes(type, n) bytes; writes n floats. Returns an error for
// unsupported types or ragged n.
Status dequantize_row(TensorType type, const void* src, float* dst, int64_t n);

// Reference quantizer: writes row_bytes(type, n) bytes.
Status quantize_row(TensorType type, const float* src, void* dst, int64_t n);

// n_rows rows of n_per_row elements each, rows packed back to back (row r of
// the blocks at r * row_bytes(type, n_per_row)). Same checks as the one-row
// calls; rows are independent, so callers may split a tensor across threads
// by row ranges.
Status dequantize_rows(TensorType type, const void* src, float* dst, int64_t n_rows,
                       int64_t n_per_row);
Status quantize_rows(TensorType type, const float* src, void* dst, int64_t n_rows,
                     int64_t n_per_row);

}  // namespace tern::quant
