// The CPU backend's small operations against their references: the owned
// expf (expf_glibc, expf.h) against the C library's where that is the
// algorithm it reproduces (glibc 2.36 on a CPU with FMA), against recorded
// values everywhere, and its AVX2 form against the scalar one; SwiGLU's AVX2
// form against the portable one; the f16 row conversion the KV cache stores
// with (every rounding case, NaNs and infinities); RoPE by a table computed
// once a batch against the one-call form; the greedy pick on every path. Fresh random inputs each run,
// outputs poisoned first. TERN_EXPF_EXHAUSTIVE=1 checks expf on every one of
// the 2^32 floats (about twenty seconds on two cores).
#include <gtest/gtest.h>

#include <gnu/libc-version.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/expf.h"
#include "backend/cpu/ops.h"
#include "base/fp16.h"
#include "tests/support/gated_forms.h"
#include "tests/support/test_seed.h"

namespace tern {
namespace {

using backend::cpu::expf_glibc;
using backend::cpu::detail::fp32_row_to_fp16;
using quant::SimdPath;

// Same bits, NaNs included.
bool same(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

// The C library's expf is the algorithm expf_glibc reproduces: glibc 2.36,
// which takes its FMA form where the CPU has FMA and AVX2.
bool libm_expf_is_the_reference() {
    return std::string(gnu_get_libc_version()) == "2.36" && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("avx2");
}

bool avx2() { return quant::simd_path_available(SimdPath::avx2); }

#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) void expf_avx2_row(const float* x, float* y, size_t n) {
    for (size_t i = 0; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, backend::cpu::expf_glibc_avx2(_mm256_loadu_ps(x + i)));
}
#endif

// expf_glibc(x) = want, recorded from glibc 2.36 on x86-64 with FMA: where
// the form changes, the overflow, underflow and subnormal edges, and plain values.
constexpr uint32_t kExpfRecorded[][2] = {
    {0x00000000u, 0x3f800000u}, {0x80000000u, 0x3f800000u}, {0x3f800000u, 0x402df854u},
    {0xbf800000u, 0x3ebc5ab2u}, {0x3f000000u, 0x3fd3094cu}, {0x322bcc77u, 0x3f800000u},
    {0x40490fdbu, 0x41b92025u}, {0x41200000u, 0x46ac14eeu}, {0xc1200000u, 0x383e6bceu},
    {0x41a40000u, 0x4e3eb628u}, {0xc18a0000u, 0x330a7a4fu}, {0x42b00000u, 0x7ef882b7u},
    {0x42b17217u, 0x7f7fff84u}, {0x42b17218u, 0x7f800000u}, {0xc2af0000u, 0x006cb2bcu},
    {0xc2c80000u, 0x0000001bu}, {0xc2cf0000u, 0x00000001u}, {0xc2cfcccdu, 0x00000001u},
    {0xc2d00000u, 0x00000000u}, {0xc2ce8ecfu, 0x00000001u}, {0xc2cff1b4u, 0x00000001u},
    {0x3a83126fu, 0x3f8020c9u}, {0xc0c66666u, 0x3b050034u}, {0x4229ae14u, 0x5e12f19fu},
    {0x3f317218u, 0x40000000u}, {0xbf317218u, 0x3f000000u}, {0x7f800000u, 0x7f800000u},
    {0xff800000u, 0x00000000u}, {0x7fc00000u, 0x7fc00000u}, {0xffc00001u, 0xffc00001u},
};

TEST(CpuOps, ExpfGivesTheRecordedBits) {
    for (const auto& [x, want] : kExpfRecorded)
        EXPECT_EQ(std::bit_cast<uint32_t>(expf_glibc(std::bit_cast<float>(x))), want)
            << "e^" << std::bit_cast<float>(x) << ", x bits " << std::hex << x;
}

TEST(CpuOps, ExpfIsTheCLibrarysWhereThatIsTheReference) {
    const bool reference = libm_expf_is_the_reference();
    if (!reference)
        std::printf("[   NOTE   ] C library %s (or this CPU) is not glibc 2.36 with FMA: expf_glibc is checked "
                    "against a double exp only\n",
                    gnu_get_libc_version());
    std::mt19937 rng(test::run_seed());
    SCOPED_TRACE("seed " + std::to_string(test::run_seed()));
    std::vector<float> xs;
    for (const auto& pair : kExpfRecorded)
        for (int d = -4; d <= 4; ++d) xs.push_back(std::bit_cast<float>(pair[0] + uint32_t(d)));
    // Every 4099th bit pattern (a million floats over every exponent), and random ones.
    for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4099) xs.push_back(std::bit_cast<float>(uint32_t(b)));
    std::uniform_real_distribution<float> softmax_range(-110.0f, 90.0f);
    for (int i = 0; i < 200000; ++i) xs.push_back(i % 2 ? std::bit_cast<float>(uint32_t(rng())) : softmax_range(rng));
    while (xs.size() % 8) xs.push_back(0.0f);
    std::vector<float> vec(xs.size() + 1, 7.0f);
#if defined(__x86_64__)
    if (avx2()) expf_avx2_row(xs.data(), vec.data(), xs.size());
#endif
    int checked = 0;
    for (size_t i = 0; i < xs.size(); ++i) {
        const float x = xs[i], e = expf_glibc(x);
        if (reference) {
            ASSERT_TRUE(same(e, std::exp(x))) << "e^" << x << ", x bits " << std::hex << std::bit_cast<uint32_t>(x);
        }
        if (avx2()) {
            ASSERT_TRUE(same(vec[i], e)) << "AVX2 e^" << x << ": " << vec[i] << " vs " << e;
        }
        if (!std::isfinite(x) || x > 88.7f || x < -87.3f) continue;  // past the normal range
        // Within one ulp of the true value, whatever the library.
        const double want = std::exp(double(x));
        ASSERT_LE(std::fabs(double(e) - want), std::ldexp(1.0, std::ilogb(want) - 23)) << "e^" << x << " = " << e;
        ++checked;
    }
    EXPECT_EQ(vec.back(), 7.0f) << "written past the end";
    EXPECT_GT(checked, 100000);
}

TEST(CpuOps, ExpfEveryFloat) {
    if (!std::getenv("TERN_EXPF_EXHAUSTIVE")) GTEST_SKIP() << "set TERN_EXPF_EXHAUSTIVE=1 to check all 2^32 floats";
    if (!libm_expf_is_the_reference()) GTEST_SKIP() << "the C library is not glibc 2.36 with FMA";
    uint64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (int64_t hi = 0; hi < 65536; ++hi) {
        std::vector<float> x(65536), y(65536);
        for (uint32_t lo = 0; lo < 65536; ++lo) x[lo] = std::bit_cast<float>(uint32_t(hi) << 16 | lo);
#if defined(__x86_64__)
        if (avx2()) expf_avx2_row(x.data(), y.data(), x.size());
#endif
        for (uint32_t lo = 0; lo < 65536; ++lo) {
            const float want = std::exp(x[lo]);
            bad += !same(expf_glibc(x[lo]), want) + (avx2() && !same(y[lo], want));
        }
    }
    EXPECT_EQ(bad, 0u);
}

TEST(CpuOps, SwigluAvx2GivesThePortableBits) {
    if (!avx2()) GTEST_SKIP() << "no AVX2 on this CPU: there is no second form to compare";
    std::mt19937 rng(test::run_seed() + 1);
    SCOPED_TRACE("seed " + std::to_string(test::run_seed()));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    test::expect_avx2_gives_portable_bits(
        backend::cpu::swiglu,
        [&](std::mt19937& r) {
            switch (r() % 4) {
                case 0: return nd(r);
                case 1: return nd(r) * 40.0f;  // e^-g past the special cases' edge
                case 2:  // -g at the recorded edges
                    return std::bit_cast<float>(kExpfRecorded[r() % std::size(kExpfRecorded)][0] ^ 0x80000000u);
                default: return std::bit_cast<float>(uint32_t(r()));
            }
        },
        [](float g, float up, float got) {  // and it is silu(g) * up
            ASSERT_TRUE(same(got, g / (1.0f + expf_glibc(-g)) * up)) << "gate " << g;
        },
        rng);
}

// Floats that reach every branch of the conversion: each exponent from
// below the half subnormals to past the half range, with mantissas at and
// around the rounding boundaries (the dropped bits one below, at and one
// above one half, odd and even kept bits), zeros, infinities, quiet and
// signalling NaNs of both signs; then random bit patterns.
std::vector<float> conversion_cases(std::mt19937& rng) {
    std::vector<uint32_t> bits;
    for (uint32_t sign : {0u, 0x80000000u}) {
        for (uint32_t exp = 90; exp <= 160; ++exp) {
            for (uint32_t kept : {0u, 1u, 2u, 0x3ffu, 0x3feu}) {
                for (int shift : {13, 14, 18, 23}) {  // the normal boundary, and deeper ones for subnormal halves
                    const uint32_t half = 1u << (shift - 1);
                    for (uint32_t dropped : {0u, 1u, half - 1, half, half + 1, (1u << shift) - 1}) {
                        const uint32_t mant = ((kept << shift) | dropped) & 0x7fffffu;
                        bits.push_back(sign | (exp << 23) | mant);
                    }
                }
            }
        }
        for (uint32_t special : {0u, 0x7f800000u, 0x7fc00000u, 0x7f800001u, 0x7fa00000u, 0x7fffffffu, 0x7fc01fffu,
                                 0x477fe000u, 0x477fefffu, 0x477ff000u, 0x38800000u, 0x387fffffu, 0x33000000u,
                                 0x33000001u, 0x32ffffffu, 0x00000001u, 0x007fffffu})
            bits.push_back(sign | special);
    }
    std::uniform_int_distribution<uint32_t> any;
    for (int i = 0; i < 1 << 18; ++i) bits.push_back(any(rng));
    std::vector<float> out;
    out.reserve(bits.size());
    for (uint32_t b : bits) out.push_back(fp32_from_bits(b));
    return out;
}

TEST(CpuOps, Fp32RowToFp16GivesTheBitsOfFp32ToFp16) {
    std::mt19937 rng(test::run_seed());
    SCOPED_TRACE("seed " + std::to_string(test::run_seed()));
    const std::vector<float> cases = conversion_cases(rng);
    for (SimdPath path : {SimdPath::scalar, quant::simd_path_best()}) {
        // Ragged lengths and offsets: the vector body and the scalar tail.
        for (size_t offset : {size_t(0), size_t(3)}) {
            const int64_t n = int64_t(cases.size() - offset);
            std::vector<uint16_t> got(size_t(n) + 1, 0xdeadu);
            fp32_row_to_fp16(cases.data() + offset, got.data(), n, path);
            for (int64_t i = 0; i < n; ++i)
                ASSERT_EQ(got[size_t(i)], fp32_to_fp16(cases[offset + size_t(i)]))
                    << "float bits " << std::hex << fp32_to_bits(cases[offset + size_t(i)]) << " path "
                    << quant::simd_path_name(path);
            EXPECT_EQ(got[size_t(n)], 0xdeadu) << "written past the end";
        }
    }
}

// The greedy pick as the sampler defines it: the first index of the largest
// value above -inf, NaN never chosen; -1 when there is none.
int64_t first_largest(const float* x, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i)
        if (!std::isnan(x[i]) && x[i] != -INFINITY && (best < 0 || x[i] > x[best])) best = i;
    return best;
}

