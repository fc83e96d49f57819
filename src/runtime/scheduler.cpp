#include "runtime/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>

#include "runtime/token_stream.h"

namespace tern::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

// One request in a slot: what it feeds the slot, its sampling and text state.
struct Scheduler::Sequence {
    Sequence(GenerationRequest r, const Engine& engine, int n_ctx, uint64_t admitted)
        : req(std::move(r)),
          callbacks(std::make_shared<const RequestCallbacks>(std::move(req.callbacks))),
          order(admitted),
          feed(req.prompt),
          stream(engine.tokenizer(), engine.n_vocab(), n_ctx, req.options, req.prompt) {}

    GenerationRequest req;        // its callbacks moved to `callbacks`
    // Shared with the jobs that call them, which may run after the sequence is gone.
    std::shared_ptr<const RequestCallbacks> callbacks;
    uint64_t order;               // admission order: older sequences keep their pages first
    // Tokens to put in the slot before the next sampling: the prompt, or
    // after a pause everything the slot held. n_fed of them are there.
    std::vector<int32_t> feed;
    size_t n_fed = 0;
    bool feed_wants_logits = true;  // the prompt's last token gives the first logits; a refill's none
    bool decoding = false;        // fed; stream.next_token() is the next to feed
    bool paused = false;          // holds no pages; fed again when pages are free
    TokenStream stream;           // sampling, stop conditions and text of the generated tokens
    GenerateResult& result = stream.result();
    Clock::time_point t_admit, t_first;
};

Scheduler::Scheduler(Engine& engine, SchedulerOptions options)
    : engine_(engine),
      options_(options),
      n_slots_(engine.forward().n_slots()),
      n_ctx_(engine.n_ctx()),
      max_batch_(engine.forward().max_tokens()),
      budget_(options.itl_stretch),
      slots_(size_t(engine.forward().n_slots())),
      pool_(engine.forward().kv_pool_pages(), engine.forward().kv_page_size()) {
    // TERN_GREEDY_PICKS=0: greedy sequences draw from their copied rows too (for A/B runs).
    if (const char* v = std::getenv("TERN_GREEDY_PICKS")) picks_on_ = std::string(v) != "0";
    stats_.kv_pages = pool_.n_pages();
    stats_.kv_page_size = pool_.page_size();
    if (options_.warm_up_tokens > 0) warm_up(std::min(options_.warm_up_tokens, max_batch_));
    stats_.graphs_captured = engine_.forward().graphs_captured();
    thread_ = std::thread([this] { loop(); });
}

