#include "runtime/session.h"

#include <algorithm>
#include <chrono>

#include "runtime/stop.h"
#include "text/detok.h"

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

Result<std::vector<float>> Session::feed(const std::vector<int32_t>& tokens) {
    model::Forward& fwd = engine_.forward();
    if (tokens.empty()) return Error{"nothing to evaluate"};
    if (cached_.size() + tokens.size() > size_t(fwd.n_ctx()))
        return Error{"context full: " + std::to_string(cached_.size() + tokens.size()) + " tokens do not fit in " +
                     std::to_string(fwd.n_ctx())};
    std::vector<float> logits;
    const size_t chunk = size_t(fwd.max_tokens());
    for (size_t i = 0; i < tokens.size(); i += chunk) {
        const size_t n = std::min(chunk, tokens.size() - i);
        model::Batch b;
        for (size_t j = 0; j < n; ++j) {
            const bool last = i + j + 1 == tokens.size();
            b.add(tokens[i + j], int32_t(cached_.size()), slot_, last);
            cached_.push_back(tokens[i + j]);
        }
        if (Status s = fwd.run(b, logits); !s.ok()) {
            cached_.resize(cached_.size() - n);
            return Error{s.message()};
        }
    }
    return logits;
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

    GenerateResult r;
    r.n_prompt_total = int(prompt.size());

    // Reuse the longest common prefix already in the slot; always re-evaluate
    // at least the last prompt token to get its logits.
    size_t common = 0;
    while (common < cached_.size() && common < prompt.size() && cached_[common] == prompt[common]) ++common;
    common = std::min(common, prompt.size() - 1);
    cached_.resize(common);

    const auto t0 = std::chrono::steady_clock::now();
    auto logits = feed(std::vector<int32_t>(prompt.begin() + int64_t(common), prompt.end()));
    if (!logits.ok()) return logits.error();
    r.n_prompt = int(prompt.size() - common);
    r.prompt_ms = ms_since(t0);

    Sampler sampler(opt.sampling, engine_.n_vocab());
    for (int32_t t : prompt) sampler.accept(t);
    text::Detokenizer detok(tok);
    StopMatcher stops(opt.stop);
    const auto t1 = std::chrono::steady_clock::now();
    auto emit = [&](const std::string& piece) {
        if (piece.empty()) return true;
        r.text += piece;
        return on_text ? on_text(piece) : true;
    };

    std::vector<float> cur = std::move(*logits);
    r.finish = FinishReason::Length;
    const int limit = opt.max_tokens < 0 ? n_ctx : opt.max_tokens;
    while (r.n_generated < limit) {
        const int32_t next = sampler.sample(cur.data());
        sampler.accept(next);
        if (!opt.ignore_eos && tok.is_eog(next)) {
            r.finish = FinishReason::Stop;
            break;
        }
        r.tokens.push_back(next);
        ++r.n_generated;
        if (!emit(stops.push(detok.push(next)))) {
            r.finish = FinishReason::Cancelled;
            break;
        }
        if (stops.stopped()) {
            r.finish = FinishReason::Stop;
            break;
        }
        if (r.n_generated >= limit) break;
        if (int(cached_.size()) >= n_ctx) break;  // context full: finish with Length
        auto l = feed({next});
        if (!l.ok()) return l.error();
        cur = std::move(*l);
    }
    if (r.finish != FinishReason::Cancelled && !stops.stopped()) emit(stops.push(detok.finish()) + stops.flush());
    r.generate_ms = ms_since(t1);
    return r;
}

}  // namespace tern::runtime
