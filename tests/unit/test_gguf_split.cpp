// Opening files from disk: split models (NAME-0000i-of-0000N.gguf) merged into
// one File and checked for consistency, errors from the file system, and (when
// TERN_TEST_LARGE_GGUF=1) a file larger than 4 GiB written and read back.
#include <gtest/gtest.h>

#include <cstdlib>
#include <random>

#include "gguf/gguf.h"
#include "test_gguf_util.h"

namespace tern::gguf {
namespace {

using testing::TempDir;

struct SplitSpec {
    std::vector<std::string> tensor_names;
    std::optional<int64_t> split_no;     // written when set
    std::optional<int64_t> split_count;
    std::optional<int64_t> tensors_count;
};

// Writes one split holding f32 tensors of 4 elements filled with `fill`+k.
void write_split(const std::string& path, const SplitSpec& spec, uint8_t fill) {
    Writer w;
    w.set_string("general.name", "split at " + path);
    if (spec.split_no) w.set("split.no", Value::of_u16(uint16_t(*spec.split_no)));
    if (spec.split_count) w.set("split.count", Value::of_u16(uint16_t(*spec.split_count)));
    if (spec.tensors_count) w.set("split.tensors.count", Value::of_i32(int32_t(*spec.tensors_count)));
    uint8_t k = 0;
    for (const std::string& name : spec.tensor_names)
        ASSERT_TRUE(w.add_tensor(name, TensorType::F32, {4}, std::vector<uint8_t>(16, uint8_t(fill + k++))));
    ASSERT_TRUE(w.begin(path));
    Status st = w.finish();
    ASSERT_TRUE(st) << st.message();
}

TEST(GgufSplit, ThreeSplitsMerge) {
    TempDir dir;
    write_split(dir.file("m-00001-of-00003.gguf"), {{"a", "b"}, 0, 3, 5}, 10);
    write_split(dir.file("m-00002-of-00003.gguf"), {{"c"}, 1, 3, {}}, 20);
    write_split(dir.file("m-00003-of-00003.gguf"), {{"d", "e"}, 2, 3, {}}, 30);
    for (const char* start : {"m-00001-of-00003.gguf", "m-00002-of-00003.gguf"}) {
        auto f = File::open(dir.file(start));
        ASSERT_TRUE(f) << f.error().message;
        EXPECT_EQ((*f)->split_count(), 3u);
        EXPECT_EQ((*f)->path(), dir.file(start));
        // Metadata comes from the first split.
        EXPECT_EQ((*f)->get_string("general.name"), "split at " + dir.file("m-00001-of-00003.gguf"));
        EXPECT_EQ((*f)->get_int("split.no"), 0);
        ASSERT_EQ((*f)->tensors().size(), 5u);
        const uint32_t want_split[] = {0, 0, 1, 2, 2};
        const uint8_t want_fill[] = {10, 11, 20, 30, 31};
        const char* names[] = {"a", "b", "c", "d", "e"};
        for (int k = 0; k < 5; ++k) {
            const TensorInfo* t = (*f)->find_tensor(names[k]);
            ASSERT_NE(t, nullptr) << names[k];
            EXPECT_EQ(t->split, want_split[k]) << names[k];
            EXPECT_EQ(t->data[0], want_fill[k]) << names[k];
            EXPECT_EQ(t->data[15], want_fill[k]) << names[k];
        }
        uint64_t total = 0;
        for (const char* n : {"m-00001-of-00003.gguf", "m-00002-of-00003.gguf", "m-00003-of-00003.gguf"})
            total += std::filesystem::file_size(dir.file(n));
        EXPECT_EQ((*f)->file_size(), total);
    }
}

std::string open_error(const std::string& path) {
    auto f = File::open(path);
    return f ? std::string() : f.error().message;
}

TEST(GgufSplit, Inconsistencies) {
    TempDir dir;
    // Missing split.
    write_split(dir.file("a-00001-of-00002.gguf"), {{"x"}, 0, 2, {}}, 1);
    std::string err = open_error(dir.file("a-00001-of-00002.gguf"));
    EXPECT_NE(err.find("a-00002-of-00002.gguf"), std::string::npos) << err;
    EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
    // Duplicate tensor across splits.
    write_split(dir.file("a-00002-of-00002.gguf"), {{"x"}, 1, 2, {}}, 2);
    err = open_error(dir.file("a-00001-of-00002.gguf"));
    EXPECT_NE(err.find("tensor 'x'"), std::string::npos) << err;
    EXPECT_NE(err.find("duplicate"), std::string::npos) << err;
    // Wrong split.no.
    write_split(dir.file("b-00001-of-00002.gguf"), {{"x"}, 0, 2, {}}, 1);
    write_split(dir.file("b-00002-of-00002.gguf"), {{"y"}, 0, 2, {}}, 2);
    err = open_error(dir.file("b-00001-of-00002.gguf"));
    EXPECT_NE(err.find("b-00002-of-00002.gguf: key 'split.no' is 0, expected 1"), std::string::npos) << err;
    // Wrong split.count.
    write_split(dir.file("c-00001-of-00002.gguf"), {{"x"}, 0, 3, {}}, 1);
    write_split(dir.file("c-00002-of-00002.gguf"), {{"y"}, 1, 3, {}}, 2);
    err = open_error(dir.file("c-00001-of-00002.gguf"));
    EXPECT_NE(err.find("split.count"), std::string::npos) << err;
    // split.tensors.count disagrees with the tensors found.
    write_split(dir.file("d-00001-of-00002.gguf"), {{"x"}, 0, 2, 3}, 1);
    write_split(dir.file("d-00002-of-00002.gguf"), {{"y"}, 1, 2, {}}, 2);
    err = open_error(dir.file("d-00001-of-00002.gguf"));
    EXPECT_NE(err.find("split.tensors.count"), std::string::npos) << err;
    // One part of a split model opened under a plain name.
    write_split(dir.file("plain.gguf"), {{"x"}, 0, 2, {}}, 1);
    err = open_error(dir.file("plain.gguf"));
    EXPECT_NE(err.find("one part of a split model"), std::string::npos) << err;
    // A single file named as split 1 of 1 with matching keys is fine.
    write_split(dir.file("e-00001-of-00001.gguf"), {{"x"}, 0, 1, 1}, 1);
    EXPECT_EQ(open_error(dir.file("e-00001-of-00001.gguf")), "");
    // A corrupt later split reports its own name.
    write_split(dir.file("f-00001-of-00002.gguf"), {{"x"}, 0, 2, {}}, 1);
    testing::write_bytes(dir.file("f-00002-of-00002.gguf"), {'G', 'G', 'U', 'F', 3, 0});
    err = open_error(dir.file("f-00001-of-00002.gguf"));
    EXPECT_EQ(err.rfind(dir.file("f-00002-of-00002.gguf") + ": ", 0), 0u) << err;
}

TEST(GgufOpen, FileSystemErrors) {
    TempDir dir;
    std::string err = open_error(dir.file("absent.gguf"));
    EXPECT_NE(err.find("absent.gguf: cannot open"), std::string::npos) << err;
    err = open_error(dir.path.string());
    EXPECT_NE(err.find("not a regular file"), std::string::npos) << err;
    testing::write_bytes(dir.file("empty.gguf"), {});
    err = open_error(dir.file("empty.gguf"));
    EXPECT_NE(err.find("empty.gguf: header: truncated: magic"), std::string::npos) << err;
    // Names that only look like splits are plain files.
    for (const char* name : {"x-00000-of-00002.gguf", "x-00003-of-00002.gguf", "x-0001-of-00002.gguf"}) {
        write_split(dir.file(name), {{"t"}, {}, {}, {}}, 1);
        auto f = File::open(dir.file(name));
        ASSERT_TRUE(f) << f.error().message;
        EXPECT_EQ((*f)->split_count(), 1u);
    }
}

// A multi-gigabyte file: offsets beyond 4 GiB survive writing and reading.
// Slow and disk-hungry, so it runs only when asked for.
TEST(GgufLarge, FiveGigabytesStreamed) {
    if (!std::getenv("TERN_TEST_LARGE_GGUF")) GTEST_SKIP() << "set TERN_TEST_LARGE_GGUF=1 to run";
    TempDir dir;
    const std::string path = dir.file("large.gguf");
    const int64_t n = int64_t(1) << 28;  // 2^28 f32 = 1 GiB per tensor
    const int count = 5;
    {
        Writer w;
        for (int k = 0; k < count; ++k)
            ASSERT_TRUE(w.add_tensor("t" + std::to_string(k), TensorType::F32, {n}));
        ASSERT_TRUE(w.begin(path));
        std::vector<uint8_t> buf(size_t(n) * 4);
        for (int k = 0; k < count; ++k) {
            buf.front() = uint8_t(k + 1);
            buf.back() = uint8_t(k + 101);
            ASSERT_TRUE(w.write_tensor_data(buf.data(), buf.size()));
        }
        Status st = w.finish();
        ASSERT_TRUE(st) << st.message();
    }
    auto f = File::open(path);
    ASSERT_TRUE(f) << f.error().message;
    ASSERT_GT((*f)->file_size(), uint64_t(count) << 30);
    for (int k = 0; k < count; ++k) {
        const TensorInfo& t = (*f)->tensors()[size_t(k)];
        EXPECT_EQ(t.offset, uint64_t(k) << 30);
        EXPECT_EQ(t.data[0], uint8_t(k + 1));
        EXPECT_EQ(t.data[t.n_bytes - 1], uint8_t(k + 101));
    }
}

}  // namespace
}  // namespace tern::gguf
