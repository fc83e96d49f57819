// quant/interleave: the CPU's registration layout of sixteen interleaved rows
// (q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K). Checked: every row reads back to its GGUF bytes and the
// padding rows read back as zero blocks; every path's group kernel gives every (row, token)
// the scalar row kernel's bits on the GGUF row, for 1..8 tokens, ragged rows
// (every tail of 1..7 blocks, rows of fewer than eight blocks), groups of
// 1..16 rows, quantizer output and arbitrary bytes, with nothing written
// outside its outputs; the threaded matmul over an interleaved weight gives
// the bits of the same weight as GGUF rows, for batches of 1..64 tokens, one
// and two threads, alone and through the one-token shared loop; bad
// arguments are errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <random>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "dot_test_util.h"
#include "quant/interleave.h"

namespace {

using namespace tern;
using namespace tern::quant;
using namespace tern::dot_testing;
using backend::Weight;
using backend::WeightLayout;

const TensorType kTypes[] = {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1,
                             TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};

// 64-byte aligned bytes, as the backend's arena gives them.
struct Aligned {
    std::unique_ptr<uint8_t, decltype(&std::free)> p{nullptr, &std::free};
    explicit Aligned(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64)), &std::free) {
        std::memset(p.get(), 0xA5, (n + 63) / 64 * 64);  // garbage the layout must overwrite
    }
    uint8_t* get() const { return p.get(); }
};

// rows x cols GGUF rows, stride bytes apart: quantizer output, or any bytes
// (every scale, NaN and infinite halves, -128 quanta).
std::vector<uint8_t> gguf_rows(std::mt19937& rng, TensorType t, int64_t rows, int64_t cols, size_t stride,
                               bool arbitrary) {
    std::vector<uint8_t> out(size_t(rows) * stride, 0x5A);
    std::uniform_int_distribution<int> byte(0, 255);
    for (int64_t r = 0; r < rows; ++r) {
        std::vector<uint8_t> row = quantize(t, random_weights(rng, cols));
        if (arbitrary)
            for (uint8_t& v : row) v = uint8_t(byte(rng));
        std::copy(row.begin(), row.end(), out.begin() + r * int64_t(stride));
    }
    return out;
}

std::vector<int64_t> lengths(TensorType t) {
    if (is_k_type(t)) return {256, 512, 768, 2816, 4096};
    // Rows shorter than eight blocks (lanes without a block), every tail of
    // 1..7 blocks after whole groups of eight, and the real models' widths.
    return {32, 32 * 3, 32 * 7, 32 * 8, 32 * 9, 32 * 11, 32 * 13, 32 * 15, 32 * 18, 32 * 20, 32 * 48, 4096};
}

TEST(Interleave, EveryRowReadsBackAndPaddingIsZero) {
    std::mt19937 rng(seed() + 60);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : kTypes) {
        for (int64_t cols : is_k_type(t) ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 32 * 9, 576}) {
            for (int64_t rows : {1, 5, 16, 17, 40}) {
                SCOPED_TRACE(name(t) + " " + std::to_string(rows) + " x " + std::to_string(cols));
                const size_t rb = row_bytes(t, cols), stride = rb + 2 * (rng() % 4);
                const std::vector<uint8_t> src = gguf_rows(rng, t, rows, cols, stride, rng() % 2 == 0);
                const size_t n = interleaved_bytes(t, rows, cols);
                ASSERT_GE(n, size_t((rows + 15) / 16 * 16) * rb);
                ASSERT_LT(n, size_t((rows + 15) / 16 * 16) * rb * 21 / 20 + 64);  // at most 5% more, and the rounding
                ASSERT_EQ(n % 64, 0u);
                Aligned dst(n);
                ASSERT_TRUE(interleave_rows(t, src.data(), stride, rows, cols, dst.get()).ok());
                // Group by group, in any order, the same bytes.
                Aligned parts(n);
                const int64_t groups = (rows + 15) / 16;
                for (int64_t g = groups - 1; g >= 0; --g)
                    ASSERT_TRUE(interleave_groups(t, src.data(), stride, rows, cols, parts.get(), g, g + 1).ok());
                ASSERT_EQ(0, std::memcmp(parts.get(), dst.get(), n));
                std::vector<uint8_t> back(rb);
                const int64_t padded = groups * 16;  // the same layout, its padding rows counted in
                for (int64_t r = 0; r < padded; ++r) {
                    ASSERT_TRUE(deinterleave_row(t, dst.get(), r < rows ? rows : padded, cols, r, back.data()).ok());
                    if (r < rows)
                        ASSERT_EQ(0, std::memcmp(back.data(), src.data() + r * int64_t(stride), rb)) << "row " << r;
                    else
                        for (size_t i = 0; i < rb; ++i) ASSERT_EQ(back[i], 0) << "padding row " << r << " byte " << i;
                }
                EXPECT_FALSE(deinterleave_row(t, dst.get(), rows, cols, rows, back.data()).ok());
            }
        }
    }
}

