#include "runtime/grammar.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <map>
#include <unordered_map>

namespace tern::runtime {

// ---- parsing ------------------------------------------------------------------------

class GrammarParser {
public:
    explicit GrammarParser(std::string_view text) : s_(text) {}

    Result<std::shared_ptr<const Grammar>> run() {
        if (s_.size() > Grammar::kMaxText)
            return Error{"grammar: the text is " + std::to_string(s_.size()) + " bytes; at most " +
                         std::to_string(Grammar::kMaxText) + " are accepted"};
        if (!parse_rules()) return Error{"grammar: " + error_};
        if (!check()) return Error{"grammar: " + error_};
        return std::shared_ptr<const Grammar>(std::make_shared<Grammar>(std::move(g_)));
    }

private:
    using Elements = std::vector<Grammar::Element>;

    bool fail(std::string what) {
        if (error_.empty()) {
            int line = 1;
            for (size_t i = 0; i < pos_ && i < s_.size(); ++i) line += s_[i] == '\n';
            error_ = "line " + std::to_string(line) + ": " + std::move(what);
        }
        return false;
    }
    bool at_end() const { return pos_ >= s_.size(); }
    char peek(size_t ahead = 0) const { return pos_ + ahead < s_.size() ? s_[pos_ + ahead] : '\0'; }
    static bool word_char(char c) {
        return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
    }

    // Spaces, tabs and comments; newlines too where a rule may continue.
    void skip_space(bool newlines) {
        while (!at_end()) {
            const char c = peek();
            if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
                ++pos_;
            } else if (c == '#') {
                while (!at_end() && peek() != '\n') ++pos_;
            } else {
                break;
            }
        }
    }

    std::string name() {
        const size_t from = pos_;
        while (!at_end() && word_char(peek())) ++pos_;
        return std::string(s_.substr(from, pos_ - from));
    }

    uint32_t rule_id(const std::string& n) {
        auto [it, fresh] = ids_.emplace(n, uint32_t(names_.size()));
        if (fresh) {
            names_.push_back(n);
            bodies_.emplace_back();
            defined_.push_back(false);
        }
        return it->second;
    }
    uint32_t fresh_rule(const std::string& base) { return rule_id(base + "~" + std::to_string(++generated_)); }

    bool parse_rules() {
        skip_space(true);
        while (!at_end()) {
            const std::string n = name();
            if (n.empty()) return fail(std::string("expected a rule name, found '") + peek() + "'");
            skip_space(false);
            if (s_.substr(pos_, 3) != "::=") return fail("expected ::= after '" + n + "'");
            pos_ += 3;
            const uint32_t id = rule_id(n);
            if (defined_[id]) return fail("rule '" + n + "' is defined twice");
            defined_[id] = true;
            std::vector<Elements> alts;
            if (!parse_alternatives(n, alts, false)) return false;
            bodies_[id] = std::move(alts);
            if (!at_end() && peek() != '\n' && peek() != '\r')
                return fail(std::string("unexpected '") + peek() + "' after rule '" + n + "'");
            skip_space(true);
        }
        return true;
    }

    bool parse_alternatives(const std::string& rule, std::vector<Elements>& alts, bool nested) {
        for (;;) {
            Elements seq;
            if (!parse_sequence(rule, seq, nested)) return false;
            alts.push_back(std::move(seq));
            if (peek() != '|') return true;
            ++pos_;
            skip_space(true);
        }
    }

