#include "runtime/token_stream.h"

#include <chrono>
#include <cmath>

namespace tern::runtime {

TokenStream::TokenStream(const text::Tokenizer& tok, int n_vocab, int n_ctx, const GenerateOptions& options,
                         const std::vector<int32_t>& prompt)
    : tok_(tok),
      ignore_eos_(options.ignore_eos),
      limit_(options.max_tokens < 0 ? n_ctx : options.max_tokens),
      sampler_(options.sampling, n_vocab),
      detok_(tok),
      stops_(options.stop) {
    for (int32_t t : prompt) sampler_.accept(t);
    result_.finish = FinishReason::Length;
    if (limit_ <= 0) done_ = true;
    if (options.grammar) {
        grammar_.emplace(options.grammar);
        grammar_vocab_ = options.grammar_vocab ? options.grammar_vocab : GrammarVocab::make(tok);
    }
}

bool TokenStream::grammar_fits(int32_t t) const {
    if (tok_.is_eog(t)) return !ignore_eos_ && grammar_->can_end();
    return t >= 0 && t < grammar_vocab_->n_vocab() && grammar_->allows(grammar_vocab_->bytes(t));
}

void TokenStream::end(FinishReason why) {
    result_.finish = why;
    done_ = true;
}

void TokenStream::draw(const float* logits) {
    if (!done_ && drawn_ < 0) drawn_ = sampler_.sample(logits);
}

bool TokenStream::wants_only_pick() const { return !done_ && drawn_ < 0 && !grammar_ && sampler_.draws_argmax(); }

void TokenStream::take_pick(int32_t argmax) {
    if (!done_ && drawn_ < 0) drawn_ = argmax >= 0 ? argmax : 0;  // sample()'s 0 where nothing can be picked
}

std::string TokenStream::advance(const float* logits, bool context_full) {
    if (done_) return {};
    int32_t t = drawn_ >= 0 ? drawn_ : sampler_.sample(logits);
    drawn_ = -1;
    const auto t_grammar = std::chrono::steady_clock::now();
    auto grammar_time = [&] {
        result_.grammar_ms +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t_grammar).count();
    };
    if (grammar_ && !grammar_fits(t)) {
        ++result_.n_grammar_masks;
        masked_.assign(logits, logits + sampler_.n_vocab());
        grammar_->mask(masked_, *grammar_vocab_);
        if (ignore_eos_)
            for (size_t id = 0; id < masked_.size(); ++id)
                if (tok_.is_eog(int32_t(id))) masked_[id] = -INFINITY;
        t = sampler_.sample(masked_.data());
        if (!grammar_fits(t)) {  // every logit masked: nothing in the vocabulary continues the text
            result_.error = grammar_->error().empty()
                                ? "grammar: no token of the vocabulary can continue the text here"
                                : grammar_->error();
            end(FinishReason::Stop);
            grammar_time();
            return {};
        }
    }
    sampler_.accept(t);
    if (!ignore_eos_ && tok_.is_eog(t)) {
        end(FinishReason::Stop);
        return {};
    }
    if (grammar_) {
        const bool took = grammar_->accept(grammar_vocab_->bytes(t));
        grammar_time();
        if (!took) {
            result_.error = grammar_->error().empty() ? "grammar: the matcher refused a token it allowed" : grammar_->error();
            end(FinishReason::Stop);
            return {};
        }
    }
    result_.tokens.push_back(t);
    ++result_.n_generated;
    std::string piece = stops_.push(detok_.push(t));
    result_.text += piece;
    if (stops_.stopped() || (grammar_ && !grammar_->can_continue()))
        end(FinishReason::Stop);
    else if (result_.n_generated >= limit_ || context_full)
        end(FinishReason::Length);
    else
        next_ = t;
    return piece;
}

void TokenStream::cancel() { end(FinishReason::Cancelled); }

std::string TokenStream::drain() {
    if (result_.finish == FinishReason::Cancelled || stops_.stopped()) return {};
    std::string tail = stops_.push(detok_.finish());
    tail += stops_.flush();
    result_.text += tail;
    return tail;
}

}  // namespace tern::runtime
