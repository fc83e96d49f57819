#include "runtime/engine.h"

#include <algorithm>
#include <thread>

#include "model/tensor_parallel.h"

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

// The backend `options` ask for ("cpu" or "cuda"), with the GPUs it needs
// checked, or why it cannot be had.
Result<std::string> resolve_backend(const EngineOptions& options) {
    if (options.gpu < 0) return Error{"GPU index must be 0 or more (got " + std::to_string(options.gpu) + ")"};
    if (options.tp < 1 || options.tp > 64)
        return Error{"tensor-parallel size must be between 1 and 64 (got " + std::to_string(options.tp) + ")"};
    const bool cuda_built = backend::built_with_cuda();
    // Asking the driver costs a moment; only cuda and auto need the answer.
    Result<std::vector<backend::GpuInfo>> gpus = std::vector<backend::GpuInfo>{};
    if (cuda_built && options.backend != "cpu") gpus = backend::list_gpus();
    auto name = choose_backend(options.backend, cuda_built, gpus);
    if (!name.ok()) return name.error();
    // Without CUDA the factory's message says how to build with it.
    if (*name == "cuda" && cuda_built)
        for (int i = options.gpu; i < options.gpu + options.tp; ++i)
            if (Status s = check_gpu(i, gpus); !s.ok())
                return Error{"backend cuda: " + s.message() +
                             (options.tp > 1 ? " (--tp " + std::to_string(options.tp) + " uses GPUs " +
                                                   std::to_string(options.gpu) + " to " +
                                                   std::to_string(options.gpu + options.tp - 1) + ")"
                                             : std::string())};
    return name;
}

Result<std::unique_ptr<backend::Backend>> open_backend(const std::string& name, const EngineOptions& options) {
    if (name == "cpu") return backend::make_cpu_backend(options.threads);
    auto be = backend::make_cuda_backend(options.gpu);
    if (!be.ok()) return Error{"backend cuda: " + be.error().message};
    return std::move(*be);
}

// The ranks' group and how each rank makes its backend.
struct TpSetup {
    std::shared_ptr<backend::CommGroup> group;
    model::TpForward::MakeBackend make_backend;
};

Result<TpSetup> open_tensor_parallel(const std::string& name, const EngineOptions& options) {
    TpSetup setup;
    if (name == "cpu") {
        const int threads = options.threads > 0 ? options.threads : int(std::thread::hardware_concurrency());
        const int per_rank = std::max(1, threads / options.tp);
        setup.group = backend::make_host_group(options.tp);
        setup.make_backend = [group = setup.group, per_rank](int rank) -> Result<std::unique_ptr<backend::Backend>> {
            return backend::make_cpu_backend(per_rank, group, rank);
        };
        return setup;
    }
    std::vector<int> devices;
    for (int i = 0; i < options.tp; ++i) devices.push_back(options.gpu + i);
    auto group = backend::make_nccl_group(devices);
    if (!group.ok()) return Error{"--tp " + std::to_string(options.tp) + ": " + group.error().message};
    setup.group = *group;
    setup.make_backend = [group = setup.group, devices](int rank) -> Result<std::unique_ptr<backend::Backend>> {
        auto be = backend::make_cuda_backend(devices[size_t(rank)], group, rank);
        if (!be.ok()) return Error{"backend cuda: " + be.error().message};
        return std::move(*be);
    };
    return setup;
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

    // The backend (or the ranks' group) first: one that cannot be had fails before the file is read.
    auto name = resolve_backend(options);
    if (!name.ok()) return name.error();
    e->backend_name_ = *name;
    e->tp_ = options.tp;
    TpSetup tp;
    if (options.tp == 1) {
        auto be = open_backend(*name, options);
        if (!be.ok()) return be.error();
        e->backend_ = std::move(*be);
    } else {
        auto setup = open_tensor_parallel(*name, options);
        if (!setup.ok()) return setup.error();
        tp = std::move(*setup);
    }

    auto file = gguf::File::open(path);
    if (!file.ok()) return file.error();
    e->file_ = std::move(*file);

    auto vocab = text::load_vocab(*e->file_);
    if (!vocab.ok()) return vocab.error();
    auto tok = text::Tokenizer::create(std::move(*vocab));
    if (!tok.ok()) return tok.error();
    e->tokenizer_ = std::move(*tok);

    const model::LoadProgress progress = *name != "cpu" ? options.load_progress : model::LoadProgress{};
    e->options_.load_progress = nullptr;  // it may hold the caller's state; loading is over after this
    auto described = model::describe_model(*e->file_);
    if (!described.ok()) return described.error();
    if (e->tokenizer_->n_vocab() > described->hp.n_vocab)
        return Error{path + ": the tokenizer has " + std::to_string(e->tokenizer_->n_vocab()) +
                     " tokens but the embedding only " + std::to_string(described->hp.n_vocab) + " rows"};
    const int n_ctx = options.n_ctx > 0 ? options.n_ctx : std::min(described->hp.n_ctx_train, 4096);
    const int max_batch = std::min(options.max_batch, std::max(n_ctx, 1) * options.n_slots);
    if ((options.kv_tokens < 0 && options.kv_tokens != kKvTokensFit) || options.kv_tokens > (int64_t(1) << 32))
        return Error{"the KV memory must be between 0 and 4294967296 tokens (got " +
                     std::to_string(options.kv_tokens) + ")"};
    const int kv_pages = options.kv_tokens > 0
                             ? int((options.kv_tokens + backend::kKvPageSize - 1) / backend::kKvPageSize)
                         : options.kv_tokens == kKvTokensFit ? model::kKvPagesFit
                                                             : 0;

    if (options.tp == 1) {
        auto m = model::register_model(*described, *e->backend_, progress, e->file_.get());
        if (!m.ok()) return m.error();
        e->model_ = std::move(*m);
        auto fwd = model::Forward::create(e->model_, *e->backend_, max_batch, options.n_slots, n_ctx, kv_pages);
        if (!fwd.ok()) return fwd.error();
        e->forward_ = std::move(*fwd);
    } else {
        e->model_ = std::move(*described);
        auto fwd = model::TpForward::create(e->model_, tp.group, tp.make_backend, max_batch, options.n_slots, n_ctx,
                                            progress, kv_pages);
        if (!fwd.ok()) return fwd.error();
        e->forward_ = std::move(*fwd);
    }
    if (auto t = e->file_->get_string("tokenizer.chat_template")) e->chat_template_ = *t;
    return e;
}

}  // namespace tern::runtime
