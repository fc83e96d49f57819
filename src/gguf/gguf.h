// The GGUF file format: a validating, memory-mapped reader (versions 2 and 3,
// split files) and a writer. Every count, length, offset and size in a file is
// checked against the file's size before it is used, so a hostile file yields
// an Error naming the field and its offset, never a crash or a huge allocation.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "gguf/tensor_type.h"

namespace tern::gguf {

enum class ValueType : uint32_t {
    U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
    STRING = 8, ARRAY = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* value_type_name(ValueType t);

// One metadata value. Scalars are held widened (integers as int64/uint64,
// floats as double) with their file type kept in `type`; arrays hold their
// element type and items (which may themselves be arrays).
struct Value {
    ValueType type = ValueType::U8;
    uint64_t u = 0;        // U8, U16, U32, U64, BOOL
    int64_t i = 0;         // I8, I16, I32, I64
    double f = 0;          // F32, F64
    std::string str;       // STRING
    ValueType elem_type = ValueType::U8;  // ARRAY: element type
    std::vector<Value> items;             // ARRAY: elements

    static Value of_u8(uint8_t v);
    static Value of_i8(int8_t v);
    static Value of_u16(uint16_t v);
    static Value of_i16(int16_t v);
    static Value of_u32(uint32_t v);
    static Value of_i32(int32_t v);
    static Value of_u64(uint64_t v);
    static Value of_i64(int64_t v);
    static Value of_f32(float v);
    static Value of_f64(double v);
    static Value of_bool(bool v);
    static Value of_string(std::string v);
    static Value of_array(ValueType elem, std::vector<Value> items);
    static Value of_strings(const std::vector<std::string>& v);
    static Value of_f32s(const std::vector<float>& v);
    static Value of_i32s(const std::vector<int32_t>& v);

    bool is_integer() const;  // any integer type (not BOOL)
    bool is_float() const;    // F32 or F64
    // Conversions that succeed only when the value fits exactly.
    std::optional<int64_t> as_int() const;
    std::optional<uint64_t> as_uint() const;
    std::optional<double> as_double() const;  // integers and floats
    std::optional<bool> as_bool() const;
    const std::string* as_string() const;    // nullptr unless STRING
    std::string to_display(size_t max_items = 8) const;  // for `tern info`
};

struct KeyValue {
    std::string key;
    Value value;
};

constexpr int kMaxDims = 4;

struct TensorInfo {
    std::string name;
    uint32_t n_dims = 0;
    int64_t ne[kMaxDims] = {1, 1, 1, 1};  // ne[0] is the row length (fastest-varying)
    uint32_t type_id = 0;                 // a TensorType value
    uint64_t offset = 0;                  // relative to its split's data section
    uint64_t n_bytes = 0;                 // checked to lie inside the file
    int64_t n_elements = 0;
    uint32_t split = 0;                   // which split file holds the data
    const uint8_t* data = nullptr;        // into the mapping; valid while the File lives

    TensorType type() const { return TensorType(type_id); }
    std::string shape_string() const;     // "[4096, 32000]"
};

// A mapped GGUF model, possibly made of several split files whose tensors and
// metadata (from the first split) are presented as one.
class File {
public:
    // Opens `path`. If it is named like NAME-00001-of-0000N.gguf (or names
    // any other part), all N splits are opened (and checked: split.count,
    // split.no, split.tensors.count, no duplicate tensor names).
    static Result<std::unique_ptr<File>> open(const std::string& path);
    // Parses a GGUF image held in memory (fuzzing, tests). The bytes must
    // outlive the File.
    static Result<std::unique_ptr<File>> parse(const uint8_t* data, size_t size,
                                               std::string name = "<memory>");
    ~File();
    File(const File&) = delete;
    File& operator=(const File&) = delete;

    const std::string& path() const { return path_; }
    uint32_t version() const { return version_; }
    uint32_t alignment() const { return alignment_; }
    uint64_t file_size() const { return total_size_; }  // all splits together
    size_t split_count() const { return splits_.size(); }