// Outputs start as this NaN; a kernel's NaN would be a quiet NaN of another payload.
constexpr uint32_t kPoison = 0x7fa5a5a5;

float poison() {
    float f;
    std::memcpy(&f, &kPoison, 4);
    return f;
}

TEST(Interleave, GroupKernelsGiveTheRowKernelsBits) {
    std::mt19937 rng(seed() + 61);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    int64_t case_index = 0;
    for (TensorType t : kTypes) {
        for (int64_t k : lengths(t)) {
            for (const bool arbitrary : {false, true}) {
                SCOPED_TRACE(name(t) + " k=" + std::to_string(k) + (arbitrary ? " arbitrary bytes" : ""));
                // One to three groups, the last of 1..16 rows: every count
                // of 1..48 in turn (the cases outnumber them).
                const int64_t rows = 1 + (case_index++ * 7) % 48;
                const size_t rb = row_bytes(t, k);
                const std::vector<uint8_t> src = gguf_rows(rng, t, rows, k, rb, arbitrary);
                Aligned w(interleaved_bytes(t, rows, k));
                ASSERT_TRUE(interleave_rows(t, src.data(), rb, rows, k, w.get()).ok());
                const int n = 1 + int(rng() % kDotMaxTokens);
                const std::vector<block_q8a> a = quantize_acts(random_acts(rng, n * k));
                const int64_t out_stride = 17;
                for (SimdPath path : available_paths()) {
                    const DotGroupFn kernel = dot_group_kernel(t, path);
                    ASSERT_NE(kernel, nullptr);
                    for (int64_t g = 0; g * 16 < rows; ++g) {
                        const int64_t in_group = std::min<int64_t>(16, rows - 16 * g);
                        SCOPED_TRACE(std::string(simd_path_name(path)) + ", group " + std::to_string(g) + " of " +
                                     std::to_string(rows) + " rows, " + std::to_string(n) + " tokens");
                        std::vector<float> out(size_t(n * out_stride), poison());
                        kernel(w.get(), rows, g, a.data(), n, k, out.data(), out_stride);
                        for (int tok = 0; tok < n; ++tok) {
                            for (int64_t r = 0; r < out_stride; ++r) {
                                const float got = out[size_t(tok * out_stride + r)];
                                if (r >= in_group) {
                                    ASSERT_EQ(bits_of(got), kPoison) << "wrote row " << r << " of " << in_group;
                                    continue;
                                }
                                ASSERT_NE(bits_of(got), kPoison) << "left token " << tok << " row " << r;
                                const float ref = dot_row_kernel(t, SimdPath::scalar)(
                                    src.data() + (16 * g + r) * int64_t(rb), a.data() + tok * (k / 32), k);
                                if (std::isnan(ref))
                                    ASSERT_TRUE(std::isnan(got)) << "token " << tok << " row " << r;
                                else
                                    ASSERT_EQ(bits_of(got), bits_of(ref)) << "token " << tok << " row " << r;
                            }
                        }
                    }
                }
            }
        }
    }
    EXPECT_GE(case_index, 48);
}

struct Pair {
    std::vector<uint8_t> rows;  // GGUF
    Aligned groups{0};
    Weight gguf, inter;
};

Pair make_both(std::mt19937& rng, TensorType t, int64_t rows, int64_t cols) {
    Pair p;
    const size_t rb = row_bytes(t, cols);
    p.rows = gguf_rows(rng, t, rows, cols, rb, false);
    p.groups = Aligned(interleaved_bytes(t, rows, cols));
    EXPECT_TRUE(interleave_rows(t, p.rows.data(), rb, rows, cols, p.groups.get()).ok());
    p.gguf.name = std::string("w");
    p.gguf.type = t;
    p.gguf.rows = rows;
    p.gguf.cols = cols;
    p.gguf.host = p.rows.data();
    p.gguf.row_bytes = rb;
    p.inter = p.gguf;
    p.inter.host = p.groups.get();
    p.inter.layout = WeightLayout::interleaved16;
    return p;
}

std::vector<float> run(const Weight& w, const std::vector<float>& x, int64_t n, int threads) {
    backend::cpu::MatmulOptions opt;
    opt.n_threads = threads;
    std::vector<float> y(size_t(n * w.rows), std::numeric_limits<float>::quiet_NaN());
    const Status s = backend::cpu::matmul(w, x.data(), n, y.data(), opt);
    EXPECT_TRUE(s.ok()) << s.message();
    return y;
}

