// Token sampling: penalties, greedy, top-k / top-p / min-p truncation,
// temperature and a seeded draw. See sampler.h for the contract.
//
// Ordering: candidates are compared by (logit descending, id ascending), a
// strict total order, so every partial sort has one defined result and the
// draw walks the same sequence on every standard library.
#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <limits>
#include <string>

#include "backend/cpu/ops.h"

namespace tern::runtime {
namespace {

constexpr float kPosInf = std::numeric_limits<float>::infinity();
constexpr float kNegInf = -kPosInf;

std::string format_float(float v) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%g", double(v));
    return buf;
}

Error field_error(const char* field, const char* rule, const std::string& got) {
    return Error{std::string("sampler: ") + field + " " + rule + ", got " + got};
}

// A finite value inside [lo, hi] (NaN fails every comparison, so it is out).
bool in_closed(float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; }

// The candidate order: higher logit first, then lower id.
bool candidate_before(float la, int32_t ia, float lb, int32_t ib) {
    return la > lb || (la == lb && ia < ib);
}

template <class T>
T clamp_or(T v, T lo, T hi, T if_nan) {
    if (v != v) return if_nan;  // NaN
    return std::clamp(v, lo, hi);
}

}  // namespace

Status SamplerParams::validate() const {
    if (!in_closed(temperature, 0.0f, 100.0f))
        return field_error("temperature", "must be in [0, 100]", format_float(temperature));
    if (top_k < 0) return field_error("top_k", "must be >= 0 (0 = off)", std::to_string(top_k));
    if (!std::isfinite(top_p) || !(top_p > 0.0f && top_p <= 1.0f))
        return field_error("top_p", "must be in (0, 1] (1 = off)", format_float(top_p));
    if (!in_closed(min_p, 0.0f, 1.0f))
        return field_error("min_p", "must be in [0, 1] (0 = off)", format_float(min_p));
    if (!std::isfinite(repeat_penalty) || !(repeat_penalty > 0.0f && repeat_penalty <= 100.0f))
        return field_error("repeat_penalty", "must be in (0, 100] (1 = off)",
                           format_float(repeat_penalty));
    if (repeat_last_n < 0)
        return field_error("repeat_last_n", "must be >= 0", std::to_string(repeat_last_n));
    if (!in_closed(presence_penalty, -2.0f, 2.0f))
        return field_error("presence_penalty", "must be in [-2, 2]", format_float(presence_penalty));
    if (!in_closed(frequency_penalty, -2.0f, 2.0f))
        return field_error("frequency_penalty", "must be in [-2, 2]",
                           format_float(frequency_penalty));
    return {};
}

void apply_penalties(std::span<float> logits, std::span<const int32_t> recent,
                     const SamplerParams& params) {
    const float rp = params.repeat_penalty;
    const float freq = params.frequency_penalty;
    const float presence = params.presence_penalty;
    if (recent.empty() || (rp == 1.0f && freq == 0.0f && presence == 0.0f)) return;

    // Count each distinct id once: sort a copy and walk its runs.
    std::vector<int32_t> ids;
    ids.reserve(recent.size());
    for (int32_t t : recent)
        if (t >= 0 && size_t(t) < logits.size()) ids.push_back(t);
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
        size_t j = i;
        while (j < ids.size() && ids[j] == ids[i]) ++j;
        const float count = float(j - i);
        float& l = logits[size_t(ids[i])];
        l = l > 0.0f ? l / rp : l * rp;
        l -= count * freq + presence;
        i = j;
    }
}

Sampler::Sampler(SamplerParams params, int n_vocab)
    : params_(params), n_vocab_(std::max(n_vocab, 0)), rng_(params.seed) {
    // Safety net for callers that skipped validate(): every field lands
    // somewhere harmless instead of producing NaNs or out-of-range reads.
    SamplerParams& p = params_;
    p.temperature = clamp_or(p.temperature, 0.0f, 100.0f, 0.0f);
    p.top_k = std::max(p.top_k, 0);
    p.top_p = clamp_or(p.top_p, 0.0f, 1.0f, 1.0f);
    p.min_p = clamp_or(p.min_p, 0.0f, 1.0f, 0.0f);
    p.repeat_penalty = p.repeat_penalty > 0.0f ? clamp_or(p.repeat_penalty, 0.0f, 100.0f, 1.0f)
                                               : 1.0f;
    p.repeat_last_n = std::max(p.repeat_last_n, 0);
    p.presence_penalty = clamp_or(p.presence_penalty, -2.0f, 2.0f, 0.0f);
    p.frequency_penalty = clamp_or(p.frequency_penalty, -2.0f, 2.0f, 0.0f);
}