    bool parse_sequence(const std::string& rule, Elements& seq, bool nested) {
        skip_space(nested);
        size_t last = seq.size();  // where the last symbol starts, for a repetition after it
        bool have_last = false;
        while (!at_end()) {
            const char c = peek();
            if (c == '"') {
                ++pos_;
                last = seq.size();
                while (!at_end() && peek() != '"') {
                    char32_t cp;
                    if (!parse_char(cp)) return false;
                    push_chars(seq, {{cp, cp}}, false);
                }
                if (at_end()) return fail("unterminated string literal");
                ++pos_;
                have_last = true;
            } else if (c == '[') {
                ++pos_;
                const bool negated = peek() == '^';
                if (negated) ++pos_;
                std::vector<std::pair<char32_t, char32_t>> ranges;
                while (!at_end() && peek() != ']') {
                    char32_t lo, hi;
                    if (!parse_char(lo)) return false;
                    hi = lo;
                    if (peek() == '-' && peek(1) != ']' && peek(1) != '\0') {
                        ++pos_;
                        if (!parse_char(hi)) return false;
                        if (hi < lo) return fail("character range is backwards");
                    }
                    ranges.emplace_back(lo, hi);
                }
                if (at_end()) return fail("unterminated character class");
                ++pos_;
                last = seq.size();
                push_chars(seq, ranges, negated);
                have_last = true;
            } else if (c == '.') {
                ++pos_;
                last = seq.size();
                seq.push_back({Grammar::Element::Any, 0, 0});
                have_last = true;
            } else if (word_char(c)) {
                const std::string n = name();
                last = seq.size();
                seq.push_back({Grammar::Element::Ref, rule_id(n), 0});
                have_last = true;
            } else if (c == '(') {
                if (++depth_ > kMaxNesting) return fail("parentheses nest deeper than " + std::to_string(kMaxNesting));
                ++pos_;
                skip_space(true);
                const uint32_t sub = fresh_rule(rule);
                std::vector<Elements> alts;
                if (!parse_alternatives(rule, alts, true)) return false;
                if (peek() != ')') return fail("expected ')'");
                ++pos_;
                --depth_;
                bodies_[sub] = std::move(alts);
                defined_[sub] = true;
                last = seq.size();
                seq.push_back({Grammar::Element::Ref, sub, 0});
                have_last = true;
            } else if (c == '*' || c == '+' || c == '?' || c == '{') {
                if (!have_last) return fail(std::string("'") + c + "' has nothing before it to repeat");
                uint64_t lo = 0, hi = UINT64_MAX;
                ++pos_;
                if (c == '+') lo = 1;
                if (c == '?') hi = 1;
                if (c == '{') {
                    skip_space(nested);
                    const bool has_lo = peek() >= '0' && peek() <= '9';
                    if (has_lo && !parse_count(lo)) return false;
                    skip_space(nested);
                    if (peek() == ',') {
                        ++pos_;
                        skip_space(nested);
                        if (peek() >= '0' && peek() <= '9' && !parse_count(hi)) return false;
                    } else {
                        if (!has_lo) return fail("expected a count after '{'");
                        hi = lo;
                    }
                    skip_space(nested);
                    if (peek() != '}') return fail("expected '}'");
                    ++pos_;
                    if (hi < lo) return fail("repetition {m,n} has n < m");
                }
                if (!repeat(rule, seq, last, lo, hi)) return false;
                have_last = false;
            } else if (c == '<') {
                return fail("token references (<...>) are not supported");
            } else {
                break;
            }
            if (elements_ > Grammar::kMaxElements) return fail("the grammar is too large");
            skip_space(nested);
        }
        return true;
    }

    bool parse_count(uint64_t& out) {
        out = 0;
        while (peek() >= '0' && peek() <= '9') {
            out = out * 10 + uint64_t(peek() - '0');
            if (out > Grammar::kMaxElements) return fail("repetition count is too large");
            ++pos_;
        }
        return true;
    }

    // One character of a literal or class, with its escapes; UTF-8 decoded.
    bool parse_char(char32_t& out) {
        const unsigned char c = uint8_t(peek());
        if (c == '\\') {
            ++pos_;
            const char e = peek();
            ++pos_;
            switch (e) {
                case 'n': out = '\n'; return true;
                case 'r': out = '\r'; return true;
                case 't': out = '\t'; return true;
                case '\\': case '"': case '[': case ']': case '-': case '^': out = char32_t(e); return true;
                case 'x': return parse_hex(2, out);
                case 'u': return parse_hex(4, out);
                case 'U': return parse_hex(8, out);
                default: return fail(std::string("unknown escape '\\") + e + "'");
            }
        }
        if (c < 0x80) {
            if (c == '\n' || c == '\r') return fail("a newline inside a literal or class must be written \\n");
            out = c;
            ++pos_;
            return true;
        }
        const int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
        if (n == 0 || c > 0xF4 || pos_ + size_t(n) > s_.size()) return fail("invalid UTF-8 in the grammar");
        char32_t cp = c & (0xFF >> (n + 1));
        for (int i = 1; i < n; ++i) {
            const unsigned char k = uint8_t(s_[pos_ + size_t(i)]);
            if ((k & 0xC0) != 0x80) return fail("invalid UTF-8 in the grammar");
            cp = (cp << 6) | (k & 0x3F);
        }
        static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return fail("invalid UTF-8 in the grammar");
        pos_ += size_t(n);
        out = cp;
        return true;
    }

