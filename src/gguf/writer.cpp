// The GGUF writer (version 3). Header, metadata and tensor infos are written
// by begin(); tensor data follows in declaration order, each tensor padded to
// the alignment, through a buffered stream so files of any size are written
// without holding their data in memory.
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>

#include "gguf/gguf.h"

namespace tern::gguf {

namespace {

constexpr uint32_t kDefaultAlignment = 32;
constexpr uint32_t kVersion = 3;
// The reader refuses deeper nesting, so the writer does too.
constexpr uint32_t kMaxArrayDepth = 64;

uint64_t align_up(uint64_t v, uint64_t alignment) {
    return (v + alignment - 1) / alignment * alignment;
}

bool valid_alignment(uint32_t a) { return a != 0 && std::has_single_bit(a); }

// Checks that a value can be written as its declared type: scalars fit their
// width, array items all have the array's element type, nesting is bounded.
Status check_value(const Value& v, uint32_t depth, const std::string& key) {
    auto bad = [&](const std::string& what) { return Status(Error{"key '" + key + "': " + what}); };
    auto fits_unsigned = [&](uint64_t max) {
        return v.u <= max ? Status{} : bad(std::to_string(v.u) + " does not fit " + value_type_name(v.type));
    };
    auto fits_signed = [&](int64_t min, int64_t max) {
        return v.i >= min && v.i <= max ? Status{}
                                        : bad(std::to_string(v.i) + " does not fit " + value_type_name(v.type));
    };
    switch (v.type) {
        case ValueType::U8: return fits_unsigned(UINT8_MAX);
        case ValueType::U16: return fits_unsigned(UINT16_MAX);
        case ValueType::U32: return fits_unsigned(UINT32_MAX);
        case ValueType::U64: return {};
        case ValueType::BOOL: return fits_unsigned(1);
        case ValueType::I8: return fits_signed(INT8_MIN, INT8_MAX);
        case ValueType::I16: return fits_signed(INT16_MIN, INT16_MAX);
        case ValueType::I32: return fits_signed(INT32_MIN, INT32_MAX);
        case ValueType::I64: case ValueType::F32: case ValueType::F64: case ValueType::STRING:
            return {};
        case ValueType::ARRAY: {
            if (depth >= kMaxArrayDepth)
                return bad("arrays nested deeper than " + std::to_string(kMaxArrayDepth));
            if (uint32_t(v.elem_type) > uint32_t(ValueType::F64))
                return bad("array element type " + std::to_string(uint32_t(v.elem_type)) + " is not a GGUF value type");
            for (size_t k = 0; k < v.items.size(); ++k) {
                if (v.items[k].type != v.elem_type)
                    return bad("array item " + std::to_string(k) + " has type " +
                               value_type_name(v.items[k].type) + " but the array holds " +
                               value_type_name(v.elem_type));
                Status st = check_value(v.items[k], depth + 1, key);
                if (!st) return st;
            }
            return {};
        }
    }
    return bad("value type " + std::to_string(uint32_t(v.type)) + " is not a GGUF value type");
}

}  // namespace

struct Writer::Out {
    std::FILE* f = nullptr;
    uint64_t written = 0;     // bytes written so far
    uint64_t data_start = 0;  // file offset of the data section
    std::string path;
    std::string error;        // first write error

