// The synthetic model shapes the whole-model tests share: "tiny" (the llama
// preset), "qwen2" (q/k/v biases, NeoX RoPE, tied output, full multi-head
// attention, widths that K-quants can split), "qwen3" (per-head q/k norms,
// NeoX RoPE, grouped-query attention, head dim 128) and "gemma3" (six layers:
// five with a sliding window of 5 positions and one global, head dim 128 on
// a 256-wide model, post-norms, GELU FFN, scaled embeddings, tied output),
// "phi3", and the mixtures of experts "qwen3moe" and "mixtral" (moe_shape).
// write_temp_model writes one of them to the temporary directory.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "base/result.h"
#include "model/synth.h"

namespace tern::test {

// A two-layer llama with a 1024-token vocabulary and the given widths (the
// tensor-parallel tests pick widths that divide over their ranks).
inline model::SynthShape llama_shape(int64_t n_embd, int64_t n_head, int64_t n_head_kv, int64_t n_ff) {
    model::SynthShape s = *model::synth_preset("tiny");
    s.preset = "custom";
    s.n_embd = n_embd;
    s.n_head = n_head;
    s.n_head_kv = n_head_kv;
    s.n_ff = n_ff;
    s.n_layer = 2;
    s.n_vocab = 1024;
    return s;
}

// The shape as a Qwen architecture ("qwen2" or "qwen3"), with Qwen's
// byte-level BPE vocabulary.
inline model::SynthShape as_qwen(model::SynthShape s, const std::string& arch) {
    s.arch = arch;
    s.tokenizer = model::SynthTokenizer::Gpt2Bpe;
    s.bpe_pre = "qwen2";
    return s;
}

// A small gemma3 with the given widths: six layers, so that both kinds of
// layer run, and a sliding window of 5 positions.
inline model::SynthShape gemma3_shape(int64_t n_embd, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                                      int64_t n_ff) {
    model::SynthShape s = llama_shape(n_embd, n_head, n_head_kv, n_ff);
    s.arch = "gemma3";
    s.n_layer = 6;
    s.n_head_dim = head_dim;
    s.sliding_window = 5;
    s.tied_output = true;
    s.rms_eps = 1e-6f;
    return s;
}

// A small phi3 (fused attn_qkv and gate/up, NeoX RoPE) with LongRoPE factors
// for an original context of 32 positions: caches longer than that use the
// long factors.
inline model::SynthShape phi3_shape(int64_t n_embd, int64_t n_head, int64_t n_head_kv, int64_t n_ff) {
    model::SynthShape s = llama_shape(n_embd, n_head, n_head_kv, n_ff);
    s.arch = "phi3";
    s.longrope_orig_ctx = 32;
    return s;
}

// A small mixture of experts: qwen3moe (8 experts, 3 routed per token: k
// neither a power of two nor 1) or a llama with experts (Mixtral's layout, 4
// experts, 2 routed), each expert 256 wide.
inline model::SynthShape moe_shape(const std::string& arch) {
    model::SynthShape s = arch == "qwen3moe" ? as_qwen(llama_shape(256, 2, 1, 256), "qwen3moe")
                                             : llama_shape(256, 4, 2, 256);
    s.n_expert = arch == "qwen3moe" ? 8 : 4;
    s.n_expert_used = arch == "qwen3moe" ? 3 : 2;
    return s;
}

inline model::SynthShape shape_named(const std::string& name) {
    model::SynthShape s = *model::synth_preset("tiny");
    if (name == "tiny") return s;
    if (name == "qwen3moe") return moe_shape("qwen3moe");
    if (name == "mixtral") return moe_shape("llama");
    if (name == "phi3") return phi3_shape(256, 4, 4, 512);
    if (name == "gemma3") return gemma3_shape(256, 2, 1, 128, 512);
    // per-head q/k norms, NeoX RoPE, GQA, head dim 128, separate output
    if (name == "qwen3") return as_qwen(llama_shape(256, 2, 1, 512), "qwen3");
    s = as_qwen(llama_shape(256, 2, 2, 768), "qwen2");
    s.n_layer = 3;
    s.tied_output = true;
    return s;
}

// A small qwen2 (q/k/v biases, NeoX RoPE, tied output) whose 2 KV heads and
// widths divide over two ranks.
inline model::SynthShape qwen2_tied_shape() {
    model::SynthShape s = as_qwen(llama_shape(256, 4, 2, 512), "qwen2");
    s.tied_output = true;
    return s;
}

// A small qwen3 (per-head q/k norms, NeoX RoPE, head dim 64) whose 4 KV heads
// divide over two and four ranks.
inline model::SynthShape qwen3_shape() { return as_qwen(llama_shape(512, 8, 4, 1024), "qwen3"); }

// Writes a synthetic model to the temporary directory as
// tern-<tag>-<process id>.gguf: its path, or why it could not be written.
inline Result<std::string> write_temp_model(const std::string& tag, const model::SynthOptions& o) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("tern-" + tag + "-" + std::to_string(::getpid()) + ".gguf")).string();
    auto written = model::write_synth_model(path, o);
    if (!written.ok()) return written.error();
    return path;
}

}  // namespace tern::test
