// UTF-8 decoding with the Unicode "maximal subpart" rule for invalid input,
// so the tokenizer and the detokenizer agree on what a broken byte stands for.
#include "text/utf8.h"

namespace tern::text {

uint32_t utf8_lead_length(uint8_t lead) {
    if (lead < 0x80) return 1;
    if (lead < 0xC2) return 0;  // continuation byte or overlong lead C0/C1
    if (lead < 0xE0) return 2;
    if (lead < 0xF0) return 3;
    if (lead < 0xF5) return 4;
    return 0;
}

// Allowed range of the second byte given the lead; later bytes are always
// 80..BF. This one table rules out overlongs, surrogates and > U+10FFFF.
static void second_byte_range(uint8_t lead, uint8_t& lo, uint8_t& hi) {
    lo = 0x80;
    hi = 0xBF;
    if (lead == 0xE0) lo = 0xA0;
    else if (lead == 0xED) hi = 0x9F;
    else if (lead == 0xF0) lo = 0x90;
    else if (lead == 0xF4) hi = 0x8F;
}

Utf8Char utf8_decode(std::string_view s, size_t pos) {
    Utf8Char r;
    const uint8_t lead = uint8_t(s[pos]);
    const uint32_t need = utf8_lead_length(lead);
    if (need == 0) {
        r.len = 1;
        return r;
    }
    if (need == 1) {
        r.cp = lead;
        r.len = 1;
        r.valid = true;
        return r;
    }
    uint32_t cp = lead & (0xFF >> (need + 1));
    uint32_t len = 1;
    for (; len < need; ++len) {
        if (pos + len >= s.size()) break;
        const uint8_t b = uint8_t(s[pos + len]);
        uint8_t lo = 0x80, hi = 0xBF;
        if (len == 1) second_byte_range(lead, lo, hi);
        if (b < lo || b > hi) break;
        cp = (cp << 6) | (b & 0x3F);
    }
    r.len = len;
    if (len == need) {
        r.cp = cp;
        r.valid = true;
    }
    return r;
}

bool utf8_is_valid(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
        const Utf8Char c = utf8_decode(s, i);
        if (!c.valid) return false;
        i += c.len;
    }
    return true;
}

void utf8_append(std::string& out, uint32_t cp) {
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = kReplacementChar;
    if (cp < 0x80) {
        out.push_back(char(cp));
    } else if (cp < 0x800) {
        out.push_back(char(0xC0 | (cp >> 6)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
        out.push_back(char(0xE0 | (cp >> 12)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    } else {
        out.push_back(char(0xF0 | (cp >> 18)));
        out.push_back(char(0x80 | ((cp >> 12) & 0x3F)));
        out.push_back(char(0x80 | ((cp >> 6) & 0x3F)));
        out.push_back(char(0x80 | (cp & 0x3F)));
    }
}

size_t utf8_incomplete_tail(std::string_view s) {
    // A sequence is at most 4 bytes, so only the last 3 bytes can start an
    // incomplete one.
    const size_t first = s.size() > 3 ? s.size() - 3 : 0;
    for (size_t start = first; start < s.size(); ++start) {
        const uint32_t need = utf8_lead_length(uint8_t(s[start]));
        if (need < 2) continue;
        const size_t have = s.size() - start;
        if (have >= need) continue;
        // Every byte present must be acceptable for this lead.
        const Utf8Char c = utf8_decode(s, start);
        if (c.len == have) return have;
    }
    return 0;
}

std::string utf8_sanitize(std::string_view s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size();) {
        const Utf8Char c = utf8_decode(s, i);
        if (c.valid) out.append(s.substr(i, c.len));
        else utf8_append(out, kReplacementChar);
        i += c.len;
    }
    return out;
}

}  // namespace tern::text
