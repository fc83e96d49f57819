// Writer -> reader round trips: every metadata type (random values, nested
// arrays, strings with any bytes), tensors of every known type with random
// shapes, data and alignment, streamed and held data, and the writer's own
// refusals.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "gguf/gguf.h"
#include "test_gguf_util.h"

namespace tern::gguf {
namespace {

using testing::TempDir;

constexpr ValueType kScalarTypes[] = {
    ValueType::U8, ValueType::I8, ValueType::U16, ValueType::I16, ValueType::U32, ValueType::I32,
    ValueType::F32, ValueType::BOOL, ValueType::STRING, ValueType::U64, ValueType::I64, ValueType::F64,
};

std::string random_string(std::mt19937_64& rng) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = char(rng());  // any byte, NUL included
    return s;
}

Value random_value(std::mt19937_64& rng, ValueType t, int depth) {
    const uint64_t r = rng();
    switch (t) {
        case ValueType::U8: return Value::of_u8(uint8_t(r));
        case ValueType::I8: return Value::of_i8(int8_t(r));
        case ValueType::U16: return Value::of_u16(uint16_t(r));
        case ValueType::I16: return Value::of_i16(int16_t(r));
        case ValueType::U32: return Value::of_u32(uint32_t(r));
        case ValueType::I32: return Value::of_i32(int32_t(r));
        case ValueType::U64: return Value::of_u64(r);
        case ValueType::I64: return Value::of_i64(int64_t(r));
        case ValueType::F32: return Value::of_f32(std::bit_cast<float>(uint32_t(r)));
        case ValueType::F64: return Value::of_f64(std::bit_cast<double>(r));
        case ValueType::BOOL: return Value::of_bool(r & 1);
        case ValueType::STRING: return Value::of_string(random_string(rng));
        case ValueType::ARRAY: {
            ValueType elem = depth < 3 && rng() % 4 == 0 ? ValueType::ARRAY
                                                         : kScalarTypes[rng() % std::size(kScalarTypes)];
            std::vector<Value> items(rng() % 7);
            for (Value& item : items) item = random_value(rng, elem, depth + 1);
            return Value::of_array(elem, std::move(items));
        }
    }
    return {};
}

// Deep equality as the file stores it (floats compared by their stored bits;
// NaNs may come back quieted, so any NaN matches any NaN).
void expect_same(const Value& a, const Value& b, const std::string& where) {
    ASSERT_EQ(a.type, b.type) << where;
    switch (a.type) {
        case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64: case ValueType::BOOL:
            EXPECT_EQ(a.u, b.u) << where;
            break;
        case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
            EXPECT_EQ(a.i, b.i) << where;
            break;
        case ValueType::F32: {
            float x = float(a.f), y = float(b.f);
            if (!(std::isnan(x) && std::isnan(y))) {
                EXPECT_EQ(std::bit_cast<uint32_t>(x), std::bit_cast<uint32_t>(y)) << where;
            }
            break;
        }
        case ValueType::F64:
            if (!(std::isnan(a.f) && std::isnan(b.f))) {
                EXPECT_EQ(std::bit_cast<uint64_t>(a.f), std::bit_cast<uint64_t>(b.f)) << where;
            }
            break;
        case ValueType::STRING:
            EXPECT_EQ(a.str, b.str) << where;
            break;
        case ValueType::ARRAY:
            ASSERT_EQ(a.elem_type, b.elem_type) << where;
            ASSERT_EQ(a.items.size(), b.items.size()) << where;
            for (size_t k = 0; k < a.items.size(); ++k)
                expect_same(a.items[k], b.items[k], where + "[" + std::to_string(k) + "]");
            break;
    }
}

TEST(GgufRoundTrip, EveryValueTypeRandom) {
    const uint64_t seed = testing::test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    TempDir dir;
    for (int round = 0; round < 20; ++round) {
        Writer w;
        std::vector<KeyValue> expected;
        // Limits of every integer type, then random values of every type.
        std::vector<Value> values = {
            Value::of_u8(0), Value::of_u8(UINT8_MAX), Value::of_i8(INT8_MIN), Value::of_i8(INT8_MAX),
            Value::of_u16(UINT16_MAX), Value::of_i16(INT16_MIN), Value::of_u32(UINT32_MAX),
            Value::of_i32(INT32_MIN), Value::of_u64(UINT64_MAX), Value::of_i64(INT64_MIN),
            Value::of_f32(-0.0f), Value::of_f64(INFINITY), Value::of_bool(false), Value::of_string(""),
            Value::of_array(ValueType::U8, {}), Value::of_array(ValueType::ARRAY, {}),
        };
        for (ValueType t : kScalarTypes) values.push_back(random_value(rng, t, 0));
        for (int k = 0; k < 12; ++k) values.push_back(random_value(rng, ValueType::ARRAY, 0));
        for (size_t k = 0; k < values.size(); ++k) {
            std::string key = "test.k" + std::to_string(k) + "." + value_type_name(values[k].type);
            w.set(key, values[k]);
            expected.push_back({key, values[k]});
        }
        const std::string path = dir.file("values.gguf");
        ASSERT_TRUE(w.begin(path));
        ASSERT_TRUE(w.finish());
        auto f = File::open(path);
        ASSERT_TRUE(f) << f.error().message;
        EXPECT_EQ((*f)->version(), 3u);
        ASSERT_EQ((*f)->metadata().size(), expected.size());
        for (size_t k = 0; k < expected.size(); ++k) {
            EXPECT_EQ((*f)->metadata()[k].key, expected[k].key);  // insertion order kept
            const Value* v = (*f)->find(expected[k].key);
            ASSERT_NE(v, nullptr);
            expect_same(*v, expected[k].value, expected[k].key);
        }
    }
}

TEST(GgufRoundTrip, TypedLookups) {
    TempDir dir;
    Writer w;
    w.set_u32("a.u32", 7);
    w.set_i32("a.i32", -7);
    w.set_f32("a.f32", 0.5f);
    w.set_bool("a.bool", true);
    w.set_string("a.str", "hello");
    w.set_string("a.str", "replaced");  // set() replaces in place
    w.set("a.list", Value::of_strings({"x", "y"}));
    ASSERT_TRUE(w.begin(dir.file("m.gguf")));
    ASSERT_TRUE(w.finish());
    auto f = File::open(dir.file("m.gguf"));
    ASSERT_TRUE(f) << f.error().message;
    const File& file = **f;
    EXPECT_EQ(file.metadata().size(), 6u);
    EXPECT_EQ(file.get_int("a.u32"), 7);
    EXPECT_EQ(file.get_int("a.i32"), -7);
    EXPECT_EQ(file.get_float("a.f32"), 0.5);
    EXPECT_EQ(file.get_float("a.u32"), 7.0);
    EXPECT_EQ(file.get_bool("a.bool"), true);
    EXPECT_EQ(file.get_string("a.str"), "replaced");
    EXPECT_EQ(file.metadata()[4].key, "a.str");
    EXPECT_EQ(file.get_string("a.u32"), std::nullopt);
    EXPECT_EQ(file.get_int("a.str"), std::nullopt);
    EXPECT_EQ(file.get_int("missing"), std::nullopt);
    EXPECT_EQ(file.find("missing"), nullptr);
    EXPECT_EQ(file.find_tensor("missing"), nullptr);
    EXPECT_EQ(file.find("a.list")->items[1].str, "y");
}

TEST(GgufRoundTrip, TensorsOfEveryTypeRandomShapesAndAlignment) {
    const uint64_t seed = testing::test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    TempDir dir;
    const uint32_t alignments[] = {1, 8, 32, 64, 4096};
    for (uint32_t alignment : alignments) {
        Writer w(alignment);
        w.set_string("general.architecture", "test");
        std::vector<std::vector<uint8_t>> data;
        int n = 0;
        for (uint32_t id = 0; id < 64; ++id) {
            auto info = tensor_type_info(id);
            if (!info) continue;
            std::vector<int64_t> ne = {int64_t(info->block_elems) * int64_t(1 + rng() % 4)};
            const size_t extra = rng() % 4;
            for (size_t d = 0; d < extra; ++d) ne.push_back(int64_t(1 + rng() % 3));
            std::string name = "t" + std::to_string(n++) + "." + info->name;
            Status st = w.add_tensor(name, TensorType(id), ne);
            ASSERT_TRUE(st) << st.message();
            std::vector<uint8_t> bytes(w.tensors().back().n_bytes);
            for (uint8_t& b : bytes) b = uint8_t(rng());
            data.push_back(std::move(bytes));
        }
        const std::string path = dir.file("tensors.gguf");
        ASSERT_TRUE(w.begin(path));
        for (const auto& bytes : data) ASSERT_TRUE(w.write_tensor_data(bytes.data(), bytes.size()));
        Status st = w.finish();
        ASSERT_TRUE(st) << st.message();

        auto f = File::open(path);
        ASSERT_TRUE(f) << f.error().message;
        EXPECT_EQ((*f)->alignment(), alignment);
        EXPECT_EQ((*f)->get_int("general.alignment").has_value(), alignment != 32);
        ASSERT_EQ((*f)->tensors().size(), data.size());
        for (size_t k = 0; k < data.size(); ++k) {
            const TensorInfo& got = (*f)->tensors()[k];
            const TensorInfo& want = w.tensors()[k];
            EXPECT_EQ(got.name, want.name);
            EXPECT_EQ(got.type_id, want.type_id);
            EXPECT_EQ(got.n_dims, want.n_dims);
            for (int d = 0; d < kMaxDims; ++d) EXPECT_EQ(got.ne[d], want.ne[d]) << got.name;
            EXPECT_EQ(got.n_bytes, data[k].size());
            EXPECT_EQ(got.offset % alignment, 0u);
            EXPECT_EQ(got.split, 0u);
            EXPECT_EQ((reinterpret_cast<uintptr_t>(got.data) - reinterpret_cast<uintptr_t>((*f)->tensors()[0].data)) %
                          alignment, 0u);
            EXPECT_EQ(std::vector<uint8_t>(got.data, got.data + got.n_bytes), data[k]) << got.name;
            EXPECT_EQ((*f)->find_tensor(got.name), &got);
        }
        // The same bytes parse identically from memory.
        std::vector<uint8_t> image = testing::read_bytes(path);
        auto m = File::parse(image.data(), image.size(), "image");
        ASSERT_TRUE(m) << m.error().message;
        EXPECT_EQ((*m)->file_size(), image.size());
        EXPECT_EQ((*m)->tensors().size(), data.size());
        EXPECT_EQ((*m)->path(), "image");
    }
}

TEST(GgufRoundTrip, HeldAndStreamedDataMix) {
    const uint64_t seed = testing::test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    TempDir dir;
    Writer w;
    std::vector<std::vector<uint8_t>> data;
    std::vector<bool> held;
    for (int k = 0; k < 8; ++k) {
        std::vector<uint8_t> bytes(4 * (1 + rng() % 20));
        for (uint8_t& b : bytes) b = uint8_t(rng());
        const bool hold = rng() % 2;
        std::vector<int64_t> ne = {int64_t(bytes.size() / 4)};
        Status st = hold ? w.add_tensor("t" + std::to_string(k), TensorType::F32, ne, bytes)
                         : w.add_tensor("t" + std::to_string(k), TensorType::F32, ne);
        ASSERT_TRUE(st) << st.message();
        data.push_back(bytes);
        held.push_back(hold);
    }
    ASSERT_TRUE(w.begin(dir.file("mix.gguf")));
    for (size_t k = 0; k < data.size(); ++k)
        if (!held[k]) {
            ASSERT_TRUE(w.write_tensor_data(data[k].data(), data[k].size()));
        }
    Status st = w.finish();
    ASSERT_TRUE(st) << st.message();
    auto f = File::open(dir.file("mix.gguf"));
    ASSERT_TRUE(f) << f.error().message;
    for (size_t k = 0; k < data.size(); ++k) {
        const TensorInfo& t = (*f)->tensors()[k];
        EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes), data[k]) << k;
    }
}

