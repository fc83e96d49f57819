#include "runtime/json_schema.h"

#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <utility>
#include <vector>

namespace tern::runtime {
namespace {

using text::jinja::Dict;
using text::jinja::List;
using text::jinja::Value;

// Whitespace between tokens: none, a space, or a newline and an indent (the
// ways models lay JSON out), bounded so that a grammar cannot be held open
// by whitespace alone.
const char* kBasics = R"(ws ::= | " " | "\n" [ \t]{0,40}
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\"" ws
integer ::= "-"? ("0" | [1-9] [0-9]{0,15}) ws
number ::= "-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})? ws
boolean ::= ("true" | "false") ws
null ::= "null" ws
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ":" ws value ("," ws string ":" ws value)*)? "}" ws
array ::= "[" ws (value ("," ws value)*)? "]" ws
)";

// RFC 3339 (JSON Schema's date, time and date-time): days per month, February
// to 28 (the 29th would need the year); time with its offset.
const char* kFormats = R"(format-date ::= [0-9]{4} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) | ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02" "-" ("0" [1-9] | "1" [0-9] | "2" [0-8]))
format-time ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
format-uuid ::= [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}
)";

// A GBNF literal for these bytes.
std::string literal(std::string_view s) {
    std::string out = "\"";
    for (const char ch : s) {
        const unsigned char c = uint8_t(ch);
        if (c == '"' || c == '\\') {
            out += '\\';
            out += char(c);
        } else if (c == '\n') {
            out += "\\n";
        } else if (c == '\r') {
            out += "\\r";
        } else if (c == '\t') {
            out += "\\t";
        } else if (c < 0x20 || c == 0x7F) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\x%02X", c);
            out += buf;
        } else {
            out += char(c);
        }
    }
    return out + "\"";
}

class Compiler {
public:
    Compiler(const Value& root, std::string prefix) : root_(root), prefix_(std::move(prefix)) {}

    // The rule `name` and the rules it uses (their names start with prefix),
    // without the basic rules.
    Result<std::string> run(const std::string& name) {
        std::string body;
        if (!compile(root_, "$", body)) return Error{"json schema: " + error_};
        std::string out = name + " ::= " + body + "\n";
        for (const auto& [rule_name, rule] : rules_) out += rule_name + " ::= " + rule + "\n";
        return out;
    }
    bool uses_formats() const { return formats_; }

private:
    bool fail(const std::string& path, const std::string& what) {
        if (error_.empty()) error_ = what + " (at " + path + ")";
        return false;
    }

    // A new rule for body; its name.
    std::string rule(const std::string& hint, std::string body) {
        const std::string name = fresh(hint);
        rules_[name] = std::move(body);
        return name;
    }
    std::string fresh(const std::string& hint) {
        std::string base;
        for (const char c : hint) base += (std::isalnum(uint8_t(c)) ? c : '-');
        if (base.empty() || !std::isalpha(uint8_t(base[0]))) base = "s-" + base;
        if (base.size() > 40) base.resize(40);
        return prefix_ + base + "-" + std::to_string(++counter_);
    }

    static const Value* field(const Dict& d, const char* key) {
        const Value* v = d.find(key);
        return v && !v->is_undefined() ? v : nullptr;
    }

    bool count(const Dict& d, const char* key, const std::string& path, int64_t& out) {
        const Value* v = field(d, key);
        if (!v) return true;
        if (v->kind() != Value::Kind::Int || v->as_int() < 0 || v->as_int() > 100000)
            return fail(path, std::string("'") + key + "' must be a whole number from 0 to 100000");
        out = v->as_int();
        return true;
    }

    // x repeated lo..hi times (hi < 0: no bound), as GBNF.
    static std::string times(const std::string& x, int64_t lo, int64_t hi) {
        if (lo == 0 && hi < 0) return "(" + x + ")*";
        if (lo == 1 && hi < 0) return "(" + x + ")+";
        return "(" + x + "){" + std::to_string(lo) + "," + (hi < 0 ? std::string() : std::to_string(hi)) + "}";
    }

