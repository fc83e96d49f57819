// Tensor-parallel plan, weight views and the CPU-simulated tensor-parallel
// forward (see tensor_parallel.h).
#include "model/tensor_parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>

#include "backend/cpu/ops.h"

namespace tern::model {

namespace {

std::string str(int64_t v) { return std::to_string(v); }

struct BlockGeometry {
    int64_t elems = 0, bytes = 0;
};

BlockGeometry block_of(TensorType t) {
    const auto info = tensor_type_info(uint32_t(t));
    if (!info || info->block_elems == 0) return {};
    return {int64_t(info->block_elems), int64_t(info->block_bytes)};
}

std::string type_name(TensorType t) { return tensor_type_name(uint32_t(t)); }

}  // namespace

namespace {

// A copy of w that views part of its host bytes: named after the part, with
// the full row's stride (a view of a view keeps its parent's), registered
// nowhere yet. The caller narrows rows or columns and moves host.
backend::Weight view_of(const backend::Weight& w, const std::string& part, const BlockGeometry& b) {
    backend::Weight v = w;
    v.name = w.name + part;
    v.row_bytes = w.row_bytes ? w.row_bytes : size_t(w.cols / b.elems * b.bytes);
    v.impl = nullptr;
    return v;
}

// A view needs host bytes, and lo..hi-1 within the n rows or columns (what) of w.
Status check_view(const backend::Weight& w, const std::string& what, int64_t lo, int64_t hi, int64_t n) {
    if (!w.host) return Error{"tensor parallel: weight '" + w.name + "' has no host data to view"};
    if (w.layout != backend::WeightLayout::gguf_rows)
        return Error{"tensor parallel: weight '" + w.name +
                     "' is in a backend's registration layout; views are made of the file's rows"};
    if (lo < 0 || hi <= lo || hi > n)
        return Error{"tensor parallel: " + what + " [" + str(lo) + ", " + str(hi) + ") of '" + w.name + "' (" +
                     str(n) + " " + what + ")"};
    return {};
}

}  // namespace

Result<backend::Weight> weight_rows(const backend::Weight& w, int64_t r0, int64_t r1) {
    if (Status st = check_view(w, "rows", r0, r1, w.rows); !st.ok()) return Error{st.message()};
    const BlockGeometry b = block_of(w.type);
    if (b.elems == 0 || w.cols % b.elems != 0)
        return Error{"tensor parallel: weight '" + w.name + "' (" + type_name(w.type) + ") has ragged rows"};
    backend::Weight v = view_of(w, "[" + str(r0) + ":" + str(r1) + ", :]", b);
    v.rows = r1 - r0;
    v.host = static_cast<const uint8_t*>(w.host) + size_t(r0) * v.row_bytes;
    return v;
}

Result<backend::Weight> weight_cols(const backend::Weight& w, int64_t c0, int64_t c1) {
    if (Status st = check_view(w, "columns", c0, c1, w.cols); !st.ok()) return Error{st.message()};
    const BlockGeometry b = block_of(w.type);
    if (b.elems == 0 || w.cols % b.elems != 0 || c0 % b.elems != 0 || c1 % b.elems != 0)
        return Error{"tensor parallel: columns [" + str(c0) + ", " + str(c1) + ") of '" + w.name + "' (" +
                     type_name(w.type) + ", " + str(b.elems) + "-element blocks) are not block aligned"};
    backend::Weight v = view_of(w, "[:, " + str(c0) + ":" + str(c1) + "]", b);
    v.cols = c1 - c0;
    v.host = static_cast<const uint8_t*>(w.host) + size_t(c0 / b.elems * b.bytes);
    return v;
}

Result<TpPlan> plan_tensor_parallel(const Hparams& hp, const Model& model, int n_ranks) {
    if (n_ranks < 1) return Error{"tensor parallel: " + str(n_ranks) + " ranks"};
    if (hp.n_head_kv < 1 || hp.n_head % hp.n_head_kv != 0)
        return Error{"tensor parallel: " + str(hp.n_head) + " query heads do not group over " + str(hp.n_head_kv) +
                     " KV heads"};
    if (hp.n_head_kv % n_ranks != 0)
        return Error{"tensor parallel: n_head_kv = " + str(hp.n_head_kv) + " KV heads cannot be divided evenly over " +
                     str(n_ranks) + " ranks"};
    if (model.layers.size() != size_t(hp.n_layer) || !model.output)
        return Error{"tensor parallel: the model's weights do not match its hyperparameters"};

    TpPlan plan;
    plan.n_ranks = n_ranks;
    plan.group = hp.n_head / hp.n_head_kv;
    const int kv_per_rank = hp.n_head_kv / n_ranks;

    // Wo is split along its input (query-head) columns: each rank's share must be whole blocks.
    const int64_t q_cols = int64_t(kv_per_rank) * plan.group * hp.head_dim;
    for (size_t il = 0; il < model.layers.size(); ++il) {
        const backend::Weight& wo = model.layers[il].wo;
        const int64_t be = block_of(wo.type).elems;
        if (be == 0 || q_cols % be != 0)
            return Error{"tensor parallel: '" + wo.name + "' is " + type_name(wo.type) + " (" + str(be) +
                         "-element blocks), but each of the " + str(n_ranks) + " ranks would take " +
                         str(kv_per_rank * plan.group) + " query heads = " + str(q_cols) +
                         " input columns, not a whole number of blocks"};
    }

    // W_down is split along its input (FFN) columns: split points at multiples of every layer's block size.
    std::string widest;  // the tensor that sets the alignment, for the message
    for (const Layer& L : model.layers) {
        const backend::Weight& down = L.has_experts() ? L.down_exps[0] : L.w_down;  // experts: views of one tensor
        const int64_t be = block_of(down.type).elems;
        if (be == 0) return Error{"tensor parallel: '" + down.name + "' has an unknown block size"};
        if (std::lcm(plan.ff_align, be) != plan.ff_align) widest = down.name + ", " + type_name(down.type);
        plan.ff_align = std::lcm(plan.ff_align, be);
    }
    if (hp.n_ff % plan.ff_align != 0)
        return Error{"tensor parallel: n_ff = " + str(hp.n_ff) + " is not a multiple of " + str(plan.ff_align)};
    const int64_t ff_units = hp.n_ff / plan.ff_align;
    if (ff_units < n_ranks)
        return Error{"tensor parallel: the FFN width n_ff = " + str(hp.n_ff) + " splits only at multiples of " +
                     str(plan.ff_align) + (widest.empty() ? "" : " (blocks of " + widest + ")") + ": " +
                     str(ff_units) + " parts, fewer than the " + str(n_ranks) + " ranks"};

    // The output head is split by rows (vocabulary entries): any row boundary will do.
    const int64_t n_vocab_rows = model.output.rows;
    if (n_vocab_rows < n_ranks)
        return Error{"tensor parallel: " + str(n_vocab_rows) + " vocabulary rows for " + str(n_ranks) + " ranks"};

    for (int r = 0; r < n_ranks; ++r) {
        TpRank rank;
        rank.kv_head_begin = r * kv_per_rank;
        rank.kv_head_end = (r + 1) * kv_per_rank;
        rank.ff_begin = plan.ff_align * (ff_units * r / n_ranks);
        rank.ff_end = plan.ff_align * (ff_units * (r + 1) / n_ranks);
        rank.vocab_begin = n_vocab_rows * r / n_ranks;
        rank.vocab_end = n_vocab_rows * (r + 1) / n_ranks;
        plan.ranks.push_back(rank);
    }
    return plan;
}

Result<Model> shard_model(const Model& model, const TpPlan& plan, int rank) {
    if (rank < 0 || rank >= plan.n_ranks || plan.ranks.size() != size_t(plan.n_ranks))
        return Error{"tensor parallel: rank " + str(rank) + " of a plan for " + str(plan.n_ranks)};
    const TpRank& r = plan.ranks[size_t(rank)];
    const int64_t hd = model.hp.head_dim;
    const int64_t q0 = int64_t(r.kv_head_begin) * plan.group * hd, q1 = int64_t(r.kv_head_end) * plan.group * hd;
    const int64_t k0 = int64_t(r.kv_head_begin) * hd, k1 = int64_t(r.kv_head_end) * hd;

    Model s = model;
    s.hp.n_head_kv = r.kv_head_end - r.kv_head_begin;
    s.hp.n_head = s.hp.n_head_kv * plan.group;
    s.hp.n_ff = int(r.ff_end - r.ff_begin);

    Status failed;
    auto take = [&](backend::Weight& dst, Result<backend::Weight> v) {
        if (!v.ok() && failed.ok()) failed = Error{v.error().message};
        if (v.ok()) dst = std::move(*v);
    };
    // A bias is a 1-D tensor read as f32 in place; other types live in a backend copy a view cannot follow.
    auto bias = [&](backend::Weight& b, int64_t c0, int64_t c1) {
        if (!b) return;
        if (b.type != TensorType::F32) {
            if (failed.ok())
                failed = Error{"tensor parallel: bias '" + b.name + "' is " + type_name(b.type) +
                               "; only f32 biases can be sharded in place"};
            return;
        }
        take(b, weight_cols(b, c0, c1));
    };
    for (Layer& L : s.layers) {
        take(L.wq, weight_rows(L.wq, q0, q1));  // column-parallel: the rank's heads are output rows
        take(L.wk, weight_rows(L.wk, k0, k1));
        take(L.wv, weight_rows(L.wv, k0, k1));
        bias(L.bq, q0, q1);
        bias(L.bk, k0, k1);
        bias(L.bv, k0, k1);
        take(L.wo, weight_cols(L.wo, q0, q1));  // row-parallel: the rank's heads are input columns
        if (!L.has_experts()) {
            take(L.w_gate, weight_rows(L.w_gate, r.ff_begin, r.ff_end));
            take(L.w_up, weight_rows(L.w_up, r.ff_begin, r.ff_end));
            take(L.w_down, weight_cols(L.w_down, r.ff_begin, r.ff_end));
        }
        // A mixture of experts: every expert split as the dense FFN is; the router is replicated.
        for (size_t e = 0; e < L.down_exps.size(); ++e) {
            take(L.gate_exps[e], weight_rows(L.gate_exps[e], r.ff_begin, r.ff_end));
            take(L.up_exps[e], weight_rows(L.up_exps[e], r.ff_begin, r.ff_end));
            take(L.down_exps[e], weight_cols(L.down_exps[e], r.ff_begin, r.ff_end));
        }
    }
    take(s.output, weight_rows(model.output, r.vocab_begin, r.vocab_end));
    if (!failed.ok()) return Error{failed.message()};
    return s;
}

// ---- the tensor-parallel forward ----

// One rank: its shard, backend and Forward, and the thread that issues all of
// its work (a CUDA backend's device belongs to the thread that made it; a CPU
// backend's OpenMP team size is its thread's setting).
struct TpForward::Rank {
    Model model;
    std::unique_ptr<backend::Backend> be;
    std::unique_ptr<Forward> fwd;
    Logits logits;  // its vocabulary columns of the wanted rows
    Status status;

