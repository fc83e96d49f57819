// The CUDA backend's mixture-of-experts operations against their CPU twins
// and against its own dense matmul:
//  - route_experts picks each token's experts by cpu::route_top_k's rule
//    (checked through the expert matmuls: a routed row computed with any other
//    expert would not have that expert's bits), ties and NaN included;
//  - matmul_experts gives every routed row the bits matmul() gives that row
//    alone with its expert's matrix, on the decode path (up to 8 tokens, a
//    mat-vec per routed row) and the prefill path (rows grouped by expert),
//    for an input shared by a token's experts and one row per (token, expert),
//    every integer weight type (q6_K in both layouts the backend registers)
//    and f16;
//  - matmul_experts_swiglu has the bits of both expert matmuls and swiglu,
//    matmul_experts_combine those of matmul_experts and combine_experts, and
//    matmul_experts_combine_add those of the combine then add;
//  - combine_experts is w_0 y_0 then fma in order, bit for bit, with the
//    device's routing weights (read back through a combine of one-hot rows);
//    those weights are the CPU's where they are exact (equal logits), else
//    within 8 ulp of them (expf, its sum and the division differ by a few).
// Outputs are poisoned before each call; fresh random inputs each run.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "base/fp16.h"
#include "gpu_test_util.h"
#include "quant/quant.h"
#include "tests/support/test_seed.h"

