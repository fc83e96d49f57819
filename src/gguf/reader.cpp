// The GGUF reader. A file (or memory image) is walked once with a cursor that
// checks every read against the bytes that remain, so each count, length,
// dimension, type id and offset is validated before it sizes an allocation or
// a pointer. Errors name the file, the field and its offset. Split models
// (NAME-00001-of-0000N.gguf) are opened as one File.
#include <bit>
#include <cstdio>
#include <cstring>
#include <map>

#include "gguf/gguf.h"
#include "gguf/mmap.h"

namespace tern::gguf {

static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kDefaultAlignment = 32;
// Nested arrays recurse; this bounds the stack a hostile file can make us use.
constexpr uint32_t kMaxArrayDepth = 64;
// Smallest possible encodings, used to reject counts that cannot fit in the
// bytes that remain before anything is allocated for them.
constexpr uint64_t kMinKvBytes = 8 + 4;  // key length + value type (a value adds more)
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;  // name length, n_dims, type, offset
// A metadata value takes as little as one byte of file but ~100 bytes as a
// Value, and a tensor info ~24 bytes of file but a few hundred in memory. These
// bounds keep a hostile file from turning into gigabytes of allocations; real
// models hold about a million values (vocabulary arrays) and a few thousand
// tensors.
constexpr uint64_t kMaxMetadataValues = uint64_t(1) << 23;
constexpr uint64_t kMaxTensors = uint64_t(1) << 20;
// Initial reservations; vectors grow past these as parsing proves the count.
constexpr uint64_t kReserveHint = 1024;

std::string num(uint64_t v) { return std::to_string(v); }

// Names from the file may hold any bytes; keep messages printable and short.
std::string printable(std::string_view s) {
    std::string out;
    const size_t limit = 96;
    for (size_t k = 0; k < s.size() && k < limit; ++k) {
        unsigned char c = static_cast<unsigned char>(s[k]);
        if (c >= 0x20 && c < 0x7f && c != '\'' && c != '\\') {
            out += char(c);
        } else {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02x", c);
            out += buf;
        }
    }
    if (s.size() > limit) out += "...";
    return out;
}

bool known_value_type(uint32_t t) { return t <= uint32_t(ValueType::F64); }

// Bytes a scalar of this type takes; 0 for STRING and ARRAY.
uint64_t scalar_size(ValueType t) {
    switch (t) {
        case ValueType::U8: case ValueType::I8: case ValueType::BOOL: return 1;
        case ValueType::U16: case ValueType::I16: return 2;
        case ValueType::U32: case ValueType::I32: case ValueType::F32: return 4;
        case ValueType::U64: case ValueType::I64: case ValueType::F64: return 8;
        case ValueType::STRING: case ValueType::ARRAY: return 0;
    }
    return 0;
}

// The least number of bytes one element of this type can occupy.
uint64_t min_encoded_size(ValueType t) {
    if (t == ValueType::STRING) return 8;       // length
    if (t == ValueType::ARRAY) return 4 + 8;    // element type + count
    return scalar_size(t);
}

// "NAME-00002-of-00005.gguf" -> {"NAME", 2, 5}.
struct SplitName {
    std::string prefix;
    uint32_t index = 0;
    uint32_t count = 0;
};

std::optional<SplitName> parse_split_name(const std::string& path) {
    static constexpr std::string_view kPattern = "-#####-of-#####.gguf";
    if (path.size() <= kPattern.size()) return std::nullopt;
    const size_t start = path.size() - kPattern.size();
    uint32_t numbers[2] = {0, 0};
    int which = -1;
    for (size_t k = 0; k < kPattern.size(); ++k) {
        const char c = path[start + k];
        if (kPattern[k] == '#') {
            if (c < '0' || c > '9') return std::nullopt;
            if (k == 0 || kPattern[k - 1] != '#') ++which;
            numbers[which] = numbers[which] * 10 + uint32_t(c - '0');
        } else if (c != kPattern[k]) {
            return std::nullopt;
        }
    }
    if (numbers[0] < 1 || numbers[1] < 1 || numbers[0] > numbers[1]) return std::nullopt;
    return SplitName{path.substr(0, start), numbers[0], numbers[1]};
}

std::string split_path(const std::string& prefix, uint32_t index, uint32_t count) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "-%05u-of-%05u.gguf", index, count);
    return prefix + buf;
}

}  // namespace

