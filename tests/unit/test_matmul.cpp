// backend/cpu/matmul: the threaded matmul over GGUF weight rows, for every
// weight type and SIMD path, with batches of 1..17, 40 and 64 tokens and row
// counts that fill no tile evenly. Checked: every output written (the buffer
// starts as NaN), each element equal to the one-token row kernel's result on
// the once-quantized activations (so the multi-token kernels that batches
// use give the one-token bits), same bits from call to call, across thread
// counts and across paths, and a token's row independent of the rest of the
// batch. With grouped_kquant_acts, K-quant matrices (and only they) read
// activations grouped as the CUDA kernels read them, also through the
// backend's shared input. Errors come back as values and leave the output
// untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "dot_test_util.h"

namespace {

using namespace tern;
using namespace tern::quant;
using namespace tern::dot_testing;
using backend::Weight;
using backend::cpu::MatmulOptions;

const int64_t kTokenCounts[] = {1, 3, 8, 17, 64};

struct Matrix {
    std::vector<uint8_t> bytes;
    Weight w;
};

// rows x cols of random weights of type t, rows `pad` bytes apart beyond their size.
Matrix make_matrix(std::mt19937& rng, TensorType t, int64_t rows, int64_t cols, size_t pad = 0) {
    const size_t rb = row_bytes(t, cols);
    Matrix m;
    m.bytes.assign(size_t(rows) * (rb + pad), 0xA5);
    for (int64_t r = 0; r < rows; ++r) {
        const std::vector<uint8_t> q = quantize(t, random_weights(rng, cols));
        std::memcpy(m.bytes.data() + size_t(r) * (rb + pad), q.data(), rb);
    }
    m.w.name = std::string("w");  // (not = "w": GCC 12 -O3 warns falsely, -Wrestrict)
    m.w.type = t;
    m.w.rows = rows;
    m.w.cols = cols;
    m.w.host = m.bytes.data();
    m.w.row_bytes = rb + pad;
    return m;
}

std::vector<float> poisoned(int64_t n) {
    return std::vector<float>(size_t(n), std::numeric_limits<float>::quiet_NaN());
}

std::vector<float> run(const Weight& w, const std::vector<float>& x, int64_t n_tokens, const MatmulOptions& opt) {
    std::vector<float> out = poisoned(n_tokens * w.rows);
    const Status s = backend::cpu::matmul(w, x.data(), n_tokens, out.data(), opt);
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(bits_of(a[i]), bits_of(b[i])) << what << " at " << i;
}

// Expected output of one (row, token) pair: the row kernel on that token alone.
float expected(const Weight& w, const std::vector<float>& x, int64_t r, int64_t t, SimdPath path) {
    const auto* row = static_cast<const uint8_t*>(w.host) + size_t(r) * w.row_bytes;
    const float* xt = x.data() + t * w.cols;
    if (dot_float_type(w.type)) return dot_float_kernel(w.type, path)(row, xt, w.cols);
    std::vector<block_q8a> a(static_cast<size_t>(w.cols / 32));
    quantize_act_row(xt, a.data(), w.cols, SimdPath::scalar);
    return dot_row_kernel(w.type, path)(row, a.data(), w.cols);
}

std::vector<TensorType> all_matmul_types() {
    std::vector<TensorType> t = int_types();
    t.insert(t.end(), {TensorType::F32, TensorType::F16, TensorType::BF16});
    return t;
}

TEST(Matmul, EveryTypePathAndBatchSize) {
    std::mt19937 rng(seed() + 10);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : all_matmul_types()) {
        const int64_t cols = is_k_type(t) ? 512 : dot_float_type(t) ? 100 : 32 * 11;
        const int64_t rows = 37;  // two 16-row tiles and a ragged one
        const Matrix m = make_matrix(rng, t, rows, cols, t == TensorType::Q6_K ? 14 : 0);
        for (int64_t n : kTokenCounts) {
            SCOPED_TRACE(name(t) + " tokens=" + std::to_string(n));
            const std::vector<float> x = random_acts(rng, n * cols);
            std::vector<float> first;
            for (SimdPath path : available_paths()) {
                SCOPED_TRACE(simd_path_name(path));
                MatmulOptions opt;
                opt.path = path;
                const std::vector<float> out = run(m.w, x, n, opt);
                for (int64_t i = 0; i < n * rows; ++i) ASSERT_TRUE(std::isfinite(out[size_t(i)])) << "output " << i;
                for (int64_t tok = 0; tok < n; ++tok)
                    for (int64_t r = 0; r < rows; ++r)
                        ASSERT_EQ(bits_of(out[size_t(tok * rows + r)]), bits_of(expected(m.w, x, r, tok, path)))
                            << "token " << tok << " row " << r;
                if (first.empty()) first = out;
                else expect_same_bits(out, first, "path vs scalar");
                expect_same_bits(run(m.w, x, n, opt), out, "second call");
            }
        }
    }
}

