// Tensor parallelism for the llama family: how a model's weights divide over
// N ranks (devices), the per-rank weight views, and a "virtual" tensor-parallel
// forward that runs the N shards on CPU backends and must equal the unsharded
// forward pass. It is the arithmetic a multi-GPU build runs, checkable without
// GPUs; docs/tensor-parallel.md describes the layout and where the reductions go.
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

// Tensor parallelism simulated on the CPU: one CPU backend, KV cache and
// Forward per rank, run on one thread per rank. Each rank's Forward runs the
// whole pass; its reduce hook is a rendezvous where every rank deposits its
// partial, then each sums all N in rank order (so every rank gets the same
// bits, whatever the thread timing) and continues. That is the structure a
// multi-GPU build keeps, with an NCCL all-reduce in the hook. The embedding is
// replicated here; a multi-GPU build could split it by vocabulary and all-reduce.
// The model's weights must be readable through their host pointers (loaded
// with a CPU backend).
class VirtualTpForward {
public:
    static Result<std::unique_ptr<VirtualTpForward>> create(const Model& model, int n_ranks, int max_tokens,
                                                            int n_slots, int n_ctx, int threads_per_rank = 1);
    ~VirtualTpForward();

    // As Forward::run: logits_for.size() rows of n_vocab, the ranks' vocabulary
    // slices gathered in rank order.
    Status run(const Batch& batch, std::vector<float>& logits);

    const TpPlan& plan() const { return plan_; }

private:
    VirtualTpForward() = default;
    struct Rank;
    struct Rendezvous;
    Status reduce(int rank, backend::Tensor partial);

    TpPlan plan_;
    int64_t n_vocab_ = 0;
    std::vector<std::unique_ptr<Rank>> ranks_;
    std::unique_ptr<Rendezvous> meet_;
};

}  // namespace tern::model
