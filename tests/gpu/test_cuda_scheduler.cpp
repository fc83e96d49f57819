// Batch invariance on the GPU as the server drives it: the continuous-batching
// scheduler over the CUDA backend gives each greedy request the tokens it gets
// alone, with 80 requests of mixed prompt lengths (5 to 300 tokens, contexts
// past several attention segments) arriving in waves at 64 slots, so decode
// steps of up to 64 sequences, prefill chunks and queued arrivals all mix;
// and again with prompts sharing prefixes over a KV pool too small for them
// all (pages shared through the page tables, sequences paused and resumed).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <future>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/synth.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "tests/support/test_seed.h"

namespace tern::runtime {
namespace {

constexpr int kSlots = 64, kCtx = 512, kRequests = 80, kWave = 16, kMaxTokens = 24;

struct SynthModel {
    std::string path;
    explicit SynthModel(uint64_t seed) {
        model::SynthOptions o;
        o.shape = *model::synth_preset("tiny");
        o.ftype = quant::FileType::Q4_K_M;  // mmvq at small steps, mmq at large ones
        o.seed = seed;
        o.n_threads = 4;
        path = (std::filesystem::temp_directory_path() /
                ("tern-cuda-scheduler-" + std::to_string(::getpid()) + ".gguf"))
                   .string();
        auto r = model::write_synth_model(path, o);
        EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    }
    ~SynthModel() { std::filesystem::remove(path); }
};

Result<std::unique_ptr<Engine>> open_cuda(const std::string& path, int64_t kv_tokens) {
    EngineOptions o;
    o.backend = "cuda";
    o.n_slots = kSlots;
    o.n_ctx = kCtx;
    o.max_batch = 512;
    o.kv_tokens = kv_tokens;
    return Engine::open(path, o);
}

std::future<GenerateResult> submit(Scheduler& s, const std::vector<int32_t>& prompt) {
    auto promise = std::make_shared<std::promise<GenerateResult>>();
    GenerationRequest r;
    r.prompt = prompt;
    r.options.max_tokens = kMaxTokens;
    r.options.sampling.temperature = 0;
    r.options.ignore_eos = true;
    r.callbacks.on_text = [](std::string_view) {};
    r.callbacks.on_done = [promise](const GenerateResult& res) { promise->set_value(res); };
    r.callbacks.on_error = [promise](const std::string& m) {
        promise->set_exception(std::make_exception_ptr(std::runtime_error(m)));
    };
    const SubmitResult sub = s.submit(std::move(r));
    EXPECT_EQ(sub.admission, Admission::Accepted) << sub.message;
    return promise->get_future();
}

TEST(CudaScheduler, SixtyFourSequencesGiveTheirSoloOutputs) {
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    const SynthModel synth(seed);
    auto engine = open_cuda(synth.path, 0);
    ASSERT_TRUE(engine.ok()) << engine.error().message;

    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> tok(3, (*engine)->n_vocab() - 1);
    std::vector<std::vector<int32_t>> prompts(kRequests);
    for (auto& p : prompts) {
        p.resize(size_t(5 + rng() % 296));
        for (int32_t& t : p) t = tok(rng);
    }

    std::vector<std::vector<int32_t>> alone;
    {
        Scheduler s(**engine, {});
        for (const auto& p : prompts) alone.push_back(submit(s, p).get().tokens);
    }

    std::vector<std::future<GenerateResult>> pending;
    uint64_t steps = 0;
    {
        SchedulerOptions so;
        so.max_queue = kRequests;
        so.warm_up_tokens = kSlots;  // as the server starts: its garbage in the KV pages must not show
        Scheduler s(**engine, so);
        ASSERT_TRUE(s.warm_up_status().ok()) << s.warm_up_status().message();
        // Waves a few steps apart: later arrivals join sequences mid-decode,
        // the last ones wait for slots in the queue.
        for (int i = 0; i < kRequests; ++i) {
            if (i > 0 && i % kWave == 0) std::this_thread::sleep_for(std::chrono::milliseconds(15));
            pending.push_back(submit(s, prompts[size_t(i)]));
        }
        for (int i = 0; i < kRequests; ++i) {
            SCOPED_TRACE("request " + std::to_string(i) + ", prompt of " + std::to_string(prompts[size_t(i)].size()));
            const GenerateResult r = pending[size_t(i)].get();
            EXPECT_EQ(r.tokens, alone[size_t(i)]) << "greedy tokens differ from the request's solo run";
        }
        steps = s.stats().steps;
    }
    // The requests did share steps: far fewer than their solo runs took.
    EXPECT_LT(steps, uint64_t(kRequests) * kMaxTokens / 4);
}

// The server's warm-up captures every step of up to 64 tokens, as a token
// from each of as many sequences and as prompt tokens beside decoding ones,
// and serving 64 requests then captures nothing: no capture's milliseconds
// land among the streams' steps. (Every step here of up to 64 tokens wants
// logits: a prompt is cut only where a step is full, at 512 tokens.)
TEST(CudaScheduler, AfterItsWarmUpServingCapturesNoStep) {
    const uint64_t seed = test::run_seed() + 2;
    SCOPED_TRACE("seed " + std::to_string(seed));
    const SynthModel synth(seed);
    auto engine = open_cuda(synth.path, 0);
    ASSERT_TRUE(engine.ok()) << engine.error().message;
    ASSERT_EQ((*engine)->forward().graph_tokens(), kSlots);

    SchedulerOptions so;
    so.max_queue = kSlots;
    so.warm_up_tokens = kSlots;
    Scheduler s(**engine, so);
    ASSERT_TRUE(s.warm_up_status().ok()) << s.warm_up_status().message();
    const SchedulerStats warmed = s.stats();
    EXPECT_EQ(warmed.graphs_captured, uint64_t(2 * kSlots - 1)) << "a graph for each size of either kind";
    EXPECT_EQ(warmed.steps, 0u) << "the warm-up is not a step of the requests";
    EXPECT_EQ(warmed.kv_pages_held, 0);
    EXPECT_GT(warmed.warm_up_seconds, 0.0);

    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> tok(3, (*engine)->n_vocab() - 1);
    std::vector<std::future<GenerateResult>> pending;
    for (int i = 0; i < kSlots; ++i) {
        std::vector<int32_t> prompt(size_t(9 + rng() % 32));
        for (int32_t& t : prompt) t = tok(rng);
        pending.push_back(submit(s, prompt));
    }
    for (auto& p : pending) EXPECT_EQ(p.get().tokens.size(), size_t(kMaxTokens));
    s.shutdown();
    EXPECT_EQ(s.stats().graphs_captured, warmed.graphs_captured) << "a step was captured while serving";
    std::printf("[   INFO   ] warm-up of steps of 1-%d tokens: %.3f s\n", kSlots, warmed.warm_up_seconds);
}

// 80 requests whose prompts start with one of three system prompts (40 to
// 200 tokens) over a pool of 6,400 positions, a fifth of what they would
// hold at once: kept pages are shared through the page tables, sequences
// pause and resume, and every output is the one it gets alone in a pool
// that holds everything.
TEST(CudaScheduler, SharedPrefixesInATightPoolGiveTheirSoloOutputs) {
    const uint64_t seed = test::run_seed() + 1;
    SCOPED_TRACE("seed " + std::to_string(seed));
    const SynthModel synth(seed);
    auto roomy = open_cuda(synth.path, 0);
    ASSERT_TRUE(roomy.ok()) << roomy.error().message;
    auto tight = open_cuda(synth.path, 6400);
    ASSERT_TRUE(tight.ok()) << tight.error().message;
    ASSERT_EQ((*tight)->forward().kv_pool_pages(), 200);

    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> tok(3, (*roomy)->n_vocab() - 1);
    std::vector<std::vector<int32_t>> systems(3);
    for (auto& p : systems) {
        p.resize(size_t(40 + rng() % 161));
        for (int32_t& t : p) t = tok(rng);
    }
    std::vector<std::vector<int32_t>> prompts(kRequests);
    for (auto& p : prompts) {
        p = systems[rng() % systems.size()];
        const size_t tail = 1 + rng() % 100;
        for (size_t i = 0; i < tail; ++i) p.push_back(tok(rng));
    }

    // Each solo run on a scheduler of its own: a fresh pool, nothing kept to share.
    std::vector<std::vector<int32_t>> alone;
    for (const auto& p : prompts) {
        Scheduler s(**roomy, {});
        alone.push_back(submit(s, p).get().tokens);
    }
    SchedulerOptions so;
    so.max_queue = kRequests;
    Scheduler s(**tight, so);
    std::vector<std::future<GenerateResult>> pending;
    for (int i = 0; i < kRequests; ++i) {
        if (i > 0 && i % kWave == 0) std::this_thread::sleep_for(std::chrono::milliseconds(15));
        pending.push_back(submit(s, prompts[size_t(i)]));
    }
    for (int i = 0; i < kRequests; ++i) {
        SCOPED_TRACE("request " + std::to_string(i) + ", prompt of " + std::to_string(prompts[size_t(i)].size()));
        EXPECT_EQ(pending[size_t(i)].get().tokens, alone[size_t(i)]) << "greedy tokens differ from the solo run";
    }
    const SchedulerStats st = s.stats();
    EXPECT_GT(st.prefix_tokens_reused, 0u);
    EXPECT_EQ(st.kv_pages_held, 0);
    std::printf("[   INFO   ] %llu prompt tokens from kept pages, %llu pauses, %llu steps\n",
                static_cast<unsigned long long>(st.prefix_tokens_reused),
                static_cast<unsigned long long>(st.preemptions), static_cast<unsigned long long>(st.steps));
}

}  // namespace
}  // namespace tern::runtime
