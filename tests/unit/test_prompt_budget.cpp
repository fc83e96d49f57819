// PromptBudget: how many prompt tokens a step may carry beside decoding
// sequences, learned from the steps' own times. Times are powers of two so
// every average, difference and fitted line below is exact.
#include "runtime/prompt_budget.h"

#include <gtest/gtest.h>

#include <cmath>

using tern::runtime::PromptBudget;

namespace {

constexpr double kStep = 1.0 / 64;     // a decode-only step of 8 sequences
constexpr double kToken = 1.0 / 1024;  // what a prompt token adds beside them

// A budget that has seen decode-only steps of 8 sequences and one step of 8
// decoding with 10 prompt tokens.
PromptBudget learned(double stretch) {
    PromptBudget b(stretch);
    b.record(8, 0, kStep);
    b.record(8, 10, kStep + 10 * kToken);
    return b;
}

}  // namespace

TEST(PromptBudget, NoCapWhenOffOrNothingDecodes) {
    EXPECT_EQ(learned(0).allow(8, 500), 500u);
    EXPECT_EQ(learned(1).allow(8, 500), 500u);
    EXPECT_EQ(learned(3).allow(0, 500), 500u) << "a step with no decoding sequence takes what fits";
}

TEST(PromptBudget, NoCapUntilADecodeOnlyStepIsSeenThenAProbe) {
    PromptBudget b(3);
    EXPECT_EQ(b.allow(8, 500), 500u);
    b.record(8, 0, kStep);
    EXPECT_EQ(b.allow(8, 500), PromptBudget::kProbe);
    EXPECT_EQ(b.allow(8, 3), 3u);
}

TEST(PromptBudget, KeepsAStepWithinTheStretchOfItsDecodingSequences) {
    PromptBudget b = learned(3);
    EXPECT_EQ(b.decode_step_seconds(8), kStep);
    EXPECT_EQ(b.prompt_token_seconds(), kToken);
    // Two decode-only steps to spare at one prompt token per 1/1024 s: 32 tokens.
    EXPECT_EQ(b.allow(8, 500), 32u);
    EXPECT_EQ(b.allow(8, 5), 5u) << "never more than the room";
    EXPECT_EQ(learned(5).allow(8, 500), 64u);
}

TEST(PromptBudget, AlwaysAMinimumChunkSoLongPromptsMove) {
    EXPECT_EQ(learned(1.5).allow(8, 500), PromptBudget::kMinChunk);  // 8 by the stretch, 8 the floor
    PromptBudget b = learned(1.5);
    for (int i = 0; i < 20; ++i) b.record(8, 10, kStep + 10 * 64 * kToken);  // prompt tokens grew dear
    EXPECT_EQ(b.allow(8, 500), PromptBudget::kMinChunk);
    EXPECT_EQ(b.allow(8, 3), 3u);
}

TEST(PromptBudget, FitsALineThroughTheCountsSeenForOthers) {
    PromptBudget b(3);
    b.record(8, 0, kStep);
    EXPECT_EQ(b.decode_step_seconds(4), kStep / 2) << "one count seen: in proportion";
    // Two counts on the line 1/128 + n/256.
    PromptBudget line(3);
    line.record(2, 0, 1.0 / 64);
    line.record(8, 0, 5.0 / 128);
    EXPECT_EQ(line.decode_step_seconds(4), 3.0 / 128);
    EXPECT_EQ(line.decode_step_seconds(2), 1.0 / 64) << "a count seen keeps its own average";
    EXPECT_EQ(PromptBudget(3).decode_step_seconds(4), 0.0);
    // Fewer decoding sequences take less time alone, so they leave fewer
    // prompt tokens at the same stretch (and at least the minimum chunk).
    line.record(8, 10, 5.0 / 128 + 10 * kToken);
    EXPECT_LT(line.allow(4, 500), line.allow(8, 500));
}

TEST(PromptBudget, LearnsOnlyFromWhatItCanAttribute) {
    PromptBudget b = learned(3);
    b.record(0, 100, 100 * kToken / 8);  // prefill-only steps seed the cost, never move it
    EXPECT_EQ(b.prompt_token_seconds(), kToken);
    b.record(8, 0, 0.0);
    b.record(8, 0, -1.0);
    b.record(8, 0, NAN);
    b.record(0, 0, 1.0);
    EXPECT_EQ(b.decode_step_seconds(8), kStep);
    EXPECT_EQ(b.prompt_token_seconds(), kToken);
    // A mixed step faster than its decoding sequences alone adds nothing, not less.
    PromptBudget c = learned(3);
    c.record(8, 10, kStep / 2);
    EXPECT_GE(c.prompt_token_seconds(), 0.0);
    EXPECT_LT(c.prompt_token_seconds(), kToken);
    // Before any decode-only step a mixed one teaches nothing.
    PromptBudget d(3);
    d.record(8, 10, kStep);
    EXPECT_EQ(d.prompt_token_seconds(), 0.0);

    PromptBudget seeded(3);
    seeded.record(0, 64, 64 * kToken);
    EXPECT_EQ(seeded.prompt_token_seconds(), kToken);
}
