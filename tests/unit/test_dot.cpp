// quant/dot*, quant/act_quant: activation quantization against its written
// definition, and every integer dot-product kernel on every SIMD path:
//  - each element's integer weight, read back through one-hot activations,
//    matches the reference dequantizer;
//  - the per-block integer sums are exact (linear in the activations) and
//    identical on every path, on quantizer output and on arbitrary bytes;
//  - the float result is bit-identical across paths, within 1e-5 of the sum of
//    |terms| of the exact value on the quantized activations, and within the
//    derived activation-rounding bound of the exact value on the raw floats;
//  - the multi-token kernels (prefill) give every token the one-token kernel's
//    bits, for 1..kDotMaxTokens tokens, ragged row lengths and arbitrary bytes,
//    writing only their outputs; the activation packing puts every element
//    where quant/dot.h says;
//  - the one-token many-row kernel gives every row the one-row kernel's bits.
// Fresh random data every run; the seed is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "base/fp16.h"
#include "dot_test_util.h"
#include "quant/blocks.h"

namespace {

using namespace tern;
using namespace tern::quant;
using namespace tern::dot_testing;

// ---- activation quantization ------------------------------------------------

TEST(ActQuant, EveryPathMatchesTheDefinition) {
    std::mt19937 rng(seed());
    SCOPED_TRACE("seed " + std::to_string(seed()));
    const int64_t n = 32 * 301;
    std::vector<float> x = random_acts(rng, n);
    // Block 5: amax 127 makes d = 1, so these are exact rounding ties.
    for (int i = 0; i < 32; ++i) x[size_t(160 + i)] = (i % 2 ? -1.0f : 1.0f) * (float(i) + 0.5f);
    x[160 + 31] = 127.0f;
    for (SimdPath path : available_paths()) {
        SCOPED_TRACE(simd_path_name(path));
        const std::vector<block_q8a> a = quantize_acts(x, path);
        for (int64_t b = 0; b < n / 32; ++b) {
            const float* xb = x.data() + 32 * b;
            float amax = 0.0f;
            for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(xb[i]));
            const float d = amax / 127.0f;
            ASSERT_EQ(bits_of(a[size_t(b)].d), bits_of(d)) << "block " << b;
            int32_t sum = 0;
            for (int i = 0; i < 32; ++i) {
                const float r = d == 0.0f ? 0.0f : std::clamp(std::round(xb[i] / d), -127.0f, 127.0f);
                ASSERT_EQ(int(a[size_t(b)].qs[i]), int(r)) << "block " << b << " element " << i << " x " << xb[i];
                sum += int(r);
            }
            ASSERT_EQ(a[size_t(b)].sum, sum) << "block " << b;
        }
        // The ties rounded away from zero.
        EXPECT_EQ(a[5].qs[0], 1);   // 0.5
        EXPECT_EQ(a[5].qs[1], -2);  // -1.5
        EXPECT_EQ(a[5].qs[30], 31);
    }
}

TEST(ActQuant, ZeroAndSubnormalBlocksGiveZeros) {
    std::vector<float> x(64, 0.0f);
    x[40] = 1e-45f;  // amax / 127 underflows to 0
    for (SimdPath path : available_paths()) {
        const std::vector<block_q8a> a = quantize_acts(x, path);
        for (const block_q8a& b : a) {
            EXPECT_EQ(b.d, 0.0f);
            EXPECT_EQ(b.sum, 0);
            for (int8_t q : b.qs) EXPECT_EQ(q, 0);
        }
    }
}

// ---- integer sums -----------------------------------------------------------

struct BlockScales {
    double d, second;  // second: m (q4_1, q5_1) or dmin (q2_K, q4_K, q5_K); else 0
};

