// Activation quantization to block_q8a: the scalar reference and the run-time
// choice of path. The rounding is written without roundf so that a SIMD
// version can reproduce it operation for operation: truncate, then step away
// from zero when the dropped fraction is at least one half. Both steps are
// exact in float for |t| <= 127, so this equals roundf(t) there.
#include "quant/act_quant.h"

#include "base/fp16.h"
#include "quant/dot_internal.h"

namespace tern::quant {

namespace {

// round-half-away-from-zero of t, after clamping to [-127, 127] (a NaN
// becomes -127 so the conversion below is always defined).
int8_t round_clamp_q8(float t) {
    if (!(t >= -127.0f)) t = -127.0f;
    if (t > 127.0f) t = 127.0f;
    const int32_t toward_zero = int32_t(t);
    const float frac = t - float(toward_zero);
    int32_t q = toward_zero;
    if (frac >= 0.5f) q += 1;
    if (frac <= -0.5f) q -= 1;
    return int8_t(q);
}

}  // namespace

namespace {

float amax_of(const float* x, int64_t n) {
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
        const float ax = x[i] < 0.0f ? -x[i] : x[i];
        if (ax > amax) amax = ax;  // a NaN never compares greater: ignored
    }
    return amax;
}

// One block's values and sum on the scale d.
void quantize_block_on(const float* x, float d, block_q8a* y) {
    y->d = d;
    int32_t sum = 0;
    for (int i = 0; i < QK8A; ++i) {
        const int8_t q = d == 0.0f ? int8_t(0) : round_clamp_q8(x[i] / d);
        y->qs[i] = q;
        sum += q;
    }
    y->sum = sum;
}

}  // namespace

void quantize_act_block_ref(const float* x, block_q8a* y) { quantize_block_on(x, amax_of(x, QK8A) / 127.0f, y); }

void quantize_act_row_grouped(const float* x, block_q8a* y, int64_t k) {
    const int64_t blocks = k / QK8A;
    for (int64_t g = 0; g < blocks; g += kActGroupBlocks) {
        const int64_t n = blocks - g < kActGroupBlocks ? blocks - g : kActGroupBlocks;
        const float d = amax_of(x + g * QK8A, n * QK8A) / 127.0f;
        for (int64_t b = g; b < g + n; ++b) quantize_block_on(x + b * QK8A, d, y + b);
    }
}

void split_block_sums(const block_q8a* y, int64_t blocks, uint16_t* out) {
    const int64_t groups = (blocks + kActGroupBlocks - 1) / kActGroupBlocks;
    for (int64_t b = 0; b < groups * kActGroupBlocks; ++b) {  // a ragged last group padded with zeros
        const int32_t s = b < blocks ? y[b].sum : 0;
        uint16_t* g = out + b / kActGroupBlocks * kSplitSumsPerGroup;
        g[b % kActGroupBlocks] = fp32_to_fp16(float(s >> 6));
        g[kActGroupBlocks + b % kActGroupBlocks] = fp32_to_fp16(float(s & 63));
    }
}

namespace detail {
void quantize_act_row_scalar(const float* x, block_q8a* y, int64_t k) {
    for (int64_t b = 0; b < k / QK8A; ++b) quantize_act_block_ref(x + b * QK8A, y + b);
}
}  // namespace detail

void quantize_act_row(const float* x, block_q8a* y, int64_t k, SimdPath path) {
    const detail::PathKernels* kernels = detail::path_kernels_scalar();
    if (path == SimdPath::avx2 && simd_path_available(path)) kernels = detail::path_kernels_avx2();
    if (path == SimdPath::avx512 && simd_path_available(path)) kernels = detail::path_kernels_avx512();
    kernels->quantize_act(x, y, k);
}

void quantize_act_row(const float* x, block_q8a* y, int64_t k) {
    quantize_act_row(x, y, k, simd_path_best());
}

}  // namespace tern::quant
