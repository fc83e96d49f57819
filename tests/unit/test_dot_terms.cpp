// quant::dot_block_terms / sum_terms_chunked / dot_row_chunked /
// quantize_act_row_grouped: the CPU twin of the CUDA kernels' summation order.
//  - the per-block terms, folded in the CPU kernels' eight-lane order, give the
//    dot kernel's bits on every path, for every integer type (so the terms are
//    the kernels' own terms, not a recomputation that merely agrees);
//  - legacy rows: dot_row_chunked (chunk by chunk, no buffer) equals
//    sum_terms_chunked of the whole row's terms bit for bit, ragged rows
//    included;
//  - K-quant rows: quantize_act_row_grouped gives every block of a 256-element
//    group the group's scale and otherwise the per-block definition, and
//    dot_row_chunked equals the super-block order written out from its
//    definition over the integer sums of dot_int_sums_kernel; the result is
//    the dot product of the dequantized row and x within the bound that the
//    grouped quantization's rounding allows;
//  - sum_terms_chunked follows the documented order on hand-made terms where
//    the order changes the result, and on random terms;
//  - types without an integer kernel and ragged K-quant rows are errors.
// Fresh random data every run; the seed is printed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "base/fp16.h"
#include "dot_test_util.h"

namespace {

using namespace tern;
using namespace tern::quant;
using namespace tern::dot_testing;

// The CPU kernels' order (docs/cpu-kernels.md): t_b into lane b % 8 from +0.0,
// lanes folded as ((l0+l4) + (l2+l6)) + ((l1+l5) + (l3+l7)).
float fold_lanes8(const std::vector<float>& terms) {
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (size_t b = 0; b < terms.size(); ++b) l[b % 8] += terms[b];
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

// The chunked order written out once more from its definition in quant/dot.h.
float fold_chunks(const std::vector<float>& terms) {
    float r = 0.0f;
    for (size_t first = 0; first < terms.size(); first += 8) {
        float c = terms[first];
        for (size_t b = first + 1; b < std::min(first + 8, terms.size()); ++b) c = c + terms[b];
        r = r + c;
    }
    return r;
}

std::vector<int64_t> lengths_for(TensorType t) {
    std::vector<int64_t> k = row_lengths(t);
    if (!is_k_type(t)) k.push_back(32 * 18);  // 576: two full chunks and a ragged one of two blocks
    return k;
}

TEST(DotTerms, LaneFoldOfTermsIsTheDotKernel) {
    std::mt19937 rng(seed());
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : int_types()) {
        for (int64_t k : lengths_for(t)) {
            for (int row = 0; row < 4; ++row) {
                SCOPED_TRACE(name(t) + " k " + std::to_string(k) + " row " + std::to_string(row));
                const std::vector<uint8_t> w = quantize(t, random_weights(rng, k));
                const std::vector<block_q8a> a = quantize_acts(random_acts(rng, k));
                std::vector<float> terms(size_t(k / 32), std::numeric_limits<float>::quiet_NaN());
                const Status st = dot_block_terms(t, w.data(), a.data(), k, terms.data());
                ASSERT_TRUE(st.ok()) << st.message();
                for (float v : terms) ASSERT_TRUE(std::isfinite(v));
                const float lanes = fold_lanes8(terms);
                for (SimdPath path : available_paths()) {
                    const float got = dot_row_kernel(t, path)(w.data(), a.data(), k);
                    ASSERT_EQ(bits_of(got), bits_of(lanes)) << simd_path_name(path) << ": kernel " << got
                                                            << ", lane fold of the terms " << lanes;
                }
                const float chunked = sum_terms_chunked(terms.data(), int64_t(terms.size()));
                ASSERT_EQ(bits_of(chunked), bits_of(fold_chunks(terms)));

                if (!is_k_type(t)) {  // the CUDA order of legacy rows: chunks of the same terms
                    const float row_chunked = dot_row_chunked(t, w.data(), a.data(), k);
                    ASSERT_EQ(bits_of(row_chunked), bits_of(chunked))
                        << "dot_row_chunked " << row_chunked << " vs sum_terms_chunked " << chunked;
                }
                // Two orders of the same terms: equal up to float rounding.
                double abs_sum = 0;
                for (float v : terms) abs_sum += std::fabs(double(v));
                EXPECT_LE(std::fabs(double(chunked) - double(lanes)), 2.0 * double(k / 32) * 0x1p-24 * abs_sum);
            }
        }
    }
}

// d and dmin of a K-quant super-block, from the GGUF layouts (ggml's block_q*_K).
void kquant_d_dmin(TensorType t, const uint8_t* sb, float& d, float& dmin) {
    auto f16 = [&](size_t off) {
        uint16_t h;
        std::memcpy(&h, sb + off, 2);
        return fp16_to_fp32(h);
    };
    dmin = 0.0f;
    switch (t) {
    case TensorType::Q2_K: d = f16(80), dmin = f16(82); break;  // scales[16], qs[64], d, dmin
    case TensorType::Q3_K: d = f16(108); break;                // hmask[32], qs[64], scales[12], d
    case TensorType::Q4_K:
    case TensorType::Q5_K: d = f16(0), dmin = f16(2); break;     // d, dmin, scales[12], ...
    case TensorType::Q6_K: d = f16(208); break;                // ql[128], qh[64], scales[16], d
    default: FAIL() << name(t);
    }
}

std::vector<block_q8a> quantize_acts_grouped(const std::vector<float>& x) {
    std::vector<block_q8a> a(x.size() / QK8A);
    quantize_act_row_grouped(x.data(), a.data(), int64_t(x.size()));
    return a;
}

TEST(DotTerms, GroupedQuantizationSharesTheGroupsScale) {
    std::mt19937 rng(seed());
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (int64_t k : {32, 256, 576, 4096}) {  // 576: two groups and a ragged one of two blocks
        SCOPED_TRACE("k " + std::to_string(k));
        std::vector<float> x = random_acts(rng, k);
        if (k >= 64) x[33] = std::numeric_limits<float>::quiet_NaN();  // ignored by amax, as per block
        const std::vector<block_q8a> a = quantize_acts_grouped(x);
        for (int64_t g = 0; g < k / 32; g += 8) {
            const int64_t end = std::min<int64_t>(g + 8, k / 32);
            float amax = 0.0f;
            int64_t at = g;  // the block that holds the group's amax
            for (int64_t b = g; b < end; ++b)
                for (int l = 0; l < 32; ++l)
                    if (std::fabs(x[size_t(32 * b + l)]) > amax) amax = std::fabs(x[size_t(32 * b + l)]), at = b;
            for (int64_t b = g; b < end; ++b) {
                ASSERT_EQ(bits_of(a[size_t(b)].d), bits_of(amax / 127.0f)) << "block " << b;
                int32_t sum = 0;
                for (int l = 0; l < 32; ++l) {
                    const float v = x[size_t(32 * b + l)];
                    const int q = a[size_t(b)].qs[l];
                    sum += q;
                    if (std::isnan(v)) {
                        ASSERT_EQ(q, -127);
                    } else if (a[size_t(b)].d == 0.0f) {
                        ASSERT_EQ(q, 0);
                    } else {  // round to nearest: within half a step, never past 127
                        ASSERT_LE(std::fabs(double(v) / a[size_t(b)].d - q), 0.5 + 1e-6) << "block " << b << " element " << l;
                        ASSERT_LE(std::abs(q), 127);
                    }
                }
                ASSERT_EQ(a[size_t(b)].sum, sum) << "block " << b;
            }
            // The block that holds the amax is quantized exactly as on its own.
            block_q8a alone;
            quantize_act_block_ref(x.data() + 32 * at, &alone);
            ASSERT_EQ(std::memcmp(&alone, &a[size_t(at)], sizeof alone), 0) << "block " << at;
        }
    }
}

// The split block sums (the CUDA K-quant mins' operand): per group of eight
// blocks, 64 hi + lo gives back every block's sum exactly, hi and lo are
// exact f16 integers (lo in 0..63), and a ragged last group is padded with
// zeros; sums of every size up to +-4,064 and every residue mod 64.
TEST(DotTerms, SplitBlockSumsGiveBackEverySum) {
    std::mt19937 rng(seed());
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (int64_t blocks : {1, 8, 18, 128}) {  // 18: two groups and a ragged one
        SCOPED_TRACE("blocks " + std::to_string(blocks));
        std::vector<block_q8a> a(static_cast<size_t>(blocks));
        for (int64_t b = 0; b < blocks; ++b) {  // both signs with every residue (128 blocks), then the extremes
            const int32_t size = 64 * int32_t(rng() % 63) + int32_t(b % 64);
            a[size_t(b)].sum = b / 64 % 2 ? -size : size;
        }
        a[0].sum = -4064;
        if (blocks > 1) a[1].sum = 4064;
        ASSERT_EQ(split_sum_count(blocks), (blocks + 7) / 8 * 16);
        std::vector<uint16_t> split(size_t(split_sum_count(blocks)), 0xFFFF);
        split_block_sums(a.data(), blocks, split.data());
        for (int64_t b = 0; b < (blocks + 7) / 8 * 8; ++b) {
            const float hi = fp16_to_fp32(split[size_t(b / 8 * 16 + b % 8)]);
            const float lo = fp16_to_fp32(split[size_t(b / 8 * 16 + 8 + b % 8)]);
            ASSERT_EQ(hi, std::trunc(hi)) << "block " << b;
            ASSERT_TRUE(lo >= 0.0f && lo <= 63.0f && lo == std::trunc(lo)) << "block " << b << ": lo " << lo;
            ASSERT_EQ(int32_t(64.0f * hi + lo), b < blocks ? a[size_t(b)].sum : 0) << "block " << b;
        }
    }
}

TEST(DotTerms, KquantRowsInTheCudaOrder) {
    std::mt19937 rng(seed());
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : int_types()) {
        if (!is_k_type(t)) continue;
        const int64_t sb_bytes = int64_t(tensor_type_info(uint32_t(t))->block_bytes);
        for (int64_t k : row_lengths(t)) {
            for (int row = 0; row < 4; ++row) {
                SCOPED_TRACE(name(t) + " k " + std::to_string(k) + " row " + std::to_string(row));
                const std::vector<float> x = random_acts(rng, k);
                const std::vector<uint8_t> w = quantize(t, random_weights(rng, k));
                const std::vector<block_q8a> a = quantize_acts_grouped(x);
                std::vector<int32_t> A(size_t(k / 32)), X(size_t(k / 32));
                dot_int_sums_kernel(t, SimdPath::scalar)(w.data(), a.data(), k, A.data(), X.data());
                float want = 0.0f;
                for (int64_t i = 0; i < k / 256; ++i) {
                    int32_t at = 0, xt = 0;
                    for (int j = 0; j < 8; ++j) at += A[size_t(8 * i + j)], xt += X[size_t(8 * i + j)];
                    float d, dmin;
                    kquant_d_dmin(t, w.data() + i * sb_bytes, d, dmin);
                    const bool has_min = t == TensorType::Q2_K || t == TensorType::Q4_K || t == TensorType::Q5_K;
                    const float inner = has_min ? std::fma(-dmin, float(xt), d * float(at)) : d * float(at);
                    want = std::fma(a[size_t(8 * i)].d, inner, want);
                }
                const float got = dot_row_chunked(t, w.data(), a.data(), k);
                ASSERT_EQ(bits_of(got), bits_of(want)) << "dot_row_chunked " << got << ", by definition " << want;

                // Against the exact product of the dequantized row and x: each
                // element is off by at most half its group's step, and the float
                // steps add a few roundings of the row's magnitude.
                const std::vector<float> wf = dequantize(t, w.data(), k);
                double exact = 0, quant_err = 0, magnitude = 0;
                for (int64_t e = 0; e < k; ++e) {
                    exact += double(wf[size_t(e)]) * x[size_t(e)];
                    quant_err += std::fabs(double(wf[size_t(e)])) * 0.5 * a[size_t(e / 32)].d;
                    magnitude += std::fabs(double(wf[size_t(e)]) * x[size_t(e)]);
                }
                EXPECT_LE(std::fabs(double(got) - exact), quant_err * 1.001 + 1e-5 * magnitude)
                    << "got " << got << ", exact " << exact;
            }
        }
    }
}

