// Continuous batching: one thread owns the Engine and serves many requests at
// once. Requests wait in a bounded queue; each step builds one Batch holding
// the next token of every decoding sequence plus prefill chunks of newly
// admitted prompts (as many as the prompt budget lets a step carry beside its
// decoding sequences: runtime/prompt_budget.h), runs it, and samples each
// sequence from its own logits row.
// Each sequence has its own KV slot, sampler (seeded per request), streaming
// detokenizer and stop matcher. Because the kernels are batch-invariant, a
// request's greedy output does not depend on what it was batched with.
//
// KV memory is a pool of pages (runtime/kv_pages.h) that the slots share: a
// sequence takes pages as it grows and gives them back when it ends; the
// full pages of its prompt and reply stay kept, so a later prompt starting
// with the same tokens maps them instead of computing them. When a page is
// needed and none is free, the youngest sequence is paused: its pages go
// back, and it is fed again (its prompt and what it generated, most of it
// found kept) when pages are free, the oldest first. Its output is the same
// as if it had never paused (prefill and decode give the same bits).
// Callbacks run on the scheduler thread and must not block: servers push into
// per-request queues that their own threads drain.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "base/result.h"
#include "runtime/delivery.h"
#include "runtime/engine.h"
#include "runtime/kv_pages.h"
#include "runtime/prompt_budget.h"
#include "runtime/session.h"

namespace tern::runtime {

struct SchedulerOptions {
    int max_queue = 64;  // requests waiting for a slot (beyond the free slots); more are rejected
    // While sequences decode, a step carries only the prompt tokens that keep
    // it within this many times what its decoding sequences alone take
    // (runtime/prompt_budget.h); 1 or less (the default): as many as fit.
    double itl_stretch = 0;
    // Before serving, steps of 1 to this many tokens (at most the batch) run
    // twice each, as a token from each of as many sequences (at most the
    // slots) and as prompt tokens beside decoding ones, so that a backend
    // that captures steps as graphs (model::Pass::graph_tokens) has done so
    // before any request's step: a capture costs milliseconds of host time,
    // and mid-serving it would land in some streams' gaps between tokens.
    // 0: none.
    int warm_up_tokens = 0;
};

// What a request reports back, in order, from the scheduler's delivery thread
// (runtime/delivery.h): never two callbacks at once, and a step's callbacks
// while the next step runs. Exactly one of on_done / on_error is called,
// last. A callback may call submit() and stats(), never shutdown().
struct RequestCallbacks {
    std::function<void(std::string_view)> on_text;        // a piece of final text
    std::function<void(const GenerateResult&)> on_done;   // finished (stop, length or cancelled)
    std::function<void(const std::string&)> on_error;     // failed; the message says why
};

struct GenerationRequest {
    std::vector<int32_t> prompt;
    GenerateOptions options;
    RequestCallbacks callbacks;
    // Set by the owner (e.g. when its client disconnects); the sequence is
    // dropped and its slot freed at the next step.
    std::shared_ptr<std::atomic<bool>> cancelled = std::make_shared<std::atomic<bool>>(false);
};

enum class Admission { Accepted, QueueFull, Invalid, ShuttingDown };

struct SubmitResult {
    Admission admission = Admission::Accepted;
    std::string message;  // why it was not accepted
};

// Counters for monitoring; all monotonic except the gauges.
struct SchedulerStats {
    int queue_depth = 0;             // gauge
    int active_sequences = 0;        // gauge
    uint64_t prompt_tokens = 0;      // prompt tokens evaluated
    uint64_t generated_tokens = 0;
    double prompt_seconds = 0;       // summed per-request prefill time
    double generate_seconds = 0;     // summed per-request decode time
    uint64_t steps = 0;              // forward calls
    double forward_seconds = 0;      // inside the forward calls of the steps
    double forward_issue_seconds = 0;  // of those, before each call first waited (Pass::last_issue_seconds)
    // The rest of the steps, the scheduler's own work, in three parts:
    // building the batch (and dropping cancelled sequences), the draws of
    // the next tokens, and what follows them (detokenizing, stop strings,
    // gathering the requests' callbacks, which run on the delivery thread).
    enum HostPart { kBatchPart = 0, kDrawPart = 1, kTextPart = 2, kHostParts = 3 };
    std::array<double, kHostParts> host_seconds{};
    int kv_pages = 0;                // the pool's pages (gauge)
    int kv_pages_held = 0;           // pages some sequence holds (gauge)
    int kv_pages_kept = 0;           // pages kept for their tokens, held or not (gauge)
    int kv_page_size = 0;            // positions per page
    uint64_t prefix_tokens_reused = 0;  // prompt tokens whose K/V came from kept pages when admitted
    uint64_t preemptions = 0;        // sequences paused for want of pages
    uint64_t graphs_captured = 0;    // forward steps the backend captured as graphs, warm-up included
    double warm_up_seconds = 0;      // the warm-up's (SchedulerOptions::warm_up_tokens)
    int warm_up_tokens = 0;          // its steps ran 1 to this many tokens (0: none, or it failed)

