// Architecture families: what each adds to the common hyperparameters, which
// optional tensors its layers carry, and its layer's forward pass, built from
// the shared blocks of model/blocks.h. One short file per family
// (llama.cpp, gemma3.cpp, phi3.cpp); family.cpp lists them.
#pragma once

#include <string>
#include <string_view>

#include "base/result.h"
#include "gguf/gguf.h"
#include "model/blocks.h"
#include "model/model.h"

namespace tern::model {

// Tensors a family's layers must carry beyond the common ones; a missing
// one is an error naming it. Biases and q/k norms are also used where a
// file of another family carries them.
struct LayerTensors {
    bool qkv_bias = false;    // attn_{q,k,v}.bias
    bool qk_norm = false;     // attn_{q,k}_norm.weight
    bool post_norms = false;  // post_attention_norm.weight, post_ffw_norm.weight
    // attn_qkv.weight (q, k, v rows in turn) in place of attn_{q,k,v}, and
    // ffn_up.weight of 2 n_ff rows (gate, then up) in place of ffn_{gate,up}:
    // taken as views of their rows (phi3). Separate tensors are read where present.
    bool fused = false;
    // A mixture-of-experts FFN (ffn_gate_inp and ffn_{gate,up,down}_exps):
    // Never, when the file's expert_count is above 0 (llama: Mixtral), or Always.
    enum class Experts { Never, WhenCounted, Always } experts = Experts::Never;
};

struct Family {
    std::string_view arch;  // general.architecture
    LayerTensors tensors;
    // Reads what the family adds to the hyperparameters read_hparams filled
    // (the common ones, attn_scale at 1/sqrt(head_dim), rope.neox false).
    Status (*read_hparams)(const gguf::File& file, Hparams& hp);
    // One layer: x += the layer's blocks, as the family arranges them.
    void (*forward_layer)(const LayerPass& pass, const Layer& layer, int il);
};

// The llama layer (llama.cpp): x += attention(n(x)), then x += SwiGLU FFN(n(x)),
// the FFN a mixture of experts where the layer has them. Phi-3 runs it too.
void llama_layer(const LayerPass& pass, const Layer& layer, int il);

// The family of general.architecture `arch`, or null.
const Family* find_family(std::string_view arch);

// "llama, qwen2, ...": the architectures tern runs, for error messages.
std::string family_names();

// The families, one per file.
extern const Family kLlama, kQwen2, kQwen3, kQwen3Moe, kGemma3, kPhi3;

}  // namespace tern::model
