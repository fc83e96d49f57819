// The per-token half of generation, shared by Session (one sequence) and the
// Scheduler (many): sample the next token from a logits row, end at
// end-of-generation tokens, stop strings, the token limit or a complete
// grammar, and turn tokens into text that is final (whole UTF-8 characters,
// no part of a stop string). Under a grammar the token is drawn as usual and
// kept when the grammar allows it; otherwise the draw is made again from the
// logits with every token the grammar refuses masked (llama.cpp's order:
// the mask costs a walk of the vocabulary only when the first draw misses).
#pragma once

#include <cstdint>
#include <optional>
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
    // The sampler's draw from these logits, which the next advance() with
    // the same logits then takes instead of drawing: the draws of many
    // streams can run on several threads (each stream on one at a time),
    // their advances, which call back into the consumer, on one.
    void draw(const float* logits);
    // Whether the next draw is the row's greedy pick alone (Sampler::draws_argmax,
    // and no grammar, which may have to draw again from the whole row); then
    // take_pick(the row's cpu::argmax_first) does what draw(row) would.
    bool wants_only_pick() const;
    void take_pick(int32_t argmax);

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

    // Under a grammar: whether t may come next, and t's bytes taken.
    bool grammar_fits(int32_t t) const;

    const text::Tokenizer& tok_;
    bool ignore_eos_;
    std::optional<GrammarMatcher> grammar_;
    std::shared_ptr<const GrammarVocab> grammar_vocab_;
    std::vector<float> masked_;  // the logits with the grammar's mask
    int limit_;
    Sampler sampler_;
    text::Detokenizer detok_;
    StopMatcher stops_;
    GenerateResult result_;
    bool done_ = false;
    int32_t next_ = -1;
    int32_t drawn_ = -1;  // draw()'s token, not yet taken by advance()
};

}  // namespace tern::runtime