    // How long whole steps took (forward and host work: a decoding stream's
    // gap between tokens), by what they carried, in buckets of upper bounds
    // kStepBounds seconds and one past the last: a tail of slow steps shows
    // which kind it is.
    enum StepKind { kDecodeOnly = 0, kDecodeAndPrompt = 1, kPromptOnly = 2, kStepKinds = 3 };
    static constexpr std::array<double, 10> kStepBounds = {0.001, 0.002, 0.005, 0.01, 0.02,
                                                          0.035, 0.05, 0.1, 0.2, 0.5};
    struct StepTimes {
        std::array<uint64_t, kStepBounds.size() + 1> in_bucket{};  // not cumulative
        uint64_t count = 0;
        double seconds = 0;
        void add(double s);
    };
    std::array<StepTimes, kStepKinds> step_times;
};

class Scheduler {
public:
    Scheduler(Engine& engine, SchedulerOptions options);
    ~Scheduler();  // shutdown()
    Scheduler(const Scheduler&) = delete;
    Scheduler& operator=(const Scheduler&) = delete;

    // Checks the request (sampling values, token ids, that the prompt fits
    // the context) and queues it. Not accepted: no callback will be called.
    SubmitResult submit(GenerationRequest request);

    // Fails every queued and running request with an error saying the server
    // is shutting down, and stops the thread. Idempotent.
    void shutdown();

    SchedulerStats stats() const;
    // How the warm-up went (SchedulerOptions::warm_up_tokens): a failed
    // one is given up at its failure; requests are served all the same.
    const Status& warm_up_status() const { return warm_up_status_; }
    int n_slots() const { return n_slots_; }
    int n_ctx() const { return n_ctx_; }

private:
    struct Sequence;
    struct Slot {
        std::vector<int32_t> cached;  // tokens whose K/V the slot holds, in order
        std::vector<int32_t> pages;   // the pool pages holding them, held
        size_t n_offered = 0;         // its first pages offered to the pool to keep
        bool remap = true;            // pages changed since the pass was told
        std::unique_ptr<Sequence> seq;
    };

    void warm_up(int n_tokens);  // before the thread starts
    void loop();
    void admit_locked();
    bool step();  // false when there was nothing to do
    void finish(Slot& slot, bool ok, const std::string& error);
    // Hands the callbacks this thread has gathered to the delivery thread.
    void deliver() { delivery_.post(outbox_); }
    // KV pages (scheduler thread).
    int pages_for(size_t n_tokens) const;
    // Maps the kept pages holding the start of what the slot's sequence feeds;
    // returns the tokens they hold.
    size_t start_feeding(Slot& slot);
    bool grow(Slot& slot);           // a page for the slot's next position; false when none is available
    void offer_full_pages(Slot& slot);
    void drop_pages(Slot& slot, bool keep_full);
    void pause(Slot& slot);
    // The youngest sequence holding pages, or `needy` when it is younger:
    // among those whose pause frees a page, if any does.
    Slot& youngest_holder(Slot& needy);
    // Pages the running sequences will take before their next draw (what is
    // left of their feeds, and a page to grow): what admissions and resumes
    // must leave them.
    int pages_promised() const;
    void resume_paused();
    Slot* oldest_paused();  // nullptr when none is paused

    Engine& engine_;
    SchedulerOptions options_;
    int n_slots_, n_ctx_, max_batch_;
    PromptBudget budget_;      // scheduler thread
    std::vector<Slot> slots_;  // touched only by the scheduler thread (after construction)
    KvPagePool pool_;          // likewise
    uint64_t next_order_ = 0;  // admission order of the sequences
    bool short_of_pages_ = false;  // the last step paused a sequence or left one waiting for a page
    model::Logits logits_;    // the last step's logits rows
    bool picks_on_ = true;            // greedy sequences take the forward pass's picks
    model::Pass::Picks picks_;        // the last step's greedy picks (Pass::run)
    std::vector<size_t> drawn_rows_;  // rows whose sequences draw from the row itself
    // The requests' callbacks of this step, run by delivery_ once the step
    // is done (scheduler thread).
    std::vector<std::function<void()>> outbox_;
    Delivery delivery_;

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<GenerationRequest> queue_;
    bool stopping_ = false;
    SchedulerStats stats_;
    Status warm_up_status_;  // written before the thread starts
    std::thread thread_;
};

}  // namespace tern::runtime
