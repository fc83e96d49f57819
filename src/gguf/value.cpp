// Metadata values: constructors, exact conversions and the one-line display
// form `tern info` prints.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>

#include "gguf/gguf.h"

namespace tern::gguf {

const char* value_type_name(ValueType t) {
    switch (t) {
        case ValueType::U8: return "u8";
        case ValueType::I8: return "i8";
        case ValueType::U16: return "u16";
        case ValueType::I16: return "i16";
        case ValueType::U32: return "u32";
        case ValueType::I32: return "i32";
        case ValueType::F32: return "f32";
        case ValueType::BOOL: return "bool";
        case ValueType::STRING: return "string";
        case ValueType::ARRAY: return "array";
        case ValueType::U64: return "u64";
        case ValueType::I64: return "i64";
        case ValueType::F64: return "f64";
    }
    return "unknown";
}

namespace {

Value unsigned_value(ValueType t, uint64_t v) {
    Value out;
    out.type = t;
    out.u = v;
    return out;
}

Value signed_value(ValueType t, int64_t v) {
    Value out;
    out.type = t;
    out.i = v;
    return out;
}

Value float_value(ValueType t, double v) {
    Value out;
    out.type = t;
    out.f = v;
    return out;
}

bool is_unsigned(ValueType t) {
    return t == ValueType::U8 || t == ValueType::U16 || t == ValueType::U32 || t == ValueType::U64;
}

bool is_signed(ValueType t) {
    return t == ValueType::I8 || t == ValueType::I16 || t == ValueType::I32 || t == ValueType::I64;
}

// 2^63 as a double: the first value outside int64's range.
constexpr double kTwo63 = 9223372036854775808.0;

void append_escaped(std::string& out, const std::string& s, size_t max_bytes) {
    size_t n = s.size();
    if (n > max_bytes) {
        n = max_bytes;
        // Do not cut a UTF-8 sequence in half.
        while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
    }
    out += '"';
    for (size_t k = 0; k < n; ++k) {
        unsigned char c = static_cast<unsigned char>(s[k]);
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            default:
                if (c < 0x20 || c == 0x7f) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\x%02x", c);
                    out += buf;
                } else {
                    out += char(c);
                }
        }
    }
    out += '"';
    if (n < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
}

template <class T>
void append_shortest(std::string& out, T v) {
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    out.append(buf, r.ptr);
}

void append_display(std::string& out, const Value& v, size_t max_items) {
    switch (v.type) {
        case ValueType::U8: case ValueType::U16: case ValueType::U32: case ValueType::U64:
            out += std::to_string(v.u);
            return;
        case ValueType::I8: case ValueType::I16: case ValueType::I32: case ValueType::I64:
            out += std::to_string(v.i);
            return;
        case ValueType::F32:
            append_shortest(out, static_cast<float>(v.f));
            return;
        case ValueType::F64:
            append_shortest(out, v.f);
            return;
        case ValueType::BOOL:
            out += v.u ? "true" : "false";
            return;
        case ValueType::STRING:
            append_escaped(out, v.str, 160);
            return;
        case ValueType::ARRAY: {
            out += '[';
            size_t shown = std::min(max_items, v.items.size());
            for (size_t k = 0; k < shown; ++k) {
                if (k) out += ", ";
                append_display(out, v.items[k], max_items);
            }
            if (shown < v.items.size()) out += shown ? ", ..." : "...";
            out += ']';
            if (shown < v.items.size())
                out += " (" + std::to_string(v.items.size()) + " " +
                       value_type_name(v.elem_type) + ")";
            return;
        }
    }
    out += "?";
}

}  // namespace

Value Value::of_u8(uint8_t v) { return unsigned_value(ValueType::U8, v); }
Value Value::of_u16(uint16_t v) { return unsigned_value(ValueType::U16, v); }
Value Value::of_u32(uint32_t v) { return unsigned_value(ValueType::U32, v); }
Value Value::of_u64(uint64_t v) { return unsigned_value(ValueType::U64, v); }
Value Value::of_bool(bool v) { return unsigned_value(ValueType::BOOL, v ? 1 : 0); }
Value Value::of_i8(int8_t v) { return signed_value(ValueType::I8, v); }
Value Value::of_i16(int16_t v) { return signed_value(ValueType::I16, v); }
Value Value::of_i32(int32_t v) { return signed_value(ValueType::I32, v); }
Value Value::of_i64(int64_t v) { return signed_value(ValueType::I64, v); }
Value Value::of_f32(float v) { return float_value(ValueType::F32, v); }
Value Value::of_f64(double v) { return float_value(ValueType::F64, v); }

Value Value::of_string(std::string v) {
    Value out;
    out.type = ValueType::STRING;
    out.str = std::move(v);
    return out;
}

Value Value::of_array(ValueType elem, std::vector<Value> items) {
    Value out;
    out.type = ValueType::ARRAY;
    out.elem_type = elem;
    out.items = std::move(items);
    return out;
}

Value Value::of_strings(const std::vector<std::string>& v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (const std::string& s : v) items.push_back(of_string(s));
    return of_array(ValueType::STRING, std::move(items));
}

Value Value::of_f32s(const std::vector<float>& v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (float x : v) items.push_back(of_f32(x));
    return of_array(ValueType::F32, std::move(items));
}

Value Value::of_i32s(const std::vector<int32_t>& v) {
    std::vector<Value> items;
    items.reserve(v.size());
    for (int32_t x : v) items.push_back(of_i32(x));
    return of_array(ValueType::I32, std::move(items));
}

bool Value::is_integer() const { return is_unsigned(type) || is_signed(type); }

bool Value::is_float() const { return type == ValueType::F32 || type == ValueType::F64; }

std::optional<int64_t> Value::as_int() const {
    if (is_signed(type)) return i;
    if (is_unsigned(type)) {
        if (u > uint64_t(std::numeric_limits<int64_t>::max())) return std::nullopt;
        return int64_t(u);
    }
    if (is_float()) {
        // A float converts only when it names an integer exactly.
        if (!std::isfinite(f) || f != std::trunc(f) || f < -kTwo63 || f >= kTwo63)
            return std::nullopt;
        return int64_t(f);
    }
    return std::nullopt;
}

std::optional<uint64_t> Value::as_uint() const {
    if (is_unsigned(type)) return u;
    if (is_signed(type)) {
        if (i < 0) return std::nullopt;
        return uint64_t(i);
    }
    if (is_float()) {
        if (!std::isfinite(f) || f != std::trunc(f) || f < 0 || f >= 2 * kTwo63)
            return std::nullopt;
        return uint64_t(f);
    }
    return std::nullopt;
}

std::optional<double> Value::as_double() const {
    if (is_float()) return f;
    if (is_signed(type)) {
        double d = double(i);
        // Round-trip check; d == 2^63 cannot come from an int64 but guard the cast.
        if (d >= kTwo63 || int64_t(d) != i) return std::nullopt;
        return d;
    }
    if (is_unsigned(type)) {
        double d = double(u);
        if (d >= 2 * kTwo63 || uint64_t(d) != u) return std::nullopt;
        return d;
    }
    return std::nullopt;
}

std::optional<bool> Value::as_bool() const {
    if (type == ValueType::BOOL) return u != 0;
    if (is_integer()) {
        auto v = as_int();
        if (v && (*v == 0 || *v == 1)) return *v == 1;
    }
    return std::nullopt;
}

const std::string* Value::as_string() const {
    return type == ValueType::STRING ? &str : nullptr;
}

std::string Value::to_display(size_t max_items) const {
    std::string out;
    append_display(out, *this, max_items);
    return out;
}

}  // namespace tern::gguf