// Scales that block b (32 elements) of a row uses, read from the block structs.
BlockScales scales_of(TensorType t, const uint8_t* row, int64_t b) {
    auto h = [](uint16_t v) { return double(fp16_to_fp32(v)); };
    switch (t) {
    case TensorType::Q4_0: return {h(reinterpret_cast<const block_q4_0*>(row)[b].d), 0};
    case TensorType::Q4_1: {
        const auto& w = reinterpret_cast<const block_q4_1*>(row)[b];
        return {h(w.d), h(w.m)};
    }
    case TensorType::Q5_0: return {h(reinterpret_cast<const block_q5_0*>(row)[b].d), 0};
    case TensorType::Q5_1: {
        const auto& w = reinterpret_cast<const block_q5_1*>(row)[b];
        return {h(w.d), h(w.m)};
    }
    case TensorType::Q8_0: return {h(reinterpret_cast<const block_q8_0*>(row)[b].d), 0};
    case TensorType::Q2_K: {
        const auto& w = reinterpret_cast<const block_q2_K*>(row)[b / 8];
        return {h(w.d), h(w.dmin)};
    }
    case TensorType::Q3_K: return {h(reinterpret_cast<const block_q3_K*>(row)[b / 8].d), 0};
    case TensorType::Q4_K: {
        const auto& w = reinterpret_cast<const block_q4_K*>(row)[b / 8];
        return {h(w.d), h(w.dmin)};
    }
    case TensorType::Q5_K: {
        const auto& w = reinterpret_cast<const block_q5_K*>(row)[b / 8];
        return {h(w.d), h(w.dmin)};
    }
    case TensorType::Q6_K: return {h(reinterpret_cast<const block_q6_K*>(row)[b / 8].d), 0};
    default: ADD_FAILURE() << "no scales for " << name(t); return {0, 0};
    }
}

// The documented meaning of (w_sum, x_sum): w = d*A + m*X, or d*A - dmin*X, or d*A.
double combine(TensorType t, const BlockScales& s, int64_t A, int64_t X) {
    if (t == TensorType::Q4_1 || t == TensorType::Q5_1) return s.d * double(A) + s.second * double(X);
    if (t == TensorType::Q2_K || t == TensorType::Q4_K || t == TensorType::Q5_K)
        return s.d * double(A) - s.second * double(X);
    return s.d * double(A);
}

// Integer sums of one row with one-hot activations at position p of every
// block: unit[p][b] = (A, X) for element 32b + p.
struct UnitResponse {
    std::vector<int32_t> A, X;  // [p * nb + b]
};

UnitResponse unit_response(DotIntSumsFn sums, const uint8_t* row, int64_t k) {
    const int64_t nb = k / 32;
    UnitResponse u{std::vector<int32_t>(size_t(32 * nb)), std::vector<int32_t>(size_t(32 * nb))};
    std::vector<block_q8a> a(static_cast<size_t>(nb));
    for (int p = 0; p < 32; ++p) {
        for (block_q8a& blk : a) {
            blk = block_q8a{1.0f, 1, {}};
            blk.qs[p] = 1;
        }
        sums(row, a.data(), k, u.A.data() + p * nb, u.X.data() + p * nb);
    }
    return u;
}

TEST(DotIntSums, OneHotActivationsReadBackEveryWeight) {
    std::mt19937 rng(seed());
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : int_types()) {
        for (int64_t k : row_lengths(t)) {
            SCOPED_TRACE(name(t) + " k=" + std::to_string(k));
            const std::vector<uint8_t> row = quantize(t, random_weights(rng, k));
            const std::vector<float> w = dequantize(t, row.data(), k);
            const int64_t nb = k / 32;
            for (SimdPath path : available_paths()) {
                SCOPED_TRACE(simd_path_name(path));
                const UnitResponse u = unit_response(dot_int_sums_kernel(t, path), row.data(), k);
                for (int64_t e = 0; e < k; ++e) {
                    const int64_t b = e / 32, p = e % 32;
                    const int32_t A = u.A[size_t(p * nb + b)], X = u.X[size_t(p * nb + b)];
                    const BlockScales s = scales_of(t, row.data(), b);
                    const double got = combine(t, s, A, X);
                    const double tol = 2e-6 * (std::fabs(s.d * A) + std::fabs(s.second * X)) + 1e-30;
                    ASSERT_NEAR(got, double(w[size_t(e)]), tol) << "element " << e << " A " << A << " X " << X;
                }
            }
        }
    }
}