// release_pages lets go of a mapping's pages and nothing else: a mapped
// file's tensors read back unchanged (the pages fault back in from the
// file), and a File parsed from memory leaves that memory alone (dropping
// anonymous pages would zero them).
TEST(GgufRoundTrip, ReleasedPagesReadBackUnchanged) {
    const uint64_t seed = testing::test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    TempDir dir;
    Writer w(4096);
    std::vector<std::vector<uint8_t>> data;
    for (int k = 0; k < 3; ++k) {
        std::vector<uint8_t> bytes(4 * (5000 + rng() % 20000));  // several pages, a ragged end
        for (uint8_t& b : bytes) b = uint8_t(rng());
        ASSERT_TRUE(w.add_tensor("t" + std::to_string(k), TensorType::F32, {int64_t(bytes.size() / 4)}, bytes));
        data.push_back(std::move(bytes));
    }
    const std::string path = dir.file("release.gguf");
    ASSERT_TRUE(w.begin(path));
    ASSERT_TRUE(w.finish());

    auto f = File::open(path);
    ASSERT_TRUE(f) << f.error().message;
    auto check = [&](const File& file, const std::string& what) {
        for (size_t k = 0; k < data.size(); ++k) {
            const TensorInfo& t = file.tensors()[k];
            EXPECT_EQ(std::vector<uint8_t>(t.data, t.data + t.n_bytes), data[k]) << what << ", tensor " << k;
        }
    };
    check(**f, "mapped, before");
    const TensorInfo& middle = (*f)->tensors()[1];
    (*f)->release_pages(middle.data, middle.n_bytes);
    (*f)->release_pages(middle.data + 1, 3);             // less than a page: nothing
    (*f)->release_pages(data[0].data(), data[0].size());  // not in the mapping: nothing
    check(**f, "mapped, after");
    const TensorInfo& first = (*f)->tensors()[0];
    (*f)->release_pages(first.data - 100, size_t(-1) / 2);  // past both ends: the mapping's part
    check(**f, "mapped, after releasing it all");

    std::vector<uint8_t> image = testing::read_bytes(path);
    auto m = File::parse(image.data(), image.size(), "image");
    ASSERT_TRUE(m) << m.error().message;
    for (const TensorInfo& t : (*m)->tensors()) (*m)->release_pages(t.data, t.n_bytes);
    check(**m, "parsed from memory");
}

