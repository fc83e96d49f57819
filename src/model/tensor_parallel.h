// Tensor parallelism for the llama family: how a model's weights divide over
// N ranks (devices), the per-rank weight views, and the forward pass that runs
// the N shards, on GPUs joined by NCCL or on CPU backends (where it must equal
// the unsharded pass within rounding); docs/tensor-parallel.md describes the
// layout and where the reductions go.
//
// Megatron-style split: per layer, the attention heads are divided by KV head
// (each rank keeps whole GQA groups, so its KV cache holds only its heads) and
// the FFN by intermediate column. Wq/Wk/Wv and W_gate/W_up are column-parallel
// (a rank computes a range of their output rows); Wo and W_down are
// row-parallel (a rank reads a range of their input columns and produces a
// partial sum over the full width, which the ranks add: the all-reduce). The
// output head is split by vocabulary rows and the logits gathered.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "base/result.h"
#include "model/forward.h"
#include "model/model.h"

namespace tern::model {

// What one rank owns; every range is [begin, end).
struct TpRank {
    int kv_head_begin = 0, kv_head_end = 0;  // KV heads; query heads follow, `group` per KV head
    int64_t ff_begin = 0, ff_end = 0;        // FFN intermediate columns
    int64_t vocab_begin = 0, vocab_end = 0;  // rows of the output head
};

struct TpPlan {
    int n_ranks = 0;
    int group = 0;         // query heads per KV head (n_head / n_head_kv)
    int64_t ff_align = 1;  // FFN split points are multiples of this (block size of every W_down)
    std::vector<TpRank> ranks;
};

// Divides the model over n_ranks. KV heads: n_head_kv / n_ranks each (must
// divide evenly). FFN columns and vocabulary rows: as even as the block
// boundaries allow. A split point along a matrix's input dimension (Wo's head
// columns, W_down's FFN columns) must fall on a quantization block boundary of
// that matrix in every layer (256 elements for K-quants, 32 for the legacy
// types, anywhere for float types); splits along output rows can fall anywhere.
// Errors name the numbers that do not divide.
Result<TpPlan> plan_tensor_parallel(const Hparams& hp, const Model& model, int n_ranks);

// Views into a weight's bytes, nothing copied. Rows [r0, r1): the column-parallel
// slice (host moves by whole rows). Input columns [c0, c1) of every row: the
// row-parallel slice (host moves by whole blocks, the row stride stays the full
// row's bytes); c0 and c1 must be block aligned. A view keeps only the host
// pointer: a backend that holds its own copy (impl) registers the shard itself.
Result<backend::Weight> weight_rows(const backend::Weight& w, int64_t r0, int64_t r1);
Result<backend::Weight> weight_cols(const backend::Weight& w, int64_t c0, int64_t c1);

// The model as rank `rank` sees it: hp.n_head, n_head_kv and n_ff count the
// rank's share (head_dim, n_embd and n_vocab stay whole: token ids index the
// replicated embedding), weights are views of `model`'s (biases shard with
// their rows, norms and the embedding are shared), and output holds the rank's
// vocabulary rows. `model` must outlive the result.
Result<Model> shard_model(const Model& model, const TpPlan& plan, int rank);

// A tensor-parallel model: per rank a backend, its shard's weights registered
// there, a KV cache of its heads and a Forward, all driven by one host thread
// per rank (a GPU backend's device is bound to the thread that made it). Each
// rank runs the whole pass; after each row-parallel matmul its backend's
// all_reduce_sum adds the ranks' partials (an NCCL all-reduce between GPUs,
// a rendezvous between CPU ranks), so every rank's copy of the residual
// stream stays the same. The logits are gathered from the ranks' vocabulary
// slices in rank order. The embedding table is read on the host by every rank.
class TpForward final : public Pass {
public:
    // Makes rank r's backend, in `group` (called on the rank's thread).
    using MakeBackend = std::function<Result<std::unique_ptr<backend::Backend>>(int rank)>;

    // `model` as describe_model() gives it (or loaded with a backend that
    // leaves the host bytes readable); it must outlive the TpForward.
    // `progress` is told the bytes registered over all ranks.
    static Result<std::unique_ptr<TpForward>> create(const Model& model, std::shared_ptr<backend::CommGroup> group,
                                                     const MakeBackend& make_backend, int max_tokens, int n_slots,
                                                     int n_ctx, const LoadProgress& progress = {}, int kv_pages = 0);
    ~TpForward() override;

    // As Forward::run: logits_for.size() rows of n_vocab, gathered from the
    // ranks' vocabulary ranges; the picks are taken from the gathered rows.
    using Pass::run;
    Status run(const Batch& batch, Logits& logits, Picks* picks) override;
    int max_tokens() const override { return max_tokens_; }
    int n_slots() const override { return n_slots_; }
    int n_ctx() const override { return n_ctx_; }
    int kv_page_size() const override;
    int kv_pool_pages() const override;
    // On every rank (each holds its heads' share of every page).
    Status map_kv_pages(int slot, const std::vector<int32_t>& pages) override;

    const TpPlan& plan() const { return plan_; }
    int n_ranks() const { return plan_.n_ranks; }
    const backend::Backend& rank_backend(int rank) const;
    size_t device_bytes() const override;  // over every rank
    double last_issue_seconds() const override;  // the longest rank's
    int graph_tokens() const override;     // the fewest of a rank
    uint64_t graphs_captured() const override;    // the most of a rank

private:
    TpForward() = default;
    struct Rank;

    TpPlan plan_;
    int64_t n_vocab_ = 0;
    int max_tokens_ = 0, n_slots_ = 0, n_ctx_ = 0;
    std::shared_ptr<backend::CommGroup> group_;
    std::vector<std::unique_ptr<Rank>> ranks_;
};

// Tensor parallelism simulated on the CPU: n_ranks CPU backends in a host
// group, threads_per_rank OpenMP threads each. It is the arithmetic a
// multi-GPU run does, checkable without GPUs. `model` is a described model
// (describe_model), whose weights view the file's rows: a registered one may
// hold a backend's own layout, which the ranks' views refuse.
Result<std::unique_ptr<TpForward>> make_cpu_tensor_parallel(const Model& model, int n_ranks, int max_tokens,
                                                           int n_slots, int n_ctx, int threads_per_rank = 1);

}  // namespace tern::model
