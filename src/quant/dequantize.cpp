// Reference dequantizers: block bytes back to floats, one function per block
// format. Each computes exactly the products (and the one subtraction or
// addition) other GGUF readers compute, in the same order, so dequantized
// values agree bit for bit.
#include <cstring>

#include "base/fp16.h"
#include "quant/kquant_scales.h"
#include "quant/reference.h"

namespace tern::quant::ref {

// The fifth bits of q5_0 / q5_1, element j at bit j.
static uint32_t load_qh32(const uint8_t* qh) {
    return uint32_t(qh[0]) | uint32_t(qh[1]) << 8 | uint32_t(qh[2]) << 16 | uint32_t(qh[3]) << 24;
}

void dequantize_q4_0(const block_q4_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK4_0 / 2; ++j) {
            const int x0 = (x[i].qs[j] & 0x0F) - 8;
            const int x1 = (x[i].qs[j] >> 4) - 8;
            y[j] = float(x0) * d;
            y[j + QK4_0 / 2] = float(x1) * d;
        }
    }
}

void dequantize_q4_1(const block_q4_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
        const float d = fp16_to_fp32(x[i].d);
        const float m = fp16_to_fp32(x[i].m);
        for (int j = 0; j < QK4_1 / 2; ++j) {
            const int x0 = x[i].qs[j] & 0x0F;
            const int x1 = x[i].qs[j] >> 4;
            y[j] = float(x0) * d + m;
            y[j + QK4_1 / 2] = float(x1) * d + m;
        }
    }
}

void dequantize_q5_0(const block_q5_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
        const float d = fp16_to_fp32(x[i].d);
        const uint32_t qh = load_qh32(x[i].qh);
        for (int j = 0; j < QK5_0 / 2; ++j) {
            const int h0 = int((qh >> j) << 4) & 0x10;
            const int h1 = int(qh >> (j + 12)) & 0x10;
            const int x0 = ((x[i].qs[j] & 0x0F) | h0) - 16;
            const int x1 = ((x[i].qs[j] >> 4) | h1) - 16;
            y[j] = float(x0) * d;
            y[j + QK5_0 / 2] = float(x1) * d;
        }
    }
}

void dequantize_q5_1(const block_q5_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
        const float d = fp16_to_fp32(x[i].d);
        const float m = fp16_to_fp32(x[i].m);
        const uint32_t qh = load_qh32(x[i].qh);
        for (int j = 0; j < QK5_1 / 2; ++j) {
            const int h0 = int((qh >> j) << 4) & 0x10;
            const int h1 = int(qh >> (j + 12)) & 0x10;
            const int x0 = (x[i].qs[j] & 0x0F) | h0;
            const int x1 = (x[i].qs[j] >> 4) | h1;
            y[j] = float(x0) * d + m;
            y[j + QK5_1 / 2] = float(x1) * d + m;
        }
    }
}

void dequantize_q8_0(const block_q8_0* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_0; ++j) y[j] = float(x[i].qs[j]) * d;
    }
}

void dequantize_q8_1(const block_q8_1* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK8_1) {
        const float d = fp16_to_fp32(x[i].d);
        for (int j = 0; j < QK8_1; ++j) y[j] = float(x[i].qs[j]) * d;
    }
}

// Elements come in two halves of 128; within a half, 2-bit plane p (bits 2p)
// of qs[0..31] holds elements 32p..32p+31, each run of 16 with its own scale.
void dequantize_q2_K(const block_q2_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        const uint8_t* q = x[i].qs;
        int is = 0;
        for (int half = 0; half < QK_K / 128; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int run = 0; run < 2; ++run) {
                    const uint8_t sc = x[i].scales[is++];
                    const float dl = d * float(sc & 0xF);
                    const float ml = dmin * float(sc >> 4);
                    for (int l = 0; l < 16; ++l) {
                        *y++ = dl * float((q[16 * run + l] >> shift) & 3) - ml;
                    }
                }
            }
        }
    }
}

// As q2_K for the low two bits; the third bit of element e of a half is bit
// (4 * half + plane) of hmask[e % 32], and a clear bit means "subtract 4".
void dequantize_q3_K(const block_q3_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d_all = fp16_to_fp32(x[i].d);
        const uint8_t* q = x[i].qs;
        const uint8_t* hm = x[i].hmask;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < QK_K / 128; ++half, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1)) {
                for (int run = 0; run < 2; ++run) {
                    const float dl = d_all * float(unpack_scale_q3_k(is++, x[i].scales));
                    for (int l = 16 * run; l < 16 * run + 16; ++l) {
                        const int v = ((q[l] >> shift) & 3) - ((hm[l] & m) ? 0 : 4);
                        *y++ = dl * float(v);
                    }
                }
            }
        }
    }
}

// Four runs of 64: low nibbles of qs[32r..32r+31] with scale 2r, high nibbles
// with scale 2r+1.
void dequantize_q4_K(const block_q4_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        const uint8_t* q = x[i].qs;
        for (int is = 0; is < QK_K / 32; is += 2, q += 32) {
            uint8_t sc, mn;
            unpack_scale_min_k4(is, x[i].scales, &sc, &mn);
            const float d1 = d * float(sc), m1 = dmin * float(mn);
            unpack_scale_min_k4(is + 1, x[i].scales, &sc, &mn);
            const float d2 = d * float(sc), m2 = dmin * float(mn);
            for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
        }
    }
}

// As q4_K; the fifth bit of sub-block s (element l of it) is bit s of qh[l].
void dequantize_q5_K(const block_q5_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const float dmin = fp16_to_fp32(x[i].dmin);
        const uint8_t* ql = x[i].qs;
        const uint8_t* qh = x[i].qh;
        for (int is = 0; is < QK_K / 32; is += 2, ql += 32) {
            uint8_t sc, mn;
            unpack_scale_min_k4(is, x[i].scales, &sc, &mn);
            const float d1 = d * float(sc), m1 = dmin * float(mn);
            unpack_scale_min_k4(is + 1, x[i].scales, &sc, &mn);
            const float d2 = d * float(sc), m2 = dmin * float(mn);
            const uint8_t u1 = uint8_t(1u << is), u2 = uint8_t(2u << is);
            for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

// Per half of 128 elements, ql has 64 bytes and qh 32: element l + 32p (p =
// 0..3) takes the low (p even) or high (p odd) nibble of ql[l + 32 * (p & 1)]
// and bits 2p..2p+1 of qh[l]. The scale is element / 16.
void dequantize_q6_K(const block_q6_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i) {
        const float d = fp16_to_fp32(x[i].d);
        const uint8_t* ql = x[i].ql;
        const uint8_t* qh = x[i].qh;
        const int8_t* sc = x[i].scales;
        for (int half = 0; half < QK_K / 128; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; ++l) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
                const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
                const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
                y[l + 0] = d * float(sc[is + 0]) * float(q1);
                y[l + 32] = d * float(sc[is + 2]) * float(q2);
                y[l + 64] = d * float(sc[is + 4]) * float(q3);
                y[l + 96] = d * float(sc[is + 6]) * float(q4);
            }
        }
    }
}

void dequantize_q8_K(const block_q8_K* x, float* y, int64_t nb) {
    for (int64_t i = 0; i < nb; ++i, y += QK_K) {
        for (int j = 0; j < QK_K; ++j) y[j] = x[i].d * float(x[i].qs[j]);
    }
}

}  // namespace tern::quant::ref