    const std::vector<KeyValue>& metadata() const { return kv_; }
    const Value* find(std::string_view key) const;
    // Typed lookups: nullopt when missing or of a type that does not convert.
    std::optional<int64_t> get_int(std::string_view key) const;
    std::optional<double> get_float(std::string_view key) const;
    std::optional<bool> get_bool(std::string_view key) const;
    std::optional<std::string> get_string(std::string_view key) const;

    const std::vector<TensorInfo>& tensors() const { return tensors_; }
    const TensorInfo* find_tensor(std::string_view name) const;

    // MappedFile::release_pages over every split's mapping: for tensor bytes
    // a reader has copied. A File parsed from memory releases nothing.
    void release_pages(const void* p, size_t n) const;

private:
    File() = default;
    struct Split;
    std::string path_;
    uint32_t version_ = 0;
    uint32_t alignment_ = 32;
    uint64_t total_size_ = 0;
    std::vector<KeyValue> kv_;
    std::vector<TensorInfo> tensors_;
    std::map<std::string, size_t, std::less<>> tensor_index_;
    std::vector<std::unique_ptr<Split>> splits_;
    friend struct Parser;
};

// Builds a GGUF (version 3) file: metadata in insertion order, then tensor
// infos, then aligned tensor data. Tensor data may be given up front or
// streamed in order with write_tensor_data(), so multi-gigabyte files never
// need to sit in memory.
class Writer {
public:
    explicit Writer(uint32_t alignment = 32);

    void set(std::string key, Value value);  // replaces an existing key
    void set_u32(std::string key, uint32_t v) { set(std::move(key), Value::of_u32(v)); }
    void set_i32(std::string key, int32_t v) { set(std::move(key), Value::of_i32(v)); }
    void set_f32(std::string key, float v) { set(std::move(key), Value::of_f32(v)); }
    void set_bool(std::string key, bool v) { set(std::move(key), Value::of_bool(v)); }
    void set_string(std::string key, std::string v) { set(std::move(key), Value::of_string(std::move(v))); }

    // Declares a tensor; ne[0] is the row length. Returns an error if the type
    // is unknown, the row length is not a whole number of blocks, or the name
    // is taken. n_bytes is computed from type and shape.
    Status add_tensor(std::string name, TensorType type, std::vector<int64_t> ne);
    // Declares a tensor together with its bytes (exactly n_bytes), which are
    // kept and written when its turn comes (small files, tests). Streamed and
    // held tensors may be mixed: write_tensor_data() feeds the next tensor
    // that has no held bytes.
    Status add_tensor(std::string name, TensorType type, std::vector<int64_t> ne,
                      std::vector<uint8_t> data);

    // Writes header, metadata and tensor infos, then waits for tensor data.
    Status begin(const std::string& path);
    // Data for the next declared tensor, in declaration order; exactly its n_bytes.
    Status write_tensor_data(const void* data, size_t n_bytes);
    // Checks every tensor got its data, pads and closes the file. A Writer
    // destroyed after begin() without a successful finish() deletes the
    // incomplete file.
    Status finish();

    const std::vector<TensorInfo>& tensors() const { return tensors_; }

    Writer(const Writer&) = delete;
    Writer& operator=(const Writer&) = delete;
    ~Writer();

private:
    Status write_held();  // writes held tensors whose turn has come
    uint32_t alignment_;
    std::vector<KeyValue> kv_;
    std::vector<TensorInfo> tensors_;
    std::vector<std::vector<uint8_t>> held_data_;  // per tensor; empty when streamed
    std::string path_;
    struct Out;
    std::unique_ptr<Out> out_;
    size_t next_tensor_ = 0;
};

// Bytes of a tensor of `type` with these dimensions, or an error if the row
// length is not a whole number of blocks or the product overflows.
Result<uint64_t> tensor_bytes(uint32_t type_id, const int64_t* ne, uint32_t n_dims);

}  // namespace tern::gguf
