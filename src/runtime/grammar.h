// Grammar-constrained generation: GBNF grammars (llama.cpp's format) parsed
// into rules of character classes and rule references, and a matcher that
// follows the text generated so far as a set of pushdown stacks and says
// which tokens may come next.
//
//   root   ::= answer "."          # rules: name ::= alternatives
//   answer ::= "yes" | "no" | [0-9]+ ("," [0-9]{3})*
//
// Literals "..." and classes [a-z] / [^"\\] take the escapes \n \r \t \\ \"
// \[ \] \xHH \uHHHH \UHHHHHHHH; `.` is any character; ( ) groups; * + ? {m}
// {m,} {m,n} {,n} repeat; # starts a comment. A rule ends at the end of its
// line unless inside parentheses or after `|`. The grammar starts at `root`.
// Refused with an error naming them: undefined or twice-defined rules,
// left recursion (a rule that can reach itself without reading a
// character), token references (<...>), and grammars past the size limits.
// A grammar is untrusted input: parsing is linear in its text, and the
// matcher bounds its stacks (an ambiguous grammar fails, it never hangs).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "text/tokenizer.h"

namespace tern::runtime {

class Grammar {
public:
    static constexpr size_t kMaxText = size_t(1) << 20;      // bytes of grammar text
    static constexpr size_t kMaxElements = size_t(1) << 18;  // after repetitions are expanded

    static Result<std::shared_ptr<const Grammar>> parse(std::string_view text);

    // One step of a rule: a character class (ranges, maybe negated), any
    // character, a reference to a rule, or the end of an alternative.
    struct Element {
        enum Kind : uint8_t { Chars, NotChars, Any, Ref, End } kind = End;
        uint32_t first = 0, count = 0;  // Chars / NotChars: ranges_[first, first + count); Ref: rule id in first
    };
    bool matches(const Element& e, char32_t c) const;
    // Whether some character in [lo, hi] matches e (a partial UTF-8 sequence
    // stands for that range of code points).
    bool matches_some(const Element& e, char32_t lo, char32_t hi) const;
    bool matches_all(const Element& e, char32_t lo, char32_t hi) const;

    const std::vector<Element>& elements() const { return elements_; }
    // Each rule's alternatives, as offsets into elements() (each ends at an End).
    const std::vector<std::vector<uint32_t>>& rules() const { return rules_; }
    uint32_t root() const { return root_; }

private:
    friend class GrammarParser;
    std::vector<Element> elements_;
    std::vector<std::pair<char32_t, char32_t>> ranges_;
    std::vector<std::vector<uint32_t>> rules_;
    uint32_t root_ = 0;
};

// The vocabulary as a grammar sees it: each token's bytes (control tokens
// have none a grammar can match) in a byte trie, so that a mask walks the
// prefixes tokens share once. Built once per tokenizer.
class GrammarVocab {
public:
    static std::shared_ptr<const GrammarVocab> make(const text::Tokenizer& tok);

    // A trie node: the tokens whose bytes start with its prefix are
    // tokens()[from, to), those whose bytes are exactly the prefix first.
    struct Node {
        uint32_t first_child = 0, n_children = 0;  // into nodes(), sorted by byte
        uint32_t from = 0, to = 0, n_exact = 0;
        uint8_t byte = 0;  // the edge from the parent
    };
    const std::vector<Node>& nodes() const { return nodes_; }  // nodes_[0]: the root (empty prefix)
    const std::vector<int32_t>& tokens() const { return tokens_; }
    // Every byte on the edges below node i, as 256 bits.
    const uint64_t* bytes_below(size_t i) const { return below_.data() + 4 * i; }
    // Every token below node i (and at it) is well-formed UTF-8 from its first
    // byte, though its last character may be unfinished.
    bool utf8_below(size_t i) const { return utf8_below_[i] != 0; }
    // The most bytes a token below node i has past the node's prefix (255: that many or more).
    int height(size_t i) const { return height_[i]; }
    const std::string& bytes(int32_t id) const { return bytes_[size_t(id)]; }
    int n_vocab() const { return int(bytes_.size()); }
    const std::vector<int32_t>& end_of_generation() const { return eog_; }  // the tokenizer's is_eog ids

private:
    std::vector<std::string> bytes_;
    std::vector<Node> nodes_;
    std::vector<int32_t> tokens_;  // sorted by bytes: each node's tokens are a range
    std::vector<uint64_t> below_;
    std::vector<uint8_t> utf8_below_;
    std::vector<uint8_t> height_;
    std::vector<int32_t> eog_;
};

// Where generation stands in a grammar: the stacks of rule positions the
// text so far can be in, and the bytes of a character not yet complete.
class GrammarMatcher {
public:
    static constexpr size_t kMaxStacks = 4096;
    static constexpr size_t kMaxWalkStates = 1 << 14;  // the mask's state cache starts again past this
    static constexpr size_t kTableStates = 1 << 14;    // states whose transitions are a table (then a map)
    static constexpr size_t kMaxCachedMasks = 256;     // whole masks kept, by the state they were made in

