#include "runtime/engine.h"

#include <algorithm>

namespace tern::runtime {

Result<std::string> choose_backend(const std::string& requested, bool built_with_cuda,
                                   const Result<std::vector<backend::GpuInfo>>& gpus) {
    if (requested == "cpu" || requested == "cuda") return requested;
    if (requested == "auto")
        return std::string(built_with_cuda && gpus.ok() && !gpus->empty() ? "cuda" : "cpu");
    return Error{"unknown backend '" + requested + "' (choose " + kBackendChoices + ")"};
}

Status check_gpu(int index, const Result<std::vector<backend::GpuInfo>>& gpus) {
    if (!gpus.ok()) return Error{"cannot list the GPUs: " + gpus.error().message};
    if (gpus->empty()) return Error{"no CUDA GPU found on this machine"};
    if (index < 0 || size_t(index) >= gpus->size()) {
        std::string found;
        for (const backend::GpuInfo& g : *gpus)
            found += (found.empty() ? "" : ", ") + std::to_string(g.index) + ": " + g.name;
        return Error{"there is no GPU " + std::to_string(index) + " (found " + std::to_string(gpus->size()) +
                     ": " + found + ")"};
    }
    return {};
}

namespace {

// Creates the backend `options` ask for, or says why it cannot be had.
Result<std::unique_ptr<backend::Backend>> open_backend(const EngineOptions& options) {
    if (options.gpu < 0) return Error{"GPU index must be 0 or more (got " + std::to_string(options.gpu) + ")"};
    const bool cuda_built = backend::built_with_cuda();
    // Asking the driver costs a moment; only cuda and auto need the answer.
    Result<std::vector<backend::GpuInfo>> gpus = std::vector<backend::GpuInfo>{};
    if (cuda_built && options.backend != "cpu") gpus = backend::list_gpus();
    auto name = choose_backend(options.backend, cuda_built, gpus);
    if (!name.ok()) return name.error();
    if (*name == "cpu") return backend::make_cpu_backend(options.threads);
    // Without CUDA the factory's message says how to build with it.
    if (cuda_built)
        if (Status s = check_gpu(options.gpu, gpus); !s.ok()) return Error{"backend cuda: " + s.message()};
    auto be = backend::make_cuda_backend(options.gpu);
    if (!be.ok()) return Error{"backend cuda: " + be.error().message};
    return std::move(*be);
}

}  // namespace

Result<std::unique_ptr<Engine>> Engine::open(const std::string& path, const EngineOptions& options) {
    std::unique_ptr<Engine> e(new Engine());
    e->options_ = options;
    if (options.n_slots < 1 || options.n_slots > 1024)
        return Error{"n_slots must be between 1 and 1024 (got " + std::to_string(options.n_slots) + ")"};
    if (options.max_batch < 1 || options.max_batch > 65536)
        return Error{"batch size must be between 1 and 65536 (got " + std::to_string(options.max_batch) + ")"};
    if (options.n_ctx < 0 || options.n_ctx > (1 << 20))
        return Error{"context size must be between 1 and 1048576 (got " + std::to_string(options.n_ctx) + ")"};

    // The backend first: a backend that cannot be had fails before the file is read.
    auto be = open_backend(options);
    if (!be.ok()) return be.error();
    e->backend_ = std::move(*be);

    auto file = gguf::File::open(path);
    if (!file.ok()) return file.error();
    e->file_ = std::move(*file);

    auto vocab = text::load_vocab(*e->file_);
    if (!vocab.ok()) return vocab.error();
    auto tok = text::Tokenizer::create(std::move(*vocab));
    if (!tok.ok()) return tok.error();
    e->tokenizer_ = std::move(*tok);

    const bool copies_weights = e->backend_->name() != "cpu";
    auto m = model::load_model(*e->file_, *e->backend_,
                               copies_weights ? options.load_progress : model::LoadProgress{});
    e->options_.load_progress = nullptr;  // it may hold the caller's state; loading is over
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
