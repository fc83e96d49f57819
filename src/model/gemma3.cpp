// Gemma 3: embeddings scaled by sqrt(n_embd); per-head q/k RMSNorm; each
// block's output normalised again before its residual add; a GELU-gated FFN;
// sliding-window layers (their own RoPE base) interleaved with global ones.
// The GGUF conversion stores Gemma's norm weights with its "1 +" folded in,
// so the common RMSNorm applies them as they are.
#include "model/family.h"

#include <cmath>
#include <string>

namespace tern::model {
namespace {

// Unless the metadata says otherwise, every sixth layer attends to the whole
// context and the others to the last sliding_window positions, with RoPE
// base 10,000 and no scaling: Gemma 3's configuration.
constexpr int kGlobalEvery = 6;
constexpr float kLocalRopeBase = 10000.0f;

void gemma3_layer(const LayerPass& p, const Layer& L, int il) {
    const float eps = p.hp.norm_eps;
    const bool local = p.hp.slides(il);
    p.be.rms_norm(p.x, L.attn_norm, eps, p.h);
    attention_block(p, L, il, p.h, local ? p.hp.rope_swa : p.rope, local ? p.hp.swa_window : 0, p.h);
    p.be.add_rms_norm(p.x, p.h, L.post_attn_norm, eps);
    p.be.rms_norm(p.x, L.ffn_norm, eps, p.h);
    gated_ffn(p, L, p.h, GateActivation::Gelu, p.h);
    p.be.add_rms_norm(p.x, p.h, L.post_ffn_norm, eps);
}

// Which layers slide: attention.sliding_window_pattern is a period n (layer
// il slides unless il % n == n - 1; 0: all slide) or one bool per layer.
Status read_sliding_layers(const gguf::File& f, Hparams& hp) {
    const std::string key = "gemma3.attention.sliding_window_pattern";
    hp.sliding.assign(size_t(hp.n_layer), 0);
    const gguf::Value* v = f.find(key);
    if (v && v->type == gguf::ValueType::ARRAY) {
        if (v->items.size() != size_t(hp.n_layer))
            return Error{f.path() + ": " + key + " has " + std::to_string(v->items.size()) + " entries for " +
                         std::to_string(hp.n_layer) + " layers"};
        for (size_t il = 0; il < v->items.size(); ++il) {
            const auto b = v->items[il].as_bool();
            if (!b) return Error{f.path() + ": " + key + " is an array of something other than bools"};
            hp.sliding[il] = *b;
        }
        return {};
    }
    int64_t period = kGlobalEvery;
    if (v) {
        const auto n = v->as_int();
        if (!n || *n < 0 || *n > hp.n_layer)
            return Error{f.path() + ": " + key + " is neither a layer period nor one bool per layer"};
        period = *n;
    }
    for (int il = 0; il < hp.n_layer; ++il) hp.sliding[size_t(il)] = period == 0 || il % period != period - 1;
    return {};
}

Status read_gemma3(const gguf::File& f, Hparams& hp) {
    hp.rope.neox = true;
    hp.embd_scale = std::sqrt(float(hp.n_embd));
    // The 27B model scales queries by 1/sqrt(n_embd / n_head) (its
    // query_pre_attn_scalar); the others by 1/sqrt(head_dim). Only the layer
    // count tells the 27B model apart in the metadata.
    if (hp.n_layer == 62) hp.attn_scale = 1.0f / std::sqrt(float(hp.n_embd / hp.n_head));
    if (auto cap = f.get_float("gemma3.final_logit_softcapping"); cap && *cap != 0.0)
        return Error{f.path() + ": gemma3.final_logit_softcapping is set; tern does not cap logits"};
    const auto window = f.get_int("gemma3.attention.sliding_window");
    if (!window) return Error{f.path() + ": metadata 'gemma3.attention.sliding_window' is missing"};
    if (*window < 0 || *window > (int64_t(1) << 24))
        return Error{f.path() + ": gemma3.attention.sliding_window = " + std::to_string(*window) + " is out of range"};
    hp.swa_window = int(*window);
    if (hp.swa_window == 0) return {};  // every layer global
    if (Status s = read_sliding_layers(f, hp); !s.ok()) return s;
    hp.rope_swa = hp.rope;
    hp.rope_swa.freq_base = kLocalRopeBase;
    hp.rope_swa.freq_scale = 1.0f;
    if (auto base = f.get_float("gemma3.rope.freq_base_swa")) {
        if (!(*base > 1.0 && std::isfinite(*base)))
            return Error{f.path() + ": gemma3.rope.freq_base_swa must be a finite number above 1"};
        hp.rope_swa.freq_base = float(*base);
    }
    return {};
}

}  // namespace

const Family kGemma3{"gemma3", {.qk_norm = true, .post_norms = true}, read_gemma3, gemma3_layer};

}  // namespace tern::model
