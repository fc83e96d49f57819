// PromptBudget: how many prompt tokens a step may carry beside decoding
// sequences, learned from the steps' own times. Times are multiples of
// powers of two, so every value compared exactly below is exact.
#include "runtime/prompt_budget.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using tern::runtime::PromptBudget;

namespace {

constexpr size_t B = PromptBudget::kBucket;
constexpr double kStep = 1.0 / 64;  // a decode-only step of 8 sequences

// A budget that has timed 8 decoding sequences alone and steps of up to 16,
// 32 and 48 tokens with prompt tokens in them at 1.5, 1.75 and 2.5 times that.
PromptBudget learned(double stretch) {
    PromptBudget b(stretch);
    b.record(8, 0, kStep);
    b.record(8, B - 8, 1.5 * kStep);
    b.record(8, 2 * B - 8, 1.75 * kStep);
    b.record(0, 3 * B, 2.5 * kStep);  // a prefill-only step teaches its bucket too
    return b;
}

}  // namespace

TEST(PromptBudget, NoCapWhenOffOrNothingDecodes) {
    for (double off : {0.0, 1.0, -2.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        PromptBudget b(off);
        EXPECT_EQ(b.allow(8, 500), 500u) << off;
        b.record(8, 0, kStep);
        b.record(8, 10, 4 * kStep);
        EXPECT_EQ(b.allow(8, 500), 500u) << off;
    }
    EXPECT_EQ(learned(2).allow(0, 500), 500u) << "a step with no decoding sequence takes what fits";
}

TEST(PromptBudget, WalksUpTheStepsWhileTheyFitTheStretch) {
    PromptBudget b = learned(2);
    EXPECT_EQ(b.mixed_step_seconds(1), 1.5 * kStep);
    EXPECT_EQ(b.mixed_step_seconds(2 * B), 1.75 * kStep);
    EXPECT_EQ(b.mixed_step_seconds(2 * B + 1), 2.5 * kStep);
    EXPECT_EQ(b.mixed_step_seconds(3 * B + 1), 0.0);
    // 2 x the decode-only step: up to 32 tokens in all fit, 48 do not.
    EXPECT_EQ(b.allow(8, 500), 2 * B - 8);
    EXPECT_EQ(b.allow(8, 5), 5u) << "never more than the room";
    // 3 x: 48 fit and the next bucket was never tried, so this step tries it.
    PromptBudget loose = learned(3);
    EXPECT_EQ(loose.allow(8, 500), 4 * B - 8);
    loose.record(8, 4 * B - 8, 4 * kStep);  // too slow
    EXPECT_EQ(loose.allow(8, 500), 3 * B - 8);
    // A slower bucket below a faster one ends the walk: the times are read as
    // never falling with more tokens.
    for (int i = 0; i < 5; ++i) loose.record(8, B - 8, 4 * kStep);  // 1.5 -> 3.18 x the decode-only step
    EXPECT_GT(loose.mixed_step_seconds(B), 3 * kStep);
    EXPECT_EQ(loose.allow(8, 500), PromptBudget::kMinChunk);
}

TEST(PromptBudget, AtLeastAMinimumChunkSoLongPromptsMove) {
    PromptBudget b = learned(1.25);  // even 16 tokens in all take 1.5 x
    EXPECT_EQ(b.allow(8, 500), PromptBudget::kMinChunk);
    EXPECT_EQ(b.allow(8, 3), 3u);
    // Decoding sequences that fill a bucket exactly start the walk at the next.
    PromptBudget full(2);
    full.record(B, 0, kStep);
    EXPECT_EQ(full.allow(B, 500), B) << "the next bucket is untried";
    full.record(B, B, 4 * kStep);
    EXPECT_EQ(full.allow(B, 500), PromptBudget::kMinChunk);
    // Decoding sequences 4 short of a bucket's end: the least step with
    // prompt tokens lands in the next bucket, so the walk starts there and
    // each step teaches the bucket it lands in.
    PromptBudget near_end(2);
    near_end.record(B - 4, 0, kStep);
    EXPECT_EQ(near_end.allow(B - 4, 500), B + 4) << "the bucket of 17-32 tokens is untried";
    near_end.record(B - 4, B + 4, 1.25 * kStep);
    EXPECT_EQ(near_end.allow(B - 4, 500), 2 * B + 4) << "it fits: the next one is tried";
}

TEST(PromptBudget, TimesACountAloneOnlyWhenNothingBelowItWasTimed) {
    PromptBudget b(2);
    EXPECT_EQ(b.allow(8, 500), 0u) << "no count was ever timed alone";
    EXPECT_EQ(b.decode_step_seconds(8), 0.0);
    b.record(8, 0, kStep);
    EXPECT_EQ(b.allow(5, 500), 0u) << "nothing below 5 was timed";
    EXPECT_EQ(b.allow(8, 500), B - 8) << "its first bucket is untried";
    // Above the highest timed count, that count's time is the estimate (a
    // lower bound); between two, the line through them.
    EXPECT_EQ(b.decode_step_seconds(12), kStep);
    b.record(16, 0, 2 * kStep);
    EXPECT_EQ(b.decode_step_seconds(12), 1.5 * kStep);
    EXPECT_EQ(b.decode_step_seconds(10), 1.25 * kStep);
    EXPECT_EQ(b.decode_step_seconds(40), 2 * kStep);
    EXPECT_EQ(b.decode_step_seconds(0), 0.0);
}

TEST(PromptBudget, TriesASlowBucketAgainOnceItsTimeIsOld) {
    PromptBudget b = learned(2);  // the bucket of 33-48 tokens is too slow
    for (uint64_t i = 0; i + 1 < PromptBudget::kRetry; ++i) b.record(8, 0, kStep);
    EXPECT_EQ(b.allow(8, 500), 2 * B - 8) << "still recent";
    b.record(8, 0, kStep);
    EXPECT_EQ(b.allow(8, 500), 3 * B - 8) << "old: this step tries it again";
    b.record(8, 3 * B - 8, 1.25 * kStep);  // an old average is replaced, not moved a fifth
    EXPECT_EQ(b.mixed_step_seconds(3 * B), 1.25 * kStep);
    EXPECT_EQ(b.allow(8, 500), 4 * B - 8);
}

TEST(PromptBudget, TimesACountAloneAgainOnceItsTimeIsOld) {
    PromptBudget b = learned(2);  // 8 decoding sequences timed alone at its first step
    for (uint64_t i = 0; i + 4 < PromptBudget::kRetry; ++i) b.record(4, 0, kStep / 2);
    EXPECT_EQ(b.allow(8, 500), 2 * B - 8) << "still recent";
    b.record(4, 0, kStep / 2);
    EXPECT_EQ(b.allow(8, 500), 0u) << "old: this step times them alone";
    b.record(8, 0, 1.5 * kStep);  // replaces the old time
    EXPECT_EQ(b.decode_step_seconds(8), 1.5 * kStep);
    EXPECT_EQ(b.allow(8, 500), 4 * B - 8) << "twice the new time: up to 48 tokens fit, 49-64 untried";
}

TEST(PromptBudget, LearnsOnlyFromStepsThatRan) {
    PromptBudget b = learned(2);
    for (double bad : {0.0, -1.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
        b.record(8, 0, bad);
        b.record(8, 10, bad);
    }
    b.record(0, 0, 1.0);
    EXPECT_EQ(b.decode_step_seconds(8), kStep);
    EXPECT_EQ(b.mixed_step_seconds(12), 1.5 * kStep);
    // The averages move a fifth of the way to each new step.
    b.record(8, 0, 2 * kStep);
    EXPECT_EQ(b.decode_step_seconds(8), kStep + kStep / 5);
    b.record(4, 8, 4 * kStep);
    EXPECT_EQ(b.mixed_step_seconds(12), 1.5 * kStep + 0.5 * kStep);
}
