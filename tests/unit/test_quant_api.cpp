// quant/: the row API's contract: sizes, errors for unsupported types and
// ragged rows, the many-rows calls agreeing with one-row calls, and
// misaligned buffers giving the same bytes as aligned ones.
#include <cstring>
#include <random>

#include "test_quant_helpers.h"

namespace {

using namespace tern;
using namespace tern::quant;
using namespace tern::quant::qtest;

std::vector<float> normal_values(size_t n, std::mt19937& rng) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    return x;
}

TEST(QuantApi, RowBytesMatchTheTypeTable) {
    for (const TypeCase& c : all_type_cases()) {
        SCOPED_TRACE(type_name(c.type));
        const auto info = tensor_type_info(uint32_t(c.type));
        ASSERT_TRUE(info.has_value());
        EXPECT_EQ(int(info->block_elems), c.block);
        EXPECT_EQ(row_bytes(c.type, 0), 0u);
        EXPECT_EQ(row_bytes(c.type, c.block), info->block_bytes);
        EXPECT_EQ(row_bytes(c.type, 7 * int64_t(c.block)), 7u * info->block_bytes);
        EXPECT_EQ(row_bytes(c.type, -int64_t(c.block)), 0u);
        if (c.block > 1) {
            EXPECT_EQ(row_bytes(c.type, c.block + 1), 0u);
            EXPECT_EQ(row_bytes(c.type, c.block - 1), 0u);
        }
    }
    // The sizes GGUF fixes for these formats.
    EXPECT_EQ(row_bytes(TensorType::Q4_K, 4096), 16u * 144u);
    EXPECT_EQ(row_bytes(TensorType::Q6_K, 256), 210u);
    EXPECT_EQ(row_bytes(TensorType::Q8_0, 64), 68u);
    EXPECT_EQ(row_bytes(TensorType::BF16, 3), 6u);
}

TEST(QuantApi, RaggedRowsAreErrors) {
    std::vector<float> x(1024, 1.0f);
    std::vector<uint8_t> q(4096);
    for (const TypeCase& c : all_type_cases()) {
        if (c.block == 1) continue;
        SCOPED_TRACE(type_name(c.type));
        for (int64_t n : {int64_t(c.block) + 1, int64_t(c.block) - 1, int64_t(c.block) * 2 + 16}) {
            const Status qs = quantize_row(c.type, x.data(), q.data(), n);
            ASSERT_FALSE(qs.ok());
            EXPECT_NE(qs.message().find("not a whole number of " + type_name(c.type)), std::string::npos)
                << qs.message();
            EXPECT_NE(qs.message().find(std::to_string(n)), std::string::npos) << qs.message();
            EXPECT_FALSE(dequantize_row(c.type, q.data(), x.data(), n).ok());
            EXPECT_FALSE(quantize_rows(c.type, x.data(), q.data(), 2, n).ok());
            EXPECT_FALSE(dequantize_rows(c.type, q.data(), x.data(), 2, n).ok());
        }
        EXPECT_FALSE(quantize_row(c.type, x.data(), q.data(), -int64_t(c.block)).ok());
        EXPECT_FALSE(quantize_rows(c.type, x.data(), q.data(), -1, c.block).ok());
    }
}