TEST(GgufWriter, RefusesBadTensors) {
    Writer w;
    EXPECT_FALSE(w.add_tensor("a", TensorType(4), {32}));           // removed type id
    EXPECT_FALSE(w.add_tensor("a", TensorType(1000), {32}));
    EXPECT_FALSE(w.add_tensor("a", TensorType::Q4_K, {128}));        // not whole blocks
    EXPECT_FALSE(w.add_tensor("a", TensorType::F32, {}));
    EXPECT_FALSE(w.add_tensor("a", TensorType::F32, {1, 1, 1, 1, 1}));
    EXPECT_FALSE(w.add_tensor("a", TensorType::F32, {4, 0}));
    EXPECT_FALSE(w.add_tensor("a", TensorType::F32, {4, -2}));
    EXPECT_FALSE(w.add_tensor("a", TensorType::F32, {INT64_MAX, 4}));
    EXPECT_FALSE(w.add_tensor("a", TensorType::F32, {4}, std::vector<uint8_t>(15)));
    EXPECT_TRUE(w.tensors().empty());
    ASSERT_TRUE(w.add_tensor("a", TensorType::F32, {4}));
    Status dup = w.add_tensor("a", TensorType::F16, {4});
    ASSERT_FALSE(dup);
    EXPECT_NE(dup.message().find("'a'"), std::string::npos);
    EXPECT_EQ(w.tensors().size(), 1u);
    EXPECT_EQ(w.tensors()[0].n_bytes, 16u);
}

