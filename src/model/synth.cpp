// Synthetic models: preset shapes, the tensor list of the llama / qwen2 layout,
// seeded weights and the streamed write. Each tensor is generated and quantized
// by all threads together (rows split in fixed chunks, each row seeded on its
// own), then handed to the GGUF writer before the next one starts.
#include "model/synth.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <omp.h>

#include "gguf/gguf.h"
#include "quant/quant.h"

namespace tern::model {

// ---- shapes -------------------------------------------------------------------

std::optional<SynthShape> synth_preset(std::string_view name) {
    SynthShape s;  // defaults are the tiny model
    s.preset = std::string(name);
    if (name == "tiny" || name == "custom") return s;
    if (name == "llama2-7b") {
        s.n_vocab = 32000; s.n_embd = 4096; s.n_layer = 32; s.n_head = 32; s.n_head_kv = 32;
        s.n_ff = 11008; s.n_ctx = 4096; s.rope_base = 10000.0f; s.rms_eps = 1e-5f;
        return s;
    }
    if (name == "llama3-8b") {
        s.n_vocab = 128256; s.n_embd = 4096; s.n_layer = 32; s.n_head = 32; s.n_head_kv = 8;
        s.n_ff = 14336; s.n_ctx = 8192; s.rope_base = 500000.0f; s.rms_eps = 1e-5f;
        s.tokenizer = SynthTokenizer::Gpt2Bpe;
        s.bpe_pre = "llama-bpe";
        return s;
    }
    if (name == "qwen3-8b") {
        s.arch = "qwen3";
        s.n_vocab = 151936; s.n_embd = 4096; s.n_layer = 36; s.n_head = 32; s.n_head_kv = 8;
        s.n_ff = 12288; s.n_ctx = 40960; s.rope_base = 1000000.0f; s.rms_eps = 1e-6f;
        s.tokenizer = SynthTokenizer::Gpt2Bpe;
        s.bpe_pre = "qwen2";
        return s;
    }
    if (name == "qwen3-30b-a3b") {
        s.arch = "qwen3moe";
        s.n_vocab = 151936; s.n_embd = 2048; s.n_layer = 48; s.n_head = 32; s.n_head_kv = 4; s.n_head_dim = 128;
        s.n_ff = 768; s.n_expert = 128; s.n_expert_used = 8;
        s.n_ctx = 40960; s.rope_base = 1000000.0f; s.rms_eps = 1e-6f;
        s.tokenizer = SynthTokenizer::Gpt2Bpe;
        s.bpe_pre = "qwen2";
        return s;
    }
    if (name == "mixtral-8x7b") {
        s.n_vocab = 32000; s.n_embd = 4096; s.n_layer = 32; s.n_head = 32; s.n_head_kv = 8;
        s.n_ff = 14336; s.n_expert = 8; s.n_expert_used = 2;
        s.n_ctx = 32768; s.rope_base = 1000000.0f; s.rms_eps = 1e-5f;
        return s;
    }
    if (name == "gemma3-4b") {
        s.arch = "gemma3";
        s.n_vocab = 262208; s.n_embd = 2560; s.n_layer = 34; s.n_head = 8; s.n_head_kv = 4; s.n_head_dim = 256;
        s.n_ff = 10240; s.n_ctx = 131072; s.rope_base = 1000000.0f; s.rms_eps = 1e-6f;
        s.sliding_window = 1024; s.tied_output = true;
        return s;
    }
    if (name == "gemma3-270m") {
        s.arch = "gemma3";
        s.n_vocab = 262144; s.n_embd = 640; s.n_layer = 18; s.n_head = 4; s.n_head_kv = 1; s.n_head_dim = 256;
        s.n_ff = 2048; s.n_ctx = 32768; s.rope_base = 1000000.0f; s.rms_eps = 1e-6f;
        s.sliding_window = 512; s.tied_output = true;
        return s;
    }
    if (name == "phi3-mini") {
        s.arch = "phi3";
        s.n_vocab = 32064; s.n_embd = 3072; s.n_layer = 32; s.n_head = 32; s.n_head_kv = 32;
        s.n_ff = 8192; s.n_ctx = 4096; s.rope_base = 10000.0f; s.rms_eps = 1e-5f;
        return s;
    }
    if (name == "qwen2-7b") {
        s.arch = "qwen2";
        s.n_vocab = 152064; s.n_embd = 3584; s.n_layer = 28; s.n_head = 28; s.n_head_kv = 4;
        s.n_ff = 18944; s.n_ctx = 32768; s.rope_base = 1000000.0f; s.rms_eps = 1e-6f;
        s.tokenizer = SynthTokenizer::Gpt2Bpe;
        s.bpe_pre = "qwen2";
        return s;
    }
    return std::nullopt;
}

std::vector<std::string> synth_preset_names() {
    return {"tiny",        "llama2-7b", "llama3-8b", "qwen2-7b",  "qwen3-8b", "qwen3-30b-a3b", "mixtral-8x7b",
            "gemma3-270m", "gemma3-4b", "phi3-mini", "custom"};
}

Status check_synth_shape(const SynthShape& s) {
    auto in_range = [](const char* what, int64_t v, int64_t lo, int64_t hi) -> Status {
        if (v < lo || v > hi)
            return Error{std::string(what) + " = " + std::to_string(v) + " is outside [" +
                         std::to_string(lo) + ", " + std::to_string(hi) + "]"};
        return {};
    };
    // Bounds keep every product (tensor bytes, parameter counts) far from overflow.
    for (Status st : {in_range("n_vocab", s.n_vocab, 1, int64_t(1) << 22),
                      in_range("n_embd", s.n_embd, 1, int64_t(1) << 16),
                      in_range("n_layer", s.n_layer, 1, 1024),
                      in_range("n_head", s.n_head, 1, 4096),
                      in_range("n_head_kv", s.n_head_kv, 1, 4096),
                      in_range("n_ff", s.n_ff, 1, int64_t(1) << 18),
                      in_range("n_ctx", s.n_ctx, 1, int64_t(1) << 24),
                      in_range("head size", s.n_head_dim, 0, 1024),
                      in_range("sliding window", s.sliding_window, 0, int64_t(1) << 24),
                      in_range("n_expert", s.n_expert, 0, 256),
                      in_range("n_expert_used", s.n_expert_used, s.n_expert > 0 ? 1 : 0, s.n_expert)})
        if (!st) return st;
    if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "qwen3" && s.arch != "qwen3moe" && s.arch != "gemma3" &&
        s.arch != "phi3")
        return Error{"architecture '" + s.arch +
                     "' is not one synth can build (llama, qwen2, qwen3, qwen3moe, gemma3, phi3)"};
    if (s.has_experts() ? (s.arch != "llama" && s.arch != "qwen3moe") : s.arch == "qwen3moe")
        return Error{"experts (--n-expert) are what qwen3moe has and llama may have (Mixtral); the other "
                     "architectures have none"};
    if (s.longrope_orig_ctx != 0 && (s.arch != "phi3" || s.longrope_orig_ctx < 1 || s.longrope_orig_ctx > s.n_ctx))
        return Error{"LongRoPE factors are phi3's, with an original context of 1 to n_ctx"};
    if ((s.arch == "gemma3") != (s.sliding_window > 0))
        return Error{"a sliding window is what gemma3 has and the other architectures do not"};
    if (s.n_head_dim == 0 && s.n_embd % s.n_head != 0)
        return Error{"n_embd " + std::to_string(s.n_embd) + " is not a multiple of n_head " +
                     std::to_string(s.n_head)};
    if (s.n_head % s.n_head_kv != 0)
        return Error{"n_head " + std::to_string(s.n_head) + " is not a multiple of n_head_kv " +
                     std::to_string(s.n_head_kv)};
    if (s.head_dim() % 2 != 0)
        return Error{"head size " + std::to_string(s.head_dim()) + " is odd; RoPE rotates pairs"};
    if (!(s.rope_base > 0.0f) || !std::isfinite(s.rope_base))
        return Error{"rope base must be a positive number"};
    if (!(s.rms_eps > 0.0f) || !std::isfinite(s.rms_eps))
        return Error{"rms epsilon must be a positive number"};
    return {};
}

