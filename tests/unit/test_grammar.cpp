// runtime/grammar: GBNF parsing (and its refusals), matching against a regex
// twin on random strings, UTF-8 split across tokens, and the token mask
// against a brute-force check of every token.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "runtime/grammar.h"
#include "test_text_util.h"

namespace {

using tern::runtime::Grammar;
using tern::runtime::GrammarMatcher;
using tern::runtime::GrammarVocab;

std::shared_ptr<const Grammar> parse_ok(const std::string& text) {
    auto g = Grammar::parse(text);
    EXPECT_TRUE(g.ok()) << text << "\n" << (g.ok() ? "" : g.error().message);
    if (!g.ok()) std::abort();
    return *g;
}

// The whole text is a sentence of the grammar.
bool full_match(const std::shared_ptr<const Grammar>& g, const std::string& text) {
    GrammarMatcher m(g);
    if (!text.empty() && !m.accept(text)) return false;
    return m.can_end();
}

TEST(Grammar, RefusesWhatItCannotHonourNamingIt) {
    const std::pair<const char*, const char*> cases[] = {
        {"root ::= item\n", "'item' is used but not defined"},
        {"root ::= \"a\"\nroot ::= \"b\"\n", "'root' is defined twice"},
        {"answer ::= \"a\"\n", "no rule named 'root'"},
        {"root ::= root \"a\" | \"b\"\n", "'root' is left-recursive"},
        {"root ::= x \"a\"\nx ::= y? root\ny ::= \"b\"\n", "left-recursive"},
        {"root ::= (\"a\"?)*\n", "left-recursive"},
        {"root ::= \"abc\n", "newline inside a literal"},
        {"root ::= \"abc", "unterminated string literal"},
        {"root ::= [a-\n", "newline inside a literal"},
        {"root ::= \"\\q\"\n", "unknown escape"},
        {"root ::= <think>\n", "token references"},
        {"root ::= \"a\"{3,2}\n", "n < m"},
        {"root ::= * \"a\"\n", "nothing before it to repeat"},
        {"root ::= [z-a]\n", "backwards"},
        {"root ::= \"a\" )\n", "unexpected ')'"},
        {"root = \"a\"\n", "expected ::="},
        {"root ::= \"a\"{99999999}\n", "too large"},
        {"root ::= \"\xff\"\n", "invalid UTF-8"},
    };
    for (const auto& [text, says] : cases) {
        auto g = Grammar::parse(text);
        ASSERT_FALSE(g.ok()) << text;
        EXPECT_NE(g.error().message.find(says), std::string::npos) << text << " -> " << g.error().message;
    }
    std::string deep = "root ::= ";
    for (int i = 0; i < 300; ++i) deep += "(";
    deep += "\"a\"";
    for (int i = 0; i < 300; ++i) deep += ")";
    auto g = Grammar::parse(deep);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.error().message.find("nest deeper"), std::string::npos) << g.error().message;
}

// Grammars and the regular expressions they equal, on random strings over
// their alphabet: the matcher and std::regex agree on every string.
TEST(Grammar, MatchesLikeItsRegexTwin) {
    struct Case {
        const char* gbnf;
        const char* regex;
        std::string alphabet;
    };
    const Case cases[] = {
        {"root ::= (\"ab\" | [c-e]+ \"x\"?){2,3} \".\"", "(ab|[c-e]+x?){2,3}\\.", "abcdex."},
        {"root ::= [^a]* \"a\" [ab]?  # a comment\n", "[^a]*a[ab]?", "abc"},
        {"root ::= num (\",\" ws num)*\nnum ::= \"-\"? [0-9]{1,3}\nws ::= | \" \"\n", "-?[0-9]{1,3}(, ?-?[0-9]{1,3})*",
         "-,0 19"},
        {"root ::= (\n  \"x\" |\n  \"y\" \"z\"{,2}\n)+ .\n", "(x|yz{0,2})+[\\s\\S]", "xyz"},
        {"root ::= \"\\x41\\u0042\" [\\]\\-]\n", "AB[\\]\\-]", "AB]-"},
        {"root ::= \"\" | \"q\" root\n", "q*", "qr"},
    };
    std::mt19937 rng(tern::test::run_seed());
    for (const Case& c : cases) {
        SCOPED_TRACE(c.gbnf);
        const auto g = parse_ok(c.gbnf);
        const std::regex re(c.regex);
        int matched = 0;
        for (int i = 0; i < 3000; ++i) {
            std::string s(rng() % 9, ' ');
            for (char& ch : s) ch = c.alphabet[rng() % c.alphabet.size()];
            const bool want = std::regex_match(s, re);
            matched += want;
            ASSERT_EQ(full_match(g, s), want) << "'" << s << "'";
        }
        EXPECT_GT(matched, 0) << "the random strings never matched: the case tests nothing";
    }
}

