// GELU's own tanh (cpu::tanh_fdlibm, gelu.cpp) against the C library's tanhf
// where that is the algorithm it reproduces (glibc 2.36, Debian 12), and the
// AVX2 GEGLU against the portable one bit for bit over random, extreme and
// threshold inputs and ragged lengths. TERN_GELU_EXHAUSTIVE=1 checks tanh and
// expm1 on every one of the 2^32 floats (about a minute on two cores).
#include <gtest/gtest.h>

#include <gnu/libc-version.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/ops.h"
#include "tests/support/gated_forms.h"
#include "tests/support/test_seed.h"

namespace tern {
namespace {

using backend::cpu::expm1_fdlibm;
using backend::cpu::tanh_fdlibm;

using test::same_float;

bool libm_is_fdlibm() { return std::string(gnu_get_libc_version()) == "2.36"; }

// Values where the algorithm changes form, a few ulps either side, and the extremes.
std::vector<float> edge_values() {
    std::vector<float> v = {0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::min(), std::numeric_limits<float>::denorm_min()};
    for (uint32_t bits : {0x24000000u, 0x3f800000u, 0x41b00000u, 0x33000000u, 0x3eb17218u, 0x3f851591u,
                          0x4195b843u, 0x42b17217u, 0x42b17180u, 0x3e800000u})
        for (int d = -3; d <= 3; ++d)
            for (uint32_t sign : {0u, 0x80000000u}) v.push_back(std::bit_cast<float>((bits + uint32_t(d)) | sign));
    return v;
}

TEST(Gelu, TanhIsTheCLibrarysWhereThatIsFdlibm) {
    if (!libm_is_fdlibm()) {
        std::printf("[   NOTE   ] C library %s is not glibc 2.36: tanh_fdlibm is checked against a double tanh only\n",
                    gnu_get_libc_version());
    }
    std::mt19937 rng(test::run_seed());
    std::vector<float> xs = edge_values();
    // Every 4099th bit pattern (a million floats over every exponent), and random ones.
    for (uint64_t b = 0; b < (uint64_t(1) << 32); b += 4099) xs.push_back(std::bit_cast<float>(uint32_t(b)));
    for (int i = 0; i < 200000; ++i) xs.push_back(std::bit_cast<float>(uint32_t(rng())));
    int checked = 0;
    for (float x : xs) {
        const float t = tanh_fdlibm(x);
        if (libm_is_fdlibm()) {
            ASSERT_TRUE(same_float(t, std::tanh(x))) << "tanh(" << x << ") bits " << std::hex << std::bit_cast<uint32_t>(x);
            ASSERT_TRUE(same_float(expm1_fdlibm(x), std::expm1(x))) << "expm1(" << x << ")";
        }
        if (!std::isfinite(x)) continue;
        // Within two and a half ulps of the true value, whatever the library.
        const double want = std::tanh(double(x));
        ASSERT_LE(std::fabs(double(t) - want), 2.5 * std::ldexp(1.0, std::ilogb(want == 0 ? 1e-300 : want) - 23) + 1e-45)
            << "tanh(" << x << ") = " << t << ", want " << want;
        ++checked;
    }
    EXPECT_GT(checked, 1000000);
}

TEST(Gelu, Avx2GivesThePortableBits) {
    if (!quant::simd_path_available(quant::SimdPath::avx2)) {
        std::printf("[   NOTE   ] no AVX2 on this CPU: only the portable GELU runs\n");
        return;
    }
    std::mt19937 rng(test::run_seed() + 1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const std::vector<float> edges = edge_values();
    test::expect_avx2_gives_portable_bits(
        backend::cpu::geglu,
        [&](std::mt19937& r) {
            switch (r() % 4) {
                case 0: return nd(r);
                case 1: return nd(r) * 8.0f;
                case 2: return edges[r() % edges.size()];
                default: return std::bit_cast<float>(uint32_t(r()));
            }
        },
        [](float, float, float) {}, rng);
}

TEST(Gelu, EveryFloat) {
    if (!std::getenv("TERN_GELU_EXHAUSTIVE")) GTEST_SKIP() << "set TERN_GELU_EXHAUSTIVE=1 to check all 2^32 floats";
    if (!libm_is_fdlibm()) GTEST_SKIP() << "the C library is not glibc 2.36";
    uint64_t bad = 0;
#pragma omp parallel for reduction(+ : bad) schedule(static)
    for (int64_t hi = 0; hi < 65536; ++hi)
        for (uint32_t lo = 0; lo < 65536; ++lo) {
            const float x = std::bit_cast<float>(uint32_t(hi) << 16 | lo);
            bad += !same_float(tanh_fdlibm(x), std::tanh(x)) + !same_float(expm1_fdlibm(x), std::expm1(x));
        }
    EXPECT_EQ(bad, 0u);
}

}  // namespace
}  // namespace tern
