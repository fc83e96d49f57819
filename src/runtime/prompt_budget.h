// How many prompt tokens a scheduler step may carry beside its decoding
// sequences. A step that prefills a new prompt while others decode makes
// every one of those streams wait for it: its inter-token gap is that step's
// time. The budget keeps such a step within `stretch` times what its decoding
// sequences alone take, from what the steps themselves take: a moving average
// of decode-only steps for each count of decoding sequences, and one of the
// time a prompt token adds to a step that also decodes. So one rule serves
// every backend and model: a GPU step that decodes 32 sequences absorbs more
// prompt tokens than a CPU one.
//
// A count's decode-only time is measured, never guessed: when it has not
// been seen alone in the last kFresh steps (decode steps slow down as
// contexts grow), the step carries no prompt token and measures it. A step
// that may carry prompt tokens carries at least kMinChunk, so a long prompt
// keeps moving beside a single fast stream, and as many as fit when nothing
// decodes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tern::runtime {

class PromptBudget {
public:
    // stretch not above 1 (0 included), or not finite: no cap.
    explicit PromptBudget(double stretch);

    // The most prompt tokens for a step with n_decode decoding tokens and
    // room tokens left in the batch (never more than room; 0 when the step
    // is to measure its decoding sequences alone).
    size_t allow(size_t n_decode, size_t room) const;

    // A finished step: its decoding and prompt token counts and the seconds
    // its forward pass took.
    void record(size_t n_decode, size_t n_prompt, double seconds);

    // The current decode-only time of n_decode sequences (0: not measured in
    // the last kFresh steps), and what a prompt token adds (0: not seen).
    double decode_step_seconds(size_t n_decode) const;
    double prompt_token_seconds() const { return token_.seen ? token_.value : 0; }

    static constexpr size_t kMinChunk = 8;   // prompt tokens a step that may carry them carries at least
    static constexpr size_t kProbe = 16;     // while a prompt token's cost is unknown
    static constexpr uint64_t kFresh = 64;   // steps a count's decode-only time stays current

private:
    struct Average {
        double value = 0;
        bool seen = false;
        uint64_t step = 0;  // when last folded
        void fold(double sample, uint64_t now);
    };

    bool on_;
    double stretch_;
    uint64_t steps_ = 0;
    std::vector<Average> decode_by_n_;  // decode-only steps of n decoding sequences
    Average token_;
};

}  // namespace tern::runtime
