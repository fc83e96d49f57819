// Byte-level BPE (GPT-2 family): every byte of a pre-tokenized piece is first
// mapped to a printable code point (the GPT-2 bytes-to-unicode table), then
// adjacent symbols are merged in order of merge rank until no listed merge
// applies. When every byte has a token (GPT-2, Llama 3, Qwen2), any byte
// string - valid UTF-8 or not - encodes and decodes back exactly; bytes a
// vocabulary has no token for (SmolLM lacks 0xC0, 0xC1, 0xF5-0xFF and a few
// others) are dropped.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/result.h"
#include "text/token_index.h"
#include "text/vocab.h"

namespace tern::text {

// The GPT-2 table: bytes 0x21-0x7E, 0xA1-0xAC and 0xAE-0xFF map to the code
// point of the same value; the other 68 bytes map to U+0100, U+0101, ... in
// byte order.
uint32_t bpe_byte_to_codepoint(uint8_t b);
// The inverse, or -1 for a code point no byte maps to.
int bpe_codepoint_to_byte(uint32_t cp);

// Bytes -> their mapped text (how the vocabulary spells them).
std::string bpe_bytes_to_text(std::string_view bytes);
// Mapped token text -> bytes. Characters outside the table are copied as
// their UTF-8, so a malformed vocabulary entry still decodes to something.
std::string bpe_text_to_bytes(std::string_view text);

class BpeModel {
public:
    // Builds the merge table. Merges whose parts or result are not tokens are
    // skipped (they could never fire). Errors if no byte has a token: then
    // this is not a byte-level vocabulary.
    static Result<BpeModel> create(const Vocab& vocab, bool ignore_merges);

    // Appends the tokens of one pre-tokenized piece (raw bytes).
    void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

    size_t merge_count() const { return merges_.size(); }

private:
    struct Merge {
        int32_t rank;
        int32_t result;
    };
    static uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

    std::unordered_map<uint64_t, Merge> merges_;
    std::array<int32_t, 256> byte_token_{};  // -1 where the vocabulary lacks the byte
    TokenIndex whole_;  // ignore_merges: ordinary tokens by text
    bool ignore_merges_ = false;
};

}  // namespace tern::text