TEST(GgufWriter, RefusesBadValuesAndAlignment) {
    TempDir dir;
    {
        Writer w;
        Value bad = Value::of_array(ValueType::I32, {Value::of_i32(1), Value::of_u8(2)});
        w.set("bad.array", bad);
        Status st = w.begin(dir.file("a.gguf"));
        ASSERT_FALSE(st);
        EXPECT_NE(st.message().find("bad.array"), std::string::npos) << st.message();
    }
    {
        Writer w;
        Value v = Value::of_u8(0);
        v.u = 300;
        w.set("bad.u8", v);
        EXPECT_FALSE(w.begin(dir.file("b.gguf")));
    }
    {
        Writer w;
        Value v = Value::of_array(ValueType::U8, {Value::of_u8(1)});
        for (int d = 0; d < 64; ++d) v = Value::of_array(ValueType::ARRAY, {v});
        w.set("too.deep", v);  // 65 levels: the reader would refuse it
        EXPECT_FALSE(w.begin(dir.file("c.gguf")));
    }
    {
        Writer w(48);
        EXPECT_FALSE(w.add_tensor("a", TensorType::F32, {4}));
        EXPECT_FALSE(w.begin(dir.file("d.gguf")));
    }
    {
        Writer w(64);
        w.set_u32("general.alignment", 32);  // contradicts the writer
        EXPECT_FALSE(w.begin(dir.file("e.gguf")));
    }
    EXPECT_FALSE(std::filesystem::exists(dir.file("a.gguf")));
    Writer w;
    Status st = w.begin(dir.file("no/such/dir/x.gguf"));
    ASSERT_FALSE(st);
    EXPECT_NE(st.message().find("cannot create"), std::string::npos);
}

