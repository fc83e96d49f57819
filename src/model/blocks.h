// The blocks every family's layer is built from: attention over the KV cache
// and the gated feed-forward network, each a few backend calls. Norms and
// residual adds are single backend calls the family file makes itself.
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
    backend::Tensor h;         // a block's input and output
    backend::Tensor q, k, v, att, gate, up;
};

// out = Wo · attention(rope(Wq·in), rope(Wk·in), Wv·in) for layer il, with
// the layer's q/k biases and per-head q/k norms where it has them; attention
// over the last `window` positions of each sequence (0: all of them). in and
// out may be the same tensor.
void attention_block(const LayerPass& p, const Layer& L, int il, backend::Tensor in,
                     const backend::RopeParams& rope, int window, backend::Tensor out);

enum class GateActivation { Silu, Gelu };

// out = W_down · (act(W_gate·in) * W_up·in). in and out may be the same tensor.
void gated_ffn(const LayerPass& p, const Layer& L, backend::Tensor in, GateActivation act, backend::Tensor out);

}  // namespace tern::model
