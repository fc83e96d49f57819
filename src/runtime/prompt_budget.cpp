#include "runtime/prompt_budget.h"

#include <algorithm>
#include <cmath>

namespace tern::runtime {
namespace {

// Weight of the newest step in the moving averages: a few steps follow a
// change of load, one slow step (a page fault, a busy host) moves little.
constexpr double kNewest = 0.2;

void fold(double& average, double sample) { average = average == 0 ? sample : average + kNewest * (sample - average); }

}  // namespace

double PromptBudget::decode_step_seconds(size_t n_decode) const {
    if (n_decode < decode_by_n_.size() && decode_by_n_[n_decode] > 0) return decode_by_n_[n_decode];
    double n = 0, sx = 0, sxx = 0, sy = 0, sxy = 0;
    for (size_t x = 1; x < decode_by_n_.size(); ++x) {
        const double y = decode_by_n_[x];
        if (y == 0) continue;
        n += 1;
        sx += double(x);
        sxx += double(x) * double(x);
        sy += y;
        sxy += double(x) * y;
    }
    if (n == 0) return 0;
    if (n == 1) return sy / sx * double(n_decode);
    const double slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);  // the counts differ: no zero divisor
    const double at_zero = (sy - slope * sx) / n;
    return std::max(0.0, at_zero + slope * double(n_decode));
}

size_t PromptBudget::allow(size_t n_decode, size_t room) const {
    if (stretch_ <= 1 || n_decode == 0) return room;
    const double own = decode_step_seconds(n_decode);
    if (own == 0) return room;  // nothing learned yet
    if (token_s_ == 0) return std::min(room, kProbe);
    const double tokens = (stretch_ - 1) * own / token_s_;
    if (tokens >= double(room)) return room;
    return std::min(room, std::max(kMinChunk, size_t(tokens)));
}

void PromptBudget::record(size_t n_decode, size_t n_prompt, double seconds) {
    if (!(seconds > 0) || n_decode + n_prompt == 0) return;
    if (n_prompt == 0) {
        if (decode_by_n_.size() <= n_decode) decode_by_n_.resize(n_decode + 1, 0.0);
        fold(decode_by_n_[n_decode], seconds);
        return;
    }
    if (n_decode == 0) {
        // A prefill-only step runs the prompt tokens at full width, cheaper
        // per token than beside decoding sequences: a first guess only.
        if (token_s_ == 0) token_s_ = seconds / double(n_prompt);
        return;
    }
    // What the prompt tokens added beyond the same decoding sequences alone.
    const double own = decode_step_seconds(n_decode);
    if (own == 0) return;  // no decode-only step seen yet
    fold(token_s_, std::max(0.0, seconds - own) / double(n_prompt));
}

}  // namespace tern::runtime
