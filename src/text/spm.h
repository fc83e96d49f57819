// SentencePiece-style tokenization for "llama" vocabularies: spaces become
// "▁", the text starts as one symbol per UTF-8 character, and the adjacent
// pair whose concatenation is the highest-scoring token is merged until no
// pair forms a token. A symbol left that is not a token is spelled with
// "<0xNN>" byte tokens (byte fallback), or the unknown token if there are none.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/token_index.h"
#include "text/vocab.h"

namespace tern::text {

// U+2581 LOWER ONE EIGHTH BLOCK, SentencePiece's visible space.
inline constexpr std::string_view kSpmSpace = "\xE2\x96\x81";

// Replaces every ' ' with "▁".
std::string spm_escape_spaces(std::string_view text);
// Replaces every "▁" with ' '.
std::string spm_unescape_spaces(std::string_view text);
// The byte a "<0xNN>" token stands for, or -1 if the text is not of that form.
int spm_byte_token_value(std::string_view text);

class SpmModel {
public:
    explicit SpmModel(const Vocab& vocab);

    // Appends the tokens of already escaped text (spaces as "▁").
    void encode(std::string_view escaped, std::vector<int32_t>& out) const;

    bool has_byte_fallback() const { return has_byte_fallback_; }

private:
    TokenIndex index_;            // ordinary tokens by text
    std::vector<float> scores_;   // by token id
    std::array<int32_t, 256> byte_token_{};
    bool has_byte_fallback_ = false;
    int32_t unk_id_ = -1;
};

}  // namespace tern::text