TEST(QuantApi, UnsupportedTypesAreErrorsNamingTheType) {
    std::vector<float> x(256, 1.0f);
    std::vector<uint8_t> q(4096);
    const std::pair<TensorType, const char*> unsupported[] = {
        {TensorType::IQ2_XXS, "iq2_xxs"}, {TensorType::IQ2_XS, "iq2_xs"},
        {TensorType::IQ3_XXS, "iq3_xxs"}, {TensorType::IQ1_S, "iq1_s"},
        {TensorType::IQ4_NL, "iq4_nl"},   {TensorType::IQ3_S, "iq3_s"},
        {TensorType::IQ2_S, "iq2_s"},     {TensorType::IQ4_XS, "iq4_xs"},
        {TensorType::IQ1_M, "iq1_m"},     {TensorType::I8, "i8"},
        {TensorType::I32, "i32"},         {TensorType::F64, "f64"},
        {TensorType::TQ1_0, "tq1_0"},     {TensorType::TQ2_0, "tq2_0"},
        {TensorType::MXFP4, "mxfp4"},     {TensorType(4), "type#4"},
        {TensorType(1000), "type#1000"},
    };
    for (const auto& [type, name] : unsupported) {
        SCOPED_TRACE(name);
        EXPECT_EQ(row_bytes(type, 256), 0u);
        const std::string want = std::string("unsupported tensor type ") + name;
        const Status qs = quantize_row(type, x.data(), q.data(), 256);
        ASSERT_FALSE(qs.ok());
        EXPECT_EQ(qs.message(), want);
        const Status ds = dequantize_row(type, q.data(), x.data(), 256);
        ASSERT_FALSE(ds.ok());
        EXPECT_EQ(ds.message(), want);
        EXPECT_EQ(quantize_rows(type, x.data(), q.data(), 1, 256).message(), want);
        EXPECT_EQ(dequantize_rows(type, q.data(), x.data(), 1, 256).message(), want);
    }
}

TEST(QuantApi, ManyRowsEqualOneRowAtATime) {
    std::mt19937 rng(test_seed() + 10);
    for (const TypeCase& c : all_type_cases()) {
        SCOPED_TRACE(type_name(c.type));
        const int64_t n_rows = 5, n_per_row = 3 * int64_t(c.block);
        const std::vector<float> x = normal_values(size_t(n_rows * n_per_row), rng);
        const size_t stride = row_bytes(c.type, n_per_row);
        std::vector<uint8_t> many(stride * size_t(n_rows)), single(stride * size_t(n_rows));
        ASSERT_TRUE(quantize_rows(c.type, x.data(), many.data(), n_rows, n_per_row).ok());
        for (int64_t r = 0; r < n_rows; ++r) {
            ASSERT_TRUE(quantize_row(c.type, x.data() + r * n_per_row, single.data() + size_t(r) * stride,
                                     n_per_row).ok());
        }
        EXPECT_EQ(many, single);
        std::vector<float> y_many(x.size()), y_single(x.size());
        ASSERT_TRUE(dequantize_rows(c.type, many.data(), y_many.data(), n_rows, n_per_row).ok());
        ASSERT_TRUE(dequantize_row(c.type, many.data(), y_single.data(), n_rows * n_per_row).ok());
        EXPECT_EQ(y_many, y_single);
        EXPECT_TRUE(quantize_rows(c.type, x.data(), many.data(), 0, n_per_row).ok());
    }
}

TEST(QuantApi, MisalignedBuffersGiveTheSameResults) {
    // Blocks in a file can start at any byte; the row API must not care.
    std::mt19937 rng(test_seed() + 11);
    for (const TypeCase& c : all_type_cases()) {
        SCOPED_TRACE(type_name(c.type));
        const int64_t n = 4 * int64_t(c.block);
        const std::vector<float> x = normal_values(size_t(n), rng);
        const std::vector<uint8_t> aligned = quantize(c.type, x);
        const std::vector<float> y_aligned = dequantize(c.type, aligned, n);
        for (size_t offset : {1, 2, 3}) {
            std::vector<uint8_t> buf(aligned.size() + offset);
            ASSERT_TRUE(quantize_row(c.type, x.data(), buf.data() + offset, n).ok());
            EXPECT_EQ(0, std::memcmp(buf.data() + offset, aligned.data(), aligned.size()));
            std::vector<float> y(static_cast<size_t>(n));
            ASSERT_TRUE(dequantize_row(c.type, buf.data() + offset, y.data(), n).ok());
            EXPECT_EQ(y, y_aligned);
        }
    }
}

}  // namespace
