// Shared pieces of the quant unit tests: the list of types with their
// round-trip error bounds, a per-run random seed, and row helpers.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "gguf/tensor_type.h"
#include "quant/quant.h"
#include "tests/support/test_seed.h"

namespace tern::quant::qtest {

// Relative RMSE bounds (RMS of the error over RMS of the data, over many
// blocks). `bound` holds for normal, uniform and small-magnitude data;
// `outlier_bound` for normal data with 1% of elements scaled by 50. `bound`
// is about 1.1x the worst value the reference algorithms reach on 16k
// values, `outlier_bound` about 1.2x (it varies more); see docs/quant.md.
struct TypeCase {
    TensorType type;
    int block;           // elements per block
    double bound;
    double outlier_bound;
};

inline const std::vector<TypeCase>& all_type_cases() {
    static const std::vector<TypeCase> cases = {
        {TensorType::F32, 1, 0.0, 0.0},
        {TensorType::F16, 1, 3e-4, 3e-4},
        {TensorType::BF16, 1, 2.5e-3, 2.5e-3},
        {TensorType::Q4_0, 32, 0.10, 0.12},
        {TensorType::Q4_1, 32, 0.095, 0.165},
        {TensorType::Q5_0, 32, 0.05, 0.095},
        {TensorType::Q5_1, 32, 0.045, 0.077},
        {TensorType::Q8_0, 32, 0.0065, 0.0165},
        {TensorType::Q8_1, 32, 0.0065, 0.0165},
        {TensorType::Q2_K, 256, 0.33, 0.33},
        {TensorType::Q3_K, 256, 0.17, 0.12},
        {TensorType::Q4_K, 256, 0.08, 0.105},
        {TensorType::Q5_K, 256, 0.042, 0.068},
        {TensorType::Q6_K, 256, 0.025, 0.044},
        {TensorType::Q8_K, 256, 0.0085, 0.041},
    };
    return cases;
}

inline std::string type_name(TensorType t) { return tensor_type_name(uint32_t(t)); }

// The binary's random seed (tests/support/test_seed.h).
inline constexpr auto& test_seed = test::run_seed;

inline std::vector<uint8_t> quantize(TensorType t, const std::vector<float>& x) {
    std::vector<uint8_t> q(row_bytes(t, int64_t(x.size())));
    const Status s = quantize_row(t, x.data(), q.data(), int64_t(x.size()));
    EXPECT_TRUE(s.ok()) << s.message();
    return q;
}

inline std::vector<float> dequantize(TensorType t, const std::vector<uint8_t>& q, int64_t n) {
    std::vector<float> y(static_cast<size_t>(n));
    const Status s = dequantize_row(t, q.data(), y.data(), n);
    EXPECT_TRUE(s.ok()) << s.message();
    return y;
}

inline double relative_rmse(const std::vector<float>& x, const std::vector<float>& y) {
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
        const double d = double(x[i]) - double(y[i]);
        err += d * d;
        ref += double(x[i]) * double(x[i]);
    }
    return ref > 0 ? std::sqrt(err / ref) : std::sqrt(err);
}

}  // namespace tern::quant::qtest