    bool compile(const Value& schema, const std::string& path, std::string& out) {
        if (++depth_ > 64) return fail(path, "the schema nests deeper than 64 levels");
        const bool ok = compile_inner(schema, path, out);
        --depth_;
        return ok;
    }

    bool compile_inner(const Value& schema, const std::string& path, std::string& out) {
        if (schema.kind() == Value::Kind::Bool) {
            if (!schema.as_bool()) return fail(path, "the schema 'false' admits no value");
            out = "value";
            return true;
        }
        if (!schema.is_dict()) return fail(path, "a schema must be an object or a boolean, not " + schema.type_name());
        const Dict& d = schema.as_dict();
        static const std::set<std::string> kKnown = {
            "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
            "maxItems", "enum", "const", "anyOf", "allOf", "$ref", "$defs", "definitions", "minLength",
            "maxLength", "format", "title", "description", "default", "examples", "$schema", "$id", "$comment"};
        for (const auto& [key, v] : d.items)
            if (!kKnown.count(key)) return fail(path, "'" + key + "' is not supported");

        if (const Value* ref = field(d, "$ref")) return compile_ref(*ref, path, out);
        if (const Value* c = field(d, "const")) return const_literal(*c, path, out);
        if (const Value* e = field(d, "enum")) {
            if (!e->is_list() || e->as_list().empty()) return fail(path + ".enum", "'enum' must be a non-empty array");
            std::string alts;
            for (size_t i = 0; i < e->as_list().size(); ++i) {
                std::string lit;
                if (!const_literal(e->as_list()[i], path + ".enum[" + std::to_string(i) + "]", lit)) return false;
                alts += (i ? " | " : "") + lit;
            }
            out = "(" + alts + ")";
            return true;
        }
        if (const Value* any = field(d, "anyOf")) {
            if (!any->is_list() || any->as_list().empty()) return fail(path + ".anyOf", "'anyOf' must be a non-empty array");
            std::string alts;
            for (size_t i = 0; i < any->as_list().size(); ++i) {
                std::string alt;
                if (!compile(merged_with_siblings(any->as_list()[i], d, "anyOf"), path + ".anyOf[" + std::to_string(i) + "]", alt))
                    return false;
                alts += (i ? " | " : "") + alt;
            }
            out = rule(path + "-any", alts);
            return true;
        }
        if (const Value* all = field(d, "allOf")) {
            if (!all->is_list() || all->as_list().size() != 1)
                return fail(path + ".allOf", "'allOf' is supported with one schema only");
            return compile(merged_with_siblings(all->as_list()[0], d, "allOf"), path + ".allOf[0]", out);
        }

        std::vector<std::string> types;
        if (const Value* t = field(d, "type")) {
            if (t->is_string()) {
                types.push_back(t->as_string());
            } else if (t->is_list() && !t->as_list().empty()) {
                for (const Value& x : t->as_list()) {
                    if (!x.is_string()) return fail(path + ".type", "'type' must be a string or an array of strings");
                    types.push_back(x.as_string());
                }
            } else {
                return fail(path + ".type", "'type' must be a string or an array of strings");
            }
        } else if (field(d, "properties") || field(d, "additionalProperties") || field(d, "required")) {
            types.push_back("object");
        } else if (field(d, "items") || field(d, "prefixItems")) {
            types.push_back("array");
        } else {
            out = "value";  // no constraint on the type
            return true;
        }
        std::string alts;
        for (size_t i = 0; i < types.size(); ++i) {
            std::string alt;
            if (!compile_type(types[i], d, path, alt)) return false;
            alts += (i ? " | " : "") + alt;
        }
        out = types.size() == 1 ? alts : "(" + alts + ")";
        return true;
    }

    // anyOf / allOf branches inherit the sibling keywords of their parent
    // (a "type" beside an anyOf applies to every branch).
    static Value merged_with_siblings(const Value& branch, const Dict& parent, const char* skip) {
        if (!branch.is_dict()) return branch;
        Dict d = branch.as_dict();
        for (const auto& [key, v] : parent.items)
            if (key != skip && key != "$defs" && key != "definitions" && !d.find(key)) d.set(key, v);
        return Value(std::move(d));
    }

