// The template built-ins: Jinja2's filters and tests that chat templates use,
// the globals Hugging Face adds (raise_exception, strftime_now) beside
// Jinja2's (range, namespace, dict), and the str / dict methods templates
// call. Each behaves as its Python original does on the values a template
// sees; list and dict methods that would mutate are refused, as the
// immutable sandbox refuses them.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <map>

#include "text/jinja_internal.h"

namespace tern::text::jinja::detail {
namespace {

const Value kNone = Value::none();
const Value kUndef = Value();

bool is_int(const Value& v) { return v.kind() == Value::Kind::Int || v.kind() == Value::Kind::Bool; }

std::string need_string(const Value& v, const char* what, int line) {
    if (!v.is_string()) fail(line, std::string(what) + " needs a string, not " + v.type_name());
    return v.as_string();
}

bool py_space(char32_t c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d ||
           c == 0x1e || c == 0x1f || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
           c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// str.strip / lstrip / rstrip, with Python's whitespace or the given characters.
std::string strip(const std::string& s, const Value& chars, bool left, bool right) {
    const std::vector<char32_t> cps = code_points(s);
    std::vector<char32_t> set;
    const bool ws = chars.is_undefined() || chars.is_none();
    if (!ws && !chars.is_string()) fail(0, "strip: the characters to strip must be a string or none, not " + chars.type_name());
    if (!ws) set = code_points(chars.as_string());
    auto drop = [&](char32_t c) { return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
    size_t a = 0, b = cps.size();
    if (left)
        while (a < b && drop(cps[a])) ++a;
    if (right)
        while (b > a && drop(cps[b - 1])) --b;
    return utf8_of(cps, a, b);
}

char32_t ascii_upper(char32_t c) { return c >= 'a' && c <= 'z' ? c - 32 : c; }
char32_t ascii_lower(char32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

// Case mapping for ASCII and the Latin-1, Greek and Cyrillic letters with a
// one-to-one case pair; other characters are left as they are.
char32_t to_upper(char32_t c) {
    if (c < 0x80) return ascii_upper(c);
    if ((c >= 0xe0 && c <= 0xfe && c != 0xf7)) return c - 0x20;
    if (c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2) return c - 0x20;
    if (c >= 0x430 && c <= 0x44f) return c - 0x20;
    if (c >= 0x450 && c <= 0x45f) return c - 0x50;
    return c;
}
char32_t to_lower(char32_t c) {
    if (c < 0x80) return ascii_lower(c);
    if ((c >= 0xc0 && c <= 0xde && c != 0xd7)) return c + 0x20;
    if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2) return c + 0x20;
    if (c >= 0x410 && c <= 0x42f) return c + 0x20;
    if (c >= 0x400 && c <= 0x40f) return c + 0x50;
    return c;
}
bool is_alpha(char32_t c) { return to_upper(c) != to_lower(c) || (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

std::string map_case(const std::string& s, char32_t (*f)(char32_t)) {
    std::vector<char32_t> cps = code_points(s);
    for (char32_t& c : cps) c = f(c);
    return utf8_of(cps, 0, cps.size());
}

std::string capitalize(const std::string& s) {
    std::vector<char32_t> cps = code_points(s);
    for (size_t i = 0; i < cps.size(); ++i) cps[i] = i == 0 ? to_upper(cps[i]) : to_lower(cps[i]);
    return utf8_of(cps, 0, cps.size());
}

// Jinja2's title filter: each word (split at whitespace and -({[<) capitalized.
std::string title_filter(const std::string& s) {
    std::vector<char32_t> cps = code_points(s);
    bool start = true;
    for (char32_t& c : cps) {
        const bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        if (sep) {
            start = true;
            continue;
        }
        c = start ? to_upper(c) : to_lower(c);
        start = false;
    }
    return utf8_of(cps, 0, cps.size());
}

// Python's str.title: a letter after a non-letter starts a word.
std::string title_method(const std::string& s) {
    std::vector<char32_t> cps = code_points(s);
    bool prev_alpha = false;
    for (char32_t& c : cps) {
        const bool alpha = is_alpha(c);
        if (alpha) c = prev_alpha ? to_lower(c) : to_upper(c);
        prev_alpha = alpha;
    }
    return utf8_of(cps, 0, cps.size());
}

List split(const std::string& s, const Value& sep_v, int64_t maxsplit, int line) {
    List out;
    if (sep_v.is_undefined() || sep_v.is_none()) {
        // Runs of whitespace separate; leading and trailing whitespace ignored.
        const std::vector<char32_t> cps = code_points(s);
        size_t i = 0;
        while (i < cps.size()) {
            while (i < cps.size() && py_space(cps[i])) ++i;
            if (i == cps.size()) break;
            if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
                size_t end = cps.size();
                while (end > i && py_space(cps[end - 1])) --end;
                out.push_back(Value(utf8_of(cps, i, end)));
                return out;
            }
            size_t j = i;
            while (j < cps.size() && !py_space(cps[j])) ++j;
            out.push_back(Value(utf8_of(cps, i, j)));
            i = j;
        }
        return out;
    }
    const std::string sep = need_string(sep_v, "split", line);
    if (sep.empty()) fail(line, "split: empty separator");
    size_t from = 0;
    while (true) {
        const size_t at = s.find(sep, from);
        if (at == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) break;
        out.push_back(Value(s.substr(from, at - from)));
        from = at + sep.size();
    }
    out.push_back(Value(s.substr(from)));
    return out;
}

std::string replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
    // The result's size before building it: old.empty() inserts between characters.
    const size_t hits = old.empty() ? code_points(s).size() + 1 : [&] {
        size_t n = 0;
        for (size_t at = s.find(old); at != std::string::npos; at = s.find(old, at + old.size())) ++n;
        return n;
    }();
    const size_t inserts = count < 0 ? hits : std::min(hits, size_t(count));
    check_string_size(s.size() + inserts * with.size(), 0);
    charge(s.size() + inserts * with.size(), 0);
    std::string out;
    if (old.empty()) {
        // Python inserts `with` between every character (and at both ends).
        const std::vector<char32_t> cps = code_points(s);
        int64_t done = 0;
        for (size_t i = 0; i <= cps.size(); ++i) {
            if (count < 0 || done < count) out += with, ++done;
            if (i < cps.size()) out += utf8_of(cps, i, i + 1);
        }
        return out;
    }
    size_t from = 0;
    int64_t done = 0;
    while (count < 0 || done < count) {
        const size_t at = s.find(old, from);
        if (at == std::string::npos) break;
        out += s.substr(from, at - from) + with;
        from = at + old.size();
        ++done;
    }
    return out + s.substr(from);
}

bool starts_or_ends(const std::string& s, const Value& affix, bool starts, int line) {
    auto one = [&](const Value& a) {
        const std::string x = need_string(a, starts ? "startswith" : "endswith", line);
        return x.size() <= s.size() && (starts ? s.compare(0, x.size(), x) == 0
                                               : s.compare(s.size() - x.size(), x.size(), x) == 0);
    };
    if (affix.is_list()) {
        for (const Value& a : affix.as_list())
            if (one(a)) return true;
        return false;
    }
    return one(affix);
}

// A builtin function or method: keywords it does not read are an error.
Value bound(const char* name, Function f) {
    return Value::function(name, [name, f = std::move(f)](Args& a) {
        Value out = f(a);
        a.refuse_unused(name);
        return out;
    });
}

// Sort keys: strings folded to lower case unless case_sensitive (Jinja2's default).
Value sort_key(const Value& v, bool case_sensitive) {
    if (!case_sensitive && v.is_string()) return Value(map_case(v.as_string(), to_lower));
    return v;
}

// An item's attribute for map / sort / selectattr: dotted paths and integer steps.
Value attribute_of(Renderer* r, const Value& item, const std::string& path, int line) {
    Value v = item;
    size_t from = 0;
    while (from <= path.size()) {
        const size_t dot = path.find('.', from);
        const std::string part = path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
        if (v.is_undefined()) return v;
        if (v.is_dict()) {
            const Value* x = v.as_dict().find(part);
            v = x ? *x : Value();
        } else if (v.is_list() && !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit)) {
            const size_t i = size_t(std::stoll(part));
            v = i < v.as_list().size() ? v.as_list()[i] : Value();
        } else {
            v = method(v, part, line);
        }
        if (dot == std::string::npos) break;
        from = dot + 1;
    }
    (void)r;
    return v;
}

List sorted(List items, bool reverse, bool case_sensitive, const Value& attribute, Renderer* r, int line) {
    std::vector<std::pair<Value, Value>> keyed;
    for (Value& v : items) {
        Value k = attribute.is_string() ? attribute_of(r, v, attribute.as_string(), line) : v;
        keyed.emplace_back(sort_key(k, case_sensitive), std::move(v));
    }
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
        bool ok = true;
        const bool lt = reverse ? less(b.first, a.first, ok) : less(a.first, b.first, ok);
        if (!ok) fail(line, "sort: cannot order '" + a.first.type_name() + "' and '" + b.first.type_name() + "'");
        return lt;
    });
    List out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return out;
}

// Python's round() to `digits` places (half to even on the binary value).
double py_round(double x, int64_t digits) {
    const double p = std::pow(10.0, double(digits));
    const double y = x * p;
    double r = std::nearbyint(y);
    return r / p;
}

std::string html_escape(const std::string& s) {
    std::string out;
    for (char c : s) {
        switch (c) {
            case '&': out += "&amp;"; break;
            case '<': out += "&lt;"; break;
            case '>': out += "&gt;"; break;
            case '"': out += "&#34;"; break;
            case '\'': out += "&#39;"; break;
            default: out += c;
        }
    }
    return out;
}

// Python's int() of a string: optional sign, digits (underscores between),
// surrounding whitespace.
bool parse_int(const std::string& s, int base, int64_t& out) {
    const std::string t = strip(s, Value(), true, true);
    if (t.empty()) return false;
    size_t i = 0;
    bool neg = false;
    if (t[i] == '+' || t[i] == '-') neg = t[i++] == '-';
    if (i == t.size()) return false;
    long double v = 0;
    for (; i < t.size(); ++i) {
        const char c = char(std::tolower(static_cast<unsigned char>(t[i])));
        if (c == '_') continue;
        int d = std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (c >= 'a' && c <= 'z') ? c - 'a' + 10 : 99;
        if (d >= base) return false;
        v = v * base + d;
        if (v > 9.2e18L) return false;
    }
    out = int64_t(neg ? -v : v);
    return true;
}

using FilterFn = Value (*)(const Value&, Args&);

Value f_length(const Value& v, Args& a) { return Value(length(v, a.line)); }

Value f_default(const Value& v, Args& a) {
    const Value def = a.get(0, "default_value", Value(std::string()));
    const bool boolean = a.get(1, "boolean", Value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return def;
    return v;
}

// Hugging Face's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value f_tojson(const Value& v, Args& a) {
    const bool ensure_ascii = a.get(0, "ensure_ascii", Value(false)).truthy();
    const Value ind = a.get(1, "indent", kNone);
    int indent = -1;
    if (ind.is_number()) {
        if (ind.as_int() > 64) fail(a.line, "tojson: indent past 64 is not supported");
        indent = int(std::max<int64_t>(0, ind.as_int()));
    } else if (!ind.is_none() && !ind.is_undefined()) {
        fail(a.line, "tojson: indent must be a number");
    }
    if (!a.get(2, "separators", kNone).is_none()) fail(a.line, "tojson: custom separators are not supported");
    const bool sort_keys = a.get(3, "sort_keys", Value(false)).truthy();
    bool ok = true;
    std::string out = to_json(v, indent, sort_keys, ok);
    if (!ok) fail(a.line, "tojson: the value holds something that is not JSON (undefined or a function)");
    if (!ensure_ascii) return Value(std::move(out));
    // Non-ASCII characters only occur inside JSON strings: escape them there.
    std::string ascii;
    for (char32_t c : code_points(out)) {
        char b[16];
        if (c < 0x80) {
            ascii += char(c);
        } else if (c < 0x10000) {
            std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
            ascii += b;
        } else {
            const unsigned u = unsigned(c) - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (u >> 10), 0xdc00 + (u & 0x3ff));
            ascii += b;
        }
    }
    return Value(std::move(ascii));
}

