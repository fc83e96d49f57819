// The template evaluator: statements write text, expressions compute values
// with Python's semantics (jinja_value.h). Scoping follows Jinja2: a for
// loop's body and a macro call get their own scope (a set inside a loop
// does not leak out of it; namespace() objects are how templates carry
// state across iterations); if blocks do not. Every statement and
// expression counts a step against the limits.
#include <cmath>
#include <limits>

#include "text/jinja_internal.h"

namespace tern::text::jinja {

const Value* Args::find(size_t i, std::string_view name) const {
    if (i < pos.size()) return &pos[i];
    for (size_t j = 0; j < kw.size(); ++j)
        if (kw[j].first == name) {
            if (kw_used.size() < kw.size()) kw_used.resize(kw.size(), false);
            kw_used[j] = true;
            return &kw[j].second;
        }
    return nullptr;
}

void Args::refuse_unused(std::string_view what) const {
    for (size_t j = 0; j < kw.size(); ++j)
        if (j >= kw_used.size() || !kw_used[j])
            detail::fail(line, std::string(what) + ": unexpected keyword argument '" + kw[j].first + "'");
}

Value Args::get(size_t i, std::string_view name, const Value& def) const {
    const Value* v = find(i, name);
    return v ? *v : def;
}

Value Args::need(size_t i, std::string_view name, std::string_view what) const {
    const Value* v = find(i, name);
    if (!v) detail::fail(line, std::string(what) + ": missing argument '" + std::string(name) + "'");
    return *v;
}

}  // namespace tern::text::jinja

namespace tern::text::jinja::detail {

struct DepthGuard {
    Renderer& r;
    DepthGuard(Renderer& renderer, int line) : r(renderer) {
        if (++r.depth_ > r.options_.limits.max_depth)
            fail(line, "the template nests deeper than " + std::to_string(r.options_.limits.max_depth) + " levels");
    }
    ~DepthGuard() { --r.depth_; }
};

namespace {
thread_local BuildBudget* tl_budget = nullptr;
}  // namespace

void charge(size_t bytes, int line) {
    if (!tl_budget) return;
    tl_budget->used += bytes;
    if (tl_budget->used > tl_budget->limit)
        fail(line, "the template built more than " + std::to_string(tl_budget->limit) + " bytes of values");
}

Renderer::~Renderer() { tl_budget = outer_budget_; }

Renderer::Renderer(const Dict& vars, const RenderOptions& options) : options_(options) {
    budget_.limit = options.limits.max_built_bytes;
    outer_budget_ = tl_budget;
    tl_budget = &budget_;
    globals_ = globals();
    scopes_.emplace_back();
    for (const auto& [k, v] : vars.items) scopes_[0][k] = v;
    deadline_ = std::chrono::steady_clock::now() +
                std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                    std::chrono::duration<double>(options.limits.max_seconds));
}

std::string Renderer::render(const Body& program) {
    std::string out;
    exec(program, out);
    return out;
}

void Renderer::step(int line) {
    if (++steps_ > options_.limits.max_steps)
        fail(line, "the template ran past its limit of " + std::to_string(options_.limits.max_steps) + " steps");
    if ((steps_ & 1023) == 0 && std::chrono::steady_clock::now() > deadline_)
        fail(line, "the template ran past its time limit");
}

void Renderer::emit(std::string& out, std::string_view text, int line) {
    emitted_ += text.size();
    if (emitted_ > options_.limits.max_output_bytes)
        fail(line, "the template's output passed its limit of " + std::to_string(options_.limits.max_output_bytes) +
                       " bytes");
    out += text;
}

// ---- statements -----------------------------------------------------------------

Renderer::Flow Renderer::exec(const Body& body, std::string& out) {
    for (const StmtPtr& s : body) {
        const Flow f = exec(*s, out);
        if (f != Flow::Normal) return f;
    }
    return Flow::Normal;
}

