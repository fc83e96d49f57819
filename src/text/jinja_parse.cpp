// The template parser: tokens to a syntax tree, with Jinja2's grammar and
// operator precedence (lowest first): conditional expression, or, and, not,
// comparisons and membership, "~", + and -, * / // %, **, unary - and +,
// then a primary with its postfixes (attribute, subscript or slice, call,
// "|" filter, "is" test).
#include <initializer_list>
#include <set>

#include "text/jinja_internal.h"

namespace tern::text::jinja::detail {
namespace {

class Parser {
public:
    explicit Parser(std::vector<Token> toks) : t_(std::move(toks)) {}

    Body program() {
        Body body = statements({});
        if (peek().kind != Tok::End) fail(peek().line, "unexpected {% " + block_word() + " %}");
        return body;
    }

private:
    // ---- statements --------------------------------------------------------------

    // Statements up to a block tag whose first word is in `until` (left unread).
    Body statements(const std::set<std::string>& until) {
        Body body;
        while (true) {
            const Token& t = peek();
            if (t.kind == Tok::End) {
                if (!until.empty()) {
                    std::string end = *until.begin();
                    for (const std::string& w : until)
                        if (w.rfind("end", 0) == 0) end = w;
                    fail(t.line, "missing {% " + end + " %}: the template ended first");
                }
                return body;
            }
            if (t.kind == Tok::Text) {
                auto s = stmt(Stmt::Kind::Text, t.line);
                s->text = t.text;
                body.push_back(std::move(s));
                ++i_;
            } else if (t.kind == Tok::VarBegin) {
                ++i_;
                auto s = stmt(Stmt::Kind::Output, t.line);
                s->expr = expression();
                expect(Tok::VarEnd, "}}");
                body.push_back(std::move(s));
            } else if (t.kind == Tok::BlockBegin) {
                const std::string word = block_word();
                if (until.count(word)) return body;
                ++i_;
                body.push_back(block(word, t.line));
            } else {
                fail(t.line, "unexpected token");
            }
        }
    }

    StmtPtr block(const std::string& word, int line) {
        ++i_;  // the word
        if (word == "if") return if_block(line);
        if (word == "for") return for_block(line);
        if (word == "set") return set_block(line);
        if (word == "macro") return macro_block(line);
        if (word == "filter") return filter_block(line);
        if (word == "break" || word == "continue") {
            if (loops_ == 0) fail(line, "{% " + word + " %} outside a loop");
            end_tag();
            return stmt(word == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue, line);
        }
        if (word == "generation") {
            end_tag();
            auto s = stmt(Stmt::Kind::Scope, line);
            s->body = statements({"endgeneration"});
            close_block("endgeneration");
            return s;
        }
        static const std::set<std::string> kUnsupported = {"include", "import", "from", "extends", "block", "call",
                                                           "with", "autoescape", "do", "trans"};
        if (kUnsupported.count(word)) fail(line, "the {% " + word + " %} tag is not supported in chat templates");
        fail(line, "unknown tag {% " + word + " %}");
    }

    StmtPtr if_block(int line) {
        auto s = stmt(Stmt::Kind::If, line);
        ExprPtr cond = expression();
        end_tag();
        while (true) {
            Body body = statements({"elif", "else", "endif"});
            s->branches.emplace_back(std::move(cond), std::move(body));
            const std::string w = block_word();
            i_ += 2;
            if (w == "endif") {
                end_tag();
                return s;
            }
            if (w == "else") {
                end_tag();
                s->branches.emplace_back(nullptr, statements({"endif"}));
                close_block("endif");
                return s;
            }
            cond = expression();  // elif
            end_tag();
        }
    }

    StmtPtr for_block(int line) {
        auto s = stmt(Stmt::Kind::For, line);
        s->targets = target_names();
        if (!accept_name("in")) fail(peek().line, "expected 'in' in a for tag");
        s->expr = or_expr();  // the iterable: no conditional (its "if" filters the loop)
        if (accept_name("if")) s->filter = or_expr();
        if (accept_name("recursive")) fail(line, "recursive loops are not supported in chat templates");
        end_tag();
        ++loops_;
        s->body = statements({"else", "endfor"});
        --loops_;
        if (block_word() == "else") {
            i_ += 2;
            end_tag();
            s->else_body = statements({"endfor"});
        }
        close_block("endfor");
        return s;
    }