Value f_join(const Value& v, Args& a) {
    const std::string sep = a.get(0, "d", Value(std::string())).str();
    const Value attr = a.get(1, "attribute", kUndef);
    std::string out;
    bool first = true;
    for (const Value& x : items_of(v, a.line)) {
        if (!first) out += sep;
        first = false;
        out += (attr.is_string() ? attribute_of(a.renderer, x, attr.as_string(), a.line) : x).str();
        check_string_size(out.size(), a.line);
    }
    charge(out.size(), a.line);
    return Value(std::move(out));
}

Value f_first(const Value& v, Args& a) {
    const List l = items_of(v, a.line);
    return l.empty() ? Value() : l.front();
}
Value f_last(const Value& v, Args& a) {
    const List l = items_of(v, a.line);
    return l.empty() ? Value() : l.back();
}
Value f_list(const Value& v, Args& a) { return Value(items_of(v, a.line)); }
Value f_string(const Value& v, Args&) { return Value(v.str()); }
Value f_upper(const Value& v, Args&) { return Value(map_case(v.str(), to_upper)); }
Value f_lower(const Value& v, Args&) { return Value(map_case(v.str(), to_lower)); }
Value f_capitalize(const Value& v, Args&) { return Value(capitalize(v.str())); }
Value f_title(const Value& v, Args&) { return Value(title_filter(v.str())); }
Value f_trim(const Value& v, Args& a) { return Value(strip(v.str(), a.get(0, "chars", kNone), true, true)); }
Value f_escape(const Value& v, Args&) { return Value(html_escape(v.str())); }
Value f_safe(const Value& v, Args&) { return v.is_string() ? v : Value(v.str()); }

