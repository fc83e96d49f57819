#include "runtime/prompt_budget.h"

#include <algorithm>
#include <cmath>

namespace tern::runtime {
namespace {

// Weight of the newest step in the moving averages: a few steps follow a
// change of load, one slow step (a page fault, a busy host) moves little.
constexpr double kNewest = 0.2;

}  // namespace

void PromptBudget::Average::fold(double sample, uint64_t now) {
    // An average not fed for kRetry steps describes another load: replaced.
    value = seen && now - step < kRetry ? value + kNewest * (sample - value) : sample;
    seen = true;
    step = now;
}

PromptBudget::PromptBudget(double stretch) : on_(std::isfinite(stretch) && stretch > 1), stretch_(stretch) {}

double PromptBudget::decode_step_seconds(size_t n_decode) const {
    if (n_decode == 0) return 0;
    if (const Average* own = fed(decode_, n_decode)) return own->value;
    size_t lo = 0, hi = 0;  // nearest timed counts below and above (0: none)
    for (size_t i = std::min(n_decode, decode_.size()); i-- > 1 && lo == 0;)
        if (fed(decode_, i)) lo = i;
    for (size_t i = n_decode + 1; i < decode_.size() && hi == 0; ++i)
        if (fed(decode_, i)) hi = i;
    if (lo == 0) return 0;
    if (hi == 0) return decode_[lo].value;
    const double f = double(n_decode - lo) / double(hi - lo);
    return decode_[lo].value + f * (decode_[hi].value - decode_[lo].value);
}

double PromptBudget::mixed_step_seconds(size_t n_tokens) const {
    if (n_tokens == 0) return 0;
    const Average* a = fed(mixed_, (n_tokens - 1) / kBucket);
    return a ? a->value : 0;
}

size_t PromptBudget::allow(size_t n_decode, size_t room) const {
    if (!on_ || n_decode == 0) return room;
    const double own = decode_step_seconds(n_decode);
    if (own == 0) return 0;  // time these decoding sequences alone first
    if (const Average* timed = fed(decode_, n_decode); timed && steps_ - timed->step >= kRetry)
        return 0;  // their time is old (contexts grow): time them alone again
    const double limit = stretch_ * own;
    const size_t most = n_decode + room;
    // The walk starts at the bucket of the smallest step that carries prompt
    // tokens, so every such step lands in a bucket the walk looked at and
    // teaches it.
    size_t reach = std::min(most, n_decode + kMinChunk);  // tokens in all the step may hold
    for (size_t b = (reach - 1) / kBucket; reach < most; ++b) {
        const size_t top = std::min(most, (b + 1) * kBucket);
        const Average* a = fed(mixed_, b);
        if (!a) {
            reach = top;  // never tried: this step tries it
            break;
        }
        if (a->value > limit) {
            if (steps_ - a->step >= kRetry) reach = top;  // too slow long ago: tried again
            break;
        }
        reach = top;
    }
    return reach - n_decode;
}

void PromptBudget::record(size_t n_decode, size_t n_prompt, double seconds) {
    ++steps_;
    if (!(seconds > 0) || !std::isfinite(seconds) || n_decode + n_prompt == 0) return;
    if (n_prompt == 0) {
        if (decode_.size() <= n_decode) decode_.resize(n_decode + 1);
        decode_[n_decode].fold(seconds, steps_);
        return;
    }
    const size_t b = (n_decode + n_prompt - 1) / kBucket;
    if (mixed_.size() <= b) mixed_.resize(b + 1);
    mixed_[b].fold(seconds, steps_);
}

}  // namespace tern::runtime
