// Helpers shared by the GGUF unit tests: a byte-level image builder for
// hand-made (and deliberately broken) files, a reference image whose field
// offsets are recorded so tests can corrupt one field at a time, a seeded RNG
// and temporary paths.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tests/support/test_seed.h"

namespace tern::gguf::testing {

// Appends little-endian fields and remembers nothing; callers note offsets.
struct Bytes {
    std::vector<uint8_t> v;

    size_t size() const { return v.size(); }
    template <class T>
    size_t put(T x) {
        size_t at = v.size();
        v.resize(at + sizeof x);
        std::memcpy(v.data() + at, &x, sizeof x);
        return at;
    }
    size_t u8(uint8_t x) { return put(x); }
    size_t u32(uint32_t x) { return put(x); }
    size_t u64(uint64_t x) { return put(x); }
    size_t raw(const void* p, size_t n) {
        size_t at = v.size();
        v.insert(v.end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
        return at;
    }
    size_t str(const std::string& s) {
        size_t at = u64(s.size());
        raw(s.data(), s.size());
        return at;
    }
    void pad(size_t alignment) {
        while (v.size() % alignment) v.push_back(0);
    }
    template <class T>
    void patch(size_t at, T x) {
        std::memcpy(v.data() + at, &x, sizeof x);
    }
};

// A small valid version-3 file built by hand, with the offset of every field
// the corruption tests touch.
struct Reference {
    Bytes b;
    size_t version = 0, tensor_count = 0, kv_count = 0;
    size_t key0_len = 0;       // length of the first key
    size_t kv0_type = 0;       // value type of the first key-value
    size_t str_len = 0;        // length of the string value "llama"
    size_t align_value = 0;    // the u32 of general.alignment
    size_t align_type = 0;     // its value type
    size_t arr_elem_type = 0;  // element type of the i32 array
    size_t arr_len = 0;        // its length
    size_t bool_value = 0;     // the byte of a bool value
    size_t t0_info = 0, t0_name_len = 0, t0_n_dims = 0, t0_dim0 = 0, t0_dim1 = 0,
           t0_type = 0, t0_offset = 0;
    size_t t1_info = 0, t1_name_len = 0, t1_dim0 = 0, t1_type = 0, t1_offset = 0;
    size_t data_start = 0;

    const uint8_t* data() const { return b.v.data(); }
    size_t size() const { return b.v.size(); }
};

inline Reference make_reference() {
    Reference r;
    Bytes& b = r.b;
    b.raw("GGUF", 4);
    r.version = b.u32(3);
    r.tensor_count = b.u64(2);
    r.kv_count = b.u64(5);
    // kv 0: general.architecture = "llama"
    r.key0_len = b.str("general.architecture");
    r.kv0_type = b.u32(8);
    r.str_len = b.str("llama");
    // kv 1: general.alignment = u32 32
    b.str("general.alignment");
    r.align_type = b.u32(4);
    r.align_value = b.u32(32);
    // kv 2: test.ints = [1, -2, 3] (i32)
    b.str("test.ints");
    b.u32(9);
    r.arr_elem_type = b.u32(5);
    r.arr_len = b.u64(3);
    b.put<int32_t>(1);
    b.put<int32_t>(-2);
    b.put<int32_t>(3);
    // kv 3: test.flag = true
    b.str("test.flag");
    b.u32(7);
    r.bool_value = b.u8(1);
    // kv 4: test.words = [["a", "bc"], []] (array of arrays of strings)
    b.str("test.words");
    b.u32(9);
    b.u32(9);
    b.u64(2);
    b.u32(8);
    b.u64(2);
    b.str("a");
    b.str("bc");
    b.u32(8);
    b.u64(0);
    // tensor 0: "w" f32 [8, 2], 64 bytes at 0
    r.t0_info = r.t0_name_len = b.str("w");
    r.t0_n_dims = b.u32(2);
    r.t0_dim0 = b.u64(8);
    r.t0_dim1 = b.u64(2);
    r.t0_type = b.u32(0);
    r.t0_offset = b.u64(0);
    // tensor 1: "q" q8_0 [32], 34 bytes at 64
    r.t1_info = r.t1_name_len = b.str("q");
    b.u32(1);
    r.t1_dim0 = b.u64(32);
    r.t1_type = b.u32(8);
    r.t1_offset = b.u64(64);
    b.pad(32);
    r.data_start = b.size();
    for (int k = 0; k < 64 + 34; ++k) b.u8(uint8_t(k * 7 + 1));
    return r;
}

// Parses and returns the error message; "" if the image parsed.
inline std::string parse_error(const std::vector<uint8_t>& bytes, const std::string& name = "t.gguf") {
    auto f = File::parse(bytes.data(), bytes.size(), name);
    return f ? std::string() : f.error().message;
}

// The binary's random seed (tests/support/test_seed.h).
inline constexpr auto& test_seed = tern::test::run_seed;

// A fresh directory of its own (mkdtemp), removed when the object dies.
struct TempDir {
    std::filesystem::path path;
    TempDir() {
        std::string name = (std::filesystem::temp_directory_path() / "tern-gguf-test-XXXXXX").string();
        if (!mkdtemp(name.data())) throw std::runtime_error("TempDir: mkdtemp failed for " + name);
        path = name;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path, ec);
    }
    std::string file(const std::string& name) const { return (path / name).string(); }
};

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace tern::gguf::testing