TEST(Interleave, MatmulGivesTheGgufRowsBits) {
    std::mt19937 rng(seed() + 62);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    for (TensorType t : kTypes) {
        for (auto [rows, cols] : {std::pair<int64_t, int64_t>{67, is_k_type(t) ? 768 : 576}, {32, 256}, {5, 4096}}) {
            const Pair p = make_both(rng, t, rows, cols);
            for (int64_t n : {1, 3, 8, 17, 64}) {
                const std::vector<float> x = random_acts(rng, n * cols);
                const std::vector<float> want = run(p.gguf, x, n, 1);
                for (int threads : {1, 2}) {
                    SCOPED_TRACE(name(t) + " " + std::to_string(rows) + " x " + std::to_string(cols) + ", " +
                                 std::to_string(n) + " tokens, " + std::to_string(threads) + " threads");
                    const std::vector<float> got = run(p.inter, x, n, threads);
                    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(bits_of(got[i]), bits_of(want[i])) << i;
                }
            }
        }
    }
}

TEST(Interleave, OneTokenSharedLoopMixesLayouts) {
    std::mt19937 rng(seed() + 63);
    SCOPED_TRACE("seed " + std::to_string(seed()));
    const int64_t cols = 576;
    const Pair q = make_both(rng, TensorType::Q4_1, 576, cols), k = make_both(rng, TensorType::Q8_0, 200, cols);
    const Pair v = make_both(rng, TensorType::Q4_0, 40, cols);
    const std::vector<float> x = random_acts(rng, cols);
    std::vector<block_q8a> xq(size_t(cols / 32));
    ASSERT_TRUE(backend::cpu::quantize_activations(x.data(), 1, cols, xq.data()).ok());
    std::vector<float> oq = run(q.gguf, x, 1, 1), ok = run(k.gguf, x, 1, 1), ov = run(v.gguf, x, 1, 1);
    std::vector<float> gq(oq.size(), NAN), gk(ok.size(), NAN), gv(ov.size(), NAN);
    const backend::cpu::Q8aTarget targets[] = {{&q.inter, gq.data()}, {&k.inter, gk.data()}, {&v.gguf, gv.data()}};
    ASSERT_TRUE(backend::cpu::matmul_q8a_one_token(targets, 3, xq.data()));
    for (size_t i = 0; i < oq.size(); ++i) ASSERT_EQ(bits_of(gq[i]), bits_of(oq[i])) << "q " << i;
    for (size_t i = 0; i < ok.size(); ++i) ASSERT_EQ(bits_of(gk[i]), bits_of(ok[i])) << "k " << i;
    for (size_t i = 0; i < ov.size(); ++i) ASSERT_EQ(bits_of(gv[i]), bits_of(ov[i])) << "v " << i;
}

TEST(Interleave, BadArgumentsAreErrors) {
    uint8_t buf[64] = {};
    Aligned dst(4096);
    EXPECT_EQ(interleaved_bytes(TensorType::Q2_K, 16, 256), 0u);
    EXPECT_EQ(interleaved_bytes(TensorType::Q4_0, 16, 48), 0u);
    EXPECT_EQ(interleaved_bytes(TensorType::Q4_K, 16, 288), 0u);  // not whole super-blocks
    EXPECT_EQ(interleaved_bytes(TensorType::Q4_0, 0, 32), 0u);
    EXPECT_FALSE(interleave_rows(TensorType::Q3_K, buf, 110, 1, 256, dst.get()).ok());
    EXPECT_FALSE(interleave_rows(TensorType::Q4_0, buf, 18, 1, 40, dst.get()).ok());
    EXPECT_FALSE(interleave_rows(TensorType::Q4_0, buf, 10, 1, 32, dst.get()).ok());  // stride below the row
    EXPECT_FALSE(deinterleave_row(TensorType::Q4_0, dst.get(), 16, 32, -1, buf).ok());
    EXPECT_FALSE(deinterleave_row(TensorType::Q4_0, dst.get(), 16, 32, 16, buf).ok());  // past the last group
    EXPECT_FALSE(interleave_groups(TensorType::Q4_0, buf, 18, 1, 32, dst.get(), 0, 2).ok());
    EXPECT_EQ(dot_group_kernel(TensorType::Q2_K, SimdPath::scalar), nullptr);

    // A matmul over a weight marked interleaved whose type has no such layout.
    Weight w;
    w.name = std::string("w");
    w.type = TensorType::Q3_K;
    w.rows = 16;
    w.cols = 256;
    w.host = dst.get();
    w.layout = WeightLayout::interleaved16;
    std::vector<float> x(256, 1.0f), y(16, NAN);
    const Status s = backend::cpu::matmul(w, x.data(), 1, y.data());
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("interleaved"), std::string::npos) << s.message();
    for (float v : y) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