TEST(CpuOps, ArgmaxFirstPicksTheFirstLargestOnEveryPath) {
    constexpr float inf = std::numeric_limits<float>::infinity();
    const float nan = std::numeric_limits<float>::quiet_NaN();
    struct Case {
        std::vector<float> x;
        int64_t want;
    };
    const std::vector<Case> cases = {
        {{}, -1},
        {{nan, 1, 3, 3, nan}, 2},
        {{-inf, -inf}, -1},
        {{nan, nan, -inf}, -1},
        {{-inf, -5}, 1},
        {{-0.0f, 0.0f}, 0},
        {{0.0f, -0.0f}, 0},
        {{1, inf, 2, inf}, 1},
        {{-std::numeric_limits<float>::max()}, 0},
    };
    for (SimdPath path : {SimdPath::scalar, quant::simd_path_best()})
        for (const Case& c : cases)
            EXPECT_EQ(backend::cpu::argmax_first(c.x.data(), int64_t(c.x.size()), path), c.want)
                << "case of " << c.x.size() << " values, path " << quant::simd_path_name(path);

    // A NaN after the largest, in every later position of a vector lane or
    // the tail: a running maximum must not let it through.
    for (int64_t n : {40, 67}) {
        for (int64_t p = 0; p < n; ++p)
            for (int64_t q = p + 1; q < n; ++q) {
                std::vector<float> x(size_t(n), 1.0f);
                x[size_t(p)] = 5.0f;
                x[size_t(q)] = q % 2 ? nan : -nan;
                for (SimdPath path : {SimdPath::scalar, quant::simd_path_best()})
                    ASSERT_EQ(backend::cpu::argmax_first(x.data(), n, path), p)
                        << "n " << n << ", largest at " << p << ", NaN at " << q;
            }
    }

    std::mt19937 rng(test::run_seed());
    SCOPED_TRACE("seed " + std::to_string(test::run_seed()));
    std::normal_distribution<float> logit(0.0f, 4.0f);
    const float specials[] = {nan, -nan, inf, -inf, 0.0f, -0.0f};
    // Ragged lengths around the vector widths, and real vocabularies.
    for (int64_t n : {1, 7, 8, 9, 31, 32, 33, 65, 1000, 32000, 49155, 262149}) {
        for (int trial = 0; trial < 6; ++trial) {
            std::vector<float> row(size_t(n) + 1);
            for (float& v : row) v = logit(rng);
            const float* x = row.data() + (trial & 1);  // unaligned starts too
            float* w = row.data() + (trial & 1);
            std::uniform_int_distribution<int64_t> at(0, n - 1);
            if (trial >= 2) {  // ties of the largest, later and earlier than where it is
                const int64_t top = first_largest(x, n);
                for (int k = 0; k < 3; ++k) w[at(rng)] = x[top];
            }
            if (trial >= 3)  // specials sprinkled, sometimes over the largest
                for (int k = 0; k < 4; ++k) w[at(rng)] = specials[std::uniform_int_distribution<int>(0, 5)(rng)];
            if (trial == 5)  // nothing can be picked
                for (int64_t i = 0; i < n; ++i) w[i] = i % 3 ? -inf : nan;
            const int64_t want = first_largest(x, n);
            for (SimdPath path : {SimdPath::scalar, quant::simd_path_best()})
                ASSERT_EQ(backend::cpu::argmax_first(x, n, path), want)
                    << "n " << n << " trial " << trial << " path " << quant::simd_path_name(path);
        }
    }
}

