// Matrix products on the CPU: out[t][r] = sum_k W[r][k] * x[t][k] for a
// weight matrix stored as GGUF rows (any type with a dot kernel in
// quant/dot.h, or F32 / F16 / BF16) and f32 activations [n_tokens][cols].
//
// Quantized weights: the activations are quantized to block_q8a once per
// call (or once by the caller, for inputs shared by several matrices), then
// OpenMP threads split the output rows (and tokens). A batch of several
// tokens runs the multi-token kernels (eight tokens per weight-row pass),
// which give every output element the bits of the one-token row kernel on
// that token alone, so results do not depend on the thread count or on which
// other tokens share the batch.
#pragma once

#include <cstdint>
#include <optional>

#include "backend/backend.h"
#include "base/result.h"
#include "quant/act_quant.h"
#include "quant/simd_path.h"

namespace tern::backend::cpu {

struct MatmulOptions {
    std::optional<quant::SimdPath> path;  // default: quant::simd_path_best()
    int n_threads = 0;                    // <= 0: OpenMP's current default
    // K-quant weights (quant::dot_grouped_type) read activations quantized
    // with one scale per 256 elements (quant::quantize_act_row_grouped), as
    // the CUDA backend's kernels read them, so that the two backends can be
    // compared on the same activations.
    bool grouped_kquant_acts = false;
};

// Whether a weight of this type reads grouped activations under opt.
bool reads_grouped_acts(TensorType type, const MatmulOptions& opt);

// out holds n_tokens * w.rows floats, row-major [t][r]; x holds n_tokens * w.cols.
// Uses w.type, w.rows, w.cols, w.host and w.row_bytes (0: packed rows).
// Errors (nothing written): unsupported type, ragged cols, bad pointers or
// alignment, unavailable path.
Status matmul(const Weight& w, const float* x, int64_t n_tokens, float* out, const MatmulOptions& opt = {});

// Quantized-weight matmul on activations already quantized with
// quantize_activations (n_tokens * w.cols / 32 blocks, token t's at t * w.cols / 32).
Status matmul_q8a(const Weight& w, const quant::block_q8a* xq, int64_t n_tokens, float* out,
                  const MatmulOptions& opt = {});

// One token's matmul_q8a into several weights that read the same activations
// (q/k/v, gate/up): the same bits as one call each, with every weight's row
// tiles in one parallel loop, so a layer's threads meet once for them, not
// once a matrix. Returns false, computing nothing, where a weight takes
// another path (a type without a many-row one-token kernel, a bad view);
// the caller then makes one call each.
struct Q8aTarget {
    const Weight* w;
    float* out;  // w->rows floats
};
bool matmul_q8a_one_token(const Q8aTarget* targets, int n, const quant::block_q8a* xq, const MatmulOptions& opt = {});

// x [n_tokens][cols] -> xq, cols a multiple of 32; threads over tokens.
// grouped: one scale per 256 elements (reads_grouped_acts).
Status quantize_activations(const float* x, int64_t n_tokens, int64_t cols, quant::block_q8a* xq,
                            const MatmulOptions& opt = {}, bool grouped = false);

}  // namespace tern::backend::cpu
