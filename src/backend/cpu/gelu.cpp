// GELU's tanh, owned: tanh_fdlibm gives the bits of the single-precision
// fdlibm algorithm, which is what Debian 12's C library (glibc 2.36) returns
// from tanhf on x86-64, so the recorded outputs (made with that tanhf, and
// matching llama.cpp's) do not change with the C library a build links
// against (glibc 2.41 replaced tanhf with a correctly rounded one). Its AVX2
// form gives the same bits eight lanes at a time: every lane computes every
// branch and blends pick one. Checked against the C library's tanhf on every
// float (tests/unit/test_gelu.cpp, TERN_GELU_EXHAUSTIVE=1).
//
// The algorithm:
//   tanh(x):  |x| >= 22        -> +-(1 - tiny)
//             1 <= |x| < 22    -> +-(1 - 2 / (expm1(2|x|) + 2))
//             2^-55 <= |x| < 1 -> +-(-t / (t + 2)),  t = expm1(-2|x|)
//             |x| < 2^-55      -> x * (1 + x)
//   expm1(x): x = k*ln2 + r with ln2 split into hi/lo parts (k = 0 and k = +-1
//             bands are special-cased), a rational correction in r*r/2, then
//             a reconstruction of 2^k * (1 + expm1(r)) - 1 whose exact form
//             depends on k so that no cancellation is lost.
// Each float operation below is one of that algorithm's, in its order (the
// file is built without fused multiply-adds, like every CPU op). Comparisons
// are on the integer bit patterns, so denormals-are-zero does not change them.
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include <bit>
#include <cstdint>

#include "backend/cpu/ops.h"

#ifdef __FAST_MATH__
#error "gelu.cpp must not be built with -ffast-math: its results must be exact"
#endif

