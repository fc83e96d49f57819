// Python semantics of template values: see jinja_value.h.
#include "text/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "text/utf8.h"

namespace tern::text::jinja {

const Value* Dict::find(std::string_view key) const {
    for (const auto& [k, v] : items)
        if (k == key) return &v;
    return nullptr;
}
Value* Dict::find(std::string_view key) {
    for (auto& [k, v] : items)
        if (k == key) return &v;
    return nullptr;
}
void Dict::set(std::string key, Value v) {
    if (Value* old = find(key)) {
        *old = std::move(v);
        return;
    }
    items.emplace_back(std::move(key), std::move(v));
}

Value Value::none() {
    Value v;
    v.kind_ = Kind::None;
    return v;
}
Value::Value(bool b) : kind_(Kind::Bool) { b_ = b; }
Value::Value(int64_t v) : kind_(Kind::Int) { i_ = v; }
Value::Value(double v) : kind_(Kind::Float) { f_ = v; }
Value::Value(std::string s) : kind_(Kind::String), p_(std::make_shared<const std::string>(std::move(s))) {}
Value::Value(List l) : kind_(Kind::List), p_(std::make_shared<const List>(std::move(l))) {}
Value::Value(Dict d) : kind_(Kind::Dict), p_(std::make_shared<Dict>(std::move(d))) {}

Value Value::tuple(List l) {
    Value v(std::move(l));
    v.tuple_ = true;
    return v;
}

Value Value::function(std::string name, Function f) {
    Value v;
    v.kind_ = Kind::Function;
    v.p_ = std::make_shared<const Named>(Named{std::move(name), std::move(f)});
    return v;
}

Value Value::namespace_of(Dict d) {
    Value v(std::move(d));
    v.namespace_ = true;
    return v;
}

bool Value::truthy() const {
    switch (kind_) {
        case Kind::Undefined: case Kind::None: return false;
        case Kind::Bool: return b_;
        case Kind::Int: return i_ != 0;
        case Kind::Float: return f_ != 0.0;
        case Kind::String: return !as_string().empty();
        case Kind::List: return !as_list().empty();
        case Kind::Dict: return !as_dict().items.empty();
        case Kind::Function: return true;
    }
    return false;
}

std::string float_repr(double v) {
    if (std::isnan(v)) return "nan";
    if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
    if (v == 0.0) return std::signbit(v) ? "-0.0" : "0.0";
    // The shortest round-trip digits, then Python's layout of them.
    char buf[64];
    auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
    std::string sci(buf, r.ptr);  // d[.ddd]e[+-]XX
    const size_t e = sci.find('e');
    const int exp = std::atoi(sci.c_str() + e + 1);
    std::string mant = sci.substr(0, e);
    const bool neg = mant[0] == '-';
    if (neg) mant.erase(0, 1);
    std::string digits;
    for (char c : mant)
        if (c != '.') digits += c;
    std::string out = neg ? "-" : "";
    if (exp < -4 || exp >= 16) {
        out += digits.substr(0, 1);
        if (digits.size() > 1) out += "." + digits.substr(1);
        char eb[16];
        std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
        return out + eb;
    }
    if (exp < 0) return out + "0." + std::string(size_t(-exp - 1), '0') + digits;
    const size_t int_len = size_t(exp) + 1;
    if (digits.size() <= int_len) return out + digits + std::string(int_len - digits.size(), '0') + ".0";
    return out + digits.substr(0, int_len) + "." + digits.substr(int_len);
}

namespace {

// repr() and to_json() of values that share a large string many times over
// could ask for terabytes; they stop at this many bytes instead.
constexpr size_t kTextLimit = size_t(1) << 26;
void check_text(const std::string& out) {
    if (out.size() > kTextLimit)
        throw std::length_error("a value's text would pass " + std::to_string(kTextLimit) + " bytes");
}

// Python's repr of a str: single quotes unless the text holds a single quote
// and no double quote; backslash escapes for the quote, backslash and
// control characters; other characters as they are.
std::string string_repr(const std::string& s) {
    const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
    const char q = dq ? '"' : '\'';
    std::string out(1, q);
    for (unsigned char c : s) {
        if (c == q || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c == '\n') out += "\\n";
        else if (c == '\r') out += "\\r";
        else if (c == '\t') out += "\\t";
        else if (c < 0x20 || c == 0x7f) {
            char b[8];
            std::snprintf(b, sizeof b, "\\x%02x", c);
            out += b;
        } else out += char(c);
    }
    return out + q;
}

void json_string(std::string& out, const std::string& s) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    char b[8];
                    std::snprintf(b, sizeof b, "\\u%04x", c);
                    out += b;
                } else {
                    out += char(c);
                }
        }
    }
    out += '"';
}

