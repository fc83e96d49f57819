// Streaming detokenization: token ids go in one at a time, text comes out as
// soon as it is made of whole UTF-8 characters. A character split across
// tokens (common for CJK and emoji under byte-level BPE) is held back until
// its last byte arrives, so a stream never shows a partial character.
#pragma once

#include <cstdint>
#include <string>

#include "text/tokenizer.h"

namespace tern::text {

class Detokenizer {
public:
    // skip_control: control tokens (BOS, EOS, <|im_end|>) produce no text.
    // at_text_start: the stream is a whole encoded text, so the space SPM's
    // space prefix put at its start (and after special tokens) is removed, as
    // Tokenizer::decode does. For generated continuations leave it false.
    explicit Detokenizer(Tokenizer tokenizer, bool skip_control = true, bool at_text_start = false);

    // The text that became complete with this token (possibly empty). Ids
    // outside the vocabulary add nothing.
    std::string push(int32_t id);

    // End of stream: bytes still held (an unfinished character) come out as
    // U+FFFD. The detokenizer is then ready for a new stream.
    std::string finish();

    // Bytes held back, waiting for the rest of a character.
    size_t pending_bytes() const { return pending_.size(); }

private:
    // Emits the complete characters of pending_, keeps a possible
    // unfinished tail (or all of it when flushing).
    void drain(std::string& out, bool flush);

    Tokenizer tok_;
    bool skip_control_;
    bool at_text_start_;
    bool strip_next_space_;
    std::string pending_;
};

}  // namespace tern::text