namespace tern::backend::cpu {
namespace {

constexpr float f32(uint32_t bits) { return std::bit_cast<float>(bits); }
inline uint32_t u32(float x) { return std::bit_cast<uint32_t>(x); }

// fdlibm constants, given by bit pattern to rule out any decimal round-trip.
constexpr float kLn2Hi = f32(0x3f317180);       // 6.9313812256e-01
constexpr float kLn2Lo = f32(0x3717f7d1);       // 9.0580006145e-06
constexpr float kInvLn2 = f32(0x3fb8aa3b);      // 1.4426950216e+00
constexpr float kOThreshold = f32(0x42b17180);  // 8.8721679688e+01
constexpr float kHuge = f32(0x7149f2ca);        // 1e30
constexpr float kTiny = f32(0x0da24260);        // 1e-30
// expm1 rational-correction coefficients (Q1..Q5).
constexpr float kQ1 = f32(0xbd088889);  // -3.3333335072e-02
constexpr float kQ2 = f32(0x3ad00d01);  //  1.5873016091e-03
constexpr float kQ3 = f32(0xb8a670cd);  // -7.9365076090e-05
constexpr float kQ4 = f32(0x36867e54);  //  4.0082177293e-06
constexpr float kQ5 = f32(0xb457edbb);  // -2.0109921195e-07

// Thresholds on |x| bit patterns.
constexpr uint32_t kExpm1Big = 0x4195b843;   // 27*ln2: expm1(x) == -1 below -this
constexpr uint32_t kExpm1Ovf = 0x42b17217;   // ln(FLT_MAX)
constexpr uint32_t kHalfLn2 = 0x3eb17218;    // 0.5*ln2: k == 0 at or below
constexpr uint32_t kThreeHalfLn2 = 0x3f851591; // 1.5*ln2: k == +-1 at or below
constexpr uint32_t kExpm1Tiny = 0x33000000;  // 2^-25: expm1(x) == x below
constexpr uint32_t kTanhSat = 0x41b00000;    // 22: tanh == +-1 at or above
constexpr uint32_t kTanhOne = 0x3f800000;    // 1
constexpr uint32_t kTanhTiny = 0x24000000;   // 2^-55: tanh(x) == x below

// Keeps the compiler from constant-folding a value, so expressions such as
// 1 - tiny are rounded at run time in the current rounding mode, like libm.
// (Only on rare paths; volatile keeps this portable.)
inline float opaque(float v) {
    volatile float copy = v;
    return copy;
}

}  // namespace

// ---------------------------------------------------------------- scalar ----

float expm1_fdlibm(float x) {
    const uint32_t hx = u32(x);
    const uint32_t ax = hx & 0x7fffffff;
    const bool neg = hx >> 31;

    if (ax > kExpm1Big) {
        if (ax > kExpm1Ovf) {
            if (ax > 0x7f800000) return x + x;                 // NaN
            if (ax == 0x7f800000) return neg ? -1.0f : x;      // +-inf
            if (x > kOThreshold) return opaque(kHuge) * kHuge; // overflow
        }
        if (neg) return opaque(kTiny) - 1.0f;  // -1, inexact
    }

    float hi, lo, c = 0.0f;
    int k;
    if (ax > kHalfLn2) {
        if (ax <= kThreeHalfLn2) {
            if (!neg) { hi = x - kLn2Hi; lo = kLn2Lo; k = 1; }
            else      { hi = x + kLn2Hi; lo = -kLn2Lo; k = -1; }
        } else {
            k = static_cast<int>(kInvLn2 * x + (neg ? -0.5f : 0.5f));  // truncates
            const float t = static_cast<float>(k);
            hi = x - t * kLn2Hi;
            lo = t * kLn2Lo;
        }
        x = hi - lo;
        c = (hi - x) - lo;
    } else if (ax < kExpm1Tiny) {
        const float t = opaque(kHuge) + x;  // x unchanged, inexact raised
        return x - (t - t);
    } else {
        k = 0;
    }

    const float hfx = 0.5f * x;
    const float hxs = x * hfx;
    const float r1 = 1.0f + hxs * (kQ1 + hxs * (kQ2 + hxs * (kQ3 + hxs * (kQ4 + hxs * kQ5))));
    const float t = 3.0f - r1 * hfx;
    float e = hxs * ((r1 - t) / (6.0f - x * t));
    if (k == 0) return x - (x * e - hxs);

    e = (x * (e - c) - c);
    e -= hxs;
    if (k == -1) return 0.5f * (x - e) - 0.5f;
    if (k == 1) {
        if (x < -0.25f) return -2.0f * (e - (x + 0.5f));
        return 1.0f + 2.0f * (x - e);
    }
    const uint32_t scale = static_cast<uint32_t>(k) << 23;  // adds k to the exponent
    if (k <= -2 || k > 56) {
        const float y = 1.0f - (e - x);
        return f32(u32(y) + scale) - 1.0f;
    }
    if (k < 23) {
        const float t1 = f32(0x3f800000 - (0x1000000u >> k));  // 1 - 2^-k
        const float y = t1 - (e - x);
        return f32(u32(y) + scale);
    }
    const float t2 = f32(static_cast<uint32_t>(0x7f - k) << 23);  // 2^-k
    float y = x - (e + t2);
    y += 1.0f;
    return f32(u32(y) + scale);
}

float tanh_fdlibm(float x) {
    const uint32_t hx = u32(x);
    const uint32_t ax = hx & 0x7fffffff;
    const bool neg = hx >> 31;

    if (ax >= 0x7f800000) return neg ? 1.0f / x - 1.0f : 1.0f / x + 1.0f;  // +-1, NaN

    float z;
    if (ax < kTanhSat) {
        if (ax == 0) return x;
        if (ax < kTanhTiny) return x * (1.0f + x);
        const float a = f32(ax);
        if (ax >= kTanhOne) {
            const float t = expm1_fdlibm(a + a);
            z = 1.0f - 2.0f / (t + 2.0f);
        } else {
            const float t = expm1_fdlibm(-2.0f * a);
            z = -t / (t + 2.0f);
        }
    } else {
        z = 1.0f - opaque(kTiny);  // 1 (1 - 2^-24 when rounding down / to zero)
    }
    return neg ? -z : z;
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

void detail::geglu_portable(float* gate, const float* up, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        gate[i] = 0.5f * g * (1.0f + tanh_fdlibm(kSqrt2OverPi * (g + kGeluCubic * g * g * g))) * up[i];
    }
}

// ------------------------------------------------------------------ AVX2 ----

#if defined(__x86_64__)
#define GELU_AVX2 __attribute__((target("avx2")))
#define GELU_AVX2_INLINE __attribute__((target("avx2"), always_inline)) inline

namespace {

GELU_AVX2_INLINE __m256 bits_ps(__m256i v) { return _mm256_castsi256_ps(v); }
GELU_AVX2_INLINE __m256i bits_i(__m256 v) { return _mm256_castps_si256(v); }
GELU_AVX2_INLINE __m256 splat(float v) { return _mm256_set1_ps(v); }
GELU_AVX2_INLINE __m256i splat_i(uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); }
// Lane mask (all ones / zero) as float, for blendv: a > c, signed. Masks are
// only ever built in this form: GCC turns c > a into min + compare-equal.
GELU_AVX2_INLINE __m256 gt_i(__m256i a, uint32_t c) {
    return bits_ps(_mm256_cmpgt_epi32(a, splat_i(c)));
}
GELU_AVX2_INLINE __m256 select(__m256 mask, __m256 if_true, __m256 if_false) {
    return _mm256_blendv_ps(if_false, if_true, mask);
}

// expm1 restricted to the arguments tanh produces: u in [2, 44) (from 2|x|,
// 1 <= |x| < 22) and u in (-2, 0] (from -2|x|, |x| < 1, or 0 for unused
// lanes). That leaves out the k == +1 band (0.5*ln2 < u <= 1.5*ln2),
// u <= -27*ln2, overflow, inf and NaN, which only the scalar expm1_fdlibm handles.
// Positive k reaches 63 here, so every reconstruction form for k >= 2 and
// k <= -1 is needed. Every lane evaluates every form; blends pick one.
GELU_AVX2_INLINE __m256 expm1_tanh_domain8(__m256 u) {
    const __m256i ui = bits_i(u);
    const __m256i au = _mm256_and_si256(ui, splat_i(0x7fffffff));
    const __m256 m_not_tiny = gt_i(au, kExpm1Tiny - 1);
    const __m256 m_not_k0 = gt_i(au, kHalfLn2);
    const __m256 m_not_k1 = gt_i(au, kThreeHalfLn2);

    // k = trunc(u*invln2 +- 0.5) as in libm (truncating in float is the same
    // as its int conversion since |k| <= 64 here); the bands near zero get
    // k = 0 and k = sign(u) regardless of that formula.
    const __m256 u_sign = bits_ps(_mm256_and_si256(ui, splat_i(0x80000000)));
    const __m256 t_k = _mm256_add_ps(_mm256_mul_ps(u, splat(kInvLn2)), _mm256_or_ps(splat(0.5f), u_sign));
    const __m256 k_small = _mm256_and_ps(m_not_k0, _mm256_or_ps(splat(1.0f), u_sign));  // 0 or +-1
    const __m256 kf =
        select(m_not_k1, _mm256_round_ps(t_k, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC), k_small);
    const __m256i k = _mm256_cvttps_epi32(kf);

    // With k in {0, +-1}, k*ln2hi and k*ln2lo are exact, so this single form
    // reproduces libm's special-cased reductions: hi = u -+ ln2hi, or hi = u
    // and lo = 0 (giving x == u, c == 0) when k == 0. Lanes that return u
    // unchanged reduce 0 instead, so no denormals reach the polynomial (they
    // would cost microcode assists).
    const __m256 u_red = _mm256_and_ps(m_not_tiny, u);
    const __m256 hi = _mm256_sub_ps(u_red, _mm256_mul_ps(kf, splat(kLn2Hi)));
    const __m256 lo = _mm256_mul_ps(kf, splat(kLn2Lo));
    const __m256 x = _mm256_sub_ps(hi, lo);
    const __m256 c = _mm256_sub_ps(_mm256_sub_ps(hi, x), lo);

    const __m256 hfx = _mm256_mul_ps(splat(0.5f), x);
    const __m256 hxs = _mm256_mul_ps(x, hfx);
    __m256 r1 = _mm256_mul_ps(hxs, splat(kQ5));
    r1 = _mm256_mul_ps(hxs, _mm256_add_ps(splat(kQ4), r1));
    r1 = _mm256_mul_ps(hxs, _mm256_add_ps(splat(kQ3), r1));
    r1 = _mm256_mul_ps(hxs, _mm256_add_ps(splat(kQ2), r1));
    r1 = _mm256_mul_ps(hxs, _mm256_add_ps(splat(kQ1), r1));
    r1 = _mm256_add_ps(splat(1.0f), r1);
    const __m256 t = _mm256_sub_ps(splat(3.0f), _mm256_mul_ps(r1, hfx));
    const __m256 e0 = _mm256_mul_ps(
        hxs, _mm256_div_ps(_mm256_sub_ps(r1, t), _mm256_sub_ps(splat(6.0f), _mm256_mul_ps(x, t))));

    // k == 0.
    const __m256 r_k0 = _mm256_sub_ps(x, _mm256_sub_ps(_mm256_mul_ps(x, e0), hxs));

    // k != 0: fold the reduction error c back in.
    __m256 e = _mm256_sub_ps(_mm256_mul_ps(x, _mm256_sub_ps(e0, c)), c);
    e = _mm256_sub_ps(e, hxs);

    // k == -1.
    const __m256 r_km1 = _mm256_sub_ps(_mm256_mul_ps(_mm256_sub_ps(x, e), splat(0.5f)), splat(0.5f));

    // 2 <= k <= 22:  y = (1 - 2^-k) - (e - x)             result 2^k*y
    // 23 <= k <= 56: y = (x - (e + 2^-k)) + 1             result 2^k*y
    // otherwise:     y = 1 - (e - x)                      result 2^k*y - 1
    const __m256 m_above56 = gt_i(k, 56);
    const __m256 m_2_to_56 = _mm256_andnot_ps(m_above56, gt_i(k, 1));
    const __m256 m_23_to_56 = _mm256_andnot_ps(m_above56, gt_i(k, 22));
    // 1 - 2^-k for 2 <= k <= 22. srlv yields 0 for shift counts >= 32 and for
    // negative k (huge unsigned counts), so this is exactly 1.0 for every
    // other k that takes the y_low form; k in {0, +-1, 23, 24} lanes differ
    // but are replaced below.
    const __m256 one_minus_2mk =
        bits_ps(_mm256_sub_epi32(splat_i(0x3f800000), _mm256_srlv_epi32(splat_i(0x1000000), k)));
    const __m256 two_mk = bits_ps(_mm256_slli_epi32(_mm256_sub_epi32(splat_i(0x7f), k), 23));
    const __m256 y_low = _mm256_sub_ps(one_minus_2mk, _mm256_sub_ps(e, x));
    const __m256 y_mid = _mm256_add_ps(_mm256_sub_ps(x, _mm256_add_ps(e, two_mk)), splat(1.0f));
    const __m256 y = select(m_23_to_56, y_mid, y_low);
    const __m256 scaled = bits_ps(_mm256_add_epi32(bits_i(y), _mm256_slli_epi32(k, 23)));
    const __m256 r_k = select(m_2_to_56, scaled, _mm256_sub_ps(scaled, splat(1.0f)));

    // Blend the early results first so r_k, ready last, needs one blend.
    const __m256 r_small = select(m_not_k0, r_km1, select(m_not_tiny, r_k0, u));
    return select(m_not_k1, r_k, r_small);
}

GELU_AVX2_INLINE __m256 tanh8_inline(__m256 x, __m256 one_minus_tiny) {
    const __m256i xi = bits_i(x);
    const __m256i ax = _mm256_and_si256(xi, splat_i(0x7fffffff));
    const __m256 sign = bits_ps(_mm256_and_si256(xi, splat_i(0x80000000)));
    const __m256 a = bits_ps(ax);

    const __m256 m_big = gt_i(ax, kTanhOne - 1);           // |x| >= 1
    const __m256 m_sat = gt_i(ax, kTanhSat - 1);           // |x| >= 22, inf, NaN
    const __m256 m_not_tiny = gt_i(ax, kTanhTiny - 1);     // |x| >= 2^-55
    const __m256 m_inf = gt_i(ax, 0x7f7fffff);             // inf, NaN
    const __m256 m_nan = gt_i(ax, 0x7f800000);

    const __m256 m_expm1 = _mm256_andnot_ps(m_sat, m_not_tiny);  // 2^-55 <= |x| < 22

    // Lanes outside m_expm1 depend on x alone: +-1 (inf), +-(1 - tiny)
    // (libm's value for finite |x| >= 22; the two differ when rounding down
    // or toward zero), x * (1 + x), or the quieted NaN. Built off the
    // critical path so the long expm1/divide chain ends in a single blend.
    __m256 direct = _mm256_xor_ps(select(m_inf, splat(1.0f), one_minus_tiny), sign);
    direct = select(m_not_tiny, direct, _mm256_mul_ps(x, _mm256_add_ps(splat(1.0f), x)));
    direct = select(m_nan, _mm256_add_ps(x, x), direct);

    // One expm1 serves both ranges: 2|x| for |x| >= 1, -2|x| below. Other
    // lanes get u = 0 (cheap, no denormals).
    __m256 u = select(m_big, _mm256_add_ps(a, a), _mm256_mul_ps(a, splat(-2.0f)));
    u = _mm256_and_ps(m_expm1, u);
    const __m256 t = expm1_tanh_domain8(u);

    // Both forms share the denominator t + 2, so a single division serves:
    // |x| >= 1: 1 - 2/(t+2);  |x| < 1: -t/(t+2).
    const __m256 d = _mm256_add_ps(t, splat(2.0f));
    const __m256 neg_t = _mm256_xor_ps(t, splat(-0.0f));
    const __m256 q = _mm256_div_ps(select(m_big, splat(2.0f), neg_t), d);
    const __m256 z = _mm256_xor_ps(select(m_big, _mm256_sub_ps(splat(1.0f), q), q), sign);
    return select(m_expm1, z, direct);
}

GELU_AVX2_INLINE __m256 one_minus_tiny8() {
    __m256 tiny = splat(kTiny);
    asm("" : "+x"(tiny));  // not foldable, like opaque(); hoisted out of loops
    return _mm256_sub_ps(splat(1.0f), tiny);
}

GELU_AVX2_INLINE __m256 geglu8(__m256 g, __m256 up, __m256 one_minus_tiny) {
    // Same association and operand order as the scalar reference, so even
    // the NaN payload that propagates matches (x86 returns the first NaN
    // operand of a binary op).
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(splat(kGeluCubic), g), g), g);
    const __m256 arg = _mm256_mul_ps(_mm256_add_ps(g3, g), splat(kSqrt2OverPi));
    const __m256 th = tanh8_inline(arg, one_minus_tiny);
    const __m256 h = _mm256_mul_ps(g, splat(0.5f));
    return _mm256_mul_ps(_mm256_mul_ps(h, _mm256_add_ps(th, splat(1.0f))), up);
}

}  // namespace

GELU_AVX2 void detail::geglu_avx2(float* gate, const float* up, int64_t n) {
    const __m256 one_minus_tiny = one_minus_tiny8();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 u = _mm256_loadu_ps(up + i);
        _mm256_storeu_ps(gate + i, geglu8(g, u, one_minus_tiny));
    }
    if (i < n) {
        // Masked tail: inactive lanes load 0 and are never stored.
        const __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)),
                                                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 g = _mm256_maskload_ps(gate + i, mask);
        const __m256 u = _mm256_maskload_ps(up + i, mask);
        _mm256_maskstore_ps(gate + i, mask, geglu8(g, u, one_minus_tiny));
    }
}

#endif  // __x86_64__

}  // namespace tern::backend::cpu