// Exact check of one path's sums on activations a against the unit responses.
void expect_linear(DotIntSumsFn sums, const uint8_t* row, const std::vector<block_q8a>& a, int64_t k,
                   const UnitResponse& u, std::vector<int32_t>* A_out, std::vector<int32_t>* X_out) {
    const int64_t nb = k / 32;
    std::vector<int32_t> A(static_cast<size_t>(nb)), X(static_cast<size_t>(nb));
    sums(row, a.data(), k, A.data(), X.data());
    for (int64_t b = 0; b < nb; ++b) {
        int64_t ea = 0, ex = 0;
        for (int p = 0; p < 32; ++p) {
            ea += int64_t(a[size_t(b)].qs[p]) * u.A[size_t(p * nb + b)];
            ex += int64_t(a[size_t(b)].qs[p]) * u.X[size_t(p * nb + b)];
        }
        ASSERT_EQ(A[size_t(b)], ea) << "w_sum of block " << b;
        ASSERT_EQ(X[size_t(b)], ex) << "x_sum of block " << b;
    }
    *A_out = A;
    *X_out = X;
}

TEST(DotIntSums, ExactAndIdenticalOnEveryPath) {
    std::mt19937 rng(seed());
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : int_types()) {
        for (int64_t k : row_lengths(t)) {
            SCOPED_TRACE(name(t) + " k=" + std::to_string(k));
            const std::vector<uint8_t> row = quantize(t, random_weights(rng, k));
            const UnitResponse u = unit_response(dot_int_sums_kernel(t, SimdPath::scalar), row.data(), k);
            for (int rep = 0; rep < 3; ++rep) {
                const std::vector<block_q8a> a = quantize_acts(random_acts(rng, k));
                std::vector<int32_t> A0, X0;
                for (SimdPath path : available_paths()) {
                    SCOPED_TRACE(simd_path_name(path));
                    std::vector<int32_t> A, X;
                    expect_linear(dot_int_sums_kernel(t, path), row.data(), a, k, u, &A, &X);
                    if (path == SimdPath::scalar) {
                        A0 = A, X0 = X;
                    } else {
                        EXPECT_EQ(A, A0);
                        EXPECT_EQ(X, X0);
                    }
                }
            }
        }
    }
}

// Any bytes at all (every scale, every -128, NaN halves): sums still exact and
// identical, floats identical wherever they are finite.
TEST(DotIntSums, ArbitraryBytesAgreeAcrossPaths) {
    std::mt19937 rng(seed() + 1);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    std::uniform_int_distribution<int> byte(0, 255), act(-127, 127);
    for (TensorType t : int_types()) {
        for (int64_t k : row_lengths(t)) {
            SCOPED_TRACE(name(t) + " k=" + std::to_string(k));
            std::vector<uint8_t> row(row_bytes(t, k));
            for (uint8_t& v : row) v = uint8_t(byte(rng));
            std::vector<block_q8a> a(static_cast<size_t>(k / 32));
            for (block_q8a& blk : a) {
                blk.d = std::ldexp(float(act(rng) + 128), -10);
                blk.sum = 0;
                for (int8_t& q : blk.qs) blk.sum += (q = int8_t(act(rng)));
            }
            const UnitResponse u = unit_response(dot_int_sums_kernel(t, SimdPath::scalar), row.data(), k);
            float ref = 0.0f;
            for (SimdPath path : available_paths()) {
                SCOPED_TRACE(simd_path_name(path));
                std::vector<int32_t> A, X;
                expect_linear(dot_int_sums_kernel(t, path), row.data(), a, k, u, &A, &X);
                const float r = dot_row_kernel(t, path)(row.data(), a.data(), k);
                if (path == SimdPath::scalar) ref = r;
                else if (std::isnan(ref)) EXPECT_TRUE(std::isnan(r));
                else EXPECT_EQ(bits_of(r), bits_of(ref)) << r << " vs " << ref;
            }
        }
    }
}

// ---- float results -------------------------------------------------------------