    StmtPtr set_block(int line) {
        auto s = stmt(Stmt::Kind::Set, line);
        const Token& first = peek();
        if (first.kind != Tok::Name) fail(first.line, "expected a name after set");
        if (peek(1).kind == Tok::Op && peek(1).text == ".") {
            s->targets = {first.text};
            i_ += 2;
            if (peek().kind != Tok::Name) fail(peek().line, "expected an attribute name after '.'");
            s->attr = peek().text;
            ++i_;
        } else {
            s->targets = target_names();
        }
        if (accept_op("=")) {
            s->expr = tuple_or_expression();
            end_tag();
            return s;
        }
        if (s->targets.size() != 1 || !s->attr.empty()) fail(line, "a set block assigns one name");
        if (accept_op("|")) fail(line, "filters on a set block are not supported");
        end_tag();
        s->kind = Stmt::Kind::SetBlock;
        s->body = statements({"endset"});
        close_block("endset");
        return s;
    }

    StmtPtr macro_block(int line) {
        auto s = stmt(Stmt::Kind::Macro, line);
        if (peek().kind != Tok::Name) fail(line, "expected the macro's name");
        s->name = peek().text;
        ++i_;
        expect_op("(");
        while (!accept_op(")")) {
            if (!s->params.empty()) expect_op(",");
            if (peek().kind != Tok::Name) fail(peek().line, "expected a parameter name");
            std::string name = peek().text;
            ++i_;
            ExprPtr def;
            if (accept_op("=")) def = expression();
            s->params.emplace_back(std::move(name), std::move(def));
        }
        end_tag();
        const int saved = loops_;
        loops_ = 0;
        s->body = statements({"endmacro"});
        loops_ = saved;
        close_block("endmacro");
        return s;
    }

    StmtPtr filter_block(int line) {
        auto s = stmt(Stmt::Kind::FilterBlock, line);
        ExprPtr chain;  // null base: the block's text
        do chain = filter_call(std::move(chain));
        while (accept_op("|"));
        s->expr = std::move(chain);
        end_tag();
        s->body = statements({"endfilter"});
        close_block("endfilter");
        return s;
    }

    // ---- expressions --------------------------------------------------------------

    // A bare tuple (a, b) is allowed where Jinja2 allows one: set values.
    ExprPtr tuple_or_expression() {
        ExprPtr first = expression();
        if (!(peek().kind == Tok::Op && peek().text == ",")) return first;
        auto tup = expr(Expr::Kind::Tuple, first->line);
        tup->args.push_back(std::move(first));
        while (accept_op(",")) {
            if (at_tag_end()) break;
            tup->args.push_back(expression());
        }
        return tup;
    }

    ExprPtr expression() {
        ExprPtr body = or_expr();
        if (!accept_name("if")) return body;
        auto c = expr(Expr::Kind::Cond, body->line);
        c->args.push_back(or_expr());
        c->args.push_back(std::move(body));
        c->args.push_back(accept_name("else") ? expression() : nullptr);
        // args: condition, value, else value
        return c;
    }

    ExprPtr or_expr() {
        ExprPtr left = and_expr();
        while (accept_name("or")) left = binary(Expr::Kind::Or, "or", std::move(left), and_expr());
        return left;
    }
    ExprPtr and_expr() {
        ExprPtr left = not_expr();
        while (accept_name("and")) left = binary(Expr::Kind::And, "and", std::move(left), not_expr());
        return left;
    }
    ExprPtr not_expr() {
        const int line = peek().line;
        if (accept_name("not")) {
            auto n = expr(Expr::Kind::Not, line);
            n->args.push_back(not_expr());
            return n;
        }
        return compare();
    }

