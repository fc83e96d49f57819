// The template engine's insides, shared by its lexer, parser, evaluator and
// built-ins (jinja_lex.cpp, jinja_parse.cpp, jinja_eval.cpp,
// jinja_builtins.cpp). Not a public header: jinja.h is the interface.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/jinja.h"
#include "text/jinja_value.h"

namespace tern::text::jinja {

namespace detail {
class Renderer;
}

// A call's arguments, for built-ins and macros (jinja_value.h's Function).
struct Args {
    std::vector<Value> pos;
    std::vector<std::pair<std::string, Value>> kw;
    detail::Renderer* renderer = nullptr;
    int line = 0;
    // Positional i, else keyword name, else null.
    const Value* find(size_t i, std::string_view name) const;
    // find's value, else def.
    Value get(size_t i, std::string_view name, const Value& def) const;
    // find's value; fails when neither was given.
    Value need(size_t i, std::string_view name, std::string_view what) const;
    // Python refuses a keyword argument a function does not take: find
    // records the keywords a builtin read, and refuse_unused fails naming
    // one it did not (`what` names the builtin). mark_all_used: the builtin
    // took them all (dict(), or handed them on).
    void mark_all_used() const { kw_used.assign(kw.size(), true); }
    void refuse_unused(std::string_view what) const;

private:
    mutable std::vector<bool> kw_used;
};

}  // namespace tern::text::jinja

namespace tern::text::jinja::detail {

// Thrown inside the engine and turned into an Error at its interface.
struct TemplateError {
    std::string message;
    int line = 0;  // 0: not tied to a line
};
[[noreturn]] void fail(int line, std::string message);

// Whether an int64 holds the integer x (exact arithmetic, or a float already
// truncated): the one range every integer result is checked against. Bounds
// of +-2^63 are exact in every long double format.
inline bool fits_int64(long double x) { return x >= -0x1p63L && x < 0x1p63L; }

// The largest string (bytes) and list (items) a template may build: growth
// by concatenation, repetition or padding stops with an error here, long
// before memory runs out.
constexpr size_t kMaxStringBytes = size_t(1) << 26;
constexpr size_t kMaxListItems = size_t(1) << 20;
void check_string_size(size_t bytes, int line);
void check_list_size(size_t items, int line);

// The bytes of strings and lists a render has built, against
// RenderLimits::max_built_bytes: charged where values grow (concatenation,
// repetition, join, replace, padding, range). The renderer on this thread
// owns the count.
struct BuildBudget {
    size_t used = 0, limit = 0;
};
void charge(size_t bytes, int line);

// ---- tokens -----------------------------------------------------------------------

enum class Tok { Text, VarBegin, VarEnd, BlockBegin, BlockEnd, Name, String, Int, Float, Op, End };

struct Token {
    Tok kind = Tok::End;
    std::string text;  // Text: the text after whitespace control; Name, Op: the spelling; String: the value
    int64_t i = 0;
    double f = 0.0;
    int line = 1;
};

// The source as tokens, with trim_blocks and lstrip_blocks applied as
// Hugging Face configures Jinja2, and "-" / "+" whitespace control; raw
// blocks become text. Comments are dropped.
std::vector<Token> lex(std::string_view source);

// ---- syntax tree ------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
    enum class Kind {
        Literal,  // value
        Name,     // name
        List, Tuple,
        Dict,     // args: key, value, key, value, ...
        Attr,     // args[0] . name
        Item,     // args[0] [ args[1] ]
        Slice,    // args[0] [ args[1] : args[2] : args[3] ] (null parts left out)
        Call,     // args[0] ( args[1..], kwargs )
        Filter,   // args[0] | name ( args[1..], kwargs ); args[0] null inside a filter block
        Test,     // args[0] is [not] name ( args[1..] )
        Neg, Pos, Not,
        Binary,   // args[0] name args[1]: + - * / // % ** ~
        And, Or,
        Compare,  // args[0] ops[0] args[1] ops[1] args[2] ...: == != < <= > >= in notin
        Cond,     // args[1] if args[0] else args[2] (args[2] may be null)
    };
    Kind kind = Kind::Literal;
    int line = 0;
    Value value;
    std::string name;
    std::vector<ExprPtr> args;
    std::vector<std::pair<std::string, ExprPtr>> kwargs;
    std::vector<std::string> ops;
    bool negated = false;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
    enum class Kind {
        Text,        // text
        Output,      // {{ expr }}
        If,          // branches: (condition, body); an else has a null condition
        For,         // for targets in expr [if filter]: body [else else_body]
        Set,         // set targets = expr; with attr: set targets[0].attr = expr
        SetBlock,    // set targets[0] %} body {% endset
        Macro,       // macro name(params) body
        FilterBlock, // filter expr (a Filter chain over a null base) body
        Break, Continue,
        Scope,       // a block that only renders its body (generation)
    };
    Kind kind = Kind::Text;
    int line = 0;
    std::string text, name, attr;
    ExprPtr expr, filter;
    std::vector<std::pair<ExprPtr, Body>> branches;
    std::vector<std::string> targets;
    std::vector<std::pair<std::string, ExprPtr>> params;  // a macro's (name, default or null)
    Body body, else_body;
};

