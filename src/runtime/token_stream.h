// The per-token half of generation, shared by Session (one sequence) and the
// Scheduler (many): sample the next token from a logits row, end at
// end-of-generation tokens, stop strings or the token limit, and turn tokens
// into text that is final (whole UTF-8 characters, no part of a stop string).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "runtime/session.h"
#include "runtime/stop.h"
#include "text/detok.h"
#include "text/tokenizer.h"

namespace tern::runtime {

class TokenStream {
public:
    // The prompt seeds the penalties' history.
    TokenStream(const text::Tokenizer& tok, int n_vocab, int n_ctx, const GenerateOptions& options,
                const std::vector<int32_t>& prompt);

    // Samples from the logits of the last evaluated token and returns the text
    // that became final. context_full: no position is left to evaluate another
    // token. Then either done() (result().finish says why) or next_token() is
    // the token to evaluate next.
    std::string advance(const float* logits, bool context_full);

    bool done() const { return done_; }
    int32_t next_token() const { return next_; }

    // Marks the generation cancelled by its consumer.
    void cancel();
    // Once done (and not cancelled): the text still held back, an unfinished
    // character or a possible start of a stop string that never completed.
    std::string drain();

    GenerateResult& result() { return result_; }

private:
    void end(FinishReason why);

    const text::Tokenizer& tok_;
    bool ignore_eos_;
    int limit_;
    Sampler sampler_;
    text::Detokenizer detok_;
    StopMatcher stops_;
    GenerateResult result_;
    bool done_ = false;
    int32_t next_ = -1;
};

}  // namespace tern::runtime