Value f_replace(const Value& v, Args& a) {
    const std::string old = a.need(0, "old", "replace").str(), with = a.need(1, "new", "replace").str();
    const Value count = a.get(2, "count", kNone);
    return Value(replace(v.str(), old, with, count.is_number() ? count.as_int() : -1));
}

Value f_items(const Value& v, Args& a) {
    if (v.is_undefined()) return Value(List());
    if (!v.is_dict()) fail(a.line, "items: expected a dict, not " + v.type_name());
    List out;
    for (const auto& [k, x] : v.as_dict().items) out.push_back(Value::tuple(List{Value(k), x}));
    return Value(std::move(out));
}

Value f_dictsort(const Value& v, Args& a) {
    if (!v.is_dict()) fail(a.line, "dictsort: expected a dict, not " + v.type_name());
    const bool cs = a.get(0, "case_sensitive", Value(false)).truthy();
    const std::string by = a.get(1, "by", Value("key")).str();
    const bool reverse = a.get(2, "reverse", Value(false)).truthy();
    if (by != "key" && by != "value") fail(a.line, "dictsort: 'by' must be 'key' or 'value'");
    std::vector<std::pair<Value, Value>> keyed;
    for (const auto& [k, x] : v.as_dict().items)
        keyed.emplace_back(sort_key(by == "key" ? Value(k) : x, cs), Value::tuple(List{Value(k), x}));
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& p, const auto& q) {
        bool ok = true;
        const bool lt = reverse ? less(q.first, p.first, ok) : less(p.first, q.first, ok);
        if (!ok) fail(a.line, "dictsort: values cannot be ordered");
        return lt;
    });
    List out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return Value(std::move(out));
}

Value f_sort(const Value& v, Args& a) {
    return Value(sorted(items_of(v, a.line), a.get(0, "reverse", Value(false)).truthy(),
                        a.get(1, "case_sensitive", Value(false)).truthy(), a.get(2, "attribute", kUndef), a.renderer,
                        a.line));
}

Value f_reverse(const Value& v, Args& a) {
    if (v.is_string()) {
        std::vector<char32_t> cps = code_points(v.as_string());
        std::reverse(cps.begin(), cps.end());
        return Value(utf8_of(cps, 0, cps.size()));
    }
    List l = items_of(v, a.line);
    std::reverse(l.begin(), l.end());
    return Value(std::move(l));
}

Value f_unique(const Value& v, Args& a) {
    const bool cs = a.get(0, "case_sensitive", Value(false)).truthy();
    const Value attr = a.get(1, "attribute", kUndef);
    List out, keys;
    const List all = items_of(v, a.line);
    if (all.size() > 65536) fail(a.line, "unique: more than 65536 items");
    for (const Value& x : all) {
        const Value k = sort_key(attr.is_string() ? attribute_of(a.renderer, x, attr.as_string(), a.line) : x, cs);
        bool seen = false;
        for (const Value& y : keys) seen = seen || equal(y, k);
        if (!seen) keys.push_back(k), out.push_back(x);
    }
    return Value(std::move(out));
}

// d toward zero, where an int64 holds it. Python's int() would give a
// bigger integer, which the engine has no room for: an error, not a wrong
// number (found by fuzzing: 3.3e66|int converted out of range).
int64_t truncated_int(double d, int line) {
    const double t = std::trunc(d);
    if (!fits_int64(t)) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%g", d);
        fail(line, std::string("int: ") + buf + " is outside the 64-bit integer range");
    }
    return int64_t(t);
}

