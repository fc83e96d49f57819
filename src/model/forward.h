// The llama-family forward pass, written once against the backend interface:
// embedding, then per layer RMSNorm -> Q/K/V (+bias) -> RoPE -> KV store ->
// grouped-query attention -> output projection -> residual, RMSNorm -> SwiGLU
// FFN -> residual; final RMSNorm and the output head for the tokens that ask
// for logits.
//
// The same pass runs one shard of a tensor-parallel model (model/tensor_parallel.h):
// the Model it is given then holds its share of heads, FFN columns and vocabulary
// rows, and a reduce hook sums the partial outputs of the row-parallel matmuls
// (wo, w_down) across shards before each residual add.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "base/result.h"
#include "model/model.h"

namespace tern::model {

// Tokens of one forward call, possibly from several sequences.
struct Batch {
    std::vector<int32_t> tokens;
    std::vector<int32_t> pos;          // position of each token in its sequence
    std::vector<int32_t> slot;         // KV-cache slot (sequence) of each token
    std::vector<int32_t> logits_for;   // indices into tokens whose logits are wanted

    void add(int32_t token, int32_t position, int32_t kv_slot, bool want_logits) {
        if (want_logits) logits_for.push_back(int32_t(tokens.size()));
        tokens.push_back(token);
        pos.push_back(position);
        slot.push_back(kv_slot);
    }
    size_t size() const { return tokens.size(); }
};

// Where a row-parallel matmul's partial output waits for the other shards.
enum class ReducePoint {
    AttentionOutput,  // Wo · attn, before x += it
    FfnOutput,        // W_down · swiglu, before x += it
};

// Given the shard's partial output (tokens x n_embd, in the backend's memory),
// must leave in it the sum of every shard's partial, the same on each shard.
// A failed status ends the forward call with that status.
using ReduceHook = std::function<Status(ReducePoint point, int layer, backend::Tensor partial)>;

// What the runtime drives: a forward pass over one backend (Forward) or over
// the ranks of a tensor-parallel model (TpForward, model/tensor_parallel.h).
class Pass {
public:
    virtual ~Pass() = default;
    // Runs the batch; on success `logits` holds logits_for.size() rows of
    // n_vocab (the output head's rows).
    virtual Status run(const Batch& batch, std::vector<float>& logits) = 0;
    virtual int max_tokens() const = 0;
    virtual int n_slots() const = 0;
    virtual int n_ctx() const = 0;
};

class Forward final : public Pass {
public:
    // Allocates the workspace for batches of up to max_tokens tokens and the
    // backend's KV cache for n_slots sequences of n_ctx positions each.
    static Result<std::unique_ptr<Forward>> create(const Model& model, backend::Backend& be, int max_tokens,
                                                   int n_slots, int n_ctx);

    // KV-cache shape for n_slots sequences of n_ctx positions each.
    static backend::KvCacheShape kv_shape(const Model& model, int n_slots, int n_ctx);

    // Runs the batch; on success `logits` holds logits_for.size() rows of the
    // output head's rows (n_vocab; a tensor-parallel shard: its vocabulary rows).
    Status run(const Batch& batch, std::vector<float>& logits) override;

    // Makes this pass one shard of a tensor-parallel model (empty: a whole model).
    void set_reduce_hook(ReduceHook hook) { reduce_ = std::move(hook); }

    int max_tokens() const override { return max_tokens_; }
    int n_slots() const override { return kv_.n_slots; }
    int n_ctx() const override { return kv_.n_ctx; }

private:
    Forward(const Model& m, backend::Backend& be, int max_tokens) : m_(m), be_(be), max_tokens_(max_tokens) {}
    const Model& m_;
    backend::Backend& be_;
    int max_tokens_;
    backend::KvCacheShape kv_;
    ReduceHook reduce_;
    backend::Tensor x_, h_, q_, k_, v_, att_, gate_, up_, sel_, logits_;
};

}  // namespace tern::model
