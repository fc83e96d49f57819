#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>

#include "runtime/token_stream.h"

namespace tern::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

// One request in a slot: its prompt position, its sampling and text state.
struct Scheduler::Sequence {
    Sequence(GenerationRequest r, const Engine& engine, int n_ctx)
        : req(std::move(r)), stream(engine.tokenizer(), engine.n_vocab(), n_ctx, req.options, req.prompt) {}

    GenerationRequest req;
    size_t n_fed = 0;         // prompt tokens in the slot (reused prefix included)
    bool decoding = false;    // the prompt is done; stream.next_token() is the next to feed
    TokenStream stream;       // sampling, stop conditions and text of the generated tokens
    GenerateResult& result = stream.result();
    Clock::time_point t_admit, t_first;
};

Scheduler::Scheduler(Engine& engine, SchedulerOptions options)
    : engine_(engine),
      options_(options),
      n_slots_(engine.forward().n_slots()),
      n_ctx_(engine.n_ctx()),
      max_batch_(engine.forward().max_tokens()),
      slots_(size_t(engine.forward().n_slots())) {
    thread_ = std::thread([this] { loop(); });
}

Scheduler::~Scheduler() { shutdown(); }

SubmitResult Scheduler::submit(GenerationRequest request) {
    if (Status s = request.options.sampling.validate(); !s.ok()) return {Admission::Invalid, s.message()};
    if (request.prompt.empty()) return {Admission::Invalid, "the prompt is empty"};
    for (int32_t t : request.prompt)
        if (t < 0 || t >= engine_.n_vocab())
            return {Admission::Invalid, "prompt token " + std::to_string(t) + " is outside the vocabulary"};
    if (int64_t(request.prompt.size()) >= n_ctx_)
        return {Admission::Invalid, "the prompt has " + std::to_string(request.prompt.size()) +
                                        " tokens and does not fit the context of " + std::to_string(n_ctx_) +
                                        " tokens per sequence"};
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return {Admission::ShuttingDown, "the server is shutting down"};
    // Requests that will find a free slot at the next step do not count as waiting.
    const int free_slots = std::max(0, n_slots_ - stats_.active_sequences);
    if (int(queue_.size()) >= options_.max_queue + free_slots)
        return {Admission::QueueFull, "the request queue is full (" + std::to_string(options_.max_queue) +
                                          " waiting); try again later"};
    queue_.push_back(std::move(request));
    stats_.queue_depth = int(queue_.size());
    cv_.notify_one();
    return {};
}

void Scheduler::shutdown() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
}

SchedulerStats Scheduler::stats() const {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
}

void Scheduler::admit_locked() {
    while (!queue_.empty()) {
        GenerationRequest& front = queue_.front();
        if (front.cancelled && front.cancelled->load()) {
            GenerationRequest r = std::move(front);
            queue_.pop_front();
            GenerateResult res;
            res.finish = FinishReason::Cancelled;
            res.n_prompt_total = int(r.prompt.size());
            if (r.callbacks.on_done) r.callbacks.on_done(res);
            continue;
        }
        // The free slot sharing the longest prefix with the prompt, so a
        // conversation's next turn reuses its K/V.
        int best = -1;
        size_t best_common = 0;
        for (size_t i = 0; i < slots_.size(); ++i) {
            if (slots_[i].seq) continue;
            const std::vector<int32_t>& c = slots_[i].cached;
            size_t common = 0;
            while (common < c.size() && common < front.prompt.size() && c[common] == front.prompt[common]) ++common;
            if (best < 0 || common > best_common) {
                best = int(i);
                best_common = common;
            }
        }
        if (best < 0) return;
        Slot& slot = slots_[size_t(best)];
        // Always evaluate the last prompt token again to get its logits.
        const size_t common = std::min(best_common, front.prompt.size() - 1);
        slot.cached.resize(common);
        auto seq = std::make_unique<Sequence>(std::move(front), engine_, n_ctx_);
        queue_.pop_front();
        seq->n_fed = common;
        seq->t_admit = Clock::now();
        seq->result.n_prompt_total = int(seq->req.prompt.size());
        seq->result.n_prompt = int(seq->req.prompt.size() - common);
        slot.seq = std::move(seq);
        ++stats_.active_sequences;
    }
}

void Scheduler::finish(Slot& slot, bool ok, const std::string& error) {
    std::unique_ptr<Sequence> seq = std::move(slot.seq);
    const auto now = Clock::now();
    GenerateResult& r = seq->result;
    if (seq->decoding) r.generate_ms = ms_between(seq->t_first, now);
    {
        std::lock_guard<std::mutex> lock(mu_);
        --stats_.active_sequences;
        stats_.prompt_seconds += r.prompt_ms / 1000.0;
        stats_.generate_seconds += r.generate_ms / 1000.0;
    }
    if (!ok) {
        slot.cached.clear();  // what the slot holds is unknown after a failed step
        if (seq->req.callbacks.on_error) seq->req.callbacks.on_error(error);
        return;
    }
    // The end of the stream: release what the detokenizer and the stop
    // matcher still hold.
    const std::string tail = seq->stream.drain();
    if (!tail.empty() && seq->req.callbacks.on_text) seq->req.callbacks.on_text(tail);
    if (!r.error.empty()) {  // the grammar could not go on: the text so far went out, the answer is incomplete
        if (seq->req.callbacks.on_error) seq->req.callbacks.on_error(r.error);
        return;
    }
    if (seq->req.callbacks.on_done) seq->req.callbacks.on_done(r);
}

