// The AVX2 path: the shared x86 kernels (dot_x86_body.h) with bytes
// multiplied by vpmaddubsw + vpmaddwd. Compiled with -mavx2 -mfma -mf16c
// (src/CMakeLists.txt); without those flags this file exports no kernels and
// the path reports itself unavailable, so the library still builds anywhere.
#include "quant/dot_internal.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)

#include <immintrin.h>

namespace tern::quant::detail {
namespace {

// Lane i = sum of u[4i..4i+3] * s[4i..4i+3]; exact while u <= 128 (no int16 saturation).
inline __m256i mul_sum_u8s8(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// acc + mul_sum_u8s8(u, s).
inline __m256i mul_sum_u8s8_acc(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(acc, mul_sum_u8s8(u, s));
}

// Sum of mul_sum_u8s8(u[i], s[i]) over i < 4, exact while u <= 32: the int16
// pair sums then total at most 4 * 2 * 32 * 127 = 32512, so they are added
// as int16 and widened once.
inline __m256i mul_sum4_u8s8(const __m256i* u, const __m256i* s) {
    const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(u[0], s[0]), _mm256_maddubs_epi16(u[1], s[1]));
    const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(u[2], s[2]), _mm256_maddubs_epi16(u[3], s[3]));
    return _mm256_madd_epi16(_mm256_add_epi16(p01, p23), _mm256_set1_epi16(1));
}

// Byte j = value where bit j of bits is set.
inline __m256i expand_bits32(uint32_t bits, char value) {
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(int(bits)),
        _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201ull));
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(value));
}

// Byte j = value where bit `bit` of v's byte j is set.
inline __m256i select_bit(__m256i v, int bit, char value) {
    const __m256i m = _mm256_set1_epi8(char(1u << bit));
    return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(v, m), m), _mm256_set1_epi8(value));
}

}  // namespace
}  // namespace tern::quant::detail

#include "quant/dot_x86_body.h"
#include "quant/dot_x86_tokens.h"

namespace tern::quant::detail {
const PathKernels* path_kernels_avx2() { return &kX86Kernels; }
}  // namespace tern::quant::detail

#else

namespace tern::quant::detail {
const PathKernels* path_kernels_avx2() { return nullptr; }
}  // namespace tern::quant::detail

#endif
