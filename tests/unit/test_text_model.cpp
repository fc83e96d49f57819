// The tokenizer on the real test model (SmolLM2-135M-Instruct: byte-level
// BPE, pre-tokenizer "smollm", 49152 tokens): vocabulary loading, token ids
// of fixed strings against an independent implementation, round trips over
// many scripts, emoji, whitespace and invalid bytes, special tokens, and
// streaming detokenization of characters split across tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <optional>

#include "gguf/gguf.h"
#include "test_text_util.h"
#include "text/detok.h"
#include "text/tokenizer.h"
#include "text/utf8.h"

using namespace tern;
using namespace tern::text;
using namespace tern::text::testing_util;

namespace {

// Loaded once for the whole suite (about 0.1 s).
class TextModel : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        const std::string path = test_model_path(&load_error_);
        if (path.empty()) return;
        auto file = gguf::File::open(path);
        if (!file) {
            load_error_ = file.error().message;
            return;
        }
        auto vocab = load_vocab(**file);
        if (!vocab) {
            load_error_ = vocab.error().message;
            return;
        }
        auto tok = Tokenizer::create(std::move(vocab.value()));
        if (!tok) {
            load_error_ = tok.error().message;
            return;
        }
        tok_.emplace(std::move(tok.value()));
    }
    void SetUp() override {
        ASSERT_TRUE(tok_.has_value()) << "test model did not load: " << load_error_;
    }
    static const Tokenizer& tok() { return *tok_; }

    static inline std::optional<Tokenizer> tok_;
    static inline std::string load_error_;
};

struct FixedCase {
    std::string text;
    std::vector<int32_t> ids;        // parse_special = true
    std::vector<int32_t> ids_plain;  // parse_special = false, when different
};

// Expected ids come from the Hugging Face `tokenizers` library (0.23), with a
// BPE model built from this GGUF's tokens and merges, SmolLM2's pre-tokenizer
// (Digits(individual_digits) then ByteLevel(add_prefix_space=false)) and the
// control tokens registered as special tokens; "plain" ids were taken with
// encode_special_tokens on. Each also decodes back to its text there.
const FixedCase kFixed[] = {
    {"Hello, world!",
     {19556, 28, 905, 17}, {}},
    {"The quick brown fox jumps over the lazy dog.",
     {504, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 30}, {}},
    {"  leading spaces and trailing   ",
     {216, 2899, 5600, 284, 35079, 333}, {}},
    {"Numbers: 1234567890 and 3.14159, year 2024.",
     {39006, 42, 216, 33, 34, 35, 36, 37, 38, 39, 40, 41, 32, 284, 216, 35, 30, 33, 36, 33, 37, 41, 28, 713, 216, 34, 32, 34, 36, 30}, {}},
    {"Grüße aus München, schöne Äpfel!",
     {27302, 7170, 34878, 85, 253, 376, 30919, 94, 7554, 28, 11659, 7466, 662, 5549, 222, 96, 34520, 17}, {}},
    {"你好，世界！今天天气很好。",
     {18645, 250, 48392, 138, 12831, 7906, 240, 178, 239, 230, 8083, 219, 15076, 228, 18614, 119, 18614, 119, 177, 125, 238, 29157, 226, 48392, 138, 19076}, {}},
    {"こんにちは、世界。カタカナとひらがな。",
     {7365, 237, 10391, 237, 41152, 7365, 111, 7365, 124, 29917, 7906, 240, 178, 239, 230, 19076, 10391, 121, 10391, 140, 10391, 121, 11100, 228, 7365, 118, 7365, 127, 10391, 227, 7365, 230, 7365, 120, 19076}, {}},
    {"مرحبا بالعالم",
     {21706, 20602, 44626, 31462, 10805, 45726, 22208, 34966, 22208, 21706}, {}},
    {"नमस्ते दुनिया",
     {30658, 35090, 38770, 16525, 26293, 30581, 12335, 116, 42990, 30658, 27011, 32932, 18075}, {}},
    {"Emoji: 👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️",
     {10809, 33777, 42, 15107, 235, 231, 10813, 233, 138, 15107, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117, 321, 231, 10813, 235, 116, 15107, 225, 119, 10813, 225, 120, 4636, 247, 114, 31752}, {}},
    {"def f(x):\n\treturn x**2  # comment\n\n\nprint(f(3))",
     {1604, 275, 24, 104, 727, 198, 197, 5406, 1792, 828, 34, 216, 907, 5189, 1116, 198, 3272, 24, 86, 24, 35, 1292}, {}},
    {"<|im_start|>user\nHi there<|im_end|>\n",
     {1, 4093, 198, 26843, 665, 2, 198},
     {44, 108, 306, 79, 3738, 108, 46, 4093, 198, 26843, 665, 44, 108, 306, 79, 486, 108, 46, 198}},
    {"I'm sure they'll say it's fine, we've seen what you'd do.",
     {57, 5248, 2090, 502, 3060, 1643, 357, 506, 4979, 28, 392, 3543, 2269, 732, 346, 6737, 536, 30}, {}},
};

}  // namespace

