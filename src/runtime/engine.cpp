#include "runtime/engine.h"

#include <algorithm>

namespace tern::runtime {

Result<std::unique_ptr<Engine>> Engine::open(const std::string& path, const EngineOptions& options) {
    std::unique_ptr<Engine> e(new Engine());
    e->options_ = options;
    if (options.n_slots < 1 || options.n_slots > 1024)
        return Error{"n_slots must be between 1 and 1024 (got " + std::to_string(options.n_slots) + ")"};
    if (options.max_batch < 1 || options.max_batch > 65536)
        return Error{"batch size must be between 1 and 65536 (got " + std::to_string(options.max_batch) + ")"};
    if (options.n_ctx < 0 || options.n_ctx > (1 << 20))
        return Error{"context size must be between 1 and 1048576 (got " + std::to_string(options.n_ctx) + ")"};

    auto file = gguf::File::open(path);
    if (!file.ok()) return file.error();
    e->file_ = std::move(*file);

    if (options.backend == "cpu") {
        e->backend_ = backend::make_cpu_backend(options.threads);
    } else {
        return Error{"backend '" + options.backend + "' is not available in this build (available: cpu)"};
    }

    auto vocab = text::load_vocab(*e->file_);
    if (!vocab.ok()) return vocab.error();
    auto tok = text::Tokenizer::create(std::move(*vocab));
    if (!tok.ok()) return tok.error();
    e->tokenizer_ = std::move(*tok);

    auto m = model::load_model(*e->file_, *e->backend_);
    if (!m.ok()) return m.error();
    e->model_ = std::move(*m);
    if (e->tokenizer_->n_vocab() > e->model_.hp.n_vocab)
        return Error{path + ": the tokenizer has " + std::to_string(e->tokenizer_->n_vocab()) +
                     " tokens but the embedding only " + std::to_string(e->model_.hp.n_vocab) + " rows"};

    const int n_ctx = options.n_ctx > 0 ? options.n_ctx : std::min(e->model_.hp.n_ctx_train, 4096);
    const int max_batch = std::min(options.max_batch, std::max(n_ctx, 1) * options.n_slots);
    auto fwd = model::Forward::create(e->model_, *e->backend_, max_batch, options.n_slots, n_ctx);
    if (!fwd.ok()) return fwd.error();
    e->forward_ = std::move(*fwd);
    if (auto t = e->file_->get_string("tokenizer.chat_template")) e->chat_template_ = *t;
    return e;
}

}  // namespace tern::runtime