struct File::Split {
    std::string path;
    MappedFile map;  // empty when parsing a caller's buffer
    const uint8_t* data = nullptr;
    uint64_t size = 0;
    uint32_t version = 0;
    uint32_t alignment = kDefaultAlignment;
    uint64_t data_offset = 0;  // where tensor data starts
};

// Walks one GGUF image. Each read checks the remaining bytes first; on any
// failure `err` holds the full message and the walk stops.
struct Parser {
    const uint8_t* base = nullptr;
    uint64_t size = 0;
    uint64_t pos = 0;
    std::string name;   // file name for messages
    std::string where;  // what is being read, e.g. "key 'a.b' (kv 3 at offset 24)"
    std::string err;

    uint32_t version = 0;
    uint32_t alignment = kDefaultAlignment;
    uint64_t data_offset = 0;
    std::vector<KeyValue> kv;
    std::vector<uint64_t> kv_offsets;
    std::vector<TensorInfo> tensors;
    std::vector<uint64_t> tensor_offsets;  // where each tensor info starts
    uint64_t n_values = 0;                 // metadata values so far, array items included

    uint64_t remaining() const { return size - pos; }

    bool fail(const std::string& what) {
        err = name + ": " + (where.empty() ? "" : where + ": ") + what;
        return false;
    }

    bool need(uint64_t n, const char* field) {
        if (n <= remaining()) return true;
        return fail(std::string("truncated: ") + field + " at offset " + num(pos) + " needs " +
                    num(n) + " bytes, only " + num(remaining()) + " remain (file size " +
                    num(size) + ")");
    }

    template <class T>
    bool read(T& out, const char* field) {
        if (!need(sizeof(T), field)) return false;
        std::memcpy(&out, base + pos, sizeof(T));
        pos += sizeof(T);
        return true;
    }

    // A string's bytes, left in place.
    bool read_string_view(std::string_view& out, const char* field) {
        const uint64_t at = pos;
        uint64_t len = 0;
        if (!read(len, field)) return false;
        if (len > remaining())
            return fail(std::string(field) + " length " + num(len) + " at offset " + num(at) +
                        " exceeds the " + num(remaining()) + " bytes remaining (file size " +
                        num(size) + ")");
        out = std::string_view(reinterpret_cast<const char*>(base + pos), size_t(len));
        pos += len;
        return true;
    }

    bool read_value(ValueType type, Value& out, uint32_t depth);
    bool read_array(Value& out, uint32_t depth);
    bool parse_header(uint64_t& tensor_count, uint64_t& kv_count);
    bool parse_metadata(uint64_t kv_count);
    bool apply_alignment();
    bool parse_tensor_infos(uint64_t tensor_count);
    bool check_data_ranges();
    bool run();

    static Result<std::unique_ptr<File>> parse_memory(const uint8_t* data, size_t size,
                                                      std::string name);
    static Result<std::unique_ptr<File>> open_path(const std::string& path);
    static Status parse_split(File::Split& split, std::vector<KeyValue>& kv_out,
                              std::vector<TensorInfo>& tensors_out,
                              std::vector<uint64_t>& info_offsets_out);
};

bool Parser::read_value(ValueType type, Value& out, uint32_t depth) {
    out.type = type;
    const uint64_t at = pos;
    switch (type) {
        case ValueType::U8: { uint8_t v; if (!read(v, "u8 value")) return false; out.u = v; return true; }
        case ValueType::I8: { int8_t v; if (!read(v, "i8 value")) return false; out.i = v; return true; }
        case ValueType::U16: { uint16_t v; if (!read(v, "u16 value")) return false; out.u = v; return true; }
        case ValueType::I16: { int16_t v; if (!read(v, "i16 value")) return false; out.i = v; return true; }
        case ValueType::U32: { uint32_t v; if (!read(v, "u32 value")) return false; out.u = v; return true; }
        case ValueType::I32: { int32_t v; if (!read(v, "i32 value")) return false; out.i = v; return true; }
        case ValueType::U64: { uint64_t v; if (!read(v, "u64 value")) return false; out.u = v; return true; }
        case ValueType::I64: { int64_t v; if (!read(v, "i64 value")) return false; out.i = v; return true; }
        case ValueType::F32: { float v; if (!read(v, "f32 value")) return false; out.f = v; return true; }
        case ValueType::F64: { double v; if (!read(v, "f64 value")) return false; out.f = v; return true; }
        case ValueType::BOOL: {
            uint8_t v;
            if (!read(v, "bool value")) return false;
            if (v > 1)
                return fail("bool value " + num(v) + " at offset " + num(at) + " is neither 0 nor 1");
            out.u = v;
            return true;
        }
        case ValueType::STRING: {
            std::string_view s;
            if (!read_string_view(s, "string value")) return false;
            out.str.assign(s);
            return true;
        }
        case ValueType::ARRAY:
            return read_array(out, depth + 1);
    }
    return fail("value type " + num(uint32_t(type)) + " at offset " + num(at) +
                " is not a GGUF value type");
}