namespace tern {
namespace {

using backend::Tensor;
using backend::Weight;

struct Shape {
    TensorType type;
    int n_expert, k;
    int64_t n_tok, cols, rows;
};

std::string shape_name(const Shape& s) {
    return std::string(tensor_type_name(uint32_t(s.type))) + " " + std::to_string(s.n_tok) + " tokens, " +
           std::to_string(s.k) + " of " + std::to_string(s.n_expert) + " experts, " + std::to_string(s.rows) +
           " x " + std::to_string(s.cols);
}

class CudaExperts : public gpu_test::GpuTest {};

void fill(backend::Backend& be, Tensor t, const std::vector<float>& v) { be.upload(v.data(), t); }
std::vector<float> read(backend::Backend& be, Tensor t) {
    std::vector<float> v(size_t(t.rows * t.cols));
    be.download(t, v.data());
    return v;
}

void check_shape(const Shape& sh, bool equal_logits, std::mt19937& rng) {
    SCOPED_TRACE(shape_name(sh) + (equal_logits ? ", equal logits" : ""));
    auto made = backend::make_cuda_backend(0);
    ASSERT_TRUE(made.ok()) << made.error().message;
    backend::Backend& be = **made;
    std::normal_distribution<float> nd(0.0f, 1.0f), wd(0.0f, 0.05f);

    // The experts: one stacked tensor, a view per expert, as the loader makes
    // them. A second set of the shape is the up matrices of the gated form.
    const size_t rb = quant::row_bytes(sh.type, sh.cols);
    std::vector<uint8_t> bytes(size_t(sh.n_expert * sh.rows) * rb), up_bytes(bytes.size());
    std::vector<float> row(static_cast<size_t>(sh.cols));
    std::vector<Weight> experts, up_experts;
    for (auto [set, data] : {std::pair{&experts, &bytes}, std::pair{&up_experts, &up_bytes}}) {
        for (int64_t r = 0; r < sh.n_expert * sh.rows; ++r) {
            for (float& v : row) v = wd(rng);
            ASSERT_TRUE(quant::quantize_row(sh.type, row.data(), data->data() + size_t(r) * rb, sh.cols).ok());
        }
        for (int e = 0; e < sh.n_expert; ++e) {
            Weight w;
            w.name = "expert " + std::to_string(e);
            w.type = sh.type;
            w.rows = sh.rows;
            w.cols = sh.cols;
            w.row_bytes = rb;
            w.host = data->data() + size_t(e * sh.rows) * rb;
            auto reg = be.register_weight(w);
            ASSERT_TRUE(reg.ok()) << reg.error().message;
            set->push_back(*reg);
        }
    }

    const int64_t n_pairs = sh.n_tok * sh.k;
    Tensor logits = *be.alloc(sh.n_tok, sh.n_expert), x = *be.alloc(sh.n_tok, sh.cols);
    Tensor xp = *be.alloc(n_pairs, sh.cols), y = *be.alloc(n_pairs, sh.rows), yp = *be.alloc(n_pairs, sh.rows);
    Tensor out = *be.alloc(sh.n_tok, sh.rows), one_y = *be.alloc(1, sh.rows);
    std::vector<float> hl(size_t(sh.n_tok * sh.n_expert)), hx(size_t(sh.n_tok * sh.cols)), hxp(size_t(n_pairs * sh.cols));
    for (size_t i = 0; i < hl.size(); ++i) {
        // Some ties (values on a coarse grid) and a NaN now and then.
        hl[i] = equal_logits ? 0.5f : std::round(nd(rng) * 4.0f) / 4.0f;
        if (!equal_logits && rng() % 97 == 0) hl[i] = std::numeric_limits<float>::quiet_NaN();
    }
    for (float& v : hx) v = nd(rng);
    for (float& v : hxp) v = nd(rng);
    const std::vector<float> poison(size_t(n_pairs * sh.rows), std::numeric_limits<float>::quiet_NaN());
    fill(be, logits, hl);
    fill(be, x, hx);
    fill(be, xp, hxp);
    fill(be, y, poison);
    fill(be, yp, poison);
    fill(be, out, std::vector<float>(size_t(sh.n_tok * sh.rows), std::numeric_limits<float>::quiet_NaN()));

    be.set_batch(backend::BatchLayout{std::vector<int32_t>(size_t(sh.n_tok), 0),
                                      std::vector<int32_t>(size_t(sh.n_tok), 0), -1});
    be.route_experts(logits, sh.k);
    be.matmul_experts(experts, x, y);
    be.matmul_experts(experts, xp, yp);
    be.combine_experts(y, out);
    const std::vector<float> gy = read(be, y), gyp = read(be, yp), gout = read(be, out);
    ASSERT_TRUE(be.take_error().ok());

    // The gated form has the bits of both expert matmuls and swiglu, for a
    // shared input and one row per (token, expert).
    for (Tensor in : {x, xp}) {
        Tensor g = *be.alloc(n_pairs, sh.rows), u = *be.alloc(n_pairs, sh.rows);
        Tensor sep_g = *be.alloc(n_pairs, sh.rows), sep_u = *be.alloc(n_pairs, sh.rows);
        fill(be, g, poison);
        fill(be, u, poison);
        be.matmul_experts_swiglu(in, experts, up_experts, g, u);
        be.matmul_experts(experts, in, sep_g);
        be.matmul_experts(up_experts, in, sep_u);
        be.swiglu(sep_g, sep_u);
        const std::vector<float> fused = read(be, g), separate = read(be, sep_g);
        ASSERT_TRUE(be.take_error().ok());
        for (int64_t p = 0; p < n_pairs; ++p)
            ASSERT_EQ(std::memcmp(fused.data() + p * sh.rows, separate.data() + p * sh.rows,
                                  size_t(sh.rows) * sizeof(float)),
                      0)
                << "routed row " << p << (in.data == x.data ? ", shared input" : ", own input");
    }
    // The down form with its combine has the bits of matmul_experts then
    // combine_experts (yp is xp's routed rows).
    {
        Tensor o = *be.alloc(sh.n_tok, sh.rows), sep = *be.alloc(sh.n_tok, sh.rows);
        Tensor scratch = *be.alloc(n_pairs, sh.rows);
        fill(be, o, std::vector<float>(size_t(sh.n_tok * sh.rows), std::numeric_limits<float>::quiet_NaN()));
        be.matmul_experts_combine(experts, xp, scratch, o);
        be.combine_experts(yp, sep);
        const std::vector<float> fused = read(be, o), separate = read(be, sep);
        ASSERT_TRUE(be.take_error().ok());
        ASSERT_EQ(std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)), 0)
            << "matmul_experts_combine";
        // Added to a residual (matmul_experts_combine_add): the bits of the combine then add.
        Tensor acc = *be.alloc(sh.n_tok, sh.rows), sep_acc = *be.alloc(sh.n_tok, sh.rows);
        Tensor acc_scratch = *be.alloc(sh.n_tok, sh.rows);
        std::vector<float> residual(size_t(sh.n_tok * sh.rows));
        for (float& v : residual) v = nd(rng) * 8.0f;
        fill(be, acc, residual);
        fill(be, sep_acc, residual);
        be.matmul_experts_combine_add(experts, xp, scratch, acc, acc_scratch);
        be.add(sep_acc, sep);
        const std::vector<float> added = read(be, acc), apart = read(be, sep_acc);
        ASSERT_TRUE(be.take_error().ok());
        ASSERT_EQ(std::memcmp(added.data(), apart.data(), added.size() * sizeof(float)), 0)
            << "matmul_experts_combine_add";
    }

    // The device's weights: a combine of rows where routed row j of a token
    // is 1 in column j and 0 elsewhere gives w_j there, exactly.
    ASSERT_GE(sh.rows, sh.k);
    std::vector<float> one_hot(size_t(n_pairs * sh.rows), 0.0f);
    for (int64_t p = 0; p < n_pairs; ++p) one_hot[size_t(p * sh.rows + p % sh.k)] = 1.0f;
    fill(be, y, one_hot);
    fill(be, out, std::vector<float>(size_t(sh.n_tok * sh.rows), std::numeric_limits<float>::quiet_NaN()));
    be.combine_experts(y, out);
    const std::vector<float> gw = read(be, out);
    ASSERT_TRUE(be.take_error().ok());
    auto ulps_apart = [](float a, float b) {
        int32_t ia, ib;
        std::memcpy(&ia, &a, 4);
        std::memcpy(&ib, &b, 4);
        return std::abs(int64_t(ia) - int64_t(ib));  // both positive here
    };

