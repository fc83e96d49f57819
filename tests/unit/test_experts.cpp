// Mixture-of-experts operations on the CPU backend: the routing rule
// (cpu::route_top_k), the expert matmuls against matmul() of each routed row
// alone, and the weighted combine, on fresh random inputs of ragged sizes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "quant/quant.h"
#include "tests/support/test_seed.h"

namespace tern {
namespace {

using backend::Tensor;
using backend::Weight;

TEST(RouteTopK, LargestFirstTiesToTheLowerIndexNanLast) {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    const float logits[7] = {0.5f, 2.0f, nan, 2.0f, -1.0f, 3.0f, 0.5f};
    int32_t ids[5];
    float w[5];
    backend::cpu::route_top_k(logits, 7, 5, ids, w);
    const int32_t want[5] = {5, 1, 3, 0, 6};
    for (int j = 0; j < 5; ++j) EXPECT_EQ(ids[j], want[j]) << "pick " << j;
    // The softmax over the chosen logits, its sum in order.
    float e[5], sum = 0.0f;
    for (int j = 0; j < 5; ++j) sum += (e[j] = std::exp(logits[want[j]] - logits[want[0]]));
    for (int j = 0; j < 5; ++j) EXPECT_EQ(w[j], e[j] / sum);
    EXPECT_NEAR(w[0] + w[1] + w[2] + w[3] + w[4], 1.0f, 1e-6f);
    EXPECT_EQ(w[1], w[2]);  // equal logits, equal weights

    // One expert: all the weight. Every expert: a permutation.
    backend::cpu::route_top_k(logits, 7, 1, ids, w);
    EXPECT_EQ(ids[0], 5);
    EXPECT_EQ(w[0], 1.0f);
    int32_t all[7];
    float wall[7];
    backend::cpu::route_top_k(logits, 7, 7, all, wall);
    EXPECT_EQ(all[5], 4);
    EXPECT_EQ(all[6], 2);  // NaN counts as -inf
    EXPECT_EQ(wall[6], 0.0f);  // and weighs nothing: the token stays a number
    float rest = 0.0f;
    for (int j = 0; j < 6; ++j) rest += wall[j];
    EXPECT_NEAR(rest, 1.0f, 1e-6f);
}

struct Experts {
    std::vector<uint8_t> bytes;  // the stacked tensor: expert e's rows after expert e-1's
    std::vector<Weight> views;
};

Experts make_experts(TensorType type, int n_expert, int64_t rows, int64_t cols, std::mt19937& rng) {
    std::normal_distribution<float> nd(0.0f, 0.05f);
    const size_t rb = quant::row_bytes(type, cols);
    Experts x;
    x.bytes.resize(size_t(n_expert * rows) * rb);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < n_expert * rows; ++r) {
        for (float& v : row) v = nd(rng);
        EXPECT_TRUE(quant::quantize_row(type, row.data(), x.bytes.data() + size_t(r) * rb, cols).ok());
    }
    for (int e = 0; e < n_expert; ++e) {
        Weight w;
        w.name = "expert " + std::to_string(e);
        w.type = type;
        w.rows = rows;
        w.cols = cols;
        w.row_bytes = rb;
        w.host = x.bytes.data() + size_t(e * rows) * rb;
        x.views.push_back(w);
    }
    return x;
}

// Every routed row equals matmul() of that row alone with its expert's
// matrix, bit for bit, for an input shared by a token's experts and for one
// row per (token, expert); the combine is w_0 y_0, then fma in order.
TEST(CpuExperts, EachRoutedRowHasTheBitsOfItsOwnMatmul) {
    std::mt19937 rng(test::run_seed());
    std::normal_distribution<float> nd(0.0f, 1.0f);
    struct Shape { TensorType type; int n_expert, k; int64_t n_tok, cols, rows; };
    for (const Shape sh : {Shape{TensorType::Q4_K, 8, 3, 5, 512, 96}, Shape{TensorType::Q8_0, 4, 2, 1, 96, 40},
                           Shape{TensorType::F16, 6, 6, 9, 64, 33}, Shape{TensorType::Q6_K, 16, 4, 13, 256, 64}}) {
        SCOPED_TRACE(std::string(tensor_type_name(uint32_t(sh.type))) + " k " + std::to_string(sh.k));
        auto be = backend::make_cpu_backend(2);
        const Experts ex = make_experts(sh.type, sh.n_expert, sh.rows, sh.cols, rng);
        std::vector<Weight> views;
        for (const Weight& w : ex.views) views.push_back(*be->register_weight(w));
        const int64_t n_pairs = sh.n_tok * sh.k;
        auto logits = *be->alloc(sh.n_tok, sh.n_expert);
        auto x = *be->alloc(sh.n_tok, sh.cols);
        auto xp = *be->alloc(n_pairs, sh.cols);  // one row per (token, expert)
        auto y = *be->alloc(n_pairs, sh.rows);
        auto yp = *be->alloc(n_pairs, sh.rows);
        auto out = *be->alloc(sh.n_tok, sh.rows);
        auto one_y = *be->alloc(1, sh.rows);
        for (Tensor t : {logits, x, xp})
            for (int64_t i = 0; i < t.rows * t.cols; ++i) t.data[i] = nd(rng);
        for (Tensor t : {y, yp, out})
            for (int64_t i = 0; i < t.rows * t.cols; ++i) t.data[i] = std::numeric_limits<float>::quiet_NaN();

        be->route_experts(logits, sh.k);
        be->matmul_experts(views, x, y);
        be->matmul_experts(views, xp, yp);
        be->combine_experts(y, out);
        ASSERT_TRUE(be->take_error().ok());

        std::vector<int32_t> ids(static_cast<size_t>(sh.k));
        std::vector<float> w(static_cast<size_t>(sh.k));
        for (int64_t t = 0; t < sh.n_tok; ++t) {
            backend::cpu::route_top_k(logits.row(t), sh.n_expert, sh.k, ids.data(), w.data());
            for (int j = 0; j < sh.k; ++j) {
                const int64_t p = t * sh.k + j;
                const Weight& we = views[size_t(ids[size_t(j)])];
                be->matmul(we, Tensor{x.row(t), 1, sh.cols}, one_y);
                ASSERT_EQ(std::memcmp(one_y.data, y.row(p), size_t(sh.rows) * sizeof(float)), 0) << "pair " << p;
                be->matmul(we, Tensor{xp.row(p), 1, sh.cols}, one_y);
                ASSERT_EQ(std::memcmp(one_y.data, yp.row(p), size_t(sh.rows) * sizeof(float)), 0) << "pair " << p;
            }
            for (int64_t i = 0; i < sh.rows; ++i) {
                float acc = w[0] * y.row(t * sh.k)[i];
                for (int j = 1; j < sh.k; ++j) acc = std::fma(w[size_t(j)], y.row(t * sh.k + j)[i], acc);
                ASSERT_EQ(acc, out.row(t)[i]) << "token " << t << " column " << i;
            }
        }
    }
}

TEST(CpuExperts, MismatchedShapesAreErrors) {
    auto be = backend::make_cpu_backend(1);
    std::mt19937 rng(test::run_seed());
    const Experts ex = make_experts(TensorType::Q8_0, 4, 32, 64, rng);
    auto logits = *be->alloc(3, 4);
    auto x = *be->alloc(2, 64);  // not 3 tokens nor 3 x 2 pairs
    auto y = *be->alloc(6, 32);
    for (int64_t i = 0; i < 12; ++i) logits.data[i] = float(i);
    be->route_experts(logits, 5);  // more than the 4 experts
    EXPECT_NE(be->take_error().message().find("cannot be routed"), std::string::npos);
    be->route_experts(logits, 2);
    ASSERT_TRUE(be->take_error().ok());
    be->matmul_experts(ex.views, x, y);
    EXPECT_NE(be->take_error().message().find("do not match the routing"), std::string::npos);
}

}  // namespace
}  // namespace tern