Value f_int(const Value& v, Args& a) {
    const Value def = a.get(0, "default", Value(int64_t(0)));
    const int base = int(a.get(1, "base", Value(int64_t(10))).as_int());
    if (is_int(v)) return Value(v.as_int());
    if (v.kind() == Value::Kind::Float) {
        if (!std::isfinite(v.as_float())) return def;
        return Value(truncated_int(v.as_float(), a.line));
    }
    if (v.is_string()) {
        int64_t out = 0;
        if (parse_int(v.as_string(), base, out)) return Value(out);
        char* end = nullptr;
        const std::string t = strip(v.as_string(), kNone, true, true);
        const double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end && *end == '\0' && std::isfinite(d)) return Value(truncated_int(d, a.line));
    }
    return def;
}

Value f_float(const Value& v, Args& a) {
    const Value def = a.get(0, "default", Value(0.0));
    if (v.is_number()) return Value(v.as_float());
    if (v.is_string()) {
        const std::string t = strip(v.as_string(), kNone, true, true);
        char* end = nullptr;
        const double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end && *end == '\0') return Value(d);
    }
    return def;
}

Value f_abs(const Value& v, Args& a) {
    if (!v.is_number()) fail(a.line, "abs: expected a number, not " + v.type_name());
    if (v.kind() == Value::Kind::Float) return Value(std::fabs(v.as_float()));
    return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
}

Value f_round(const Value& v, Args& a) {
    if (!v.is_number()) fail(a.line, "round: expected a number, not " + v.type_name());
    const int64_t precision = a.get(0, "precision", Value(int64_t(0))).as_int();
    const std::string method = a.get(1, "method", Value("common")).str();
    const double p = std::pow(10.0, double(precision)), x = v.as_float();
    if (method == "common") return Value(py_round(x, precision));
    if (method == "floor") return Value(std::floor(x * p) / p);
    if (method == "ceil") return Value(std::ceil(x * p) / p);
    fail(a.line, "round: method must be common, floor or ceil");
}

Value f_sum(const Value& v, Args& a) {
    const Value attr = a.get(0, "attribute", kUndef);
    Value total = a.get(1, "start", Value(int64_t(0)));
    for (const Value& x : items_of(v, a.line)) {
        const Value item = attr.is_string() ? attribute_of(a.renderer, x, attr.as_string(), a.line) : x;
        if (!item.is_number() || !total.is_number()) fail(a.line, "sum: expected numbers");
        total = (item.kind() == Value::Kind::Float || total.kind() == Value::Kind::Float)
                    ? Value(total.as_float() + item.as_float())
                    : Value(total.as_int() + item.as_int());
    }
    return total;
}

Value min_max(const Value& v, Args& a, bool want_max) {
    const bool cs = a.get(0, "case_sensitive", Value(false)).truthy();
    const Value attr = a.get(1, "attribute", kUndef);
    const List l = items_of(v, a.line);
    if (l.empty()) return Value();
    size_t best = 0;
    for (size_t i = 1; i < l.size(); ++i) {
        auto key = [&](const Value& x) {
            return sort_key(attr.is_string() ? attribute_of(a.renderer, x, attr.as_string(), a.line) : x, cs);
        };
        bool ok = true;
        const bool better = want_max ? less(key(l[best]), key(l[i]), ok) : less(key(l[i]), key(l[best]), ok);
        if (!ok) fail(a.line, std::string(want_max ? "max" : "min") + ": values cannot be ordered");
        if (better) best = i;
    }
    return l[best];
}
Value f_max(const Value& v, Args& a) { return min_max(v, a, true); }
Value f_min(const Value& v, Args& a) { return min_max(v, a, false); }

Value f_indent(const Value& v, Args& a) {
    const Value w = a.get(0, "width", Value(int64_t(4)));
    if (!w.is_string()) check_string_size(size_t(std::max<int64_t>(0, w.as_int())), a.line);
    const std::string pad = w.is_string() ? w.as_string() : std::string(size_t(std::max<int64_t>(0, w.as_int())), ' ');
    const bool first = a.get(1, "first", Value(false)).truthy(), blank = a.get(2, "blank", Value(false)).truthy();
    const std::string s = v.str();
    std::string out;
    size_t from = 0;
    bool is_first = true;
    while (true) {
        const size_t nl = s.find('\n', from);
        const std::string line = s.substr(from, nl == std::string::npos ? std::string::npos : nl - from);
        if ((!is_first || first) && (blank || !line.empty())) out += pad;
        check_string_size(out.size() + line.size(), a.line);
        out += line;
        if (nl == std::string::npos) break;
        out += '\n';
        from = nl + 1;
        is_first = false;
    }
    charge(out.size(), a.line);
    return Value(std::move(out));
}

Value f_wordcount(const Value& v, Args& a) {
    return Value(int64_t(split(v.str(), kUndef, -1, a.line).size()));
}

Value f_center(const Value& v, Args& a) {
    const int64_t width = a.get(0, "width", Value(int64_t(80))).as_int();
    const std::vector<char32_t> cps = code_points(v.str());
    const int64_t n = int64_t(cps.size());
    if (width <= n) return Value(v.str());
    check_string_size(size_t(width), a.line);
    charge(size_t(width), a.line);
    const int64_t total = width - n, left = total / 2 + (total & width & 1);
    return Value(std::string(size_t(left), ' ') + v.str() + std::string(size_t(total - left), ' '));
}

Value f_batch(const Value& v, Args& a) {
    const int64_t n = a.need(0, "linecount", "batch").as_int();
    if (n <= 0) fail(a.line, "batch: the size must be positive");
    check_list_size(size_t(std::min<int64_t>(n, int64_t(kMaxListItems) + 1)), a.line);
    const Value fill = a.get(1, "fill_with", kNone);
    List out, cur;
    for (const Value& x : items_of(v, a.line)) {
        cur.push_back(x);
        if (int64_t(cur.size()) == n) out.push_back(Value(std::move(cur))), cur.clear();
    }
    if (!cur.empty()) {
        if (!fill.is_none()) while (int64_t(cur.size()) < n) cur.push_back(fill);
        out.push_back(Value(std::move(cur)));
    }
    return Value(std::move(out));
}

