// Text <-> token ids for a model's vocabulary: special-token splitting, then
// SentencePiece-style or byte-level BPE tokenization of the text between
// special tokens, and the inverse.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "text/vocab.h"

namespace tern::text {

class Tokenizer {
public:
    // Validates the vocabulary, picks the pre-tokenizer (BPE) and builds the
    // lookup tables. Copies of a Tokenizer share them and are cheap; all
    // methods are const and safe to call from several threads.
    static Result<Tokenizer> create(Vocab vocab);

    // add_special: prepend BOS / append EOS as the vocabulary's add_bos /
    // add_eos flags say. parse_special: text spelling a control token (such
    // as "<|im_start|>") becomes that token; otherwise it is tokenized as
    // ordinary text. User-defined tokens are always matched. Any bytes are
    // accepted: byte-level BPE encodes invalid UTF-8 exactly; SPM spells it
    // with byte tokens when the vocabulary has them.
    std::vector<int32_t> encode(std::string_view text, bool add_special, bool parse_special) const;

    // The bytes one token stands for: spaces for "▁" (SPM), raw bytes for
    // byte-level and "<0xNN>" tokens, the literal text of control tokens.
    // Empty for an id outside the vocabulary. A piece may be part of a
    // UTF-8 character; use Detokenizer to stream text.
    std::string token_to_piece(int32_t id) const;

    // The inverse of encode: decode(encode(s, add_special, parse_special)) == s
    // when the BOS/EOS added by add_special are skipped (skip_special) or
    // absent. It removes the space that SPM's space prefix put in front of
    // text at the start and after special tokens. Ids outside the vocabulary
    // are ignored. SPM cannot tell a "▁" typed in the text from a space, so
    // for SPM the round trip holds for text without U+2581.
    std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

    // End of generation: eos, eot, eom and the control tokens that end a
    // turn in common chat formats (<|im_end|>, <|eot_id|>, <|endoftext|>, ...).
    bool is_eog(int32_t id) const;
    // Control or user-defined: produced by special-token matching, never by
    // the text tokenizers, and a boundary for SPM's space prefix.
    bool is_special(int32_t id) const;
    bool is_control(int32_t id) const;

    const Vocab& vocab() const;
    int32_t n_vocab() const { return vocab().size(); }
    int32_t bos_id() const { return vocab().bos_id; }
    int32_t eos_id() const { return vocab().eos_id; }
    // Name of the pre-tokenizer in use ("" for SPM).
    const std::string& pre_name() const;

    // Detokenizer helpers: the token's bytes before SPM's "▁" -> space
    // replacement, and whether this vocabulary needs that replacement and
    // the space-prefix removal.
    std::string raw_piece(int32_t id) const;
    bool unescapes_spaces() const;
    bool strips_space_prefix() const;

private:
    struct Impl;
    explicit Tokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
    std::shared_ptr<const Impl> impl_;
};

}  // namespace tern::text
