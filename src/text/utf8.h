// UTF-8 helpers for the tokenizers and the detokenizer. Text reaching the
// engine is untrusted bytes: every function here accepts any byte string,
// reads only inside it, and reports invalid sequences instead of assuming
// well-formed input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tern::text {

constexpr uint32_t kReplacementChar = 0xFFFD;

// One decoded step. For a valid sequence: its code point and length (1-4).
// For an invalid one: valid == false and len is the length of the maximal
// ill-formed subpart (the bytes a replacement character stands for, as the
// Unicode standard recommends), always at least 1.
struct Utf8Char {
    uint32_t cp = 0;
    uint32_t len = 0;
    bool valid = false;
};

// Decodes the character starting at s[pos]; pos must be < s.size().
Utf8Char utf8_decode(std::string_view s, size_t pos);

// Length a sequence starting with this lead byte would have (1-4), or 0 if
// the byte cannot start a sequence (a continuation byte, 0xC0, 0xC1, >= 0xF5).
uint32_t utf8_lead_length(uint8_t lead);

bool utf8_is_valid(std::string_view s);

// Appends the UTF-8 encoding of cp; surrogates and values above U+10FFFF are
// written as U+FFFD.
void utf8_append(std::string& out, uint32_t cp);

// Number of bytes at the end of s that form a proper prefix of a valid
// sequence (so more bytes could still complete it); 0 if s ends on a
// character boundary or with bytes that can never become valid.
size_t utf8_incomplete_tail(std::string_view s);

// s with each maximal ill-formed subpart replaced by U+FFFD.
std::string utf8_sanitize(std::string_view s);

}  // namespace tern::text
