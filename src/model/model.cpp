// Loading a model: hyperparameters from metadata, every tensor checked for
// presence, type and shape before any backend sees it.
#include "model/model.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "model/family.h"
#include "model/tensor_parallel.h"
#include "quant/quant.h"

namespace tern::model {
namespace {

std::string key(const Hparams& hp, const char* suffix) { return hp.arch + "." + suffix; }

Result<int> require_int(const gguf::File& f, const std::string& k, int lo, int hi) {
    auto v = f.get_int(k);
    if (!v) return Error{f.path() + ": metadata '" + k + "' is missing or not an integer"};
    if (*v < lo || *v > hi)
        return Error{f.path() + ": metadata '" + k + "' = " + std::to_string(*v) + " is out of range [" +
                     std::to_string(lo) + ", " + std::to_string(hi) + "]"};
    return int(*v);
}

int optional_int(const gguf::File& f, const std::string& k, int fallback) {
    auto v = f.get_int(k);
    return v ? int(*v) : fallback;
}

// Looks a tensor up and checks its type is usable and its shape is {ne0, ne1}
// (ne1 == 0: a 1-D tensor of ne0), or {ne0, ne1, ne2} when ne2 is given.
Result<const gguf::TensorInfo*> find_checked(const gguf::File& f, const std::string& name, int64_t ne0,
                                             int64_t ne1, bool required = true, int64_t ne2 = 0) {
    const gguf::TensorInfo* t = f.find_tensor(name);
    if (!t) {
        if (!required) return static_cast<const gguf::TensorInfo*>(nullptr);
        return Error{f.path() + ": tensor '" + name + "' is missing"};
    }
    if (!tensor_type_supported(t->type_id))
        return Error{f.path() + ": tensor '" + name + "' has unsupported tensor type " +
                     tensor_type_name(t->type_id)};
    const bool shape_ok = ne2 > 0    ? (t->n_dims == 3 && t->ne[0] == ne0 && t->ne[1] == ne1 && t->ne[2] == ne2)
                          : ne1 == 0 ? (t->n_elements == ne0 && t->ne[0] == ne0)
                                     : (t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == ne1);
    if (!shape_ok)
        return Error{f.path() + ": tensor '" + name + "' has shape " + t->shape_string() + ", expected [" +
                     std::to_string(ne0) + (ne1 ? ", " + std::to_string(ne1) : std::string()) +
                     (ne2 ? ", " + std::to_string(ne2) : std::string()) + "]"};
    return t;
}

}  // namespace

bool architecture_supported(const std::string& arch) { return find_family(arch) != nullptr; }

Result<Hparams> read_hparams(const gguf::File& f) {
    Hparams hp;
    auto arch = f.get_string("general.architecture");
    if (!arch) return Error{f.path() + ": metadata 'general.architecture' is missing"};
    hp.arch = *arch;
    const Family* family = find_family(hp.arch);
    if (!family)
        return Error{f.path() + ": unsupported architecture '" + hp.arch + "' (tern runs: " + family_names() + ")"};

    constexpr int kBig = 1 << 24;
    auto n_embd = require_int(f, key(hp, "embedding_length"), 1, kBig);
    auto n_layer = require_int(f, key(hp, "block_count"), 1, 4096);
    auto n_ff = require_int(f, key(hp, "feed_forward_length"), 1, kBig);
    auto n_head = require_int(f, key(hp, "attention.head_count"), 1, 4096);
    if (!n_embd.ok()) return n_embd.error();
    if (!n_layer.ok()) return n_layer.error();
    if (!n_ff.ok()) return n_ff.error();
    if (!n_head.ok()) return n_head.error();
    hp.n_embd = *n_embd;
    hp.n_layer = *n_layer;
    hp.n_ff = *n_ff;
    hp.n_head = *n_head;
    hp.n_head_kv = optional_int(f, key(hp, "attention.head_count_kv"), hp.n_head);
    if (hp.n_head_kv < 1 || hp.n_head % hp.n_head_kv != 0)
        return Error{f.path() + ": attention.head_count_kv = " + std::to_string(hp.n_head_kv) +
                     " does not divide head_count = " + std::to_string(hp.n_head)};
    hp.head_dim = optional_int(f, key(hp, "attention.key_length"), hp.n_embd / hp.n_head);
    if (hp.head_dim < 2 || hp.head_dim % 2 != 0 || hp.head_dim > 1024)
        return Error{f.path() + ": head dimension " + std::to_string(hp.head_dim) + " is not usable"};
    if (auto v = f.get_int(key(hp, "attention.value_length")); v && *v != hp.head_dim)
        return Error{f.path() + ": attention.value_length = " + std::to_string(*v) + " differs from key_length = " +
                     std::to_string(hp.head_dim) + " (tern needs one head size)"};
    hp.n_ctx_train = optional_int(f, key(hp, "context_length"), 2048);
    if (hp.n_ctx_train < 1) hp.n_ctx_train = 2048;
    hp.rope_orig_ctx = hp.n_ctx_train;
    if (f.get_int(key(hp, "rope.scaling.original_context_length"))) {
        auto orig = require_int(f, key(hp, "rope.scaling.original_context_length"), 1, kBig);
        if (!orig.ok()) return orig.error();
        hp.rope_orig_ctx = *orig;
    }

    if (auto eps = f.get_float(key(hp, "attention.layer_norm_rms_epsilon"))) hp.norm_eps = float(*eps);
    if (!(hp.norm_eps > 0.0f && hp.norm_eps < 1.0f))
        return Error{f.path() + ": attention.layer_norm_rms_epsilon is not a small positive number"};

    hp.attn_scale = 1.0f / std::sqrt(float(hp.head_dim));
    hp.rope.n_dims = optional_int(f, key(hp, "rope.dimension_count"), hp.head_dim);
    if (hp.rope.n_dims < 2 || hp.rope.n_dims > hp.head_dim || hp.rope.n_dims % 2 != 0)
        return Error{f.path() + ": rope.dimension_count = " + std::to_string(hp.rope.n_dims) +
                     " does not fit head dimension " + std::to_string(hp.head_dim)};
    if (auto base = f.get_float(key(hp, "rope.freq_base"))) hp.rope.freq_base = float(*base);
    if (!(hp.rope.freq_base > 1.0f && std::isfinite(hp.rope.freq_base)))
        return Error{f.path() + ": rope.freq_base must be a finite number above 1"};
    if (auto type = f.get_string(key(hp, "rope.scaling.type")); type && *type != "none") {
        if (*type != "linear")
            return Error{f.path() + ": rope scaling '" + *type + "' is not supported (tern supports none, linear)"};
        auto factor = f.get_float(key(hp, "rope.scaling.factor"));
        if (!factor || !(*factor >= 1.0 && *factor < 1e6))
            return Error{f.path() + ": rope.scaling.factor is missing or out of range"};
        hp.rope.freq_scale = float(1.0 / *factor);
    }
    if (auto af = f.get_float(key(hp, "rope.scaling.attn_factor"))) {
        if (!(*af > 0.0 && *af < 16.0))
            return Error{f.path() + ": rope.scaling.attn_factor = " + std::to_string(*af) + " is out of range"};
        hp.rope.attn_factor = float(*af);
    }

    const gguf::TensorInfo* embd = f.find_tensor("token_embd.weight");
    if (!embd) return Error{f.path() + ": tensor 'token_embd.weight' is missing"};
    if (embd->n_dims != 2 || embd->ne[0] != hp.n_embd || embd->ne[1] < 1 || embd->ne[1] > kBig)
        return Error{f.path() + ": tensor 'token_embd.weight' has shape " + embd->shape_string() +
                     ", expected [" + std::to_string(hp.n_embd) + ", n_vocab]"};
    hp.n_vocab = int(embd->ne[1]);

    // A mixture of experts: how many, and how many each token is routed to.
    using Experts = LayerTensors::Experts;
    const int n_expert = optional_int(f, key(hp, "expert_count"), 0);
    if (family->tensors.experts == Experts::Always && n_expert == 0)
        return Error{f.path() + ": metadata '" + key(hp, "expert_count") + "' is missing (" + hp.arch +
                     " is a mixture of experts)"};
    if (n_expert != 0) {
        if (family->tensors.experts == Experts::Never)
            return Error{f.path() + ": " + hp.arch + " with " + key(hp, "expert_count") + " = " +
                         std::to_string(n_expert) + " is not supported (mixtures of experts: llama, qwen3moe)"};
        auto count = require_int(f, key(hp, "expert_count"), 1, backend::kMaxExperts);
        if (!count.ok()) return count.error();
        auto used = require_int(f, key(hp, "expert_used_count"), 1, *count);
        if (!used.ok()) return used.error();
        hp.n_expert = *count;
        hp.n_expert_used = *used;
    }
    if (Status s = family->read_hparams(f, hp); !s.ok()) return Error{s.message()};
    return hp;
}

Result<Model> describe_model(const gguf::File& f) {
    auto hp = read_hparams(f);
    if (!hp.ok()) return hp.error();
    Model m;
    m.hp = *hp;
    const Hparams& h = m.hp;
    const LayerTensors& has = find_family(h.arch)->tensors;
    const int64_t q_dim = int64_t(h.n_head) * h.head_dim;
    const int64_t kv_dim = int64_t(h.n_head_kv) * h.head_dim;

    Status failed;
    auto want = [&](backend::Weight& dst, const std::string& name, int64_t ne0, int64_t ne1, bool required = true,
                    int64_t ne2 = 0) {
        if (!failed.ok()) return;
        auto t = find_checked(f, name, ne0, ne1, required, ne2);
        if (!t.ok()) { failed = t.error(); return; }
        if (*t == nullptr) return;
        auto w = backend::describe_weight(**t);
        if (!w.ok()) { failed = Error{f.path() + ": " + w.error().message}; return; }
        dst = std::move(*w);
    };

    want(m.token_embd, "token_embd.weight", h.n_embd, h.n_vocab);
    want(m.output_norm, "output_norm.weight", h.n_embd, 0);
    want(m.output, "output.weight", h.n_embd, h.n_vocab, /*required=*/false);
    want(m.rope_freqs, "rope_freqs.weight", h.rope.n_dims / 2, 0, /*required=*/false);
    want(m.rope_long, "rope_factors_long.weight", h.rope.n_dims / 2, 0, /*required=*/false);
    want(m.rope_short, "rope_factors_short.weight", h.rope.n_dims / 2, 0, /*required=*/false);
    // RoPE divides each frequency by these: a zero, negative or non-finite one is a broken file.
    for (const backend::Weight* w : {&m.rope_freqs, &m.rope_long, &m.rope_short}) {
        if (!*w || !failed.ok()) continue;
        std::vector<float> v(size_t(w->cols));
        if (!quant::dequantize_row(w->type, w->host, v.data(), w->cols).ok()) {
            failed = Error{f.path() + ": tensor '" + w->name + "' cannot be read"};
            continue;
        }
        for (float x : v)
            if (!(x > 0.0f && std::isfinite(x))) {
                failed = Error{f.path() + ": tensor '" + w->name + "' holds a frequency factor " + std::to_string(x) +
                               " (each must be a finite number above 0)"};
                break;
            }
    }
    m.layers.resize(size_t(h.n_layer));
    for (int i = 0; i < h.n_layer && failed.ok(); ++i) {
        Layer& L = m.layers[size_t(i)];
        const std::string p = "blk." + std::to_string(i) + ".";
        want(L.attn_norm, p + "attn_norm.weight", h.n_embd, 0);
        // Rows r0..r1 of a fused tensor as a weight of their own.
        auto want_rows = [&](backend::Weight& dst, const backend::Weight& whole, int64_t r0, int64_t r1) {
            if (!failed.ok()) return;
            auto v = weight_rows(whole, r0, r1);
            if (!v.ok()) { failed = Error{f.path() + ": " + v.error().message}; return; }
            dst = std::move(*v);
        };
        if (has.fused && f.find_tensor(p + "attn_qkv.weight")) {
            backend::Weight qkv;
            want(qkv, p + "attn_qkv.weight", h.n_embd, q_dim + 2 * kv_dim);
            want_rows(L.wq, qkv, 0, q_dim);
            want_rows(L.wk, qkv, q_dim, q_dim + kv_dim);
            want_rows(L.wv, qkv, q_dim + kv_dim, q_dim + 2 * kv_dim);
        } else {
            want(L.wq, p + "attn_q.weight", h.n_embd, q_dim);
            want(L.wk, p + "attn_k.weight", h.n_embd, kv_dim);
            want(L.wv, p + "attn_v.weight", h.n_embd, kv_dim);
        }
        // Biases and q/k norms: required where the family has them, used
        // wherever a file carries them (a llama file with q/k/v biases).
        want(L.bq, p + "attn_q.bias", q_dim, 0, has.qkv_bias);
        want(L.bk, p + "attn_k.bias", kv_dim, 0, has.qkv_bias);
        want(L.bv, p + "attn_v.bias", kv_dim, 0, has.qkv_bias);
        want(L.q_norm, p + "attn_q_norm.weight", h.head_dim, 0, has.qk_norm);
        want(L.k_norm, p + "attn_k_norm.weight", h.head_dim, 0, has.qk_norm);
        if (bool(L.q_norm) != bool(L.k_norm) && failed.ok())
            failed = Error{f.path() + ": layer " + std::to_string(i) + " has one of attn_q_norm and attn_k_norm"};
        want(L.wo, p + "attn_output.weight", q_dim, h.n_embd);
        want(L.ffn_norm, p + "ffn_norm.weight", h.n_embd, 0);
        if (h.n_expert > 0) {
            // Each expert's matrix: rows e*n_ff.. of the stacked tensor (ne = [cols, rows, experts]).
            const std::string exps[3] = {p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight", p + "ffn_down_exps.weight"};
            for (const std::string& name : exps)
                if (!f.find_tensor(name) && failed.ok())
                    failed = Error{f.path() + ": tensor '" + name + "' is missing (expert_count = " +
                                   std::to_string(h.n_expert) + " declares a mixture of experts" +
                                   (f.find_tensor(p + "ffn_gate.weight") ? ", but the file carries a dense FFN)" : ")")};
            want(L.ffn_router, p + "ffn_gate_inp.weight", h.n_embd, h.n_expert);
            backend::Weight stacked[3];
            want(stacked[0], exps[0], h.n_embd, h.n_ff, true, h.n_expert);
            want(stacked[1], exps[1], h.n_embd, h.n_ff, true, h.n_expert);
            want(stacked[2], exps[2], h.n_ff, h.n_embd, true, h.n_expert);
            std::vector<backend::Weight>* per_expert[3] = {&L.gate_exps, &L.up_exps, &L.down_exps};
            for (int m = 0; m < 3 && failed.ok(); ++m) {
                per_expert[m]->resize(size_t(h.n_expert));
                const int64_t rows = stacked[m].rows / h.n_expert;
                for (int e = 0; e < h.n_expert; ++e)
                    want_rows((*per_expert[m])[size_t(e)], stacked[m], e * rows, (e + 1) * rows);
            }
        } else if (has.fused && !f.find_tensor(p + "ffn_gate.weight")) {
            backend::Weight gate_up;
            want(gate_up, p + "ffn_up.weight", h.n_embd, 2 * int64_t(h.n_ff));
            want_rows(L.w_gate, gate_up, 0, h.n_ff);
            want_rows(L.w_up, gate_up, h.n_ff, 2 * int64_t(h.n_ff));
        } else {
            want(L.w_gate, p + "ffn_gate.weight", h.n_embd, h.n_ff);
            want(L.w_up, p + "ffn_up.weight", h.n_embd, h.n_ff);
        }
        if (h.n_expert == 0) want(L.w_down, p + "ffn_down.weight", h.n_ff, h.n_embd);
        if (has.post_norms) {
            want(L.post_attn_norm, p + "post_attention_norm.weight", h.n_embd, 0);
            want(L.post_ffn_norm, p + "post_ffw_norm.weight", h.n_embd, 0);
        }
    }
    if (!failed.ok()) return Error{failed.message()};
    if (!m.output) m.output = m.token_embd;  // tied embeddings
    return m;
}

namespace {

// Every weight of a model, in load order; the output head last, so that a
// tied head can be told from the table it shares.
// (Model or const Model: pointers of the same constness.)
template <class M>
auto weights_of(M& m) {
    using W = std::conditional_t<std::is_const_v<M>, const backend::Weight, backend::Weight>;
    std::vector<W*> all = {&m.token_embd, &m.output_norm, &m.rope_freqs, &m.rope_long, &m.rope_short};
    for (auto& L : m.layers) {
        for (W* w : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.bq, &L.bk, &L.bv, &L.q_norm, &L.k_norm, &L.wo,
                     &L.post_attn_norm, &L.ffn_norm, &L.w_gate, &L.w_up, &L.w_down, &L.post_ffn_norm, &L.ffn_router})
            all.push_back(w);
        for (auto* experts : {&L.gate_exps, &L.up_exps, &L.down_exps})
            for (W& w : *experts) all.push_back(&w);
    }
    all.push_back(&m.output);
    return all;
}

bool same_view(const backend::Weight& a, const backend::Weight& b) {
    return a.host == b.host && a.rows == b.rows && a.cols == b.cols && a.row_bytes == b.row_bytes;
}

size_t weight_bytes(const backend::Weight& w) {
    return w ? size_t(w.rows) * quant::row_bytes(w.type, w.cols) : 0;
}

}  // namespace

size_t model_bytes(const Model& described) {
    size_t total = 0;
    for (const backend::Weight* w : weights_of(described))
        if (w != &described.output || !same_view(described.output, described.token_embd)) total += weight_bytes(*w);
    return total;
}

const backend::Weight* rope_factors(const Model& m, int n_ctx) {
    if (m.rope_freqs) return &m.rope_freqs;
    if (m.rope_long && n_ctx > m.hp.rope_orig_ctx) return &m.rope_long;
    if (m.rope_short) return &m.rope_short;
    return nullptr;
}

Result<Model> register_model(const Model& described, backend::Backend& be, const LoadProgress& progress,
                             const gguf::File* source) {
    Model m = described;
    const size_t total_bytes = model_bytes(described);
    const bool tied = same_view(m.output, m.token_embd);
    size_t done_bytes = 0;
    for (backend::Weight* w : weights_of(m)) {
        if (!*w) continue;
        if (w == &m.output && tied) {
            m.output = m.token_embd;  // one registration serves both
            continue;
        }
        auto r = be.register_weight(*w);
        if (!r.ok()) return r.error();
        if (source && w->rows > 1 && r->host != w->host)
            source->release_pages(w->host, backend::weight_span(*w));
        *w = std::move(*r);
        done_bytes += weight_bytes(*w);
        if (progress) progress(done_bytes, total_bytes);
    }
    return m;
}

Result<Model> load_model(const gguf::File& f, backend::Backend& be, const LoadProgress& progress) {
    auto m = describe_model(f);
    if (!m.ok()) return m.error();
    return register_model(*m, be, progress, &f);
}

}  // namespace tern::model