    ExprPtr compare() {
        ExprPtr first = concat();
        ExprPtr chain;
        while (true) {
            std::string op;
            const Token& t = peek();
            if (t.kind == Tok::Op && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == "<=" ||
                                      t.text == ">" || t.text == ">=")) {
                op = t.text;
                ++i_;
            } else if (t.kind == Tok::Name && t.text == "in") {
                op = "in";
                ++i_;
            } else if (t.kind == Tok::Name && t.text == "not" && peek(1).kind == Tok::Name && peek(1).text == "in") {
                op = "notin";
                i_ += 2;
            } else {
                break;
            }
            if (!chain) {
                chain = expr(Expr::Kind::Compare, first->line);
                chain->args.push_back(std::move(first));
            }
            chain->ops.push_back(op);
            chain->args.push_back(concat());
        }
        return chain ? std::move(chain) : std::move(first);
    }

    // One left-associative level of binary operators over the next level.
    ExprPtr binary_level(ExprPtr (Parser::*next)(), std::initializer_list<const char*> ops) {
        ExprPtr left = (this->*next)();
        while (true) {
            const char* op = nullptr;
            for (const char* o : ops)
                if (peek().kind == Tok::Op && peek().text == o) op = o;
            if (!op) return left;
            ++i_;
            left = binary(Expr::Kind::Binary, op, std::move(left), (this->*next)());
        }
    }
    ExprPtr concat() { return binary_level(&Parser::sum, {"~"}); }
    ExprPtr sum() { return binary_level(&Parser::product, {"+", "-"}); }
    ExprPtr product() { return binary_level(&Parser::power, {"*", "/", "//", "%"}); }
    ExprPtr power() { return binary_level(&Parser::unary_filtered, {"**"}); }
    ExprPtr unary_filtered() { return unary(); }

    // Jinja2: "-x|f" is (-x)|f: filters and tests apply to the outermost
    // unary result, not to the operand of a nested one ("--x|f" is (--x)|f).
    ExprPtr unary(bool with_filters = true) {
        const int line = peek().line;
        ExprPtr e;
        if (peek().kind == Tok::Op && (peek().text == "-" || peek().text == "+")) {
            const bool neg = peek().text == "-";
            ++i_;
            e = expr(neg ? Expr::Kind::Neg : Expr::Kind::Pos, line);
            e->args.push_back(unary(false));
        } else {
            e = postfix(primary());
        }
        return with_filters ? postfix_filters(std::move(e)) : std::move(e);
    }

    ExprPtr primary() {
        const Token t = peek();
        ++i_;
        switch (t.kind) {
            case Tok::String: {
                std::string s = t.text;
                while (peek().kind == Tok::String) s += peek().text, ++i_;  // adjacent literals join
                return literal(Value(std::move(s)), t.line);
            }
            case Tok::Int: return literal(Value(t.i), t.line);
            case Tok::Float: return literal(Value(t.f), t.line);
            case Tok::Name: {
                if (t.text == "true" || t.text == "True") return literal(Value(true), t.line);
                if (t.text == "false" || t.text == "False") return literal(Value(false), t.line);
                if (t.text == "none" || t.text == "None") return literal(Value::none(), t.line);
                auto n = expr(Expr::Kind::Name, t.line);
                n->name = t.text;
                return n;
            }
            case Tok::Op:
                if (t.text == "(") {
                    if (accept_op(")")) return expr(Expr::Kind::Tuple, t.line);
                    ExprPtr first = expression();
                    if (accept_op(")")) return first;
                    auto tup = expr(Expr::Kind::Tuple, t.line);
                    tup->args.push_back(std::move(first));
                    while (accept_op(",")) {
                        if (peek().kind == Tok::Op && peek().text == ")") break;
                        tup->args.push_back(expression());
                    }
                    expect_op(")");
                    return tup;
                }
                if (t.text == "[") {
                    auto l = expr(Expr::Kind::List, t.line);
                    while (!accept_op("]")) {
                        if (!l->args.empty()) {
                            expect_op(",");
                            if (accept_op("]")) break;
                        }
                        l->args.push_back(expression());
                    }
                    return l;
                }
                if (t.text == "{") {
                    auto d = expr(Expr::Kind::Dict, t.line);
                    while (!accept_op("}")) {
                        if (!d->args.empty()) {
                            expect_op(",");
                            if (accept_op("}")) break;
                        }
                        d->args.push_back(expression());
                        expect_op(":");
                        d->args.push_back(expression());
                    }
                    return d;
                }
                break;
            default: break;
        }
        fail(t.line, t.kind == Tok::VarEnd || t.kind == Tok::BlockEnd ? "expected an expression before the tag's end"
                                                                    : "unexpected '" + t.text + "' in an expression");
    }