TEST(DotTerms, ChunkedOrderOnHandMadeTerms) {
    // Eight ones, then 1e9 and -1e9. Chunks: 8 and (1e9 - 1e9) = 0, so 8.
    // Left to right the ones are absorbed by 1e9 (ulp 64) and the sum is 0;
    // the CPU's eight lanes also give 0 (lane 0 holds 1e9, lane 1 -1e9).
    std::vector<float> t(8, 1.0f);
    t.push_back(1e9f);
    t.push_back(-1e9f);
    EXPECT_EQ(sum_terms_chunked(t.data(), int64_t(t.size())), 8.0f);
    EXPECT_EQ(fold_lanes8(t), 0.0f);
    float sequential = 0.0f;
    for (float v : t) sequential += v;
    EXPECT_EQ(sequential, 0.0f);

    // 1e9 first in its chunk absorbs the seven ones after it; the next chunk's
    // eight ones sum to 8, below half an ulp of 1e9, absorbed when added; the
    // last (ragged) chunk, -1e9, cancels: 0. (Eight lanes give 14: lane 0
    // holds 1e9 + 1 - 1e9 = 0, the other seven lanes 2 each.)
    std::vector<float> u = {1e9f, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1e9f};
    EXPECT_EQ(sum_terms_chunked(u.data(), int64_t(u.size())), 0.0f);
    EXPECT_EQ(fold_lanes8(u), 14.0f);

    // Within a chunk, left to right: 40 + 40 + 1e9 keeps the 80 (1e9 + 80 rounds
    // to 1e9 + 64), while 1e9 + 40 + 40 rounds up twice: (1e9 + 64) + 40 -> 1e9 + 128.
    std::vector<float> v = {40, 40, 1e9f, 0, 0, 0, 0, 0, -1e9f};
    EXPECT_EQ(sum_terms_chunked(v.data(), int64_t(v.size())), 64.0f);
    std::vector<float> w = {1e9f, 40, 40, 0, 0, 0, 0, 0, -1e9f};
    EXPECT_EQ(sum_terms_chunked(w.data(), int64_t(w.size())), 128.0f);

    // The result starts at +0.0: a row of -0.0 terms gives +0.0, not -0.0.
    std::vector<float> z(11, -0.0f);
    const float zero = sum_terms_chunked(z.data(), int64_t(z.size()));
    EXPECT_EQ(bits_of(zero), 0u);
    // No blocks: +0.0.
    EXPECT_EQ(bits_of(sum_terms_chunked(nullptr, 0)), 0u);

    // A ragged last chunk of one term is added, not dropped: 2^24 + 8 - 2^24.
    std::vector<float> r(8, 1.0f);
    r.push_back(16777216.0f);
    for (int i = 0; i < 7; ++i) r.push_back(1.0f);  // each absorbed by 2^24 (ties to even)
    r.push_back(-16777216.0f);
    EXPECT_EQ(sum_terms_chunked(r.data(), int64_t(r.size())), 8.0f);
}

