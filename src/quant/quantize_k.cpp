// Reference quantizers for the K-quant super-blocks of 256 elements (q2_K,
// q3_K, q4_K, q5_K, q6_K, q8_K). Each one: search a scale (and min) per
// sub-block (kquant_search.h), quantize those scales to 4, 6 or 8 bits against
// one f16 super-block scale, then requantize every element against the scale
// actually stored, and pack the levels in the format's bit layout.
#include <cmath>
#include <cstring>

#include "base/fp16.h"
#include "quant/kquant_scales.h"
#include "quant/kquant_search.h"
#include "quant/reference.h"

namespace tern::quant::ref {
namespace {

int clamp_level(int l, int lo, int hi) { return l < lo ? lo : (l > hi ? hi : l); }

// q2_K / q3_K: four 2-bit planes; qs[32h + l] holds elements 128h + l + 32p
// at bits 2p.
void pack_2bit_planes(const uint8_t* L, uint8_t* qs) {
    for (int j = 0; j < QK_K; j += 128) {
        for (int l = 0; l < 32; ++l) {
            qs[j / 4 + l] = uint8_t(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) |
                                    (L[j + l + 96] << 6));
        }
    }
}

// Weights for q4_K / q5_K: each element's magnitude plus the sub-block RMS,
// so small elements still count.
void rms_plus_abs_weights(const float* x, float* weights) {
    float sum_x2 = 0.0f;
    for (int l = 0; l < 32; ++l) sum_x2 += x[l] * x[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[l]);
}

// Shared by q4_K and q5_K: per 32-element sub-block an asymmetric search,
// then the 8 scales and 8 mins quantized to 6 bits each against max/63.
// Fills d, dmin, the packed scales and the final levels L (0..nmax).
void quantize_scales_mins_k4(const float* x, int nmax, float rmin, float rdelta, int nstep,
                             uint16_t* d_out, uint16_t* dmin_out, uint8_t* packed, uint8_t* L) {
    float scales[QK_K / 32], mins[QK_K / 32], weights[32];
    uint8_t Laux[32];
    float max_scale = 0.0f, max_min = 0.0f;  // the search keeps scales and mins >= 0
    for (int j = 0; j < QK_K / 32; ++j) {
        rms_plus_abs_weights(x + 32 * j, weights);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux,
                                     rmin, rdelta, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.f / max_min : 0.0f;
    uint8_t ls[QK_K / 32], lm[QK_K / 32];
    for (int j = 0; j < QK_K / 32; ++j) {
        // Through uint8_t as the reference does, then capped at 63.
        const uint8_t s = uint8_t(nearest_int(inv_scale * scales[j]));
        const uint8_t m = uint8_t(nearest_int(inv_min * mins[j]));
        ls[j] = s < 63 ? s : 63;
        lm[j] = m < 63 ? m : 63;
    }
    pack_scales_mins_k4(ls, lm, packed);
    *d_out = fp32_to_fp16(max_scale / 63.f);
    *dmin_out = fp32_to_fp16(max_min / 63.f);

    const float d_all = fp16_to_fp32(*d_out), dmin_all = fp16_to_fp32(*dmin_out);
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        unpack_scale_min_k4(j, packed, &sc, &m);
        const float d = d_all * float(sc);
        if (d == 0.0f) continue;  // levels from the search stay
        const float dm = dmin_all * float(m);
        for (int ii = 0; ii < 32; ++ii) {
            L[32 * j + ii] = uint8_t(clamp_level(nearest_int((x[32 * j + ii] + dm) / d), 0, nmax));
        }
    }
}

}  // namespace

void quantize_q2_K(const float* x, block_q2_K* y, int64_t nb) {
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    const float q4scale = 15.f;
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux,
                                         -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        // Scales in the low nibble, mins in the high; integer conversions
        // wrap to 8 bits as in the reference.
        if (max_scale > 0.0f) {
            const float iscale = q4scale / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) y[i].scales[j] = uint8_t(nearest_int(iscale * scales[j]));
            y[i].d = fp32_to_fp16(max_scale / q4scale);
        } else {
            std::memset(y[i].scales, 0, sizeof y[i].scales);
            y[i].d = fp32_to_fp16(0.0f);
        }
        if (max_min > 0.0f) {
            const float iscale = q4scale / max_min;
            for (int j = 0; j < QK_K / 16; ++j) {
                const uint32_t l = uint32_t(nearest_int(iscale * mins[j]));
                y[i].scales[j] = uint8_t(y[i].scales[j] | (l << 4));
            }
            y[i].dmin = fp32_to_fp16(max_min / q4scale);
        } else {
            y[i].dmin = fp32_to_fp16(0.0f);
        }
        const float d_all = fp16_to_fp32(y[i].d), dmin_all = fp16_to_fp32(y[i].dmin);
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = d_all * float(y[i].scales[j] & 0xF);
            if (d == 0.0f) continue;  // levels from the search stay
            const float dm = dmin_all * float(y[i].scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) {
                L[16 * j + ii] = uint8_t(clamp_level(nearest_int((x[16 * j + ii] + dm) / d), 0, 3));
            }
        }
        pack_2bit_planes(L, y[i].qs);
    }
}