// ---- tensors ------------------------------------------------------------------

int64_t SynthTensor::n_rows() const {
    int64_t rows = 1;
    for (size_t d = 1; d < ne.size(); ++d) rows *= ne[d];
    return rows;
}

int64_t SynthTensor::n_elements() const { return ne[0] * n_rows(); }

std::vector<SynthTensor> synth_tensors(const SynthShape& s) {
    const int64_t embd = s.n_embd, qd = s.q_dim(), kv = s.kv_dim(), ff = s.n_ff, vocab = s.n_vocab;
    std::vector<SynthTensor> t;
    auto add = [&t](std::string name, std::vector<int64_t> ne, SynthInit init = SynthInit::Normal) {
        t.push_back({std::move(name), std::move(ne), init});
    };
    add("token_embd.weight", {embd, vocab});
    if (s.longrope_orig_ctx > 0) {
        add("rope_factors_long.weight", {s.head_dim() / 2}, SynthInit::NearFour);
        add("rope_factors_short.weight", {s.head_dim() / 2}, SynthInit::NearOne);
    }
    for (int64_t l = 0; l < s.n_layer; ++l) {
        const std::string p = "blk." + std::to_string(l) + ".";
        add(p + "attn_norm.weight", {embd}, SynthInit::NearOne);
        if (s.fused()) {
            add(p + "attn_qkv.weight", {embd, qd + 2 * kv});  // q, k, v rows in turn
        } else {
            add(p + "attn_q.weight", {embd, qd});  // n_head * head_dim outputs
            if (s.has_qkv_bias()) add(p + "attn_q.bias", {qd});
            add(p + "attn_k.weight", {embd, kv});    // n_head_kv * head_dim outputs
            if (s.has_qkv_bias()) add(p + "attn_k.bias", {kv});
            add(p + "attn_v.weight", {embd, kv});
            if (s.has_qkv_bias()) add(p + "attn_v.bias", {kv});
        }
        if (s.has_qk_norm()) {
            add(p + "attn_q_norm.weight", {s.head_dim()}, SynthInit::NearOne);
            add(p + "attn_k_norm.weight", {s.head_dim()}, SynthInit::NearOne);
        }
        add(p + "attn_output.weight", {qd, embd});
        if (s.has_post_norms()) add(p + "post_attention_norm.weight", {embd}, SynthInit::NearOne);
        add(p + "ffn_norm.weight", {embd}, SynthInit::NearOne);
        if (s.has_experts()) {
            add(p + "ffn_gate_inp.weight", {embd, s.n_expert});  // the router
            add(p + "ffn_gate_exps.weight", {embd, ff, s.n_expert});
            add(p + "ffn_up_exps.weight", {embd, ff, s.n_expert});
            add(p + "ffn_down_exps.weight", {ff, embd, s.n_expert});
        } else if (s.fused()) {
            add(p + "ffn_up.weight", {embd, 2 * ff});  // gate rows, then up rows
        } else {
            add(p + "ffn_gate.weight", {embd, ff});
            add(p + "ffn_up.weight", {embd, ff});
        }
        if (!s.has_experts()) add(p + "ffn_down.weight", {ff, embd});
        if (s.has_post_norms()) add(p + "post_ffw_norm.weight", {embd}, SynthInit::NearOne);
    }
    add("output_norm.weight", {embd}, SynthInit::NearOne);
    if (!s.tied_output) add("output.weight", {embd, vocab});
    return t;
}

