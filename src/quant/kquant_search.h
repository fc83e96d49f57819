// The scale searches behind the K-quant reference quantizers: given one
// sub-block of 16 or 32 floats, choose a scale (and for the asymmetric
// formats a min) and integer levels that minimise a weighted squared or
// absolute error. These are the standard GGUF searches; their exact float
// operation order is part of the file format in practice, since the chosen
// levels must match other producers bit for bit.
#pragma once

#include <cstdint>

namespace tern::quant {

// Sub-blocks whose largest magnitude is below this are quantized as zeros.
constexpr float kGroupMaxEps = 1e-15f;

// Symmetric levels L[i] in 0..2*nmax-1 (value = scale * (L[i] - nmax)).
// rmse_type 0: plain max-abs scale. rmse_type 1: weights x^2 and a search of
// 18 scales around nmax / max, keeping the one with the best least-squares
// fit. Returns the scale (0 for an all-zero sub-block, with L all 0).
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type);

// As make_qx_quants for 3-bit q3_K: levels from the max-abs scale, then up
// to 5 rounds of coordinate descent on the x^2-weighted fit if do_rmse.
float make_q3_quants(int n, int nmax, const float* x, int8_t* L, bool do_rmse);

// Asymmetric levels L[i] in 0..nmax with value = scale * L[i] - *the_min
// (*the_min >= 0). Starts from the min/max fit, then tries nstep + 1 scales
// (nmax + rmin + rdelta * k) / (max - min) with a least-squares refit of
// scale and min each time, keeping the lowest weighted error (absolute if
// use_mad, else squared). Laux is scratch of n levels.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad);

}  // namespace tern::quant
