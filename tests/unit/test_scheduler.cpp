// The continuous-batching scheduler on a small synthetic model: outputs of
// requests run together equal their outputs run alone (and Session's), long
// prompts are chunked across steps, cancellation frees the slot, a full queue
// rejects, and prompts that do not fit the context are refused. With a KV
// pool smaller than every slot's context, sequences pause and resume with
// the outputs they have alone; prompts sharing a prefix share its pages.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <random>

#include "model/synth.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "runtime/session.h"
#include "tests/support/test_seed.h"
#include "tests/support/test_shapes.h"

namespace tern::runtime {
namespace {

const std::string& synth_path() {
    static const std::string path = [] {
        model::SynthOptions o;
        o.shape = *model::synth_preset("tiny");
        o.ftype = quant::FileType::Q8_0;
        o.seed = 5;
        o.n_threads = 2;
        auto r = test::write_temp_model("scheduler", o);
        EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
        return r.ok() ? *r : std::string();
    }();
    return path;
}

std::unique_ptr<Engine> open_engine(int n_slots, int n_ctx, int max_batch, int64_t kv_tokens = 0) {
    EngineOptions o;
    o.threads = 2;
    o.n_slots = n_slots;
    o.n_ctx = n_ctx;
    o.max_batch = max_batch;
    o.kv_tokens = kv_tokens;
    auto e = Engine::open(synth_path(), o);
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().message);
    return e.ok() ? std::move(*e) : nullptr;
}

// A request whose outcome arrives through a future.
struct Pending {
    std::shared_ptr<std::promise<GenerateResult>> promise = std::make_shared<std::promise<GenerateResult>>();
    std::future<GenerateResult> future = promise->get_future();
    std::shared_ptr<std::atomic<bool>> cancelled;
    std::shared_ptr<std::atomic<int>> pieces = std::make_shared<std::atomic<int>>(0);
    SubmitResult submitted;
};

// hold: when valid, the first piece of text blocks the delivery thread until
// it is ready, and with it the scheduler a step later (it hands a step's
// callbacks over only once the last step's have run), which keeps this
// request running for as long as a test needs.
Pending submit(Scheduler& s, const std::vector<int32_t>& prompt, const GenerateOptions& opt,
               std::shared_future<void> hold = {}) {
    Pending p;
    GenerationRequest r;
    r.prompt = prompt;
    r.options = opt;
    p.cancelled = r.cancelled;
    auto promise = p.promise;
    auto pieces = p.pieces;
    auto text = std::make_shared<std::string>();
    r.callbacks.on_text = [pieces, text, hold](std::string_view t) {
        *text += t;
        if (pieces->fetch_add(1) == 0 && hold.valid()) hold.wait();
    };
    r.callbacks.on_done = [promise, text](const GenerateResult& res) {
        GenerateResult copy = res;
        EXPECT_EQ(*text, res.text);  // streamed pieces add up to the final text
        promise->set_value(copy);
    };
    r.callbacks.on_error = [promise](const std::string& m) {
        promise->set_exception(std::make_exception_ptr(std::runtime_error(m)));
    };
    p.submitted = s.submit(std::move(r));
    return p;
}

std::vector<int32_t> random_prompt(std::mt19937_64& rng, int n_vocab, int len) {
    std::uniform_int_distribution<int32_t> tok(3, n_vocab - 1);
    std::vector<int32_t> p(static_cast<size_t>(len));
    for (int32_t& t : p) t = tok(rng);
    return p;
}

GenerateOptions greedy(int max_tokens) {
    GenerateOptions o;
    o.max_tokens = max_tokens;
    o.sampling.temperature = 0;
    o.ignore_eos = true;
    return o;
}

// Each prompt (with its options) served alone, one request after another,
// by a scheduler with default options.
std::vector<GenerateResult> serve_alone(Engine& engine, const std::vector<std::vector<int32_t>>& prompts,
                                        const std::vector<GenerateOptions>& opts) {
    Scheduler s(engine, {});
    std::vector<GenerateResult> results;
    for (size_t i = 0; i < prompts.size(); ++i) results.push_back(submit(s, prompts[i], opts[i]).future.get());
    return results;
}

// Every prompt submitted to `s` at once; their results in order (an empty
// one, and a failure, for a request not accepted).
std::vector<GenerateResult> serve_together(Scheduler& s, const std::vector<std::vector<int32_t>>& prompts,
                                           const std::vector<GenerateOptions>& opts) {
    std::vector<Pending> ps;
    for (size_t i = 0; i < prompts.size(); ++i) ps.push_back(submit(s, prompts[i], opts[i]));
    std::vector<GenerateResult> results;
    for (Pending& p : ps) {
        EXPECT_EQ(p.submitted.admission, Admission::Accepted) << p.submitted.message;
        results.push_back(p.submitted.admission == Admission::Accepted ? p.future.get() : GenerateResult{});
    }
    return results;
}

template <class F>
void wait_until(F cond) {
    for (int i = 0; i < 2000 && !cond(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_TRUE(cond());
}

TEST(SchedulerStats, StepTimesFallInTheBucketOfTheirUpperBound) {
    SchedulerStats::StepTimes t;
    t.add(0.0);                                    // the first bucket
    t.add(SchedulerStats::kStepBounds[0]);         // on a bound: that bucket (Prometheus' "le")
    t.add(SchedulerStats::kStepBounds[0] * 1.01);  // just above: the next
    t.add(SchedulerStats::kStepBounds.back() * 2); // past the last bound: the overflow bucket
    EXPECT_EQ(t.in_bucket[0], 2u);
    EXPECT_EQ(t.in_bucket[1], 1u);
    EXPECT_EQ(t.in_bucket.back(), 1u);
    EXPECT_EQ(t.count, 4u);
    EXPECT_DOUBLE_EQ(t.seconds, SchedulerStats::kStepBounds[0] * 2.01 + SchedulerStats::kStepBounds.back() * 2);
}

TEST(Scheduler, TogetherEqualsAlone) {
    const uint64_t seed = tern::test::run_seed() + 11;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    // max_batch 16 forces prompts of up to 60 tokens to be chunked across steps.
    auto engine = open_engine(4, 128, 16);
    ASSERT_TRUE(engine);
    const int n_vocab = engine->n_vocab();

    std::vector<std::vector<int32_t>> prompts;
    std::vector<GenerateOptions> opts;
    for (int i = 0; i < 6; ++i) {
        prompts.push_back(random_prompt(rng, n_vocab, 3 + int(rng() % 58)));
        GenerateOptions o = greedy(8 + int(rng() % 8));
        if (i % 2 == 1) {  // sampled requests are reproducible through their own seed
            o.sampling = SamplerParams{};
            o.sampling.temperature = 0.9f;
            o.sampling.seed = rng();
        }
        opts.push_back(o);
    }

    std::vector<GenerateResult> alone;
    uint64_t alone_steps = 0;
    {
        Scheduler s(*engine, {});
        for (size_t i = 0; i < prompts.size(); ++i) {
            Pending p = submit(s, prompts[i], opts[i]);
            ASSERT_EQ(p.submitted.admission, Admission::Accepted) << p.submitted.message;
            alone.push_back(p.future.get());
        }
        // Stopped first: a request's answer is given before its last step's
        // time is in the histogram.
        s.shutdown();
        alone_steps = s.stats().steps;
        // The steps' time is split between the forward calls and the
        // scheduler's own host work, both measured.
        const SchedulerStats st = s.stats();
        EXPECT_GT(st.forward_seconds, 0.0);
        EXPECT_GT(st.forward_issue_seconds, 0.0);
        EXPECT_LE(st.forward_issue_seconds, st.forward_seconds + 1e-6) << "a part of the forward calls";
        for (double part : st.host_seconds) EXPECT_GT(part, 0.0);
        // Every step is in the histogram of its kind: one request at a time,
        // so each opens with prompt-only steps (a long prompt takes several)
        // and goes on decoding alone.
        uint64_t counted = 0;
        for (const SchedulerStats::StepTimes& t : st.step_times) {
            uint64_t in_buckets = 0;
            for (uint64_t n : t.in_bucket) in_buckets += n;
            EXPECT_EQ(in_buckets, t.count);
            counted += t.count;
        }
        EXPECT_EQ(counted, st.steps);
        EXPECT_GE(st.step_times[SchedulerStats::kPromptOnly].count, prompts.size());
        EXPECT_GT(st.step_times[SchedulerStats::kDecodeOnly].count, 0u);
        EXPECT_EQ(st.step_times[SchedulerStats::kDecodeAndPrompt].count, 0u);
        EXPECT_GT(st.step_times[SchedulerStats::kDecodeOnly].seconds, 0.0);
    }
    // Six requests over four slots: two wait in the queue and join mid-way.
    std::vector<GenerateResult> together;
    {
        Scheduler s(*engine, {});
        std::vector<Pending> ps;
        for (size_t i = 0; i < prompts.size(); ++i) {
            ps.push_back(submit(s, prompts[i], opts[i]));
            ASSERT_EQ(ps.back().submitted.admission, Admission::Accepted);
        }
        for (Pending& p : ps) together.push_back(p.future.get());
        // Sequences shared steps (the submissions race the scheduler thread,
        // but all six are queued long before the first ones finish).
        EXPECT_LT(s.stats().steps, alone_steps);
        EXPECT_EQ(s.stats().active_sequences, 0);
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        EXPECT_EQ(alone[i].tokens, together[i].tokens);
        EXPECT_EQ(alone[i].text, together[i].text);
        EXPECT_EQ(int(together[i].tokens.size()), opts[i].max_tokens);
        EXPECT_EQ(together[i].finish, FinishReason::Length);
        EXPECT_EQ(together[i].n_prompt_total, int(prompts[i].size()));
    }

    // The single-sequence Session produces the same greedy tokens.
    auto engine2 = open_engine(1, 128, 16);
    ASSERT_TRUE(engine2);
    Session session(*engine2);
    auto r = session.generate(prompts[0], opts[0]);
    ASSERT_TRUE(r.ok()) << r.error().message;
    EXPECT_EQ(r->tokens, alone[0].tokens);
}

// With the prompt budget on (--itl-stretch), prompts that join decoding
// sequences are cut into the chunks the step times allow, and a count of
// decoding sequences with no timed count at or below it first runs a step
// without prompt tokens: the outputs stay those of the requests alone, and
// every request ends.
TEST(Scheduler, WithAPromptBudgetTogetherEqualsAlone) {
    const uint64_t seed = tern::test::run_seed() + 12;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto engine = open_engine(4, 128, 64);
    ASSERT_TRUE(engine);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 8; ++i) prompts.push_back(random_prompt(rng, engine->n_vocab(), 3 + int(rng() % 100)));
    const std::vector<GenerateOptions> opts(prompts.size(), greedy(12));

    const std::vector<GenerateResult> alone = serve_alone(*engine, prompts, opts);
    SchedulerOptions budgeted;
    budgeted.itl_stretch = 1.5;
    Scheduler s(*engine, budgeted);
    const std::vector<GenerateResult> together = serve_together(s, prompts, opts);
    for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        EXPECT_EQ(together[i].tokens, alone[i].tokens);
        EXPECT_EQ(together[i].finish, FinishReason::Length);
    }
}

// The warm-up (run before serving, so that a GPU captures its steps as
// graphs) decodes at positions 0 and 1 of borrowed pages, here with more
// slots than the pool has pages: it is no step of the stats, gives every
// page back, and the requests served after it give the outputs they get
// without it.
TEST(Scheduler, AWarmUpLeavesThePoolAndTheOutputsAsTheyWere) {
    const uint64_t seed = tern::test::run_seed() + 13;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto engine = open_engine(8, 64, 32, 128);
    ASSERT_TRUE(engine);
    ASSERT_EQ(engine->forward().kv_pool_pages(), 4);
    EXPECT_EQ(engine->forward().graph_tokens(), 0) << "the CPU captures nothing";
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 8; ++i) prompts.push_back(random_prompt(rng, engine->n_vocab(), 5 + int(rng() % 16)));
    const std::vector<GenerateOptions> opts(prompts.size(), greedy(10));

