// base/: half and bfloat16 conversions against the compiler's own _Float16
// (an independent implementation) and against exhaustive round trips.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "base/fp16.h"
#include "base/result.h"
#include "tests/support/test_seed.h"

namespace {

using namespace tern;

TEST(Fp16, EveryHalfRoundTripsThroughFloat) {
    for (uint32_t h = 0; h < 0x10000; ++h) {
        const float f = fp16_to_fp32(uint16_t(h));
        if (std::isnan(f)) {
            EXPECT_TRUE(((h >> 10) & 0x1f) == 0x1f && (h & 0x3ff)) << h;
            EXPECT_TRUE(std::isnan(fp16_to_fp32(fp32_to_fp16(f))));
            continue;
        }
        EXPECT_EQ(fp32_to_fp16(f), h) << "half bits " << h;
    }
}

#if defined(__FLT16_MAX__)
TEST(Fp16, MatchesCompilerConversionOnRandomFloats) {
    const unsigned seed = tern::test::run_seed();
    std::mt19937 rng(seed);
    std::uniform_int_distribution<uint32_t> bits;
    for (int i = 0; i < 2'000'000; ++i) {
        // Random bit patterns cover every exponent; clamp most to the half range.
        uint32_t u = bits(rng);
        if (i % 2) u = (u & 0x807fffffu) | ((100u + (u % 60u)) << 23);
        const float f = fp32_from_bits(u);
        if (std::isnan(f)) continue;
        const _Float16 ref = static_cast<_Float16>(f);
        uint16_t ref_bits;
        std::memcpy(&ref_bits, &ref, 2);
        ASSERT_EQ(fp32_to_fp16(f), ref_bits) << "float bits " << u << " seed " << seed;
        ASSERT_EQ(fp16_to_fp32(ref_bits), static_cast<float>(ref)) << "half bits " << ref_bits;
    }
}
#endif

TEST(Bf16, RoundsToNearestEven) {
    EXPECT_EQ(fp32_to_bf16(1.0f), 0x3f80);
    // 1 + 2^-8 lies exactly halfway between two bf16 values: ties go to even.
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f808000u)), 0x3f80);
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f818000u)), 0x3f82);
    EXPECT_EQ(fp32_to_bf16(fp32_from_bits(0x3f808001u)), 0x3f81);
    EXPECT_TRUE(std::isnan(bf16_to_fp32(fp32_to_bf16(NAN))));
    EXPECT_EQ(bf16_to_fp32(0x4049), fp32_from_bits(0x40490000u));
}

TEST(Result, CarriesValueOrError) {
    Result<int> good = 7;
    ASSERT_TRUE(good.ok());
    EXPECT_EQ(*good, 7);
    Result<int> bad = Error{"field 'x' at offset 12: out of range"};
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.error().message, "field 'x' at offset 12: out of range");
    Status s = Error{"nope"};
    EXPECT_FALSE(s.ok());
    EXPECT_EQ(s.message(), "nope");
    EXPECT_TRUE(Status{}.ok());
}

}  // namespace
