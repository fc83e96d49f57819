// The llama family: Llama 2/3, Mistral, SmolLM2, TinyLlama, and Mixtral (a
// llama whose FFN is a mixture of experts); Qwen2 (q/k/v biases, NeoX RoPE),
// Qwen3 (per-head q/k RMSNorm before NeoX RoPE) and Qwen3-MoE (Qwen3 with a
// mixture of experts) have the same layer. Pre-norm attention and SwiGLU FFN,
// each added to x.
#include <algorithm>
#include <string>

#include "model/family.h"

namespace tern::model {

void llama_layer(const LayerPass& p, const Layer& L, int il) {
    const float eps = p.hp.norm_eps;
    p.be.rms_norm(p.x, L.attn_norm, eps, p.h);
    attention_block(p, L, il, p.h, p.rope, /*window=*/0, p.x, BlockOut::Add);
    p.be.rms_norm(p.x, L.ffn_norm, eps, p.h);
    if (L.has_experts())
        moe_ffn(p, L, p.h, p.x, BlockOut::Add);
    else
        gated_ffn(p, L, p.h, GateActivation::Silu, p.x, BlockOut::Add);
}

namespace {

Status read_llama(const gguf::File&, Hparams&) { return {}; }

Status read_qwen(const gguf::File&, Hparams& hp) {
    hp.rope.neox = true;
    return {};
}

// Qwen3-MoE: each expert's width is expert_feed_forward_length (else, as
// llama.cpp reads it, feed_forward_length / expert_used_count).
Status read_qwen3moe(const gguf::File& f, Hparams& hp) {
    hp.rope.neox = true;
    if (auto v = f.get_int("qwen3moe.expert_feed_forward_length")) {
        if (*v < 1 || *v > (1 << 24))
            return Error{f.path() + ": metadata 'qwen3moe.expert_feed_forward_length' = " + std::to_string(*v) +
                         " is out of range"};
        hp.n_ff = int(*v);
    } else {
        hp.n_ff = std::max(1, hp.n_ff / std::max(1, hp.n_expert_used));
    }
    return {};
}

}  // namespace

const Family kLlama{"llama", {.experts = LayerTensors::Experts::WhenCounted}, read_llama, llama_layer};
const Family kQwen2{"qwen2", {.qkv_bias = true}, read_qwen, llama_layer};
const Family kQwen3{"qwen3", {.qk_norm = true}, read_qwen, llama_layer};
const Family kQwen3Moe{"qwen3moe", {.qk_norm = true, .experts = LayerTensors::Experts::Always}, read_qwen3moe,
                       llama_layer};

}  // namespace tern::model
