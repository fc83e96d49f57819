// quant/: quantize fresh random rows and dequantize them again, for every
// supported type, several value distributions and row lengths; the error
// must stay under the type's stated bound (test_quant_helpers.h). Constant
// and all-zero rows have tighter, exact-style expectations.
#include <algorithm>
#include <random>

#include "test_quant_helpers.h"

namespace {

using namespace tern;
using namespace tern::quant;
using namespace tern::quant::qtest;

enum class Dist { Normal, Uniform, Weights, Tiny, Outliers };

const char* dist_name(Dist d) {
    switch (d) {
        case Dist::Normal: return "normal(0,1)";
        case Dist::Uniform: return "uniform(-1,1)";
        case Dist::Weights: return "normal(0,0.02)";
        case Dist::Tiny: return "normal(0,1e-3)";
        case Dist::Outliers: return "normal with 1% x50 outliers";
    }
    return "?";
}

std::vector<float> draw(Dist d, size_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f), unit(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) {
        switch (d) {
            case Dist::Normal: v = normal(rng); break;
            case Dist::Uniform: v = uniform(rng); break;
            case Dist::Weights: v = 0.02f * normal(rng); break;
            case Dist::Tiny: v = 1e-3f * normal(rng); break;
            case Dist::Outliers: v = normal(rng) * (unit(rng) < 0.01f ? 50.0f : 1.0f); break;
        }
    }
    return x;
}

// Quantizes n_rows rows of row_len values one row at a time and returns the
// relative RMSE over all of them.
double roundtrip_error(TensorType t, Dist d, int64_t row_len, int64_t n_rows, std::mt19937& rng) {
    std::vector<float> all_x, all_y;
    for (int64_t r = 0; r < n_rows; ++r) {
        const std::vector<float> x = draw(d, size_t(row_len), rng);
        const std::vector<float> y = dequantize(t, quantize(t, x), row_len);
        all_x.insert(all_x.end(), x.begin(), x.end());
        all_y.insert(all_y.end(), y.begin(), y.end());
    }
    return relative_rmse(all_x, all_y);
}

TEST(QuantRoundTrip, ErrorWithinTypeBound) {
    std::mt19937 rng(test_seed());
    for (const TypeCase& c : all_type_cases()) {
        for (const int64_t blocks_per_row : {1, 3, 64}) {
            const int64_t row_len = blocks_per_row * c.block;
            // Enough rows for at least 16k values, so the error is a stable average.
            const int64_t n_rows = std::max<int64_t>(1, (16384 + row_len - 1) / row_len);
            for (Dist d : {Dist::Normal, Dist::Uniform, Dist::Weights, Dist::Tiny, Dist::Outliers}) {
                SCOPED_TRACE(type_name(c.type) + ", " + dist_name(d) + ", row of " +
                             std::to_string(row_len) + ", seed " + std::to_string(test_seed()));
                const double bound = d == Dist::Outliers ? c.outlier_bound : c.bound;
                const double err = roundtrip_error(c.type, d, row_len, n_rows, rng);
                if (bound == 0.0) {
                    EXPECT_EQ(err, 0.0);
                } else {
                    EXPECT_LT(err, bound);
                    // A quantizer that returned its input would pass the bound
                    // trivially; every lossy type loses something on random data.
                    EXPECT_GT(err, bound / 20);
                }
            }
        }
    }
}

TEST(QuantRoundTrip, ConstantRowsComeBackNearlyExact) {
    // A constant block is representable up to the f16 rounding of its scales
    // (bf16 rounding for bf16); two stacked scales at most double it. That
    // holds while the scales are normal f16 numbers: below 6.1e-5 their
    // precision is absolute (a q5_K row of 0.01 has a scale unit of 5.5e-6,
    // rounded to 2^-24, about 0.5%), so magnitudes start at 1.
    std::mt19937 rng(test_seed() + 1);
    std::uniform_real_distribution<float> mag(1.0f, 100.0f);
    for (const TypeCase& c : all_type_cases()) {
        const double tol = c.type == TensorType::F32 ? 0.0
                           : c.type == TensorType::BF16 ? 1.0 / 256 : 1.0 / 1024;
        for (int trial = 0; trial < 8; ++trial) {
            const float value = (trial % 2 ? -1.0f : 1.0f) * mag(rng);
            SCOPED_TRACE(type_name(c.type) + ", constant " + std::to_string(value));
            const std::vector<float> x(size_t(4 * c.block), value);
            const std::vector<float> y = dequantize(c.type, quantize(c.type, x), int64_t(x.size()));
            for (size_t i = 0; i < x.size(); ++i) {
                ASSERT_LE(std::fabs(double(y[i]) - value), tol * std::fabs(value)) << "element " << i;
            }
        }
    }
}

TEST(QuantRoundTrip, ZerosStayExactlyZero) {
    for (const TypeCase& c : all_type_cases()) {
        SCOPED_TRACE(type_name(c.type));
        const std::vector<float> x(size_t(2 * c.block), 0.0f);
        const std::vector<uint8_t> q = quantize(c.type, x);
        for (float v : dequantize(c.type, q, int64_t(x.size()))) ASSERT_EQ(v, 0.0f);
    }
}

TEST(QuantRoundTrip, ZeroSubBlocksInsideNonzeroData) {
    // K-quant searches treat all-zero sub-blocks specially; they must come
    // back as zeros for the symmetric formats and within one step for the rest.
    // 32 segments of two super-blocks, each with the same zero runs: the type's
    // bound is a relative RMSE over at least 16k values (ErrorWithinTypeBound),
    // and one segment's 512 values scatter too widely around it.
    constexpr size_t kSegment = 512, kSegments = 32;
    std::mt19937 rng(test_seed() + 2);
    for (const TypeCase& c : all_type_cases()) {
        if (c.block != 256) continue;
        SCOPED_TRACE(type_name(c.type) + ", seed " + std::to_string(test_seed()));
        std::vector<float> x = draw(Dist::Normal, kSegment * kSegments, rng);
        for (size_t s = 0; s < kSegments; ++s) {
            const auto seg = x.begin() + std::ptrdiff_t(s * kSegment);
            std::fill(seg + 32, seg + 96, 0.0f);
            std::fill(seg + 304, seg + 320, 0.0f);
        }
        const std::vector<float> y = dequantize(c.type, quantize(c.type, x), int64_t(x.size()));
        EXPECT_LT(relative_rmse(x, y), c.bound);
        const bool symmetric = c.type == TensorType::Q3_K || c.type == TensorType::Q6_K ||
                               c.type == TensorType::Q8_K;
        for (size_t s = 0; s < kSegments; ++s) {
            for (size_t i : {32, 50, 95, 304, 319}) {
                const size_t at = s * kSegment + i;
                if (symmetric) {
                    EXPECT_EQ(y[at], 0.0f) << "element " << at;
                } else {
                    EXPECT_LT(std::fabs(y[at]), 0.5f) << "element " << at;
                }
            }
        }
    }
}

TEST(QuantRoundTrip, QuantizingIsDeterministic) {
    std::mt19937 rng(test_seed() + 3);
    for (const TypeCase& c : all_type_cases()) {
        SCOPED_TRACE(type_name(c.type));
        const std::vector<float> x = draw(Dist::Normal, size_t(8 * c.block), rng);
        EXPECT_EQ(quantize(c.type, x), quantize(c.type, x));
    }
}

}  // namespace