TEST(GgufWriter, StreamingOrderAndCompleteness) {
    TempDir dir;
    const std::string path = dir.file("s.gguf");
    std::vector<uint8_t> a(16, 1), b(8, 2);
    {
        Writer w;
        ASSERT_TRUE(w.add_tensor("a", TensorType::F32, {4}));
        ASSERT_TRUE(w.add_tensor("b", TensorType::F16, {4}));
        EXPECT_FALSE(w.write_tensor_data(a.data(), a.size()));  // before begin
        ASSERT_TRUE(w.begin(path));
        EXPECT_FALSE(w.add_tensor("c", TensorType::F32, {4}));  // after begin
        EXPECT_FALSE(w.write_tensor_data(b.data(), b.size()));  // wrong size for 'a'
        ASSERT_TRUE(w.write_tensor_data(a.data(), a.size()));
        Status st = w.finish();
        ASSERT_FALSE(st);  // 'b' has no data
        EXPECT_NE(st.message().find("'b'"), std::string::npos) << st.message();
        EXPECT_TRUE(std::filesystem::exists(path));
    }
    // Destroyed without a successful finish: the partial file is gone.
    EXPECT_FALSE(std::filesystem::exists(path));
    Writer w;
    ASSERT_TRUE(w.add_tensor("a", TensorType::F32, {4}));
    ASSERT_TRUE(w.begin(path));
    ASSERT_TRUE(w.write_tensor_data(a.data(), a.size()));
    EXPECT_FALSE(w.write_tensor_data(a.data(), a.size()));  // no tensor left
    ASSERT_TRUE(w.finish());
    EXPECT_FALSE(w.finish());
    EXPECT_FALSE(w.begin(path));
    auto f = File::open(path);
    ASSERT_TRUE(f) << f.error().message;
    // Data padded to the alignment after the last tensor.
    EXPECT_EQ((*f)->file_size() % 32, 0u);
}

}  // namespace
}  // namespace tern::gguf
