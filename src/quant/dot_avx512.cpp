// The AVX-512 path: the shared x86 kernels (dot_x86_body.h) with bytes
// multiplied by VNNI's vpdpbusd and bit planes expanded through mask
// registers (AVX-512 BW/VL). Compiled with -mavx512f -mavx512bw -mavx512vl
// -mavx512vnni (src/CMakeLists.txt); without them it exports no kernels.
#include "quant/dot_internal.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512VNNI__) && \
    defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

namespace tern::quant::detail {
namespace {

// Lane i = sum of u[4i..4i+3] * s[4i..4i+3], in one instruction, exact.
inline __m256i mul_sum_u8s8(__m256i u, __m256i s) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
}

// acc + mul_sum_u8s8(u, s), in the same instruction.
inline __m256i mul_sum_u8s8_acc(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }

// Sum of mul_sum_u8s8(u[i], s[i]) over i < 4 (exact for any u).
inline __m256i mul_sum4_u8s8(const __m256i* u, const __m256i* s) {
    __m256i acc = _mm256_dpbusd_epi32(_mm256_setzero_si256(), u[0], s[0]);
    for (int i = 1; i < 4; ++i) acc = _mm256_dpbusd_epi32(acc, u[i], s[i]);
    return acc;
}

inline __m256i expand_bits32(uint32_t bits, char value) {
    return _mm256_maskz_set1_epi8(__mmask32(bits), value);
}

inline __m256i select_bit(__m256i v, int bit, char value) {
    return _mm256_maskz_set1_epi8(_mm256_test_epi8_mask(v, _mm256_set1_epi8(char(1u << bit))), value);
}

}  // namespace
}  // namespace tern::quant::detail

#include "quant/dot_x86_body.h"
#include "quant/dot_x86_tokens.h"

namespace tern::quant::detail {
const PathKernels* path_kernels_avx512() { return &kX86Kernels; }
}  // namespace tern::quant::detail

#else

namespace tern::quant::detail {
const PathKernels* path_kernels_avx512() { return nullptr; }
}  // namespace tern::quant::detail

#endif