TEST(Grammar, CharactersMayArriveSplitAcrossTokens) {
    const auto g = parse_ok("root ::= [α-ω]+ \"日本\"\n");
    EXPECT_TRUE(full_match(g, "αβ日本"));
    EXPECT_FALSE(full_match(g, "aβ日本"));
    GrammarMatcher m(g);
    EXPECT_TRUE(m.accept("\xce"));       // the first byte of α
    EXPECT_FALSE(m.can_end());
    EXPECT_FALSE(m.allows("\xce"));      // not a continuation byte
    EXPECT_FALSE(m.allows("\x80\xe6"));  // U+0380 is not in [α-ω]
    EXPECT_TRUE(m.accept("\xb1\xe6"));   // α, then the first byte of 日
    EXPECT_FALSE(m.allows("\x97\xa0"));  // 无, not 日
    EXPECT_TRUE(m.accept("\x97\xa5\xe6\x9c\xac"));
    EXPECT_TRUE(m.can_end());
    EXPECT_FALSE(m.can_continue());
    EXPECT_FALSE(m.allows("x"));
    // Invalid UTF-8 never enters: an overlong form, a lone continuation byte.
    const auto any = parse_ok("root ::= .*\n");
    GrammarMatcher a(any);
    EXPECT_TRUE(a.allows("ok é"));
    EXPECT_FALSE(a.allows("\xc0\xaf"));
    EXPECT_FALSE(a.allows("\x80"));
    EXPECT_FALSE(a.allows("\xed\xa0\x80"));  // a surrogate
    EXPECT_FALSE(a.allows("\xed\xa0"));      // the start of one
    EXPECT_FALSE(a.allows("\xe0\x81"));      // the start of an overlong form
    EXPECT_FALSE(a.allows("\xf4\x90"));      // past U+10FFFF
    // A lead byte is no way into an ASCII class: the characters it starts
    // are all past it (0xe0 begins U+0800..U+0FFF).
    const auto ascii = parse_ok("root ::= [0-9]+ \" \" [a-z]+\n");
    GrammarMatcher m2(ascii);
    EXPECT_TRUE(m2.accept("150 "));
    EXPECT_FALSE(m2.allows("\xe0"));
    EXPECT_FALSE(m2.allows("\xc3"));
    EXPECT_TRUE(m2.allows("c"));
}

TEST(Grammar, AcceptingNothingLeavesTheStateAsItWas) {
    const auto g = parse_ok("root ::= \"ab\" | \"ac\"\n");
    GrammarMatcher m(g);
    EXPECT_FALSE(m.accept("ax"));
    EXPECT_TRUE(m.accept("a"));
    EXPECT_FALSE(m.accept("b\xff"));
    EXPECT_TRUE(m.accept("c"));
    EXPECT_TRUE(m.can_end());
}

