// Byte-level BPE: the GPT-2 byte table, the regex pre-tokenizers against
// splits recorded from Hugging Face tokenizers, merge order on hand-made
// merges, and the heap-based merging against a naive reference on random
// merge tables.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

#include "test_text_util.h"
#include "text/bpe.h"
#include "text/pretokenize.h"
#include "text/tokenizer.h"

using namespace tern::text;
using namespace tern::text::testing_util;

TEST(TextBpe, ByteTableIsABijection) {
    std::set<uint32_t> seen;
    for (int b = 0; b < 256; ++b) {
        const uint32_t cp = bpe_byte_to_codepoint(uint8_t(b));
        EXPECT_TRUE(seen.insert(cp).second);
        EXPECT_EQ(bpe_codepoint_to_byte(cp), b);
    }
    EXPECT_EQ(bpe_byte_to_codepoint(' '), 0x120u);  // "Ġ"
    EXPECT_EQ(bpe_byte_to_codepoint('\n'), 0x10Au);  // "Ċ"
    EXPECT_EQ(bpe_byte_to_codepoint('A'), uint32_t('A'));
    EXPECT_EQ(bpe_byte_to_codepoint(0xAD), 0x143u);
    EXPECT_EQ(bpe_codepoint_to_byte(0x20), -1);
    EXPECT_EQ(bpe_codepoint_to_byte(0x144), -1);
    const std::string all = [] {
        std::string s;
        for (int b = 0; b < 256; ++b) s.push_back(char(b));
        return s;
    }();
    EXPECT_EQ(bpe_text_to_bytes(bpe_bytes_to_text(all)), all);
}

// Expected pieces recorded from the Hugging Face `tokenizers` library with
// the same patterns (Split, behavior "isolated"; smollm as Digits(individual)
// then the GPT-2 pattern).
struct SplitCase {
    const char* pre;
    std::string text;
    std::vector<std::string> pieces;
};
static const SplitCase kSplitCases[] = {
    {"gpt2", "Hello world's  end\n", {"Hello", " world", "'s", " ", " end", "\n"}},
    {"gpt2", "I'M HERE, you're 12345 items!!!\n\nnext", {"I", "'", "M", " HERE", ",", " you", "'re", " 12345", " items", "!!!", "\n", "\n", "next"}},
    {"gpt2", "tab\there   x\r\n\r\n  y", {"tab", "\t", "here", "  ", " x", "\r\n\r\n ", " y"}},
    {"gpt2", " 42 apples", {" 42", " apples"}},
    {"gpt2", "a b　c", {"a", " ", "b", "　", "c"}},
    {"gpt2", "x=(1+2)*3;", {"x", "=(", "1", "+", "2", ")*", "3", ";"}},
    {"gpt2", "ŞİŃ  ﬁne  ", {"ŞİŃ", " ", " ﬁne", "  "}},
    {"gpt2", "٣٤٥ ½ ²", {"٣٤٥", " ½", " ²"}},
    {"llama3", "Hello world's  end\n", {"Hello", " world", "'s", " ", " end", "\n"}},
    {"llama3", "I'M HERE, you're 12345 items!!!\n\nnext", {"I", "'M", " HERE", ",", " you", "'re", " ", "123", "45", " items", "!!!\n\n", "next"}},
    {"llama3", "tab\there   x\r\n\r\n  y", {"tab", "\there", "  ", " x", "\r\n\r\n", " ", " y"}},
    {"llama3", " 42 apples", {" ", "42", " apples"}},
    {"llama3", "a b　c", {"a", " b", "　c"}},
    {"llama3", "x=(1+2)*3;", {"x", "=(", "1", "+", "2", ")*", "3", ";"}},
    {"llama3", "ŞİŃ  ﬁne  ", {"ŞİŃ", " ", " ﬁne", "  "}},
    {"llama3", "٣٤٥ ½ ²", {"٣٤٥", " ", "½", " ", "²"}},
    {"qwen2", "Hello world's  end\n", {"Hello", " world", "'s", " ", " end", "\n"}},
    {"qwen2", "I'M HERE, you're 12345 items!!!\n\nnext", {"I", "'M", " HERE", ",", " you", "'re", " ", "1", "2", "3", "4", "5", " items", "!!!\n\n", "next"}},
    {"qwen2", "tab\there   x\r\n\r\n  y", {"tab", "\there", "  ", " x", "\r\n\r\n", " ", " y"}},
    {"qwen2", " 42 apples", {" ", "4", "2", " apples"}},
    {"qwen2", "a b　c", {"a", " b", "　c"}},
    {"qwen2", "x=(1+2)*3;", {"x", "=(", "1", "+", "2", ")*", "3", ";"}},
    {"qwen2", "ŞİŃ  ﬁne  ", {"ŞİŃ", " ", " ﬁne", "  "}},
    {"qwen2", "٣٤٥ ½ ²", {"٣", "٤", "٥", " ", "½", " ", "²"}},
    {"smollm", "Hello world's  end\n", {"Hello", " world", "'s", " ", " end", "\n"}},
    {"smollm", "I'M HERE, you're 12345 items!!!\n\nnext", {"I", "'", "M", " HERE", ",", " you", "'re", " ", "1", "2", "3", "4", "5", " items", "!!!", "\n", "\n", "next"}},
    {"smollm", "tab\there   x\r\n\r\n  y", {"tab", "\t", "here", "  ", " x", "\r\n\r\n ", " y"}},
    {"smollm", " 42 apples", {" ", "4", "2", " apples"}},
    {"smollm", "a b　c", {"a", " ", "b", "　", "c"}},
    {"smollm", "x=(1+2)*3;", {"x", "=(", "1", "+", "2", ")*", "3", ";"}},
    {"smollm", "ŞİŃ  ﬁne  ", {"ŞİŃ", " ", " ﬁne", "  "}},
    {"smollm", "٣٤٥ ½ ²", {"٣", "٤", "٥", " ", "½", " ", "²"}},
};