TEST(DotRow, BitIdenticalAcrossPathsAndWithinStatedTolerances) {
    std::mt19937 rng(seed() + 2);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : int_types()) {
        double worst_q = 0, worst_x = 0;  // error / tolerance, for the summary line
        for (int64_t k : row_lengths(t)) {
            SCOPED_TRACE(name(t) + " k=" + std::to_string(k));
            for (int r = 0; r < 6; ++r) {
                const std::vector<uint8_t> row = quantize(t, random_weights(rng, k));
                const std::vector<float> w = dequantize(t, row.data(), k);
                const std::vector<float> x = random_acts(rng, k);
                const std::vector<block_q8a> a = quantize_acts(x);
                const float ref = dot_row_kernel(t, SimdPath::scalar)(row.data(), a.data(), k);
                for (SimdPath path : available_paths()) {
                    const float got = dot_row_kernel(t, path)(row.data(), a.data(), k);
                    ASSERT_EQ(bits_of(got), bits_of(ref)) << simd_path_name(path) << ": " << got << " vs " << ref;
                }
                // Exact value on the quantized activations; tolerance 1e-5 of sum |terms|.
                // Against the raw activations: each |x - d*q| <= d/2 (plus the rounding of x/d).
                double exact_q = 0, abs_q = 0, exact_x = 0, act_bound = 0;
                for (int64_t i = 0; i < k; ++i) {
                    const block_q8a& blk = a[size_t(i / 32)];
                    const double xq = double(blk.d) * blk.qs[i % 32];
                    exact_q += double(w[size_t(i)]) * xq;
                    abs_q += std::fabs(double(w[size_t(i)]) * xq);
                    exact_x += double(w[size_t(i)]) * double(x[size_t(i)]);
                    act_bound += std::fabs(double(w[size_t(i)])) * (0.5 + 1e-5) * double(blk.d);
                }
                const double tol_q = 1e-5 * abs_q + 1e-30;
                const double tol_x = act_bound + tol_q;
                EXPECT_NEAR(double(ref), exact_q, tol_q);
                EXPECT_NEAR(double(ref), exact_x, tol_x);
                worst_q = std::max(worst_q, std::fabs(double(ref) - exact_q) / tol_q);
                worst_x = std::max(worst_x, std::fabs(double(ref) - exact_x) / tol_x);
            }
        }
        std::printf("  %-5s worst error / tolerance: %.3g on quantized activations, %.3g on raw\n",
                    name(t).c_str(), worst_q, worst_x);
    }
}

TEST(DotFloat, BitIdenticalAcrossPathsAndWithinTheSummationBound) {
    std::mt19937 rng(seed() + 3);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
        for (int64_t k : {1, 15, 16, 17, 255, 4096, 4099}) {
            SCOPED_TRACE(name(t) + " k=" + std::to_string(k));
            std::vector<float> src(static_cast<size_t>(k)), x(static_cast<size_t>(k));
            for (float& v : src) v = normal(rng);
            for (float& v : x) v = normal(rng) * (rng() % 50 == 0 ? 30.0f : 1.0f);
            const std::vector<uint8_t> row = quantize(t, src);
            const std::vector<float> w = dequantize(t, row.data(), k);
            const float ref = dot_float_kernel(t, SimdPath::scalar)(row.data(), x.data(), k);
            for (SimdPath path : available_paths()) {
                const float got = dot_float_kernel(t, path)(row.data(), x.data(), k);
                ASSERT_EQ(bits_of(got), bits_of(ref)) << simd_path_name(path);
            }
            // 16 lanes of about k/16 additions, a 4-level fold, one rounded product each.
            double exact = 0, abs_sum = 0;
            for (int64_t i = 0; i < k; ++i) {
                exact += double(w[size_t(i)]) * x[size_t(i)];
                abs_sum += std::fabs(double(w[size_t(i)]) * x[size_t(i)]);
            }
            const double u = std::ldexp(1.0, -24);
            EXPECT_NEAR(double(ref), exact, 1.01 * double((k + 15) / 16 + 5) * u * abs_sum);
        }
    }
}

// ---- several tokens per call ----------------------------------------------------

// n tokens' activations: as block_q8a rows (token t at t * k/32) for the
// one-token kernels, and packed for the multi-token kernels.
struct TokenBatch {
    std::vector<block_q8a> blocks;
    std::vector<int8_t> qs;
    std::vector<float> d;
    std::vector<int32_t> sum;
    int64_t stride = 0;
    ActTokens packed() const { return {qs.data(), d.data(), sum.data(), stride}; }
    const block_q8a* token(int t, int64_t k) const { return blocks.data() + t * (k / 32); }
};