bool Parser::read_array(Value& out, uint32_t depth) {
    if (depth > kMaxArrayDepth)
        return fail("arrays nested deeper than " + num(kMaxArrayDepth) + " at offset " + num(pos));
    const uint64_t type_at = pos;
    uint32_t elem = 0;
    if (!read(elem, "array element type")) return false;
    if (!known_value_type(elem))
        return fail("array element type " + num(elem) + " at offset " + num(type_at) +
                    " is not a GGUF value type");
    const ValueType elem_type = ValueType(elem);
    const uint64_t count_at = pos;
    uint64_t count = 0;
    if (!read(count, "array length")) return false;
    // Every element takes at least min_encoded_size bytes of file, so a count
    // that passes this check cannot make the reserve below outgrow the file.
    const uint64_t min_size = min_encoded_size(elem_type);
    if (count > remaining() / min_size)
        return fail("array length " + num(count) + " at offset " + num(count_at) + " of " +
                    value_type_name(elem_type) + " cannot fit in the " + num(remaining()) +
                    " bytes remaining (file size " + num(size) + ")");
    if (count > kMaxMetadataValues - n_values)
        return fail("array length " + num(count) + " at offset " + num(count_at) +
                    " takes the metadata past " + num(kMaxMetadataValues) + " values");
    n_values += count;
    out.type = ValueType::ARRAY;
    out.elem_type = elem_type;
    out.items.clear();
    out.items.resize(size_t(count));
    for (Value& item : out.items)
        if (!read_value(elem_type, item, depth)) return false;
    return true;
}

bool Parser::parse_header(uint64_t& tensor_count, uint64_t& kv_count) {
    where = "header";
    if (!need(4, "magic")) return false;
    if (std::memcmp(base, "GGUF", 4) != 0) {
        std::string seen;
        for (int k = 0; k < 4; ++k) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "%s%02x", k ? " " : "", base[k]);
            seen += buf;
        }
        return fail("bad magic " + seen + " at offset 0 (expected 47 47 55 46, \"GGUF\"); not a GGUF file");
    }
    pos = 4;
    if (!read(version, "version")) return false;
    if (version == 1)
        return fail("unsupported version 1 at offset 4 (GGUF v1 is obsolete; "
                    "convert the file to version 3)");
    if (version != 2 && version != 3) {
        const uint32_t swapped = __builtin_bswap32(version);
        if (swapped >= 1 && swapped <= 3)
            return fail("version at offset 4 reads as " + num(swapped) +
                        " only in big-endian byte order: big-endian GGUF files are not supported");
        return fail("unsupported version " + num(version) + " at offset 4 (supported: 2, 3)");
    }
    const uint64_t tensor_count_at = pos;
    if (!read(tensor_count, "tensor_count")) return false;
    const uint64_t kv_count_at = pos;
    if (!read(kv_count, "kv_count")) return false;
    if (kv_count > remaining() / kMinKvBytes)
        return fail("kv_count " + num(kv_count) + " at offset " + num(kv_count_at) +
                    " cannot fit in the " + num(remaining()) + " bytes remaining (file size " +
                    num(size) + ")");
    if (kv_count > kMaxMetadataValues)
        return fail("kv_count " + num(kv_count) + " at offset " + num(kv_count_at) +
                    " exceeds the limit of " + num(kMaxMetadataValues) + " metadata values");
    if (tensor_count > remaining() / kMinTensorInfoBytes)
        return fail("tensor_count " + num(tensor_count) + " at offset " + num(tensor_count_at) +
                    " cannot fit in the " + num(remaining()) + " bytes remaining (file size " +
                    num(size) + ")");
    if (tensor_count > kMaxTensors)
        return fail("tensor_count " + num(tensor_count) + " at offset " + num(tensor_count_at) +
                    " exceeds the limit of " + num(kMaxTensors) + " tensors");
    return true;
}