    bool bytes(const void* p, size_t n) {
        if (!error.empty()) return false;
        if (n && std::fwrite(p, 1, n, f) != n) {
            error = path + ": write failed at offset " + std::to_string(written) + ": " +
                    std::strerror(errno);
            return false;
        }
        written += n;
        return true;
    }
    template <class T>
    bool put(T v) { return bytes(&v, sizeof v); }
    bool string(const std::string& s) { return put(uint64_t(s.size())) && bytes(s.data(), s.size()); }
    bool pad_to(uint64_t alignment) {
        static const uint8_t zeros[256] = {};
        uint64_t n = align_up(written, alignment) - written;
        while (n > 0) {
            size_t chunk = size_t(std::min<uint64_t>(n, sizeof zeros));
            if (!bytes(zeros, chunk)) return false;
            n -= chunk;
        }
        return true;
    }
    // A value's payload (no type tag): arrays write element type, count, items.
    bool value(const Value& v) {
        switch (v.type) {
            case ValueType::U8: return put(uint8_t(v.u));
            case ValueType::I8: return put(int8_t(v.i));
            case ValueType::U16: return put(uint16_t(v.u));
            case ValueType::I16: return put(int16_t(v.i));
            case ValueType::U32: return put(uint32_t(v.u));
            case ValueType::I32: return put(int32_t(v.i));
            case ValueType::U64: return put(uint64_t(v.u));
            case ValueType::I64: return put(int64_t(v.i));
            case ValueType::F32: return put(float(v.f));
            case ValueType::F64: return put(double(v.f));
            case ValueType::BOOL: return put(uint8_t(v.u ? 1 : 0));
            case ValueType::STRING: return string(v.str);
            case ValueType::ARRAY:
                if (!put(uint32_t(v.elem_type)) || !put(uint64_t(v.items.size()))) return false;
                for (const Value& item : v.items)
                    if (!value(item)) return false;
                return true;
        }
        return false;
    }
    Status status() const { return error.empty() ? Status{} : Status(Error{error}); }
};

Writer::Writer(uint32_t alignment) : alignment_(alignment) {}

Writer::~Writer() {
    if (out_ && out_->f) {
        // Never leave a file that looks like GGUF but lacks its data.
        std::fclose(out_->f);
        std::remove(path_.c_str());
    }
}

void Writer::set(std::string key, Value value) {
    for (KeyValue& e : kv_) {
        if (e.key == key) {
            e.value = std::move(value);
            return;
        }
    }
    kv_.push_back({std::move(key), std::move(value)});
}

Status Writer::add_tensor(std::string name, TensorType type, std::vector<int64_t> ne) {
    if (out_) return Error{"tensor '" + name + "': add_tensor after begin()"};
    if (!valid_alignment(alignment_))
        return Error{"alignment " + std::to_string(alignment_) + " is not a nonzero power of two"};
    if (ne.empty() || ne.size() > size_t(kMaxDims))
        return Error{"tensor '" + name + "': " + std::to_string(ne.size()) +
                     " dimensions (must be 1 to " + std::to_string(kMaxDims) + ")"};
    for (const TensorInfo& t : tensors_)
        if (t.name == name) return Error{"tensor '" + name + "': name already declared"};
    TensorInfo t;
    t.name = std::move(name);
    t.n_dims = uint32_t(ne.size());
    for (size_t d = 0; d < ne.size(); ++d) t.ne[d] = ne[d];
    t.type_id = uint32_t(type);
    Result<uint64_t> bytes = tensor_bytes(t.type_id, t.ne, t.n_dims);
    if (!bytes) return Error{"tensor '" + t.name + "': " + bytes.error().message};
    t.n_bytes = *bytes;
    t.n_elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) t.n_elements *= t.ne[d];  // checked by tensor_bytes
    if (!tensors_.empty()) {
        const TensorInfo& prev = tensors_.back();
        uint64_t end = prev.offset + prev.n_bytes;
        if (end < prev.offset || end > std::numeric_limits<uint64_t>::max() - alignment_ ||
            align_up(end, alignment_) > std::numeric_limits<uint64_t>::max() - t.n_bytes)
            return Error{"tensor '" + t.name + "': data section would exceed 2^64 bytes"};
        t.offset = align_up(end, alignment_);
    }
    tensors_.push_back(std::move(t));
    held_data_.emplace_back();
    return {};
}

Status Writer::add_tensor(std::string name, TensorType type, std::vector<int64_t> ne,
                          std::vector<uint8_t> data) {
    Status st = add_tensor(std::move(name), type, std::move(ne));
    if (!st) return st;
    const TensorInfo& t = tensors_.back();
    if (data.size() != t.n_bytes) {
        Error e{"tensor '" + t.name + "': got " + std::to_string(data.size()) +
                " bytes of data, its type and shape need " + std::to_string(t.n_bytes)};
        tensors_.pop_back();
        held_data_.pop_back();
        return e;
    }
    held_data_.back() = std::move(data);
    return {};
}