    const std::vector<GenerateResult> alone = serve_alone(*engine, prompts, opts);
    SchedulerOptions warm;
    warm.warm_up_tokens = 100;  // more than the batch (32): it bounds them, the slots bound the sequences
    Scheduler s(*engine, warm);
    EXPECT_TRUE(s.warm_up_status().ok()) << s.warm_up_status().message();
    const SchedulerStats st = s.stats();
    EXPECT_GT(st.warm_up_seconds, 0.0);
    EXPECT_EQ(st.warm_up_tokens, 32) << "the batch bounds the warm-up's steps";
    EXPECT_EQ(st.steps, 0u);
    EXPECT_EQ(st.kv_pages_held, 0);
    EXPECT_EQ(st.graphs_captured, 0u);
    const std::vector<GenerateResult> together = serve_together(s, prompts, opts);
    for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        EXPECT_EQ(together[i].tokens, alone[i].tokens);
    }
}

TEST(Scheduler, CancelFreesTheSlot) {
    auto engine = open_engine(1, 256, 32);
    ASSERT_TRUE(engine);
    std::mt19937_64 rng(tern::test::run_seed() + 13);
    Scheduler s(*engine, {});
    std::promise<void> release;
    Pending a = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(200), release.get_future().share());
    ASSERT_EQ(a.submitted.admission, Admission::Accepted);
    // Queued behind a: cancelled before it ever runs.
    Pending b = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(200));
    wait_until([&] { return a.pieces->load() > 0; });
    b.cancelled->store(true);
    a.cancelled->store(true);
    release.set_value();
    GenerateResult ra = a.future.get();
    EXPECT_EQ(ra.finish, FinishReason::Cancelled);
    EXPECT_LT(ra.n_generated, 200);
    EXPECT_EQ(b.future.get().finish, FinishReason::Cancelled);
    // The only slot is free again: a new request completes.
    Pending c = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(5));
    GenerateResult rc = c.future.get();
    EXPECT_EQ(rc.finish, FinishReason::Length);
    EXPECT_EQ(rc.n_generated, 5);
    EXPECT_EQ(s.stats().active_sequences, 0);
}

