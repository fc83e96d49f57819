// SentencePiece-style tokenization on hand-made vocabularies: score-driven
// merge order, byte fallback, the unknown token, the space prefix (at the
// start and after special tokens), round trips, and a larger synthesized
// vocabulary checked against a naive reference of the same algorithm.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <span>

#include "test_text_util.h"
#include "text/spm.h"
#include "text/tokenizer.h"

using namespace tern::text;
using namespace tern::text::testing_util;

namespace {

const std::string kSp = "\xE2\x96\x81";  // "▁"

// <unk>, <s>, </s>, 256 byte tokens, then the given pieces (▁ for space).
Vocab make_spm_vocab(const std::vector<std::pair<std::string, float>>& pieces, bool byte_tokens = true,
                     bool space_prefix = true) {
    Vocab v;
    v.kind = VocabKind::Spm;
    auto add = [&](std::string text, float score, TokenType type) {
        v.tokens.push_back(std::move(text));
        v.scores.push_back(score);
        v.types.push_back(type);
    };
    add("<unk>", 0, TokenType::Unknown);
    add("<s>", 0, TokenType::Control);
    add("</s>", 0, TokenType::Control);
    if (byte_tokens) {
        for (int b = 0; b < 256; ++b) {
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", b);
            add(name, 0, TokenType::Byte);
        }
    }
    for (const auto& [text, score] : pieces) add(text, score, TokenType::Normal);
    v.unk_id = 0;
    v.bos_id = 1;
    v.eos_id = 2;
    v.add_bos = true;
    v.add_space_prefix = space_prefix;
    return v;
}

std::vector<int32_t> ids_of(const Vocab& v, const std::vector<std::string>& texts) {
    std::vector<int32_t> out;
    for (const std::string& t : texts) {
        const int32_t id = find_token(v, t);
        EXPECT_GE(id, 0) << "no token " << t;
        out.push_back(id);
    }
    return out;
}

}  // namespace

TEST(TextSpm, HigherScoreMergesFirst) {
    // ab scores above bc: "abc" -> ab c. Reversed: a bc.
    {
        Vocab v = make_spm_vocab({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -1}, {"bc", -2}}, true, false);
        Tokenizer t = make_tokenizer(v);
        EXPECT_EQ(t.encode("abc", false, false), ids_of(v, {"ab", "c"}));
    }
    {
        Vocab v = make_spm_vocab({{"a", -5}, {"b", -5}, {"c", -5}, {"ab", -2}, {"bc", -1}}, true, false);
        Tokenizer t = make_tokenizer(v);
        EXPECT_EQ(t.encode("abc", false, false), ids_of(v, {"a", "bc"}));
    }
    // Merged symbols merge again: a b c d -> ab cd -> abcd.
    {
        Vocab v = make_spm_vocab(
            {{"a", -5}, {"b", -5}, {"c", -5}, {"d", -5}, {"ab", -1}, {"cd", -1}, {"abcd", -3}}, true, false);
        Tokenizer t = make_tokenizer(v);
        EXPECT_EQ(t.encode("abcd", false, false), ids_of(v, {"abcd"}));
        // Equal scores: the leftmost pair first, so "aaa" -> aa a.
        Vocab w = make_spm_vocab({{"a", -5}, {"aa", -1}}, true, false);
        Tokenizer tw = make_tokenizer(w);
        EXPECT_EQ(tw.encode("aaa", false, false), ids_of(w, {"aa", "a"}));
    }
}