TEST(DotTerms, ChunkedOrderOnRandomTerms) {
    std::mt19937 rng(seed());
    SCOPED_TRACE("seed " + std::to_string(seed()));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> log_scale(-10.0f, 10.0f);
    for (int n = 0; n <= 70; ++n) {
        std::vector<float> t(static_cast<size_t>(n));
        for (float& v : t) v = normal(rng) * std::exp(log_scale(rng));
        ASSERT_EQ(bits_of(sum_terms_chunked(t.data(), n)), bits_of(fold_chunks(t))) << "n " << n;
    }
}

TEST(DotTerms, ErrorsForTypesWithoutAnIntegerKernel) {
    std::vector<float> w(256, 1.0f);
    std::vector<block_q8a> a(8);
    std::vector<float> terms(8);
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::BF16, TensorType::Q8_K}) {
        const Status st = dot_block_terms(t, w.data(), a.data(), 256, terms.data());
        ASSERT_FALSE(st.ok()) << name(t);
        EXPECT_NE(st.message().find("no integer dot product"), std::string::npos) << st.message();
        EXPECT_NE(st.message().find(name(t)), std::string::npos) << st.message();
        EXPECT_TRUE(std::isnan(dot_row_chunked(t, w.data(), a.data(), 256))) << name(t);
    }
    // A K-quant row must be whole super-blocks: 576 = 2.25 of them.
    std::vector<uint8_t> q(row_bytes(TensorType::Q4_K, 768));
    std::vector<block_q8a> a18(24);
    std::vector<float> t18(24);
    const Status st = dot_block_terms(TensorType::Q4_K, q.data(), a18.data(), 32 * 18, t18.data());
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("576"), std::string::npos) << st.message();
    EXPECT_TRUE(std::isnan(dot_row_chunked(TensorType::Q4_K, q.data(), a18.data(), 32 * 18)));
    EXPECT_FALSE(dot_block_terms(TensorType::Q4_0, q.data(), a18.data(), -32, t18.data()).ok());
}

}  // namespace
