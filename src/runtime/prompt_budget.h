// How many prompt tokens a scheduler step may carry beside its decoding
// sequences. A step that prefills a new prompt while others decode makes
// every one of those streams wait for it: its inter-token gap is that step's
// time. The budget keeps such a step within `stretch` times what its decoding
// sequences alone would take, from what the steps themselves take: a moving
// average of decode-only steps for each count of decoding sequences (a
// least-squares line through those for a count not yet seen alone), and one
// of the time a prompt token adds to a step that also decodes. So one rule
// serves every backend and model: a GPU step that decodes 32 sequences
// absorbs more prompt tokens than a CPU one. A step carries at least
// kMinChunk prompt tokens, so a long prompt keeps moving beside a single
// fast stream, and as many as fit when nothing decodes.
#pragma once

#include <cstddef>
#include <vector>

namespace tern::runtime {

class PromptBudget {
public:
    // stretch <= 1 (0 included): no cap.
    explicit PromptBudget(double stretch) : stretch_(stretch) {}

    // The most prompt tokens for a step with n_decode decoding tokens and
    // room tokens left in the batch (never more than room).
    size_t allow(size_t n_decode, size_t room) const;

    // A finished step: its decoding and prompt token counts and the seconds
    // its forward pass took.
    void record(size_t n_decode, size_t n_prompt, double seconds);

    // A decode-only step of n_decode sequences: its average once seen, else
    // the least-squares line through the counts seen (through zero while one
    // count has been); 0 while none has.
    double decode_step_seconds(size_t n_decode) const;
    // What a prompt token adds to a step (0: not seen yet).
    double prompt_token_seconds() const { return token_s_; }

    static constexpr size_t kMinChunk = 8;  // prompt tokens a step may always carry
    static constexpr size_t kProbe = 16;    // while a prompt token's cost is unknown

private:
    double stretch_;
    std::vector<double> decode_by_n_;  // decode-only steps of n decoding sequences
    double token_s_ = 0;
};

}  // namespace tern::runtime