// ---- weights ------------------------------------------------------------------

namespace {

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

uint64_t hash_name(std::string_view name) {
    uint64_t h = 0xCBF29CE484222325ull;  // FNV-1a
    for (unsigned char c : name) h = (h ^ c) * 0x100000001B3ull;
    return h;
}

constexpr float kWeightStd = 0.02f;

// Gaussian values by Box-Muller: each 64-bit draw gives two 24-bit uniforms
// and two independent normals.
void fill_normal(uint64_t state, float mean, float stddev, float* out, int64_t n) {
    constexpr float kTwoPi = 6.28318530717958647692f;
    constexpr float kInv24 = 1.0f / 16777216.0f;
    int64_t i = 0;
    while (i < n) {
        const uint64_t x = splitmix64(state);
        const float u1 = float((x >> 40) + 1) * kInv24;  // (0, 1]: log is finite
        const float u2 = float(x & 0xFFFFFFu) * kInv24;  // [0, 1)
        const float r = stddev * std::sqrt(-2.0f * std::log(u1));
        const float theta = kTwoPi * u2;
        out[i++] = mean + r * std::cos(theta);
        if (i < n) out[i++] = mean + r * std::sin(theta);
    }
}

}  // namespace

void synth_fill_rows(uint64_t seed, const SynthTensor& tensor, int64_t first_row, int64_t n_rows,
                     float* out) {
    const uint64_t tensor_key = hash_name(tensor.name) ^ (seed * 0xD6E8FEB86659FD93ull);
    const float mean = tensor.init == SynthInit::NearOne ? 1.0f : tensor.init == SynthInit::NearFour ? 4.0f : 0.0f;
    const int64_t len = tensor.row_length();
    for (int64_t r = 0; r < n_rows; ++r) {
        uint64_t s = tensor_key + uint64_t(first_row + r) * 0x9E3779B97F4A7C15ull;
        const uint64_t row_state = splitmix64(s);
        fill_normal(row_state, mean, kWeightStd, out + r * len, len);
    }
}