Renderer::Flow Renderer::exec(const Stmt& s, std::string& out) {
    step(s.line);
    DepthGuard guard(*this, s.line);
    switch (s.kind) {
        case Stmt::Kind::Text: emit(out, s.text, s.line); break;
        case Stmt::Kind::Output: emit(out, eval(*s.expr).str(), s.line); break;
        case Stmt::Kind::If:
            for (const auto& [cond, body] : s.branches)
                if (!cond || eval(*cond).truthy()) return exec(body, out);
            break;
        case Stmt::Kind::For: exec_for(s, out); break;
        case Stmt::Kind::Set: {
            Value v = eval(*s.expr);
            if (s.attr.empty()) {
                assign_targets(s.targets, v, s.line);
                break;
            }
            const Value ns = lookup(s.targets[0]);
            if (!ns.is_namespace())
                fail(s.line, "cannot assign attribute '" + s.attr + "' of '" + s.targets[0] +
                                 "': only a namespace() takes attributes");
            ns.mutable_dict().set(s.attr, std::move(v));
            break;
        }
        case Stmt::Kind::SetBlock: {
            std::string captured;  // bounded by the output limit (emit counts it)
            exec(s.body, captured);
            assign(s.targets[0], Value(std::move(captured)));
            break;
        }
        case Stmt::Kind::Macro: assign(s.name, make_macro(s)); break;
        case Stmt::Kind::FilterBlock: {
            std::string captured;
            exec(s.body, captured);
            // The chain's innermost base is null: the captured text.
            std::vector<const Expr*> chain;
            for (const Expr* e = s.expr.get(); e; e = e->args[0].get()) chain.push_back(e);
            Value v(std::move(captured));
            for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
                Args a;
                for (size_t i = 1; i < (*it)->args.size(); ++i) a.pos.push_back(eval(*(*it)->args[i]));
                for (const auto& [k, e] : (*it)->kwargs) a.kw.emplace_back(k, eval(*e));
                v = apply_filter((*it)->name, v, a, (*it)->line);
            }
            emit(out, v.str(), s.line);
            break;
        }
        case Stmt::Kind::Break: return Flow::Break;
        case Stmt::Kind::Continue: return Flow::Continue;
        case Stmt::Kind::Scope: return exec(s.body, out);
    }
    return Flow::Normal;
}

namespace {
struct ScopeGuard {
    std::vector<std::unordered_map<std::string, Value>>& scopes;
    explicit ScopeGuard(std::vector<std::unordered_map<std::string, Value>>& s) : scopes(s) { scopes.emplace_back(); }
    ~ScopeGuard() { scopes.pop_back(); }
};
}  // namespace

void Renderer::exec_for(const Stmt& s, std::string& out) {
    const Value seq = eval(*s.expr);
    if (seq.is_none() || seq.is_number() || seq.is_function())
        fail(s.line, "'" + seq.type_name() + "' object is not iterable");
    // A list is walked in place; anything else (and a filtered loop) as a list.
    List made;
    const List* items = &made;
    if (seq.is_list()) items = &seq.as_list();
    else made = items_of(seq, s.line);
    if (s.filter) {
        List kept;
        for (const Value& v : *items) {
            step(s.line);
            ScopeGuard scope(scopes_);
            assign_targets(s.targets, v, s.line);
            if (eval(*s.filter).truthy()) kept.push_back(v);
        }
        made = std::move(kept);
        items = &made;
    }
    if (items->empty()) {
        ScopeGuard scope(scopes_);
        exec(s.else_body, out);
        return;
    }
    // One loop object, updated in place each iteration (as Jinja2's is).
    const int64_t n = int64_t(items->size());
    auto index = std::make_shared<int64_t>(0);
    Dict d;
    for (const char* k : {"index", "index0", "revindex", "revindex0", "first", "last", "length", "depth", "depth0",
                          "previtem", "nextitem"})
        d.items.emplace_back(k, Value());
    d.items.emplace_back("cycle", Value::function("cycle", [index](Args& a) {
                             if (a.pos.empty()) fail(a.line, "loop.cycle() needs at least one value");
                             return a.pos[size_t(*index) % a.pos.size()];
                         }));
    const Value loop(std::move(d));
    auto& slots = loop.mutable_dict().items;
    for (int64_t i = 0; i < n; ++i) {
        step(s.line);  // an iteration counts even when its body is empty
        ScopeGuard scope(scopes_);
        *index = i;
        slots[0].second = Value(i + 1);
        slots[1].second = Value(i);
        slots[2].second = Value(n - i);
        slots[3].second = Value(n - i - 1);
        slots[4].second = Value(i == 0);
        slots[5].second = Value(i == n - 1);
        slots[6].second = Value(n);
        slots[7].second = Value(int64_t(1));
        slots[8].second = Value(int64_t(0));
        slots[9].second = i > 0 ? (*items)[size_t(i - 1)] : Value();
        slots[10].second = i + 1 < n ? (*items)[size_t(i + 1)] : Value();
        assign("loop", loop);
        assign_targets(s.targets, (*items)[size_t(i)], s.line);
        if (exec(s.body, out) == Flow::Break) break;
    }
}

