// UTF-8 helpers: valid sequences of every length, each kind of invalid input
// (stray continuation, overlong, surrogate, too large, truncated), and random
// bytes checked against a simple reference decoder.
#include <gtest/gtest.h>

#include <random>

#include "text/utf8.h"
#include "tests/support/test_seed.h"

using namespace tern::text;

TEST(TextUtf8, DecodesEachLength) {
    const std::string s = "A\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80";  // A é 中 😀
    Utf8Char c = utf8_decode(s, 0);
    EXPECT_TRUE(c.valid);
    EXPECT_EQ(c.cp, 0x41u);
    EXPECT_EQ(c.len, 1u);
    c = utf8_decode(s, 1);
    EXPECT_TRUE(c.valid);
    EXPECT_EQ(c.cp, 0xE9u);
    EXPECT_EQ(c.len, 2u);
    c = utf8_decode(s, 3);
    EXPECT_TRUE(c.valid);
    EXPECT_EQ(c.cp, 0x4E2Du);
    EXPECT_EQ(c.len, 3u);
    c = utf8_decode(s, 6);
    EXPECT_TRUE(c.valid);
    EXPECT_EQ(c.cp, 0x1F600u);
    EXPECT_EQ(c.len, 4u);
    EXPECT_TRUE(utf8_is_valid(s));
}

TEST(TextUtf8, InvalidInputHasMaximalSubpartLengths) {
    struct Case {
        std::string bytes;
        uint32_t len;
    };
    const Case cases[] = {
        {"\x80", 1},              // stray continuation
        {"\xC0\xAF", 1},          // overlong lead
        {"\xC1\xBF", 1},
        {"\xE0\x80\x80", 1},      // overlong 3-byte: second byte out of range
        {"\xED\xA0\x80", 1},      // surrogate U+D800
        {"\xF4\x90\x80\x80", 1},  // above U+10FFFF
        {"\xF5\x80", 1},          // impossible lead
        {"\xE4\xB8", 2},          // truncated at end
        {"\xE4\xB8" "A", 2},      // interrupted
        {"\xF0\x9F\x98", 3},
        {"\xF0\x9F" "A", 2},
        {"\xFF", 1},
    };
    for (const Case& c : cases) {
        const Utf8Char d = utf8_decode(c.bytes, 0);
        EXPECT_FALSE(d.valid) << testing::PrintToString(c.bytes);
        EXPECT_EQ(d.len, c.len) << testing::PrintToString(c.bytes);
        EXPECT_FALSE(utf8_is_valid(c.bytes));
    }
}