    ExprPtr postfix(ExprPtr e) {
        while (true) {
            const Token& t = peek();
            if (t.kind != Tok::Op) return e;
            if (t.text == ".") {
                ++i_;
                const Token& n = peek();
                auto a = expr(Expr::Kind::Attr, n.line);
                if (n.kind == Tok::Name) {
                    a->name = n.text;
                } else if (n.kind == Tok::Int) {  // x.0 is x[0]
                    a->kind = Expr::Kind::Item;
                    a->args.push_back(std::move(e));
                    a->args.push_back(literal(Value(n.i), n.line));
                    ++i_;
                    e = std::move(a);
                    continue;
                } else {
                    fail(n.line, "expected an attribute name after '.'");
                }
                ++i_;
                a->args.push_back(std::move(e));
                e = std::move(a);
            } else if (t.text == "[") {
                ++i_;
                e = subscript(std::move(e), t.line);
            } else if (t.text == "(") {
                ++i_;
                auto c = expr(Expr::Kind::Call, t.line);
                c->args.push_back(std::move(e));
                call_args(*c);
                e = std::move(c);
            } else {
                return e;
            }
        }
    }

    ExprPtr subscript(ExprPtr base, int line) {
        ExprPtr parts[3];
        int n = 0;
        bool is_slice = false;
        while (true) {
            if (peek().kind == Tok::Op && (peek().text == ":" || peek().text == "]")) {
                // an empty part
            } else {
                parts[n] = expression();
            }
            if (accept_op(":")) {
                is_slice = true;
                if (++n > 2) fail(line, "a slice has at most three parts");
                continue;
            }
            expect_op("]");
            break;
        }
        if (!is_slice) {
            if (!parts[0]) fail(line, "empty subscript");
            auto it = expr(Expr::Kind::Item, line);
            it->args.push_back(std::move(base));
            it->args.push_back(std::move(parts[0]));
            return it;
        }
        auto s = expr(Expr::Kind::Slice, line);
        s->args.push_back(std::move(base));
        for (auto& p : parts) s->args.push_back(std::move(p));
        return s;
    }

    // Arguments after "(" through ")": positional, then name=value.
    void call_args(Expr& c) {
        while (!accept_op(")")) {
            if (c.args.size() > 1 || !c.kwargs.empty()) {
                expect_op(",");
                if (accept_op(")")) return;
            }
            if (peek().kind == Tok::Name && peek(1).kind == Tok::Op && peek(1).text == "=") {
                std::string name = peek().text;
                i_ += 2;
                c.kwargs.emplace_back(std::move(name), expression());
            } else {
                if (!c.kwargs.empty()) fail(peek().line, "a positional argument after a keyword argument");
                c.args.push_back(expression());
            }
        }
    }

    ExprPtr postfix_filters(ExprPtr e) {
        while (true) {
            if (accept_op("|")) {
                e = filter_call(std::move(e));
            } else if (peek().kind == Tok::Name && peek().text == "is") {
                const int line = peek().line;
                ++i_;
                auto t = expr(Expr::Kind::Test, line);
                t->negated = accept_name("not");
                if (peek().kind != Tok::Name) {
                    // "is ==" style tests are spelled as names (eq, ...); Jinja2 also allows none/true/false.
                    fail(peek().line, "expected a test name after 'is'");
                }
                t->name = peek().text;
                ++i_;
                if (!has_test(t->name)) fail(line, "no test named '" + t->name + "'");
                t->args.push_back(std::move(e));
                if (accept_op("(")) {
                    call_args(*t);
                } else if (starts_test_argument()) {
                    t->args.push_back(primary_with_postfix());  // "is divisibleby 3", "is sameas none"
                }
                e = std::move(t);
            } else {
                return e;
            }
        }
    }

