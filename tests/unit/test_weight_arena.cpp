// backend/cpu/weight_arena and the CPU backend's registration: weight
// matrices are copied byte for byte into 64-byte aligned, non-overlapping
// memory (a view with its rows at their stride), or interleaved where the
// type and the CPU have that layout, 1-D weights are not, and nothing is
// copied past the budget (shared by the live arenas of the process) or with
// TERN_CPU_WEIGHT_COPY=0.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/weight_arena.h"
#include "quant/interleave.h"
#include "quant/quant.h"
#include "quant/simd_path.h"
#include "tests/support/test_seed.h"

namespace tern {
namespace {

std::vector<uint8_t> random_bytes(std::mt19937& rng, size_t n) {
    std::vector<uint8_t> v(n);
    for (uint8_t& b : v) b = uint8_t(rng());
    return v;
}

TEST(WeightArena, CopiesAreExactAlignedAndApart) {
    std::mt19937 rng(tern::test::run_seed() + 1);
    backend::cpu::WeightArena arena(size_t(1) << 30);
    std::vector<std::vector<uint8_t>> sources;
    std::vector<const uint8_t*> copies;
    // Small ones share a chunk; one larger than a chunk takes its own.
    // (Copies of more than 2 MiB are split among threads; one ends ragged.)
    for (size_t n : {size_t(1), size_t(63), size_t(4097), (size_t(5) << 20) + 123, size_t(300) << 20, size_t(100)}) {
        sources.push_back(random_bytes(rng, n));
        const auto* c = static_cast<const uint8_t*>(arena.copy(sources.back().data(), n));
        ASSERT_NE(c, nullptr) << n;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(c) % 64, 0u);
        copies.push_back(c);
    }
    for (size_t i = 0; i < sources.size(); ++i)
        EXPECT_EQ(std::memcmp(copies[i], sources[i].data(), sources[i].size()), 0) << "copy " << i;
    for (size_t i = 0; i < copies.size(); ++i)
        for (size_t j = i + 1; j < copies.size(); ++j) {
            const bool apart = copies[i] + sources[i].size() <= copies[j] || copies[j] + sources[j].size() <= copies[i];
            EXPECT_TRUE(apart) << i << " and " << j << " overlap";
        }
}

TEST(WeightArena, NothingPastTheBudget) {
    std::vector<uint8_t> src(1000, 7);
    backend::cpu::WeightArena arena(1500);
    EXPECT_NE(arena.copy(src.data(), 1000), nullptr);
    EXPECT_EQ(arena.copy(src.data(), 1000), nullptr);  // would pass 1500
    EXPECT_NE(arena.copy(src.data(), 500), nullptr);
    EXPECT_EQ(arena.copied(), 1500u);
    {
        // A second live arena shares the budget; the first one's copies count.
        backend::cpu::WeightArena other(1500 + 100);
        EXPECT_EQ(other.copy(src.data(), 101), nullptr);
        EXPECT_NE(other.copy(src.data(), 100), nullptr);
    }
    backend::cpu::WeightArena none(0);
    EXPECT_EQ(none.copy(src.data(), 1), nullptr);
    EXPECT_EQ(none.copy(src.data(), 0), nullptr);
}

TEST(WeightArena, CopiesAreGivenBackWithTheArena) {
    std::vector<uint8_t> src(1000, 7);
    for (int i = 0; i < 3; ++i) {
        backend::cpu::WeightArena arena(1000);
        EXPECT_NE(arena.copy(src.data(), 1000), nullptr) << "round " << i;
    }
}

// (f16 rows have no interleaved layout: their copies are byte for byte.)
backend::Weight matrix(const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols,
                       TensorType type = TensorType::F16) {
    backend::Weight w;
    w.name = "m";
    w.type = type;
    w.rows = rows;
    w.cols = cols;
    w.host = bytes.data();
    w.row_bytes = quant::row_bytes(type, cols);
    return w;
}

TEST(CpuBackendWeights, MatricesAreCopiedViewsAtTheirStrideVectorsAreNot) {
    std::mt19937 rng(tern::test::run_seed() + 2);
    const int64_t rows = 7, cols = 256;
    const size_t rb = quant::row_bytes(TensorType::F16, cols);
    const std::vector<uint8_t> bytes = random_bytes(rng, rb * size_t(rows));
    auto be = backend::make_cpu_backend(1);
    if (backend::cpu::WeightArena::available_budget() < (size_t(512) << 20))
        GTEST_SKIP() << "less than 512 MiB of memory available: the backend reads weights in place";

    auto full = be->register_weight(matrix(bytes, rows, cols));
    ASSERT_TRUE(full.ok()) << full.error().message;
    EXPECT_NE(full->host, bytes.data());
    EXPECT_EQ(std::memcmp(full->host, bytes.data(), bytes.size()), 0);

    // Columns 64..191 of rows 2..5: four blocks of each row, at the full stride.
    backend::Weight view = matrix(bytes, 4, 128);
    view.host = bytes.data() + 2 * rb + quant::row_bytes(TensorType::F16, 64);
    view.row_bytes = rb;
    auto v = be->register_weight(view);
    ASSERT_TRUE(v.ok()) << v.error().message;
    EXPECT_NE(v->host, view.host);
    EXPECT_EQ(v->row_bytes, rb);
    const size_t view_row = quant::row_bytes(TensorType::F16, 128);
    for (int64_t r = 0; r < 4; ++r)
        EXPECT_EQ(std::memcmp(static_cast<const uint8_t*>(v->host) + r * rb,
                              static_cast<const uint8_t*>(view.host) + r * rb, view_row),
                  0)
            << "view row " << r;

    std::vector<float> norm(cols, 1.5f);
    backend::Weight vec;
    vec.name = "norm";
    vec.type = TensorType::F32;
    vec.cols = cols;
    vec.host = norm.data();
    vec.row_bytes = size_t(cols) * 4;
    auto n = be->register_weight(vec);
    ASSERT_TRUE(n.ok());
    EXPECT_EQ(n->host, norm.data());
}

// Matrices of the types with an interleaved layout are registered in it where
// the AVX-512 path runs (else, and with TERN_CPU_INTERLEAVE=0, copied as GGUF
// rows at their stride); every row reads back, and the backend's embedding
// lookup reads a table in either layout.
TEST(CpuBackendWeights, InterleavedWhereAvx512RunsAndEveryRowReadsBack) {
    std::mt19937 rng(tern::test::run_seed() + 4);
    if (backend::cpu::WeightArena::available_budget() < (size_t(512) << 20))
        GTEST_SKIP() << "less than 512 MiB of memory available: the backend reads weights in place";
    const bool avx512 = quant::simd_path_best() == quant::SimdPath::avx512;
    const TensorType types[] = {TensorType::Q4_0, TensorType::Q4_1, TensorType::Q5_0, TensorType::Q5_1,
                                TensorType::Q8_0, TensorType::Q4_K, TensorType::Q5_K, TensorType::Q6_K};
    for (TensorType t : types) {
        // 37 rows; 1100 (more groups than one thread's run at registration,
        // with two threads); a view whose rows lie twice their size apart.
        for (const int64_t rows : {37, 1100}) {
            for (const bool switched_off : {false, true}) {
                SCOPED_TRACE(std::string(tensor_type_name(uint32_t(t))) + " " + std::to_string(rows) + " rows" +
                             (switched_off ? " TERN_CPU_INTERLEAVE=0" : ""));
                const bool k_quant = t == TensorType::Q4_K || t == TensorType::Q5_K || t == TensorType::Q6_K;
                const int64_t cols = k_quant ? 256 : 96;
                const size_t rb = quant::row_bytes(t, cols), stride = 2 * rb;
                std::vector<uint8_t> bytes(stride * size_t(rows), 0x5A);
                std::vector<float> row(cols);
                for (int64_t r = 0; r < rows; ++r) {
                    for (float& v : row) v = float(int(rng() % 2001) - 1000) / 100.0f;
                    ASSERT_TRUE(quant::quantize_row(t, row.data(), bytes.data() + size_t(r) * stride, cols).ok());
                }
                if (switched_off) {
                    ASSERT_EQ(setenv("TERN_CPU_INTERLEAVE", "0", 1), 0);
                }
                auto be = backend::make_cpu_backend(2);
                unsetenv("TERN_CPU_INTERLEAVE");
                backend::Weight view = matrix(bytes, rows, cols, t);
                view.row_bytes = stride;
                auto w = be->register_weight(view);
                ASSERT_TRUE(w.ok()) << w.error().message;
                const bool interleaved = avx512 && !switched_off;
                EXPECT_EQ(w->layout == backend::WeightLayout::interleaved16, interleaved);
                EXPECT_EQ(reinterpret_cast<uintptr_t>(w->host) % 64, 0u);
                std::vector<uint8_t> back(rb);
                for (int64_t r = 0; r < rows; ++r) {
                    const uint8_t* got = static_cast<const uint8_t*>(w->host) + size_t(r) * stride;
                    if (interleaved) {
                        ASSERT_TRUE(quant::deinterleave_row(t, w->host, rows, cols, r, back.data()).ok());
                        got = back.data();
                    }
                    ASSERT_EQ(std::memcmp(got, bytes.data() + size_t(r) * stride, rb), 0) << "row " << r;
                }
                const std::vector<int32_t> tokens = {int32_t(rows - 1), 0, 17, 17};
                auto out = be->alloc(int64_t(tokens.size()), cols);
                ASSERT_TRUE(out.ok());
                be->embed(*w, tokens, *out);
                ASSERT_TRUE(be->take_error().ok());
                std::vector<float> got(tokens.size() * size_t(cols)), want(cols);
                be->download(*out, got.data());
                for (size_t i = 0; i < tokens.size(); ++i) {
                    ASSERT_TRUE(quant::dequantize_row(t, bytes.data() + size_t(tokens[i]) * stride, want.data(), cols)
                                    .ok());
                    for (int64_t c = 0; c < cols; ++c)
                        ASSERT_EQ(got[i * size_t(cols) + size_t(c)], want[size_t(c)]) << "token " << tokens[i];
                }
                // A token past the table is an error naming it, not a read past the rows.
                be->embed(*w, {int32_t(rows)}, *out);
                const Status bad = be->take_error();
                ASSERT_FALSE(bad.ok());
                EXPECT_NE(bad.message().find("token " + std::to_string(rows)), std::string::npos) << bad.message();
            }
        }
    }
}

TEST(CpuBackendWeights, SwitchedOffTheyAreReadInPlace) {
    std::mt19937 rng(tern::test::run_seed() + 3);
    const std::vector<uint8_t> bytes = random_bytes(rng, quant::row_bytes(TensorType::F16, 64) * 3);
    ASSERT_EQ(setenv("TERN_CPU_WEIGHT_COPY", "0", 1), 0);
    auto be = backend::make_cpu_backend(1);
    unsetenv("TERN_CPU_WEIGHT_COPY");
    auto w = be->register_weight(matrix(bytes, 3, 64));
    ASSERT_TRUE(w.ok());
    EXPECT_EQ(w->host, bytes.data());
}

}  // namespace
}  // namespace tern
