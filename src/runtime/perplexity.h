// Perplexity of a model over a text, computed the way GGUF tools report it so
// numbers can be compared across engines: the tokens are cut into chunks of
// n_ctx, each chunk is evaluated from an empty KV slot (its first token
// replaced by BOS when the vocabulary adds one), and only the second half of
// each chunk is scored, so every scored token sees at least n_ctx/2 tokens of
// context.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "base/result.h"
#include "runtime/engine.h"

namespace tern::runtime {

struct PerplexityOptions {
    int n_ctx = 512;      // tokens per chunk; the engine's context must hold that many
    int max_chunks = -1;  // < 0: every whole chunk of the text
    int slot = 0;         // KV slot used (its contents are overwritten)
};

// Running totals after a chunk.
struct PerplexityProgress {
    int chunk = 0;         // 1-based index of the chunk just scored
    int n_chunks = 0;      // chunks that will be scored in all
    double ppl = 0;        // perplexity over every token scored so far
    double chunk_ms = 0;   // time to evaluate this chunk
};

struct PerplexityResult {
    double ppl = 0;        // exp(mean negative log-likelihood)
    double ppl_error = 0;  // standard error of ppl (from the spread of per-token NLL)
    double mean_nll = 0;   // in nats
    int n_chunks = 0;
    int64_t n_scored = 0;  // tokens scored
    double total_ms = 0;
};

// Tokens the text must have at least for a chunk size (two chunks).
inline int64_t perplexity_min_tokens(int n_ctx) { return 2 * int64_t(n_ctx); }

// Scores `tokens` (the whole text, tokenized with BOS as the vocabulary says).
// Fails when there are fewer than perplexity_min_tokens(n_ctx) tokens, when
// n_ctx is below 4 or beyond the engine's context, or when a forward pass
// fails. Uses the engine's forward pass directly on options.slot: a Session on
// that slot must be reset() afterwards.
Result<PerplexityResult> compute_perplexity(Engine& engine, const std::vector<int32_t>& tokens,
                                            const PerplexityOptions& options,
                                            const std::function<void(const PerplexityProgress&)>& on_chunk = {});

// -log softmax(logits)[target] over n_vocab logits, in double precision.
double token_nll(const float* logits, int n_vocab, int32_t target);

}  // namespace tern::runtime