TEST(Scheduler, FullQueueRejects) {
    auto engine = open_engine(1, 256, 32);
    ASSERT_TRUE(engine);
    std::mt19937_64 rng(tern::test::run_seed() + 14);
    SchedulerOptions so;
    so.max_queue = 2;
    Scheduler s(*engine, so);
    std::promise<void> release;
    Pending running = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(200), release.get_future().share());
    wait_until([&] { return running.pieces->load() > 0; });
    Pending q1 = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(3));
    Pending q2 = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(3));
    Pending over = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(3));
    EXPECT_EQ(q1.submitted.admission, Admission::Accepted);
    EXPECT_EQ(q2.submitted.admission, Admission::Accepted);
    EXPECT_EQ(over.submitted.admission, Admission::QueueFull);
    EXPECT_NE(over.submitted.message.find("queue is full"), std::string::npos);
    EXPECT_EQ(s.stats().queue_depth, 2);
    running.cancelled->store(true);
    release.set_value();
    EXPECT_EQ(q1.future.get().n_generated, 3);
    EXPECT_EQ(q2.future.get().n_generated, 3);
}

TEST(Scheduler, ZeroQueueStillFillsFreeSlots) {
    auto engine = open_engine(2, 256, 32);
    ASSERT_TRUE(engine);
    std::mt19937_64 rng(tern::test::run_seed() + 15);
    SchedulerOptions so;
    so.max_queue = 0;
    Scheduler s(*engine, so);
    std::promise<void> release;
    Pending a = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(200));
    // b is admitted with or after a, and a cannot finish 200 tokens before b's first.
    Pending b = submit(s, random_prompt(rng, engine->n_vocab(), 8), greedy(200), release.get_future().share());
    EXPECT_EQ(a.submitted.admission, Admission::Accepted);
    EXPECT_EQ(b.submitted.admission, Admission::Accepted);
    wait_until([&] { return b.pieces->load() > 0; });
    EXPECT_EQ(s.stats().active_sequences, 2);
    EXPECT_EQ(submit(s, {1, 2, 3}, greedy(2)).submitted.admission, Admission::QueueFull);
    a.cancelled->store(true);
    b.cancelled->store(true);
    release.set_value();
    a.future.get();
    b.future.get();
}

