// A gated activation's AVX2 form (cpu::geglu, cpu::swiglu) against its
// portable form: forty rounds of ragged lengths (0 to 19 values, then up to
// 20,000), gates drawn by the caller, `up` from a normal distribution, both
// forms' outputs compared bit for bit (any NaN equal to a NaN of the same
// sign) and one value past the end that neither may write. `check(gate, up,
// got)` then looks at each portable result on its own.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "quant/simd_path.h"

namespace tern::test {

inline bool same_float(float a, float b) {
    if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b) && std::signbit(a) == std::signbit(b);
    return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

template <class Form, class DrawGate, class Check>
void expect_avx2_gives_portable_bits(Form form, DrawGate draw_gate, Check check, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (int round = 0; round < 40; ++round) {
        const int64_t n = round < 20 ? round : int64_t(rng() % 20000);
        std::vector<float> gate(static_cast<size_t>(n)), up(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
            gate[size_t(i)] = draw_gate(rng);
            up[size_t(i)] = nd(rng);
        }
        std::vector<float> a(size_t(n) + 1, 7.0f), b(size_t(n) + 1, 7.0f);
        std::copy(gate.begin(), gate.end(), a.begin());
        std::copy(gate.begin(), gate.end(), b.begin());
        form(a.data(), up.data(), n, quant::SimdPath::scalar);
        form(b.data(), up.data(), n, quant::SimdPath::avx2);
        for (int64_t i = 0; i < n; ++i) {
            const size_t k = size_t(i);
            ASSERT_TRUE(same_float(a[k], b[k])) << "gate " << gate[k] << " up " << up[k] << ": " << a[k] << " vs " << b[k];
            ASSERT_NO_FATAL_FAILURE(check(gate[k], up[k], a[k]));
        }
        ASSERT_EQ(a[size_t(n)], 7.0f) << "written past the end";
        ASSERT_EQ(b[size_t(n)], 7.0f) << "written past the end";
    }
}

}  // namespace tern::test
