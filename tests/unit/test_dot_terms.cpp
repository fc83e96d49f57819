// quant::dot_block_terms(_fused) / sum_terms_chunked / dot_row_chunked: the CPU twin
// of the CUDA kernels' summation order.
//  - the per-block terms, folded in the CPU kernels' eight-lane order, give the
//    dot kernel's bits on every path, for every integer type (so the terms are
//    the kernels' own terms, not a recomputation that merely agrees);
//  - the fused terms (the CUDA kernels'): the same bits as the kernels' terms
//    for every type but q4_K/q5_K, whose fused terms are within 8 ulp of the
//    block's magnitude (sum |w a|) of the kernels' terms;
//  - dot_row_chunked (chunk by chunk, no buffer) equals sum_terms_chunked of
//    the whole row's fused terms bit for bit, ragged legacy rows included;
//  - sum_terms_chunked follows the documented order on hand-made terms where
//    the order changes the result, and on random terms;
//  - types without an integer kernel and ragged K-quant rows are errors.
// Fresh random data every run; the seed is printed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "base/fp16.h"
#include "dot_test_util.h"
#include "quant/kquant_scales.h"

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

                std::vector<float> fused(terms.size(), std::numeric_limits<float>::quiet_NaN());
                const Status fs = dot_block_terms_fused(t, w.data(), a.data(), k, fused.data());
                ASSERT_TRUE(fs.ok()) << fs.message();
                const bool fused_form = t == TensorType::Q4_K || t == TensorType::Q5_K;
                std::vector<float> wf(static_cast<size_t>(k));
                ASSERT_TRUE(dequantize_row(t, w.data(), wf.data(), k).ok());
                for (size_t b = 0; b < terms.size(); ++b) {
                    if (!fused_form) {
                        ASSERT_EQ(bits_of(fused[b]), bits_of(terms[b])) << "block " << b;
                        continue;
                    }
                    // The term is P - Q, P from d*sc*q and Q from dmin*mn: bound by their sizes,
                    // since the two can cancel far below either.
                    const uint8_t* sb = w.data() + (b / 8) * size_t(tensor_type_info(uint32_t(t))->block_bytes);
                    uint16_t dmin_bits;
                    std::memcpy(&dmin_bits, sb + 2, 2);
                    uint8_t sc, mn;
                    unpack_scale_min_k4(int(b % 8), sb + 4, &sc, &mn);
                    const double offset = double(fp16_to_fp32(dmin_bits)) * mn;
                    double magnitude = std::fabs(offset * double(a[b].d) * a[b].sum);
                    for (int l = 0; l < 32; ++l)
                        magnitude += std::fabs((double(wf[32 * b + size_t(l)]) + offset) * double(a[b].d) * a[b].qs[l]);
                    ASSERT_LE(std::fabs(double(fused[b]) - double(terms[b])), 8 * 0x1p-24 * magnitude)
                        << "block " << b << ": fused " << fused[b] << ", kernel term " << terms[b];
                }
                const float row_chunked = dot_row_chunked(t, w.data(), a.data(), k);
                const float fused_chunked = sum_terms_chunked(fused.data(), int64_t(fused.size()));
                ASSERT_EQ(bits_of(row_chunked), bits_of(fused_chunked))
                    << "dot_row_chunked " << row_chunked << " vs sum_terms_chunked " << fused_chunked;
                // Two orders of the same terms: equal up to float rounding.
                double abs_sum = 0;
                for (float v : terms) abs_sum += std::fabs(double(v));
                EXPECT_LE(std::fabs(double(chunked) - double(lanes)), 2.0 * double(k / 32) * 0x1p-24 * abs_sum);
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