bool Parser::parse_metadata(uint64_t kv_count) {
    kv.reserve(size_t(std::min(kv_count, kReserveHint)));
    kv_offsets.reserve(size_t(std::min(kv_count, kReserveHint)));
    n_values = kv_count;
    // Keys are compared as views into the image, which outlives the walk. An
    // ordered map: a file cannot pick keys that all collide, as with a hash.
    std::map<std::string_view, uint64_t> seen;
    for (uint64_t n = 0; n < kv_count; ++n) {
        const uint64_t at = pos;
        where = "kv " + num(n) + " (at offset " + num(at) + ")";
        std::string_view key;
        if (!read_string_view(key, "key")) return false;
        where = "key '" + printable(key) + "' (kv " + num(n) + " at offset " + num(at) + ")";
        auto [it, inserted] = seen.emplace(key, at);
        if (!inserted) return fail("duplicate key (first at offset " + num(it->second) + ")");
        const uint64_t type_at = pos;
        uint32_t type = 0;
        if (!read(type, "value type")) return false;
        if (!known_value_type(type))
            return fail("value type " + num(type) + " at offset " + num(type_at) +
                        " is not a GGUF value type");
        KeyValue entry;
        entry.key.assign(key);
        if (!read_value(ValueType(type), entry.value, 0)) return false;
        kv.push_back(std::move(entry));
        kv_offsets.push_back(at);
    }
    where.clear();
    return true;
}

bool Parser::apply_alignment() {
    for (size_t k = 0; k < kv.size(); ++k) {
        if (kv[k].key != "general.alignment") continue;
        where = "key 'general.alignment' (kv " + num(k) + " at offset " + num(kv_offsets[k]) + ")";
        const Value& v = kv[k].value;
        if (v.type != ValueType::U32)
            return fail(std::string("has type ") + value_type_name(v.type) + ", expected u32");
        if (v.u == 0 || !std::has_single_bit(v.u))
            return fail("alignment " + num(v.u) + " is not a nonzero power of two");
        alignment = uint32_t(v.u);
        where.clear();
    }
    return true;
}

bool Parser::parse_tensor_infos(uint64_t tensor_count) {
    // The header check bounded tensor_count by the bytes after it; bound the
    // reserve again by what the metadata left.
    tensors.reserve(size_t(std::min(tensor_count, remaining() / kMinTensorInfoBytes)));
    tensor_offsets.reserve(tensors.capacity());
    std::map<std::string_view, uint64_t> seen;
    for (uint64_t n = 0; n < tensor_count; ++n) {
        const uint64_t at = pos;
        where = "tensor info " + num(n) + " (at offset " + num(at) + ")";
        std::string_view tname;
        if (!read_string_view(tname, "tensor name")) return false;
        where = "tensor '" + printable(tname) + "' (tensor info at offset " + num(at) + ")";
        auto [it, inserted] = seen.emplace(tname, at);
        if (!inserted)
            return fail("duplicate tensor name (first at offset " + num(it->second) + ")");
        TensorInfo t;
        t.name.assign(tname);
        const uint64_t n_dims_at = pos;
        if (!read(t.n_dims, "n_dims")) return false;
        if (t.n_dims > uint32_t(kMaxDims))
            return fail("n_dims " + num(t.n_dims) + " at offset " + num(n_dims_at) + " exceeds " +
                        num(kMaxDims));
        for (uint32_t d = 0; d < t.n_dims; ++d) {
            const uint64_t dim_at = pos;
            uint64_t dim = 0;
            if (!read(dim, "dimension")) return false;
            if (dim == 0)
                return fail("dimension " + num(d) + " at offset " + num(dim_at) + " is 0");
            if (dim > uint64_t(INT64_MAX))
                return fail("dimension " + num(d) + " at offset " + num(dim_at) + " is " +
                            std::to_string(int64_t(dim)) + " (negative as int64)");
            t.ne[d] = int64_t(dim);
        }
        const uint64_t type_at = pos;
        if (!read(t.type_id, "tensor type")) return false;
        if (!tensor_type_info(t.type_id))
            return fail("unknown tensor type id " + num(t.type_id) + " at offset " + num(type_at));
        const uint64_t offset_at = pos;
        if (!read(t.offset, "data offset")) return false;
        if (t.offset % alignment != 0)
            return fail("data offset " + num(t.offset) + " at offset " + num(offset_at) +
                        " is not a multiple of the alignment " + num(alignment));
        int64_t n_elements = 1;
        for (uint32_t d = 0; d < t.n_dims; ++d)
            if (__builtin_mul_overflow(n_elements, t.ne[d], &n_elements))
                return fail("shape " + t.shape_string() + " has more elements than int64 holds");
        t.n_elements = n_elements;
        Result<uint64_t> bytes = tensor_bytes(t.type_id, t.ne, t.n_dims);
        if (!bytes)
            return fail("shape " + t.shape_string() + " of type " + tensor_type_name(t.type_id) +
                        ": " + bytes.error().message);
        t.n_bytes = *bytes;
        tensors.push_back(std::move(t));
        tensor_offsets.push_back(at);
    }
    where.clear();
    return true;
}

