// How many prompt tokens a scheduler step may carry beside its decoding
// sequences. A step that prefills a new prompt while others decode makes
// every one of those streams wait for it: its inter-token gap is that step's
// time. The budget keeps such a step within `stretch` times what its decoding
// sequences alone take, from what the steps themselves take, so one rule
// serves every backend and model: a GPU step that decodes 32 sequences
// absorbs more prompt tokens than a CPU one.
//
// It learns two tables of moving averages: decode-only steps by their count
// of sequences, and steps that carry prompt tokens by their total token count
// (in buckets of kBucket tokens). A step's time is not linear in its tokens
// on a GPU: it is nearly flat while one kernel serves the count, then jumps
// where a wider one takes over, so the budget reads the measured times of
// whole steps rather than a cost per token. Going up the buckets from that
// of the smallest step with prompt tokens (the decoding sequences and
// kMinChunk), each bucket known to fit extends the chunk,
// the first unknown one is tried (its step teaches it), and the first known
// too slow ends the walk; a slow bucket not stepped into for kRetry steps is
// tried again, since one slow step must not close it for good.
//
// A count of decoding sequences never timed alone is estimated from the
// nearest counts that were (between two, or a lower one: a lower bound, as
// more sequences never take less); with none below it, or when its own time
// is kRetry steps old, the step carries no prompt token and times it. A step
// that may carry prompt tokens carries at least kMinChunk, so a long prompt
// keeps moving, and as many as fit when nothing decodes. Prefill-only steps
// teach the buckets of their size too: at a given size the weights, not the
// few decoding rows' attention, set a step's time.
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
    // is to time its decoding sequences alone).
    size_t allow(size_t n_decode, size_t room) const;

    // A finished step: its decoding and prompt token counts and the seconds
    // its forward pass took.
    void record(size_t n_decode, size_t n_prompt, double seconds);

    // What the tables hold now (0: nothing to go by): a decode-only step of
    // n_decode sequences, timed or estimated from its neighbours; a step
    // carrying prompt tokens with n_tokens tokens in all (its bucket's).
    double decode_step_seconds(size_t n_decode) const;
    double mixed_step_seconds(size_t n_tokens) const;

    static constexpr size_t kBucket = 16;    // tokens a bucket of the mixed steps' table spans
    static constexpr size_t kMinChunk = 8;   // prompt tokens a step that may carry them carries at least
    static constexpr uint64_t kRetry = 256;  // steps after which a slow bucket, or a count's own time, is measured again

private:
    struct Average {
        double value = 0;
        bool seen = false;
        uint64_t step = 0;  // when last folded
        void fold(double sample, uint64_t now);
    };
    // Entry i of a table, if a step has fed it; else null.
    static const Average* fed(const std::vector<Average>& table, size_t i) {
        return i < table.size() && table[i].seen ? &table[i] : nullptr;
    }

    bool on_;
    double stretch_;
    uint64_t steps_ = 0;
    std::vector<Average> decode_;  // decode-only steps, by count of sequences
    std::vector<Average> mixed_;   // steps with prompt tokens, by bucket of (tokens - 1) / kBucket
};

}  // namespace tern::runtime