    std::vector<int32_t> ids(static_cast<size_t>(sh.k));
    std::vector<float> w(static_cast<size_t>(sh.k));
    for (int64_t t = 0; t < sh.n_tok; ++t) {
        backend::cpu::route_top_k(hl.data() + t * sh.n_expert, sh.n_expert, sh.k, ids.data(), w.data());
        for (int j = 0; j < sh.k; ++j) {
            const int64_t p = t * sh.k + j;
            const Weight& we = experts[size_t(ids[size_t(j)])];
            fill(be, one_y, poison);
            be.matmul(we, Tensor{x.row(t), 1, sh.cols}, one_y);
            const std::vector<float> want = read(be, one_y);
            ASSERT_EQ(std::memcmp(want.data(), gy.data() + p * sh.rows, size_t(sh.rows) * sizeof(float)), 0)
                << "token " << t << " expert " << j << " (" << ids[size_t(j)] << "), shared input";
            be.matmul(we, Tensor{xp.row(p), 1, sh.cols}, one_y);
            const std::vector<float> want_p = read(be, one_y);
            ASSERT_EQ(std::memcmp(want_p.data(), gyp.data() + p * sh.rows, size_t(sh.rows) * sizeof(float)), 0)
                << "token " << t << " expert " << j << " (" << ids[size_t(j)] << "), own input";
        }
        std::vector<float> dw(static_cast<size_t>(sh.k));
        for (int j = 0; j < sh.k; ++j) {
            dw[size_t(j)] = gw[size_t(t * sh.rows + j)];
            if (equal_logits)
                ASSERT_EQ(dw[size_t(j)], w[size_t(j)]) << "token " << t << " weight " << j;
            else
                ASSERT_LE(ulps_apart(dw[size_t(j)], w[size_t(j)]), 8)
                    << "token " << t << " weight " << j << ": gpu " << dw[size_t(j)] << " cpu " << w[size_t(j)];
        }
        for (int64_t i = 0; i < sh.rows; ++i) {
            float acc = dw[0] * gy[size_t(t * sh.k * sh.rows + i)];
            for (int j = 1; j < sh.k; ++j) acc = std::fma(dw[size_t(j)], gy[size_t((t * sh.k + j) * sh.rows + i)], acc);
            ASSERT_EQ(fp32_to_bits(gout[size_t(t * sh.rows + i)]), fp32_to_bits(acc))
                << "token " << t << " column " << i << ": gpu " << gout[size_t(t * sh.rows + i)] << " want " << acc;
        }
    }
    ASSERT_TRUE(be.take_error().ok());
}

TEST_F(CudaExperts, RoutedRowsHaveTheirOwnMatmulsBitsAndCombineInOrder) {
    std::mt19937 rng(test::run_seed() + 41);
    const Shape shapes[] = {
        // decode: a mat-vec per routed row
        {TensorType::Q4_K, 128, 8, 1, 512, 96},   {TensorType::Q6_K, 8, 2, 3, 256, 130},
        {TensorType::Q8_0, 16, 3, 8, 96, 64},     {TensorType::Q5_0, 4, 4, 2, 160, 33},
        // prefill: rows grouped by expert, some experts with none, some past a 64-row tile
        {TensorType::Q4_K, 128, 8, 70, 512, 200}, {TensorType::Q6_K, 8, 2, 300, 256, 130},
        {TensorType::Q8_0, 16, 3, 9, 96, 64},     {TensorType::Q4_0, 64, 6, 41, 64, 300},
        {TensorType::Q5_K, 32, 1, 129, 256, 64},  {TensorType::Q4_1, 256, 8, 33, 32, 40},
        // float experts
        {TensorType::F16, 8, 2, 5, 64, 48},       {TensorType::F16, 8, 3, 20, 64, 48},
    };
    for (const Shape& sh : shapes) {
        check_shape(sh, false, rng);
        if (HasFatalFailure()) return;
    }
    for (const Shape& sh : {shapes[2], shapes[6]}) {
        check_shape(sh, true, rng);
        if (HasFatalFailure()) return;
    }
}

// q6_K registered raw (210-byte blocks) instead of padded: the routed kernels
// read either layout.
TEST_F(CudaExperts, RawQ6KLayoutToo) {
    ASSERT_EQ(setenv("TERN_CUDA_Q6K", "raw", 1), 0);
    std::mt19937 rng(test::run_seed() + 43);
    check_shape({TensorType::Q6_K, 8, 2, 3, 256, 130}, false, rng);
    check_shape({TensorType::Q6_K, 8, 2, 100, 256, 130}, false, rng);
    unsetenv("TERN_CUDA_Q6K");
}

TEST_F(CudaExperts, MismatchedShapesAreErrors) {
    auto made = backend::make_cuda_backend(0);
    ASSERT_TRUE(made.ok()) << made.error().message;
    backend::Backend& be = **made;
    Tensor logits = *be.alloc(3, 4);
    be.route_experts(logits, 5);
    EXPECT_NE(be.take_error().message().find("cannot be routed"), std::string::npos);
    be.route_experts(logits, 2);
    Tensor y = *be.alloc(6, 8), out = *be.alloc(2, 8);
    be.combine_experts(y, out);
    EXPECT_NE(be.take_error().message().find("do not match the routing"), std::string::npos);
}

}  // namespace
}  // namespace tern