Value Renderer::make_macro(const Stmt& s) {
    return Value::function(s.name, [this, &s](Args& a) {
        DepthGuard guard(*this, a.line);
        if (a.pos.size() > s.params.size())
            fail(a.line, "macro '" + s.name + "' takes " + std::to_string(s.params.size()) + " arguments, got " +
                             std::to_string(a.pos.size()));
        // A macro sees the template's top-level names and its own parameters;
        // the caller's scopes come back however the body ends.
        struct CallerScopes {
            std::vector<std::unordered_map<std::string, Value>>& scopes;
            std::vector<std::unordered_map<std::string, Value>> saved;
            explicit CallerScopes(std::vector<std::unordered_map<std::string, Value>>& s)
                : scopes(s), saved(std::make_move_iterator(s.begin() + 1), std::make_move_iterator(s.end())) {
                scopes.resize(1);
                scopes.emplace_back();
            }
            ~CallerScopes() {
                scopes.resize(1);
                for (auto& m : saved) scopes.push_back(std::move(m));
            }
        } caller(scopes_);
        std::string out;
        {
            for (const auto& [k, v] : a.kw) {
                bool known = false;
                for (const auto& p : s.params) known = known || p.first == k;
                if (!known) fail(a.line, "macro '" + s.name + "' has no parameter named '" + k + "'");
            }
            for (size_t i = 0; i < s.params.size(); ++i) {
                const auto& [name, def] = s.params[i];
                const Value* given = a.find(i, name);
                assign(name, given ? *given : def ? eval(*def) : Value());
            }
            exec(s.body, out);
        }
        return Value(std::move(out));
    });
}

Value Renderer::lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
        const auto f = it->find(name);
        if (f != it->end()) return f->second;
    }
    const auto g = globals_.find(name);
    return g != globals_.end() ? g->second : Value();
}

void Renderer::assign(const std::string& name, Value v) { scopes_.back()[name] = std::move(v); }

void Renderer::assign_targets(const std::vector<std::string>& targets, const Value& v, int line) {
    if (targets.size() == 1) return assign(targets[0], v);
    const List parts = items_of(v, line);
    if (parts.size() != targets.size())
        fail(line, "cannot unpack " + std::to_string(parts.size()) + " values into " +
                       std::to_string(targets.size()) + " names");
    for (size_t i = 0; i < targets.size(); ++i) assign(targets[i], parts[i]);
}

// ---- expressions ----------------------------------------------------------------

Value Renderer::call(const Value& fn, Args& args, int line) {
    if (fn.is_undefined()) fail(line, "called an undefined value");
    if (!fn.is_function()) fail(line, "'" + fn.type_name() + "' object is not callable");
    args.renderer = this;
    args.line = line;
    return fn.as_function()(args);
}

Value Renderer::apply_filter(const std::string& name, const Value& base, Args& args, int line) {
    step(line);  // map() and select() call filters and tests once per item
    args.renderer = this;
    args.line = line;
    return filter(name, base, args);
}

