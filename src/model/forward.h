// The forward pass, written once against the backend interface: embedding,
// each layer as its family arranges the shared blocks (model/family.h; the
// llama family: RMSNorm -> Q/K/V (+bias) -> RoPE -> KV store -> grouped-query
// attention -> output projection -> residual, RMSNorm -> SwiGLU FFN ->
// residual), final RMSNorm and the output head for the tokens that ask for
// logits.
//
// The same pass runs one shard of a tensor-parallel model (model/tensor_parallel.h):
// the Model it is given then holds its share of heads, FFN columns and vocabulary
// rows, and the backend's all_reduce_sum adds the shards' partial outputs of the
// row-parallel matmuls (wo, w_down) before each residual add.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/host_memory.h"
#include "base/result.h"
#include "model/model.h"

namespace tern::model {

struct Family;

// Tokens of one forward call, possibly from several sequences.
struct Batch {
    std::vector<int32_t> tokens;
    std::vector<int32_t> pos;          // position of each token in its sequence
    std::vector<int32_t> slot;         // KV-cache slot (sequence) of each token
    std::vector<int32_t> logits_for;   // indices into tokens whose logits are wanted
    // Per logits_for entry: 1 where only the row's greedy pick is wanted
    // (Pass::run's picks), not the row itself.
    std::vector<uint8_t> pick_only;

    // want_logits: the token's logits row is wanted; pick_only (with it): only
    // its greedy pick.
    void add(int32_t token, int32_t position, int32_t kv_slot, bool want_logits, bool only_pick = false) {
        if (want_logits) {
            logits_for.push_back(int32_t(tokens.size()));
            pick_only.push_back(only_pick ? 1 : 0);
        }
        tokens.push_back(token);
        pos.push_back(position);
        slot.push_back(kv_slot);
    }
    size_t size() const { return tokens.size(); }
};

// A step's logits rows, in host memory a GPU's copy lands in directly
// (backend/host_memory.h).
using Logits = backend::HostVector<float>;

constexpr int kKvPagesFit = -1;
constexpr size_t kKvReserveBytes = size_t(1) << 30;  // for CUDA graphs, libraries, the attention workspace

// What the runtime drives: a forward pass over one backend (Forward) or over
// the ranks of a tensor-parallel model (TpForward, model/tensor_parallel.h).
class Pass {
public:
    virtual ~Pass() = default;
    // Greedy picks, one per logits_for entry (Batch::pick_only).
    using Picks = std::vector<int32_t>;

    // Runs the batch; on success `logits` holds logits_for.size() rows of
    // n_vocab (the output head's rows). With `picks`, a row marked pick_only
    // may be left unwritten: (*picks)[j] is then its greedy pick, the first
    // index of its largest logit, NaN read as -inf, -1 when none is above
    // -inf (cpu::argmax_first of the row); the other entries are unspecified.
    // Without, every row is written.
    virtual Status run(const Batch& batch, Logits& logits, Picks* picks) = 0;
    Status run(const Batch& batch, Logits& logits) { return run(batch, logits, nullptr); }
    virtual int max_tokens() const = 0;
    virtual int n_slots() const = 0;
    virtual int n_ctx() const = 0;
    // The KV cache: a pool of kv_pool_pages() pages of kv_page_size()
    // positions (backend.h). map_kv_pages gives a slot its pages
    // (Backend::map_kv_pages on every backend of the pass); run() refuses a
    // token whose position lies past its slot's mapped pages. A pool that
    // holds every slot's whole context starts with each slot mapped to pages
    // of its own.
    virtual int kv_page_size() const = 0;
    virtual int kv_pool_pages() const = 0;
    virtual Status map_kv_pages(int slot, const std::vector<int32_t>& pages) = 0;
    // Device memory the pass's backends hold (weights, KV cache, workspace); 0 on the CPU.
    virtual size_t device_bytes() const = 0;
    // Seconds the last run that got past its checks spent on the host before
    // it first waited for the backend's results: on a GPU, issuing the step's work (or
    // replaying its graph) and the host's own parts of it, such as the
    // embedding rows; on the CPU, where operations run as they are issued,
    // the whole run. A GPU step whose issue time nears its run time is bound
    // by the host, not the device.
    virtual double last_issue_seconds() const = 0;
    // Steps of up to this many tokens are captured as graphs on their second
    // run (Backend::graph_tokens; 0: none are), a graph for each token count
    // and kind of step (a token from each sequence, or not) of those that
    // want logits; and how many steps have been captured so far.
    virtual int graph_tokens() const = 0;
    virtual uint64_t graphs_captured() const = 0;
};

class Forward final : public Pass {
public:
    // Allocates the workspace for batches of up to max_tokens tokens and the
    // backend's KV cache for n_slots sequences of up to n_ctx positions each:
    // a pool of kv_pages pages; 0: every slot's whole context; kKvPagesFit:
    // every slot's whole context if the backend's free memory holds it with
    // kKvReserveBytes to spare, else as many pages as that leaves room for (at
    // least one whole context: less is an error).
    static Result<std::unique_ptr<Forward>> create(const Model& model, backend::Backend& be, int max_tokens,
                                                   int n_slots, int n_ctx, int kv_pages = 0);

