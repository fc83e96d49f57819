// Picks the next token from a row of logits the way llama.cpp users expect:
// repetition/frequency/presence penalties over the recent history, then
// greedy argmax, or top-k -> top-p -> min-p -> temperature -> a seeded draw.
// The same seed and the same logits give the same tokens on every platform:
// the generator is std::mt19937_64 (its output sequence is fixed by the
// standard) and the uniform draw is made from its raw 64 bits here.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <vector>

#include "base/result.h"

namespace tern::runtime {

struct SamplerParams {
    float temperature = 0.8f;      // 0 = greedy (argmax, ties -> lowest id)
    int32_t top_k = 40;            // 0 = off
    float top_p = 0.95f;           // 1 = off
    float min_p = 0.05f;           // 0 = off
    float repeat_penalty = 1.0f;   // 1 = off
    int32_t repeat_last_n = 64;    // history window of all three penalties; 0 = no penalties
    float presence_penalty = 0.0f; // 0 = off
    float frequency_penalty = 0.0f;// 0 = off
    uint64_t seed = 0;             // callers that want fresh randomness pass a random seed

    // Rejects values no caller means (NaN/inf anywhere, temperature outside
    // [0, 100], top_k < 0, top_p outside (0, 1], min_p outside [0, 1],
    // repeat_penalty outside (0, 100], presence/frequency outside [-2, 2] as
    // in the OpenAI API, repeat_last_n < 0). The message names the field.
    Status validate() const;
};

// One surviving token and its probability in the distribution a draw uses.
struct TokenProb {
    int32_t id;
    float p;
};

// The penalty step on its own: for each distinct token t in `recent` (ids
// outside [0, logits.size()) are skipped) with count c, a positive logit is
// divided by repeat_penalty and a non-positive one multiplied by it, then
// c * frequency_penalty + presence_penalty is subtracted. `recent` is the
// window itself; the caller has already cut it to repeat_last_n tokens.
void apply_penalties(std::span<float> logits, std::span<const int32_t> recent,
                     const SamplerParams& params);

class Sampler {
public:
    // params must pass validate() and n_vocab must be positive (create()
    // checks both); out-of-range values are clamped here so that a sampler
    // never misbehaves, but the clamping is a safety net, not an interface.
    explicit Sampler(SamplerParams params, int n_vocab);
    static Result<Sampler> create(SamplerParams params, int n_vocab);

    // logits holds n_vocab floats and is not modified. NaN counts as -inf.
    // If any logit is +inf the draw is uniform over the +inf tokens. If no
    // token has a finite or +inf logit after the penalties, returns 0 (the
    // argmax of an all -inf row with ties going to the lowest id). With
    // temperature > 0 every call consumes exactly one 64-bit draw.
    int32_t sample(const float* logits);
    // Whether sample() is now the plain greedy pick of the row as it is
    // (greedy, and no penalty has a history to apply): then it returns
    // cpu::argmax_first of the row, or 0 where that is -1, and a backend's
    // argmax_rows can stand in for the row.
    bool draws_argmax() const;

    // The distribution sample() would draw from for these logits and the
    // current history, without drawing: the surviving tokens and their
    // probabilities after temperature (summing to 1), in the order the draw
    // walks them. Greedy gives the argmax alone with p = 1.
    std::vector<TokenProb> distribution(const float* logits);

    // Adds a token to the penalty history (keeps the last repeat_last_n).
    // Ids outside [0, n_vocab) are ignored.
    void accept(int32_t token);
    // Clears the history and restarts the generator from params().seed.
    void reset();

    const SamplerParams& params() const { return params_; }
    int n_vocab() const { return n_vocab_; }

private:
    struct Candidate {
        int32_t id;
        float logit;
    };
    // Fills cands_ with the penalized, sanitized candidates and narrows them
    // to the set the draw uses; returns false when nothing survives.
    bool prepare(const float* logits);
    int32_t argmax_candidate() const;
    void select_top_k(size_t k);   // from work_, no +inf present
    void keep_top_k(size_t k);     // within cands_
    void keep_top_p(double p);
    void keep_min_p(double min_p);
    void sort_prefix(size_t done, size_t k);
    // exp((logit - max) / temperature) for every candidate into weights_.
    double compute_weights(double temperature);

    SamplerParams params_;
    int n_vocab_;
    std::mt19937_64 rng_;
    std::deque<int32_t> history_;
    std::vector<float> work_;          // penalized copy of the logits
    std::vector<Candidate> cands_;     // surviving candidates
    std::vector<double> weights_;      // unnormalized draw weights, parallel to cands_
    std::vector<int32_t> window_;      // history copy handed to apply_penalties
    bool sorted_ = false;              // cands_ is in (logit desc, id asc) order
};

}  // namespace tern::runtime