bool Parser::check_data_ranges() {
    // pos <= size, so this cannot wrap.
    data_offset = (pos + alignment - 1) / alignment * alignment;
    for (size_t k = 0; k < tensors.size(); ++k) {
        const TensorInfo& t = tensors[k];
        where = "tensor '" + printable(t.name) + "' (tensor info at offset " +
                num(tensor_offsets[k]) + ")";
        uint64_t start = 0, end = 0;
        if (__builtin_add_overflow(data_offset, t.offset, &start) ||
            __builtin_add_overflow(start, t.n_bytes, &end))
            return fail("data offset " + num(t.offset) + " + size " + num(t.n_bytes) +
                        " lies beyond the end of the file (size " + num(size) + ")");
        if (end > size)
            return fail("data [" + num(start) + ", " + num(end) +
                        ") extends past end of file (size " + num(size) + ")");
        tensors[k].data = base + start;
    }
    where.clear();
    return true;
}

bool Parser::run() {
    uint64_t tensor_count = 0, kv_count = 0;
    return parse_header(tensor_count, kv_count) && parse_metadata(kv_count) &&
           apply_alignment() && parse_tensor_infos(tensor_count) && check_data_ranges();
}

Status Parser::parse_split(File::Split& split, std::vector<KeyValue>& kv_out,
                           std::vector<TensorInfo>& tensors_out,
                           std::vector<uint64_t>& info_offsets_out) {
    Parser p;
    p.base = split.data;
    p.size = split.size;
    p.name = split.path;
    if (!p.run()) return Error{p.err};
    split.version = p.version;
    split.alignment = p.alignment;
    split.data_offset = p.data_offset;
    kv_out = std::move(p.kv);
    tensors_out = std::move(p.tensors);
    info_offsets_out = std::move(p.tensor_offsets);
    return {};
}

Result<std::unique_ptr<File>> Parser::parse_memory(const uint8_t* data, size_t size,
                                                   std::string name) {
    std::unique_ptr<File> file(new File());
    auto split = std::make_unique<File::Split>();
    split->path = name;
    split->data = data;
    split->size = size;
    std::vector<uint64_t> info_offsets;
    Status st = parse_split(*split, file->kv_, file->tensors_, info_offsets);
    if (!st) return Error{st.message()};
    file->path_ = std::move(name);
    file->version_ = split->version;
    file->alignment_ = split->alignment;
    file->total_size_ = size;
    for (size_t k = 0; k < file->tensors_.size(); ++k)
        file->tensor_index_.emplace(file->tensors_[k].name, k);
    file->splits_.push_back(std::move(split));
    return file;
}

