// One sequence of conversation or completion in one KV-cache slot, and the
// generation loop: prefill the prompt in batches (reusing whatever prefix the
// slot already holds), then sample, detokenize and stream token by token until
// an end-of-generation token, a stop string, the token limit or the end of the
// context.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "runtime/engine.h"
#include "runtime/grammar.h"
#include "runtime/sampler.h"

namespace tern::runtime {

struct GenerateOptions {
    int max_tokens = 128;           // tokens to generate at most; < 0: until the context is full
    SamplerParams sampling;
    std::vector<std::string> stop;  // stop strings; not included in the output
    bool ignore_eos = false;        // keep going past end-of-generation tokens
    bool truncate_prompt = false;   // drop the oldest prompt tokens instead of failing when it does not fit
    // Set: every token must keep the text inside this grammar (ending when it
    // is complete and cannot go on). grammar_vocab: the tokenizer's, built
    // once by a caller that generates often; null: built for this generation.
    std::shared_ptr<const Grammar> grammar;
    std::shared_ptr<const GrammarVocab> grammar_vocab;
};

enum class FinishReason { Stop, Length, Cancelled };
const char* finish_reason_name(FinishReason r);

struct GenerateResult {
    std::string text;
    std::vector<int32_t> tokens;    // generated
    FinishReason finish = FinishReason::Length;
    int n_prompt = 0;               // prompt tokens evaluated (after prefix reuse)
    int n_prompt_total = 0;         // prompt tokens in all
    int n_prompt_cached = 0;        // prompt tokens whose K/V were reused from earlier requests (server)
    int n_generated = 0;
    double prompt_ms = 0, generate_ms = 0;
    // Under a grammar: tokens whose first draw the grammar refused, so the
    // vocabulary was masked and the draw made again (the costly path).
    int n_grammar_masks = 0;
    double grammar_ms = 0;  // host time in the grammar (checks, masks, advances)
    // Why generation could not go on, when it is an error (no token of the
    // vocabulary continues the grammar): the text so far is kept.
    std::string error;
    double prompt_tps() const { return prompt_ms > 0 ? n_prompt * 1000.0 / prompt_ms : 0; }
    double generate_tps() const { return generate_ms > 0 ? n_generated * 1000.0 / generate_ms : 0; }
};

// Called with each piece of text as it becomes final; return false to stop.
using TextCallback = std::function<bool(std::string_view)>;

class Session {
public:
    explicit Session(Engine& engine, int slot = 0);

    Result<GenerateResult> generate(const std::vector<int32_t>& prompt, const GenerateOptions& options,
                                    const TextCallback& on_text = {});

    // Forgets the slot's contents.
    void reset() { cached_.clear(); }
    const std::vector<int32_t>& cached_tokens() const { return cached_; }

private:
    // Evaluates tokens after what the slot holds; then logits_ holds the last one's.
    Status feed(const std::vector<int32_t>& tokens);

    Engine& engine_;
    int slot_;
    std::vector<int32_t> cached_;  // tokens whose K/V are in the slot, in order
    model::Logits logits_;         // one buffer for every call (page-locked where a GPU runs)
};

}  // namespace tern::runtime
