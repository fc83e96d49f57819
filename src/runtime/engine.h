// Everything needed to run one model: the mapped file, a backend with the
// weights registered, the forward pass with its KV cache, and the tokenizer.
// Entry points (run, chat, bench, perplexity, serve) open one Engine.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "base/result.h"
#include "gguf/gguf.h"
#include "model/forward.h"
#include "model/model.h"
#include "text/tokenizer.h"

namespace tern::runtime {

struct EngineOptions {
    std::string backend = "cpu";
    int threads = 0;       // CPU threads; 0 = all cores
    int n_ctx = 0;         // positions per sequence; 0 = the model's training context, capped at 4096
    int n_slots = 1;       // sequences held at once
    int max_batch = 512;   // tokens per forward call
};

class Engine {
public:
    static Result<std::unique_ptr<Engine>> open(const std::string& path, const EngineOptions& options);

    const gguf::File& file() const { return *file_; }
    const model::Model& model() const { return model_; }
    const text::Tokenizer& tokenizer() const { return *tokenizer_; }
    model::Forward& forward() { return *forward_; }
    backend::Backend& backend() { return *backend_; }
    const EngineOptions& options() const { return options_; }
    int n_ctx() const { return forward_->n_ctx(); }
    int n_vocab() const { return model_.hp.n_vocab; }
    // The chat template text from the file (empty if none).
    const std::string& chat_template() const { return chat_template_; }

private:
    Engine() = default;
    EngineOptions options_;
    std::unique_ptr<gguf::File> file_;
    std::unique_ptr<backend::Backend> backend_;
    model::Model model_;
    std::unique_ptr<model::Forward> forward_;
    std::optional<text::Tokenizer> tokenizer_;
    std::string chat_template_;
};

}  // namespace tern::runtime