TEST_F(TextModel, VocabularyMetadata) {
    const Vocab& v = tok().vocab();
    EXPECT_EQ(v.kind, VocabKind::Bpe);
    EXPECT_EQ(v.pre, "smollm");
    EXPECT_EQ(v.size(), 49152);
    EXPECT_EQ(v.merges.size(), 48900u);
    EXPECT_EQ(v.bos_id, 1);
    EXPECT_EQ(v.eos_id, 2);
    EXPECT_EQ(v.unk_id, 0);
    EXPECT_FALSE(v.add_bos);
    EXPECT_FALSE(v.add_space_prefix);
    EXPECT_EQ(v.tokens[1], "<|im_start|>");
    EXPECT_EQ(v.type(1), TokenType::Control);
    EXPECT_EQ(v.type(17), TokenType::Normal);
    EXPECT_EQ(tok().pre_name(), "smollm");
}

TEST_F(TextModel, FixedStringsMatchReferenceIds) {
    for (const FixedCase& c : kFixed) {
        EXPECT_EQ(tok().encode(c.text, false, true), c.ids) << testing::PrintToString(c.text);
        const std::vector<int32_t>& plain = c.ids_plain.empty() ? c.ids : c.ids_plain;
        EXPECT_EQ(tok().encode(c.text, false, false), plain) << testing::PrintToString(c.text);
        EXPECT_EQ(tok().decode(c.ids), c.text);
    }
}

TEST_F(TextModel, RoundTripsAcrossScripts) {
    const std::string texts[] = {
        "English text with punctuation: (a), [b], {c}; \"quotes\" & 'apostrophes'.",
        "Größenänderung: Äußerst schöne Übungen für Öl und Straße.",
        "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
        "日本語のテキスト：東京は日本の首都です。ｶﾀｶﾅ半角も。",
        "النص العربي: مرحبا، كيف حالك؟ ١٢٣",
        "हिन्दी पाठ: भारत एक विशाल देश है। १२३४",
        "Emoji 😀🎉👍🏿 👩‍💻 👨‍👩‍👧‍👦 🏳️‍🌈 🇯🇵 1️⃣ ❤️‍🔥",
        "    spaces    inside   and tabs\t\t\there  ",
        "\n\nnew\nlines\r\n\r\nand \n \n mixed\n",
        "digits 0 12 345 6789 3.14159 1e-10 ١٢٣ ۴۵۶ ½",
        "",
        " ",
        "\n",
        "a",
    };
    for (const std::string& s : texts) {
        const std::vector<int32_t> ids = tok().encode(s, false, false);
        EXPECT_EQ(tok().decode(ids), s) << testing::PrintToString(s);
        for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok().n_vocab());
    }
}

TEST_F(TextModel, RandomTextRoundTrips) {
    const uint32_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    const std::vector<std::string> palette = {
        "the", " the", "Hello", " world", "ü", "ß", "中文", "日本", "ع", "न्", "😀", "👨‍👩‍👧", "🇩🇪",
        " ", "   ", "\t", "\n", "\r\n", "0", "42", "7", "'s", "'LL", "!", "?!", "...", "<|im_start|>",
        "<|im_end|>", "<", "|", "\xC2\xA0", "\xE3\x80\x80"};
    for (int iter = 0; iter < 300; ++iter) {
        const std::string s = random_text(rng, palette, 25);
        for (bool parse_special : {false, true}) {
            const std::vector<int32_t> ids = tok().encode(s, false, parse_special);
            ASSERT_EQ(tok().decode(ids), s) << testing::PrintToString(s);
        }
    }
}