Status Writer::begin(const std::string& path) {
    if (out_) return Error{path + ": begin() called twice (a Writer writes one file)"};
    if (!valid_alignment(alignment_))
        return Error{path + ": alignment " + std::to_string(alignment_) +
                     " is not a nonzero power of two"};
    // A reader finds the alignment only through this key.
    bool has_alignment_key = false;
    for (const KeyValue& e : kv_) {
        if (e.key != "general.alignment") continue;
        has_alignment_key = true;
        if (e.value.type != ValueType::U32 || e.value.u != alignment_)
            return Error{path + ": key 'general.alignment' is " + e.value.to_display() + " (" +
                         value_type_name(e.value.type) + "), but the writer aligns to u32 " +
                         std::to_string(alignment_)};
    }
    if (!has_alignment_key && alignment_ != kDefaultAlignment)
        set_u32("general.alignment", alignment_);
    for (const KeyValue& e : kv_) {
        Status st = check_value(e.value, 0, e.key);
        if (!st) return Error{path + ": " + st.message()};
    }

    auto out = std::make_unique<Out>();
    out->path = path;
    out->f = std::fopen(path.c_str(), "wb");
    if (!out->f) return Error{path + ": cannot create: " + std::strerror(errno)};
    // Large buffer: metadata is many small writes (vocabularies).
    std::setvbuf(out->f, nullptr, _IOFBF, 1 << 20);
    path_ = path;
    out_ = std::move(out);
    next_tensor_ = 0;

    Out& o = *out_;
    o.bytes("GGUF", 4);
    o.put(kVersion);
    o.put(uint64_t(tensors_.size()));
    o.put(uint64_t(kv_.size()));
    for (const KeyValue& e : kv_) {
        o.string(e.key);
        o.put(uint32_t(e.value.type));
        o.value(e.value);
    }
    for (const TensorInfo& t : tensors_) {
        o.string(t.name);
        o.put(t.n_dims);
        for (uint32_t d = 0; d < t.n_dims; ++d) o.put(uint64_t(t.ne[d]));
        o.put(t.type_id);
        o.put(t.offset);
    }
    o.pad_to(alignment_);
    o.data_start = o.written;
    return write_held();
}

Status Writer::write_held() {
    Out& o = *out_;
    while (next_tensor_ < tensors_.size() && !held_data_[next_tensor_].empty()) {
        std::vector<uint8_t>& data = held_data_[next_tensor_];
        o.bytes(data.data(), data.size());
        o.pad_to(alignment_);
        std::vector<uint8_t>().swap(data);  // written: release the copy
        ++next_tensor_;
    }
    return o.status();
}

Status Writer::write_tensor_data(const void* data, size_t n_bytes) {
    if (!out_ || !out_->f) return Error{"write_tensor_data outside begin() ... finish()"};
    if (next_tensor_ >= tensors_.size())
        return Error{path_ + ": write_tensor_data: all " + std::to_string(tensors_.size()) +
                     " tensors already have their data"};
    const TensorInfo& t = tensors_[next_tensor_];
    if (n_bytes != t.n_bytes)
        return Error{path_ + ": tensor '" + t.name + "': got " + std::to_string(n_bytes) +
                     " bytes of data, expected " + std::to_string(t.n_bytes)};
    Out& o = *out_;
    if (o.written - o.data_start != t.offset)
        return Error{path_ + ": tensor '" + t.name + "': stream at data offset " +
                     std::to_string(o.written - o.data_start) + ", expected " +
                     std::to_string(t.offset)};
    o.bytes(data, n_bytes);
    o.pad_to(alignment_);
    ++next_tensor_;
    return write_held();
}

Status Writer::finish() {
    if (!out_ || !out_->f) return Error{"finish() without an open begin()"};
    if (next_tensor_ < tensors_.size())
        return Error{path_ + ": tensor '" + tensors_[next_tensor_].name + "' (" +
                     std::to_string(next_tensor_ + 1) + " of " + std::to_string(tensors_.size()) +
                     ") has no data yet"};
    Out& o = *out_;
    Status st = o.status();
    if (st && std::fflush(o.f) != 0)
        st = Error{path_ + ": write failed: " + std::strerror(errno)};
    // fclose reports errors the buffered writes deferred (a full disk).
    if (std::fclose(o.f) != 0 && st) st = Error{path_ + ": close failed: " + std::strerror(errno)};
    o.f = nullptr;
    if (!st) std::remove(path_.c_str());
    return st;  // out_ stays, closed, so the Writer cannot begin() again
}

}  // namespace tern::gguf