TEST(TextSpm, SpacePrefixAndEscaping) {
    Vocab v = make_spm_vocab({{kSp, -3}, {"h", -4}, {"i", -4}, {kSp + "h", -2}, {kSp + "hi", -1}, {"!", -4}});
    Tokenizer t = make_tokenizer(v);
    // "hi hi!" -> ▁hi▁hi! ; BOS with add_special.
    EXPECT_EQ(t.encode("hi hi!", false, false), ids_of(v, {kSp + "hi", kSp + "hi", "!"}));
    std::vector<int32_t> with_bos = t.encode("hi", true, false);
    ASSERT_EQ(with_bos.size(), 2u);
    EXPECT_EQ(with_bos[0], 1);
    EXPECT_EQ(t.token_to_piece(find_token(v, kSp + "hi")), " hi");
    EXPECT_EQ(t.decode(t.encode("hi hi!", true, false), true), "hi hi!");
    EXPECT_EQ(t.decode(t.encode(" hi", false, false)), " hi");  // a typed leading space survives
    EXPECT_EQ(t.decode(t.encode("  ", false, false)), "  ");
    // After a special token the text gets its own prefix, and decode removes it.
    EXPECT_EQ(t.encode("<s>hi", false, true), (std::vector<int32_t>{1, find_token(v, kSp + "hi")}));
    EXPECT_EQ(t.decode(t.encode("hi</s>hi", false, true)), "hi</s>hi");
    // Without the flag nothing is added.
    Vocab nv = v;
    nv.add_space_prefix = false;
    Tokenizer tn = make_tokenizer(nv);
    EXPECT_EQ(tn.encode("hi", false, false), ids_of(nv, {"h", "i"}));
    EXPECT_EQ(tn.decode(tn.encode(" hi", false, false)), " hi");
}

TEST(TextSpm, ByteFallbackAndUnknown) {
    Vocab v = make_spm_vocab({{"a", -1}, {kSp, -2}}, true, false);
    Tokenizer t = make_tokenizer(v);
    // é is not a piece: its two bytes come out as <0xC3> <0xA9>.
    EXPECT_EQ(t.encode("a\xC3\xA9", false, false), ids_of(v, {"a", "<0xC3>", "<0xA9>"}));
    EXPECT_EQ(t.token_to_piece(find_token(v, "<0xC3>")), "\xC3");
    EXPECT_EQ(t.decode(t.encode("a\xC3\xA9 a", false, false)), "a\xC3\xA9 a");
    // Invalid bytes are single symbols and fall back to bytes too: exact round trip.
    const std::string bad = "a\xFF\xE4\xB8 \x80";
    EXPECT_EQ(t.decode(t.encode(bad, false, false)), bad);
    // No byte tokens: one <unk> per unknown character.
    Vocab nb = make_spm_vocab({{"a", -1}}, false, false);
    Tokenizer tn = make_tokenizer(nb);
    EXPECT_EQ(tn.encode("a\xC3\xA9" "a\xFF", false, false),
              (std::vector<int32_t>{find_token(nb, "a"), 0, find_token(nb, "a"), 0}));
    // Byte-token text typed in the input is ordinary text, not a byte.
    const std::vector<int32_t> typed = t.encode("<0x41>", false, false);
    EXPECT_EQ(t.decode(typed), "<0x41>");
    EXPECT_EQ(std::count(typed.begin(), typed.end(), find_token(v, "<0x41>")), 0);
}

TEST(TextSpm, RandomRoundTrips) {
    const uint32_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Vocab v = make_spm_vocab({{kSp, -3}, {"a", -2}, {"b", -2}, {kSp + "a", -1}, {"ab", -1.5f}, {"ä", -2},
                              {"\n", -2}, {kSp + kSp, -2.5f}});
    const std::vector<std::string> palette = {"a", "b", "ab", " ", "  ", "\n", "ä", "中", "😀", "<s>", "</s>",
                                              "x", "\t", "\xFF", "\xE4\xB8", "<0x41>"};
    for (bool prefix : {true, false}) {
        v.add_space_prefix = prefix;
        Tokenizer t = make_tokenizer(v);
        for (int iter = 0; iter < 400; ++iter) {
            const std::string s = random_text(rng, palette, 20);
            for (bool parse_special : {false, true}) {
                const std::vector<int32_t> ids = t.encode(s, true, parse_special);
                ASSERT_FALSE(ids.empty());
                ASSERT_EQ(ids[0], v.bos_id);
                ASSERT_EQ(t.decode(std::span(ids).subspan(1)), s) << testing::PrintToString(s) << " prefix " << prefix;
                if (!parse_special) {
                    // Only BOS is a control token when specials are not parsed.
                    for (size_t i = 1; i < ids.size(); ++i) ASSERT_FALSE(t.is_control(ids[i]));
                }
            }
        }
    }
}