bool Renderer::apply_test(const std::string& name, const Value& v, Args& args, int line) {
    step(line);
    args.renderer = this;
    args.line = line;
    return test(name, v, args);
}

Value Renderer::eval(const Expr& e) {
    step(e.line);
    DepthGuard guard(*this, e.line);
    auto args_of = [&](size_t from) {
        Args a;
        for (size_t i = from; i < e.args.size(); ++i) a.pos.push_back(eval(*e.args[i]));
        for (const auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
        return a;
    };
    switch (e.kind) {
        case Expr::Kind::Literal: return e.value;
        case Expr::Kind::Name: return lookup(e.name);
        case Expr::Kind::List: case Expr::Kind::Tuple: {
            List l;
            for (const ExprPtr& x : e.args) l.push_back(eval(*x));
            return e.kind == Expr::Kind::Tuple ? Value::tuple(std::move(l)) : Value(std::move(l));
        }
        case Expr::Kind::Dict: {
            Dict d;
            for (size_t i = 0; i + 1 < e.args.size(); i += 2) {
                const Value k = eval(*e.args[i]);
                if (!k.is_string()) fail(e.line, "dict keys must be strings here, not " + k.type_name());
                d.set(k.as_string(), eval(*e.args[i + 1]));
            }
            return Value(std::move(d));
        }
        case Expr::Kind::Attr: return eval_attr(eval(*e.args[0]), e.name, e.line);
        case Expr::Kind::Item: {
            const Value base = eval(*e.args[0]);
            return eval_item(base, eval(*e.args[1]), e.line);
        }
        case Expr::Kind::Slice: {
            const Value base = eval(*e.args[0]);
            Value parts[3];
            for (int i = 0; i < 3; ++i)
                if (e.args[size_t(i) + 1]) parts[i] = eval(*e.args[size_t(i) + 1]);
            return slice(base, parts[0], parts[1], parts[2], e.line);
        }
        case Expr::Kind::Call: {
            const Value fn = eval(*e.args[0]);
            Args a = args_of(1);
            return call(fn, a, e.line);
        }
        case Expr::Kind::Filter: {
            const Value base = eval(*e.args[0]);
            Args a = args_of(1);
            return apply_filter(e.name, base, a, e.line);
        }
        case Expr::Kind::Test: {
            const Value v = eval(*e.args[0]);
            Args a = args_of(1);
            return Value(apply_test(e.name, v, a, e.line) != e.negated);
        }
        case Expr::Kind::Neg: case Expr::Kind::Pos: {
            const Value v = eval(*e.args[0]);
            if (!v.is_number()) fail(e.line, "bad operand type for unary " + std::string(e.kind == Expr::Kind::Neg ? "-" : "+") + ": '" + v.type_name() + "'");
            if (e.kind == Expr::Kind::Pos) return v.kind() == Value::Kind::Float ? v : Value(v.as_int());
            if (v.kind() == Value::Kind::Float) return Value(-v.as_float());
            if (v.as_int() == std::numeric_limits<int64_t>::min()) fail(e.line, "integer overflow");
            return Value(-v.as_int());
        }
        case Expr::Kind::Not: return Value(!eval(*e.args[0]).truthy());
        case Expr::Kind::And: {
            Value a = eval(*e.args[0]);
            return a.truthy() ? eval(*e.args[1]) : a;
        }
        case Expr::Kind::Or: {
            Value a = eval(*e.args[0]);
            return a.truthy() ? a : eval(*e.args[1]);
        }
        case Expr::Kind::Binary: {
            const Value a = eval(*e.args[0]);
            const Value b = eval(*e.args[1]);
            return eval_binary(e.name, a, b, e.line);
        }
        case Expr::Kind::Compare: {
            Value left = eval(*e.args[0]);
            for (size_t i = 0; i < e.ops.size(); ++i) {
                Value right = eval(*e.args[i + 1]);
                if (!eval_compare(e.ops[i], left, right, e.line)) return Value(false);
                left = std::move(right);
            }
            return Value(true);
        }
        case Expr::Kind::Cond:
            if (eval(*e.args[0]).truthy()) return eval(*e.args[1]);
            return e.args[2] ? eval(*e.args[2]) : Value();
    }
    return Value();
}

Value Renderer::eval_attr(const Value& base, const std::string& name, int line) {
    if (base.is_undefined()) fail(line, "cannot read attribute '" + name + "' of an undefined value");
    if (base.is_dict()) {
        // Python looks up an attribute (a dict's methods) before a key.
        if (!base.is_namespace()) {
            Value m = method(base, name, line);
            if (!m.is_undefined()) return m;
        }
        const Value* v = base.as_dict().find(name);
        return v ? *v : Value();
    }
    return method(base, name, line);
}

Value Renderer::eval_item(const Value& base, const Value& key, int line) {
    if (base.is_undefined()) fail(line, "cannot index an undefined value");
    if (base.is_dict()) {
        if (!key.is_string()) return Value();
        const Value* v = base.as_dict().find(key.as_string());
        if (v) return *v;
        return base.is_namespace() ? Value() : method(base, key.as_string(), line);
    }
    if ((base.is_list() || base.is_string()) && key.is_number() && key.kind() != Value::Kind::Float) {
        int64_t i = key.as_int();
        if (base.is_list()) {
            const int64_t n = int64_t(base.as_list().size());
            if (i < 0) i += n;
            return i >= 0 && i < n ? base.as_list()[size_t(i)] : Value();
        }
        const std::vector<char32_t> cps = code_points(base.as_string());
        const int64_t n = int64_t(cps.size());
        if (i < 0) i += n;
        return i >= 0 && i < n ? Value(utf8_of(cps, size_t(i), size_t(i) + 1)) : Value();
    }
    if (key.is_string()) return method(base, key.as_string(), line);
    return Value();
}

namespace {

int64_t checked(long double exact, int line) {
    if (!fits_int64(exact)) fail(line, "integer overflow");
    return int64_t(exact);
}

[[noreturn]] void unsupported(const std::string& op, const Value& a, const Value& b, int line) {
    fail(line, "unsupported operand types for " + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'");
}

Value repeat(const Value& seq, int64_t times, int line) {
    if (times < 0) times = 0;
    const int64_t unit = seq.is_string() ? int64_t(seq.as_string().size()) : int64_t(seq.as_list().size());
    const int64_t cap = seq.is_string() ? int64_t(kMaxStringBytes) : int64_t(kMaxListItems);
    if (unit > 0 && times > cap / unit) {
        if (seq.is_string()) check_string_size(size_t(cap) + 1, line);
        check_list_size(size_t(cap) + 1, line);
    }
    charge(size_t(unit * times) * (seq.is_string() ? 1 : sizeof(Value)), line);
    if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < times; ++i) out += seq.as_string();
        return Value(std::move(out));
    }
    List out;
    for (int64_t i = 0; i < times; ++i) out.insert(out.end(), seq.as_list().begin(), seq.as_list().end());
    return Value(std::move(out));
}

}  // namespace