TEST(Scheduler, RejectsPromptsThatDoNotFit) {
    auto engine = open_engine(2, 64, 32);
    ASSERT_TRUE(engine);
    std::mt19937_64 rng(tern::test::run_seed() + 16);
    Scheduler s(*engine, {});
    Pending p = submit(s, random_prompt(rng, engine->n_vocab(), 64), greedy(4));
    EXPECT_EQ(p.submitted.admission, Admission::Invalid);
    EXPECT_NE(p.submitted.message.find("does not fit the context of 64"), std::string::npos) << p.submitted.message;
    Pending bad_token = submit(s, {1, engine->n_vocab()}, greedy(4));
    EXPECT_EQ(bad_token.submitted.admission, Admission::Invalid);
    GenerateOptions bad_temp = greedy(4);
    bad_temp.sampling.temperature = -1;
    Pending bad = submit(s, {1, 2, 3}, bad_temp);
    EXPECT_EQ(bad.submitted.admission, Admission::Invalid);
    EXPECT_NE(bad.submitted.message.find("temperature"), std::string::npos);
    // A prompt that fits with no room left stops at the end of the context.
    Pending edge = submit(s, random_prompt(rng, engine->n_vocab(), 60), greedy(100));
    ASSERT_EQ(edge.submitted.admission, Admission::Accepted);
    GenerateResult r = edge.future.get();
    EXPECT_EQ(r.finish, FinishReason::Length);
    EXPECT_EQ(r.n_generated, 5);  // sampled from the logits at positions 59..63
}