TEST(TextUtf8, AppendEncodesAndReplacesImpossibleCodePoints) {
    std::string s;
    utf8_append(s, 0x24);
    utf8_append(s, 0x20AC);
    utf8_append(s, 0x10348);
    EXPECT_EQ(s, "$\xE2\x82\xAC\xF0\x90\x8D\x88");
    std::string bad;
    utf8_append(bad, 0xD800);
    utf8_append(bad, 0x110000);
    EXPECT_EQ(bad, "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST(TextUtf8, IncompleteTail) {
    EXPECT_EQ(utf8_incomplete_tail(""), 0u);
    EXPECT_EQ(utf8_incomplete_tail("abc"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xE4"), 1u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xE4\xB8"), 2u);
    EXPECT_EQ(utf8_incomplete_tail("ab\xE4\xB8\xAD"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F\x98"), 3u);
    EXPECT_EQ(utf8_incomplete_tail("\xF0\x9F"), 2u);
    EXPECT_EQ(utf8_incomplete_tail("x\xED\xA0"), 0u);  // surrogate prefix can never complete
    EXPECT_EQ(utf8_incomplete_tail("x\xE4" "A"), 0u);
    EXPECT_EQ(utf8_incomplete_tail("\x80\x80"), 0u);
}

TEST(TextUtf8, SanitizeReplacesEachSubpart) {
    EXPECT_EQ(utf8_sanitize("ok"), "ok");
    EXPECT_EQ(utf8_sanitize("a\xE4\xB8" "b"), "a\xEF\xBF\xBD" "b");
    EXPECT_EQ(utf8_sanitize("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
    EXPECT_EQ(utf8_sanitize("\xF0\x9F\x98"), "\xEF\xBF\xBD");
}

// Reference: decode by trying every code point encoding that matches the
// prefix; slow but obviously right.
static bool reference_valid_at(const std::string& s, size_t pos, uint32_t& len) {
    for (uint32_t n = 1; n <= 4 && pos + n <= s.size(); ++n) {
        const std::string_view seq(s.data() + pos, n);
        // Encode candidate code points of this length and compare.
        uint32_t lo = n == 1 ? 0 : n == 2 ? 0x80 : n == 3 ? 0x800 : 0x10000;
        uint32_t hi = n == 1 ? 0x7F : n == 2 ? 0x7FF : n == 3 ? 0xFFFF : 0x10FFFF;
        // Decode bits naively, then check the value re-encodes to the same bytes.
        uint32_t cp = n == 1 ? uint8_t(seq[0]) : uint8_t(seq[0]) & (0x7F >> n);
        for (uint32_t k = 1; k < n; ++k) cp = (cp << 6) | (uint8_t(seq[k]) & 0x3F);
        if (cp < lo || cp > hi || (cp >= 0xD800 && cp <= 0xDFFF)) continue;
        std::string enc;
        utf8_append(enc, cp);
        if (enc == seq) {
            len = n;
            return true;
        }
    }
    return false;
}

// Reference: the longest suffix (under 4 bytes) that some continuation bytes
// turn into exactly one valid character. The candidate bytes cover every
// second-byte range a lead allows.
static size_t reference_incomplete_tail(const std::string& s) {
    const uint8_t fill[] = {0x80, 0x90, 0xA0, 0xBF};
    for (size_t t = std::min<size_t>(3, s.size()); t >= 1; --t) {
        const std::string tail = s.substr(s.size() - t);
        for (size_t k = 1; t + k <= 4; ++k) {
            for (uint32_t combo = 0; combo < (1u << (2 * k)); ++combo) {
                std::string cand = tail;
                for (size_t j = 0; j < k; ++j) cand.push_back(char(fill[(combo >> (2 * j)) & 3]));
                uint32_t len = 0;
                if (reference_valid_at(cand, 0, len) && len == cand.size()) return t;
            }
        }
    }
    return 0;
}

TEST(TextUtf8, RandomBytesAgreeWithReference) {
    const uint32_t seed = tern::test::run_seed() + 1;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937 rng(seed);
    // Bias towards bytes that make interesting sequences.
    const uint8_t palette[] = {0x41, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xDF,
                               0xE0, 0xE4, 0xED, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF};
    for (int iter = 0; iter < 2000; ++iter) {
        std::string s(size_t(rng() % 12), '\0');
        for (char& c : s) c = char(rng() % 2 ? palette[rng() % sizeof palette] : uint8_t(rng()));
        std::string rebuilt;
        for (size_t i = 0; i < s.size();) {
            const Utf8Char c = utf8_decode(s, i);
            ASSERT_GE(c.len, 1u);
            ASSERT_LE(i + c.len, s.size());
            uint32_t ref_len = 0;
            const bool ref_valid = reference_valid_at(s, i, ref_len);
            ASSERT_EQ(c.valid, ref_valid) << testing::PrintToString(s) << " at " << i;
            if (c.valid) {
                ASSERT_EQ(c.len, ref_len);
                utf8_append(rebuilt, c.cp);
            } else {
                rebuilt.append(s, i, c.len);
            }
            i += c.len;
        }
        EXPECT_EQ(rebuilt, s);
        EXPECT_TRUE(utf8_is_valid(utf8_sanitize(s)));
        EXPECT_EQ(utf8_incomplete_tail(s), reference_incomplete_tail(s)) << testing::PrintToString(s);
    }
}