    std::thread thread;
    std::mutex mu;
    std::condition_variable cv;
    std::function<void()> job;
    bool pending = false, quit = false;

    void start() {
        thread = std::thread([this] {
            std::unique_lock<std::mutex> lk(mu);
            for (;;) {
                cv.wait(lk, [&] { return pending || quit; });
                if (!pending) return;
                std::function<void()> j = std::move(job);
                lk.unlock();
                j();
                lk.lock();
                pending = false;
                cv.notify_all();
            }
        });
    }
    void post(std::function<void()> f) {
        {
            std::lock_guard<std::mutex> lk(mu);
            job = std::move(f);
            pending = true;
        }
        cv.notify_all();
    }
    void wait() {
        std::unique_lock<std::mutex> lk(mu);
        cv.wait(lk, [&] { return !pending; });
    }
    // Forward and backend are released on the rank's thread, as they were made.
    void stop() {
        if (!thread.joinable()) return;
        post([this] {
            fwd.reset();
            be.reset();
        });
        wait();
        {
            std::lock_guard<std::mutex> lk(mu);
            quit = true;
        }
        cv.notify_all();
        thread.join();
    }
};

TpForward::~TpForward() {
    for (auto& r : ranks_) r->stop();
}

const backend::Backend& TpForward::rank_backend(int rank) const { return *ranks_[size_t(rank)]->be; }

size_t TpForward::device_bytes() const {
    size_t total = 0;
    for (const auto& r : ranks_) total += r->be->device_bytes();
    return total;
}

Result<std::unique_ptr<TpForward>> TpForward::create(const Model& model, std::shared_ptr<backend::CommGroup> group,
                                                     const MakeBackend& make_backend, int max_tokens, int n_slots,
                                                     int n_ctx, const LoadProgress& progress, int kv_pages) {
    if (!group) return Error{"tensor parallel: no communication group"};
    const int n_ranks = group->size();
    auto plan = plan_tensor_parallel(model.hp, model, n_ranks);
    if (!plan.ok()) return plan.error();
    std::unique_ptr<TpForward> tp(new TpForward());
    tp->plan_ = std::move(*plan);
    tp->n_vocab_ = model.output.rows;
    tp->max_tokens_ = max_tokens;
    tp->n_slots_ = n_slots;
    tp->n_ctx_ = n_ctx;
    tp->group_ = group;
    // Page ids are shared by every rank, so every pool has one size: fitting
    // each rank's free memory could give different ones.
    if (kv_pages == kKvPagesFit) kv_pages = 0;

    // Shards first (a plan that cannot be cut fails before any device is touched).
    size_t total_bytes = 0;
    for (int r = 0; r < n_ranks; ++r) {
        auto shard = shard_model(model, tp->plan_, r);
        if (!shard.ok()) return shard.error();
        auto rank = std::make_unique<Rank>();
        rank->model = std::move(*shard);
        total_bytes += model_bytes(rank->model);
        tp->ranks_.push_back(std::move(rank));
    }

    // Every rank loads at once, each on its own thread; progress sums them.
    std::mutex progress_mu;
    std::vector<size_t> done(size_t(n_ranks), 0);
    for (int r = 0; r < n_ranks; ++r) {
        Rank* rp = tp->ranks_[size_t(r)].get();
        rp->start();
        rp->post([=, &make_backend, &progress, &progress_mu, &done] {
            auto fail = [&](const std::string& why) { rp->status = Error{"tensor parallel rank " + str(r) + ": " + why}; };
            auto be = make_backend(r);
            if (!be.ok()) return fail(be.error().message);
            rp->be = std::move(*be);
            LoadProgress told;
            if (progress)
                told = [&, r](size_t d, size_t) {
                    std::lock_guard<std::mutex> lk(progress_mu);
                    done[size_t(r)] = d;
                    size_t sum = 0;
                    for (size_t v : done) sum += v;
                    progress(sum, total_bytes);
                };
            auto registered = register_model(rp->model, *rp->be, told);
            if (!registered.ok()) return fail(registered.error().message);
            rp->model = std::move(*registered);
            auto f = Forward::create(rp->model, *rp->be, max_tokens, n_slots, n_ctx, kv_pages);
            if (!f.ok()) return fail(f.error().message);
            rp->fwd = std::move(*f);
            rp->fwd->set_shard(true);  // a failed all-reduce surfaces at the pass's end, from take_error
        });
    }
    for (auto& r : tp->ranks_) r->wait();
    for (auto& r : tp->ranks_)
        if (!r->status.ok()) return Error{r->status.message()};
    return tp;
}

int TpForward::kv_page_size() const { return ranks_.front()->fwd->kv_page_size(); }
int TpForward::kv_pool_pages() const { return ranks_.front()->fwd->kv_pool_pages(); }

// Host-side tables only: no rank is running a pass between calls of run().
Status TpForward::map_kv_pages(int slot, const std::vector<int32_t>& pages) {
    for (auto& r : ranks_)
        if (Status s = r->fwd->map_kv_pages(slot, pages); !s.ok()) return s;
    return {};
}

Status TpForward::run(const Batch& batch, Logits& logits, Picks* picks) {
    if (picks && batch.pick_only.size() != batch.logits_for.size())
        return Error{"tensor parallel: the batch's pick flags differ in length from its logits rows"};
    group_->begin_pass();
    for (size_t r = 0; r < ranks_.size(); ++r) {
        Rank* rp = ranks_[r].get();
        rp->post([this, rp, r, &batch] {
            rp->status = rp->fwd->run(batch, rp->logits);
            if (!rp->status.ok()) group_->abandon(int(r));
        });
    }
    for (auto& r : ranks_) r->wait();
    for (auto& r : ranks_)
        if (!r->status.ok()) return r->status;

    // Gather: each rank's logits are its vocabulary columns of every wanted row.
    const size_t m = batch.logits_for.size();
    logits.resize(m * size_t(n_vocab_));  // the ranks' vocabulary ranges cover every column: no clearing
    for (size_t r = 0; r < ranks_.size(); ++r) {
        const TpRank& pr = plan_.ranks[r];
        const size_t width = size_t(pr.vocab_end - pr.vocab_begin);
        const Logits& part = ranks_[r]->logits;
        for (size_t t = 0; t < m; ++t)
            std::copy(part.begin() + int64_t(t * width), part.begin() + int64_t((t + 1) * width),
                      logits.begin() + int64_t(t * size_t(n_vocab_) + size_t(pr.vocab_begin)));
    }
    if (picks) {
        picks->assign(m, -1);
        for (size_t t = 0; t < m; ++t)
            if (batch.pick_only[t])
                (*picks)[t] = int32_t(backend::cpu::argmax_first(logits.data() + t * size_t(n_vocab_), n_vocab_));
    }
    return {};
}

double TpForward::last_issue_seconds() const {
    double most = 0;
    for (const auto& r : ranks_) most = std::max(most, r->fwd->last_issue_seconds());
    return most;
}

int TpForward::graph_tokens() const {
    int fewest = ranks_.empty() ? 0 : ranks_.front()->fwd->graph_tokens();
    for (const auto& r : ranks_) fewest = std::min(fewest, r->fwd->graph_tokens());
    return fewest;
}

uint64_t TpForward::graphs_captured() const {
    uint64_t most = 0;
    for (const auto& r : ranks_) most = std::max(most, r->fwd->graphs_captured());
    return most;
}

Result<std::unique_ptr<TpForward>> make_cpu_tensor_parallel(const Model& model, int n_ranks, int max_tokens,
                                                           int n_slots, int n_ctx, int threads_per_rank) {
    if (n_ranks < 1) return Error{"tensor parallel: " + str(n_ranks) + " ranks"};
    std::shared_ptr<backend::CommGroup> group = backend::make_host_group(n_ranks);
    return TpForward::create(
        model, group,
        [group, threads_per_rank](int rank) -> Result<std::unique_ptr<backend::Backend>> {
            return backend::make_cpu_backend(threads_per_rank, group, rank);
        },
        max_tokens, n_slots, n_ctx);
}

}  // namespace tern::model
