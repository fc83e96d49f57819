// Metadata value helpers (constructors, exact conversions, display form) and
// tensor_bytes(), the size arithmetic every tensor check relies on.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include "gguf/gguf.h"
#include "test_gguf_util.h"

namespace tern::gguf {
namespace {

TEST(GgufValue, ConstructorsKeepTypeAndValue) {
    EXPECT_EQ(Value::of_u8(200).type, ValueType::U8);
    EXPECT_EQ(Value::of_u8(200).u, 200u);
    EXPECT_EQ(Value::of_i8(-100).i, -100);
    EXPECT_EQ(Value::of_u16(65535).u, 65535u);
    EXPECT_EQ(Value::of_i16(-32768).i, -32768);
    EXPECT_EQ(Value::of_u32(4000000000u).u, 4000000000u);
    EXPECT_EQ(Value::of_i32(-7).type, ValueType::I32);
    EXPECT_EQ(Value::of_u64(UINT64_MAX).u, UINT64_MAX);
    EXPECT_EQ(Value::of_i64(INT64_MIN).i, INT64_MIN);
    EXPECT_EQ(Value::of_f32(0.5f).type, ValueType::F32);
    EXPECT_EQ(Value::of_f64(0.1).f, 0.1);
    EXPECT_EQ(Value::of_bool(true).u, 1u);
    EXPECT_EQ(Value::of_string("hi").str, "hi");
    Value s = Value::of_strings({"a", "", "c"});
    EXPECT_EQ(s.type, ValueType::ARRAY);
    EXPECT_EQ(s.elem_type, ValueType::STRING);
    ASSERT_EQ(s.items.size(), 3u);
    EXPECT_EQ(s.items[2].str, "c");
    Value f = Value::of_f32s({1.5f, -2.f});
    EXPECT_EQ(f.elem_type, ValueType::F32);
    EXPECT_EQ(f.items[1].f, -2.0);
    Value i = Value::of_i32s({5, -6});
    EXPECT_EQ(i.elem_type, ValueType::I32);
    EXPECT_EQ(i.items[1].i, -6);
    EXPECT_STREQ(value_type_name(ValueType::ARRAY), "array");
    EXPECT_STREQ(value_type_name(ValueType::F64), "f64");
}

TEST(GgufValue, ExactConversions) {
    EXPECT_TRUE(Value::of_u8(1).is_integer());
    EXPECT_FALSE(Value::of_bool(true).is_integer());
    EXPECT_TRUE(Value::of_f64(1).is_float());
    EXPECT_FALSE(Value::of_i64(1).is_float());

    EXPECT_EQ(Value::of_u64(UINT64_MAX).as_int(), std::nullopt);
    EXPECT_EQ(Value::of_u64(uint64_t(INT64_MAX)).as_int(), INT64_MAX);
    EXPECT_EQ(Value::of_i8(-3).as_int(), -3);
    EXPECT_EQ(Value::of_i8(-3).as_uint(), std::nullopt);
    EXPECT_EQ(Value::of_u64(UINT64_MAX).as_uint(), UINT64_MAX);
    EXPECT_EQ(Value::of_f32(4096.f).as_int(), 4096);
    EXPECT_EQ(Value::of_f32(0.5f).as_int(), std::nullopt);
    EXPECT_EQ(Value::of_f64(9.3e18).as_int(), std::nullopt);
    EXPECT_EQ(Value::of_f64(-1).as_uint(), std::nullopt);
    EXPECT_EQ(Value::of_f64(NAN).as_int(), std::nullopt);
    EXPECT_EQ(Value::of_string("1").as_int(), std::nullopt);
    EXPECT_EQ(Value::of_bool(true).as_int(), std::nullopt);

    EXPECT_EQ(Value::of_i32(-5).as_double(), -5.0);
    EXPECT_EQ(Value::of_f32(0.25f).as_double(), 0.25);
    EXPECT_EQ(Value::of_u64((uint64_t(1) << 53) + 1).as_double(), std::nullopt);
    EXPECT_EQ(Value::of_u64(uint64_t(1) << 60).as_double(), std::ldexp(1.0, 60));
    EXPECT_EQ(Value::of_u64(UINT64_MAX).as_double(), std::nullopt);
    EXPECT_EQ(Value::of_i64(INT64_MAX).as_double(), std::nullopt);
    EXPECT_EQ(Value::of_i64(INT64_MIN).as_double(), -std::ldexp(1.0, 63));

    EXPECT_EQ(Value::of_bool(false).as_bool(), false);
    EXPECT_EQ(Value::of_u8(1).as_bool(), true);
    EXPECT_EQ(Value::of_u8(2).as_bool(), std::nullopt);
    EXPECT_EQ(Value::of_f32(1).as_bool(), std::nullopt);

    Value s = Value::of_string("x");
    ASSERT_NE(s.as_string(), nullptr);
    EXPECT_EQ(*s.as_string(), "x");
    EXPECT_EQ(Value::of_u8(0).as_string(), nullptr);
}

TEST(GgufValue, RandomIntegersConvertExactly) {
    const uint64_t seed = testing::test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    for (int k = 0; k < 2000; ++k) {
        const int64_t i = int64_t(rng()) >> (rng() % 64);
        EXPECT_EQ(Value::of_i64(i).as_int(), i);
        EXPECT_EQ(Value::of_i64(i).as_uint().has_value(), i >= 0);
        const uint64_t u = rng() >> (rng() % 64);
        EXPECT_EQ(Value::of_u64(u).as_uint(), u);
        EXPECT_EQ(Value::of_u64(u).as_int().has_value(), u <= uint64_t(INT64_MAX));
        // as_double succeeds exactly when the double holds the integer.
        auto d = Value::of_u64(u).as_double();
        if (d) {
            EXPECT_EQ(uint64_t(*d), u);
        }
        // ... which is when its significant bits span at most 53.
        const bool fits = u == 0 || std::bit_width(u) - std::countr_zero(u) <= 53;
        EXPECT_EQ(d.has_value(), fits) << u;
    }
}

TEST(GgufValue, Display) {
    EXPECT_EQ(Value::of_u32(7).to_display(), "7");
    EXPECT_EQ(Value::of_i16(-7).to_display(), "-7");
    EXPECT_EQ(Value::of_f32(0.1f).to_display(), "0.1");
    EXPECT_EQ(Value::of_f64(1e-300).to_display(), "1e-300");
    EXPECT_EQ(Value::of_bool(false).to_display(), "false");
    EXPECT_EQ(Value::of_string("a\"b\n\x01").to_display(), "\"a\\\"b\\n\\x01\"");
    EXPECT_EQ(Value::of_i32s({1, 2, 3}).to_display(), "[1, 2, 3]");
    EXPECT_EQ(Value::of_i32s({1, 2, 3}).to_display(2), "[1, 2, ...] (3 i32)");
    EXPECT_EQ(Value::of_i32s({}).to_display(), "[]");
    EXPECT_EQ(Value::of_strings({"x", "y"}).to_display(), "[\"x\", \"y\"]");
    Value nested = Value::of_array(ValueType::ARRAY, {Value::of_i32s({1}), Value::of_i32s({})});
    EXPECT_EQ(nested.to_display(), "[[1], []]");
    // Long strings are cut on a UTF-8 boundary and say how long they were.
    std::string long_text(158, 'a');
    long_text += "\xc3\xa9\xc3\xa9\xc3\xa9";  // "ééé" straddles the 160-byte cut
    std::string shown = Value::of_string(long_text).to_display();
    EXPECT_EQ(shown, "\"" + std::string(158, 'a') + "\xc3\xa9\"... (164 bytes)");
}

TEST(GgufTensorBytes, Geometry) {
    const int64_t f32[2] = {8, 3};
    EXPECT_EQ(tensor_bytes(uint32_t(TensorType::F32), f32, 2).value(), 96u);
    const int64_t q4k[2] = {512, 10};
    EXPECT_EQ(tensor_bytes(uint32_t(TensorType::Q4_K), q4k, 2).value(), 2u * 10 * 144);
    const int64_t q8[1] = {64};
    EXPECT_EQ(tensor_bytes(uint32_t(TensorType::Q8_0), q8, 1).value(), 68u);
    EXPECT_EQ(tensor_bytes(uint32_t(TensorType::F16), q8, 0).value(), 2u);  // a scalar
    const int64_t bad_row[1] = {100};
    auto r = tensor_bytes(uint32_t(TensorType::Q4_K), bad_row, 1);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("not a multiple"), std::string::npos);
    EXPECT_FALSE(tensor_bytes(4, q8, 1));  // removed type id
    EXPECT_FALSE(tensor_bytes(uint32_t(TensorType::F32), q8, 5));
    const int64_t neg[2] = {8, -1};
    EXPECT_FALSE(tensor_bytes(uint32_t(TensorType::F32), neg, 2));
    const int64_t zero[2] = {8, 0};
    EXPECT_FALSE(tensor_bytes(uint32_t(TensorType::F32), zero, 2));
    const int64_t huge[4] = {INT64_MAX, 2, 1, 1};
    EXPECT_FALSE(tensor_bytes(uint32_t(TensorType::F32), huge, 4));
    const int64_t big_bytes[2] = {int64_t(1) << 62, 1};  // elements fit, 4x bytes do not
    EXPECT_FALSE(tensor_bytes(uint32_t(TensorType::F32), big_bytes, 2));
    const int64_t max_ok[1] = {int64_t(1) << 61};
    EXPECT_EQ(tensor_bytes(uint32_t(TensorType::F32), max_ok, 1).value(), uint64_t(1) << 63);
}

TEST(GgufTensorBytes, RandomShapesMatchBlockArithmetic) {
    const uint64_t seed = testing::test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    for (uint32_t id = 0; id < 64; ++id) {
        auto info = tensor_type_info(id);
        if (!info) continue;
        for (int k = 0; k < 50; ++k) {
            int64_t ne[4] = {int64_t(info->block_elems) * int64_t(1 + rng() % 64), int64_t(1 + rng() % 9),
                             int64_t(1 + rng() % 5), int64_t(1 + rng() % 3)};
            uint32_t n_dims = 1 + uint32_t(rng() % 4);
            uint64_t rows = 1;
            for (uint32_t d = 1; d < n_dims; ++d) rows *= uint64_t(ne[d]);
            auto bytes = tensor_bytes(id, ne, n_dims);
            ASSERT_TRUE(bytes) << bytes.error().message;
            EXPECT_EQ(*bytes, rows * uint64_t(ne[0]) / info->block_elems * info->block_bytes);
        }
    }
}

TEST(GgufTensorInfo, ShapeString) {
    TensorInfo t;
    t.n_dims = 2;
    t.ne[0] = 4096;
    t.ne[1] = 32000;
    EXPECT_EQ(t.shape_string(), "[4096, 32000]");
    t.n_dims = 0;
    EXPECT_EQ(t.shape_string(), "[]");
}

}  // namespace
}  // namespace tern::gguf