Value Renderer::eval_binary(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "~") {
        std::string x = a.str(), y = b.str();
        check_string_size(x.size() + y.size(), line);
        charge(x.size() + y.size(), line);
        return Value(x + y);
    }
    if (a.is_undefined() || b.is_undefined()) fail(line, "an undefined value in '" + op + "'");
    const bool nums = a.is_number() && b.is_number();
    const bool floats = nums && (a.kind() == Value::Kind::Float || b.kind() == Value::Kind::Float);
    if (op == "+") {
        if (nums) return floats ? Value(a.as_float() + b.as_float())
                                : Value(checked((long double)a.as_int() + b.as_int(), line));
        if (a.is_string() && b.is_string()) {
            check_string_size(a.as_string().size() + b.as_string().size(), line);
            charge(a.as_string().size() + b.as_string().size(), line);
            return Value(a.as_string() + b.as_string());
        }
        if (a.is_list() && b.is_list()) {
            check_list_size(a.as_list().size() + b.as_list().size(), line);
            charge((a.as_list().size() + b.as_list().size()) * sizeof(Value), line);
            List l = a.as_list();
            l.insert(l.end(), b.as_list().begin(), b.as_list().end());
            return Value(std::move(l));
        }
        unsupported(op, a, b, line);
    }
    if (op == "*") {
        if (nums) return floats ? Value(a.as_float() * b.as_float())
                                : Value(checked((long double)a.as_int() * b.as_int(), line));
        const bool a_int = a.is_number() && a.kind() != Value::Kind::Float;
        const bool b_int = b.is_number() && b.kind() != Value::Kind::Float;
        if ((a.is_string() || a.is_list()) && b_int) return repeat(a, b.as_int(), line);
        if ((b.is_string() || b.is_list()) && a_int) return repeat(b, a.as_int(), line);
        unsupported(op, a, b, line);
    }
    if (!nums) unsupported(op, a, b, line);
    if (op == "-")
        return floats ? Value(a.as_float() - b.as_float()) : Value(checked((long double)a.as_int() - b.as_int(), line));
    if (op == "/") {
        if (b.as_float() == 0.0) fail(line, "division by zero");
        return Value(a.as_float() / b.as_float());
    }
    if (op == "//" || op == "%") {
        if (floats) {
            if (b.as_float() == 0.0) fail(line, op == "//" ? "float floor division by zero" : "float modulo");
            const double q = std::floor(a.as_float() / b.as_float());
            return op == "//" ? Value(q) : Value(a.as_float() - q * b.as_float());
        }
        const int64_t x = a.as_int(), y = b.as_int();
        if (y == 0) fail(line, op == "//" ? "integer division by zero" : "integer modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) fail(line, "integer overflow");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) --q, r += y;  // Python rounds toward -inf
        return op == "//" ? Value(q) : Value(r);
    }
    if (op == "**") {
        if (!floats && b.as_int() >= 0) {
            // Products checked one by one: a base of magnitude 2 or more
            // overflows within 63 of them (found by fuzzing: 2 ** 63 passed a
            // looser bound and its conversion overflowed).
            const int64_t base = a.as_int(), exp = b.as_int();
            if (base == 0 || base == 1) return Value(exp == 0 ? int64_t(1) : base);
            if (base == -1) return Value(exp % 2 ? int64_t(-1) : int64_t(1));
            int64_t r = 1;
            for (int64_t i = 0; i < exp; ++i) r = checked((long double)r * base, line);
            return Value(r);
        }
        return Value(std::pow(a.as_float(), b.as_float()));
    }
    fail(line, "unknown operator " + op);
}

