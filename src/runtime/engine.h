// Everything needed to run one model: the mapped file, a backend with the
// weights registered, the forward pass with its KV cache, and the tokenizer.
// Entry points (run, chat, bench, perplexity, serve) open one Engine.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/gpu.h"
#include "base/result.h"
#include "gguf/gguf.h"
#include "model/forward.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace tern::runtime {

// The names EngineOptions::backend accepts, for messages: "auto, cpu or cuda".
inline constexpr const char* kBackendChoices = "auto, cpu or cuda";

inline constexpr int64_t kKvTokensFit = -1;

struct EngineOptions {
    // "cpu", "cuda", or "auto": cuda when this build has CUDA and a GPU
    // answers, else cpu. Engine::backend().name() says which was chosen.
    std::string backend = "auto";
    int gpu = 0;           // device index for the cuda backend (the first, with tp > 1)
    // Tensor-parallel ranks: with cuda, GPUs gpu .. gpu+tp-1 joined by NCCL;
    // with cpu, tp CPU ranks in one process (threads divided among them).
    int tp = 1;
    int threads = 0;       // CPU threads; 0 = all cores
    int n_ctx = 0;         // positions per sequence; 0 = the model's training context, capped at 4096
    int n_slots = 1;       // sequences held at once
    // KV positions for all sequences together, in pages of backend::kKvPageSize
    // (rounded up); at least n_ctx. 0: every sequence's whole context (each
    // slot mapped to its own pages: what a caller driving Pass::run directly
    // needs). kKvTokensFit: that, or on a GPU whose free memory does not hold
    // it, as much as it does (for a runtime::Scheduler, which maps pages as
    // sequences grow).
    int64_t kv_tokens = 0;
    int max_batch = 512;   // tokens per forward call
    // Told as weights are copied onto a device; never called for the cpu
    // backend, whose weights are the file's memory map and load at once.
    model::LoadProgress load_progress;
};

// The backend a name selects, "cpu" or "cuda", given whether this build has
// CUDA and what backend::list_gpus() reported. "auto" is cuda when the build
// has CUDA and the list holds a GPU, else cpu; "cuda" is returned even when
// it cannot run (check_gpu and make_cuda_backend say why). Unknown names are
// an error listing the accepted ones.
Result<std::string> choose_backend(const std::string& requested, bool built_with_cuda,
                                   const Result<std::vector<backend::GpuInfo>>& gpus);

// Whether GPU `index` is in what backend::list_gpus() reported; the error
// names why not (the list failed, no GPU, no such index among those found).
Status check_gpu(int index, const Result<std::vector<backend::GpuInfo>>& gpus);

class Engine {
public:
    static Result<std::unique_ptr<Engine>> open(const std::string& path, const EngineOptions& options);

    const gguf::File& file() const { return *file_; }
    const model::Model& model() const { return model_; }
    const text::Tokenizer& tokenizer() const { return *tokenizer_; }
    // The forward pass: over one backend, or over the tensor-parallel ranks.
    model::Pass& forward() { return *forward_; }
    // "cpu" or "cuda": the backend every rank runs.
    const std::string& backend_name() const { return backend_name_; }
    int tp() const { return tp_; }
    // Device memory held over every rank (weights, KV cache, workspace); 0 on the CPU.
    size_t device_bytes() const { return forward_->device_bytes(); }
    const EngineOptions& options() const { return options_; }
    int n_ctx() const { return forward_->n_ctx(); }
    int n_vocab() const { return model_.hp.n_vocab; }
    // The chat template text from the file (empty if none).
    const std::string& chat_template() const { return chat_template_; }

private:
    Engine() = default;
    EngineOptions options_;
    std::unique_ptr<gguf::File> file_;
    std::unique_ptr<backend::Backend> backend_;  // tp == 1; the ranks own theirs
    std::string backend_name_;
    int tp_ = 1;
    model::Model model_;  // tp > 1: the whole model, described; the ranks hold shards
    std::unique_ptr<model::Pass> forward_;
    std::optional<text::Tokenizer> tokenizer_;
    std::string chat_template_;
};

}  // namespace tern::runtime