// ---- the file -----------------------------------------------------------------

namespace {

void set_metadata(gguf::Writer& w, const SynthShape& s, const SynthVocab& v, quant::FileType ftype) {
    const std::string& a = s.arch;
    w.set_string("general.architecture", a);
    w.set_string("general.name", "synthetic " + s.preset);
    w.set_u32("general.file_type", uint32_t(ftype));
    w.set_u32("general.quantization_version", 2);
    w.set_u32(a + ".context_length", uint32_t(s.n_ctx));
    w.set_u32(a + ".embedding_length", uint32_t(s.n_embd));
    w.set_u32(a + ".block_count", uint32_t(s.n_layer));
    if (a == "qwen3moe") {
        // Qwen3-MoE states each expert's width apart; feed_forward_length is the routed total.
        w.set_u32(a + ".feed_forward_length", uint32_t(s.n_ff * s.n_expert_used));
        w.set_u32(a + ".expert_feed_forward_length", uint32_t(s.n_ff));
    } else {
        w.set_u32(a + ".feed_forward_length", uint32_t(s.n_ff));
    }
    if (s.has_experts()) {
        w.set_u32(a + ".expert_count", uint32_t(s.n_expert));
        w.set_u32(a + ".expert_used_count", uint32_t(s.n_expert_used));
    }
    w.set_u32(a + ".rope.dimension_count", uint32_t(s.head_dim()));
    w.set_u32(a + ".attention.head_count", uint32_t(s.n_head));
    w.set_u32(a + ".attention.head_count_kv", uint32_t(s.n_head_kv));
    if (s.n_head_dim > 0) {
        w.set_u32(a + ".attention.key_length", uint32_t(s.n_head_dim));
        w.set_u32(a + ".attention.value_length", uint32_t(s.n_head_dim));
    }
    if (s.sliding_window > 0) w.set_u32(a + ".attention.sliding_window", uint32_t(s.sliding_window));
    if (s.longrope_orig_ctx > 0) {
        // LongRoPE's attention factor as Phi-3 derives it: sqrt(1 + ln(n_ctx / orig) / ln(orig)).
        const double scale = double(s.n_ctx) / double(s.longrope_orig_ctx);
        const double orig = double(std::max<int64_t>(s.longrope_orig_ctx, 2));
        w.set_u32(a + ".rope.scaling.original_context_length", uint32_t(s.longrope_orig_ctx));
        w.set_f32(a + ".rope.scaling.attn_factor",
                  float(scale > 1.0 ? std::sqrt(1.0 + std::log(scale) / std::log(orig)) : 1.0));
    }
    w.set_f32(a + ".attention.layer_norm_rms_epsilon", s.rms_eps);
    w.set_f32(a + ".rope.freq_base", s.rope_base);
    w.set_u32(a + ".vocab_size", uint32_t(s.n_vocab));

    w.set_string("tokenizer.ggml.model", v.model);
    w.set_string("tokenizer.ggml.pre", v.pre);
    w.set("tokenizer.ggml.tokens", gguf::Value::of_strings(v.tokens));
    if (!v.scores.empty()) w.set("tokenizer.ggml.scores", gguf::Value::of_f32s(v.scores));
    w.set("tokenizer.ggml.token_type", gguf::Value::of_i32s(v.token_types));
    if (!v.merges.empty()) w.set("tokenizer.ggml.merges", gguf::Value::of_strings(v.merges));
    w.set_u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos_id));
    w.set_u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos_id));
    if (v.unk_id >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", uint32_t(v.unk_id));
    if (v.pad_id >= 0) w.set_u32("tokenizer.ggml.padding_token_id", uint32_t(v.pad_id));
    w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
    w.set_bool("tokenizer.ggml.add_eos_token", false);
    if (!v.chat_template.empty()) w.set_string("tokenizer.chat_template", v.chat_template);
}

