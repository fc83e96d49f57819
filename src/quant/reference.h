// Typed reference dequantizers and quantizers, one pair per block format,
// working on nb whole blocks. quant.h dispatches to these by TensorType; code
// that already knows its block type (activation quantization, kernel tests)
// may call them directly. Pointers must be aligned for their block type.
//
// The quantizers are the plain ("no importance matrix") reference algorithms
// of the GGUF ecosystem, with the same float operation order, so their output
// matches other GGUF producers bit for bit.
#pragma once

#include <cstdint>

#include "quant/blocks.h"

namespace tern::quant::ref {

void dequantize_q4_0(const block_q4_0* x, float* y, int64_t nb);
void dequantize_q4_1(const block_q4_1* x, float* y, int64_t nb);
void dequantize_q5_0(const block_q5_0* x, float* y, int64_t nb);
void dequantize_q5_1(const block_q5_1* x, float* y, int64_t nb);
void dequantize_q8_0(const block_q8_0* x, float* y, int64_t nb);
void dequantize_q8_1(const block_q8_1* x, float* y, int64_t nb);  // d * q; s is not used
void dequantize_q2_K(const block_q2_K* x, float* y, int64_t nb);
void dequantize_q3_K(const block_q3_K* x, float* y, int64_t nb);
void dequantize_q4_K(const block_q4_K* x, float* y, int64_t nb);
void dequantize_q5_K(const block_q5_K* x, float* y, int64_t nb);
void dequantize_q6_K(const block_q6_K* x, float* y, int64_t nb);
void dequantize_q8_K(const block_q8_K* x, float* y, int64_t nb);  // d * q; bsums not used

void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb);
void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb);
void quantize_q5_0(const float* x, block_q5_0* y, int64_t nb);
void quantize_q5_1(const float* x, block_q5_1* y, int64_t nb);
void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb);
void quantize_q8_1(const float* x, block_q8_1* y, int64_t nb);
void quantize_q2_K(const float* x, block_q2_K* y, int64_t nb);
void quantize_q3_K(const float* x, block_q3_K* y, int64_t nb);
void quantize_q4_K(const float* x, block_q4_K* y, int64_t nb);
void quantize_q5_K(const float* x, block_q5_K* y, int64_t nb);
void quantize_q6_K(const float* x, block_q6_K* y, int64_t nb);
void quantize_q8_K(const float* x, block_q8_K* y, int64_t nb);

}  // namespace tern::quant::ref
