// Incremental detokenizer. Output is always valid UTF-8: bytes that can never
// become a character are replaced by U+FFFD at once, an unfinished tail is
// held, and at a special token or the end of the stream it is replaced too.
#include "text/detok.h"

#include "text/utf8.h"

namespace tern::text {

Detokenizer::Detokenizer(Tokenizer tokenizer, bool skip_control, bool at_text_start)
    : tok_(std::move(tokenizer)),
      skip_control_(skip_control),
      at_text_start_(at_text_start),
      strip_next_space_(at_text_start && tok_.strips_space_prefix()) {}

void Detokenizer::drain(std::string& out, bool flush) {
    const size_t keep = flush ? 0 : utf8_incomplete_tail(pending_);
    const std::string_view ready = std::string_view(pending_).substr(0, pending_.size() - keep);
    for (size_t i = 0; i < ready.size();) {
        const Utf8Char c = utf8_decode(ready, i);
        i += c.len;
        uint32_t cp = c.valid ? c.cp : kReplacementChar;
        if (cp == 0x2581 && tok_.unescapes_spaces()) cp = ' ';
        if (!(cp == ' ' && strip_next_space_)) utf8_append(out, cp);
        strip_next_space_ = false;
    }
    pending_.erase(0, ready.size());
}

std::string Detokenizer::push(int32_t id) {
    std::string out;
    if (id < 0 || id >= tok_.n_vocab()) return out;
    if (tok_.is_special(id)) {
        drain(out, true);  // a special token ends the byte stream of the text before it
        if (!(skip_control_ && tok_.is_control(id))) out += utf8_sanitize(tok_.vocab().tokens[size_t(id)]);
        strip_next_space_ = tok_.strips_space_prefix() && at_text_start_;
        return out;
    }
    pending_ += tok_.raw_piece(id);
    drain(out, false);
    return out;
}

std::string Detokenizer::finish() {
    std::string out;
    drain(out, true);
    strip_next_space_ = at_text_start_ && tok_.strips_space_prefix();
    return out;
}

}  // namespace tern::text