void quantize_q3_K(const float* x, block_q3_K* y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K / 16; ++j) {
            scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j, true);
            const float scale = std::fabs(scales[j]);
            if (scale > amax) {
                amax = scale;
                max_scale = scales[j];
            }
        }
        std::memset(y[i].scales, 0, sizeof y[i].scales);
        if (max_scale != 0.0f) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                const int l = clamp_level(int8_t(nearest_int(iscale * scales[j])), -32, 31) + 32;
                pack_scale_q3_k(j, l, y[i].scales);
            }
            y[i].d = fp32_to_fp16(1 / iscale);
        } else {
            y[i].d = fp32_to_fp16(0.0f);
        }
        const float d_all = fp16_to_fp32(y[i].d);
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = d_all * float(unpack_scale_q3_k(j, y[i].scales));
            if (d == 0.0f) continue;  // levels from the search stay
            for (int ii = 0; ii < 16; ++ii) {
                L[16 * j + ii] = int8_t(clamp_level(nearest_int(x[16 * j + ii] / d), -4, 3) + 4);
            }
        }
        // Third bit of element j at bit j / 32 of hmask[j % 32]; the low two
        // bits go in the 2-bit planes.
        std::memset(y[i].hmask, 0, sizeof y[i].hmask);
        uint8_t low[QK_K];
        for (int j = 0; j < QK_K; ++j) {
            int l = L[j];
            if (l > 3) {
                y[i].hmask[j % 32] = uint8_t(y[i].hmask[j % 32] | (1u << (j / 32)));
                l -= 4;
            }
            low[j] = uint8_t(l);
        }
        pack_2bit_planes(low, y[i].qs);
    }
}

void quantize_q4_K(const float* x, block_q4_K* y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        quantize_scales_mins_k4(x, 15, -1.f, 0.1f, 20, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t* q = y[i].qs;
        for (int j = 0; j < QK_K; j += 64, q += 32) {
            for (int l = 0; l < 32; ++l) q[l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
        }
    }
}

void quantize_q5_K(const float* x, block_q5_K* y, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        quantize_scales_mins_k4(x, 31, -0.5f, 0.1f, 15, &y[i].d, &y[i].dmin, y[i].scales, L);
        uint8_t* ql = y[i].qs;
        uint8_t* qh = y[i].qh;
        std::memset(qh, 0, QK_K / 8);
        uint8_t m1 = 1, m2 = 2;
        for (int n = 0; n < QK_K; n += 64, ql += 32) {
            for (int j = 0; j < 32; ++j) {
                int l1 = L[n + j], l2 = L[n + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    qh[j] = uint8_t(qh[j] | m1);
                }
                if (l2 > 15) {
                    l2 -= 16;
                    qh[j] = uint8_t(qh[j] | m2);
                }
                ql[j] = uint8_t(l1 | (l2 << 4));
            }
            m1 = uint8_t(m1 << 2);
            m2 = uint8_t(m2 << 2);
        }
    }
}

void quantize_q6_K(const float* x, block_q6_K* y, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max_scale = 0.0f, max_abs_scale = 0.0f;
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
            scales[ib] = scale;
            const float abs_scale = std::fabs(scale);
            if (abs_scale > max_abs_scale) {
                max_abs_scale = abs_scale;
                max_scale = scale;
            }
        }
        if (max_abs_scale < kGroupMaxEps) {
            std::memset(&y[i], 0, sizeof y[i]);
            y[i].d = fp32_to_fp16(0.0f);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y[i].d = fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib) {
            const int s = nearest_int(iscale * scales[ib]);
            y[i].scales[ib] = int8_t(s < 127 ? s : 127);
        }
        const float d_all = fp16_to_fp32(y[i].d);
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = d_all * float(y[i].scales[j]);
            if (d == 0.0f) continue;  // levels from the search stay
            for (int ii = 0; ii < 16; ++ii) {
                L[16 * j + ii] = int8_t(clamp_level(nearest_int(x[16 * j + ii] / d), -32, 31) + 32);
            }
        }
        // Per half of 128: low nibbles of elements l, l+64 in ql[l], of
        // l+32, l+96 in ql[l+32]; the top two bits of all four in qh[l].
        uint8_t* ql = y[i].ql;
        uint8_t* qh = y[i].qh;
        for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
            for (int l = 0; l < 32; ++l) {
                const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
                ql[l] = uint8_t((q1 & 0xF) | ((q3 & 0xF) << 4));
                ql[l + 32] = uint8_t((q2 & 0xF) | ((q4 & 0xF) << 4));
                qh[l] = uint8_t((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6));
            }
        }
    }
}

void quantize_q8_K(const float* x, block_q8_K* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK_K) {
        float max = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K; ++j) {
            const float ax = std::fabs(x[j]);
            if (ax > amax) {
                amax = ax;
                max = x[j];
            }
        }
        if (amax == 0.0f) {
            std::memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        // -127 (not -128) keeps every level in -127..127.
        const float iscale = -127.f / max;
        for (int j = 0; j < QK_K; ++j) {
            const int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = int8_t(v < 127 ? v : 127);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            int sum = 0;
            for (int ii = 0; ii < 16; ++ii) sum += y[i].qs[j * 16 + ii];
            y[i].bsums[j] = int16_t(sum);
        }
        y[i].d = 1 / iscale;
    }
}

}  // namespace tern::quant::ref
