// The template lexer: text and tags, with Jinja2's whitespace rules as
// Hugging Face configures them. Line breaks are first normalized as Jinja2
// normalizes them (str.splitlines, joined by "\n", and one trailing newline
// dropped: keep_trailing_newline is off). Then, per tag:
//   - "{%-", "{{-", "{#-" strip all whitespace before the tag, "-%}", "-}}",
//     "-#}" all whitespace after it;
//   - trim_blocks: the first newline after a block or comment tag goes;
//   - lstrip_blocks: spaces and tabs from the start of a line to a block or
//     comment tag go, unless the tag opens with "{%+".
// Inside a tag the end is recognized only outside brackets, as Jinja2 does,
// so a dict literal's "}}" does not close a "{{".
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "text/jinja_internal.h"
#include "text/utf8.h"

namespace tern::text::jinja::detail {

void fail(int line, std::string message) { throw TemplateError{std::move(message), line}; }

void check_string_size(size_t bytes, int line) {
    if (bytes > kMaxStringBytes)
        fail(line, "a string would pass the template limit of " + std::to_string(kMaxStringBytes) + " bytes");
}
void check_list_size(size_t items, int line) {
    if (items > kMaxListItems)
        fail(line, "a list would pass the template limit of " + std::to_string(kMaxListItems) + " items");
}

namespace {

// Python's splitlines() boundaries as "\n", and a single trailing newline
// removed.
std::string normalize_newlines(std::string_view src) {
    std::string out;
    out.reserve(src.size());
    for (size_t i = 0; i < src.size();) {
        const unsigned char c = static_cast<unsigned char>(src[i]);
        if (c == '\r') {
            out += '\n';
            i += (i + 1 < src.size() && src[i + 1] == '\n') ? 2 : 1;
            continue;
        }
        if (c == '\n' || c == '\v' || c == '\f' || c == 0x1c || c == 0x1d || c == 0x1e) {
            out += '\n';
            ++i;
            continue;
        }
        if (c >= 0x80) {
            const Utf8Char u = utf8_decode(src, i);
            if (u.valid && (u.cp == 0x85 || u.cp == 0x2028 || u.cp == 0x2029)) {
                out += '\n';
                i += u.len;
                continue;
            }
        }
        out += char(c);
        ++i;
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view rstrip_all(std::string_view s) {
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}
std::string_view lstrip_all(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    return s;
}

// Python's unicode-escape decoding of a string literal's body.
std::string unescape(std::string_view body, int line) {
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
        const char c = body[i];
        if (c != '\\' || i + 1 == body.size()) {
            out += c;
            continue;
        }
        const char e = body[++i];
        auto hex = [&](int digits) {
            uint32_t v = 0;
            for (int k = 0; k < digits; ++k) {
                if (i + 1 >= body.size()) fail(line, "truncated \\" + std::string(1, e) + " escape in a string literal");
                const char h = body[++i];
                if (!std::isxdigit(static_cast<unsigned char>(h)))
                    fail(line, "bad \\" + std::string(1, e) + " escape in a string literal");
                v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
            }
            return v;
        };
        switch (e) {
            case 'n': out += '\n'; break;
            case 't': out += '\t'; break;
            case 'r': out += '\r'; break;
            case '\\': out += '\\'; break;
            case '\'': out += '\''; break;
            case '"': out += '"'; break;
            case 'a': out += '\a'; break;
            case 'b': out += '\b'; break;
            case 'f': out += '\f'; break;
            case 'v': out += '\v'; break;
            case '0': out += '\0'; break;
            case '\n': break;  // a backslash-newline continues the line
            case 'x': utf8_append(out, hex(2)); break;
            case 'u': utf8_append(out, hex(4)); break;
            case 'U': utf8_append(out, hex(8)); break;
            default:
                out += '\\';  // Python keeps unknown escapes as they are
                out += e;
        }
    }
    return out;
}

class Lexer {
public:
    explicit Lexer(std::string src) : s_(std::move(src)) {}

    std::vector<Token> run() {
        bool strip_next = false, trim_newline = false;
        size_t pos = 0;
        while (pos <= s_.size()) {
            const size_t tag = next_tag(pos);
            std::string_view text(s_.data() + pos, (tag == std::string::npos ? s_.size() : tag) - pos);
            // Whether the text starts a line, as Jinja2 decides it: the tag
            // before it (with what its close consumed) ended with a newline.
            bool line_start = pos == 0 || s_[pos - 1] == '\n';
            line_ = line_at(pos);
            if (trim_newline && !text.empty() && text.front() == '\n') {
                text.remove_prefix(1);
                line_start = true;
            }
            if (strip_next) {
                const std::string_view kept = lstrip_all(text);
                if (kept.size() < text.size()) line_start = text[text.size() - kept.size() - 1] == '\n';
                text = kept;
            }
            if (tag == std::string::npos) {
                push_text(text);
                break;
            }
            const char kind = s_[tag + 1];  // '{', '%' or '#'
            const char mod = tag + 2 < s_.size() ? s_[tag + 2] : '\0';
            if (mod == '-') {
                text = rstrip_all(text);
            } else if (mod != '+' && kind != '{') {
                // lstrip_blocks: only spaces and tabs between the line's start and the tag.
                const size_t nl = text.rfind('\n');
                const size_t from = nl == std::string_view::npos ? 0 : nl + 1;
                if ((nl != std::string_view::npos || line_start) && from < text.size()) {
                    bool blank = true;
                    for (size_t i = from; i < text.size(); ++i)
                        blank = blank && (text[i] == ' ' || text[i] == '\t' || text[i] == '\v' || text[i] == '\f' ||
                                          text[i] == '\r');
                    if (blank) text = text.substr(0, from);
                }
            }
            push_text(text);
            line_ = line_at(tag);
            size_t p = tag + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
            if (kind == '#') p = comment(p, strip_next, trim_newline);
            else if (kind == '%' && is_raw(p)) p = raw(p, strip_next, trim_newline);
            else p = tag_body(kind == '{' ? Tok::VarBegin : Tok::BlockBegin, p, strip_next, trim_newline);
            pos = p;
        }
        Token end;
        end.kind = Tok::End;
        end.line = line_;
        toks_.push_back(end);
        return std::move(toks_);
    }

private:
    int line_at(size_t pos) {
        // Positions only move forward: lines are counted incrementally.
        for (; counted_ < pos && counted_ < s_.size(); ++counted_) line_count_ += s_[counted_] == '\n';
        return line_count_ + 1;
    }

    size_t next_tag(size_t from) const {
        for (size_t i = from; i + 1 < s_.size(); ++i)
            if (s_[i] == '{' && (s_[i + 1] == '{' || s_[i + 1] == '%' || s_[i + 1] == '#')) return i;
        return std::string::npos;
    }

    void push_text(std::string_view text) {
        if (text.empty()) return;
        Token t;
        t.kind = Tok::Text;
        t.text = std::string(text);
        t.line = line_;
        toks_.push_back(std::move(t));
    }

    // After a tag's closing characters at p (just past them): the flags for
    // the next text. strip: the close had '-'; block: trim_blocks applies.
    void after_close(bool dash, bool plus, bool block, bool& strip_next, bool& trim_newline) {
        strip_next = dash;
        trim_newline = block && !dash && !plus;
    }

    size_t comment(size_t p, bool& strip_next, bool& trim_newline) {
        const size_t end = s_.find("#}", p);
        if (end == std::string::npos) fail(line_, "a comment ({#) is never closed");
        const bool dash = end > p && s_[end - 1] == '-', plus = end > p && s_[end - 1] == '+';
        after_close(dash, plus, true, strip_next, trim_newline);
        return end + 2;
    }

    // "{% raw %}" at p (past "{%" and its modifier)?
    bool is_raw(size_t p) const {
        while (p < s_.size() && is_space(s_[p])) ++p;
        if (s_.compare(p, 3, "raw") != 0) return false;
        p += 3;
        while (p < s_.size() && is_space(s_[p])) ++p;
        if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
        return s_.compare(p, 2, "%}") == 0;
    }

    size_t raw(size_t p, bool& strip_next, bool& trim_newline) {
        const size_t open_end = s_.find("%}", p);
        const bool open_dash = s_[open_end - 1] == '-';
        size_t body = open_end + 2;
        // The body runs to "{%[-+]? endraw [-+]?%}".
        for (size_t i = body; (i = s_.find("{%", i)) != std::string::npos; ++i) {
            size_t q = i + 2;
            const bool dash_before = q < s_.size() && s_[q] == '-';
            if (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) ++q;
            while (q < s_.size() && is_space(s_[q])) ++q;
            if (s_.compare(q, 6, "endraw") != 0) continue;
            q += 6;
            while (q < s_.size() && is_space(s_[q])) ++q;
            const bool dash_after = q < s_.size() && s_[q] == '-', plus_after = q < s_.size() && s_[q] == '+';
            if (dash_after || plus_after) ++q;
            if (s_.compare(q, 2, "%}") != 0) continue;
            std::string_view text(s_.data() + body, i - body);
            if (open_dash) text = lstrip_all(text);
            if (dash_before) text = rstrip_all(text);
            push_text(text);
            after_close(dash_after, plus_after, true, strip_next, trim_newline);
            return q + 2;
        }
        fail(line_, "a raw block is never closed with {% endraw %}");
    }

    // The tokens of a {{ }} or {% %} tag from p to its close.
    size_t tag_body(Tok begin, size_t p, bool& strip_next, bool& trim_newline) {
        const bool block = begin == Tok::BlockBegin;
        const char close = block ? '%' : '}';
        Token b;
        b.kind = begin;
        b.line = line_at(p);
        toks_.push_back(b);
        int depth = 0;
        while (true) {
            while (p < s_.size() && is_space(s_[p])) ++p;
            if (p >= s_.size()) fail(line_at(p), std::string("a ") + (block ? "{%" : "{{") + " tag is never closed");
            const int line = line_at(p);
            if (depth == 0) {
                const bool dash = s_[p] == '-' && s_.compare(p + 1, 2, std::string(1, close) + "}") == 0;
                const bool plus = block && s_[p] == '+' && s_.compare(p + 1, 2, "%}") == 0;
                if (dash || plus || s_.compare(p, 2, std::string(1, close) + "}") == 0) {
                    Token e;
                    e.kind = block ? Tok::BlockEnd : Tok::VarEnd;
                    e.line = line;
                    toks_.push_back(e);
                    after_close(dash, plus, block, strip_next, trim_newline);
                    return p + ((dash || plus) ? 3 : 2);
                }
            }
            Token t;
            t.line = line;
            const char c = s_[p];
            if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
                size_t q = p;
                while (q < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[q])) || s_[q] == '_')) ++q;
                t.kind = Tok::Name;
                t.text = s_.substr(p, q - p);
                p = q;
            } else if (std::isdigit(static_cast<unsigned char>(c))) {
                p = number(p, t);
            } else if (c == '\'' || c == '"') {
                size_t q = p + 1;
                while (q < s_.size() && s_[q] != c) q += s_[q] == '\\' ? 2 : 1;
                if (q >= s_.size()) fail(line, "a string literal is never closed");
                t.kind = Tok::String;
                t.text = unescape(std::string_view(s_.data() + p + 1, q - p - 1), line);
                p = q + 1;
            } else {
                static const char* const kTwo[] = {"//", "**", "==", "!=", "<=", ">="};
                t.kind = Tok::Op;
                for (const char* op : kTwo)
                    if (s_.compare(p, 2, op) == 0) t.text = op;
                if (t.text.empty()) {
                    if (std::string_view("+-*/%~<>=()[]{}.,:|").find(c) == std::string_view::npos)
                        fail(line, std::string("unexpected character '") + c + "' in a tag");
                    t.text = std::string(1, c);
                }
                if (c == '(' || c == '[' || c == '{') ++depth;
                if ((c == ')' || c == ']' || c == '}') && t.text.size() == 1) {
                    if (depth == 0) fail(line, std::string("unexpected '") + c + "'");
                    --depth;
                }
                p += t.text.size();
            }
            toks_.push_back(std::move(t));
        }
    }

    // An integer or float literal (underscores between digits allowed).
    size_t number(size_t p, Token& t) {
        auto digits = [&](size_t q) {
            while (q < s_.size() && (std::isdigit(static_cast<unsigned char>(s_[q])) ||
                                     (s_[q] == '_' && q + 1 < s_.size() && std::isdigit(static_cast<unsigned char>(s_[q + 1])))))
                ++q;
            return q;
        };
        size_t q = digits(p);
        bool is_float = false;
        if (q + 1 < s_.size() && s_[q] == '.' && std::isdigit(static_cast<unsigned char>(s_[q + 1]))) {
            q = digits(q + 1);
            is_float = true;
        }
        if (q < s_.size() && (s_[q] == 'e' || s_[q] == 'E')) {
            size_t r = q + 1;
            if (r < s_.size() && (s_[r] == '+' || s_[r] == '-')) ++r;
            if (r < s_.size() && std::isdigit(static_cast<unsigned char>(s_[r]))) {
                q = digits(r);
                is_float = true;
            }
        }
        std::string text;
        for (size_t i = p; i < q; ++i)
            if (s_[i] != '_') text += s_[i];
        if (is_float) {
            t.kind = Tok::Float;
            t.f = std::strtod(text.c_str(), nullptr);
        } else {
            t.kind = Tok::Int;
            errno = 0;
            t.i = std::strtoll(text.c_str(), nullptr, 10);
            if (errno == ERANGE) fail(line_, "integer literal " + text + " is too large");
        }
        t.text = text;
        return q;
    }

    std::string s_;
    std::vector<Token> toks_;
    int line_ = 1;
    size_t counted_ = 0;
    int line_count_ = 0;
};

}  // namespace

std::vector<Token> lex(std::string_view source) { return Lexer(normalize_newlines(source)).run(); }

}  // namespace tern::text::jinja::detail
