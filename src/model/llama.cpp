// The llama family: Llama 2/3, Mistral, SmolLM2, TinyLlama; Qwen2 (q/k/v
// biases, NeoX RoPE) and Qwen3 (per-head q/k RMSNorm before NeoX RoPE) have
// the same layer. Pre-norm attention and SwiGLU FFN, each added to x.
#include "model/family.h"

namespace tern::model {

void llama_layer(const LayerPass& p, const Layer& L, int il) {
    const float eps = p.hp.norm_eps;
    p.be.rms_norm(p.x, L.attn_norm, eps, p.h);
    attention_block(p, L, il, p.h, p.rope, /*window=*/0, p.h);
    p.be.add(p.x, p.h);
    p.be.rms_norm(p.x, L.ffn_norm, eps, p.h);
    gated_ffn(p, L, p.h, GateActivation::Silu, p.h);
    p.be.add(p.x, p.h);
}

namespace {

Status read_llama(const gguf::File&, Hparams&) { return {}; }

Status read_qwen(const gguf::File&, Hparams& hp) {
    hp.rope.neox = true;
    return {};
}

}  // namespace

const Family kLlama{"llama", {}, read_llama, llama_layer};
const Family kQwen2{"qwen2", {.qkv_bias = true}, read_qwen, llama_layer};
const Family kQwen3{"qwen3", {.qk_norm = true}, read_qwen, llama_layer};

}  // namespace tern::model
