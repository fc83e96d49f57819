// Incremental detokenizer: characters split over several tokens are held
// until complete, every chunk it emits is valid UTF-8, the chunks add up to
// the text, broken bytes become U+FFFD, and special tokens end a character.
#include <gtest/gtest.h>

#include "test_text_util.h"
#include "text/detok.h"
#include "text/utf8.h"

using namespace tern::text;
using namespace tern::text::testing_util;

namespace {

const std::string kFffd = "\xEF\xBF\xBD";

// Byte-level vocabulary with no useful merges: every byte is its own token,
// so every multi-byte character is split across tokens.
Tokenizer byte_tokenizer() {
    Vocab v = make_bpe_vocab({{"q", "q"}});
    v.tokens.push_back("<|end|>");
    v.types.push_back(TokenType::Control);
    v.eos_id = v.size() - 1;
    return make_tokenizer(v);
}

}  // namespace

TEST(TextDetok, HoldsSplitCharactersUntilComplete) {
    Tokenizer t = byte_tokenizer();
    Detokenizer d(t);
    const std::string text = "a中😀";
    const std::vector<int32_t> ids = t.encode(text, false, false);
    ASSERT_EQ(ids.size(), text.size());
    const std::vector<std::string> expected = {"a", "", "", "中", "", "", "", "😀"};
    std::string all;
    for (size_t i = 0; i < ids.size(); ++i) {
        const std::string chunk = d.push(ids[i]);
        EXPECT_EQ(chunk, expected[i]) << "step " << i;
        all += chunk;
    }
    EXPECT_EQ(d.pending_bytes(), 0u);
    EXPECT_EQ(d.finish(), "");
    EXPECT_EQ(all, text);
}

TEST(TextDetok, BrokenBytesBecomeReplacementCharacters) {
    Tokenizer t = byte_tokenizer();
    {
        Detokenizer d(t);
        EXPECT_EQ(d.push('x'), "x");
        EXPECT_EQ(d.push(0xE4), "");
        EXPECT_EQ(d.pending_bytes(), 1u);
        EXPECT_EQ(d.finish(), kFffd);  // end of stream inside a character
        EXPECT_EQ(d.push('y'), "y");   // ready for a new stream
    }
    {
        Detokenizer d(t);
        EXPECT_EQ(d.push(0xE4), "");
        EXPECT_EQ(d.push(0xB8), "");
        EXPECT_EQ(d.push('z'), kFffd + "z");  // the character cannot complete any more
        EXPECT_EQ(d.push(0xFF), kFffd);       // a byte that never starts a character: at once
    }
    {
        Detokenizer d(t);  // a control token ends the character before it
        EXPECT_EQ(d.push(0xF0), "");
        EXPECT_EQ(d.push(t.eos_id()), kFffd);
        Detokenizer shown(t, false);
        EXPECT_EQ(shown.push(0xF0), "");
        EXPECT_EQ(shown.push(t.eos_id()), kFffd + "<|end|>");
    }
    Detokenizer d(t);
    EXPECT_EQ(d.push(-1), "");
    EXPECT_EQ(d.push(t.n_vocab()), "");
}

TEST(TextDetok, RandomStreamsEqualSanitizedDecode) {
    const uint32_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    Tokenizer t = make_tokenizer(make_bpe_vocab({{"\xE4", "\xB8"}, {"\xE4\xB8", "\xAD"}, {"\xF0", "\x9F"}, {"a", "b"}}));
    const std::vector<std::string> palette = {"ab", "中", "\xE4\xB8", "😀", "\xF0\x9F", "é", " ", "\xFF", "\x80", "z"};
    for (int iter = 0; iter < 500; ++iter) {
        const std::string s = iter % 3 ? random_text(rng, palette, 12) : random_bytes(rng, 24);
        const std::vector<int32_t> ids = t.encode(s, false, false);
        Detokenizer d(t);
        std::string all;
        for (int32_t id : ids) {
            const std::string chunk = d.push(id);
            ASSERT_TRUE(utf8_is_valid(chunk)) << testing::PrintToString(s);
            all += chunk;
        }
        const std::string tail = d.finish();
        ASSERT_TRUE(utf8_is_valid(tail));
        all += tail;
        ASSERT_EQ(all, utf8_sanitize(t.decode(ids))) << testing::PrintToString(s);
        if (utf8_is_valid(s)) {
            ASSERT_EQ(all, s);
        }
    }
}

TEST(TextDetok, SpmSpacesAndPrefix) {
    const std::string sp = "\xE2\x96\x81";
    Vocab v;
    v.kind = VocabKind::Spm;
    v.tokens = {"<unk>", "<s>", "</s>", sp + "hi", sp, "<0xE4>", "<0xB8>", "<0xAD>", sp + "h", "i"};
    v.types = {TokenType::Unknown, TokenType::Control, TokenType::Control, TokenType::Normal, TokenType::Normal,
               TokenType::Byte,    TokenType::Byte,    TokenType::Byte,    TokenType::Normal, TokenType::Normal};
    v.scores.assign(v.tokens.size(), 0.0f);
    v.unk_id = 0;
    v.bos_id = 1;
    v.eos_id = 2;
    v.add_bos = true;
    v.add_space_prefix = true;
    Tokenizer t = make_tokenizer(v);
    const std::string text = "hi 中 hi";
    const std::vector<int32_t> ids = t.encode(text, true, false);
    EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4, 5, 6, 7, 3}));
    // A whole encoded text: BOS skipped, the prefix space removed.
    Detokenizer whole(t, true, true);
    std::string all;
    for (int32_t id : ids) all += whole.push(id);
    all += whole.finish();
    EXPECT_EQ(all, text);
    EXPECT_EQ(t.decode(ids, true), text);
    // A continuation keeps its leading space.
    Detokenizer cont(t);
    EXPECT_EQ(cont.push(3), " hi");
    EXPECT_EQ(cont.push(4), " ");
    EXPECT_EQ(cont.push(5), "");
    EXPECT_EQ(cont.push(6), "");
    EXPECT_EQ(cont.push(7), "中");
    EXPECT_EQ(cont.push(3), " hi");
    // After a special token a whole-text stream drops the prefix space again.
    Detokenizer again(t, false, true);
    EXPECT_EQ(again.push(3), "hi");
    EXPECT_EQ(again.push(2), "</s>");
    EXPECT_EQ(again.push(3), "hi");
}