TokenBatch pack(std::vector<block_q8a> blocks, int n, int64_t k) {
    TokenBatch b;
    b.blocks = std::move(blocks);
    b.stride = act_tokens_stride(k);
    b.qs.assign(size_t(n * b.stride * 32), int8_t(99));  // garbage the packing must overwrite
    b.d.assign(size_t(n * b.stride), -1.0f);
    b.sum.assign(size_t(n * b.stride), -1);
    pack_act_tokens(b.blocks.data(), n, k, b.qs.data(), b.d.data(), b.sum.data());
    return b;
}

TokenBatch random_batch(std::mt19937& rng, int n, int64_t k) {
    return pack(quantize_acts(random_acts(rng, n * k)), n, k);
}

TEST(ActTokens, PackingPutsEveryElementWhereTheKernelsReadIt) {
    std::mt19937 rng(seed() + 20);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (int64_t k : {32, 32 * 8, 32 * 11, 4096}) {
        const int n = 3;
        const TokenBatch b = random_batch(rng, n, k);
        const int64_t nb = k / 32;
        ASSERT_EQ(b.stride, (nb + 7) / 8 * 8);
        ASSERT_EQ(b.packed().from(2).qs, b.qs.data() + 2 * 32 * b.stride);
        for (int t = 0; t < n; ++t)
            for (int64_t blk = 0; blk < b.stride; ++blk) {
                const int64_t at = t * b.stride + blk;
                const block_q8a* x = blk < nb ? &b.token(t, k)[blk] : nullptr;
                ASSERT_EQ(bits_of(b.d[size_t(at)]), bits_of(x ? x->d : 0.0f)) << "token " << t << " block " << blk;
                ASSERT_EQ(b.sum[size_t(at)], x ? x->sum : 0);
                // Word 8s + j of group g holds elements 4s..4s+3 of block 8g + j.
                for (int e = 0; e < 32; ++e) {
                    const int s = e / 4, i = e % 4;
                    const size_t pos = size_t(t * 32 * b.stride + 256 * (blk / 8) + 4 * (8 * s + blk % 8) + i);
                    ASSERT_EQ(int(b.qs[pos]), x ? int(x->qs[e]) : 0)
                        << "token " << t << " block " << blk << " element " << e;
                }
            }
    }
}

// Runs the multi-token kernel for n tokens into every third float of a NaN
// buffer and checks each token against the one-token kernel on the same path;
// the floats in between must stay untouched.
void expect_tokens_match(TensorType t, SimdPath path, const uint8_t* row, const TokenBatch& b, int n, int64_t k,
                         bool nan_ok) {
    const int64_t out_stride = 3;
    std::vector<float> out(size_t(n * out_stride), std::numeric_limits<float>::quiet_NaN());
    dot_tokens_kernel(t, path)(row, b.packed(), n, k, out.data(), out_stride);
    for (int tok = 0; tok < n; ++tok) {
        const float ref = dot_row_kernel(t, path)(row, b.token(tok, k), k);
        const float got = out[size_t(tok * out_stride)];
        if (nan_ok && std::isnan(ref)) EXPECT_TRUE(std::isnan(got)) << "token " << tok;
        else ASSERT_EQ(bits_of(got), bits_of(ref)) << "token " << tok << " of " << n << ": " << got << " vs " << ref;
        for (int64_t g = 1; g < out_stride; ++g)
            ASSERT_TRUE(std::isnan(out[size_t(tok * out_stride + g)])) << "wrote outside its outputs";
    }
}