Result<Sampler> Sampler::create(SamplerParams params, int n_vocab) {
    if (n_vocab <= 0)
        return Error{"sampler: n_vocab must be positive, got " + std::to_string(n_vocab)};
    if (Status s = params.validate(); !s.ok()) return Error{s.message()};
    return Sampler(params, n_vocab);
}

void Sampler::accept(int32_t token) {
    if (token < 0 || token >= n_vocab_ || params_.repeat_last_n == 0) return;
    history_.push_back(token);
    while (history_.size() > size_t(params_.repeat_last_n)) history_.pop_front();
}

void Sampler::reset() {
    history_.clear();
    rng_.seed(params_.seed);
}

void Sampler::sort_prefix(size_t done, size_t k) {
    // Precondition: the first `done` candidates are already the largest,
    // sorted; after the call the first k are. A small prefix of a long
    // range is a heap selection (about one comparison per candidate); a
    // large one is selection then sort.
    auto cmp = [](const Candidate& a, const Candidate& b) {
        return candidate_before(a.logit, a.id, b.logit, b.id);
    };
    k = std::min(k, cands_.size());
    const auto first = cands_.begin() + std::ptrdiff_t(done);
    const auto middle = cands_.begin() + std::ptrdiff_t(k);
    if ((k - done) * 16 <= cands_.size() - done) {
        std::partial_sort(first, middle, cands_.end(), cmp);
    } else {
        if (middle != cands_.end()) std::nth_element(first, middle, cands_.end(), cmp);
        std::sort(first, middle, cmp);
    }
}

bool Sampler::draws_argmax() const {
    const bool penalties = params_.repeat_penalty != 1.0f || params_.frequency_penalty != 0.0f ||
                           params_.presence_penalty != 0.0f;
    return params_.temperature <= 0.0f && (history_.empty() || !penalties);
}

bool Sampler::prepare(const float* logits) {
    sorted_ = false;
    cands_.clear();
    if (n_vocab_ == 0 || logits == nullptr) return false;

    const bool greedy = params_.temperature <= 0.0f;
    if (draws_argmax()) {
        // The logits as they are: the token the general path picks (NaN as
        // -inf; a +inf beats every finite logit; ties: lowest id).
        const int best = int(backend::cpu::argmax_first(logits, n_vocab_));
        if (best >= 0) cands_.push_back({best, logits[best] == kPosInf ? 0.0f : logits[best]});
        return best >= 0;
    }

    work_.assign(logits, logits + n_vocab_);
    if (!history_.empty()) {
        window_.assign(history_.begin(), history_.end());
        apply_penalties(work_, window_, params_);
    }
    // NaN counts as -inf; -inf tokens can never be drawn.
    bool any_pos_inf = false;
    for (float& l : work_) {
        if (l != l) l = kNegInf;
        any_pos_inf |= l == kPosInf;
    }

    const int32_t k = params_.top_k;
    if (any_pos_inf) {
        // +inf dominates everything finite: the distribution is uniform over
        // the +inf tokens (logit 0 each), which keeps the arithmetic finite.
        for (int i = 0; i < n_vocab_; ++i)
            if (work_[size_t(i)] == kPosInf) cands_.push_back({i, 0.0f});
        if (!greedy && k > 0 && size_t(k) < cands_.size()) keep_top_k(size_t(k));
    } else if (greedy) {
        const int best = int(backend::cpu::argmax_first(work_.data(), n_vocab_));  // ties: lowest id
        if (best >= 0) cands_.push_back({best, work_[size_t(best)]});
    } else if (k > 0 && k < n_vocab_) {
        select_top_k(size_t(k));
    } else {
        for (int i = 0; i < n_vocab_; ++i)
            if (work_[size_t(i)] > kNegInf) cands_.push_back({i, work_[size_t(i)]});
    }
    if (cands_.empty()) return false;
    if (greedy) return true;

    if (params_.top_p < 1.0f) keep_top_p(params_.top_p);
    if (params_.min_p > 0.0f) keep_min_p(params_.min_p);
    return true;
}

void Sampler::select_top_k(size_t k) {
    // One pass with a heap of the k best so far, worst on top: for typical
    // logits almost every token costs one comparison with the heap top.
    const auto better = [](const Candidate& a, const Candidate& b) {
        return candidate_before(a.logit, a.id, b.logit, b.id);
    };
    cands_.reserve(k);
    for (int i = 0; i < n_vocab_; ++i) {
        const float l = work_[size_t(i)];
        if (!(l > kNegInf)) continue;
        if (cands_.size() < k) {
            cands_.push_back({i, l});
            std::push_heap(cands_.begin(), cands_.end(), better);
        } else if (l > cands_.front().logit) {
            // Strictly greater: an equal logit comes with a higher id, which
            // loses the tie.
            std::pop_heap(cands_.begin(), cands_.end(), better);
            cands_.back() = {i, l};
            std::push_heap(cands_.begin(), cands_.end(), better);
        }
    }
    std::sort(cands_.begin(), cands_.end(), better);
    sorted_ = true;
}