// map / select / reject / selectattr / rejectattr.
Value f_map(const Value& v, Args& a) {
    List out;
    const Value attr = a.get(99, "attribute", kUndef);
    if (attr.is_string()) {
        const Value def = a.get(99, "default", kUndef);
        for (const Value& x : items_of(v, a.line)) {
            Value y = attribute_of(a.renderer, x, attr.as_string(), a.line);
            out.push_back(y.is_undefined() && !def.is_undefined() ? def : y);
        }
        return Value(std::move(out));
    }
    const std::string name = need_string(a.need(0, "filter", "map"), "map", a.line);
    if (!has_filter(name)) fail(a.line, "map: no filter named '" + name + "'");
    for (const Value& x : items_of(v, a.line)) {
        Args fa;
        fa.pos.assign(a.pos.begin() + 1, a.pos.end());
        fa.kw = a.kw;  // the named filter checks them
        a.mark_all_used();
        out.push_back(a.renderer->apply_filter(name, x, fa, a.line));
    }
    return Value(std::move(out));
}

Value select_impl(const Value& v, Args& a, bool attr_form, bool keep_if) {
    List out;
    size_t i0 = 0;
    std::string attr;
    if (attr_form) attr = need_string(a.need(0, "attribute", "selectattr"), "selectattr", a.line), i0 = 1;
    const bool has_test_name = a.pos.size() > i0;
    const std::string name = has_test_name ? need_string(a.pos[i0], "select", a.line) : std::string();
    if (has_test_name && !has_test(name)) fail(a.line, "no test named '" + name + "'");
    for (const Value& x : items_of(v, a.line)) {
        const Value subject = attr_form ? attribute_of(a.renderer, x, attr, a.line) : x;
        bool pass;
        if (!has_test_name) {
            pass = subject.truthy();
        } else {
            Args ta;
            ta.pos.assign(a.pos.begin() + long(i0) + 1, a.pos.end());
            ta.kw = a.kw;  // the named test checks them
            a.mark_all_used();
            pass = a.renderer->apply_test(name, subject, ta, a.line);
        }
        if (pass == keep_if) out.push_back(x);
    }
    return Value(std::move(out));
}
Value f_select(const Value& v, Args& a) { return select_impl(v, a, false, true); }
Value f_reject(const Value& v, Args& a) { return select_impl(v, a, false, false); }
Value f_selectattr(const Value& v, Args& a) { return select_impl(v, a, true, true); }
Value f_rejectattr(const Value& v, Args& a) { return select_impl(v, a, true, false); }

Value f_attr(const Value& v, Args& a) {
    const std::string name = need_string(a.need(0, "name", "attr"), "attr", a.line);
    if (v.is_dict()) {
        const Value* x = v.as_dict().find(name);
        return x ? *x : Value();
    }
    return method(v, name, a.line);
}

Value f_truncate(const Value& v, Args& a) {
    const int64_t length = a.get(0, "length", Value(int64_t(255))).as_int();
    const bool killwords = a.get(1, "killwords", Value(false)).truthy();
    const std::string end = a.get(2, "end", Value("...")).str();
    const int64_t leeway = a.get(3, "leeway", Value(int64_t(5))).as_int();
    const std::vector<char32_t> cps = code_points(v.str());
    if (int64_t(cps.size()) <= length + leeway) return Value(v.str());
    const int64_t keep = std::max<int64_t>(0, length - int64_t(code_points(end).size()));
    std::string head = utf8_of(cps, 0, size_t(keep));
    if (!killwords) {
        const size_t sp = head.rfind(' ');
        if (sp != std::string::npos) head = head.substr(0, sp);
    }
    return Value(head + end);
}

const std::map<std::string, FilterFn>& filters() {
    static const std::map<std::string, FilterFn> kFilters = {
        {"abs", f_abs}, {"attr", f_attr}, {"batch", f_batch}, {"capitalize", f_capitalize}, {"center", f_center},
        {"count", f_length}, {"d", f_default}, {"default", f_default}, {"dictsort", f_dictsort},
        {"e", f_escape}, {"escape", f_escape}, {"first", f_first}, {"float", f_float}, {"forceescape", f_escape},
        {"indent", f_indent}, {"int", f_int}, {"items", f_items}, {"join", f_join}, {"last", f_last},
        {"length", f_length}, {"list", f_list}, {"lower", f_lower}, {"map", f_map}, {"max", f_max}, {"min", f_min},
        {"reject", f_reject}, {"rejectattr", f_rejectattr}, {"replace", f_replace}, {"reverse", f_reverse},
        {"round", f_round}, {"safe", f_safe}, {"select", f_select}, {"selectattr", f_selectattr}, {"sort", f_sort},
        {"string", f_string}, {"sum", f_sum}, {"title", f_title}, {"tojson", f_tojson}, {"trim", f_trim},
        {"truncate", f_truncate}, {"unique", f_unique}, {"upper", f_upper}, {"wordcount", f_wordcount},
    };
    return kFilters;
}

// ---- tests ------------------------------------------------------------------------

using TestFn = bool (*)(const Value&, Args&);

bool cmp(const Value& v, Args& a, const char* op) {
    const Value o = a.need(0, "other", op);
    bool ok = true;
    const std::string s = op;
    bool r = false;
    if (s == "eq") return equal(v, o);
    if (s == "ne") return !equal(v, o);
    if (s == "lt") r = less(v, o, ok);
    if (s == "gt") r = less(o, v, ok);
    if (s == "le") r = !less(o, v, ok);
    if (s == "ge") r = !less(v, o, ok);
    if (!ok) fail(a.line, "test '" + s + "': values cannot be ordered");
    return r;
}