TEST(DotTokens, EveryTokenGetsTheOneTokenKernelsBits) {
    std::mt19937 rng(seed() + 21);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : int_types()) {
        std::vector<int64_t> lengths = row_lengths(t);
        if (!is_k_type(t)) lengths.insert(lengths.end(), {32, 32 * 7, 32 * 9, 32 * 18});
        for (int64_t k : lengths) {
            SCOPED_TRACE(name(t) + " k=" + std::to_string(k));
            for (int n = 1; n <= kDotMaxTokens; ++n) {
                SCOPED_TRACE("tokens " + std::to_string(n));
                const std::vector<uint8_t> row = quantize(t, random_weights(rng, k));
                const TokenBatch b = random_batch(rng, n, k);
                for (SimdPath path : available_paths()) {
                    SCOPED_TRACE(simd_path_name(path));
                    expect_tokens_match(t, path, row.data(), b, n, k, false);
                    if (HasFatalFailure()) return;
                }
                // and so, through the one-token kernels, the scalar reference's bits
                std::vector<float> ref(static_cast<size_t>(n)), got(static_cast<size_t>(n));
                dot_tokens_kernel(t, SimdPath::scalar)(row.data(), b.packed(), n, k, ref.data(), 1);
                for (SimdPath path : available_paths()) {
                    dot_tokens_kernel(t, path)(row.data(), b.packed(), n, k, got.data(), 1);
                    for (int tok = 0; tok < n; ++tok) ASSERT_EQ(bits_of(got[size_t(tok)]), bits_of(ref[size_t(tok)]));
                }
            }
        }
    }
}

// Any weight bytes (every scale, NaN and infinite halves, -128 quanta) and
// activations off the quantizer's grid.
TEST(DotTokens, ArbitraryBytesAgreeWithTheOneTokenKernel) {
    std::mt19937 rng(seed() + 22);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    std::uniform_int_distribution<int> byte(0, 255), act(-127, 127);
    for (TensorType t : int_types()) {
        for (int64_t k : row_lengths(t)) {
            SCOPED_TRACE(name(t) + " k=" + std::to_string(k));
            const int n = 1 + int(rng() % kDotMaxTokens);
            std::vector<uint8_t> row(row_bytes(t, k));
            for (uint8_t& v : row) v = uint8_t(byte(rng));
            std::vector<block_q8a> a(size_t(n * (k / 32)));
            for (block_q8a& blk : a) {
                blk.d = std::ldexp(float(act(rng) + 128), -10);
                blk.sum = 0;
                for (int8_t& q : blk.qs) blk.sum += (q = int8_t(act(rng)));
            }
            const TokenBatch b = pack(a, n, k);
            for (SimdPath path : available_paths()) {
                SCOPED_TRACE(simd_path_name(path));
                expect_tokens_match(t, path, row.data(), b, n, k, true);
            }
        }
    }
}

// The one-token matmul's kernel (activation scales and sums gathered once for
// all rows): every row's one-row bits, rows at a stride past their bytes, and
// nothing written past the last; quantizer output and arbitrary bytes, and
// rows longer than its planes (it falls back to gathering per row).
TEST(DotRows, EveryRowGetsTheOneRowKernelsBits) {
    std::mt19937 rng(seed() + 24);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    std::uniform_int_distribution<int> byte(0, 255);
    for (TensorType t : int_types()) {
        std::vector<int64_t> lengths = row_lengths(t);
        lengths.push_back(32 * 2048 + 256);  // past the planes
        for (int64_t k : lengths) {
            for (const bool arbitrary : {false, true}) {
                SCOPED_TRACE(name(t) + " k=" + std::to_string(k) + (arbitrary ? " arbitrary bytes" : ""));
                const int64_t n_rows = 1 + int64_t(rng() % 5);
                const size_t stride = row_bytes(t, k) + 2 * (rng() % 8);
                std::vector<uint8_t> rows(stride * size_t(n_rows));
                for (int64_t r = 0; r < n_rows; ++r) {
                    std::vector<uint8_t> row = quantize(t, random_weights(rng, k));
                    if (arbitrary)
                        for (uint8_t& v : row) v = uint8_t(byte(rng));
                    std::copy(row.begin(), row.end(), rows.begin() + r * int64_t(stride));
                }
                const TokenBatch b = random_batch(rng, 1, k);
                EXPECT_EQ(dot_rows_kernel(t, SimdPath::scalar), nullptr);
                for (SimdPath path : available_paths()) {
                    if (path == SimdPath::scalar) continue;
                    SCOPED_TRACE(simd_path_name(path));
                    const DotRowsFn kernel = dot_rows_kernel(t, path);
                    ASSERT_NE(kernel, nullptr);
                    std::vector<float> out(size_t(n_rows + 1), std::numeric_limits<float>::quiet_NaN());
                    kernel(rows.data(), stride, n_rows, b.token(0, k), k, out.data());
                    for (int64_t r = 0; r < n_rows; ++r) {
                        const float ref = dot_row_kernel(t, path)(rows.data() + r * int64_t(stride), b.token(0, k), k);
                        if (std::isnan(ref)) ASSERT_TRUE(std::isnan(out[size_t(r)])) << "row " << r;
                        else ASSERT_EQ(bits_of(out[size_t(r)]), bits_of(ref)) << "row " << r << " of " << n_rows;
                    }
                    ASSERT_TRUE(std::isnan(out[size_t(n_rows)])) << "wrote past the last row";
                }
            }
        }
    }
}

