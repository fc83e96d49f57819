// The reader against hand-made broken files: every header field corrupted in
// turn must give an error that names the field and its offset, and no prefix
// or random mutation of a valid file may crash (run these under ASan/UBSan).
#include <gtest/gtest.h>

#include <random>

#include "gguf/gguf.h"
#include "test_gguf_util.h"

namespace tern::gguf {
namespace {

using testing::Bytes;
using testing::make_reference;
using testing::parse_error;
using testing::Reference;

constexpr uint64_t kHuge = uint64_t(1) << 63;

// Expects the parse to fail with a message containing every fragment.
void expect_error(const std::vector<uint8_t>& bytes, std::initializer_list<std::string> fragments) {
    std::string err = parse_error(bytes);
    ASSERT_FALSE(err.empty()) << "parsed, but an error was expected";
    EXPECT_EQ(err.rfind("t.gguf: ", 0), 0u) << err;
    for (const std::string& f : fragments) EXPECT_NE(err.find(f), std::string::npos) << "missing '" << f << "' in: " << err;
}

TEST(GgufCorrupt, ReferenceImageParses) {
    Reference r = make_reference();
    auto f = File::parse(r.data(), r.size(), "t.gguf");
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_EQ((*f)->version(), 3u);
    EXPECT_EQ((*f)->alignment(), 32u);
    ASSERT_EQ((*f)->metadata().size(), 5u);
    EXPECT_EQ((*f)->get_string("general.architecture"), "llama");
    EXPECT_EQ((*f)->get_bool("test.flag"), true);
    const Value* ints = (*f)->find("test.ints");
    ASSERT_NE(ints, nullptr);
    ASSERT_EQ(ints->items.size(), 3u);
    EXPECT_EQ(ints->items[1].i, -2);
    const Value* words = (*f)->find("test.words");
    ASSERT_NE(words, nullptr);
    EXPECT_EQ(words->elem_type, ValueType::ARRAY);
    ASSERT_EQ(words->items.size(), 2u);
    EXPECT_EQ(words->items[0].items[1].str, "bc");
    EXPECT_TRUE(words->items[1].items.empty());
    EXPECT_EQ(words->items[1].elem_type, ValueType::STRING);
    ASSERT_EQ((*f)->tensors().size(), 2u);
    const TensorInfo* q = (*f)->find_tensor("q");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(q->n_bytes, 34u);
    EXPECT_EQ(q->data, r.data() + r.data_start + 64);
    EXPECT_EQ((*f)->find_tensor("w")->n_elements, 16);
}

TEST(GgufCorrupt, BadMagic) {
    Reference r = make_reference();
    r.b.v[1] = 'X';
    expect_error(r.b.v, {"bad magic", "offset 0"});
    expect_error({}, {"magic", "needs 4 bytes"});
}

TEST(GgufCorrupt, Version) {
    Reference r = make_reference();
    r.b.patch<uint32_t>(r.version, 1);
    expect_error(r.b.v, {"unsupported version 1", "offset 4"});
    r.b.patch<uint32_t>(r.version, 4);
    expect_error(r.b.v, {"unsupported version 4"});
    r.b.patch<uint32_t>(r.version, 0x03000000u);
    expect_error(r.b.v, {"big-endian"});
    r.b.patch<uint32_t>(r.version, 0x02000000u);
    expect_error(r.b.v, {"big-endian"});
    // Version 2 has the same layout for little-endian files.
    r.b.patch<uint32_t>(r.version, 2);
    auto f = File::parse(r.data(), r.size());
    ASSERT_TRUE(f) << f.error().message;
    EXPECT_EQ((*f)->version(), 2u);
}

TEST(GgufCorrupt, EveryPrefixIsAnError) {
    // The reference image ends exactly at its last tensor's data, so every
    // proper prefix is missing something.
    Reference r = make_reference();
    for (size_t n = 0; n < r.size(); ++n) {
        std::vector<uint8_t> prefix(r.b.v.begin(), r.b.v.begin() + n);
        // A heap copy of exactly n bytes lets ASan catch any read past the end.
        std::string err = parse_error(prefix);
        EXPECT_FALSE(err.empty()) << "prefix of " << n << " bytes parsed";
    }
}

TEST(GgufCorrupt, HugeCounts) {
    {
        Reference r = make_reference();
        r.b.patch(r.tensor_count, kHuge);
        expect_error(r.b.v, {"tensor_count 9223372036854775808", "offset 8", "cannot fit"});
    }
    {
        Reference r = make_reference();
        r.b.patch(r.kv_count, kHuge);
        expect_error(r.b.v, {"kv_count 9223372036854775808", "offset 16"});
    }
    {
        Reference r = make_reference();
        r.b.patch(r.key0_len, kHuge);
        expect_error(r.b.v, {"key length 9223372036854775808", "offset " + std::to_string(r.key0_len)});
    }
    {
        Reference r = make_reference();
        r.b.patch(r.str_len, kHuge);
        expect_error(r.b.v, {"general.architecture", "string value length", "offset " + std::to_string(r.str_len)});
    }
    {
        Reference r = make_reference();
        r.b.patch(r.arr_len, kHuge);
        expect_error(r.b.v, {"test.ints", "array length 9223372036854775808", "offset " + std::to_string(r.arr_len)});
    }
    {
        // Just too long: 3 i32 fit, but not as many as the remaining bytes / 4 + 1.
        Reference r = make_reference();
        r.b.patch<uint64_t>(r.arr_len, (r.size() - r.arr_len - 8) / 4 + 1);
        expect_error(r.b.v, {"test.ints", "array length"});
    }
    {
        Reference r = make_reference();
        r.b.patch(r.t0_name_len, kHuge);
        expect_error(r.b.v, {"tensor info 0", "tensor name length"});
    }
    // Counts a little too large make the reader walk into the next section;
    // whatever it finds there, it must not crash. Impossible counts are errors.
    for (uint64_t count : {uint64_t(3), uint64_t(6), uint64_t(1000), ~uint64_t(0)}) {
        Reference r = make_reference();
        r.b.patch(r.tensor_count, count);
        std::string err = parse_error(r.b.v);
        if (count >= 1000) {
            EXPECT_NE(err.find("tensor_count"), std::string::npos) << err;
        }
        r = make_reference();
        r.b.patch(r.kv_count, count);
        err = parse_error(r.b.v);
        if (count >= 1000) {
            EXPECT_NE(err.find("kv_count"), std::string::npos) << err;
        }
    }
}

TEST(GgufCorrupt, MemoryLimits) {
    // More tensors than any model has, with bytes enough for their infos.
    Reference r = make_reference();
    r.b.patch<uint64_t>(r.tensor_count, (uint64_t(1) << 20) + 1);
    r.b.v.resize(r.b.v.size() + 25 * (size_t(1) << 20));
    expect_error(r.b.v, {"tensor_count 1048577", "limit of 1048576 tensors"});
    // An array whose bytes are present but whose items would cost ~100 bytes
    // each in memory: refused past 2^23 values.
    Bytes b;
    b.raw("GGUF", 4);
    b.u32(3);
    b.u64(0);
    b.u64(1);
    b.str("big");
    b.u32(9);
    b.u32(0);
    b.u64(uint64_t(1) << 23);
    b.v.resize(b.v.size() + (size_t(1) << 23), 7);
    expect_error(b.v, {"key 'big'", "array length 8388608", "past 8388608 values"});
}

TEST(GgufCorrupt, ValueTypes) {
    Reference r = make_reference();
    r.b.patch<uint32_t>(r.kv0_type, 13);
    expect_error(r.b.v, {"general.architecture", "value type 13", "offset " + std::to_string(r.kv0_type)});
    r = make_reference();
    r.b.patch<uint32_t>(r.arr_elem_type, 0xFFFFFFFFu);
    expect_error(r.b.v, {"test.ints", "array element type 4294967295"});
    r = make_reference();
    r.b.v[r.bool_value] = 2;
    expect_error(r.b.v, {"test.flag", "bool value 2", "offset " + std::to_string(r.bool_value)});
}

TEST(GgufCorrupt, Alignment) {
    for (uint32_t bad : {0u, 3u, 48u, 0x80000001u}) {
        Reference r = make_reference();
        r.b.patch(r.align_value, bad);
        expect_error(r.b.v, {"general.alignment", "not a nonzero power of two"});
    }
    Reference r = make_reference();
    r.b.patch<uint32_t>(r.align_type, 5);  // i32 with the same payload
    expect_error(r.b.v, {"general.alignment", "has type i32, expected u32"});
    // A valid larger alignment that tensor q's offset 64 does not respect.
    r = make_reference();
    r.b.patch<uint32_t>(r.align_value, 128);
    expect_error(r.b.v, {"tensor 'q'", "data offset 64", "not a multiple of the alignment 128"});
    // Alignment 1 puts the data right after the infos, which the image pads;
    // tensors then start earlier and still fit.
    r = make_reference();
    r.b.patch<uint32_t>(r.align_value, 1);
    EXPECT_EQ(parse_error(r.b.v), "");
}

TEST(GgufCorrupt, TensorDims) {
    Reference r = make_reference();
    r.b.patch<uint32_t>(r.t0_n_dims, 5);
    expect_error(r.b.v, {"tensor 'w'", "tensor info at offset " + std::to_string(r.t0_info), "n_dims 5",
                         "offset " + std::to_string(r.t0_n_dims)});
    r = make_reference();
    r.b.patch<uint64_t>(r.t0_dim1, 0);
    expect_error(r.b.v, {"tensor 'w'", "dimension 1", "is 0", "offset " + std::to_string(r.t0_dim1)});
    r = make_reference();
    r.b.patch<uint64_t>(r.t0_dim0, uint64_t(-8));
    expect_error(r.b.v, {"tensor 'w'", "dimension 0", "-8", "negative"});
    r = make_reference();
    r.b.patch<uint64_t>(r.t0_dim0, uint64_t(1) << 32);
    r.b.patch<uint64_t>(r.t0_dim1, uint64_t(1) << 32);
    expect_error(r.b.v, {"tensor 'w'", "more elements than int64"});
    // Elements fit in int64 but bytes (4 per f32) would not fit in the file.
    r = make_reference();
    r.b.patch<uint64_t>(r.t0_dim0, uint64_t(1) << 30);
    r.b.patch<uint64_t>(r.t0_dim1, uint64_t(1) << 31);
    expect_error(r.b.v, {"tensor 'w'", "extends past end of file"});
    // Elements fit in int64, bytes do not fit in uint64.
    r = make_reference();
    r.b.patch<uint64_t>(r.t0_dim0, uint64_t(1) << 31);
    r.b.patch<uint64_t>(r.t0_dim1, uint64_t(1) << 31);
    expect_error(r.b.v, {"tensor 'w'", "byte size overflows"});
    // Row not a whole number of q8_0 blocks.
    r = make_reference();
    r.b.patch<uint64_t>(r.t1_dim0, 16);
    expect_error(r.b.v, {"tensor 'q'", "row length 16", "block size 32"});
}

TEST(GgufCorrupt, TensorTypeAndOffset) {
    for (uint32_t bad : {4u, 5u, 31u, 1000u, 0xFFFFFFFFu}) {
        Reference r = make_reference();
        r.b.patch(r.t1_type, bad);
        expect_error(r.b.v, {"tensor 'q'", "unknown tensor type id " + std::to_string(bad),
                             "offset " + std::to_string(r.t1_type)});
    }
    // A known type without tern arithmetic still loads (iq4_nl: 32 elements, 18 bytes).
    Reference r = make_reference();
    r.b.patch<uint32_t>(r.t1_type, 20);
    EXPECT_EQ(parse_error(r.b.v), "");
    r = make_reference();
    r.b.patch<uint64_t>(r.t1_offset, 65);
    expect_error(r.b.v, {"tensor 'q'", "data offset 65", "not a multiple of the alignment 32"});
    r = make_reference();
    r.b.patch<uint64_t>(r.t1_offset, 96);
    const size_t start = r.data_start + 96;
    expect_error(r.b.v, {"tensor 'q' (tensor info at offset " + std::to_string(r.t1_info) + ")",
                         "data [" + std::to_string(start) + ", " + std::to_string(start + 34) +
                             ") extends past end of file (size " + std::to_string(r.size()) + ")"});
    r = make_reference();
    r.b.patch<uint64_t>(r.t1_offset, ~uint64_t(31));  // aligned, wraps when added
    expect_error(r.b.v, {"tensor 'q'", "beyond the end of the file"});
}

TEST(GgufCorrupt, Duplicates) {
    Reference r = make_reference();
    // Rename "test.flag" to "test.ints" (same length).
    std::string v(r.b.v.begin(), r.b.v.end());
    size_t at = v.find("test.flag");
    ASSERT_NE(at, std::string::npos);
    std::memcpy(r.b.v.data() + at, "test.ints", 9);
    expect_error(r.b.v, {"key 'test.ints'", "duplicate key"});
    r = make_reference();
    r.b.v[r.t1_name_len + 8] = 'w';
    expect_error(r.b.v, {"tensor 'w'", "duplicate tensor name", "first at offset " + std::to_string(r.t0_info)});
}

// Builds a file whose single key holds arrays nested `depth` deep.
std::vector<uint8_t> nested_arrays(size_t depth) {
    Bytes b;
    b.raw("GGUF", 4);
    b.u32(3);
    b.u64(0);
    b.u64(1);
    b.str("deep");
    b.u32(9);
    for (size_t d = 1; d < depth; ++d) {
        b.u32(9);
        b.u64(1);
    }
    b.u32(0);  // innermost: one u8
    b.u64(1);
    b.u8(42);
    return b.v;
}

TEST(GgufCorrupt, NestingDepth) {
    auto ok = nested_arrays(64);
    auto f = File::parse(ok.data(), ok.size());
    ASSERT_TRUE(f) << f.error().message;
    const Value* v = (*f)->find("deep");
    for (int d = 1; d < 64; ++d) v = &v->items.at(0);
    EXPECT_EQ(v->items.at(0).u, 42u);
    expect_error(nested_arrays(65), {"key 'deep'", "nested deeper than 64"});
    // Far deeper than any stack could recurse: still just an error.
    expect_error(nested_arrays(200000), {"nested deeper than 64"});
}

// Random byte flips of a valid file: each result is either a File whose tensor
// data lies inside the buffer, or an error. ASan checks the rest.
TEST(GgufCorrupt, RandomFlipsNeverCrash) {
    const uint64_t seed = testing::test_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    Reference r = make_reference();
    int parsed = 0;
    for (int iter = 0; iter < 20000; ++iter) {
        std::vector<uint8_t> bytes = r.b.v;
        const int flips = 1 + int(rng() % 4);
        for (int k = 0; k < flips; ++k) {
            size_t at = rng() % bytes.size();
            if (rng() % 2) bytes[at] ^= uint8_t(1u << (rng() % 8));
            else bytes[at] = uint8_t(rng());
        }
        if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
        auto f = File::parse(bytes.data(), bytes.size(), "t.gguf");
        if (!f) {
            ASSERT_FALSE(f.error().message.empty());
            continue;
        }
        ++parsed;
        for (const TensorInfo& t : (*f)->tensors()) {
            ASSERT_GE(t.data, bytes.data());
            ASSERT_LE(t.data + t.n_bytes, bytes.data() + bytes.size());
            ASSERT_GT(t.n_bytes, 0u);
        }
    }
    // Flips in tensor data and in some values leave the file valid.
    EXPECT_GT(parsed, 0);
}

}  // namespace
}  // namespace tern::gguf
