// Scale searches for the K-quant reference quantizers (see kquant_search.h).
// Sums are accumulated element by element in float, in index order, and each
// product is written in the order the reference evaluates it: reordering or
// vectorising these loops changes which scale wins on near ties.
#include "quant/kquant_search.h"

#include <algorithm>
#include <cmath>

#include "quant/kquant_scales.h"

namespace tern::quant {
namespace {

// Largest magnitude and the signed element that has it (first on ties).
void signed_absmax(const float* x, int n, float* amax, float* max) {
    *amax = 0.0f;
    *max = 0.0f;
    for (int i = 0; i < n; ++i) {
        const float ax = std::fabs(x[i]);
        if (ax > *amax) {
            *amax = ax;
            *max = x[i];
        }
    }
}

int clamp_level(int l, int lo, int hi) { return std::max(lo, std::min(hi, l)); }

}  // namespace

float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type) {
    float amax, max;
    signed_absmax(x, n, &amax, &max);
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.0f;
    }
    float iscale = float(-nmax) / max;
    if (rmse_type == 0) {
        for (int i = 0; i < n; ++i) {
            L[i] = int8_t(nmax + clamp_level(nearest_int(iscale * x[i]), -nmax, nmax - 1));
        }
        return 1 / iscale;
    }
    // Only the x^2 weighting (rmse_type 1) is used by the formats here.
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_level(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = int8_t(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * float(l);
        suml2 += w * float(l) * float(l);
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        iscale = -(float(nmax) + 0.1f * float(is)) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_level(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * float(l);
            suml2 += w * float(l) * float(l);
        }
        // Better fit: sumlx^2 / suml2 larger, i.e. less residual error.
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; ++i) {
                L[i] = int8_t(nmax + clamp_level(nearest_int(iscale * x[i]), -nmax, nmax - 1));
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

float make_q3_quants(int n, int nmax, const float* x, int8_t* L, bool do_rmse) {
    float amax, max;
    signed_absmax(x, n, &amax, &max);
    if (amax < kGroupMaxEps) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        return 0.0f;
    }
    const float iscale = float(-nmax) / max;
    if (!do_rmse) {
        for (int i = 0; i < n; ++i) {
            L[i] = int8_t(clamp_level(nearest_int(iscale * x[i]), -nmax, nmax - 1) + nmax);
        }
        return 1 / iscale;
    }
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = clamp_level(nearest_int(iscale * x[i]), -nmax, nmax - 1);
        L[i] = int8_t(l);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * float(l);
        suml2 += w * float(l) * float(l);
    }
    // Coordinate descent: move one level at a time to the value the fit of
    // the others asks for, keep it if the whole fit improves.
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * float(L[i]);
            if (slx > 0.0f) {
                float sl2 = suml2 - w * float(L[i]) * float(L[i]);
                const int new_l = clamp_level(nearest_int(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (new_l != L[i]) {
                    slx += w * x[i] * float(new_l);
                    sl2 += w * float(new_l) * float(new_l);
                    if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = int8_t(new_l);
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (n_changed == 0) break;
    }
    for (int i = 0; i < n; ++i) L[i] = int8_t(L[i] + nmax);
    return sumlx / suml2;
}

float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* the_min, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    // The min is subtracted as a non-negative offset, so it is at most 0.
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        for (int i = 0; i < n; ++i) L[i] = 0;
        *the_min = -min;
        return 0.0f;
    }
    float iscale = float(nmax) / (max - min);
    float scale = 1 / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = uint8_t(clamp_level(l, 0, nmax));
        float diff = scale * float(L[i]) + min - x[i];
        diff = use_mad ? std::fabs(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    if (nstep < 1) {
        *the_min = -min;
        return scale;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * float(is) + float(nmax)) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; ++i) {
            const int l = clamp_level(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = uint8_t(l);
            const float w = weights[i];
            sum_l += w * float(l);
            sum_l2 += w * float(l) * float(l);
            sum_xl += w * float(l) * x[i];
        }
        // Weighted least squares for value = scale * l + min.
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0.0f) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0.0f) {
                this_min = 0.0f;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0.0f;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * float(Laux[i]) + this_min - x[i];
                diff = use_mad ? std::fabs(diff) : diff * diff;
                err += weights[i] * diff;
            }
            if (err < best_error) {
                for (int i = 0; i < n; ++i) L[i] = Laux[i];
                best_error = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

}  // namespace tern::quant
