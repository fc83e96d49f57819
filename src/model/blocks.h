// The blocks every family's layer is built from: attention over the KV cache,
// the gated feed-forward network and the mixture of experts, each a few
// backend calls. Norms are single backend calls the family file makes itself;
// a block either writes its result or adds it to the residual stream.
#pragma once

#include "backend/backend.h"
#include "model/model.h"

namespace tern::model {

// What a layer's blocks share in one forward call: the backend, the model's
// hyperparameters and the step's workspace (rows = the batch's tokens).
struct LayerPass {
    backend::Backend& be;
    const Hparams& hp;
    backend::RopeParams rope;  // hp.rope with the model's frequency factors, if any
    bool shard;                // a tensor-parallel shard: row-parallel outputs are summed over ranks
    backend::Tensor x;         // the residual stream
    backend::Tensor h;         // a block's input (a norm's output), and its output or scratch
    backend::Tensor q, k, v, att, gate, up;  // gate and up: room for n_expert_used rows per token
    backend::Tensor router;                  // a mixture of experts' router logits, per token
    backend::Tensor experts_out;             // and its experts' outputs, n_expert_used rows per token
};

// How a block leaves its result in `out`: written (in and out may then be
// the same tensor), or added to it, the residual stream (in is then the
// block's scratch after its last read of it, and must not be out). Added,
// the bits are those of writing the result to in and adding in to out.
enum class BlockOut { Write, Add };

// out = (or +=) Wo · attention(rope(Wq·in), rope(Wk·in), Wv·in) for layer il,
// with the layer's q/k biases and per-head q/k norms where it has them;
// attention over the last `window` positions of each sequence (0: all of them).
void attention_block(const LayerPass& p, const Layer& L, int il, backend::Tensor in,
                     const backend::RopeParams& rope, int window, backend::Tensor out,
                     BlockOut how = BlockOut::Write);

enum class GateActivation { Silu, Gelu };

// out = (or +=) W_down · (act(W_gate·in) * W_up·in).
void gated_ffn(const LayerPass& p, const Layer& L, backend::Tensor in, GateActivation act, backend::Tensor out,
               BlockOut how = BlockOut::Write);

// out = (or +=) the mixture of experts: the router picks hp.n_expert_used
// experts per token, each a SwiGLU FFN, and their outputs are summed with the
// router's weights (Backend::route_experts).
void moe_ffn(const LayerPass& p, const Layer& L, backend::Tensor in, backend::Tensor out,
             BlockOut how = BlockOut::Write);

}  // namespace tern::model
