// quant/: bit-exactness against the reference quantizers of the GGUF
// ecosystem (ggml's quantize_row_*_ref, which GGUF producers run when no
// importance matrix is given). The digests below are FNV-1a hashes of the
// reference's output for a fixed, platform-independent input; any change in
// rounding, search order or packing changes them. The random-data tests
// elsewhere check the same algorithms against gguf-py and numpy.
#include <cstdint>
#include <vector>

#include "test_quant_helpers.h"

namespace {

using namespace tern;
using namespace tern::quant;

// Deterministic test input built from integer arithmetic and exact float
// operations only (no libm), so it is the same on every platform.
struct GoldenRng {
    uint64_t state;
    uint64_t next() {  // splitmix64
        uint64_t z = (state += 0x9E3779B97F4A7C15ull);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        return z ^ (z >> 31);
    }
    float uniform() { return float(next() >> 40) * (1.0f / 16777216.0f); }  // [0, 1)
    float normalish() {  // Irwin-Hall sum of four, scaled to unit variance
        return (uniform() + uniform() + uniform() + uniform() - 2.0f) * 1.7320508f;
    }
};

// 256-value super-blocks cycling through eight kinds of data.
std::vector<float> golden_input(int n_superblocks) {
    GoldenRng rng{0x7465726E71756E74ull};
    std::vector<float> x;
    for (int b = 0; b < n_superblocks; ++b) {
        for (int i = 0; i < 256; ++i) {
            const float n = rng.normalish();
            float v = 0.0f;
            switch (b % 8) {
                case 0: v = n; break;
                case 1: v = 0.02f * n; break;
                case 2: v = (n < 0 ? -n : n) + 0.5f; break;
                case 3: v = n * (rng.uniform() < 0.02f ? 40.0f : 1.0f); break;
                case 4: v = float(int(rng.uniform() * 17.0f) - 8); break;
                case 5: v = (i / 16) % 3 == 0 ? 0.0f : n; break;
                case 6: v = (i % 16 == 0 || x.empty()) ? n : x.back(); break;
                case 7: v = 1e-3f * n; break;
            }
            x.push_back(v);
        }
    }
    return x;
}

uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint8_t b : bytes) {
        h ^= b;
        h *= 0x100000001b3ull;
    }
    return h;
}

TEST(QuantGolden, QuantizersMatchTheReferenceBitForBit) {
    const std::vector<float> x = golden_input(64);
    ASSERT_EQ(x.size(), 16384u);
    const struct {
        TensorType type;
        uint64_t digest;
    } expected[] = {
        {TensorType::Q4_0, 0xe05b2b5eb2e66613ull},
        {TensorType::Q4_1, 0x8b857384d80734fdull},
        {TensorType::Q5_0, 0x99252831a18839feull},
        {TensorType::Q5_1, 0x0689ca8c604037c5ull},
        {TensorType::Q8_0, 0xc51a7d34d3920186ull},
        {TensorType::Q8_1, 0x8bc1506a418d81b1ull},
        {TensorType::Q2_K, 0xadd368924fc244afull},
        {TensorType::Q3_K, 0x370a2151d5ac28f8ull},
        {TensorType::Q4_K, 0x5fa9124014f2965cull},
        {TensorType::Q5_K, 0xde1926132f3186a7ull},
        {TensorType::Q6_K, 0xc485c7196789e3ecull},
        {TensorType::Q8_K, 0x3be03b79f98d52fbull},
    };
    for (const auto& e : expected) {
        std::vector<uint8_t> q(row_bytes(e.type, int64_t(x.size())));
        ASSERT_TRUE(quantize_row(e.type, x.data(), q.data(), int64_t(x.size())).ok());
        EXPECT_EQ(fnv1a64(q), e.digest) << tern::quant::qtest::type_name(e.type);
    }
}

}  // namespace