bool Renderer::eval_compare(const std::string& op, const Value& a, const Value& b, int line) {
    if (op == "==") return equal(a, b);
    if (op == "!=") return !equal(a, b);
    if (op == "in" || op == "notin") {
        bool found = false;
        if (b.is_string()) {
            if (!a.is_string()) fail(line, "'in <string>' requires a string on the left, not " + a.type_name());
            found = b.as_string().find(a.as_string()) != std::string::npos;
        } else if (b.is_list()) {
            for (const Value& v : b.as_list()) found = found || equal(v, a);
        } else if (b.is_dict()) {
            found = a.is_string() && b.as_dict().find(a.as_string()) != nullptr;
        } else if (!b.is_undefined()) {
            fail(line, "argument of type '" + b.type_name() + "' is not iterable");
        }
        return op == "in" ? found : !found;
    }
    bool ok = true;
    bool r = false;
    if (op == "<") r = less(a, b, ok);
    else if (op == ">") r = less(b, a, ok);
    else if (op == "<=") r = !less(b, a, ok);
    else if (op == ">=") r = !less(a, b, ok);
    if (!ok) fail(line, "'" + op + "' not supported between '" + a.type_name() + "' and '" + b.type_name() + "'");
    return r;
}

}  // namespace tern::text::jinja::detail