const std::map<std::string, TestFn>& tests() {
    static const std::map<std::string, TestFn> kTests = {
        {"defined", [](const Value& v, Args&) { return !v.is_undefined(); }},
        {"undefined", [](const Value& v, Args&) { return v.is_undefined(); }},
        {"none", [](const Value& v, Args&) { return v.is_none(); }},
        {"boolean", [](const Value& v, Args&) { return v.kind() == Value::Kind::Bool; }},
        {"true", [](const Value& v, Args&) { return v.kind() == Value::Kind::Bool && v.as_bool(); }},
        {"false", [](const Value& v, Args&) { return v.kind() == Value::Kind::Bool && !v.as_bool(); }},
        {"string", [](const Value& v, Args&) { return v.is_string(); }},
        {"number", [](const Value& v, Args&) { return v.is_number(); }},
        {"integer", [](const Value& v, Args&) { return v.kind() == Value::Kind::Int; }},
        {"float", [](const Value& v, Args&) { return v.kind() == Value::Kind::Float; }},
        {"mapping", [](const Value& v, Args&) { return v.is_dict(); }},
        {"sequence", [](const Value& v, Args&) { return v.is_list() || v.is_string() || v.is_dict(); }},
        {"iterable", [](const Value& v, Args&) { return v.is_list() || v.is_string() || v.is_dict() || v.is_undefined(); }},
        {"callable", [](const Value& v, Args&) { return v.is_function(); }},
        {"odd", [](const Value& v, Args& a) {
             if (!is_int(v)) fail(a.line, "test 'odd' needs an integer");
             return v.as_int() % 2 != 0;
         }},
        {"even", [](const Value& v, Args& a) {
             if (!is_int(v)) fail(a.line, "test 'even' needs an integer");
             return v.as_int() % 2 == 0;
         }},
        {"divisibleby", [](const Value& v, Args& a) {
             const Value n = a.need(0, "num", "divisibleby");
             if (!is_int(v) || !is_int(n) || n.as_int() == 0) fail(a.line, "test 'divisibleby' needs nonzero integers");
             return v.as_int() % n.as_int() == 0;
         }},
        {"lower", [](const Value& v, Args&) { return v.is_string() && map_case(v.as_string(), to_lower) == v.as_string(); }},
        {"upper", [](const Value& v, Args&) { return v.is_string() && map_case(v.as_string(), to_upper) == v.as_string(); }},
        {"in", [](const Value& v, Args& a) {
             const Value c = a.need(0, "seq", "in");
             if (c.is_string()) return v.is_string() && c.as_string().find(v.as_string()) != std::string::npos;
             if (c.is_dict()) return v.is_string() && c.as_dict().find(v.as_string()) != nullptr;
             for (const Value& x : items_of(c, a.line))
                 if (equal(x, v)) return true;
             return false;
         }},
        {"sameas", [](const Value& v, Args& a) {
             const Value o = a.need(0, "other", "sameas");
             if (v.kind() != o.kind()) return false;
             if (v.is_none() || v.is_undefined()) return true;
             if (v.kind() == Value::Kind::Bool) return v.as_bool() == o.as_bool();
             if (v.is_dict()) return &v.as_dict() == &o.as_dict();
             if (v.is_list()) return &v.as_list() == &o.as_list();
             return equal(v, o);
         }},
        {"eq", [](const Value& v, Args& a) { return cmp(v, a, "eq"); }},
        {"equalto", [](const Value& v, Args& a) { return cmp(v, a, "eq"); }},
        {"==", [](const Value& v, Args& a) { return cmp(v, a, "eq"); }},
        {"ne", [](const Value& v, Args& a) { return cmp(v, a, "ne"); }},
        {"!=", [](const Value& v, Args& a) { return cmp(v, a, "ne"); }},
        {"lt", [](const Value& v, Args& a) { return cmp(v, a, "lt"); }},
        {"lessthan", [](const Value& v, Args& a) { return cmp(v, a, "lt"); }},
        {"<", [](const Value& v, Args& a) { return cmp(v, a, "lt"); }},
        {"gt", [](const Value& v, Args& a) { return cmp(v, a, "gt"); }},
        {"greaterthan", [](const Value& v, Args& a) { return cmp(v, a, "gt"); }},
        {">", [](const Value& v, Args& a) { return cmp(v, a, "gt"); }},
        {"le", [](const Value& v, Args& a) { return cmp(v, a, "le"); }},
        {"<=", [](const Value& v, Args& a) { return cmp(v, a, "le"); }},
        {"ge", [](const Value& v, Args& a) { return cmp(v, a, "ge"); }},
        {">=", [](const Value& v, Args& a) { return cmp(v, a, "ge"); }},
    };
    return kTests;
}

// ---- globals ----------------------------------------------------------------------

Value g_range(Args& a) {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : a.pos)
        if (!is_int(v)) fail(a.line, "range() takes integers, not " + v.type_name());
    if (a.pos.size() == 1) stop = a.pos[0].as_int();
    else if (a.pos.size() == 2 || a.pos.size() == 3) {
        start = a.pos[0].as_int();
        stop = a.pos[1].as_int();
        if (a.pos.size() == 3) step = a.pos[2].as_int();
    } else {
        fail(a.line, "range() takes one to three arguments");
    }
    if (step == 0) fail(a.line, "range() step must not be zero");
    List out;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        check_list_size(out.size() + 1, a.line);
        charge(sizeof(Value), a.line);
        out.push_back(Value(i));
    }
    return Value(std::move(out));
}