    bool parse_hex(int digits, char32_t& out) {
        out = 0;
        for (int i = 0; i < digits; ++i) {
            const char h = peek();
            int v;
            if (h >= '0' && h <= '9') v = h - '0';
            else if (h >= 'a' && h <= 'f') v = h - 'a' + 10;
            else if (h >= 'A' && h <= 'F') v = h - 'A' + 10;
            else return fail("expected " + std::to_string(digits) + " hex digits in an escape");
            out = out * 16 + char32_t(v);
            ++pos_;
        }
        if (out > 0x10FFFF) return fail("escape is past U+10FFFF");
        return true;
    }

    void push_chars(Elements& seq, const std::vector<std::pair<char32_t, char32_t>>& ranges, bool negated) {
        Grammar::Element e{negated ? Grammar::Element::NotChars : Grammar::Element::Chars,
                           uint32_t(g_.ranges_.size()), uint32_t(ranges.size())};
        g_.ranges_.insert(g_.ranges_.end(), ranges.begin(), ranges.end());
        seq.push_back(e);
        ++elements_;
    }

    // seq[last..] repeated lo..hi times (hi = UINT64_MAX: unbounded), as
    // rules: x{2,4} is x x R2 with R2 ::= x R1 | "" and R1 ::= x | "".
    bool repeat(const std::string& rule, Elements& seq, size_t last, uint64_t lo, uint64_t hi) {
        const Elements x(seq.begin() + long(last), seq.end());
        seq.resize(last);
        const uint64_t optional = hi == UINT64_MAX ? 0 : hi - lo;
        if ((lo + optional) * std::max<size_t>(x.size(), 1) > Grammar::kMaxElements)
            return fail("repetition makes the grammar too large");
        for (uint64_t i = 0; i < lo; ++i) seq.insert(seq.end(), x.begin(), x.end());
        elements_ += size_t(lo + optional) * x.size();
        if (hi == UINT64_MAX) {
            const uint32_t r = fresh_rule(rule);
            Elements more = x;
            more.push_back({Grammar::Element::Ref, r, 0});
            bodies_[r] = {std::move(more), Elements{}};
            defined_[r] = true;
            seq.push_back({Grammar::Element::Ref, r, 0});
        } else if (optional > 0) {
            uint32_t inner = 0;
            for (uint64_t k = 1; k <= optional; ++k) {
                const uint32_t r = fresh_rule(rule);
                Elements more = x;
                if (k > 1) more.push_back({Grammar::Element::Ref, inner, 0});
                bodies_[r] = {std::move(more), Elements{}};
                defined_[r] = true;
                inner = r;
            }
            seq.push_back({Grammar::Element::Ref, inner, 0});
        }
        return true;
    }

    // Every referenced rule defined, a root, no left recursion; then the
    // flat layout.
    bool check() {
        for (size_t i = 0; i < names_.size(); ++i)
            if (!defined_[i]) return fail("rule '" + names_[i] + "' is used but not defined");
        const auto root = ids_.find("root");
        if (root == ids_.end()) return fail("there is no rule named 'root'");
        g_.root_ = root->second;

        // Nullable rules (they can match the empty string), to a fixed point.
        std::vector<bool> nullable(names_.size(), false);
        for (bool changed = true; changed;) {
            changed = false;
            for (size_t r = 0; r < names_.size(); ++r) {
                if (nullable[r]) continue;
                for (const Elements& alt : bodies_[r]) {
                    bool all = true;
                    for (const auto& e : alt)
                        if (e.kind != Grammar::Element::Ref || !nullable[e.first]) {
                            all = false;
                            break;
                        }
                    if (all) {
                        nullable[r] = changed = true;
                        break;
                    }
                }
            }
        }
        // Left recursion: a cycle among the rules each can start with.
        std::vector<std::vector<uint32_t>> starts(names_.size());
        for (size_t r = 0; r < names_.size(); ++r)
            for (const Elements& alt : bodies_[r])
                for (const auto& e : alt) {
                    if (e.kind != Grammar::Element::Ref) break;
                    starts[r].push_back(e.first);
                    if (!nullable[e.first]) break;
                }
        std::vector<uint8_t> mark(names_.size(), 0);  // 0 new, 1 on the path, 2 done
        for (size_t r0 = 0; r0 < names_.size(); ++r0) {
            if (mark[r0]) continue;
            std::vector<std::pair<uint32_t, size_t>> path{{uint32_t(r0), 0}};
            mark[r0] = 1;
            while (!path.empty()) {
                auto& [r, next] = path.back();
                if (next == starts[r].size()) {
                    mark[r] = 2;
                    path.pop_back();
                    continue;
                }
                const uint32_t to = starts[r][next++];
                if (mark[to] == 1) {
                    std::string n = names_[to];
                    if (const size_t cut = n.find('~'); cut != std::string::npos) n.resize(cut);
                    return fail("rule '" + n + "' is left-recursive (it can reach itself before reading a character)");
                }
                if (mark[to] == 0) {
                    mark[to] = 1;
                    path.emplace_back(to, 0);
                }
            }
        }
        g_.rules_.resize(names_.size());
        for (size_t r = 0; r < names_.size(); ++r)
            for (const Elements& alt : bodies_[r]) {
                g_.rules_[r].push_back(uint32_t(g_.elements_.size()));
                g_.elements_.insert(g_.elements_.end(), alt.begin(), alt.end());
                g_.elements_.push_back({Grammar::Element::End, 0, 0});
            }
        return true;
    }

