// `tern synth OUT --shape S --type T`: writes a random-weight GGUF model with
// the shape, names, metadata and tokenizer layout of a real checkpoint, for
// tests and benchmarks that need realistic files without downloads.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "model/synth.h"
#include "quant/mix.h"
#include "tools/commands.h"
#include "tools/fail.h"
#include "tools/progress.h"

namespace tern::tools {
namespace {

struct SynthCliOptions {
    std::string output;
    std::string shape = "tiny";
    std::string type = "f32";
    uint64_t seed = 0;
    int threads = 0;
    // Overrides of the preset's dimensions.
    std::optional<int64_t> n_vocab, n_embd, n_layer, n_head, n_head_kv, n_ff, n_ctx, n_expert, n_expert_used;
    std::optional<float> rope_base, rms_eps;
    std::optional<std::string> arch, tokenizer;
    bool tied = false;
};

std::string join(const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& s : items) out += (out.empty() ? "" : ", ") + s;
    return out;
}

model::SynthShape shape_from(const SynthCliOptions& o) {
    auto preset = model::synth_preset(o.shape);
    if (!preset)
        fail("synth", "unknown shape '" + o.shape + "' (choose one of: " +
                          join(model::synth_preset_names()) + ")");
    model::SynthShape s = *preset;
    if (o.n_vocab) s.n_vocab = *o.n_vocab;
    if (o.n_embd) s.n_embd = *o.n_embd;
    if (o.n_layer) s.n_layer = *o.n_layer;
    if (o.n_head) s.n_head = *o.n_head;
    if (o.n_head_kv) s.n_head_kv = *o.n_head_kv;
    else if (o.n_head && o.shape == "custom") s.n_head_kv = *o.n_head;  // plain multi-head by default
    if (o.n_ff) s.n_ff = *o.n_ff;
    if (o.n_ctx) s.n_ctx = *o.n_ctx;
    if (o.rope_base) s.rope_base = *o.rope_base;
    if (o.rms_eps) s.rms_eps = *o.rms_eps;
    if (o.arch && *o.arch != s.arch) {
        s.arch = *o.arch;
        if (s.arch != "llama" && s.tokenizer == model::SynthTokenizer::Gpt2Bpe) s.bpe_pre = "qwen2";
        if (s.arch == "gemma3" && s.sliding_window == 0) {
            s.n_head_dim = 256;
            s.sliding_window = 512;
        }
        if (s.arch != "gemma3") s.n_head_dim = s.sliding_window = 0;
    }
    if (s.arch == "qwen3moe" && !s.has_experts() && !o.n_expert) {  // qwen3moe with the preset's widths
        s.n_expert = 8;
        s.n_expert_used = 2;
    }
    if (o.n_expert) {
        s.n_expert = *o.n_expert;
        if (!o.n_expert_used) s.n_expert_used = std::min<int64_t>(s.n_expert, 2);
    }
    if (o.n_expert_used) s.n_expert_used = *o.n_expert_used;
    if (o.tokenizer) {
        if (*o.tokenizer == "llama") {
            s.tokenizer = model::SynthTokenizer::SentencePiece;
        } else if (*o.tokenizer == "gpt2") {
            s.tokenizer = model::SynthTokenizer::Gpt2Bpe;
            s.bpe_pre = s.arch == "llama" ? "llama-bpe" : "qwen2";
        } else {
            fail("synth", "unknown tokenizer '" + *o.tokenizer + "' (choose llama or gpt2)");
        }
    }
    if (o.tied) s.tied_output = true;
    if (Status st = model::check_synth_shape(s); !st) fail("synth", st.message());
    return s;
}

void run_synth(const SynthCliOptions& o) {
    const auto ftype = quant::file_type_from_name(o.type);
    if (!ftype)
        fail("synth", "unknown type '" + o.type + "' (choose one of: " +
                          join(quant::writable_file_type_names()) + ")");
    if (o.threads < 0) fail("synth", "--threads must be positive");
    model::SynthOptions opt;
    opt.shape = shape_from(o);
    opt.ftype = *ftype;
    opt.seed = o.seed;
    opt.n_threads = o.threads > 0 ? o.threads : std::max(1, int(std::thread::hardware_concurrency()));

    // The total is known only once the library has laid out the tensors.
    std::unique_ptr<ProgressBar> live;
    opt.on_progress = [&live](uint64_t done, uint64_t all) {
        if (!live) live = std::make_unique<ProgressBar>("synth", all, "params");
        live->update(done);
    };
    const auto start = std::chrono::steady_clock::now();
    auto written = model::write_synth_model(o.output, opt);
    if (live) live->finish();
    if (!written) fail("synth", written.error().message);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::error_code ec;
    const uint64_t size = std::filesystem::file_size(o.output, ec);
    std::printf("wrote %s: %s %s, %s parameters, %llu tensors, %s\n", o.output.c_str(),
                opt.shape.preset.c_str(), quant::file_type_name(uint32_t(*ftype)).value_or("?").c_str(),
                format_count(written->n_params).c_str(),
                static_cast<unsigned long long>(written->n_tensors), format_bytes(size).c_str());
    std::printf("  time: %.2f s with %d threads (%.1f M params/s)\n", seconds, opt.n_threads,
                seconds > 0 ? double(written->n_params) / seconds / 1e6 : 0.0);
}

}  // namespace

