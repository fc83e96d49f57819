// The values a chat template computes with, with Python's semantics where a
// template can see them (Jinja2 runs on Python): truthiness, equality and
// ordering, str() and repr() text, and json.dumps() for the tojson filter.
// Lists and dicts are shared by reference, as Python's are; the template
// engine never mutates one it did not create (Hugging Face renders templates
// in an immutable sandbox), so sharing is safe. Dict keys are strings, in
// insertion order (the JSON a request carries).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tern::text::jinja {

class Value;
using List = std::vector<Value>;

struct Dict {
    std::vector<std::pair<std::string, Value>> items;
    const Value* find(std::string_view key) const;
    Value* find(std::string_view key);
    void set(std::string key, Value v);  // replaces in place, else appends
};

// A callable (a macro, a global such as range(), a bound string method).
struct Args;
using Function = std::function<Value(Args&)>;

class Value {
public:
    enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Function };

    Value() = default;  // undefined
    static Value none();
    Value(bool b);
    Value(int v) : Value(int64_t(v)) {}
    Value(int64_t v);
    Value(double v);
    Value(std::string s);
    Value(const char* s) : Value(std::string(s)) {}
    Value(List l);
    Value(Dict d);
    // A tuple: a list that Python prints in parentheses (items(), (a, b)).
    static Value tuple(List l);
    static Value function(std::string name, Function f);
    // A namespace(): a dict whose attributes `{% set ns.x = ... %}` may assign.
    static Value namespace_of(Dict d);

    Kind kind() const { return kind_; }
    bool is_undefined() const { return kind_ == Kind::Undefined; }
    bool is_none() const { return kind_ == Kind::None; }
    bool is_number() const { return kind_ == Kind::Int || kind_ == Kind::Float || kind_ == Kind::Bool; }
    bool is_string() const { return kind_ == Kind::String; }
    bool is_list() const { return kind_ == Kind::List; }
    bool is_dict() const { return kind_ == Kind::Dict; }
    bool is_function() const { return kind_ == Kind::Function; }
    bool is_namespace() const { return kind_ == Kind::Dict && namespace_; }
    bool is_tuple() const { return kind_ == Kind::List && tuple_; }

    bool as_bool() const { return b_; }
    int64_t as_int() const { return kind_ == Kind::Bool ? int64_t(b_) : i_; }
    double as_float() const { return kind_ == Kind::Float ? f_ : double(as_int()); }
    const std::string& as_string() const { return *static_cast<const std::string*>(p_.get()); }
    const List& as_list() const { return *static_cast<const List*>(p_.get()); }
    const Dict& as_dict() const { return *static_cast<const Dict*>(p_.get()); }
    // Namespaces and the engine's own loop objects only: the engine checks.
    Dict& mutable_dict() const { return *const_cast<Dict*>(static_cast<const Dict*>(p_.get())); }
    const std::string& function_name() const { return static_cast<const Named*>(p_.get())->name; }
    const Function& as_function() const { return static_cast<const Named*>(p_.get())->fn; }

    // Python's bool(x); undefined is false.
    bool truthy() const;
    // Python's str(x) (undefined: ""), and repr(x).
    std::string str() const;
    std::string repr() const;
    // The name Python gives the type, for errors ("str", "list", "dict", ...).
    std::string type_name() const;

private:
    struct Named {
        std::string name;
        Function fn;
    };
    // 32 bytes: templates build lists of a million values (range()).
    Kind kind_ = Kind::Undefined;
    bool namespace_ = false, tuple_ = false;
    union {
        bool b_;
        int64_t i_ = 0;
        double f_;
    };
    std::shared_ptr<const void> p_;  // the string, list, dict or function
};

// Python's ==, and the ordering of <, for numbers, strings and lists; false
// from less() with ok = false when Python would raise (mixed kinds).
bool equal(const Value& a, const Value& b);
bool less(const Value& a, const Value& b, bool& ok);

// Python's repr() of a float: the shortest text that reads back as the same
// double, "1.0" for whole numbers, exponent form outside 1e-4 .. 1e16.
std::string float_repr(double v);

// json.dumps(v, ensure_ascii=False, indent=indent, sort_keys=sort_keys):
// indent < 0 for none (", " and ": " separators). Undefined and functions
// are not JSON: ok = false.
std::string to_json(const Value& v, int indent, bool sort_keys, bool& ok);

// UTF-8 text as code points (invalid bytes become U+FFFD), and code points
// from..to back to UTF-8: Python indexes, slices and counts strings by code
// point.
std::vector<char32_t> code_points(std::string_view s);
std::string utf8_of(const std::vector<char32_t>& cps, size_t from, size_t to);

}  // namespace tern::text::jinja