    std::string_view s_;
    size_t pos_ = 0;
    std::string error_;
    Grammar g_;
    std::unordered_map<std::string, uint32_t> ids_;
    std::vector<std::string> names_;
    std::vector<std::vector<Elements>> bodies_;
    std::vector<bool> defined_;
    size_t generated_ = 0, elements_ = 0;
    static constexpr int kMaxNesting = 256;
    int depth_ = 0;
};

Result<std::shared_ptr<const Grammar>> Grammar::parse(std::string_view text) { return GrammarParser(text).run(); }

bool Grammar::matches(const Element& e, char32_t c) const { return matches_some(e, c, c); }

bool Grammar::matches_all(const Element& e, char32_t lo, char32_t hi) const {
    if (e.kind == Element::Any) return true;
    if (e.kind == Element::NotChars) {
        const auto* r = ranges_.data() + e.first;
        for (uint32_t i = 0; i < e.count; ++i)
            if (r[i].first <= hi && lo <= r[i].second) return false;
        return true;
    }
    if (e.kind != Element::Chars) return false;
    // Chars: the ranges cover [lo, hi] (they may overlap and come in any order).
    for (char32_t c = lo;;) {
        bool covered = false;
        const auto* r = ranges_.data() + e.first;
        for (uint32_t i = 0; i < e.count; ++i)
            if (r[i].first <= c && c <= r[i].second) {
                if (r[i].second >= hi) return true;
                c = r[i].second + 1;
                covered = true;
                break;
            }
        if (!covered) return false;
    }
}

bool Grammar::matches_some(const Element& e, char32_t lo, char32_t hi) const {
    if (e.kind == Element::Any) return true;
    if (e.kind != Element::Chars && e.kind != Element::NotChars) return false;
    const auto* r = ranges_.data() + e.first;
    if (e.kind == Element::Chars) {
        for (uint32_t i = 0; i < e.count; ++i)
            if (r[i].first <= hi && lo <= r[i].second) return true;
        return false;
    }
    // Negated: some code point of [lo, hi] lies outside every range. Walk the
    // candidates from lo, jumping past each range that covers one.
    for (char32_t c = lo;;) {
        bool covered = false;
        for (uint32_t i = 0; i < e.count; ++i)
            if (r[i].first <= c && c <= r[i].second) {
                covered = true;
                if (r[i].second >= hi) return false;
                c = r[i].second + 1;
                break;
            }
        if (!covered) return true;
    }
}

// ---- the vocabulary -------------------------------------------------------------------