// Reference: rescan all adjacent pairs each step, merge the best-scoring
// (leftmost on ties), then spell leftovers with byte tokens.
static std::vector<int32_t> reference_spm(const std::string& escaped, const Vocab& v,
                                          const std::map<std::string, int32_t>& normal) {
    std::vector<std::string> sym;
    for (size_t i = 0; i < escaped.size();) {
        size_t len = 1;
        const uint8_t b = uint8_t(escaped[i]);
        const size_t need = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : 2;
        len = std::min(need, escaped.size() - i);  // test text is valid UTF-8
        sym.push_back(escaped.substr(i, len));
        i += len;
    }
    for (;;) {
        int best = -1;
        float best_score = 0;
        for (size_t i = 0; i + 1 < sym.size(); ++i) {
            auto it = normal.find(sym[i] + sym[i + 1]);
            if (it == normal.end()) continue;
            const float s = v.scores[size_t(it->second)];
            if (best < 0 || s > best_score) {
                best = int(i);
                best_score = s;
            }
        }
        if (best < 0) break;
        sym[size_t(best)] += sym[size_t(best) + 1];
        sym.erase(sym.begin() + best + 1);
    }
    std::vector<int32_t> out;
    for (const std::string& s : sym) {
        auto it = normal.find(s);
        if (it != normal.end()) {
            out.push_back(it->second);
            continue;
        }
        for (char c : s) {
            char name[8];
            std::snprintf(name, sizeof name, "<0x%02X>", uint8_t(c));
            out.push_back(find_token(v, name));
        }
    }
    return out;
}

TEST(TextSpm, SynthesizedVocabularyMatchesReference) {
    const uint32_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    // Pieces: every substring (up to 5 characters) of random words over a
    // small alphabet, with random scores; about 3000 pieces.
    const std::vector<std::string> chars = {"a", "e", "n", "r", "s", "t", "ö", "中", kSp};
    std::set<std::string> pieces;
    while (pieces.size() < 3000) {
        std::vector<std::string> word;
        const size_t n = 1 + rng() % 8;
        for (size_t i = 0; i < n; ++i) word.push_back(chars[rng() % chars.size()]);
        for (size_t i = 0; i < n; ++i) {
            std::string s;
            for (size_t j = i; j < n && j < i + 5; ++j) {
                s += word[j];
                pieces.insert(s);
            }
        }
    }
    std::vector<std::pair<std::string, float>> scored;
    std::uniform_real_distribution<float> score(-20.0f, 0.0f);
    for (const std::string& p : pieces) {
        if (p == "中") continue;  // leave one character to byte fallback
        scored.push_back({p, std::round(score(rng) * 4) / 4});  // coarse scores produce ties
    }
    Vocab v = make_spm_vocab(scored);
    std::map<std::string, int32_t> normal;
    for (int32_t id = 0; id < v.size(); ++id)
        if (v.types[size_t(id)] == TokenType::Normal) normal.emplace(v.tokens[size_t(id)], id);
    Tokenizer t = make_tokenizer(v);
    const std::vector<std::string> palette = {"a", "e", "n", "r", "s", "t", "ö", "中", " ", "  ", "x"};
    for (int iter = 0; iter < 300; ++iter) {
        const std::string s = random_text(rng, palette, 30);
        std::string escaped = kSp;
        for (char c : s) {
            if (c == ' ') escaped += kSp;
            else escaped.push_back(c);
        }
        const std::vector<int32_t> got = t.encode(s, false, false);
        // Empty text has no fragment, so no prefix either.
        const std::vector<int32_t> expected = s.empty() ? std::vector<int32_t>{} : reference_spm(escaped, v, normal);
        ASSERT_EQ(got, expected) << testing::PrintToString(s);
        ASSERT_EQ(t.decode(got), s);
    }
}
