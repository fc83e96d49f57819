// Synthetic models: GGUF files with the exact shapes, tensor names, metadata and
// tokenizer layout of real checkpoints (Llama 2/3, Qwen2/3 and Qwen3-MoE,
// Mixtral, Gemma 3, Phi-3, a tiny Llama), filled with seeded random weights. They let tests, benchmarks and the
// loader run on realistic files without downloading multi-gigabyte models.
// Weights are generated and quantized a tensor at a time and streamed to disk,
// so a 7B file never sits in memory.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "quant/mix.h"

namespace tern::model {

enum class SynthTokenizer {
    SentencePiece,  // tokenizer.ggml.model "llama": scored pieces with byte fallback
    Gpt2Bpe,        // tokenizer.ggml.model "gpt2": byte-level BPE with merges
};

struct SynthShape {
    std::string preset = "custom";  // a name of synth_preset_names()
    std::string arch = "llama";     // "llama", "qwen2" (q/k/v biases), "qwen3" (per-head q/k norms),
                                    // "qwen3moe" (qwen3 with a mixture of experts),
                                    // "gemma3" (q/k norms, post-norms, GELU, sliding-window layers) or
                                    // "phi3" (fused attn_qkv and gate/up, optional LongRoPE)
    int64_t n_vocab = 1024;
    int64_t n_embd = 256;
    int64_t n_layer = 2;
    int64_t n_head = 4;
    int64_t n_head_kv = 2;
    int64_t n_ff = 512;
    int64_t n_head_dim = 0;         // head size when it is not n_embd / n_head (gemma3), else 0
    int64_t sliding_window = 0;     // gemma3: positions a sliding-window layer attends to
    int64_t longrope_orig_ctx = 0;  // phi3: > 0 writes LongRoPE factors and this original context
    int64_t n_expert = 0;           // > 0: a mixture-of-experts FFN of this many experts, each n_ff wide
    int64_t n_expert_used = 0;      // (llama: Mixtral; qwen3moe) and the experts each token is routed to
    int64_t n_ctx = 512;
    float rope_base = 10000.0f;
    float rms_eps = 1e-5f;
    bool tied_output = false;       // true: no output.weight, token_embd doubles as output
    SynthTokenizer tokenizer = SynthTokenizer::SentencePiece;
    std::string bpe_pre;            // tokenizer.ggml.pre for BPE ("llama-bpe", "qwen2")

    int64_t head_dim() const { return n_head_dim > 0 ? n_head_dim : n_head > 0 ? n_embd / n_head : 0; }
    int64_t q_dim() const { return n_head * head_dim(); }
    int64_t kv_dim() const { return n_head_kv * head_dim(); }
    bool has_qkv_bias() const { return arch == "qwen2"; }
    bool has_qk_norm() const { return arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3"; }
    bool has_experts() const { return n_expert > 0; }
    bool has_post_norms() const { return arch == "gemma3"; }
    bool fused() const { return arch == "phi3"; }
};

// The named shapes; nullopt for unknown names.
std::optional<SynthShape> synth_preset(std::string_view name);
std::vector<std::string> synth_preset_names();

// Checks that the dimensions describe a model that can be built: positive and
// bounded sizes, heads dividing the width, an even head size (RoPE), a
// vocabulary large enough for the tokenizer's fixed tokens, a known arch.
Status check_synth_shape(const SynthShape& shape);

// How a tensor's values are drawn.
enum class SynthInit {
    Normal,   // N(0, 0.02): weight matrices and biases
    NearOne,  // 1 + N(0, 0.02): norm scales, LongRoPE's short factors
    NearFour, // 4 + N(0, 0.02): LongRoPE's long factors (real ones run from 1 to about 60)
};

struct SynthTensor {
    std::string name;
    std::vector<int64_t> ne;  // ne[0] is the row length
    SynthInit init = SynthInit::Normal;

    int64_t row_length() const { return ne[0]; }
    int64_t n_rows() const;
    int64_t n_elements() const;
};

// Tensors in file order, named as GGUF files of this architecture name them.
std::vector<SynthTensor> synth_tensors(const SynthShape& shape);

// Writes the values of rows [first_row, first_row + n_rows) of `tensor` to out.
// Each row has its own generator seeded from (seed, tensor name, row), so the
// numbers do not depend on how the rows are split between threads.
void synth_fill_rows(uint64_t seed, const SynthTensor& tensor, int64_t first_row, int64_t n_rows,
                     float* out);

// The tokenizer section of a synthetic model.
struct SynthVocab {
    std::string model;                // tokenizer.ggml.model: "llama" or "gpt2"
    std::string pre;                  // tokenizer.ggml.pre
    std::vector<std::string> tokens;  // exactly n_vocab, all distinct, valid UTF-8
    std::vector<float> scores;        // SentencePiece only
    std::vector<int32_t> token_types; // 1 normal, 2 unknown, 3 control, 5 unused, 6 byte
    std::vector<std::string> merges;  // BPE only: "left right", in rank order
    int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
    bool add_bos = false;
    std::string chat_template;        // empty: none written
};

// Builds the vocabulary for a shape (deterministic; it does not depend on the
// weight seed). Errors when n_vocab is too small for the tokenizer's fixed tokens.
Result<SynthVocab> synth_vocab(const SynthShape& shape);

// Token types as GGUF numbers them.
constexpr int32_t kTokenNormal = 1, kTokenUnknown = 2, kTokenControl = 3, kTokenUnused = 5,
                  kTokenByte = 6;

struct SynthOptions {
    SynthShape shape;
    quant::FileType ftype = quant::FileType::ALL_F32;
    uint64_t seed = 0;
    int n_threads = 1;
    // Called with (elements done, elements total) as tensors are generated;
    // calls come from worker threads but never two at once.
    std::function<void(uint64_t, uint64_t)> on_progress;
};

struct SynthSummary {
    uint64_t n_params = 0;
    uint64_t n_tensors = 0;
    uint64_t data_bytes = 0;  // tensor data written
};

// Generates the model and writes it to `path`.
Result<SynthSummary> write_synth_model(const std::string& path, const SynthOptions& options);

}  // namespace tern::model