TEST(DotFloatTokens, EveryTokenGetsTheOneTokenKernelsBits) {
    std::mt19937 rng(seed() + 23);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
        for (int64_t k : {1, 15, 16, 17, 255, 4096, 4099}) {
            SCOPED_TRACE(name(t) + " k=" + std::to_string(k));
            std::vector<float> src(static_cast<size_t>(k));
            for (float& v : src) v = normal(rng);
            const std::vector<uint8_t> row = quantize(t, src);
            for (int n = 1; n <= kDotMaxTokens; ++n) {
                const int64_t x_stride = k + 5, out_stride = 2;
                std::vector<float> x(size_t(n * x_stride));
                for (float& v : x) v = normal(rng) * (rng() % 50 == 0 ? 30.0f : 1.0f);
                for (SimdPath path : available_paths()) {
                    SCOPED_TRACE(std::string(simd_path_name(path)) + " tokens " + std::to_string(n));
                    std::vector<float> out(size_t(n * out_stride), std::numeric_limits<float>::quiet_NaN());
                    dot_float_tokens_kernel(t, path)(row.data(), x.data(), x_stride, n, k, out.data(), out_stride);
                    for (int tok = 0; tok < n; ++tok) {
                        const float* xt = x.data() + tok * x_stride;
                        const float ref = dot_float_kernel(t, SimdPath::scalar)(row.data(), xt, k);
                        ASSERT_EQ(bits_of(out[size_t(tok * out_stride)]), bits_of(ref)) << "token " << tok;
                        ASSERT_TRUE(std::isnan(out[size_t(tok * out_stride + 1)])) << "wrote outside its outputs";
                    }
                }
            }
        }
    }
}

TEST(DotKernels, TableCoversExactlyTheSupportedTypes) {
    for (TensorType t : int_types()) {
        EXPECT_TRUE(dot_int_type(t)) << name(t);
        for (SimdPath p : available_paths()) {
            EXPECT_NE(dot_row_kernel(t, p), nullptr) << name(t) << " " << simd_path_name(p);
            EXPECT_NE(dot_int_sums_kernel(t, p), nullptr);
            EXPECT_NE(dot_tokens_kernel(t, p), nullptr);
            EXPECT_EQ(dot_float_kernel(t, p), nullptr);
            EXPECT_EQ(dot_float_tokens_kernel(t, p), nullptr);
        }
    }
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16}) {
        EXPECT_TRUE(dot_float_type(t));
        EXPECT_FALSE(dot_int_type(t));
        EXPECT_EQ(dot_row_kernel(t, SimdPath::scalar), nullptr);
        EXPECT_EQ(dot_tokens_kernel(t, SimdPath::scalar), nullptr);
        for (SimdPath p : available_paths()) EXPECT_NE(dot_float_tokens_kernel(t, p), nullptr);
    }
    for (TensorType t : {TensorType::Q8_1, TensorType::Q8_K, TensorType::IQ2_XXS, TensorType::I32}) {
        EXPECT_FALSE(dot_int_type(t));
        EXPECT_FALSE(dot_float_type(t));
        EXPECT_EQ(dot_row_kernel(t, SimdPath::scalar), nullptr);
        EXPECT_EQ(dot_tokens_kernel(t, SimdPath::scalar), nullptr);
        EXPECT_EQ(dot_float_tokens_kernel(t, SimdPath::scalar), nullptr);
    }
    EXPECT_TRUE(simd_path_available(SimdPath::scalar));
    EXPECT_TRUE(simd_path_available(simd_path_best()));
    EXPECT_FALSE(simd_path_available(SimdPath(7)));
    std::printf("  best SIMD path here: %s\n", simd_path_name(simd_path_best()));
}

}  // namespace