// Steps of every size from 1 to n_tokens tokens, each run twice, in both
// kinds a backend captures apart: a token from each of n sequences (decode),
// and n tokens of which two belong to one sequence (prompt tokens beside
// decoding ones), every token wanting logits. They decode at positions 0 and
// 1 of slots 0..n-1, on pages borrowed from the pool (shared by several
// slots when it has fewer pages than slots) and given back unmapped: what
// the steps wrote there is garbage that a sequence taking the page
// overwrites before it reads it, as with any page it takes.
void Scheduler::warm_up(int n_tokens) {
    const auto t0 = Clock::now();
    model::Pass& pass = engine_.forward();
    const int n_seqs = std::min(n_tokens, n_slots_);
    std::vector<int32_t> pages;
    while (int(pages.size()) < n_seqs)
        if (std::optional<int32_t> page = pool_.take())
            pages.push_back(*page);
        else
            break;
    Status st = pages.empty() ? Status(Error{"no KV page is free"}) : Status();
    for (int i = 0; i < n_seqs && st.ok(); ++i) st = pass.map_kv_pages(i, {pages[size_t(i) % pages.size()]});
    model::Batch batch;
    auto run_twice = [&] {
        for (int run = 0; run < 2 && st.ok(); ++run) st = pass.run(batch, logits_, &picks_);
    };
    for (int n = 1; n <= n_tokens && st.ok(); ++n) {
        if (n <= n_seqs) {
            batch = {};
            for (int i = 0; i < n; ++i) batch.add(0, 0, i, true, true);
            run_twice();
        }
        if (n >= 2) {
            batch = {};
            batch.add(0, 0, 0, true, true);
            batch.add(0, 1, 0, true, true);
            for (int i = 2; i < n; ++i) batch.add(0, 0, (i - 1) % n_seqs, true, true);
            run_twice();
        }
    }
    for (int i = 0; i < n_seqs; ++i) {
        const Status unmapped = pass.map_kv_pages(i, {});
        if (st.ok()) st = unmapped;
    }
    for (int32_t page : pages) pool_.release(page);
    if (!st.ok())
        warm_up_status_ = Error{"warm-up: " + st.message()};
    else
        stats_.warm_up_tokens = n_tokens;
    stats_.warm_up_seconds = ms_between(t0, Clock::now()) / 1000.0;
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

// --- KV pages -----------------------------------------------------------------

int Scheduler::pages_for(size_t n_tokens) const {
    return int((n_tokens + size_t(pool_.page_size()) - 1) / size_t(pool_.page_size()));
}

size_t Scheduler::start_feeding(Slot& slot) {
    Sequence& s = *slot.seq;
    const size_t P = size_t(pool_.page_size());
    // A prompt's last token is always computed (its logits start the reply),
    // so its page is never a shared one.
    const size_t max_pages = s.feed_wants_logits ? (s.feed.size() - 1) / P : s.feed.size() / P;
    slot.pages = pool_.match(s.feed.data(), s.feed.size(), max_pages);
    slot.n_offered = slot.pages.size();
    slot.remap = true;
    s.n_fed = slot.pages.size() * P;
    slot.cached.assign(s.feed.begin(), s.feed.begin() + int64_t(s.n_fed));
    if (!s.feed_wants_logits && s.n_fed == s.feed.size()) s.decoding = true;  // a refill found whole
    return s.n_fed;
}

bool Scheduler::grow(Slot& slot) {
    if (slot.cached.size() < slot.pages.size() * size_t(pool_.page_size())) return true;
    const std::optional<int32_t> page = pool_.take();
    if (!page) return false;
    slot.pages.push_back(*page);
    slot.remap = true;
    return true;
}

void Scheduler::offer_full_pages(Slot& slot) {
    const size_t P = size_t(pool_.page_size());
    for (size_t i = slot.n_offered; (i + 1) * P <= slot.cached.size(); ++i) {
        pool_.keep(i > 0 ? slot.pages[i - 1] : KvPagePool::kNoPage, slot.cached.data() + i * P, slot.pages[i]);
        slot.n_offered = i + 1;
    }
}

void Scheduler::drop_pages(Slot& slot, bool keep_full) {
    if (keep_full) offer_full_pages(slot);
    // The last page first: kept pages are taken back in release order, and a
    // chain's later pages are no use without its first.
    for (auto it = slot.pages.rbegin(); it != slot.pages.rend(); ++it) pool_.release(*it);
    slot.pages.clear();
    slot.cached.clear();
    slot.n_offered = 0;
    slot.remap = true;
}

void Scheduler::pause(Slot& slot) {
    Sequence& s = *slot.seq;
    if (s.decoding) {  // fed again: everything the slot held, with no logits wanted
        s.feed = slot.cached;
        s.feed_wants_logits = false;
        s.decoding = false;
    }
    s.n_fed = 0;
    s.paused = true;
    drop_pages(slot, true);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.preemptions;
}

Scheduler::Slot& Scheduler::youngest_holder(Slot& needy) {
    // A sequence whose pages are all shared frees none by pausing: such a
    // one is passed over while a younger one (or the needy one) would.
    auto frees = [this](const Slot& slot) {
        for (int32_t page : slot.pages)
            if (pool_.holds(page) == 1) return true;
        return false;
    };
    Slot* youngest = frees(needy) ? &needy : nullptr;
    for (Slot& slot : slots_)
        if (slot.seq && !slot.pages.empty() && slot.seq->order > needy.seq->order && frees(slot) &&
            (!youngest || slot.seq->order > youngest->seq->order))
            youngest = &slot;
    if (youngest) return *youngest;
    youngest = &needy;
    for (Slot& slot : slots_)
        if (slot.seq && !slot.pages.empty() && slot.seq->order > youngest->seq->order) youngest = &slot;
    return *youngest;
}

int Scheduler::pages_promised() const {
    int n = 0;
    for (const Slot& slot : slots_)
        if (slot.seq && !slot.seq->paused)
            n += std::max(0, pages_for(std::max(slot.seq->feed.size(), slot.cached.size()) + 1) - int(slot.pages.size()));
    return n;
}

// Paused sequences come back oldest first, each once the last step ran
// without want of pages and the pool holds what it feeds and a page to grow.
void Scheduler::resume_paused() {
    while (!short_of_pages_) {
        Slot* oldest = oldest_paused();
        if (!oldest || pool_.available() - pages_promised() < pages_for(oldest->seq->feed.size() + 1)) return;
        oldest->seq->paused = false;
        start_feeding(*oldest);
    }
}

Scheduler::Slot* Scheduler::oldest_paused() {
    Slot* oldest = nullptr;
    for (Slot& slot : slots_)
        if (slot.seq && slot.seq->paused && (!oldest || slot.seq->order < oldest->seq->order)) oldest = &slot;
    return oldest;
}

// --- admission and steps -------------------------------------------------------

void Scheduler::admit_locked() {
    while (!queue_.empty()) {
        GenerationRequest& front = queue_.front();
        if (front.cancelled && front.cancelled->load()) {
            GenerationRequest r = std::move(front);
            queue_.pop_front();
            GenerateResult res;
            res.finish = FinishReason::Cancelled;
            res.n_prompt_total = int(r.prompt.size());
            if (r.callbacks.on_done) outbox_.push_back([f = std::move(r.callbacks.on_done), res] { f(res); });
            continue;
        }
        // Paused sequences first; then a prompt starts when the pool holds it
        // and a page to grow (kept pages it will share count as available).
        // (Waiting for pages means nothing while no sequence runs: the flag
        // of a step whose sequences all ended is stale.)
        const bool short_now = short_of_pages_ && stats_.active_sequences > 0;
        if (oldest_paused() || short_now || pool_.available() - pages_promised() < pages_for(front.prompt.size() + 1))
            return;
        Slot* free_slot = nullptr;
        for (Slot& slot : slots_)
            if (!slot.seq) {
                free_slot = &slot;
                break;
            }
        if (!free_slot) return;
        auto seq = std::make_unique<Sequence>(std::move(front), engine_, n_ctx_, next_order_++);
        queue_.pop_front();
        seq->t_admit = Clock::now();
        free_slot->seq = std::move(seq);
        ++stats_.active_sequences;
        stats_.prefix_tokens_reused += start_feeding(*free_slot);
        Sequence& s = *free_slot->seq;
        s.result.n_prompt_total = int(s.req.prompt.size());
        s.result.n_prompt = int(s.req.prompt.size() - s.n_fed);
        s.result.n_prompt_cached = int(s.n_fed);
    }
}

void Scheduler::finish(Slot& slot, bool ok, const std::string& error) {
    std::unique_ptr<Sequence> seq = std::move(slot.seq);
    // After a failed step what the slot's last pages hold is unknown: only
    // pages offered before it stay kept.
    drop_pages(slot, ok);
    const auto now = Clock::now();
    GenerateResult& r = seq->result;
    if (seq->decoding) r.generate_ms = ms_between(seq->t_first, now);
    {
        std::lock_guard<std::mutex> lock(mu_);
        --stats_.active_sequences;
        stats_.kv_pages_held = pool_.held();
        stats_.kv_pages_kept = pool_.kept();
        stats_.prompt_seconds += r.prompt_ms / 1000.0;
        stats_.generate_seconds += r.generate_ms / 1000.0;
    }
    const std::shared_ptr<const RequestCallbacks> cb = seq->callbacks;
    if (!ok) {
        if (cb->on_error) outbox_.push_back([cb, error] { cb->on_error(error); });
        return;
    }
    // The end of the stream: release what the detokenizer and the stop
    // matcher still hold.
    std::string tail = seq->stream.drain();
    if (!tail.empty() && cb->on_text) outbox_.push_back([cb, tail = std::move(tail)] { cb->on_text(tail); });
    if (!r.error.empty()) {  // the grammar could not go on: the text so far went out, the answer is incomplete
        if (cb->on_error) outbox_.push_back([cb, message = r.error] { cb->on_error(message); });
        return;
    }
    if (cb->on_done) outbox_.push_back([cb, result = std::move(r)] { cb->on_done(result); });
}

void SchedulerStats::StepTimes::add(double s) {
    size_t b = 0;
    while (b < kStepBounds.size() && s > kStepBounds[b]) ++b;
    ++in_bucket[b];
    ++count;
    seconds += s;
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
    resume_paused();

    // The running sequences, oldest first: a sequence short of a page pauses
    // the youngest one holding pages, so those already in the batch (older)
    // keep theirs.
    bool short_of_pages = false;  // some sequence waited for a page this step
    std::vector<size_t> by_age;
    for (size_t i = 0; i < slots_.size(); ++i)
        if (slots_[i].seq && !slots_[i].seq->paused) by_age.push_back(i);
    std::sort(by_age.begin(), by_age.end(),
              [this](size_t a, size_t b) { return slots_[a].seq->order < slots_[b].seq->order; });

    model::Batch batch;
    std::vector<size_t> row_slot;  // slot of each logits row
    std::vector<size_t> in_batch;  // slots with tokens in this batch
    // Decoding sequences first: one token each keeps every stream moving.
    for (size_t i : by_age) {
        Slot& slot = slots_[i];
        if (int(batch.size()) >= max_batch_) break;
        if (!slot.seq || slot.seq->paused || !slot.seq->decoding) continue;
        bool grown = grow(slot);
        while (!grown) {
            short_of_pages = true;
            Slot& victim = youngest_holder(slot);
            pause(victim);
            if (&victim == &slot) break;
            grown = grow(slot);
        }
        if (!grown) continue;
        batch.add(slot.seq->stream.next_token(), int32_t(slot.cached.size()), int32_t(i), true,
                  picks_on_ && slot.seq->stream.wants_only_pick());
        slot.cached.push_back(slot.seq->stream.next_token());
        row_slot.push_back(i);
        in_batch.push_back(i);
    }
    // Then prompt chunks with the room left, within the prompt budget while
    // sequences decode (a paused sequence's refill, a stream already
    // waiting, takes the batch's room); a long prompt spans steps. A chunk
    // short of a page waits for one (pausing others only when nothing else
    // can run, below).
    const size_t n_decode = batch.size();
    size_t prompt_room = budget_.allow(n_decode, size_t(max_batch_) - n_decode);
    for (size_t i : by_age) {
        Slot& slot = slots_[i];
        if (int(batch.size()) >= max_batch_) break;
        if (!slot.seq || slot.seq->paused || slot.seq->decoding) continue;
        Sequence& s = *slot.seq;
        const size_t batch_room = size_t(max_batch_) - batch.size();
        const size_t room = s.feed_wants_logits ? std::min(prompt_room, batch_room) : batch_room;
        const size_t n = std::min(room, s.feed.size() - s.n_fed);
        size_t j = 0;
        for (; j < n; ++j) {
            if (!grow(slot)) {
                short_of_pages = true;
                break;
            }
            const bool last = s.n_fed + j + 1 == s.feed.size();
            const bool logits = last && s.feed_wants_logits;
            batch.add(s.feed[s.n_fed + j], int32_t(slot.cached.size()), int32_t(i), logits,
                      logits && picks_on_ && s.stream.wants_only_pick());
            slot.cached.push_back(s.feed[s.n_fed + j]);
            if (logits) row_slot.push_back(i);
        }
        if (j == 0) continue;
        if (s.feed_wants_logits) prompt_room -= std::min(prompt_room, j);
        s.n_fed += j;
        if (!s.feed_wants_logits && s.n_fed == s.feed.size()) s.decoding = true;  // refilled: go on decoding
        in_batch.push_back(i);
    }
    short_of_pages_ = short_of_pages;
    if (batch.size() == 0) {
        if (!short_of_pages) return false;
        // Every running sequence waits for a page: the youngest holder gives
        // its pages back (the oldest can always run: the pool holds a whole
        // context).
        Slot* youngest = nullptr;
        for (Slot& slot : slots_)
            if (slot.seq && !slot.pages.empty() && (!youngest || slot.seq->order > youngest->seq->order))
                youngest = &slot;
        if (youngest) pause(*youngest);
        return youngest != nullptr;
    }

    Status mapped;
    for (size_t i = 0; i < slots_.size(); ++i) {
        Slot& slot = slots_[i];
        if (!slot.remap) continue;
        Status st = engine_.forward().map_kv_pages(int(i), slot.pages);
        slot.remap = false;
        if (!st.ok() && mapped.ok()) mapped = st;
    }
    if (!mapped.ok()) {
        // The pass refused pages the pool handed out (a bug): the batch's
        // tokens are already counted in their slots, so every sequence in it
        // fails, as after a failed forward pass.
        for (size_t i : in_batch)
            if (slots_[i].seq) finish(slots_[i], false, "the KV pages could not be mapped: " + mapped.message());
        return true;
    }

    model::Logits& logits = logits_;  // kept across steps: no fresh pages to fault in each step
    const auto t_forward = Clock::now();
    const Status st = engine_.forward().run(batch, logits, &picks_);
    const auto t_sample = Clock::now();
    if (st.ok()) budget_.record(n_decode, batch.size() - n_decode, ms_between(t_forward, t_sample) / 1000.0);
    {
        std::lock_guard<std::mutex> lock(mu_);
        ++stats_.steps;
        stats_.forward_seconds += ms_between(t_forward, t_sample) / 1000.0;
        if (st.ok()) stats_.forward_issue_seconds += engine_.forward().last_issue_seconds();
        stats_.host_seconds[SchedulerStats::kBatchPart] += ms_between(t_step, t_forward) / 1000.0;
    }
    if (!st.ok()) {
        for (size_t i : in_batch)
            if (slots_[i].seq) finish(slots_[i], false, "the forward pass failed: " + st.message());
        return true;
    }
    for (size_t i : in_batch) offer_full_pages(slots_[i]);

    const size_t n_vocab = size_t(engine_.n_vocab());
    // Greedy picks made by the forward pass are taken as they are; the other
    // sequences draw from their rows side by side (a pass over the vocabulary
    // each); then, in order, what follows them, callbacks included.
    drawn_rows_.clear();
    for (size_t r = 0; r < row_slot.size(); ++r) {
        if (batch.pick_only[r])
            slots_[row_slot[r]].seq->stream.take_pick(picks_[r]);
        else
            drawn_rows_.push_back(r);
    }
#pragma omp parallel for schedule(dynamic, 1) if (drawn_rows_.size() > 1)
    for (size_t k = 0; k < drawn_rows_.size(); ++k) {
        const size_t r = drawn_rows_[k];
        slots_[row_slot[r]].seq->stream.draw(logits.data() + r * n_vocab);
    }
    const auto t_drawn = Clock::now();
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
        std::string piece = s.stream.advance(logits.data() + r * n_vocab, int(slot.cached.size()) >= n_ctx_);
        new_generated += uint64_t(s.result.n_generated - before);
        if (!piece.empty() && s.callbacks->on_text)
            outbox_.push_back([cb = s.callbacks, piece = std::move(piece)] { cb->on_text(piece); });
        if (s.stream.done()) finish(slot, true, {});
    }
    const uint64_t captured = engine_.forward().graphs_captured();
    std::lock_guard<std::mutex> lock(mu_);
    stats_.graphs_captured = captured;
    stats_.prompt_tokens += new_prompt;
    stats_.generated_tokens += new_generated;
    stats_.kv_pages_held = pool_.held();
    stats_.kv_pages_kept = pool_.kept();
    const auto t_end = Clock::now();
    stats_.host_seconds[SchedulerStats::kDrawPart] += ms_between(t_sample, t_drawn) / 1000.0;
    stats_.host_seconds[SchedulerStats::kTextPart] += ms_between(t_drawn, t_end) / 1000.0;
    const auto kind = n_decode == 0                ? SchedulerStats::kPromptOnly
                      : batch.size() > n_decode ? SchedulerStats::kDecodeAndPrompt
                                                : SchedulerStats::kDecodeOnly;
    stats_.step_times[kind].add(ms_between(t_step, t_end) / 1000.0);
    return true;
}

void Scheduler::loop() {
    for (;;) {
        bool idle = false;
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (stopping_) break;
            admit_locked();
            stats_.queue_depth = int(queue_.size());
            idle = stats_.active_sequences == 0;
        }
        if (!idle) step();
        // Not under mu_: it may wait for the last step's callbacks, which may
        // call submit() or stats().
        deliver();
        if (idle) {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
        }
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
        if (r.callbacks.on_error) outbox_.push_back([f = std::move(r.callbacks.on_error), msg] { f(msg); });
    deliver();
    delivery_.flush();  // shutdown() returns once every request has had its last word
}

}  // namespace tern::runtime