std::shared_ptr<const GrammarVocab> GrammarVocab::make(const text::Tokenizer& tok) {
    auto v = std::make_shared<GrammarVocab>();
    const int n = tok.n_vocab();
    v->bytes_.resize(size_t(n));
    for (int id = 0; id < n; ++id) {
        if (!tok.is_control(id)) v->bytes_[size_t(id)] = tok.token_to_piece(id);
        if (tok.is_eog(id)) v->eog_.push_back(id);
    }
    // The trie, breadth first: children of a node are contiguous and sorted,
    // and the tokens sorted by bytes give every node a range.
    std::vector<int32_t>& order = v->tokens_;
    for (int id = 0; id < n; ++id)
        if (!v->bytes_[size_t(id)].empty()) order.push_back(id);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
        return v->bytes_[size_t(a)] < v->bytes_[size_t(b)] || (v->bytes_[size_t(a)] == v->bytes_[size_t(b)] && a < b);
    });
    v->nodes_.push_back({0, 0, 0, uint32_t(order.size()), 0, 0});
    std::vector<uint32_t> depth{0};
    for (size_t at = 0; at < v->nodes_.size(); ++at) {
        const uint32_t d = depth[at], from = v->nodes_[at].from, to = v->nodes_[at].to;
        uint32_t i = from;
        while (i < to && v->bytes_[size_t(order[i])].size() == d) ++i;
        v->nodes_[at].n_exact = i - from;
        v->nodes_[at].first_child = uint32_t(v->nodes_.size());
        while (i < to) {
            const uint8_t b = uint8_t(v->bytes_[size_t(order[i])][d]);
            uint32_t j = i;
            while (j < to && uint8_t(v->bytes_[size_t(order[j])][d]) == b) ++j;
            v->nodes_.push_back({0, 0, i, j, 0, b});
            depth.push_back(d + 1);
            i = j;
        }
        v->nodes_[at].n_children = uint32_t(v->nodes_.size()) - v->nodes_[at].first_child;
    }
    // Well-formed UTF-8 from the first byte, the last character possibly cut.
    auto well_formed = [](const std::string& b) {
        for (size_t i = 0; i < b.size();) {
            const unsigned char c = uint8_t(b[i]);
            const size_t n = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
            if (n == 0) return false;
            for (size_t k = 1; k < n; ++k) {
                if (i + k >= b.size()) return true;  // cut at the end
                const unsigned char x = uint8_t(b[i + k]);
                if ((x & 0xC0) != 0x80) return false;
                // The second byte rules out overlong forms, surrogates and past U+10FFFF.
                if (k == 1 && ((c == 0xE0 && x < 0xA0) || (c == 0xED && x > 0x9F) || (c == 0xF0 && x < 0x90) ||
                               (c == 0xF4 && x > 0x8F)))
                    return false;
            }
            i += n;
        }
        return true;
    };
    v->utf8_below_.assign(v->nodes_.size(), 1);
    v->height_.assign(v->nodes_.size(), 0);
    // Children come after their parents: one backward pass gathers the bytes below.
    v->below_.assign(4 * v->nodes_.size(), 0);
    for (size_t at = v->nodes_.size(); at-- > 0;) {
        const Node& nd = v->nodes_[at];
        uint64_t* mine = v->below_.data() + 4 * at;
        for (uint32_t c = nd.first_child; c < nd.first_child + nd.n_children; ++c) {
            const uint64_t* theirs = v->below_.data() + 4 * c;
            for (int k = 0; k < 4; ++k) mine[k] |= theirs[k];
            mine[v->nodes_[c].byte >> 6] |= uint64_t(1) << (v->nodes_[c].byte & 63);
            v->utf8_below_[at] &= v->utf8_below_[c];
            v->height_[at] = uint8_t(std::max<int>(v->height_[at], std::min<int>(v->height_[c] + 1, 255)));
        }
        for (uint32_t i = nd.from; i < nd.from + nd.n_exact; ++i)
            if (!well_formed(v->bytes_[size_t(order[i])])) v->utf8_below_[at] = 0;
    }
    return v;
}

// ---- matching -------------------------------------------------------------------------

GrammarMatcher::GrammarMatcher(std::shared_ptr<const Grammar> grammar) : g_(std::move(grammar)) {
    bool overflow = false;
    for (uint32_t alt : g_->rules()[g_->root()]) {
        Stack s{alt};
        expand(s, state_.stacks, &overflow);
    }
    std::sort(state_.stacks.begin(), state_.stacks.end());
    state_.stacks.erase(std::unique(state_.stacks.begin(), state_.stacks.end()), state_.stacks.end());
    if (overflow) error_ = "grammar: too ambiguous to follow (more than " + std::to_string(kMaxStacks) + " parses)";
}

// Replaces stack's top until it is a character element (or the stack is
// empty: the sentence is complete), adding each result to out. Left
// recursion is refused at parse time, so this terminates; it works from a
// list, not by recursion, so a deep stack cannot exhaust the thread's.
void GrammarMatcher::expand(const Stack& stack, std::vector<Stack>& out, bool* overflow) const {
    std::vector<Stack> work{stack};
    while (!work.empty()) {
        if (out.size() + work.size() > kMaxStacks) {
            *overflow = true;
            return;
        }
        Stack s = std::move(work.back());
        work.pop_back();
        while (!s.empty() && g_->elements()[s.back()].kind == Grammar::Element::End) s.pop_back();
        if (s.empty() || g_->elements()[s.back()].kind != Grammar::Element::Ref) {
            out.push_back(std::move(s));
            continue;
        }
        const uint32_t rule = g_->elements()[s.back()].first;
        // The rest of this alternative, after the rule; nothing when the rule
        // was its last element (a tail call), so that a repetition's stacks
        // do not grow with every round.
        if (g_->elements()[s.back() + 1].kind == Grammar::Element::End)
            s.pop_back();
        else
            ++s.back();
        for (uint32_t alt : g_->rules()[rule]) {
            Stack t = s;
            t.push_back(alt);
            work.push_back(std::move(t));
        }
    }
}

