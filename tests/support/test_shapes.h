// The synthetic model shapes the whole-model tests share: "tiny" (the llama
// preset) and "qwen2" (q/k/v biases, NeoX RoPE, tied output, full multi-head
// attention, widths that K-quants can split).
#pragma once

#include <string>

#include "model/synth.h"

namespace tern::test {

inline model::SynthShape shape_named(const std::string& name) {
    model::SynthShape s = *model::synth_preset("tiny");
    if (name == "tiny") return s;
    s.preset = "custom";
    s.arch = "qwen2";
    s.n_embd = 256;
    s.n_head = 2;
    s.n_head_kv = 2;
    s.n_ff = 768;
    s.n_layer = 3;
    s.tied_output = true;
    s.tokenizer = model::SynthTokenizer::Gpt2Bpe;
    s.bpe_pre = "qwen2";
    return s;
}

}  // namespace tern::test
