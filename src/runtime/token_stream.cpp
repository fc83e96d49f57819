#include "runtime/token_stream.h"

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
}

void TokenStream::end(FinishReason why) {
    result_.finish = why;
    done_ = true;
}

std::string TokenStream::advance(const float* logits, bool context_full) {
    if (done_) return {};
    const int32_t t = sampler_.sample(logits);
    sampler_.accept(t);
    if (!ignore_eos_ && tok_.is_eog(t)) {
        end(FinishReason::Stop);
        return {};
    }
    result_.tokens.push_back(t);
    ++result_.n_generated;
    std::string piece = stops_.push(detok_.push(t));
    result_.text += piece;
    if (stops_.stopped())
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