bool Scheduler::step() {
    const auto t_step = Clock::now();
    // Drop cancelled sequences first so their slots are free for the queue.
    for (Slot& slot : slots_) {
        if (slot.seq && slot.seq->req.cancelled && slot.seq->req.cancelled->load()) {
            slot.seq->stream.cancel();
            finish(slot, true, {});
        }
    }

    model::Batch batch;
    std::vector<size_t> row_slot;  // slot of each logits row
    std::vector<size_t> in_batch;  // slots with tokens in this batch
    // Decoding sequences first: one token each keeps every stream moving.
    for (size_t i = 0; i < slots_.size() && int(batch.size()) < max_batch_; ++i) {
        Slot& slot = slots_[i];
        if (!slot.seq || !slot.seq->decoding) continue;
        batch.add(slot.seq->stream.next_token(), int32_t(slot.cached.size()), int32_t(i), true);
        slot.cached.push_back(slot.seq->stream.next_token());
        row_slot.push_back(i);
        in_batch.push_back(i);
    }
    // Then prompt chunks with the room left; a long prompt spans steps.
    for (size_t i = 0; i < slots_.size() && int(batch.size()) < max_batch_; ++i) {
        Slot& slot = slots_[i];
        if (!slot.seq || slot.seq->decoding) continue;
        Sequence& s = *slot.seq;
        const size_t room = size_t(max_batch_) - batch.size();
        const size_t n = std::min(room, s.req.prompt.size() - s.n_fed);
        for (size_t j = 0; j < n; ++j) {
            const bool last = s.n_fed + j + 1 == s.req.prompt.size();
            batch.add(s.req.prompt[s.n_fed + j], int32_t(slot.cached.size()), int32_t(i), last);
            slot.cached.push_back(s.req.prompt[s.n_fed + j]);
            if (last) row_slot.push_back(i);
        }
        s.n_fed += n;
        in_batch.push_back(i);
    }
    if (batch.size() == 0) return false;

    std::vector<float> logits;
    const auto t_forward = Clock::now();
    const Status st = engine_.forward().run(batch, logits);
    const auto t_sample = Clock::now();
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.steps;
        stats_.forward_seconds += ms_between(t_forward, t_sample) / 1000.0;
        stats_.host_seconds += ms_between(t_step, t_forward) / 1000.0;
    }
    if (!st.ok()) {
        for (size_t i : in_batch)
            if (slots_[i].seq) finish(slots_[i], false, "the forward pass failed: " + st.message());
        return true;
    }

    const size_t n_vocab = size_t(engine_.n_vocab());
    uint64_t new_prompt = 0, new_generated = 0;
    for (size_t r = 0; r < row_slot.size(); ++r) {
        Slot& slot = slots_[row_slot[r]];
        Sequence& s = *slot.seq;
        const auto now = Clock::now();
        if (!s.decoding) {
            s.decoding = true;
            s.t_first = now;
            s.result.prompt_ms = ms_between(s.t_admit, now);
            new_prompt += uint64_t(s.result.n_prompt);
        }
        const int before = s.result.n_generated;
        const std::string piece = s.stream.advance(logits.data() + r * n_vocab, int(slot.cached.size()) >= n_ctx_);
        new_generated += uint64_t(s.result.n_generated - before);
        if (!piece.empty() && s.req.callbacks.on_text) s.req.callbacks.on_text(piece);
        if (s.stream.done()) finish(slot, true, {});
    }
    std::lock_guard<std::mutex> lock(mu_);
    stats_.prompt_tokens += new_prompt;
    stats_.generated_tokens += new_generated;
    stats_.host_seconds += ms_between(t_sample, Clock::now()) / 1000.0;
    return true;
}

void Scheduler::loop() {
    for (;;) {
        {
            std::unique_lock<std::mutex> lock(mu_);
            if (stopping_) break;
            admit_locked();
            stats_.queue_depth = int(queue_.size());
            if (stats_.active_sequences == 0) {
                cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
                continue;
            }
        }
        step();
    }
    // Shutting down: every request still here gets an error.
    const std::string msg = "the server is shutting down";
    for (Slot& slot : slots_)
        if (slot.seq) finish(slot, false, msg);
    std::deque<GenerationRequest> rest;
    {
        std::lock_guard<std::mutex> lock(mu_);
        rest.swap(queue_);
        stats_.queue_depth = 0;
    }
    for (GenerationRequest& r : rest)
        if (r.callbacks.on_error) r.callbacks.on_error(msg);
}

}  // namespace tern::runtime
