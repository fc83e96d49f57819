// e^x for floats, owned: expf_glibc gives the bits of the C library's expf
// as Debian 12's glibc (2.36) computes it on an x86-64 CPU with FMA, the
// form it picks on every machine this project runs on; its AVX2 form gives
// the same bits eight lanes at a time. Owning it keeps the CPU's results
// from depending on the C library or on whether the CPU fuses (glibc's form
// for CPUs without FMA rounds differently), and lets the softmax and SwiGLU
// loops run it in vectors. Checked against the C library's expf
// (tests/unit/test_cpu_ops.cpp; every float with TERN_EXPF_EXHAUSTIVE=1).
//
// The algorithm (in double): x/ln2 * 32 = k + r with k an integer (rounded
// by adding 1.5 * 2^52), 2^(k/32) = 2^(k div 32) * T[k mod 32], and
// 2^(r/32) ~= 1 + C2 r + C1 r^2 + C0 r^3, where every multiply-add below is
// one fused operation, as glibc's compiled code has it; then one rounding to
// float. |x| >= 88 (and NaN, infinities) takes the special cases first.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace tern::backend::cpu {
// Internal linkage: this header is compiled both with and without AVX2 and
// FMA enabled, and a copy built for AVX2 must never be the one a portable
// caller gets (as the linker may pick any one of an inline function's copies).
namespace {
namespace expf_detail {

// T[i]: the bits of the double nearest 2^(i/32), less i << 47 (the exponent
// bits the shifted k adds back).
inline constexpr uint64_t kTable[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51, 0x3fef72b83c7d517b,
    0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1, 0x3fef06fe0a31b715, 0x3feef1a7373aa9cb,
    0x3feedea64c123422, 0x3feece086061892d, 0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429,
    0x3feea47eb03a5585, 0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d, 0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069, 0x3fef5818dcfba487, 0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
inline constexpr double kInvLn2x32 = 0x1.71547652b82fep+5;  // 32 / ln 2
inline constexpr double kShift = 0x1.8p+52;                 // rounds to an integer in the low bits
inline constexpr double kC0 = 0x1.c6af84b912394p-20;
inline constexpr double kC1 = 0x1.ebfce50fac4f3p-13;
inline constexpr double kC2 = 0x1.62e42ff0c52d6p-6;
inline constexpr uint32_t kSpecialTop = 0x42b;  // (bits >> 20) & 0x7ff from here on: |x| >= 88, inf, NaN

// The cases glibc takes apart: -inf, NaN and +inf, overflow past ln(2^128),
// underflow below ln(2^-150), and the band just above it, which glibc
// answers with the smallest subnormal; everything else is `regular`.
inline bool special(float x, float& result) {
    const uint32_t bits = std::bit_cast<uint32_t>(x);
    const uint32_t top = (bits >> 20) & 0x7ff;
    if (top < kSpecialTop) return false;
    if (bits == 0xff800000u) result = 0.0f;
    else if (top >= 0x7f8) result = x + x;
    else if (x > 0x1.62e42ep6f) result = INFINITY;
    else if (x < -0x1.9fe368p6f) result = 0.0f;
    else if (x < -0x1.9d1d9ep6f) result = 0x1p-149f;
    else return false;
    return true;
}

inline float regular(float x) {
    const double xd = double(x);
    const double shifted = std::fma(kInvLn2x32, xd, kShift);
    const uint64_t ki = std::bit_cast<uint64_t>(shifted);
    const double kd = shifted - kShift;
    const double r = std::fma(kInvLn2x32, xd, -kd);
    const double s = std::bit_cast<double>(kTable[ki % 32] + (ki << 47));
    const double z = std::fma(r, kC0, kC1);
    const double r2 = r * r;
    double y = std::fma(r, kC2, 1.0);
    y = std::fma(z, r2, y);
    return float(y * s);
}

}  // namespace expf_detail

inline float expf_glibc(float x) {
    float result;
    if (expf_detail::special(x, result)) return result;
    return expf_detail::regular(x);
}

#if defined(__x86_64__)
namespace expf_detail {
// Four regular lanes, in double.
__attribute__((target("avx2,fma"), always_inline)) inline __m128 regular_x4(__m128 x4) {
    const __m256d xd = _mm256_cvtps_pd(x4);
    const __m256d shift = _mm256_set1_pd(kShift), inv_ln2 = _mm256_set1_pd(kInvLn2x32);
    const __m256d shifted = _mm256_fmadd_pd(inv_ln2, xd, shift);
    const __m256i ki = _mm256_castpd_si256(shifted);
    const __m256d kd = _mm256_sub_pd(shifted, shift);
    const __m256d r = _mm256_fmsub_pd(inv_ln2, xd, kd);
    const __m256i t = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kTable),
                                             _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8);
    const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(ki, 47)));
    const __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(kC0), _mm256_set1_pd(kC1));
    const __m256d r2 = _mm256_mul_pd(r, r);
    __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(kC2), _mm256_set1_pd(1.0));
    y = _mm256_fmadd_pd(z, r2, y);
    return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}
}  // namespace expf_detail

// Eight expf_glibc at once; a vector with any lane past |x| >= 88 (rare in
// softmax and SwiGLU) takes the scalar form lane by lane.
__attribute__((target("avx2,fma"), always_inline)) inline __m256 expf_glibc_avx2(__m256 x) {
    using namespace expf_detail;
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(x), 20), _mm256_set1_epi32(0x7ff));
    const __m256i is_special = _mm256_cmpgt_epi32(top, _mm256_set1_epi32(int(kSpecialTop) - 1));
    if (!_mm256_testz_si256(is_special, is_special)) [[unlikely]] {
        alignas(32) float lanes[8];
        _mm256_store_ps(lanes, x);
        for (float& v : lanes) v = expf_glibc(v);
        return _mm256_load_ps(lanes);
    }
    return _mm256_set_m128(regular_x4(_mm256_extractf128_ps(x, 1)), regular_x4(_mm256_castps256_ps128(x)));
}
#endif

}  // namespace
}  // namespace tern::backend::cpu
