// Continuous batching: one thread owns the Engine and serves many requests at
// once. Requests wait in a bounded queue; each step builds one Batch holding
// the next token of every decoding sequence plus prefill chunks of newly
// admitted prompts, runs it, and samples each sequence from its own logits row.
// Each sequence has its own KV slot, sampler (seeded per request), streaming
// detokenizer and stop matcher. Because the kernels are batch-invariant, a
// request's greedy output does not depend on what it was batched with.
// Callbacks run on the scheduler thread and must not block: servers push into
// per-request queues that their own threads drain.
#pragma once

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
#include "runtime/engine.h"
#include "runtime/session.h"

namespace tern::runtime {

struct SchedulerOptions {
    int max_queue = 64;  // requests waiting for a slot (beyond the free slots); more are rejected
};

// What a request reports back, from the scheduler thread. Exactly one of
// on_done / on_error is called, last.
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
    double host_seconds = 0;         // the rest of the steps: batching, sampling, detokenizing, callbacks
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
    int n_slots() const { return n_slots_; }
    int n_ctx() const { return n_ctx_; }

private:
    struct Sequence;
    struct Slot {
        std::vector<int32_t> cached;  // tokens whose K/V the slot holds, in order
        std::unique_ptr<Sequence> seq;
    };

    void loop();
    void admit_locked();
    bool step();  // false when there was nothing to do
    void finish(Slot& slot, bool ok, const std::string& error);

    Engine& engine_;
    SchedulerOptions options_;
    int n_slots_, n_ctx_, max_batch_;
    std::vector<Slot> slots_;  // touched only by the scheduler thread (after construction)

    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<GenerationRequest> queue_;
    bool stopping_ = false;
    SchedulerStats stats_;
    std::thread thread_;
};

}  // namespace tern::runtime
