// Shared pieces of the dot-product and matmul tests: a per-run seed, random
// weights and activations shaped like a model's (varied block scales, zero
// blocks, outliers), and the row quantize / dequantize round trip.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gguf/tensor_type.h"
#include "quant/act_quant.h"
#include "quant/dot.h"
#include "quant/quant.h"
#include "quant/simd_path.h"
#include "tests/support/test_seed.h"

namespace tern::dot_testing {

// The binary's random seed (tests/support/test_seed.h).
inline constexpr auto& seed = test::run_seed;

inline const std::vector<TensorType>& int_types() {
    static const std::vector<TensorType> t = {
        TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1, TensorType::Q8_0,
        TensorType::Q2_K, TensorType::Q3_K, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K,
    };
    return t;
}

inline bool is_k_type(TensorType t) {
    return t == TensorType::Q2_K || t == TensorType::Q3_K || t == TensorType::Q4_K || t == TensorType::Q5_K ||
           t == TensorType::Q6_K;
}

// Row lengths under test: powers of two and a ragged count of blocks.
inline std::vector<int64_t> row_lengths(TensorType t) {
    if (is_k_type(t)) return {256, 512, 4096, 256 * 3};
    // Every ragged tail of 1..7 blocks after whole groups of eight (and rows
    // shorter than a group): 20 blocks is Gemma 3 270M's 640, 18 SmolLM2's 576.
    return {256, 512, 4096, 32, 32 * 3, 32 * 11, 32 * 13, 32 * 15, 32 * 18, 32 * 20, 32 * 22};
}

inline std::string name(TensorType t) { return tensor_type_name(uint32_t(t)); }

const quant::SimdPath kPaths[] = {quant::SimdPath::scalar, quant::SimdPath::avx2, quant::SimdPath::avx512};

// The SIMD paths this CPU runs; says once which it skips.
inline std::vector<quant::SimdPath> available_paths() {
    std::vector<quant::SimdPath> out;
    for (quant::SimdPath p : kPaths) {
        if (quant::simd_path_available(p)) {
            out.push_back(p);
        } else {
            static bool said[quant::kSimdPathCount] = {};
            if (!said[int(p)]) std::fprintf(stderr, "skipping path %s: not supported here\n", quant::simd_path_name(p));
            said[int(p)] = true;
        }
    }
    return out;
}

inline uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// Weights: normal values whose scale changes per 32-block (as real rows
// do), now and then an all-zero block, now and then a uniform block.
inline std::vector<float> random_weights(std::mt19937& rng, int64_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> uni(-1.0f, 1.0f), log_scale(-4.0f, 1.0f);
    std::vector<float> x(size_t(n), 0.0f);
    for (int64_t b = 0; b < n / 32; ++b) {
        const int kind = int(rng() % 16);
        const float scale = std::exp(log_scale(rng));
        for (int64_t i = 32 * b; i < 32 * b + 32; ++i)
            x[size_t(i)] = kind == 0 ? 0.0f : kind == 1 ? scale * uni(rng) : scale * normal(rng);
    }
    for (int64_t i = n / 32 * 32; i < n; ++i) x[size_t(i)] = normal(rng);
    return x;
}

// Activations: normal, with 1% outliers up to 100x, now and then a zero block
// and a block of tiny values.
inline std::vector<float> random_acts(std::mt19937& rng, int64_t n) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> big(10.0f, 100.0f);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    for (float& v : x)
        if (rng() % 100 == 0) v = (rng() % 2 ? 1.0f : -1.0f) * big(rng);
    for (int64_t b = 0; b + 32 <= n; b += 32) {
        const int kind = int(rng() % 24);
        for (int64_t i = b; i < b + 32; ++i) {
            if (kind == 0) x[size_t(i)] = 0.0f;
            if (kind == 1) x[size_t(i)] *= 1e-30f;
        }
    }
    return x;
}

inline std::vector<uint8_t> quantize(TensorType t, const std::vector<float>& x) {
    std::vector<uint8_t> q(quant::row_bytes(t, int64_t(x.size())));
    const Status s = quant::quantize_row(t, x.data(), q.data(), int64_t(x.size()));
    EXPECT_TRUE(s.ok()) << s.message();
    return q;
}

inline std::vector<float> dequantize(TensorType t, const uint8_t* q, int64_t n) {
    std::vector<float> y(static_cast<size_t>(n));
    const Status s = quant::dequantize_row(t, q, y.data(), n);
    EXPECT_TRUE(s.ok()) << s.message();
    return y;
}

inline std::vector<quant::block_q8a> quantize_acts(const std::vector<float>& x,
                                                   quant::SimdPath path = quant::SimdPath::scalar) {
    std::vector<quant::block_q8a> a(x.size() / quant::QK8A);
    quant::quantize_act_row(x.data(), a.data(), int64_t(x.size()), path);
    return a;
}

}  // namespace tern::dot_testing
