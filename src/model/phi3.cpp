// Phi-3: the llama layer (family.h: pre-norm attention and SwiGLU FFN), NeoX RoPE,
// with q, k and v in one tensor and gate and up in another, read as views of their
// rows (family.h: LayerTensors::fused), and LongRoPE: per-frequency divisors
// chosen by the context length (model.h: rope_factors) and the attention
// factor scaling cos and sin. Its sliding-window metadata is not used, as
// llama.cpp does not use it: the published conversions do not say which
// layers slide.
#include "model/family.h"

namespace tern::model {
namespace {

Status read_phi3(const gguf::File&, Hparams& hp) {
    hp.rope.neox = true;
    return {};
}

}  // namespace

const Family kPhi3{"phi3", {.fused = true}, read_phi3, llama_layer};

}  // namespace tern::model