bool json_into(std::string& out, const Value& v, int indent, bool sort_keys, int depth) {
    const auto newline = [&](int d) {
        out += '\n';
        out.append(size_t(indent) * size_t(d), ' ');
    };
    switch (v.kind()) {
        case Value::Kind::Undefined: case Value::Kind::Function: return false;
        case Value::Kind::None: out += "null"; return true;
        case Value::Kind::Bool: out += v.as_bool() ? "true" : "false"; return true;
        case Value::Kind::Int: out += std::to_string(v.as_int()); return true;
        case Value::Kind::Float: {
            const double f = v.as_float();
            out += std::isnan(f) ? "NaN" : std::isinf(f) ? (f > 0 ? "Infinity" : "-Infinity") : float_repr(f);
            return true;
        }
        case Value::Kind::String: json_string(out, v.as_string()); return true;
        case Value::Kind::List: {
            const List& l = v.as_list();
            if (l.empty()) {
                out += "[]";
                return true;
            }
            out += '[';
            for (size_t i = 0; i < l.size(); ++i) {
                if (i) out += indent >= 0 ? "," : ", ";
                if (indent >= 0) newline(depth + 1);
                if (!json_into(out, l[i], indent, sort_keys, depth + 1)) return false;
                check_text(out);
            }
            if (indent >= 0) newline(depth);
            out += ']';
            return true;
        }
        case Value::Kind::Dict: {
            std::vector<const std::pair<std::string, Value>*> items;
            for (const auto& kv : v.as_dict().items) items.push_back(&kv);
            if (items.empty()) {
                out += "{}";
                return true;
            }
            if (sort_keys)
                std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
            out += '{';
            for (size_t i = 0; i < items.size(); ++i) {
                if (i) out += indent >= 0 ? "," : ", ";
                if (indent >= 0) newline(depth + 1);
                json_string(out, items[i]->first);
                out += ": ";
                if (!json_into(out, items[i]->second, indent, sort_keys, depth + 1)) return false;
                check_text(out);
            }
            if (indent >= 0) newline(depth);
            out += '}';
            return true;
        }
    }
    return false;
}

}  // namespace

std::string to_json(const Value& v, int indent, bool sort_keys, bool& ok) {
    std::string out;
    ok = json_into(out, v, indent, sort_keys, 0);
    return out;
}

std::string Value::str() const {
    switch (kind_) {
        case Kind::Undefined: return "";
        case Kind::String: return as_string();
        default: return repr();
    }
}

std::string Value::repr() const {
    switch (kind_) {
        case Kind::Undefined: return "";
        case Kind::None: return "None";
        case Kind::Bool: return b_ ? "True" : "False";
        case Kind::Int: return std::to_string(i_);
        case Kind::Float: return float_repr(f_);
        case Kind::String: return string_repr(as_string());
        case Kind::List: {
            const List& l = as_list();
            std::string out = tuple_ ? "(" : "[";
            for (size_t i = 0; i < l.size(); ++i) {
                out += (i ? ", " : "") + l[i].repr();
                check_text(out);
            }
            if (tuple_ && l.size() == 1) out += ",";
            return out + (tuple_ ? ")" : "]");
        }
        case Kind::Dict: {
            const Dict& d = as_dict();
            std::string out = namespace_ ? "<Namespace {" : "{";
            for (size_t i = 0; i < d.items.size(); ++i) {
                out += (i ? ", " : "") + string_repr(d.items[i].first) + ": " + d.items[i].second.repr();
                check_text(out);
            }
            return out + (namespace_ ? "}>" : "}");
        }
        case Kind::Function: return "<function " + function_name() + ">";
    }
    return "";
}

std::string Value::type_name() const {
    switch (kind_) {
        case Kind::Undefined: return "Undefined";
        case Kind::None: return "NoneType";
        case Kind::Bool: return "bool";
        case Kind::Int: return "int";
        case Kind::Float: return "float";
        case Kind::String: return "str";
        case Kind::List: return tuple_ ? "tuple" : "list";
        case Kind::Dict: return namespace_ ? "Namespace" : "dict";
        case Kind::Function: return "function";
    }
    return "";
}

bool equal(const Value& a, const Value& b) {
    if (a.is_number() && b.is_number()) {
        if (a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float) return a.as_float() == b.as_float();
        return a.as_int() == b.as_int();
    }
    if (a.kind() != b.kind()) return false;
    switch (a.kind()) {
        case Value::Kind::Undefined: case Value::Kind::None: return true;
        case Value::Kind::String: return a.as_string() == b.as_string();
        case Value::Kind::List: {
            const List &x = a.as_list(), &y = b.as_list();
            if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
            for (size_t i = 0; i < x.size(); ++i)
                if (!equal(x[i], y[i])) return false;
            return true;
        }
        case Value::Kind::Dict: {
            const Dict &x = a.as_dict(), &y = b.as_dict();
            if (&x == &y) return true;
            if (x.items.size() != y.items.size()) return false;
            for (const auto& [k, v] : x.items) {
                const Value* o = y.find(k);
                if (!o || !equal(v, *o)) return false;
            }
            return true;
        }
        case Value::Kind::Function: return &a.as_function() == &b.as_function();
        default: return false;
    }
}

bool less(const Value& a, const Value& b, bool& ok) {
    ok = true;
    if (a.is_number() && b.is_number()) {
        if (a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float) return a.as_float() < b.as_float();
        return a.as_int() < b.as_int();
    }
    if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 bytes order as code points
    if (a.is_list() && b.is_list()) {
        const List &x = a.as_list(), &y = b.as_list();
        for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
            if (equal(x[i], y[i])) continue;
            return less(x[i], y[i], ok);
        }
        return x.size() < y.size();
    }
    ok = false;
    return false;
}

std::vector<char32_t> code_points(std::string_view s) {
    std::vector<char32_t> out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const Utf8Char c = utf8_decode(s, i);
        out.push_back(c.valid ? char32_t(c.cp) : char32_t(kReplacementChar));
        i += c.len;
    }
    return out;
}

std::string utf8_of(const std::vector<char32_t>& cps, size_t from, size_t to) {
    std::string out;
    for (size_t i = from; i < to && i < cps.size(); ++i) utf8_append(out, uint32_t(cps[i]));
    return out;
}

}  // namespace tern::text::jinja
