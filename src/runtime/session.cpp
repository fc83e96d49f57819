#include "runtime/session.h"

#include <algorithm>
#include <chrono>

#include "runtime/token_stream.h"

namespace tern::runtime {
namespace {

double ms_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
    switch (r) {
        case FinishReason::Stop: return "stop";
        case FinishReason::Length: return "length";
        case FinishReason::Cancelled: return "cancelled";
    }
    return "?";
}

Session::Session(Engine& engine, int slot) : engine_(engine), slot_(slot) {}

Status Session::feed(const std::vector<int32_t>& tokens) {
    model::Pass& fwd = engine_.forward();
    if (tokens.empty()) return Error{"nothing to evaluate"};
    if (cached_.size() + tokens.size() > size_t(fwd.n_ctx()))
        return Error{"context full: " + std::to_string(cached_.size() + tokens.size()) + " tokens do not fit in " +
                     std::to_string(fwd.n_ctx())};
    const size_t chunk = size_t(fwd.max_tokens());
    for (size_t i = 0; i < tokens.size(); i += chunk) {
        const size_t n = std::min(chunk, tokens.size() - i);
        model::Batch b;
        for (size_t j = 0; j < n; ++j) {
            const bool last = i + j + 1 == tokens.size();
            b.add(tokens[i + j], int32_t(cached_.size()), slot_, last);
            cached_.push_back(tokens[i + j]);
        }
        if (Status s = fwd.run(b, logits_); !s.ok()) {
            cached_.resize(cached_.size() - n);
            return Error{s.message()};
        }
    }
    return {};
}

Result<GenerateResult> Session::generate(const std::vector<int32_t>& prompt_in, const GenerateOptions& opt,
                                         const TextCallback& on_text) {
    if (Status s = opt.sampling.validate(); !s.ok()) return Error{s.message()};
    if (prompt_in.empty()) return Error{"the prompt is empty"};
    const int n_ctx = engine_.n_ctx();
    const text::Tokenizer& tok = engine_.tokenizer();
    for (int32_t t : prompt_in)
        if (t < 0 || t >= engine_.n_vocab()) return Error{"prompt token " + std::to_string(t) + " is outside the vocabulary"};

    std::vector<int32_t> prompt = prompt_in;
    if (int(prompt.size()) >= n_ctx) {
        if (!opt.truncate_prompt)
            return Error{"the prompt has " + std::to_string(prompt.size()) + " tokens and does not fit the context of " +
                         std::to_string(n_ctx) + " (use a larger context, a shorter prompt, or truncation)"};
        // Keep the newest tokens, leaving room for half the context to be generated.
        const size_t keep = size_t(std::max(1, n_ctx / 2));
        prompt.erase(prompt.begin(), prompt.end() - int64_t(keep));
    }

    const int n_prompt_total = int(prompt.size());

    // Reuse the longest common prefix already in the slot; always re-evaluate
    // at least the last prompt token to get its logits.
    size_t common = 0;
    while (common < cached_.size() && common < prompt.size() && cached_[common] == prompt[common]) ++common;
    common = std::min(common, prompt.size() - 1);
    cached_.resize(common);

    const auto t0 = std::chrono::steady_clock::now();
    if (Status s = feed(std::vector<int32_t>(prompt.begin() + int64_t(common), prompt.end())); !s.ok())
        return Error{s.message()};
    const int n_prompt = int(prompt.size() - common);
    const double prompt_ms = ms_since(t0);

    TokenStream stream(tok, engine_.n_vocab(), n_ctx, opt, prompt);
    const auto t1 = std::chrono::steady_clock::now();
    auto emit = [&](const std::string& piece) { return piece.empty() || !on_text || on_text(piece); };
    while (!stream.done()) {
        const std::string piece = stream.advance(logits_.data(), int(cached_.size()) >= n_ctx);
        if (!emit(piece)) {
            stream.cancel();
            break;
        }
        if (stream.done()) break;
        if (Status s = feed({stream.next_token()}); !s.ok()) return Error{s.message()};
    }
    emit(stream.drain());
    GenerateResult r = std::move(stream.result());
    if (!r.error.empty()) return Error{r.error + " (after " + std::to_string(r.n_generated) + " tokens: \"" + r.text + "\")"};
    r.n_prompt_total = n_prompt_total;
    r.n_prompt = n_prompt;
    r.prompt_ms = prompt_ms;
    r.generate_ms = ms_since(t1);
    return r;
}

}  // namespace tern::runtime