    explicit GrammarMatcher(std::shared_ptr<const Grammar> grammar);

    // Would these bytes (one token's) keep the text inside the grammar?
    bool allows(std::string_view bytes) const;
    // Takes the bytes; false (and the state unchanged) when allows() is false
    // or the grammar is too ambiguous to follow (error() says so).
    bool accept(std::string_view bytes);

    // The text so far is a whole sentence of the grammar (an end-of-generation
    // token may come now), and whether it can also go on.
    bool can_end() const;
    bool can_continue() const;

    // Sets the logits of tokens that may not come next to -inf: tokens whose
    // bytes leave the grammar, empty tokens, and end-of-generation tokens
    // unless can_end(). logits holds vocab.n_vocab() floats.
    void mask(std::span<float> logits, const GrammarVocab& vocab) const;

    // Set when accept() failed because the stacks passed kMaxStacks.
    const std::string& error() const { return error_; }

private:
    using Stack = std::vector<uint32_t>;  // positions in grammar elements; the top is the next to match
    struct State {
        std::vector<Stack> stacks;
        std::string partial;  // leading bytes of an unfinished UTF-8 character
    };
    // Advances state by bytes; false when no stack survives or on overflow.
    bool step(State& s, std::string_view bytes, bool* overflow) const;
    bool advance_char(std::vector<Stack>& stacks, char32_t c, bool* overflow) const;
    void expand(const Stack& stack, std::vector<Stack>& out, bool* overflow) const;
    bool partial_viable(const State& s) const;
    // The interned states of one mask's walk and their transitions by byte.
    struct Walk {
        static constexpr int32_t kUnknown = -2;
        std::vector<State> states;
        std::unordered_map<std::string, uint32_t> ids;
        // next[state * 256 + byte]: the state a byte leads to, -1 refused,
        // kUnknown not yet computed (a table, not a map: the walk looks one
        // up per trie node it visits, a hundred thousand on a large
        // vocabulary). States past kTableStates, which one walk of a large
        // grammar can make, keep theirs in next_far, so memory stays bounded.
        std::vector<int32_t> next;
        std::unordered_map<uint64_t, int32_t> next_far;  // (state << 8 | byte) -> state
        size_t n_vocab = 0;  // the vocabulary the masks below were made for
        // The allowed tokens (a bit each) of a mask made in a state; the
        // state recurs with every character of a string or digit of a number.
        std::unordered_map<uint32_t, std::vector<uint64_t>> masks;
        // state -> the ASCII bytes that lead back to it, and whether every
        // non-ASCII character does too
        struct Loop {
            std::array<uint64_t, 4> bytes{};
            bool any_non_ascii = false;
        };
        std::unordered_map<uint32_t, Loop> loops;
        uint32_t intern(State s);
    };
    int64_t transition(Walk& w, uint32_t from, uint8_t byte) const;
    // The tokens (a bit each) whose bytes keep the text inside the grammar
    // from state start; end-of-generation tokens left out.
    std::vector<uint64_t> walk_mask(Walk& w, uint32_t start, const GrammarVocab& vocab) const;
    bool subtree_fits(Walk& w, uint32_t state, uint32_t node, const GrammarVocab& vocab) const;
    bool every_path_fits(Walk& w, uint32_t state, const uint64_t* below, int height) const;
    const Walk::Loop& loop_of(Walk& w, uint32_t state) const;

    std::shared_ptr<const Grammar> g_;
    State state_;
    std::string error_;
    // Kept across masks: a generation meets the same states again (every
    // character of a string), and their transitions are computed once.
    mutable Walk walk_;
};

}  // namespace tern::runtime