    // KV-cache shape for n_slots sequences of n_ctx positions each, in a pool
    // of kv_pages pages (0: every slot's whole context).
    static backend::KvCacheShape kv_shape(const Model& model, int n_slots, int n_ctx, int kv_pages = 0);

    // Runs the batch; on success `logits` holds logits_for.size() rows of the
    // output head's rows (n_vocab; a tensor-parallel shard: its vocabulary rows),
    // and picks as Pass::run says: the backend's argmax_rows, with no copy of
    // a piece of the head whose rows all want only their pick.
    using Pass::run;
    Status run(const Batch& batch, Logits& logits, Picks* picks) override;

    // Makes this pass one shard of a tensor-parallel model: the partial
    // outputs of wo and w_down go through the backend's all_reduce_sum (its
    // group's ranks must run the same batches). Off: a whole model.
    void set_shard(bool shard) { shard_ = shard; }

    int max_tokens() const override { return max_tokens_; }
    int n_slots() const override { return kv_.n_slots; }
    int n_ctx() const override { return kv_.n_ctx; }
    int kv_page_size() const override { return kv_.page_size; }
    int kv_pool_pages() const override { return kv_.pool_pages(); }
    Status map_kv_pages(int slot, const std::vector<int32_t>& pages) override;
    size_t device_bytes() const override { return be_.device_bytes(); }
    double last_issue_seconds() const override { return issue_seconds_; }
    int graph_tokens() const override { return be_.graph_tokens(); }
    uint64_t graphs_captured() const override { return be_.graphs_captured(); }

    // The output head runs on at most this many rows at a time, so its
    // workspace stays near kLogitsBytes whatever the vocabulary (Gemma 3's
    // 262,144 entries times a 512-token batch would be 512 MiB), and never
    // fewer than kLogitsMinRows: a step of up to 64 decoding sequences is one
    // piece.
    static constexpr size_t kLogitsBytes = size_t(64) << 20;
    static constexpr int64_t kLogitsMinRows = 64;
    static int64_t logits_rows(int64_t n_vocab, int64_t max_tokens);

private:
    Forward(const Model& m, backend::Backend& be, const Family& family, int max_tokens)
        : m_(m), be_(be), family_(&family), max_tokens_(max_tokens) {}
    const Model& m_;
    backend::Backend& be_;
    const Family* family_;
    int max_tokens_;
    int64_t logits_rows_ = 0;  // rows of one piece of the output head (logits_rows)
    backend::KvCacheShape kv_;
    std::vector<int> mapped_pages_;  // per slot: its first pages that are mapped
    bool shard_ = false;
    double issue_seconds_ = 0;  // of the last run (Pass::last_issue_seconds)
    backend::Tensor x_, h_, q_, k_, v_, att_, gate_, up_, sel_, logits_;
    backend::Tensor router_, experts_out_;  // mixtures of experts only
};

}  // namespace tern::model