// The mask's trie walk against a brute-force allows() of every token, in
// states along random sentences of a JSON-like grammar.
TEST(Grammar, MaskAllowsExactlyTheTokensThatFit) {
    using namespace tern::text;
    std::vector<std::pair<std::string, std::string>> merges = {
        {"{", "\""}, {"\"", ":"}, {" ", "\""}, {"t", "r"}, {"tr", "u"}, {"tru", "e"}, {"1", "2"}, {"12", "3"},
        {"\xce", "\xb1"}, {"\xce\xb1", "\xce"}, {"\"", "}"}, {",", " "}, {"n", "u"}, {"nu", "l"}, {"nul", "l"},
        {"a", "b"}, {"ab", "c"}, {"\\", "n"}, {"}", "\n"},
    };
    // Families of tokens sharing prefixes, so that subtrees are large enough
    // for the mask's shortcuts: letters, digits, quotes and non-ASCII text.
    const std::string letters = "abcdefgh";
    for (char a : letters)
        for (char b : letters) merges.push_back({std::string(1, a), std::string(1, b)});
    for (char a : letters)
        for (char b : std::string("abc")) merges.push_back({std::string(1, a) + "a", std::string(1, b)});
    for (char a : std::string("123"))
        for (char b : std::string("0123456789")) merges.push_back({std::string(1, a), std::string(1, b)});
    for (const char* tail : {"\"", "\\", "é", "\xc3", "日本", "\x01", "\"}"})
        for (const char* head : {"a", "b", "1"}) merges.push_back({head, tail});
    // Subtrees of 20 tokens: plain letters (inside a string, all fit; after
    // "#", while the count of letters left allows their length), "é"
    // and letters (they fit by the non-ASCII rule), and a cut "\xc3" then
    // letters beside them (ill-formed: none fit, though their bytes would).
    for (int i = 0; i < 20; ++i) {
        const std::string tail = std::string(1, letters[size_t(i) % 8]) + std::string(1, "abcde"[i / 8 + 1]);
        merges.push_back({"x", tail});
        merges.push_back({"é", tail});
        merges.push_back({"\xc3", tail});
        merges.push_back({"z", "é" + tail});                           // fit by the non-ASCII rule below 'z'
        merges.push_back({"y", i % 5 ? tail : "\xc3" + tail});         // some ill-formed below 'y'
    }
    Vocab v = testing_util::make_bpe_vocab(merges);
    v.tokens.push_back("<|end|>");
    v.types.push_back(TokenType::Control);
    v.eos_id = int32_t(v.tokens.size()) - 1;
    const Tokenizer tok = testing_util::make_tokenizer(v);
    const auto vocab = GrammarVocab::make(tok);
    const auto g = parse_ok(
        "root ::= \"{\" ws (pair (\",\" ws pair)*)? \"}\" \"\\n\"?\n"
        "pair ::= str \":\" ws value\n"
        "value ::= str | [0-9]+ | \"true\" | \"null\" | root | [a-h]+ [é]? | \"#\" [a-hx]{0,4}\n"
        "str ::= \"\\\"\" ([^\"\\\\\\x00-\\x1f] | \"\\\\\" [n\"])* \"\\\"\"\n"
        "ws ::= \" \"?\n");
    // Compares m's mask with allows() token by token; the allowed tokens.
    auto check_mask = [&](const GrammarMatcher& m, const std::string& where) {
        std::vector<float> logits(size_t(tok.n_vocab()), 1.0f);
        m.mask(logits, *vocab);
        std::vector<int32_t> allowed;
        for (int32_t id = 0; id < tok.n_vocab(); ++id) {
            const bool want = tok.is_eog(id) ? m.can_end() : m.allows(vocab->bytes(id));
            EXPECT_EQ(!std::isinf(logits[size_t(id)]), want) << "token " << id << " '" << vocab->bytes(id) << "' " << where;
            if (want && !tok.is_eog(id)) allowed.push_back(id);
        }
        return allowed;
    };
    std::mt19937 rng(tern::test::run_seed());
    int checked_states = 0;
    for (int walk = 0; walk < 20; ++walk) {
        GrammarMatcher m(g);
        for (int step = 0; step < 40; ++step) {
            const std::vector<int32_t> allowed = check_mask(m, "at step " + std::to_string(step));
            ASSERT_FALSE(testing::Test::HasFailure());
            ++checked_states;
            if (allowed.empty()) break;
            ASSERT_TRUE(m.accept(vocab->bytes(allowed[rng() % allowed.size()])));
        }
    }
    EXPECT_GT(checked_states, 100);
    // Each count of a counted repetition's letters left, each mask twice:
    // walked, then from the masks the matcher kept by state.
    GrammarMatcher m(g);
    ASSERT_TRUE(m.accept("{\"k\": #"));
    for (int left = 4; left >= 0; --left) {
        check_mask(m, std::to_string(left) + " letters left");
        check_mask(m, std::to_string(left) + " letters left, kept");
        if (left > 0) {
            ASSERT_TRUE(m.accept("a"));
        }
    }
}

}  // namespace