void add_synth_command(CLI::App& app) {
    auto o = std::make_shared<SynthCliOptions>();
    CLI::App* cmd = app.add_subcommand(
        "synth", "Write a random-weight GGUF model with the shape and tokenizer of a real one");
    cmd->add_option("output", o->output, "GGUF file to write")->required();
    cmd->add_option("--shape", o->shape, "Preset: " + join(model::synth_preset_names()) + " (default tiny)");
    cmd->add_option("--type", o->type,
                    "File type: " + join(quant::writable_file_type_names()) + " (default F32)");
    cmd->add_option("--seed", o->seed, "Seed of the weights (default 0)");
    cmd->add_option("-t,--threads", o->threads, "Worker threads (default: all hardware threads)");
    cmd->add_option("--n-vocab", o->n_vocab, "Vocabulary size (overrides the preset)");
    cmd->add_option("--n-embd", o->n_embd, "Model width");
    cmd->add_option("--n-layer", o->n_layer, "Number of layers");
    cmd->add_option("--n-head", o->n_head, "Attention heads");
    cmd->add_option("--n-head-kv", o->n_head_kv, "Key/value heads (grouped-query attention)");
    cmd->add_option("--n-ff", o->n_ff, "Feed-forward width");
    cmd->add_option("--n-ctx", o->n_ctx, "Context length");
    cmd->add_option("--rope-base", o->rope_base, "RoPE frequency base");
    cmd->add_option("--rms-eps", o->rms_eps, "RMSNorm epsilon");
    cmd->add_option("--arch", o->arch,
                    "Architecture: llama, qwen2 (q/k/v biases), qwen3 (per-head q/k norms), qwen3moe (qwen3 with a "
                    "mixture of experts; 8 experts, 2 used, unless --n-expert says), gemma3 (q/k norms, "
                    "post-norms, GELU FFN, sliding-window layers; head size 256, window 512 unless the preset says) "
                    "or phi3 (fused attn_qkv and gate/up)");
    cmd->add_option("--n-expert", o->n_expert,
                    "Experts of a mixture-of-experts FFN, each --n-ff wide (llama: Mixtral's layout; qwen3moe); "
                    "0: a dense FFN");
    cmd->add_option("--n-expert-used", o->n_expert_used, "Experts each token is routed to (default 2)");
    cmd->add_option("--tokenizer", o->tokenizer, "Tokenizer: llama (SentencePiece) or gpt2 (byte-level BPE)");
    cmd->add_flag("--tied", o->tied, "No output.weight: the token embedding doubles as output");
    cmd->callback([o] { run_synth(*o); });
}

}  // namespace tern::tools
