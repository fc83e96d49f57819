// Reference quantizers for the 32-element block formats (q4_0, q4_1, q5_0,
// q5_1, q8_0, q8_1). One scale per block from the block's extremes, then one
// rounding per element; the rounding (truncating x + 8.5 for q4_0, roundf for
// q8_0, ...) is the reference one, which is what makes files bit-identical.
#include <cmath>
#include <cstring>

#include "base/fp16.h"
#include "quant/reference.h"

namespace tern::quant::ref {
namespace {

// The element of largest magnitude with its sign; the first one on ties.
float signed_absmax(const float* x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; ++j) {
        if (amax < std::fabs(x[j])) {
            amax = std::fabs(x[j]);
            max = x[j];
        }
    }
    return max;
}

float absmax(const float* x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    return amax;
}

void min_max(const float* x, int n, float* min, float* max) {
    *min = 3.402823466e+38f;
    *max = -3.402823466e+38f;
    for (int j = 0; j < n; ++j) {
        if (x[j] < *min) *min = x[j];
        if (x[j] > *max) *max = x[j];
    }
}

// Truncation toward zero, as the reference's cast to a small integer type.
// Arguments are >= 0 for finite input; the clamp keeps NaN/inf input defined.
int truncate_level(float v, int top) {
    if (!(v > 0.0f)) return 0;
    if (v >= float(top)) return top;
    return int(v);
}

// roundf to a q8 level; the clamp only matters for non-finite input, where
// the plain conversion would be undefined.
int8_t round_level_q8(float v) {
    const float r = std::round(v);
    if (!(r > -128.0f)) return r != r ? 0 : -128;
    if (r > 127.0f) return 127;
    return int8_t(r);
}

// 5-bit levels: low nibbles in qs, element j's fifth bit at bit j of qh.
void pack_5bit(const int* q, uint8_t* qs, uint8_t* qh_bytes, int qk) {
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
        const int q0 = q[j], q1 = q[j + qk / 2];
        qs[j] = uint8_t((q0 & 0x0F) | ((q1 & 0x0F) << 4));
        qh |= uint32_t((q0 & 0x10) >> 4) << j;
        qh |= uint32_t((q1 & 0x10) >> 4) << (j + qk / 2);
    }
    for (int b = 0; b < 4; ++b) qh_bytes[b] = uint8_t(qh >> (8 * b));
}

}  // namespace

void quantize_q4_0(const float* x, block_q4_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK4_0) {
        const float d = signed_absmax(x, QK4_0) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const int q0 = truncate_level(x[j] * id + 8.5f, 15);
            const int q1 = truncate_level(x[j + QK4_0 / 2] * id + 8.5f, 15);
            y[i].qs[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

void quantize_q4_1(const float* x, block_q4_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK4_1) {
        float min, max;
        min_max(x, QK4_1, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(min);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            const int q0 = truncate_level((x[j] - min) * id + 0.5f, 15);
            const int q1 = truncate_level((x[j + QK4_1 / 2] - min) * id + 0.5f, 15);
            y[i].qs[j] = uint8_t(q0 | (q1 << 4));
        }
    }
}

void quantize_q5_0(const float* x, block_q5_0* y, int64_t nb) {
    int q[QK5_0];
    for (int64_t i = 0; i < nb; ++i, x += QK5_0) {
        const float d = signed_absmax(x, QK5_0) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK5_0; ++j) q[j] = truncate_level(x[j] * id + 16.5f, 31);
        pack_5bit(q, y[i].qs, y[i].qh, QK5_0);
    }
}

void quantize_q5_1(const float* x, block_q5_1* y, int64_t nb) {
    int q[QK5_1];
    for (int64_t i = 0; i < nb; ++i, x += QK5_1) {
        float min, max;
        min_max(x, QK5_1, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        y[i].m = fp32_to_fp16(min);
        for (int j = 0; j < QK5_1; ++j) q[j] = truncate_level((x[j] - min) * id + 0.5f, 31);
        pack_5bit(q, y[i].qs, y[i].qh, QK5_1);
    }
}

void quantize_q8_0(const float* x, block_q8_0* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK8_0) {
        const float d = absmax(x, QK8_0) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        for (int j = 0; j < QK8_0; ++j) y[i].qs[j] = round_level_q8(x[j] * id);
    }
}

void quantize_q8_1(const float* x, block_q8_1* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, x += QK8_1) {
        const float d = absmax(x, QK8_1) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK8_1; ++j) {
            y[i].qs[j] = round_level_q8(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].s = fp32_to_fp16(float(sum) * d);
    }
}

}  // namespace tern::quant::ref