// Four sequences whose contexts grow to 70-120 positions over a pool of 160
// (five pages of 32): they cannot all hold their pages at once, so the
// youngest pause and resume, fed again with what they had. Every output is
// the one the sequence gives alone in a pool that holds everything.
TEST(Scheduler, SmallPoolPausesAndResumesWithTheSameOutputs) {
    const uint64_t seed = tern::test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto roomy = open_engine(4, 128, 32);
    auto tight = open_engine(4, 128, 32, 160);
    ASSERT_TRUE(roomy && tight);
    ASSERT_EQ(tight->forward().kv_pool_pages(), 5);
    std::vector<std::vector<int32_t>> prompts;
    std::vector<GenerateOptions> opts;
    for (int i = 0; i < 4; ++i) {
        prompts.push_back(random_prompt(rng, roomy->n_vocab(), 30 + int(rng() % 40)));
        GenerateOptions o = greedy(40 + int(rng() % 10));
        if (i % 2 == 1) {
            o.sampling = SamplerParams{};
            o.sampling.temperature = 0.9f;
            o.sampling.seed = rng();
        }
        opts.push_back(o);
    }
    const std::vector<GenerateResult> alone = serve_alone(*roomy, prompts, opts);
    Scheduler s(*tight, {});
    const std::vector<GenerateResult> together = serve_together(s, prompts, opts);
    for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE("request " + std::to_string(i));
        EXPECT_EQ(together[i].tokens, alone[i].tokens);
        EXPECT_EQ(together[i].text, alone[i].text);
        EXPECT_EQ(together[i].finish, FinishReason::Length);
    }
    const SchedulerStats st = s.stats();
    EXPECT_GT(st.preemptions, 0u) << "the pool should have run short";
    EXPECT_EQ(st.kv_pages, 5);
    EXPECT_EQ(st.kv_pages_held, 0);
    EXPECT_EQ(st.active_sequences, 0);
}

// A prompt whose start another prompt computed maps its kept pages: only
// the rest is evaluated, and the output is the one it gets computed whole.
TEST(Scheduler, SharedPrefixReusesPages) {
    const uint64_t seed = tern::test::run_seed() + 1;
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    auto engine = open_engine(2, 256, 64);
    ASSERT_TRUE(engine);
    const int n_vocab = engine->n_vocab();
    const std::vector<int32_t> system = random_prompt(rng, n_vocab, 75);  // two whole pages and 11 tokens
    auto with_tail = [&](int n) {
        std::vector<int32_t> p = system;
        const std::vector<int32_t> tail = random_prompt(rng, n_vocab, n);
        p.insert(p.end(), tail.begin(), tail.end());
        return p;
    };
    const std::vector<int32_t> a = with_tail(9), b = with_tail(20);

    GenerateResult b_whole;
    {
        Scheduler s(*engine, {});
        b_whole = submit(s, b, greedy(12)).future.get();
        EXPECT_EQ(b_whole.n_prompt, int(b.size()));
    }
    Scheduler s(*engine, {});
    const GenerateResult ra = submit(s, a, greedy(12)).future.get();
    EXPECT_EQ(ra.n_prompt, int(a.size()));  // nothing kept yet
    const GenerateResult rb = submit(s, b, greedy(12)).future.get();
    EXPECT_EQ(rb.n_prompt, int(b.size()) - 64);  // the system prompt's two whole pages were mapped
    EXPECT_EQ(rb.tokens, b_whole.tokens);
    EXPECT_EQ(s.stats().prefix_tokens_reused, 64u);
    EXPECT_GE(s.stats().kv_pages_kept, 2);
    // The same prompt again: every whole page but the one holding its last
    // token (computed again for its logits).
    const GenerateResult rb2 = submit(s, b, greedy(12)).future.get();
    EXPECT_EQ(rb2.n_prompt, int(b.size()) - int((b.size() - 1) / 32 * 32));
    EXPECT_EQ(rb2.tokens, b_whole.tokens);

    // A prompt of exactly three pages, twice: the second maps two and computes
    // the third (its last token's logits are always computed).
    const std::vector<int32_t> c = with_tail(96 - int(system.size()));
    ASSERT_EQ(c.size(), 96u);
    const GenerateResult rc = submit(s, c, greedy(6)).future.get();
    const GenerateResult rc2 = submit(s, c, greedy(6)).future.get();
    EXPECT_EQ(rc2.n_prompt, 32);
    EXPECT_EQ(rc2.n_prompt_cached, 64);
    EXPECT_EQ(rc2.tokens, rc.tokens);
}

}  // namespace
}  // namespace tern::runtime