// The dict of namespace(...) and dict(...): dicts given positionally, then keyword arguments.
Dict dict_of_args(Args& a, const char* what) {
    Dict d;
    for (const Value& v : a.pos) {
        if (!v.is_dict()) fail(a.line, std::string(what) + "() takes a dict or keyword arguments");
        for (const auto& [k, x] : v.as_dict().items) d.set(k, x);
    }
    for (const auto& [k, v] : a.kw) d.set(k, v);
    a.mark_all_used();
    return d;
}

Value g_namespace(Args& a) { return Value::namespace_of(dict_of_args(a, "namespace")); }
Value g_dict(Args& a) { return Value(dict_of_args(a, "dict")); }

Value g_raise_exception(Args& a) {
    // Hugging Face raises TemplateError(message): the message alone. An
    // empty one (raise_exception(''), or of a name the context lacks) would
    // say nothing, so it says where the template raised it.
    std::string message = a.get(0, "message", Value("raise_exception() was called")).str();
    if (message.empty()) throw TemplateError{"raise_exception() was called with an empty message", a.line};
    throw TemplateError{std::move(message), 0};
}

Value g_strftime_now(Args& a) {
    const std::string fmt = need_string(a.need(0, "format", "strftime_now"), "strftime_now", a.line);
    std::tm tm{};
    if (a.renderer->options().now) {
        tm = *a.renderer->options().now;
    } else {
        const std::time_t t = std::time(nullptr);
        localtime_r(&t, &tm);
    }
    if (fmt.size() > 256) fail(a.line, "strftime_now: the format is too long");
    char buf[1024];
    const size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    if (n == 0 && !fmt.empty()) fail(a.line, "strftime_now: the formatted time is too long or empty");
    return Value(std::string(buf, n));
}

}  // namespace

bool has_filter(const std::string& name) { return filters().count(name) > 0; }
bool has_test(const std::string& name) { return tests().count(name) > 0; }

Value filter(const std::string& name, const Value& base, Args& args) {
    const auto it = filters().find(name);
    if (it == filters().end()) fail(args.line, "no filter named '" + name + "'");
    Value out = it->second(base, args);
    args.refuse_unused("filter '" + name + "'");
    return out;
}

bool test(const std::string& name, const Value& v, Args& args) {
    const auto it = tests().find(name);
    if (it == tests().end()) fail(args.line, "no test named '" + name + "'");
    const bool out = it->second(v, args);
    args.refuse_unused("test '" + name + "'");
    return out;
}

std::unordered_map<std::string, Value> globals() {
    return {
        {"range", bound("range", g_range)},
        {"namespace", bound("namespace", g_namespace)},
        {"dict", bound("dict", g_dict)},
        {"raise_exception", bound("raise_exception", g_raise_exception)},
        {"strftime_now", bound("strftime_now", g_strftime_now)},
    };
}

Value method(const Value& base, const std::string& name, int line) {
    if (base.is_string()) {
        const std::string s = base.as_string();
        if (name == "strip" || name == "lstrip" || name == "rstrip") {
            const bool l = name != "rstrip", r = name != "lstrip";
            return bound("strip", [s, l, r](Args& a) { return Value(strip(s, a.get(0, "chars", kNone), l, r)); });
        }
        if (name == "split")
            return bound("split", [s](Args& a) {
                return Value(split(s, a.get(0, "sep", kNone), a.get(1, "maxsplit", Value(int64_t(-1))).as_int(), a.line));
            });
        if (name == "startswith" || name == "endswith") {
            const bool st = name == "startswith";
            return bound("startswith", [s, st](Args& a) {
                return Value(starts_or_ends(s, a.need(0, st ? "prefix" : "suffix", st ? "startswith" : "endswith"), st, a.line));
            });
        }
        if (name == "upper") return bound("upper", [s](Args&) { return Value(map_case(s, to_upper)); });
        if (name == "lower") return bound("lower", [s](Args&) { return Value(map_case(s, to_lower)); });
        if (name == "title") return bound("title", [s](Args&) { return Value(title_method(s)); });
        if (name == "capitalize") return bound("capitalize", [s](Args&) { return Value(capitalize(s)); });
        if (name == "replace")
            return bound("replace", [s](Args& a) {
                const Value count = a.get(2, "count", Value(int64_t(-1)));
                return Value(replace(s, need_string(a.need(0, "old", "replace"), "replace", a.line),
                                     need_string(a.need(1, "new", "replace"), "replace", a.line), count.as_int()));
            });
        if (name == "find" || name == "rfind" || name == "index" || name == "count")
            return bound("find", [s, name](Args& a) {
                const std::string sub = need_string(a.need(0, "sub", name), name.c_str(), a.line);
                if (name == "count") {
                    if (sub.empty()) return Value(int64_t(code_points(s).size() + 1));
                    int64_t n = 0;
                    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
                    return Value(n);
                }
                const size_t at = name == "rfind" ? s.rfind(sub) : s.find(sub);
                if (at == std::string::npos) {
                    if (name == "index") fail(a.line, "substring not found");
                    return Value(int64_t(-1));
                }
                return Value(int64_t(code_points(s.substr(0, at)).size()));
            });
        if (name == "join")
            return bound("join", [s](Args& a) {
                std::string out;
                bool first = true;
                for (const Value& x : items_of(a.need(0, "iterable", "join"), a.line)) {
                    if (!x.is_string()) fail(a.line, "join: expected strings, found " + x.type_name());
                    if (!first) out += s;
                    first = false;
                    out += x.as_string();
                }
                return Value(std::move(out));
            });
        if (name == "splitlines")
            return bound("splitlines", [s](Args& a) {
                const bool keep = a.get(0, "keepends", Value(false)).truthy();
                List out;
                size_t from = 0;
                for (size_t i = 0; i < s.size(); ++i) {
                    if (s[i] != '\n' && s[i] != '\r') continue;
                    size_t end = i;
                    if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
                    out.push_back(Value(s.substr(from, (keep ? i + 1 : end) - from)));
                    from = i + 1;
                }
                if (from < s.size()) out.push_back(Value(s.substr(from)));
                return Value(std::move(out));
            });
        if (name == "isdigit" || name == "isalpha" || name == "isspace" || name == "isalnum" || name == "islower" ||
            name == "isupper")
            return bound("is", [s, name](Args&) {
                const std::vector<char32_t> cps = code_points(s);
                if (cps.empty()) return Value(false);
                bool all = true, cased = false;
                for (char32_t c : cps) {
                    if (name == "isdigit") all = all && c >= '0' && c <= '9';
                    else if (name == "isalpha") all = all && is_alpha(c);
                    else if (name == "isspace") all = all && py_space(c);
                    else if (name == "isalnum") all = all && (is_alpha(c) || (c >= '0' && c <= '9'));
                    else if (name == "islower") all = all && to_lower(c) == c, cased = cased || is_alpha(c);
                    else all = all && to_upper(c) == c, cased = cased || is_alpha(c);
                }
                return Value(all && (name == "islower" || name == "isupper" ? cased : true));
            });
        if (name == "format") fail(line, "str.format() is not supported in chat templates");
        return Value();
    }
    if (base.is_dict() && !base.is_namespace()) {
        if (name == "items")
            return bound("items", [base](Args& a) {
                Args none;
                none.line = a.line;
                return f_items(base, none);
            });
        if (name == "keys")
            return bound("keys", [base](Args&) {
                List out;
                for (const auto& kv : base.as_dict().items) out.push_back(Value(kv.first));
                return Value(std::move(out));
            });
        if (name == "values")
            return bound("values", [base](Args&) {
                List out;
                for (const auto& kv : base.as_dict().items) out.push_back(kv.second);
                return Value(std::move(out));
            });
        if (name == "get")
            return bound("get", [base](Args& a) {
                const Value k = a.need(0, "key", "get");
                const Value* v = k.is_string() ? base.as_dict().find(k.as_string()) : nullptr;
                return v ? *v : a.get(1, "default", kNone);
            });
        if (name == "update" || name == "pop" || name == "setdefault" || name == "clear" || name == "popitem")
            fail(line, "access to attribute '" + name + "' of 'dict' object is unsafe (templates cannot change values)");
        return Value();
    }
    if (base.is_list()) {
        if (name == "index" || name == "count")
            return bound("index", [base, name](Args& a) {
                const Value x = a.need(0, "value", name);
                int64_t n = 0;
                const List& l = base.as_list();
                for (size_t i = 0; i < l.size(); ++i) {
                    if (!equal(l[i], x)) continue;
                    if (name == "index") return Value(int64_t(i));
                    ++n;
                }
                if (name == "index") fail(a.line, "list.index(x): x not in list");
                return Value(n);
            });
        if (name == "append" || name == "extend" || name == "insert" || name == "pop" || name == "remove" ||
            name == "sort" || name == "reverse" || name == "clear")
            fail(line, "access to attribute '" + name + "' of 'list' object is unsafe (templates cannot change values)");
        return Value();
    }
    return Value();
}

