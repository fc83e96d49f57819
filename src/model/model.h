// A loaded model: hyperparameters read from GGUF metadata and the weights of
// each layer, registered with a backend. One struct serves every family
// (model/family.h: the llama family with Qwen2, Qwen3 and their mixtures of
// experts, Gemma 3, Phi-3); a layer
// holds the tensors its family uses and leaves the others empty. The forward
// pass is in forward.cpp, each family's layer in its own file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/result.h"
#include "gguf/gguf.h"

namespace tern::model {

struct Hparams {
    std::string arch;         // general.architecture: "llama", "qwen2", ...
    int n_vocab = 0;
    int n_embd = 0;
    int n_layer = 0;
    int n_head = 0;
    int n_head_kv = 0;
    int head_dim = 0;         // n_embd / n_head unless the file says otherwise
    int n_ff = 0;             // the FFN's width (a mixture of experts: each expert's)
    int n_expert = 0;         // experts of a mixture-of-experts FFN (0: a dense FFN)
    int n_expert_used = 0;    // experts each token is routed to
    int n_ctx_train = 0;
    float norm_eps = 1e-5f;
    float attn_scale = 0.0f;   // scores = q·k * attn_scale (1/sqrt(head_dim) unless the family says otherwise)
    backend::RopeParams rope;  // freq_factors left null: the forward pass points it at the model's factors
    int rope_orig_ctx = 0;     // LongRoPE: contexts longer than this use rope_factors_long (else _short)
    float embd_scale = 0.0f;   // embedding rows multiplied by this (gemma3: sqrt(n_embd)); 0: not scaled
    // Sliding-window attention (gemma3): layers il with sliding[il] set attend to
    // the last swa_window positions, with RoPE rope_swa. swa_window 0: none.
    int swa_window = 0;
    std::vector<uint8_t> sliding;  // per layer, 1: a sliding-window layer (empty: none)
    backend::RopeParams rope_swa;
    bool slides(int il) const { return swa_window > 0 && size_t(il) < sliding.size() && sliding[size_t(il)]; }
};

struct Layer {
    backend::Weight attn_norm;    // [n_embd]
    backend::Weight wq;           // (n_embd -> n_head*head_dim)
    backend::Weight wk;           // (n_embd -> n_head_kv*head_dim)
    backend::Weight wv;           // (n_embd -> n_head_kv*head_dim)
    backend::Weight bq, bk, bv;   // optional biases (qwen2)
    backend::Weight q_norm;       // [head_dim] RMSNorm of each query head before RoPE (qwen3), or empty
    backend::Weight k_norm;       // [head_dim] the same for each key head
    backend::Weight wo;           // (n_head*head_dim -> n_embd)
    backend::Weight post_attn_norm;  // [n_embd] RMSNorm of the attention output before its add (gemma3), or empty
    backend::Weight ffn_norm;     // [n_embd]
    backend::Weight w_gate;       // (n_embd -> n_ff)
    backend::Weight w_up;         // (n_embd -> n_ff)
    backend::Weight w_down;       // (n_ff -> n_embd)
    backend::Weight post_ffn_norm;  // [n_embd] RMSNorm of the FFN output before its add (gemma3), or empty
    // A mixture-of-experts FFN in place of w_gate/w_up/w_down (Mixtral, Qwen3-MoE):
    // the router and each expert's matrices, views of the file's stacked
    // ffn_{gate,up,down}_exps tensors (empty for a dense FFN).
    backend::Weight ffn_router;   // ffn_gate_inp (n_embd -> n_expert)
    std::vector<backend::Weight> gate_exps, up_exps;  // per expert (n_embd -> n_ff)
    std::vector<backend::Weight> down_exps;           // per expert (n_ff -> n_embd)
    bool has_experts() const { return bool(ffn_router); }
};

struct Model {
    Hparams hp;
    backend::Weight token_embd;   // (n_vocab rows of n_embd)
    backend::Weight output_norm;  // [n_embd]
    backend::Weight output;       // (n_embd -> n_vocab); the embedding table when tied
    backend::Weight rope_freqs;   // optional [n_rot/2] frequency divisors (llama3)
    backend::Weight rope_long;    // optional [n_rot/2] LongRoPE divisors for contexts past rope_orig_ctx (phi3)
    backend::Weight rope_short;   // optional [n_rot/2] LongRoPE divisors for the others
    std::vector<Layer> layers;
};

// Architectures tern runs (model/family.h).
bool architecture_supported(const std::string& arch);

// Reads hyperparameters and checks every expected tensor's presence, type and
// shape, without touching a backend.
Result<Hparams> read_hparams(const gguf::File& file);

// Told after each weight is registered: bytes of tensor data registered so
// far and in all (done_bytes == total_bytes after the last one).
using LoadProgress = std::function<void(size_t done_bytes, size_t total_bytes)>;

// Checks every tensor's presence, type and shape and describes each weight
// (backend::describe_weight): a Model whose weights point into the file and
// belong to no backend yet. A tied output head is the embedding table. The
// file must outlive the model.
Result<Model> describe_model(const gguf::File& file);

// Bytes of weight data register_model() will hand to a backend (a tied output
// head counted once).
size_t model_bytes(const Model& described);

// The frequency divisors RoPE uses with a cache of n_ctx positions:
// rope_freqs, else LongRoPE's long or short factors, else none (null).
const backend::Weight* rope_factors(const Model& m, int n_ctx);

// Registers every weight of a described model (or of a tensor-parallel shard
// of one) with the backend, calling `progress` (if given) after each. With
// `source`, the file the described weights map: where the backend copied a
// matrix (its registered bytes are elsewhere), the file's pages of it are let
// go as it goes (gguf::File::release_pages), so a model is not held twice.
Result<Model> register_model(const Model& described, backend::Backend& be, const LoadProgress& progress = {},
                             const gguf::File* source = nullptr);

// describe_model, then register_model: a bad file fails before a backend
// copies anything.
Result<Model> load_model(const gguf::File& file, backend::Backend& be, const LoadProgress& progress = {});

}  // namespace tern::model