TEST_F(TextModel, InvalidUtf8RoundTripsExceptUnencodableBytes) {
    // This vocabulary has no token for 21 bytes (0x04 0x06 0x13 0x14 0x16
    // 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5-0xFF): encoding drops them, as Hugging
    // Face's BPE does. Every other byte string comes back exactly.
    std::array<bool, 256> encodable{};
    int missing = 0;
    for (int b = 0; b < 256; ++b) {
        const int32_t id = find_token(tok().vocab(), bpe_bytes_to_text(std::string(1, char(b))));
        encodable[size_t(b)] = id >= 0;
        missing += id < 0;
    }
    EXPECT_EQ(missing, 21);
    EXPECT_FALSE(encodable[0xFF]);
    EXPECT_TRUE(encodable[0x80]);
    const uint32_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    for (int iter = 0; iter < 300; ++iter) {
        std::string s = random_bytes(rng, 64);
        if (iter % 2) s = "ok " + s + " 中";
        std::string expected;
        for (char c : s)
            if (encodable[uint8_t(c)]) expected.push_back(c);
        const std::vector<int32_t> ids = tok().encode(s, false, true);
        ASSERT_EQ(tok().decode(ids), expected) << testing::PrintToString(s);
    }
    const std::string truncated = "caf\xC3";  // é cut in half
    EXPECT_EQ(tok().decode(tok().encode(truncated, false, false)), truncated);
    EXPECT_EQ(tok().decode(tok().encode("a\xFF\xFE" "b\x80", false, false)), "ab\x80");
}

TEST_F(TextModel, SpecialTokensOnlyWhenParsed) {
    const std::string text = "<|im_start|>user\nHi<|im_end|>";
    const std::vector<int32_t> parsed = tok().encode(text, false, true);
    ASSERT_GE(parsed.size(), 3u);
    EXPECT_EQ(parsed.front(), 1);  // <|im_start|>
    EXPECT_EQ(parsed.back(), 2);   // <|im_end|>
    EXPECT_EQ(std::count_if(parsed.begin(), parsed.end(), [&](int32_t id) { return tok().is_control(id); }), 2);
    const std::vector<int32_t> plain = tok().encode(text, false, false);
    for (int32_t id : plain) EXPECT_FALSE(tok().is_control(id)) << id;
    EXPECT_GT(plain.size(), parsed.size());
    EXPECT_EQ(tok().decode(plain), text);
    EXPECT_EQ(tok().decode(parsed), text);
    EXPECT_EQ(tok().decode(parsed, true), "user\nHi");
    EXPECT_EQ(tok().token_to_piece(1), "<|im_start|>");
    EXPECT_EQ(tok().encode("<|im_start|>", false, true), std::vector<int32_t>{1});
    // Only a complete token text counts.
    const std::vector<int32_t> partial = tok().encode("<|im_start|", false, true);
    for (int32_t id : partial) EXPECT_FALSE(tok().is_control(id));
}

TEST_F(TextModel, EndOfGeneration) {
    EXPECT_TRUE(tok().is_eog(2));   // <|im_end|>, eos
    EXPECT_TRUE(tok().is_eog(0));   // <|endoftext|>
    EXPECT_FALSE(tok().is_eog(1));  // <|im_start|>
    EXPECT_FALSE(tok().is_eog(17));
    EXPECT_FALSE(tok().is_eog(-3));
    EXPECT_FALSE(tok().is_eog(49152));
}

TEST_F(TextModel, StreamingDetokenizerNeverShowsPartialCharacters) {
    const std::string texts[] = {"你好，世界！今天天气很好。", "Emoji: 👍🏽 👨‍👩‍👧‍👦 🇩🇪 ❤️",
                                 "नमस्ते दुनिया", "Grüße aus München", "<|im_start|>assistant\n東京 😀<|im_end|>"};
    size_t held_steps = 0;
    for (const std::string& s : texts) {
        const std::vector<int32_t> ids = tok().encode(s, false, true);
        Detokenizer d(tok(), false);
        std::string all;
        for (int32_t id : ids) {
            const std::string chunk = d.push(id);
            ASSERT_TRUE(utf8_is_valid(chunk)) << testing::PrintToString(chunk);
            if (d.pending_bytes() > 0) ++held_steps;
            all += chunk;
        }
        EXPECT_EQ(d.finish(), "");
        EXPECT_EQ(all, s);
    }
    // The model splits CJK and emoji into byte tokens, so bytes were held.
    EXPECT_GT(held_steps, 10u);
}

TEST_F(TextModel, EncodingIsFast) {
    std::string text;
    while (text.size() < 200000) text += "The quick brown fox 123 jumps over the lazy dog. 敏捷的狐狸 😀\n";
    const auto t0 = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tok().encode(text, false, false);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(tok().decode(ids), text);
    // Generous bound (a sanitizer build is slower); catches quadratic behaviour.
    EXPECT_LT(ms, 5000.0) << ids.size() << " tokens";
}