TEST(TextBpe, PreTokenizersMatchRecordedSplits) {
    for (const SplitCase& c : kSplitCases) {
        auto pre = PreTokenizer::create(c.pre);
        ASSERT_TRUE(pre.ok()) << pre.error().message;
        std::vector<std::string_view> got;
        pre->split(c.text, got);
        std::vector<std::string> got_s(got.begin(), got.end());
        EXPECT_EQ(got_s, c.pieces) << c.pre << " on " << testing::PrintToString(c.text);
    }
}

TEST(TextBpe, PreTokenizerAliasesAndUnknownNames) {
    for (const char* name : {"default", "llama-bpe", "smaug-bpe", "starcoder", "deepseek-r1-qwen"})
        EXPECT_TRUE(PreTokenizer::create(name).ok()) << name;
    EXPECT_TRUE(PreTokenizer::create("llama3")->ignore_merges());
    EXPECT_FALSE(PreTokenizer::create("smollm")->ignore_merges());
    auto bad = PreTokenizer::create("no-such-pre");
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message.find("no-such-pre"), std::string::npos);
    EXPECT_NE(bad.error().message.find("qwen2"), std::string::npos);  // lists the known ones
}

TEST(TextBpe, PreTokenizerCoversRandomBytesExactly) {
    const uint32_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::vector<std::string> palette = {"a", "Z", "7", " ", "  ", "\n", "\r\n", "\t", "'s", "'T", "!", "é",
                                              "中", "😀", "\xC2\xA0", "\xFF", "\x80", "\xE4\xB8", "\xF0\x9F", "\0"};
    for (const char* name : {"gpt2", "llama3", "qwen2", "smollm"}) {
        auto pre = PreTokenizer::create(name);
        ASSERT_TRUE(pre.ok());
        for (int iter = 0; iter < 300; ++iter) {
            const std::string s = iter % 2 ? random_text(rng, palette, 40) : random_bytes(rng, 60);
            std::vector<std::string_view> pieces;
            pre->split(s, pieces);
            std::string joined;
            for (std::string_view p : pieces) {
                EXPECT_FALSE(p.empty());
                joined += p;
            }
            ASSERT_EQ(joined, s) << name << " " << testing::PrintToString(s);
        }
    }
}

TEST(TextBpe, PreTokenizerHandlesLongRuns) {
    auto pre = PreTokenizer::create("llama3");
    ASSERT_TRUE(pre.ok());
    const std::string spaces(200000, ' ');
    const std::string letters(200000, 'x');
    const std::string text = spaces + "y" + letters + std::string(50000, '\n');
    std::vector<std::string_view> pieces;
    pre->split(text, pieces);
    // The space run leaves its last space to the letter run; the newlines stay together.
    ASSERT_EQ(pieces.size(), 3u);
    EXPECT_EQ(pieces[0].size(), spaces.size() - 1);
    EXPECT_EQ(pieces[1].size(), 2 + letters.size());
    EXPECT_EQ(pieces[2].size(), 50000u);
}