TEST(CpuOps, RopeByTableGivesTheBitsOfRope) {
    std::mt19937 rng(test::run_seed());
    SCOPED_TRACE("seed " + std::to_string(test::run_seed()));
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::uniform_int_distribution<int32_t> position(0, 40000);
    struct Case {
        int n_heads, head_dim, n_dims;
        bool neox, factors;
        float scale, attn;
    };
    for (const Case c : {Case{4, 64, 64, false, false, 1.0f, 1.0f}, Case{2, 128, 128, true, true, 0.25f, 1.0f},
                         Case{3, 96, 32, true, false, 1.0f, 1.19f}, Case{1, 256, 256, false, true, 0.5f, 1.0f}}) {
        for (int64_t rows : {1, 5, 130}) {
            SCOPED_TRACE("head_dim " + std::to_string(c.head_dim) + " rows " + std::to_string(rows));
            backend::RopeParams p;
            p.n_dims = c.n_dims;
            p.neox = c.neox;
            p.freq_base = c.factors ? 500000.0f : 10000.0f;
            p.freq_scale = c.scale;
            p.attn_factor = c.attn;
            std::vector<float> factors(size_t(c.n_dims / 2));
            for (float& f : factors) f = 1.0f + std::fabs(nd(rng));
            const float* ff = c.factors ? factors.data() : nullptr;
            std::vector<int32_t> pos(static_cast<size_t>(rows));
            for (int32_t& q : pos) q = position(rng);
            std::vector<float> x(size_t(rows * c.n_heads * c.head_dim));
            for (float& v : x) v = nd(rng);

            std::vector<float> want = x;
            backend::cpu::rope(want.data(), rows, c.n_heads, c.head_dim, pos.data(), p, ff);
            // A table for more rows than this call rotates serves it too.
            backend::cpu::RopeTable table;
            std::vector<int32_t> more = pos;
            more.push_back(7);
            backend::cpu::rope_table(more.data(), rows + 1, p, ff, table);
            std::vector<float> got = x;
            backend::cpu::rope_apply(got.data(), rows, c.n_heads, c.head_dim, c.neox, table);
            for (size_t i = 0; i < want.size(); ++i)
                ASSERT_EQ(fp32_to_bits(got[i]), fp32_to_bits(want[i])) << "element " << i;
            // Against the rotation computed from its formula in double: pair i
            // of a head turns by pos * freq_scale * base^(-2i/n_dims) / factor_i.
            const int half = c.n_dims / 2;
            for (int64_t t = 0; t < rows; ++t)
                for (int h = 0; h < c.n_heads; ++h)
                    for (int i = 0; i < half; ++i) {
                        const int a = c.neox ? i : 2 * i, b = c.neox ? i + half : 2 * i + 1;
                        const double theta = double(pos[size_t(t)]) * double(p.freq_scale) *
                                             std::pow(double(p.freq_base), -2.0 * i / c.n_dims) /
                                             (ff ? double(ff[i]) : 1.0);
                        const double co = std::cos(theta) * double(p.attn_factor);
                        const double si = std::sin(theta) * double(p.attn_factor);
                        const size_t at = size_t((t * c.n_heads + h) * c.head_dim);
                        const double x0 = x[at + size_t(a)], x1 = x[at + size_t(b)];
                        const double tol = 1e-5 * (std::fabs(x0) + std::fabs(x1)) + 1e-6;
                        ASSERT_NEAR(want[at + size_t(a)], x0 * co - x1 * si, tol) << "token " << t << " pair " << i;
                        ASSERT_NEAR(want[at + size_t(b)], x0 * si + x1 * co, tol) << "token " << t << " pair " << i;
                    }
            // And the rotation happened: dimensions past n_dims stay, the rest move.
            size_t moved = 0;
            for (size_t i = 0; i < want.size(); ++i) {
                const int d = int(i % size_t(c.head_dim));
                if (d >= c.n_dims) {
                    ASSERT_EQ(fp32_to_bits(want[i]), fp32_to_bits(x[i])) << "element " << i;
                }
                moved += want[i] != x[i];
            }
            EXPECT_GT(moved, want.size() * size_t(c.n_dims) / size_t(c.head_dim) / 2);
        }
    }
}

}  // namespace
}  // namespace tern
