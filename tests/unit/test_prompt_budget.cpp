// PromptBudget: how many prompt tokens a step may carry beside decoding
// sequences, learned from the steps' own times. Times are powers of two so
// every average and difference below is exact.
#include "runtime/prompt_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using tern::runtime::PromptBudget;

namespace {

constexpr double kStep = 1.0 / 64;     // a decode-only step of 8 sequences
constexpr double kToken = 1.0 / 1024;  // what a prompt token adds beside them

// A budget that has seen a decode-only step of 8 sequences and then one of 8
// decoding with 10 prompt tokens.
PromptBudget learned(double stretch) {
    PromptBudget b(stretch);
    b.record(8, 0, kStep);
    b.record(8, 10, kStep + 10 * kToken);
    return b;
}

}  // namespace

TEST(PromptBudget, NoCapWhenOffOrNothingDecodes) {
    for (double off : {0.0, 1.0, -2.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        PromptBudget b(off);
        EXPECT_EQ(b.allow(8, 500), 500u) << off;
        b.record(8, 0, kStep);
        b.record(8, 10, kStep + 10 * kToken);
        EXPECT_EQ(b.allow(8, 500), 500u) << off;
    }
    EXPECT_EQ(learned(3).allow(0, 500), 500u) << "a step with no decoding sequence takes what fits";
}

TEST(PromptBudget, MeasuresEachCountAloneBeforeAddingPromptTokens) {
    PromptBudget b(3);
    EXPECT_EQ(b.allow(8, 500), 0u) << "8 decoding sequences never ran alone";
    b.record(8, 0, kStep);
    EXPECT_EQ(b.allow(8, 500), PromptBudget::kProbe) << "a prompt token's cost is not known yet";
    EXPECT_EQ(b.allow(8, 3), 3u);
    EXPECT_EQ(b.allow(5, 500), 0u) << "another count is measured on its own";
}

TEST(PromptBudget, KeepsAStepWithinTheStretchOfItsDecodingSequences) {
    PromptBudget b = learned(3);
    EXPECT_EQ(b.decode_step_seconds(8), kStep);
    EXPECT_EQ(b.prompt_token_seconds(), kToken);
    // Two decode-only steps to spare at one prompt token per 1/1024 s: 32 tokens.
    EXPECT_EQ(b.allow(8, 500), 32u);
    EXPECT_EQ(b.allow(8, 5), 5u) << "never more than the room";
    EXPECT_EQ(learned(5).allow(8, 500), 64u);
    // Prompt tokens that cost nothing: all that fit.
    PromptBudget free_tokens(3);
    free_tokens.record(8, 0, kStep);
    free_tokens.record(8, 10, kStep / 2);
    EXPECT_EQ(free_tokens.prompt_token_seconds(), 0.0);
    EXPECT_EQ(free_tokens.allow(8, 500), 500u);
}

TEST(PromptBudget, AtLeastAMinimumChunkSoLongPromptsMove) {
    EXPECT_EQ(learned(1.25).allow(8, 500), PromptBudget::kMinChunk);  // 4 by the stretch
    PromptBudget b = learned(3);
    for (int i = 0; i < 30; ++i) b.record(8, 10, kStep + 10 * 64 * kToken);  // prompt tokens grew dear
    EXPECT_EQ(b.allow(8, 500), PromptBudget::kMinChunk);
    EXPECT_EQ(b.allow(8, 3), 3u);
}

TEST(PromptBudget, MeasuresACountAgainOnceItsTimeIsStale) {
    PromptBudget b = learned(3);
    for (uint64_t i = 0; i + 2 < PromptBudget::kFresh; ++i) b.record(4, 0, kStep / 2);
    EXPECT_EQ(b.allow(8, 500), 32u) << "still current";
    b.record(4, 0, kStep / 2);
    EXPECT_EQ(b.decode_step_seconds(8), 0.0);
    EXPECT_EQ(b.allow(8, 500), 0u) << "stale: measure 8 alone again";
    b.record(8, 10, 100.0);  // a mixed step against a stale count teaches nothing
    EXPECT_EQ(b.prompt_token_seconds(), kToken);
    b.record(8, 0, kStep);
    EXPECT_EQ(b.allow(8, 500), 32u);
}

TEST(PromptBudget, LearnsOnlyFromWhatItCanAttribute) {
    PromptBudget b = learned(3);
    b.record(5, 10, 100.0);  // 5 decoding sequences never ran alone: nothing to subtract
    EXPECT_EQ(b.prompt_token_seconds(), kToken);
    b.record(0, 100, 100 * kToken / 8);  // prefill-only steps seed the cost, never move it
    EXPECT_EQ(b.prompt_token_seconds(), kToken);
    for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        b.record(8, 0, bad);
        b.record(8, 10, bad);
    }
    b.record(0, 0, 1.0);
    EXPECT_EQ(b.decode_step_seconds(8), kStep);
    EXPECT_EQ(b.prompt_token_seconds(), kToken);
    // The averages move a fifth of the way to each new step.
    b.record(8, 0, 2 * kStep);
    EXPECT_EQ(b.decode_step_seconds(8), kStep + kStep / 5);

    PromptBudget seeded(3);
    seeded.record(0, 64, 64 * kToken);
    EXPECT_EQ(seeded.prompt_token_seconds(), kToken);
    PromptBudget untaught(3);
    untaught.record(8, 10, kStep);
    EXPECT_EQ(untaught.prompt_token_seconds(), 0.0);
}