    bool const_literal(const Value& v, const std::string& path, std::string& out) {
        bool ok = true;
        const std::string json = text::jinja::to_json(v, -1, false, ok);
        if (!ok) return fail(path, "the value is not JSON");
        out = "(" + literal(json) + " ws)";
        return true;
    }

    bool compile_ref(const Value& ref, const std::string& path, std::string& out) {
        if (!ref.is_string()) return fail(path + ".$ref", "'$ref' must be a string");
        const std::string& r = ref.as_string();
        if (auto it = refs_.find(r); it != refs_.end()) {
            if (unguarded_.count(r))
                return fail(path + ".$ref", "'$ref' " + r +
                                                " leads back to itself before any character of the value is read, "
                                                "which no grammar can express");
            out = it->second;
            return true;
        }
        const Value* target = nullptr;
        if (r == "#") {
            target = &root_;
        } else {
            for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
                const std::string p = prefix;
                if (r.compare(0, p.size(), p) != 0) continue;
                const std::string section = p.substr(2, p.size() - 3);
                if (!root_.is_dict()) break;
                const Value* defs = root_.as_dict().find(section);
                if (defs && defs->is_dict()) target = defs->as_dict().find(r.substr(p.size()));
            }
        }
        if (!target || target->is_undefined())
            return fail(path + ".$ref", "'$ref' " + r + " does not name a schema under #/$defs or #/definitions");
        const std::string name = fresh("ref-" + r.substr(r.rfind('/') + 1));
        refs_[r] = name;  // before compiling: a recursive reference finds it
        unguarded_.insert(r);
        std::string body;
        if (!compile(*target, r, body)) return false;
        unguarded_.erase(r);
        rules_[name] = body;
        out = name;
        return true;
    }

    bool compile_type(const std::string& type, const Dict& d, const std::string& path, std::string& out) {
        if (type == "null" || type == "boolean" || type == "integer" || type == "number") {
            out = type;
            return true;
        }
        if (type == "string") return compile_string(d, path, out);
        if (type == "array" || type == "object") {
            // Their values open with '[' or '{', so a reference met inside
            // them may lead back to one being compiled: the grammar reads a
            // character before it recurs.
            std::set<std::string> outer = std::exchange(unguarded_, {});
            const bool ok = type == "array" ? compile_array(d, path, out) : compile_object(d, path, out);
            unguarded_ = std::move(outer);
            return ok;
        }
        return fail(path + ".type", "unknown type '" + type + "'");
    }

    bool compile_string(const Dict& d, const std::string& path, std::string& out) {
        if (const Value* f = field(d, "format")) {
            const std::string fmt = f->is_string() ? f->as_string() : std::string();
            formats_ = true;
            if (fmt == "date") out = "(\"\\\"\" format-date \"\\\"\" ws)";
            else if (fmt == "time") out = "(\"\\\"\" format-time \"\\\"\" ws)";
            else if (fmt == "date-time") out = "(\"\\\"\" format-date \"T\" format-time \"\\\"\" ws)";
            else if (fmt == "uuid") out = "(\"\\\"\" format-uuid \"\\\"\" ws)";
            else return fail(path + ".format", "format '" + fmt + "' is not supported (date, time, date-time, uuid are)");
            if (field(d, "minLength") || field(d, "maxLength"))
                return fail(path, "minLength and maxLength beside a format are not supported");
            return true;
        }
        int64_t lo = 0, hi = -1;
        if (!count(d, "minLength", path, lo) || !count(d, "maxLength", path, hi)) return false;
        if (hi >= 0 && hi < lo) return fail(path, "maxLength is below minLength");
        if (lo == 0 && hi < 0) {
            out = "string";
            return true;
        }
        out = "(\"\\\"\" " + times("char", lo, hi) + " \"\\\"\" ws)";
        return true;
    }

    bool compile_array(const Dict& d, const std::string& path, std::string& out) {
        int64_t lo = 0, hi = -1;
        if (!count(d, "minItems", path, lo) || !count(d, "maxItems", path, hi)) return false;
        if (hi >= 0 && hi < lo) return fail(path, "maxItems is below minItems");
        std::vector<std::string> prefix;
        if (const Value* p = field(d, "prefixItems")) {
            if (!p->is_list()) return fail(path + ".prefixItems", "'prefixItems' must be an array");
            for (size_t i = 0; i < p->as_list().size(); ++i) {
                std::string x;
                if (!compile(p->as_list()[i], path + ".prefixItems[" + std::to_string(i) + "]", x)) return false;
                prefix.push_back(x);
            }
        }
        std::string item = "value";
        bool more = true;  // items after the prefix
        if (const Value* it = field(d, "items")) {
            if (it->kind() == Value::Kind::Bool && !it->as_bool()) {
                more = false;
            } else if (!compile(*it, path + ".items", item)) {
                return false;
            }
        }
        const int64_t n = int64_t(prefix.size());
        const int64_t most = more ? hi : (hi < 0 ? n : std::min(hi, n));  // -1: no bound
        if (most >= 0 && lo > most) return fail(path, "minItems is above the items the schema allows");
        // Item k of the array (k >= 1 after a comma): the k-th prefix schema,
        // then the items schema. The first lo are required; each later one
        // is optional and opens the next.
        auto nth = [&](int64_t k) { return (k ? std::string("\",\" ws ") : std::string()) + (k < n ? prefix[size_t(k)] : item); };
        std::string body;
        for (int64_t k = 0; k < lo && k < std::max(n, lo); ++k) body += nth(k) + " ";
        // Optional ones: the rest of the prefix one by one, then the items.
        std::string tail;
        const int64_t from = lo;
        const int64_t prefix_end = most < 0 ? n : std::min(n, most);
        if (from < prefix_end || (more && (most < 0 || most > std::max(from, n)))) {
            // Innermost first: the items past the prefix, then the prefix backwards.
            const int64_t start = std::max(from, n);
            if (more && (most < 0 || most > start)) {
                const std::string rest = "\",\" ws " + item;
                if (start == 0)
                    tail = "(" + item + " " + times(rest, 0, most < 0 ? -1 : most - 1) + ")?";
                else
                    tail = times(rest, 0, most < 0 ? -1 : most - start);
            }
            for (int64_t k = prefix_end - 1; k >= from; --k) tail = "(" + nth(k) + (tail.empty() ? "" : " " + tail) + ")?";
        }
        out = rule(path + "-array", "\"[\" ws " + body + tail + " \"]\" ws");
        return true;
    }

    bool compile_object(const Dict& d, const std::string& path, std::string& out) {
        std::vector<std::pair<std::string, std::string>> props;  // key literal + value, in schema order
        std::set<std::string> required;
        if (const Value* r = field(d, "required")) {
            if (!r->is_list()) return fail(path + ".required", "'required' must be an array of strings");
            for (const Value& k : r->as_list()) {
                if (!k.is_string()) return fail(path + ".required", "'required' must be an array of strings");
                required.insert(k.as_string());
            }
        }
        std::vector<bool> is_required;
        if (const Value* p = field(d, "properties")) {
            if (!p->is_dict()) return fail(path + ".properties", "'properties' must be an object");
            for (const auto& [key, sub] : p->as_dict().items) {
                std::string v;
                if (!compile(sub, path + ".properties." + key, v)) return false;
                bool ok = true;
                props.emplace_back(literal(text::jinja::to_json(Value(key), -1, false, ok)) + " ws \":\" ws " + v, key);
                is_required.push_back(required.count(key) > 0);
            }
        }
        for (const std::string& k : required) {
            bool named = false;
            for (const auto& p : props) named = named || p.second == k;
            if (!named) return fail(path + ".required", "required property '" + k + "' has no schema in 'properties'");
        }
        std::string extra;  // an additional key and value, when allowed
        if (const Value* a = field(d, "additionalProperties")) {
            std::string v = "value";
            if (a->kind() != Value::Kind::Bool && !compile(*a, path + ".additionalProperties", v)) return false;
            if (a->kind() != Value::Kind::Bool || a->as_bool()) {
                std::vector<std::string> named;
                for (const auto& p : props) named.push_back(p.second);
                extra = other_key(named, path) + " \":\" ws " + v;
            }
        }
        // after[i]: properties i.. once something came before (each with its
        // comma); first[i]: the same when nothing has yet.
        const size_t n = props.size();
        std::vector<std::string> after(n + 1), first(n + 1);
        after[n] = extra.empty() ? "" : "(\",\" ws " + extra + ")*";
        first[n] = extra.empty() ? "" : "(" + extra + " (\",\" ws " + extra + ")*)?";
        for (size_t i = n; i-- > 0;) {
            const std::string kv = props[i].first;
            after[i] = (is_required[i] ? "\",\" ws " + kv : "(\",\" ws " + kv + ")?") + " " + after[i + 1];
            const std::string tail = after[i + 1].empty() ? "" : " " + rule(path + "-after", after[i + 1]);
            if (is_required[i]) {
                first[i] = kv + tail;
            } else {
                const std::string skip = first[i + 1].empty() ? "\"\"" : rule(path + "-from", first[i + 1]);
                first[i] = kv + tail + " | " + skip;
            }
        }
        std::string body = "\"{\" ws ";
        if (!first[0].empty()) body += "(" + first[0] + ") ";
        out = rule(path + "-object", body + "\"}\" ws");
        return true;
    }

    // A JSON string that is none of these keys (an additional property
    // must not repeat a named one): the keys' characters as a trie, and at
    // each node the ways to leave it (another character, or the end where no
    // key ends). A key written with escapes (\u0061 for a) is not compared.
    std::string other_key(const std::vector<std::string>& keys, const std::string& path) {
        if (keys.empty()) return "string";
        struct Node {
            std::map<char32_t, size_t> next;
            bool key_ends = false;
        };
        std::vector<Node> trie(1);
        for (const std::string& k : keys) {
            size_t at = 0;
            for (char32_t c : text::jinja::code_points(k)) {
                auto it = trie[at].next.find(c);
                if (it == trie[at].next.end()) {
                    trie.push_back({});
                    it = trie[at].next.emplace(c, trie.size() - 1).first;
                }
                at = it->second;
            }
            trie[at].key_ends = true;
        }
        std::vector<std::string> names(trie.size());
        for (size_t i = 0; i < trie.size(); ++i) names[i] = fresh(path + "-key");
        for (size_t i = 0; i < trie.size(); ++i) {
            std::string cls = "[^\"\\\\\\x7F\\x00-\\x1F";
            std::string alts;
            for (const auto& [c, child] : trie[i].next) {
                // A quote, backslash or control character is written escaped:
                // the class leaves it out already, the escape branch takes it.
                if (c < 0x20 || c == '"' || c == '\\' || c == 0x7F) continue;
                const std::string one = text::jinja::utf8_of({c}, 0, 1);
                if (c == ']' || c == '-' || c == '^') cls += "\\";
                cls += one;
                alts += " | " + literal(one) + " " + names[child];
            }
            std::string body = cls + "] char* \"\\\"\" | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) char* \"\\\"\"" + alts;
            if (!trie[i].key_ends) body += " | \"\\\"\"";
            rules_[names[i]] = body;
        }
        return "(\"\\\"\" " + names[0] + " ws)";
    }

    const Value& root_;
    std::string prefix_;
    std::map<std::string, std::string> rules_;
    std::map<std::string, std::string> refs_;
    std::set<std::string> unguarded_;  // references being compiled, no character read since they began
    std::string error_;
    int counter_ = 0, depth_ = 0;
    bool formats_ = false;
};

}  // namespace

Result<std::string> json_schema_rules(const text::jinja::Value& schema, const std::string& name) {
    return Compiler(schema, name + "-").run(name);
}

std::string json_schema_basics() { return std::string(kBasics) + kFormats; }

Result<std::string> json_schema_to_gbnf(const text::jinja::Value& schema) {
    Compiler c(schema, "");
    auto rules = c.run("root");
    if (!rules.ok()) return rules;
    return *rules + kBasics + (c.uses_formats() ? kFormats : "");
}

std::string json_object_gbnf() { return std::string("root ::= object\n") + kBasics; }

}  // namespace tern::runtime
