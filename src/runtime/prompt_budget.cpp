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
    value = seen ? value + kNewest * (sample - value) : sample;
    seen = true;
    step = now;
}

PromptBudget::PromptBudget(double stretch) : on_(std::isfinite(stretch) && stretch > 1), stretch_(stretch) {}

double PromptBudget::decode_step_seconds(size_t n_decode) const {
    if (n_decode >= decode_by_n_.size()) return 0;
    const Average& a = decode_by_n_[n_decode];
    return a.seen && steps_ - a.step < kFresh ? a.value : 0;
}

size_t PromptBudget::allow(size_t n_decode, size_t room) const {
    if (!on_ || n_decode == 0) return room;
    const double own = decode_step_seconds(n_decode);
    if (own == 0) return 0;  // measure these decoding sequences alone first
    if (!token_.seen) return std::min(room, kProbe);
    const double tokens = (stretch_ - 1) * own / token_.value;  // +inf when prompt tokens came free
    if (!(tokens < double(room))) return room;
    return std::min(room, std::max(kMinChunk, size_t(tokens)));
}

void PromptBudget::record(size_t n_decode, size_t n_prompt, double seconds) {
    ++steps_;
    if (!(seconds > 0) || !std::isfinite(seconds) || n_decode + n_prompt == 0) return;
    if (n_prompt == 0) {
        if (decode_by_n_.size() <= n_decode) decode_by_n_.resize(n_decode + 1);
        decode_by_n_[n_decode].fold(seconds, steps_);
        return;
    }
    if (n_decode == 0) {
        // A prefill-only step runs the prompt tokens at full width, cheaper
        // per token than beside decoding sequences: a first guess only.
        if (!token_.seen) token_.fold(seconds / double(n_prompt), steps_);
        return;
    }
    // What the prompt tokens added beyond the same decoding sequences alone.
    const double own = decode_step_seconds(n_decode);
    if (own == 0) return;
    token_.fold(std::max(0.0, seconds - own) / double(n_prompt), steps_);
}

}  // namespace tern::runtime