// Batches run the multi-token kernels, eight tokens a call, over tiles of
// rows and tokens; every count of tokens that leaves a ragged call or tile,
// and row counts from one to past two tiles, against the one-token scalar
// kernel on each token alone (the one-token kernels agree across paths).
TEST(Matmul, BatchesGiveEveryTokenTheOneTokenBits) {
    std::mt19937 rng(seed() + 15);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    std::vector<int64_t> token_counts;
    for (int64_t n = 1; n <= 17; ++n) token_counts.push_back(n);
    token_counts.insert(token_counts.end(), {40, 64});
    const int64_t max_rows = 70, max_tokens = 64;
    for (TensorType t : all_matmul_types()) {
        // Legacy rows end in a ragged group of three blocks; K rows hold three super-blocks.
        // Rows are padded apart, so blocks sit at only 2-byte (F32: 4-byte) aligned addresses.
        const int64_t cols = is_k_type(t) ? 768 : dot_float_type(t) ? 100 : 32 * 11;
        const Matrix m = make_matrix(rng, t, max_rows, cols, t == TensorType::F32 ? 4 : 6);
        const std::vector<float> x = random_acts(rng, max_tokens * cols);
        std::vector<float> want(size_t(max_tokens * max_rows));
        for (int64_t tok = 0; tok < max_tokens; ++tok)
            for (int64_t r = 0; r < max_rows; ++r)
                want[size_t(tok * max_rows + r)] = expected(m.w, x, r, tok, SimdPath::scalar);
        for (int64_t rows : {int64_t(1), int64_t(7), int64_t(33), max_rows}) {
            Weight w = m.w;
            w.rows = rows;
            for (int64_t n : token_counts) {
                for (SimdPath path : available_paths()) {
                    SCOPED_TRACE(name(t) + " cols=" + std::to_string(cols) + " rows=" + std::to_string(rows) +
                                 " tokens=" + std::to_string(n) + " " + simd_path_name(path));
                    MatmulOptions opt;
                    opt.path = path;
                    opt.n_threads = n == 17 || n == 64 ? 2 : 1;  // (thread counts: next test)
                    const std::vector<float> out = run(w, x, n, opt);
                    for (int64_t tok = 0; tok < n; ++tok)
                        for (int64_t r = 0; r < rows; ++r)
                            ASSERT_EQ(bits_of(out[size_t(tok * rows + r)]), bits_of(want[size_t(tok * max_rows + r)]))
                                << "token " << tok << " row " << r;
                }
            }
        }
    }
}

TEST(Matmul, ThreadCountAndBatchDoNotChangeBits) {
    std::mt19937 rng(seed() + 11);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : {TensorType::Q4_K, TensorType::Q8_0, TensorType::Q6_K, TensorType::Q5_1, TensorType::F16}) {
        SCOPED_TRACE(name(t));
        const int64_t rows = 203, cols = 1024, n = 17;
        const Matrix m = make_matrix(rng, t, rows, cols);
        const std::vector<float> x = random_acts(rng, n * cols);
        for (SimdPath path : available_paths()) {
            SCOPED_TRACE(simd_path_name(path));
            MatmulOptions one, three, all;
            one.path = three.path = all.path = path;
            one.n_threads = 1;
            three.n_threads = 3;
            const std::vector<float> ref = run(m.w, x, n, one);
            expect_same_bits(run(m.w, x, n, three), ref, "3 threads vs 1");
            expect_same_bits(run(m.w, x, n, all), ref, "default threads vs 1");
            for (int64_t tok = 0; tok < n; ++tok) {
                const std::vector<float> xt(x.begin() + tok * cols, x.begin() + (tok + 1) * cols);
                const std::vector<float> alone = run(m.w, xt, 1, all);
                const std::vector<float> in_batch(ref.begin() + tok * rows, ref.begin() + (tok + 1) * rows);
                expect_same_bits(alone, in_batch, "token alone vs in a batch of 17");
            }
        }
    }
}