TEST(TextBpe, MergesApplyInRankOrder) {
    // "abc" with a+b ranked before b+c gives "ab c"; the other order "a bc".
    {
        Tokenizer t = make_tokenizer(make_bpe_vocab({{"a", "b"}, {"b", "c"}}));
        const Vocab& v = t.vocab();
        EXPECT_EQ(t.encode("abc", false, false), (std::vector<int32_t>{find_token(v, "ab"), 'c'}));
    }
    {
        Tokenizer t = make_tokenizer(make_bpe_vocab({{"b", "c"}, {"a", "b"}}));
        const Vocab& v = t.vocab();
        EXPECT_EQ(t.encode("abc", false, false), (std::vector<int32_t>{'a', find_token(v, "bc")}));
    }
    // Equal ranks merge leftmost first: "aaa" -> "aa a".
    {
        Tokenizer t = make_tokenizer(make_bpe_vocab({{"a", "a"}}));
        EXPECT_EQ(t.encode("aaa", false, false), (std::vector<int32_t>{find_token(t.vocab(), "aa"), 'a'}));
        EXPECT_EQ(t.encode("aaaa", false, false),
                  (std::vector<int32_t>{find_token(t.vocab(), "aa"), find_token(t.vocab(), "aa")}));
    }
    // Chains: h e l l o with ranked merges builds " hello" from the pre-tokenized " hello".
    {
        Tokenizer t = make_tokenizer(make_bpe_vocab(
            {{"l", "l"}, {"h", "e"}, {"he", "ll"}, {"hell", "o"}, {" ", "hello"}, {" ", "w"}, {"o", "r"}}));
        const Vocab& v = t.vocab();
        EXPECT_EQ(t.encode("hello hello world", false, false),
                  (std::vector<int32_t>{find_token(v, bpe_bytes_to_text("hello")),
                                        find_token(v, bpe_bytes_to_text(" hello")),
                                        find_token(v, bpe_bytes_to_text(" w")), find_token(v, "or"), 'l', 'd'}));
    }
    // Merges never cross a pre-tokenizer boundary: "a" and " b" are separate pieces.
    {
        Tokenizer t = make_tokenizer(make_bpe_vocab({{"a", " "}}));
        EXPECT_EQ(t.encode("a b", false, false), (std::vector<int32_t>{'a', ' ', 'b'}));
    }
}

TEST(TextBpe, IgnoreMergesTakesWholeWordTokens) {
    // "abcd" is a token but no merge sequence reaches it: llama3 (ignore
    // merges) uses it directly, gpt2 merges as listed.
    for (const char* pre : {"llama3", "gpt2"}) {
        Vocab v = make_bpe_vocab({{"a", "b"}, {"c", "d"}}, pre);
        v.tokens.push_back("abcd");
        v.types.push_back(TokenType::Normal);
        const int32_t whole = v.size() - 1;
        Tokenizer t = make_tokenizer(v);
        const std::vector<int32_t> got = t.encode("abcd", false, false);
        if (std::string(pre) == "llama3") EXPECT_EQ(got, std::vector<int32_t>{whole});
        else EXPECT_EQ(got, (std::vector<int32_t>{find_token(v, "ab"), find_token(v, "cd")}));
    }
}

TEST(TextBpe, BytesWithoutTokensAreDropped) {
    Vocab v = make_bpe_vocab({{"a", "b"}, {"!", "?"}});
    v.tokens[7] = "seven";
    Tokenizer t = make_tokenizer(v);
    EXPECT_EQ(t.encode("x\x07" "y", false, false), (std::vector<int32_t>{'x', 'y'}));
    // The pre-tokenizer makes "\x07" a piece of its own between letters...
    EXPECT_EQ(t.encode("a\x07" "b", false, false), (std::vector<int32_t>{'a', 'b'}));
    // ...but inside a symbol run the byte is dropped before merging, as
    // Hugging Face's BPE does, so its neighbours merge.
    EXPECT_EQ(t.encode("!\x07?", false, false), std::vector<int32_t>{find_token(v, "!?")});
    EXPECT_EQ(t.encode("\x07", false, false), std::vector<int32_t>{});
    // No byte-level alphabet at all: not a gpt2 vocabulary.
    Vocab alien = make_bpe_vocab({{"a", "b"}});
    for (int b = 0; b < 256; ++b) alien.tokens[size_t(b)] = "t" + std::to_string(b);
    auto bad = Tokenizer::create(alien);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message.find("byte-level"), std::string::npos) << bad.error().message;
}

TEST(TextBpe, InvalidVocabulariesAreErrors) {
    Vocab no_merges = make_bpe_vocab({});
    EXPECT_FALSE(Tokenizer::create(no_merges).ok());
    Vocab bad_pre = make_bpe_vocab({{"a", "b"}}, "klingon");
    EXPECT_FALSE(Tokenizer::create(bad_pre).ok());
}

// Reference BPE: repeatedly merge the lowest-ranked adjacent pair (leftmost
// on ties), rescanning everything each time.
static std::vector<std::string> reference_bpe(std::string_view piece, const std::map<std::pair<std::string, std::string>, int>& ranks) {
    std::vector<std::string> sym;
    for (char c : piece) sym.push_back(bpe_bytes_to_text(std::string(1, c)));
    for (;;) {
        int best = -1;
        size_t at = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
            auto it = ranks.find({sym[i], sym[i + 1]});
            if (it != ranks.end() && (best < 0 || it->second < best)) {
                best = it->second;
                at = i;
            }
        }
        if (best < 0) return sym;
        sym[at] += sym[at + 1];
        sym.erase(sym.begin() + long(at) + 1);
    }
}

