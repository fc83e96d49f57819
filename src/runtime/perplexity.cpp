#include "runtime/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

namespace tern::runtime {

double token_nll(const float* logits, int n_vocab, int32_t target) {
    float max_logit = logits[0];
    for (int i = 1; i < n_vocab; ++i) max_logit = std::max(max_logit, logits[i]);
    // Shift by the maximum so exp never overflows; sum in double so the
    // 10^5 small terms of a large vocabulary keep their precision.
    double sum = 0;
    for (int i = 0; i < n_vocab; ++i) sum += std::exp(double(logits[i]) - double(max_logit));
    return std::log(sum) - (double(logits[target]) - double(max_logit));
}

Result<PerplexityResult> compute_perplexity(Engine& engine, const std::vector<int32_t>& tokens,
                                            const PerplexityOptions& opt,
                                            const std::function<void(const PerplexityProgress&)>& on_chunk) {
    model::Pass& fwd = engine.forward();
    const int n_ctx = opt.n_ctx;
    const int n_vocab = engine.n_vocab();
    if (n_ctx < 4) return Error{"the perplexity context must be at least 4 tokens (got " + std::to_string(n_ctx) + ")"};
    if (n_ctx > fwd.n_ctx())
        return Error{"the perplexity context of " + std::to_string(n_ctx) + " tokens exceeds the engine's context of " +
                     std::to_string(fwd.n_ctx())};
    if (opt.slot < 0 || opt.slot >= fwd.n_slots())
        return Error{"KV slot " + std::to_string(opt.slot) + " does not exist (the engine has " +
                     std::to_string(fwd.n_slots()) + ")"};
    if (int64_t(tokens.size()) < perplexity_min_tokens(n_ctx))
        return Error{"the text has " + std::to_string(tokens.size()) + " tokens; perplexity with a context of " +
                     std::to_string(n_ctx) + " needs at least " + std::to_string(perplexity_min_tokens(n_ctx)) +
                     " (two chunks): use a longer text or a smaller context"};
    for (int32_t t : tokens)
        if (t < 0 || t >= n_vocab) return Error{"token " + std::to_string(t) + " is outside the vocabulary"};

    const text::Tokenizer& tok = engine.tokenizer();
    const bool replace_with_bos = tok.vocab().add_bos && tok.bos_id() >= 0;
    const int all_chunks = int(tokens.size() / size_t(n_ctx));
    const int n_chunks = opt.max_chunks < 0 ? all_chunks : std::min(opt.max_chunks, all_chunks);
    if (n_chunks < 1) return Error{"no chunk to score (--chunks must be at least 1)"};

    // Positions scored in every chunk: the logits at i predict token i+1, for
    // i in [first, n_ctx - 1).
    const int first = n_ctx / 2;
    const int max_batch = fwd.max_tokens();

    PerplexityResult r;
    double nll_sum = 0, nll_sq_sum = 0;
    model::Logits logits;
    const auto t_start = std::chrono::steady_clock::now();
    for (int c = 0; c < n_chunks; ++c) {
        const auto t_chunk = std::chrono::steady_clock::now();
        const size_t start = size_t(c) * size_t(n_ctx);
        for (int j = 0; j < n_ctx; j += max_batch) {
            const int n = std::min(max_batch, n_ctx - j);
            model::Batch b;
            for (int k = 0; k < n; ++k) {
                const int pos = j + k;
                int32_t t = tokens[start + size_t(pos)];
                if (pos == 0 && replace_with_bos) t = tok.bos_id();
                b.add(t, pos, opt.slot, pos >= first && pos < n_ctx - 1);
            }
            // A batch wholly in the first half only fills the KV cache.
            if (Status s = fwd.run(b, logits); !s.ok()) return Error{"chunk " + std::to_string(c + 1) + ": " + s.message()};
            if (logits.size() < b.logits_for.size() * size_t(n_vocab))
                return Error{"chunk " + std::to_string(c + 1) + ": the forward pass returned too few logits"};
            for (size_t row = 0; row < b.logits_for.size(); ++row) {
                const int pos = j + b.logits_for[row];
                const double nll = token_nll(logits.data() + row * size_t(n_vocab), n_vocab,
                                             tokens[start + size_t(pos) + 1]);
                nll_sum += nll;
                nll_sq_sum += nll * nll;
                ++r.n_scored;
            }
        }
        r.n_chunks = c + 1;
        if (on_chunk) {
            PerplexityProgress p;
            p.chunk = c + 1;
            p.n_chunks = n_chunks;
            p.ppl = std::exp(nll_sum / double(r.n_scored));
            p.chunk_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_chunk).count();
            on_chunk(p);
        }
    }
    r.total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_start).count();

    const double n = double(r.n_scored);
    r.mean_nll = nll_sum / n;
    r.ppl = std::exp(r.mean_nll);
    // Standard error of the mean NLL, carried to the perplexity: d exp(x) = exp(x) dx.
    const double variance = nll_sq_sum / n - r.mean_nll * r.mean_nll;
    r.ppl_error = (variance > 0 && n > 1) ? r.ppl * std::sqrt(variance / (n - 1)) : 0;
    return r;
}

}  // namespace tern::runtime