TEST(Matmul, PreQuantizedActivationsGiveTheSameResult) {
    std::mt19937 rng(seed() + 12);
    const int64_t rows = 50, cols = 768, n = 8;
    const Matrix m = make_matrix(rng, TensorType::Q3_K, rows, cols);
    const std::vector<float> x = random_acts(rng, n * cols);
    std::vector<block_q8a> xq(static_cast<size_t>(n * cols / 32));
    ASSERT_TRUE(backend::cpu::quantize_activations(x.data(), n, cols, xq.data()).ok());
    std::vector<float> out = poisoned(n * rows);
    ASSERT_TRUE(backend::cpu::matmul_q8a(m.w, xq.data(), n, out.data()).ok());
    expect_same_bits(out, run(m.w, x, n, {}), "matmul_q8a vs matmul");
}

// grouped_kquant_acts: K-quant weights see activations quantized one scale per
// 256 elements (as the CUDA backend's kernels do), other types per block; each
// output has the one-token row kernel's bits on those activations, and the
// grouping does change a K-quant result.
TEST(Matmul, GroupedActivationsForKquantWeightsOnly) {
    std::mt19937 rng(seed() + 14);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    const int64_t rows = 37, cols = 768, n = 9;
    MatmulOptions grouped;
    grouped.grouped_kquant_acts = true;
    for (TensorType t : {TensorType::Q4_K, TensorType::Q6_K, TensorType::Q8_0, TensorType::Q4_1}) {
        SCOPED_TRACE(name(t));
        const Matrix m = make_matrix(rng, t, rows, cols);
        const std::vector<float> x = random_acts(rng, n * cols);
        const bool kquant = t == TensorType::Q4_K || t == TensorType::Q6_K;
        EXPECT_EQ(backend::cpu::reads_grouped_acts(t, grouped), kquant);
        EXPECT_FALSE(backend::cpu::reads_grouped_acts(t, MatmulOptions{}));
        std::vector<block_q8a> xq(static_cast<size_t>(n * cols / 32));
        for (int64_t tok = 0; tok < n; ++tok) {
            if (kquant)
                quantize_act_row_grouped(x.data() + tok * cols, xq.data() + tok * cols / 32, cols);
            else
                quantize_act_row(x.data() + tok * cols, xq.data() + tok * cols / 32, cols, SimdPath::scalar);
        }
        const DotRowFn dot = dot_row_kernel(t, SimdPath::scalar);
        const std::vector<float> got = run(m.w, x, n, grouped);
        std::vector<float> want(static_cast<size_t>(n * rows));
        for (int64_t tok = 0; tok < n; ++tok)
            for (int64_t r = 0; r < rows; ++r)
                want[size_t(tok * rows + r)] = dot(m.bytes.data() + size_t(r) * m.w.row_bytes, xq.data() + tok * cols / 32, cols);
        expect_same_bits(got, want, "grouped option vs the row kernel on the grouping's activations");
        const std::vector<float> plain = run(m.w, x, n, {});
        size_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) differ += bits_of(got[i]) != bits_of(plain[i]);
        if (kquant)
            EXPECT_GT(differ, got.size() / 2) << "the grouping left most K-quant outputs unchanged";
        else
            EXPECT_EQ(differ, 0u) << "a legacy type's activations were grouped";
    }
}