bool GrammarMatcher::advance_char(std::vector<Stack>& stacks, char32_t c, bool* overflow) const {
    std::vector<Stack> next;
    for (Stack& s : stacks) {
        if (s.empty() || !g_->matches(g_->elements()[s.back()], c)) continue;
        ++s.back();
        expand(s, next, overflow);
        if (*overflow) return false;
    }
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
    stacks = std::move(next);
    return !stacks.empty();
}

// Could the unfinished character in s.partial still be completed into one
// that some stack accepts?
bool GrammarMatcher::partial_viable(const State& s) const {
    if (s.partial.empty()) return true;
    const unsigned char c0 = uint8_t(s.partial[0]);
    const int n = c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : 2;
    char32_t lo = c0 & (0xFF >> (n + 1));
    for (size_t i = 1; i < s.partial.size(); ++i) lo = (lo << 6) | (uint8_t(s.partial[i]) & 0x3F);
    const int missing = n - int(s.partial.size());
    char32_t hi = lo;
    for (int i = 0; i < missing; ++i) {
        lo = lo << 6;
        hi = (hi << 6) | 0x3F;
    }
    // The characters of this length start at 0x80, 0x800 or 0x10000 (shorter
    // forms are overlong) and end at U+10FFFF.
    static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    lo = std::max(lo, kMin[n]);
    hi = std::min<char32_t>(hi, 0x10FFFF);
    if (lo > hi) return false;
    for (const Stack& st : s.stacks)
        if (!st.empty() && g_->matches_some(g_->elements()[st.back()], lo, hi)) return true;
    return false;
}

bool GrammarMatcher::step(State& s, std::string_view bytes, bool* overflow) const {
    for (const char ch : bytes) {
        const unsigned char b = uint8_t(ch);
        if (s.partial.empty()) {
            if (b < 0x80) {
                if (!advance_char(s.stacks, b, overflow)) return false;
                continue;
            }
            if (b < 0xC2 || b > 0xF4) return false;  // not a lead byte
            s.partial.push_back(char(b));
        } else {
            if ((b & 0xC0) != 0x80) return false;
            // The second byte rules out surrogates and what lies past U+10FFFF
            // (overlong forms fall below the length's minimum, checked later).
            const unsigned char lead = uint8_t(s.partial[0]);
            if (s.partial.size() == 1 && ((lead == 0xED && b > 0x9F) || (lead == 0xF4 && b > 0x8F))) return false;
            s.partial.push_back(char(b));
        }
        const unsigned char c0 = uint8_t(s.partial[0]);
        const size_t n = c0 >= 0xF0 ? 4 : c0 >= 0xE0 ? 3 : 2;
        if (s.partial.size() < n) continue;
        char32_t cp = c0 & (0xFF >> (n + 1));
        for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (uint8_t(s.partial[i]) & 0x3F);
        s.partial.clear();
        static constexpr char32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        if (!advance_char(s.stacks, cp, overflow)) return false;
    }
    return partial_viable(s);
}

bool GrammarMatcher::allows(std::string_view bytes) const {
    if (bytes.empty() || !error_.empty()) return false;
    State s = state_;
    bool overflow = false;
    return step(s, bytes, &overflow);
}

bool GrammarMatcher::accept(std::string_view bytes) {
    if (bytes.empty() || !error_.empty()) return false;
    State s = state_;
    bool overflow = false;
    if (!step(s, bytes, &overflow)) {
        if (overflow) error_ = "grammar: too ambiguous to follow (more than " + std::to_string(kMaxStacks) + " parses)";
        return false;
    }
    state_ = std::move(s);
    return true;
}

bool GrammarMatcher::can_end() const {
    if (!state_.partial.empty()) return false;
    for (const Stack& s : state_.stacks)
        if (s.empty()) return true;
    return false;
}

bool GrammarMatcher::can_continue() const {
    for (const Stack& s : state_.stacks)
        if (!s.empty()) return true;
    return false;
}