int64_t length(const Value& v, int line) {
    switch (v.kind()) {
        case Value::Kind::Undefined: return 0;
        case Value::Kind::String: return int64_t(code_points(v.as_string()).size());
        case Value::Kind::List: return int64_t(v.as_list().size());
        case Value::Kind::Dict: return int64_t(v.as_dict().items.size());
        default: fail(line, "object of type '" + v.type_name() + "' has no len()");
    }
}

List items_of(const Value& v, int line) {
    switch (v.kind()) {
        case Value::Kind::Undefined: return {};
        case Value::Kind::List: return v.as_list();
        case Value::Kind::Dict: {
            List keys;
            for (const auto& kv : v.as_dict().items) keys.push_back(Value(kv.first));
            return keys;
        }
        case Value::Kind::String: {
            const std::vector<char32_t> cps = code_points(v.as_string());
            check_list_size(cps.size(), line);
            charge(cps.size() * sizeof(Value), line);
            List out;
            for (size_t i = 0; i < cps.size(); ++i) out.push_back(Value(utf8_of(cps, i, i + 1)));
            return out;
        }
        default: fail(line, "'" + v.type_name() + "' object is not iterable");
    }
}

Value slice(const Value& base, const Value& start_v, const Value& stop_v, const Value& step_v, int line) {
    if (!base.is_list() && !base.is_string()) fail(line, "cannot slice a " + base.type_name());
    auto given = [](const Value& v) { return !v.is_undefined() && !v.is_none(); };
    for (const Value* v : {&start_v, &stop_v, &step_v})
        if (given(*v) && !is_int(*v)) fail(line, "slice indices must be integers");
    const int64_t step = given(step_v) ? step_v.as_int() : 1;
    if (step == 0) fail(line, "slice step cannot be zero");
    std::vector<char32_t> cps;
    if (base.is_string()) cps = code_points(base.as_string());
    const int64_t n = base.is_list() ? int64_t(base.as_list().size()) : int64_t(cps.size());
    // Python's slice.indices().
    auto clamp = [&](const Value& v, int64_t def) {
        if (!given(v)) return def;
        int64_t i = v.as_int();
        if (i < 0) i += n;
        if (step > 0) return std::clamp<int64_t>(i, 0, n);
        return std::clamp<int64_t>(i, -1, n - 1);
    };
    const int64_t start = clamp(start_v, step > 0 ? 0 : n - 1), stop = clamp(stop_v, step > 0 ? n : -1);
    List out;
    std::vector<char32_t> chars;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
        if (base.is_list()) out.push_back(base.as_list()[size_t(i)]);
        else chars.push_back(cps[size_t(i)]);
    }
    if (base.is_string()) return Value(utf8_of(chars, 0, chars.size()));
    return Value(std::move(out));
}

}  // namespace tern::text::jinja::detail