// The CPU backend's matmul_shared, with K-quant and legacy matrices on one
// input, with and without grouped_kquant_acts, for several tokens and for one
// (one quantization and one parallel loop where the matrices share a
// grouping): each target gets the bits of matmul() under the same option.
void check_shared_input(std::mt19937& rng, bool group_kquants, int64_t n) {
    const int64_t cols = 512;
    MatmulOptions grouped;
    grouped.grouped_kquant_acts = group_kquants;
    const TensorType types[] = {TensorType::Q4_K, TensorType::Q8_0, TensorType::Q6_K, TensorType::Q4_0};
    std::vector<Matrix> ms;
    for (TensorType t : types) ms.push_back(make_matrix(rng, t, 19, cols));
    const std::vector<float> x = random_acts(rng, n * cols);

    auto be = backend::make_cpu_backend(1, nullptr, 0, group_kquants);
    std::vector<Weight> ws;
    for (const Matrix& m : ms) {
        auto w = be->register_weight(m.w);
        ASSERT_TRUE(w.ok()) << w.error().message;
        ws.push_back(*w);
    }
    auto xt = be->alloc(n, cols);
    ASSERT_TRUE(xt.ok());
    be->upload(x.data(), *xt);
    std::vector<backend::Tensor> ys;
    for (size_t i = 0; i < ws.size(); ++i) {
        auto y = be->alloc(n, ws[i].rows);
        ASSERT_TRUE(y.ok());
        ys.push_back(*y);
    }
    be->matmul_shared(*xt, {{&ws[0], ys[0]}, {&ws[1], ys[1]}, {&ws[2], ys[2]}, {&ws[3], ys[3]}});
    ASSERT_TRUE(be->take_error().ok());
    for (size_t i = 0; i < ws.size(); ++i) {
        SCOPED_TRACE(name(types[i]));
        std::vector<float> got = poisoned(n * ws[i].rows);
        be->download(ys[i], got.data());
        expect_same_bits(got, run(ms[i].w, x, n, grouped), "matmul_shared vs matmul");
    }
}

TEST(Matmul, BackendSharedInputKeepsEachMatrixsGrouping) {
    std::mt19937 rng(seed() + 15);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (const bool group_kquants : {true, false})
        for (const int64_t n : {int64_t(5), int64_t(1)}) {
            SCOPED_TRACE(std::string(group_kquants ? "grouped" : "plain") + ", tokens " + std::to_string(n));
            check_shared_input(rng, group_kquants, n);
            if (::testing::Test::HasFatalFailure()) return;
        }
}

// One token into several weights in one parallel loop: every output has the
// bits of matmul_q8a on that weight alone (ragged row counts, padded rows,
// one and two threads, poisoned outputs); what it cannot serve it refuses
// without writing.
TEST(Matmul, OneTokenIntoSeveralWeightsKeepsEachWeightsBits) {
    std::mt19937 rng(seed() + 16);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    const int64_t cols = 512;
    const TensorType types[] = {TensorType::Q4_1, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K};
    const int64_t rows[] = {37, 1, 70, 40};  // enough work for two threads to split
    std::vector<Matrix> ms;
    for (size_t i = 0; i < std::size(types); ++i)
        ms.push_back(make_matrix(rng, types[i], rows[i], cols, types[i] == TensorType::Q6_K ? 14 : 0));
    const std::vector<float> x = random_acts(rng, cols);
    std::vector<block_q8a> xq(static_cast<size_t>(cols / 32));
    ASSERT_TRUE(backend::cpu::quantize_activations(x.data(), 1, cols, xq.data()).ok());
    for (int threads : {1, 2}) {
        for (SimdPath path : available_paths()) {
            SCOPED_TRACE(std::string(simd_path_name(path)) + ", threads " + std::to_string(threads));
            MatmulOptions opt;
            opt.path = path;
            opt.n_threads = threads;
            std::vector<std::vector<float>> got;
            std::vector<backend::cpu::Q8aTarget> targets;
            for (const Matrix& m : ms) got.push_back(poisoned(m.w.rows));
            for (size_t i = 0; i < ms.size(); ++i) targets.push_back({&ms[i].w, got[i].data()});
            const bool served = backend::cpu::matmul_q8a_one_token(targets.data(), int(targets.size()), xq.data(), opt);
            // The scalar path has no many-row kernel: refused, nothing written.
            EXPECT_EQ(served, path != SimdPath::scalar);
            for (size_t i = 0; i < ms.size(); ++i) {
                SCOPED_TRACE(name(types[i]));
                std::vector<float> want = poisoned(ms[i].w.rows);
                if (served) {
                    ASSERT_TRUE(backend::cpu::matmul_q8a(ms[i].w, xq.data(), 1, want.data(), opt).ok());
                }
                expect_same_bits(got[i], want, "one loop vs one call a weight");
            }
        }
    }
    // Refused: no targets, too many, a float weight; nothing written.
    const Matrix f = make_matrix(rng, TensorType::F16, 5, cols);
    std::vector<float> out = poisoned(5);
    const backend::cpu::Q8aTarget float_target{&f.w, out.data()};
    EXPECT_FALSE(backend::cpu::matmul_q8a_one_token(&float_target, 1, xq.data()));
    EXPECT_FALSE(backend::cpu::matmul_q8a_one_token(&float_target, 0, xq.data()));
    const backend::cpu::Q8aTarget five[5] = {float_target, float_target, float_target, float_target, float_target};
    EXPECT_FALSE(backend::cpu::matmul_q8a_one_token(five, 5, xq.data()));
    for (float v : out) EXPECT_TRUE(std::isnan(v));
}