// The mask walks the trie with the states interned: a state is computed once
// per distinct (state, byte), and the many trie nodes that lead to the same
// state (every ordinary character inside a string) cost a table lookup.
uint32_t GrammarMatcher::Walk::intern(State s) {
    std::string key;
    for (const Stack& st : s.stacks) {
        key.append(reinterpret_cast<const char*>(st.data()), st.size() * sizeof(uint32_t));
        key.append(4, '\xff');  // no position is 0xffffffff
    }
    key += '|';
    key += s.partial;
    auto [it, fresh] = ids.emplace(std::move(key), uint32_t(states.size()));
    if (fresh) {
        states.push_back(std::move(s));
        // The table's room reserved once: growing it by reallocation cost
        // more than the walk (fresh pages zeroed).
        if (next.capacity() == 0) next.reserve(kTableStates * 256);
        if (states.size() <= kTableStates) next.resize(states.size() * 256, kUnknown);
    }
    return it->second;
}

int64_t GrammarMatcher::transition(Walk& w, uint32_t from, uint8_t byte) const {
    const bool in_table = from < kTableStates;
    const size_t at = size_t(from) * 256 + byte;
    if (in_table) {
        if (w.next[at] != Walk::kUnknown) return w.next[at];
    } else if (auto it = w.next_far.find(at); it != w.next_far.end()) {
        return it->second;
    }
    State t = w.states[from];
    bool overflow = false;
    const char b = char(byte);
    const int32_t to = step(t, std::string_view(&b, 1), &overflow) ? int32_t(w.intern(std::move(t))) : -1;
    if (in_table)
        w.next[at] = to;  // after intern(), which may have grown the table
    else
        w.next_far.emplace(at, to);
    return to;
}

// The ASCII bytes b with transition(state, b) == state, and whether every
// non-ASCII character leads back to it too: true when each stack's next
// element takes either all of U+0080..U+10FFFF or none of it (so the same
// stacks survive whichever such character comes, and where they go does not
// depend on which character a class took) and one such character (é)
// returns to the state.
const GrammarMatcher::Walk::Loop& GrammarMatcher::loop_of(Walk& w, uint32_t state) const {
    if (auto it = w.loops.find(state); it != w.loops.end()) return it->second;
    Walk::Loop loop;
    if (w.states[state].partial.empty()) {
        for (int b = 0; b < 128; ++b)
            if (transition(w, state, uint8_t(b)) == int64_t(state))
                loop.bytes[size_t(b >> 6)] |= uint64_t(1) << (b & 63);
        bool uniform = true, some = false;
        for (const Stack& st : w.states[state].stacks) {
            if (st.empty()) continue;
            const Grammar::Element& e = g_->elements()[st.back()];
            const bool all = g_->matches_all(e, 0x80, 0x10FFFF);
            some = some || all;
            uniform = uniform && (all || !g_->matches_some(e, 0x80, 0x10FFFF));
        }
        if (uniform && some) {
            const int64_t mid = transition(w, state, 0xC3);
            loop.any_non_ascii = mid >= 0 && transition(w, uint32_t(mid), 0xA9) == int64_t(state);
        }
    }
    return w.loops.emplace(state, loop).first->second;
}

void GrammarMatcher::mask(std::span<float> logits, const GrammarVocab& vocab) const {
    const size_t n_vocab = size_t(vocab.n_vocab());
    std::vector<uint64_t> fresh;
    const std::vector<uint64_t>* ok = &fresh;
    if (!error_.empty()) {
        fresh.assign((n_vocab + 63) / 64, 0);  // the grammar cannot go on: nothing fits
    } else {
        Walk& w = walk_;
        if (w.states.size() > kMaxWalkStates || w.n_vocab != n_vocab) w = Walk{};
        w.n_vocab = n_vocab;  // the masks kept are bitsets of this vocabulary
        const uint32_t start = w.intern(state_);
        if (auto it = w.masks.find(start); it != w.masks.end()) {
            ok = &it->second;
        } else {
            fresh = walk_mask(w, start, vocab);
            if (w.masks.size() < kMaxCachedMasks) ok = &w.masks.emplace(start, std::move(fresh)).first->second;
        }
    }
    // End-of-generation tokens are not in the walk's masks: they may come
    // exactly when the text so far is a whole sentence.
    std::vector<std::pair<size_t, float>> ends;
    if (can_end())
        for (int32_t id : vocab.end_of_generation())
            if (size_t(id) < logits.size()) ends.emplace_back(size_t(id), logits[size_t(id)]);
    const size_t n = std::min(logits.size(), n_vocab);
    for (size_t id = 0; id < n; ++id)
        if (!(((*ok)[id >> 6] >> (id & 63)) & 1)) logits[id] = -INFINITY;
    for (size_t id = n; id < logits.size(); ++id) logits[id] = -INFINITY;
    for (const auto& [id, logit] : ends) logits[id] = logit;
}