// Generates one tensor into `out` (already sized), all threads together.
Status generate_tensor(const SynthTensor& t, TensorType type, const SynthOptions& opt,
                       uint8_t* out, std::atomic<uint64_t>& done, uint64_t total,
                       std::mutex& progress_mutex) {
    const int64_t len = t.row_length();
    const int64_t rows = t.n_rows();
    const size_t row_bytes = quant::row_bytes(type, len);
    if (row_bytes == 0)
        return Error{"cannot store " + t.name + " as " + tensor_type_name(uint32_t(type)) +
                     " (row length " + std::to_string(len) + ")"};
    // Chunks of about 64K elements keep threads busy on small tensors too.
    const int64_t rows_per_chunk = std::max<int64_t>(1, 65536 / len);
    const int64_t n_chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
    std::atomic<bool> failed{false};
    std::string failure;
    std::mutex failure_mutex;

#pragma omp parallel num_threads(std::max(1, opt.n_threads))
    {
        std::vector<float> scratch(size_t(rows_per_chunk * len));
#pragma omp for schedule(dynamic, 1)
        for (int64_t c = 0; c < n_chunks; ++c) {
            if (failed.load(std::memory_order_relaxed)) continue;
            const int64_t r0 = c * rows_per_chunk;
            const int64_t nr = std::min(rows_per_chunk, rows - r0);
            synth_fill_rows(opt.seed, t, r0, nr, scratch.data());
            for (int64_t r = 0; r < nr; ++r) {
                Status st = quant::quantize_row(type, scratch.data() + r * len,
                                                out + size_t(r0 + r) * row_bytes, len);
                if (!st) {
                    std::lock_guard<std::mutex> lock(failure_mutex);
                    if (!failed.exchange(true)) failure = t.name + ": " + st.message();
                    break;
                }
            }
            const uint64_t now = done.fetch_add(uint64_t(nr * len)) + uint64_t(nr * len);
            if (opt.on_progress && progress_mutex.try_lock()) {
                opt.on_progress(now, total);
                progress_mutex.unlock();
            }
        }
    }
    if (failed.load()) return Error{failure};
    return {};
}

}  // namespace

Result<SynthSummary> write_synth_model(const std::string& path, const SynthOptions& opt) {
    const SynthShape& s = opt.shape;
    if (Status st = check_synth_shape(s); !st) return Error{st.message()};
    auto vocab = synth_vocab(s);
    if (!vocab) return vocab.error();

    const std::vector<SynthTensor> tensors = synth_tensors(s);
    quant::MixModel mix;
    mix.ftype = opt.ftype;
    mix.arch = s.arch;
    mix.n_layers = int(s.n_layer);
    mix.n_head = int(s.n_head);
    mix.n_head_kv = int(s.n_head_kv);
    mix.has_output = !s.tied_output;
    mix.n_expert = int(s.n_expert);

    gguf::Writer w;
    set_metadata(w, s, *vocab, opt.ftype);
    std::vector<TensorType> types;
    SynthSummary summary;
    for (const SynthTensor& t : tensors) {
        const TensorType type = quant::choose_tensor_type(mix, t.name, t.ne.data(), int(t.ne.size()),
                                                          TensorType::F32);
        if (Status st = w.add_tensor(t.name, type, t.ne); !st) return Error{st.message()};
        types.push_back(type);
        summary.n_params += uint64_t(t.n_elements());
    }
    summary.n_tensors = tensors.size();

    // From here on an error leaves no file: the writer removes what it has not finished.
    if (Status st = w.begin(path); !st) return Error{st.message()};
    std::atomic<uint64_t> done{0};
    std::mutex progress_mutex;
    std::vector<uint8_t> buffer;
    for (size_t i = 0; i < tensors.size(); ++i) {
        const size_t n_bytes = size_t(w.tensors()[i].n_bytes);
        buffer.resize(n_bytes);
        Status st = generate_tensor(tensors[i], types[i], opt, buffer.data(), done, summary.n_params,
                                    progress_mutex);
        if (st) st = w.write_tensor_data(buffer.data(), n_bytes);
        if (!st) return Error{st.message()};
        summary.data_bytes += n_bytes;
    }
    if (Status st = w.finish(); !st) return Error{st.message()};
    if (opt.on_progress) opt.on_progress(summary.n_params, summary.n_params);
    return summary;
}

}  // namespace tern::model