TEST(Matmul, LargeShapeAgreesWithDoubleReference) {
    std::mt19937 rng(seed() + 13);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    const int64_t rows = 96, cols = 4096, n = 64;
    for (TensorType t : {TensorType::Q4_K, TensorType::Q8_0}) {
        SCOPED_TRACE(name(t));
        const Matrix m = make_matrix(rng, t, rows, cols);
        const std::vector<float> x = random_acts(rng, n * cols);
        const std::vector<float> out = run(m.w, x, n, {});
        std::vector<std::vector<block_q8a>> acts;
        for (int64_t tok = 0; tok < n; ++tok)
            acts.push_back(quantize_acts(std::vector<float>(x.begin() + tok * cols, x.begin() + (tok + 1) * cols)));
        // |x - d*q| <= d/2 per element, plus 1e-5 of each |term| for the float combination.
        for (int64_t r = 0; r < rows; ++r) {
            const std::vector<float> w = dequantize(t, m.bytes.data() + size_t(r) * m.w.row_bytes, cols);
            for (int64_t tok = 0; tok < n; ++tok) {
                const std::vector<block_q8a>& a = acts[size_t(tok)];
                double exact = 0, bound = 0;
                for (int64_t i = 0; i < cols; ++i) {
                    const block_q8a& blk = a[size_t(i / 32)];
                    exact += double(w[size_t(i)]) * x[size_t(tok * cols + i)];
                    const double xq = double(blk.d) * blk.qs[i % 32];
                    bound += std::fabs(double(w[size_t(i)])) * ((0.5 + 1e-5) * blk.d + 1e-5 * std::fabs(xq));
                }
                ASSERT_NEAR(double(out[size_t(tok * rows + r)]), exact, bound + 1e-30)
                    << "row " << r << " token " << tok;
            }
        }
    }
}

TEST(Matmul, ErrorsAreValuesAndWriteNothing) {
    std::mt19937 rng(seed() + 14);
    Matrix m = make_matrix(rng, TensorType::Q4_K, 4, 256);
    std::vector<float> x(2 * 256, 1.0f), out = poisoned(8);
    auto fails = [&](const Weight& w, const float* xp, int64_t n, const char* what) {
        const Status s = backend::cpu::matmul(w, xp, n, out.data());
        EXPECT_FALSE(s.ok()) << what;
        EXPECT_TRUE(s.ok() || !s.message().empty()) << what;
        for (float v : out) EXPECT_TRUE(std::isnan(v)) << what << ": output written";
    };
    Weight w = m.w;
    w.cols = 255;
    w.row_bytes = 0;
    fails(w, x.data(), 2, "ragged columns");
    w = m.w;
    w.type = TensorType::Q8_K;
    fails(w, x.data(), 2, "type without a dot product");
    w = m.w;
    w.type = TensorType::IQ2_XXS;
    fails(w, x.data(), 2, "unsupported type");
    w = m.w;
    w.host = nullptr;
    fails(w, x.data(), 2, "no data");
    w = m.w;
    w.row_bytes = 100;
    fails(w, x.data(), 2, "stride below the row size");
    w = m.w;
    w.host = m.bytes.data() + 1;
    fails(w, x.data(), 2, "misaligned weights");
    fails(m.w, nullptr, 2, "null activations");
    fails(m.w, x.data(), -1, "negative token count");
    EXPECT_TRUE(backend::cpu::matmul(m.w, x.data(), 0, out.data()).ok());  // nothing to do
    std::vector<block_q8a> xq(8);
    EXPECT_FALSE(backend::cpu::quantize_activations(x.data(), 1, 100, xq.data()).ok());
}

}  // namespace