    ExprPtr filter_call(ExprPtr base) {
        if (peek().kind != Tok::Name) fail(peek().line, "expected a filter name after '|'");
        auto f = expr(Expr::Kind::Filter, peek().line);
        f->name = peek().text;
        ++i_;
        while (accept_op(".")) {  // dotted names are not filters Jinja2 knows either
            fail(f->line, "no filter named '" + f->name + ".'");
        }
        if (!has_filter(f->name)) fail(f->line, "no filter named '" + f->name + "'");
        f->args.push_back(std::move(base));
        if (accept_op("(")) call_args(*f);
        return f;
    }

    // Jinja2 reads one argument without parentheses after a test name when
    // the next token starts an expression (not an operator or keyword).
    bool starts_test_argument() const {
        const Token& t = peek();
        if (t.kind == Tok::String || t.kind == Tok::Int || t.kind == Tok::Float) return true;
        if (t.kind == Tok::Name)
            return t.text != "and" && t.text != "or" && t.text != "if" && t.text != "else" && t.text != "in" &&
                   t.text != "not" && t.text != "is";
        return t.kind == Tok::Op && (t.text == "[" || t.text == "{");
    }
    ExprPtr primary_with_postfix() { return postfix(primary()); }

    // ---- helpers ------------------------------------------------------------------

    const Token& peek(size_t k = 0) const {
        const size_t j = i_ + k;
        return j < t_.size() ? t_[j] : t_.back();
    }
    std::string block_word() const {
        const Token& w = peek(1);
        return peek().kind == Tok::BlockBegin && w.kind == Tok::Name ? w.text : std::string();
    }
    bool accept_op(const char* op) {
        if (peek().kind == Tok::Op && peek().text == op) {
            ++i_;
            return true;
        }
        return false;
    }
    bool accept_name(const char* n) {
        if (peek().kind == Tok::Name && peek().text == n) {
            ++i_;
            return true;
        }
        return false;
    }
    void expect_op(const char* op) {
        if (!accept_op(op)) fail(peek().line, std::string("expected '") + op + "'" + found());
    }
    void expect(Tok kind, const char* what) {
        if (peek().kind != kind) fail(peek().line, std::string("expected '") + what + "'" + found());
        ++i_;
    }
    std::string found() const {
        const Token& t = peek();
        if (t.kind == Tok::End) return ", found the end of the template";
        if (t.kind == Tok::VarEnd || t.kind == Tok::BlockEnd) return ", found the tag's end";
        if (t.kind == Tok::Text) return ", found text";
        return ", found '" + t.text + "'";
    }
    bool at_tag_end() const { return peek().kind == Tok::BlockEnd || peek().kind == Tok::VarEnd; }
    void end_tag() { expect(Tok::BlockEnd, "%}"); }
    void close_block(const char* word) {
        if (block_word() != word) fail(peek().line, std::string("expected {% ") + word + " %}");
        i_ += 2;
        end_tag();
    }

    std::vector<std::string> target_names() {
        std::vector<std::string> names;
        const bool paren = accept_op("(");
        do {
            if (peek().kind != Tok::Name) fail(peek().line, "expected a name to assign");
            names.push_back(peek().text);
            ++i_;
        } while (accept_op(","));
        if (paren) expect_op(")");
        return names;
    }

    static StmtPtr stmt(Stmt::Kind k, int line) {
        auto s = std::make_unique<Stmt>();
        s->kind = k;
        s->line = line;
        return s;
    }
    static ExprPtr expr(Expr::Kind k, int line) {
        auto e = std::make_unique<Expr>();
        e->kind = k;
        e->line = line;
        return e;
    }
    static ExprPtr literal(Value v, int line) {
        auto e = expr(Expr::Kind::Literal, line);
        e->value = std::move(v);
        return e;
    }
    static ExprPtr binary(Expr::Kind k, const std::string& op, ExprPtr a, ExprPtr b) {
        auto e = expr(k, a->line);
        e->name = op;
        e->args.push_back(std::move(a));
        e->args.push_back(std::move(b));
        return e;
    }

    std::vector<Token> t_;
    size_t i_ = 0;
    int loops_ = 0;
};

}  // namespace

Body parse(std::vector<Token> tokens) { return Parser(std::move(tokens)).program(); }

}  // namespace tern::text::jinja::detail