namespace {

const Value* find_key(const std::vector<KeyValue>& kv, std::string_view key) {
    for (const KeyValue& e : kv)
        if (e.key == key) return &e.value;
    return nullptr;
}

// Checks `split.no` and `split.count` of one split against its place.
Status check_split_keys(const std::string& path, const std::vector<KeyValue>& kv,
                        uint32_t index0, uint32_t count) {
    if (const Value* v = find_key(kv, "split.no")) {
        auto no = v->as_int();
        if (!no || *no != int64_t(index0))
            return Error{path + ": key 'split.no' is " + v->to_display() + ", expected " +
                         num(index0) + " for split " + num(index0 + 1) + " of " + num(count)};
    }
    if (const Value* v = find_key(kv, "split.count")) {
        auto n = v->as_int();
        if (!n || *n != int64_t(count)) {
            if (count == 1 && n && *n > 1)
                return Error{path + ": key 'split.count' is " + v->to_display() +
                             ": this file is one part of a split model; open its first part, "
                             "named NAME-00001-of-NNNNN.gguf"};
            return Error{path + ": key 'split.count' is " + v->to_display() + ", expected " +
                         num(count)};
        }
    }
    return {};
}

}  // namespace

Result<std::unique_ptr<File>> Parser::open_path(const std::string& path) {
    std::optional<SplitName> split_name = parse_split_name(path);
    const uint32_t count = split_name ? split_name->count : 1;
    std::unique_ptr<File> file(new File());
    file->path_ = path;
    for (uint32_t k = 0; k < count; ++k) {
        auto split = std::make_unique<File::Split>();
        split->path = split_name ? split_path(split_name->prefix, k + 1, count) : path;
        Result<MappedFile> map = MappedFile::open(split->path);
        if (!map) return Error{map.error().message};
        split->map = std::move(*map);
        split->data = split->map.data();
        split->size = split->map.size();
        std::vector<KeyValue> kv;
        std::vector<TensorInfo> tensors;
        std::vector<uint64_t> info_offsets;
        Status st = parse_split(*split, kv, tensors, info_offsets);
        if (!st) return Error{st.message()};
        st = check_split_keys(split->path, kv, k, count);
        if (!st) return Error{st.message()};
        for (size_t t = 0; t < tensors.size(); ++t) {
            tensors[t].split = k;
            auto [it, inserted] = file->tensor_index_.emplace(tensors[t].name, file->tensors_.size());
            if (!inserted)
                return Error{split->path + ": tensor '" + printable(tensors[t].name) +
                             "' (tensor info at offset " + num(info_offsets[t]) +
                             "): duplicate of the tensor in " +
                             file->splits_[file->tensors_[it->second].split]->path};
            file->tensors_.push_back(std::move(tensors[t]));
        }
        file->total_size_ += split->size;
        if (k == 0) {
            // The model's metadata is the first split's.
            file->kv_ = std::move(kv);
            file->version_ = split->version;
            file->alignment_ = split->alignment;
        }
        file->splits_.push_back(std::move(split));
    }
    if (const Value* v = find_key(file->kv_, "split.tensors.count")) {
        auto n = v->as_int();
        if (!n || *n != int64_t(file->tensors_.size()))
            return Error{file->splits_[0]->path + ": key 'split.tensors.count' is " +
                         v->to_display() + ", but the " + num(count) + " split(s) hold " +
                         num(file->tensors_.size()) + " tensors"};
    }
    return file;
}

File::~File() = default;

Result<std::unique_ptr<File>> File::open(const std::string& path) {
    return Parser::open_path(path);
}

Result<std::unique_ptr<File>> File::parse(const uint8_t* data, size_t size, std::string name) {
    return Parser::parse_memory(data, size, std::move(name));
}

const Value* File::find(std::string_view key) const { return find_key(kv_, key); }

std::optional<int64_t> File::get_int(std::string_view key) const {
    const Value* v = find(key);
    return v ? v->as_int() : std::nullopt;
}

std::optional<double> File::get_float(std::string_view key) const {
    const Value* v = find(key);
    return v ? v->as_double() : std::nullopt;
}

std::optional<bool> File::get_bool(std::string_view key) const {
    const Value* v = find(key);
    return v ? v->as_bool() : std::nullopt;
}

std::optional<std::string> File::get_string(std::string_view key) const {
    const Value* v = find(key);
    if (!v || !v->as_string()) return std::nullopt;
    return *v->as_string();
}

void File::release_pages(const void* p, size_t n) const {
    for (const auto& split : splits_) split->map.release_pages(p, n);
}

const TensorInfo* File::find_tensor(std::string_view name) const {
    auto it = tensor_index_.find(name);
    return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

}  // namespace tern::gguf