// Whether every string of at most `height` bytes, each in `below` (ASCII
// only), keeps the text inside the grammar from `state`: true when at each
// step every such byte leads to one same viable state. A counted repetition
// ([a-z]{0,20}, a schema's maxLength) passes while enough repetitions are
// left, a loop (a string's characters) at once.
bool GrammarMatcher::every_path_fits(Walk& w, uint32_t state, const uint64_t* below, int height) const {
    if (below[2] != 0 || below[3] != 0 || (below[0] | below[1]) == 0) return false;
    const int first = below[0] != 0 ? std::countr_zero(below[0]) : 64 + std::countr_zero(below[1]);
    uint32_t at = state;
    for (int level = 0; level < height; ++level) {
        const int64_t to = transition(w, at, uint8_t(first));
        if (to < 0) return false;
        for (int k = 0; k < 2; ++k)
            for (uint64_t bits = below[k]; bits != 0; bits &= bits - 1)
                if (transition(w, at, uint8_t(64 * k + std::countr_zero(bits))) != to) return false;
        if (to == int64_t(at)) return true;  // from here every byte comes back
        at = uint32_t(to);
    }
    return true;
}

// Whether every token below `node` (reached in `state`) keeps the text
// inside the grammar, by one of two shortcuts: every byte below leads the
// state back to itself (the characters of a string, the digits of a number;
// non-ASCII characters where the class takes them all), or every_path_fits.
bool GrammarMatcher::subtree_fits(Walk& w, uint32_t state, uint32_t node, const GrammarVocab& vocab) const {
    const GrammarVocab::Node& nd = vocab.nodes()[node];
    const uint64_t* below = vocab.bytes_below(node);
    // The loop needs the state to lead back to itself; one byte below (the
    // first child's, a transition the walk needs anyway) tells most states
    // that do not (a counted repetition's) at once.
    if (transition(w, state, vocab.nodes()[nd.first_child].byte) == int64_t(state)) {
        const Walk::Loop& loop = loop_of(w, state);
        const bool high = loop.any_non_ascii && vocab.utf8_below(node);
        bool inside = true;
        for (int k = 0; k < 4; ++k)
            inside = inside && (below[k] & ~(loop.bytes[size_t(k)] | (high && k >= 2 ? ~uint64_t(0) : 0))) == 0;
        if (inside) return true;
    }
    return vocab.height(node) < 255 && every_path_fits(w, state, below, vocab.height(node));
}

std::vector<uint64_t> GrammarMatcher::walk_mask(Walk& w, uint32_t start, const GrammarVocab& vocab) const {
    std::vector<uint64_t> ok((size_t(vocab.n_vocab()) + 63) / 64, 0);
    auto allow = [&](uint32_t from, uint32_t to) {
        for (uint32_t i = from; i < to; ++i) {
            const auto id = uint32_t(vocab.tokens()[i]);
            ok[id >> 6] |= uint64_t(1) << (id & 63);
        }
    };
    // Depth first over the trie: (node, state id) pairs still to visit;
    // each node was reached with a viable state, so its exact tokens fit;
    // a subtree that fits whole (subtree_fits) is taken at once.
    constexpr uint32_t kShortcutFrom = 16;  // tokens in a subtree worth the shortcuts' checks
    std::vector<std::pair<uint32_t, uint32_t>> todo{{0, start}};
    while (!todo.empty()) {
        const auto [node, state] = todo.back();
        todo.pop_back();
        const GrammarVocab::Node& nd = vocab.nodes()[node];
        if (node != 0) allow(nd.from, nd.from + nd.n_exact);  // the root is the empty prefix
        if (nd.n_children == 0) continue;
        if (node != 0 && nd.to - nd.from >= kShortcutFrom && subtree_fits(w, state, node, vocab)) {
            allow(nd.from, nd.to);
            continue;
        }
        for (uint32_t c = 0; c < nd.n_children; ++c) {
            const uint32_t child = nd.first_child + c;
            const int64_t to = transition(w, state, vocab.nodes()[child].byte);
            if (to >= 0) todo.emplace_back(child, uint32_t(to));
        }
    }
    // End-of-generation tokens are decided by can_end() when the mask is applied.
    for (int32_t id : vocab.end_of_generation()) ok[size_t(id) >> 6] &= ~(uint64_t(1) << (size_t(id) & 63));
    return ok;
}

}  // namespace tern::runtime