void Sampler::keep_top_k(size_t k) {
    sort_prefix(0, k);
    cands_.resize(k);
    sorted_ = true;
}

void Sampler::keep_top_p(double p) {
    // Probabilities at temperature 1 over the current candidates.
    float max_logit = cands_[0].logit;
    for (const Candidate& c : cands_) max_logit = std::max(max_logit, c.logit);
    double total = 0.0;
    for (const Candidate& c : cands_) total += std::exp(double(c.logit) - double(max_logit));

    // Sort only as far as needed: grow the sorted prefix until it holds the
    // smallest set whose mass reaches p (most distributions stop early).
    double cum = 0.0;
    size_t done = 0;
    size_t k = sorted_ ? cands_.size() : std::min<size_t>(cands_.size(), 64);
    for (;;) {
        if (!sorted_) sort_prefix(done, k);
        for (size_t i = done; i < k; ++i) {
            cum += std::exp(double(cands_[i].logit) - double(max_logit));
            if (cum / total >= p) {
                cands_.resize(i + 1);
                sorted_ = true;
                return;
            }
        }
        if (k == cands_.size()) break;  // rounding kept the sum short of p: keep all
        done = k;
        k = std::min(cands_.size(), k * 4);
    }
    sorted_ = true;
}

void Sampler::keep_min_p(double min_p) {
    float max_logit = cands_[0].logit;
    if (!sorted_)
        for (const Candidate& c : cands_) max_logit = std::max(max_logit, c.logit);
    // p / p_max = exp(logit - max_logit) >= min_p, compared in log space
    // (the normalization cancels, and no exp per token is needed).
    const double log_min_p = std::log(min_p);
    size_t n = 0;
    for (const Candidate& c : cands_)
        if (double(c.logit) - double(max_logit) >= log_min_p) cands_[n++] = c;
    cands_.resize(n);
}

double Sampler::compute_weights(double temperature) {
    float max_logit = cands_[0].logit;
    for (const Candidate& c : cands_) max_logit = std::max(max_logit, c.logit);
    weights_.resize(cands_.size());
    double total = 0.0;
    for (size_t i = 0; i < cands_.size(); ++i) {
        weights_[i] = std::exp((double(cands_[i].logit) - double(max_logit)) / temperature);
        total += weights_[i];
    }
    return total;  // >= 1: the maximum has weight exactly 1
}

int32_t Sampler::argmax_candidate() const {
    // cands_ is in id order here, so the first maximum has the lowest id.
    const Candidate* best = &cands_[0];
    for (const Candidate& c : cands_)
        if (candidate_before(c.logit, c.id, best->logit, best->id)) best = &c;
    return best->id;
}

int32_t Sampler::sample(const float* logits) {
    const bool greedy = params_.temperature <= 0.0f;
    // 53 random bits -> a double in [0, 1), independent of the library's
    // distributions (whose algorithms the standard leaves open).
    const double u = greedy ? 0.0 : double(rng_() >> 11) * 0x1.0p-53;
    if (!prepare(logits)) return 0;
    if (greedy) return argmax_candidate();

    const double total = compute_weights(params_.temperature);
    const double target = u * total;
    double cum = 0.0;
    size_t last_positive = 0;
    for (size_t i = 0; i < cands_.size(); ++i) {
        if (weights_[i] <= 0.0) continue;
        cum += weights_[i];
        last_positive = i;
        if (target < cum) return cands_[i].id;
    }
    return cands_[last_positive].id;  // rounding left target at the very end
}

std::vector<TokenProb> Sampler::distribution(const float* logits) {
    std::vector<TokenProb> out;
    if (!prepare(logits)) {
        if (n_vocab_ > 0) out.push_back({0, 1.0f});
        return out;
    }
    if (params_.temperature <= 0.0f) {
        out.push_back({argmax_candidate(), 1.0f});
        return out;
    }
    const double total = compute_weights(params_.temperature);
    out.reserve(cands_.size());
    for (size_t i = 0; i < cands_.size(); ++i)
        out.push_back({cands_[i].id, float(weights_[i] / total)});
    return out;
}

}  // namespace tern::runtime