TEST(TextBpe, HeapMergingMatchesReferenceOnRandomMergeTables) {
    const uint32_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::string alphabet = "abcd é";
    for (int table = 0; table < 20; ++table) {
        // Merges of tokens that exist so far, so each one can fire.
        std::vector<std::string> have;
        for (char c : alphabet) have.push_back(std::string(1, c));
        std::vector<std::pair<std::string, std::string>> merges;
        std::set<std::pair<std::string, std::string>> used;
        for (int k = 0; k < 120; ++k) {
            const std::string& l = have[rng() % have.size()];
            const std::string& r = have[rng() % have.size()];
            if (!used.insert({l, r}).second || l.size() + r.size() > 12) continue;
            merges.push_back({l, r});
            have.push_back(l + r);
        }
        Vocab v = make_bpe_vocab(merges);
        std::map<std::pair<std::string, std::string>, int> ranks;
        for (size_t i = 0; i < merges.size(); ++i)
            ranks.try_emplace({bpe_bytes_to_text(merges[i].first), bpe_bytes_to_text(merges[i].second)}, int(i));
        Tokenizer t = make_tokenizer(v);
        auto pre = PreTokenizer::create("gpt2");
        for (int iter = 0; iter < 50; ++iter) {
            std::string s;
            const size_t n = rng() % 40;
            for (size_t i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
            std::vector<std::string_view> pieces;
            pre->split(s, pieces);
            std::vector<int32_t> expected;
            for (std::string_view p : pieces)
                for (const std::string& sym : reference_bpe(p, ranks)) expected.push_back(find_token(v, sym));
            ASSERT_EQ(t.encode(s, false, false), expected) << testing::PrintToString(s);
            ASSERT_EQ(t.decode(t.encode(s, false, false)), s);
        }
    }
}

TEST(TextBpe, InvalidUtf8RoundTripsExactly) {
    const uint32_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Tokenizer t = make_tokenizer(make_bpe_vocab({{"a", "b"}, {"\xE4", "\xB8"}, {" ", "a"}}, "llama3"));
    for (int iter = 0; iter < 300; ++iter) {
        const std::string s = random_bytes(rng, 80);
        const std::vector<int32_t> ids = t.encode(s, false, true);
        ASSERT_EQ(t.decode(ids), s) << testing::PrintToString(s);
    }
    EXPECT_EQ(t.decode(t.encode("x\xFF\xE4\xB8y", false, false)), "x\xFF\xE4\xB8y");
}

TEST(TextBpe, UserDefinedAndControlTokens) {
    Vocab v = make_bpe_vocab({{"a", "b"}});
    v.tokens.push_back("<ctl>");
    v.types.push_back(TokenType::Control);
    const int32_t ctl = v.size() - 1;
    v.tokens.push_back("<user>");
    v.types.push_back(TokenType::UserDefined);
    const int32_t user = v.size() - 1;
    v.tokens.push_back("<user>long");  // longest match wins
    v.types.push_back(TokenType::UserDefined);
    const int32_t user_long = v.size() - 1;
    v.bos_id = ctl;
    v.add_bos = true;
    Tokenizer t = make_tokenizer(v);
    const int32_t ab = find_token(t.vocab(), "ab");
    // User-defined tokens are matched with or without parse_special.
    EXPECT_EQ(t.encode("ab<user>ab", false, false), (std::vector<int32_t>{ab, user, ab}));
    EXPECT_EQ(t.encode("<user>longab", false, false), (std::vector<int32_t>{user_long, ab}));
    // Control tokens only with parse_special.
    EXPECT_EQ(t.encode("<ctl>ab", false, true), (std::vector<int32_t>{ctl, ab}));
    const std::vector<int32_t> plain = t.encode("<ctl>ab", false, false);
    EXPECT_EQ(std::count(plain.begin(), plain.end(), ctl), 0);
    EXPECT_EQ(t.decode(plain), "<ctl>ab");
    // add_special puts BOS in front; decode can drop it again.
    const std::vector<int32_t> with_bos = t.encode("ab", true, false);
    EXPECT_EQ(with_bos, (std::vector<int32_t>{ctl, ab}));
    EXPECT_EQ(t.decode(with_bos), "<ctl>ab");
    EXPECT_EQ(t.decode(with_bos, true), "ab");
    EXPECT_EQ(t.token_to_piece(user), "<user>");
    EXPECT_EQ(t.token_to_piece(' '), " ");
    EXPECT_EQ(t.token_to_piece(-1), "");
    EXPECT_EQ(t.token_to_piece(t.n_vocab()), "");
}