// Parses the whole template; errors name the line.
Body parse(std::vector<Token> tokens);

// ---- evaluation -------------------------------------------------------------------

class Renderer {
public:
    Renderer(const Dict& vars, const RenderOptions& options);
    ~Renderer();
    Renderer(const Renderer&) = delete;
    Renderer& operator=(const Renderer&) = delete;
    std::string render(const Body& program);

    // For the built-ins.
    Value call(const Value& fn, Args& args, int line);
    Value apply_filter(const std::string& name, const Value& base, Args& args, int line);
    bool apply_test(const std::string& name, const Value& v, Args& args, int line);
    const RenderOptions& options() const { return options_; }
    void step(int line);

private:
    enum class Flow { Normal, Break, Continue };
    Flow exec(const Body& body, std::string& out);
    Flow exec(const Stmt& s, std::string& out);
    void exec_for(const Stmt& s, std::string& out);
    Value eval(const Expr& e);
    Value eval_attr(const Value& base, const std::string& name, int line);
    Value eval_item(const Value& base, const Value& key, int line);
    Value eval_binary(const std::string& op, const Value& a, const Value& b, int line);
    bool eval_compare(const std::string& op, const Value& a, const Value& b, int line);
    Value lookup(const std::string& name) const;
    void assign(const std::string& name, Value v);
    void assign_targets(const std::vector<std::string>& targets, const Value& v, int line);
    Value make_macro(const Stmt& s);
    void emit(std::string& out, std::string_view text, int line);

    RenderOptions options_;
    std::vector<std::unordered_map<std::string, Value>> scopes_;
    std::unordered_map<std::string, Value> globals_;
    int64_t steps_ = 0;
    int depth_ = 0;
    BuildBudget budget_;
    BuildBudget* outer_budget_ = nullptr;
    size_t emitted_ = 0;
    std::chrono::steady_clock::time_point deadline_;
    friend struct DepthGuard;
};

// The built-in filters, tests, globals and methods (jinja_builtins.cpp).
bool has_filter(const std::string& name);
bool has_test(const std::string& name);
Value filter(const std::string& name, const Value& base, Args& args);
bool test(const std::string& name, const Value& v, Args& args);
std::unordered_map<std::string, Value> globals();
// base.name for a str, list or dict method (bound to base), or undefined.
Value method(const Value& base, const std::string& name, int line);

// Python's slice of a str or list (missing parts undefined or none).
Value slice(const Value& base, const Value& start, const Value& stop, const Value& step, int line);
// Python's len() and iteration (dicts give their keys, strings their characters).
int64_t length(const Value& v, int line);
List items_of(const Value& v, int line);

}  // namespace tern::text::jinja::detail
