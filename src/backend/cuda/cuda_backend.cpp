// The CUDA backend: weights registered into device memory at load (q6_K
// repacked to 224-byte blocks unless TERN_CUDA_Q6K=raw), activations and the
// f16 KV cache on the device, one stream in issue order. Every operation only
// enqueues; the first CUDA error is kept and returned by take_error() at the
// sync points (download, synchronize), as the Backend contract says.
//
// Steps of up to 64 tokens are captured once per batch shape as a CUDA graph
// and replayed: set_batch() starts a step, download() ends it. A shape is
// captured on its second occurrence (the first runs eagerly, so lazy uploads
// and workspace growth never happen inside a capture); on replay the
// operations only do their host-side part (the embedding rows, the batch
// arrays, the attention tiles) and the graph runs at download().
#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/host_memory.h"
#include "backend/kv_page_table.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/nccl_group.h"
#include "backend/cuda/ops.h"
#include "quant/act_quant.h"
#include "quant/quant.h"

namespace tern::backend {
namespace {

std::string mib(size_t bytes) { return std::to_string((bytes + (1u << 19)) >> 20) + " MiB"; }

Error cuda_failure(const std::string& what, cudaError_t e) {
    return Error{"cuda: " + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")"};
}

// A registered weight's device side.
struct DeviceWeight {
    cuda::DevWeight dev;          // 2-D weights used by matmul (data null until uploaded)
    const float* vec = nullptr;   // 1-D weights as f32 on the device
    const void* host = nullptr;   // the file's bytes, for lazy upload and the embedding
    size_t host_stride = 0;       // bytes between rows there (more than a row for a column view)
    size_t file_bytes = 0;        // the rows' bytes, packed
    bool deferred = false;        // uploaded at first matmul use (the embedding table)
};

// Page-locked host memory usable from every device (tensor parallelism); a
// failed allocation leaves no error behind for a later check to find. Made
// and freed with the first backend's device current, whatever thread asks
// (a scheduler thread has none: the runtime would otherwise start a context
// on device 0, which may not be one the user chose).
// A thread whose current device is not one a backend runs on is left on the
// first backend's device afterwards: switching back would start a context
// there (cudaSetDevice does since CUDA 12).
std::atomic<int> g_pinned_device{-1};
std::atomic<uint64_t> g_backend_devices{0};  // bit d: a backend runs on device d

template <class F>
void on_pinned_device(F&& f) {
    int previous = -1;
    const int device = g_pinned_device.load();
    const bool switch_device = device >= 0 && cudaGetDevice(&previous) == cudaSuccess && previous != device;
    if (switch_device) cudaSetDevice(device);
    f();
    const bool back = switch_device && previous >= 0 && previous < 64 && (g_backend_devices.load() >> previous & 1);
    if (back) cudaSetDevice(previous);
    cudaGetLastError();
}
void* pinned_host_alloc(size_t bytes) {
    void* p = nullptr;
    on_pinned_device([&] {
        if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) p = nullptr;
    });
    return p;
}
void pinned_host_free(void* p) {
    on_pinned_device([&] { cudaFreeHost(p); });
}
constexpr PinnedMemory kPinnedHostMemory{pinned_host_alloc, pinned_host_free};

// Kernels TERN_CUDA_LEAVE_OUT can leave out of every step, to time what each
// costs inside a replayed graph, where Nsight Compute's one-at-a-time
// durations include launch costs that PDL and graphs hide (docs/cuda.md,
// bench/leave-out). The outputs are then wrong. The routing is not among
// them: without it the expert kernels would read through unset ids (leaving
// out the router's float matmul only routes by stale logits).
enum LeftOut : uint32_t {
    kLeaveRmsNorm = 1u << 0,
    kLeaveAdd = 1u << 1,
    kLeaveQuantize = 1u << 2,
    kLeaveMatmulFloat = 1u << 3,
    kLeaveMatmulInt = 1u << 4,
    kLeavePrepareAttention = 1u << 5,
    kLeaveAttention = 1u << 6,
    kLeaveExpertsGateUp = 1u << 7,
    kLeaveExpertsDown = 1u << 8,
};

constexpr std::pair<const char*, LeftOut> kLeaveOutNames[] = {
    {"rms_norm", kLeaveRmsNorm},
    {"add", kLeaveAdd},
    {"quantize", kLeaveQuantize},
    {"matmul_float", kLeaveMatmulFloat},
    {"matmul_int", kLeaveMatmulInt},
    {"prepare_attention", kLeavePrepareAttention},
    {"attention", kLeaveAttention},
    {"experts_gate_up", kLeaveExpertsGateUp},
    {"experts_down", kLeaveExpertsDown},
};

// A comma-separated list of kLeaveOutNames' names (spaces around them
// ignored) as their flags.
Result<uint32_t> parse_left_out(const std::string& list) {
    uint32_t kinds = 0;
    size_t at = 0;
    while (at <= list.size()) {
        const size_t comma = std::min(list.find(',', at), list.size());
        std::string name = list.substr(at, comma - at);
        name.erase(0, name.find_first_not_of(' '));
        name.erase(name.find_last_not_of(' ') + 1);
        if (name.empty()) return Error{"cuda: TERN_CUDA_LEAVE_OUT='" + list + "' has an empty name"};
        bool known = false;
        for (const auto& [n, k] : kLeaveOutNames)
            if (name == n) kinds |= k, known = true;
        if (!known) {
            std::string all;
            for (const auto& [n, k] : kLeaveOutNames) all += std::string(all.empty() ? "" : ", ") + n;
            return Error{"cuda: TERN_CUDA_LEAVE_OUT names '" + name + "', not a kernel it can leave out (" + all + ")"};
        }
        at = comma + 1;
    }
    return kinds;
}

class CudaBackend final : public Backend {
public:
    static Result<std::unique_ptr<Backend>> create(int device, std::shared_ptr<CommGroup> group, int rank) {
        if (group) {
            auto* nccl = dynamic_cast<NcclGroup*>(group.get());
            if (!nccl) return Error{"cuda: a " + group->kind() + " group cannot join CUDA backends"};
            if (rank < 0 || rank >= nccl->size() || nccl->device_of(rank) != device)
                return Error{"cuda: rank " + std::to_string(rank) + " of the NCCL group is not GPU " +
                             std::to_string(device)};
        }
        int n = 0;
        if (cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) return cuda_failure("no usable GPU", e);
        if (device < 0 || device >= n)
            return Error{"cuda: GPU " + std::to_string(device) + " does not exist (" + std::to_string(n) +
                         " visible)"};
        if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) return cuda_failure("cudaSetDevice", e);
        cudaDeviceProp p{};
        if (cudaError_t e = cudaGetDeviceProperties(&p, device); e != cudaSuccess)
            return cuda_failure("cudaGetDeviceProperties", e);
        if (p.major < 8)
            return Error{"cuda: GPU " + std::to_string(device) + " (" + p.name + ") has compute capability " +
                         std::to_string(p.major) + "." + std::to_string(p.minor) + "; tern needs 8.0 or newer"};
        std::unique_ptr<CudaBackend> be(new CudaBackend(device));
        be->nccl_ = std::static_pointer_cast<NcclGroup>(std::move(group));  // checked above
        be->rank_ = rank;
        if (cudaError_t e = cudaStreamCreateWithFlags(&be->stream_, cudaStreamNonBlocking); e != cudaSuccess)
            return cuda_failure("cudaStreamCreate", e);
        // Logits rows made from now on are page-locked: download() lands them
        // in one DMA (backend/host_memory.h). TERN_CUDA_PINNED_LOGITS=0: plain
        // memory, for A/B runs.
        const char* pinned = std::getenv("TERN_CUDA_PINNED_LOGITS");
        if (device < 64) g_backend_devices.fetch_or(uint64_t(1) << device);
        if (!(pinned && std::string(pinned) == "0")) {
            int none = -1;
            g_pinned_device.compare_exchange_strong(none, device);
            enable_pinned_host_memory(&kPinnedHostMemory);
        }
        const char* layout = std::getenv("TERN_CUDA_Q6K");
        be->pad_q6k_ = !(layout && std::string(layout) == "raw");
        const char* graphs = std::getenv("TERN_CUDA_GRAPHS");
        be->graphs_enabled_ = !(graphs && std::string(graphs) == "0");
        if (const char* m = std::getenv("TERN_MMQ_BATCH_MIN")) be->mmq_batch_min_ = std::atoi(m);
        if (const char* m = std::getenv("TERN_MMQ_BATCH_ROWS")) be->mmq_batch_rows_ = std::atoll(m);
        if (const char* f = std::getenv("TERN_CUDA_PREPARE_ATTENTION")) be->fused_attention_inputs_ = std::string(f) != "0";
        if (const char* f = std::getenv("TERN_CUDA_ADD_NORM")) be->joined_add_norm_ = std::string(f) != "0";
        if (const char* f = std::getenv("TERN_CUDA_MATMUL_ADD")) be->joined_matmul_add_ = std::string(f) != "0";
        if (const char* f = std::getenv("TERN_ATTN_RUN_TILES")) be->run_tiles_ = std::string(f) != "0";
        if (const char* m = std::getenv("TERN_MMVQ_PARTS"))
            be->mmvq_max_parts_ = std::clamp(std::atoi(m), 1, cuda::kMmvqMaxParts);
        if (const char* names = std::getenv("TERN_CUDA_LEAVE_OUT"); names && *names) {
            auto kinds = parse_left_out(names);
            if (!kinds.ok()) return kinds.error();
            be->left_out_ = *kinds;
            std::fprintf(stderr,
                         "cuda: TERN_CUDA_LEAVE_OUT=%s: those kernels are left out of every step, so every output "
                         "is wrong; for timing what they cost only\n",
                         names);
        }
        return std::unique_ptr<Backend>(std::move(be));
    }

    ~CudaBackend() override {
        cudaSetDevice(device_);
        if (stream_) cudaStreamSynchronize(stream_);
        for (auto& [key, g] : graphs_)
            if (g.exec) cudaGraphExecDestroy(g.exec);
        for (void* p : device_allocs_) cudaFree(p);
        for (void* p : host_allocs_) cudaFreeHost(p);
        if (stream_) cudaStreamDestroy(stream_);
    }

    std::string name() const override { return "cuda"; }
    size_t device_bytes() const override { return device_bytes_; }
    int graph_tokens() const override { return graphs_enabled_ ? int(kGraphMaxTokens) : 0; }
    uint64_t graphs_captured() const override { return graphs_captured_; }
    size_t free_device_bytes() const override {
        size_t free = 0, total = 0;
        return cudaMemGetInfo(&free, &total) == cudaSuccess ? free : 0;
    }

    // ---- memory and registration ----------------------------------------------

    // A view (some rows, or some columns of every row) is uploaded packed:
    // on the device every matrix is whole rows, one after another.
    Result<Weight> register_weight(const Weight& described) override {
        Weight w = described;
        const uint32_t type_id = uint32_t(w.type);
        const size_t packed_row = quant::row_bytes(w.type, w.cols);
        if (!w.host || packed_row == 0 || w.row_bytes < packed_row)
            return Error{"cuda: weight '" + w.name + "' has no host bytes or a row stride shorter than its row"};
        if (w.layout != WeightLayout::gguf_rows)
            return Error{"cuda: weight '" + w.name + "' is in another backend's registration layout, not the file's rows"};
        DeviceWeight& d = weights_.emplace_back();
        d.host = w.host;
        d.host_stride = w.row_bytes;
        d.file_bytes = packed_row * size_t(w.rows);
        w.impl = &d;
        if (w.rows == 1) {
            // 1-D parameters (norm scales, biases, rope factors) are f32 on the device.
            std::vector<float> f(size_t(w.cols));
            if (Status s = quant::dequantize_row(w.type, w.host, f.data(), w.cols); !s.ok())
                return Error{"tensor '" + w.name + "': " + s.message()};
            auto mem = device_alloc(f.size() * sizeof(float), w.name);
            if (!mem.ok()) return mem.error();
            if (cudaError_t e = copy_to_device(*mem, f.data(), f.size() * sizeof(float)); e != cudaSuccess)
                return cuda_failure("uploading '" + w.name + "'", e);
            d.vec = static_cast<const float*>(*mem);
            return w;
        }
        const auto wt = cuda::WType(type_id);
        const bool known = cuda::int_type(wt) || wt == cuda::WType::F32 || wt == cuda::WType::F16 ||
                           wt == cuda::WType::BF16;
        if (!known) {
            // The embedding table may be of any type: the lookup reads the file.
            // Any other matrix needs a kernel.
            if (w.name != "token_embd.weight")
                return Error{"cuda: tensor '" + w.name + "' has type " + tensor_type_name(type_id) +
                             ", which has no CUDA matmul kernel (supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, "
                             "Q5_1, Q8_0, Q4_K, Q5_K, Q6_K; use --backend cpu)"};
            d.dev.type = wt;
            d.deferred = true;
            return w;
        }
        d.dev.type = wt;
        d.dev.rows = w.rows;
        d.dev.cols = w.cols;
        d.dev.block_stride = int(tensor_type_info(type_id)->block_bytes);
        d.dev.row_stride = int64_t(packed_row);
        // The embedding table is read on the host; it goes to the GPU only if
        // it is also the output matrix (tied embeddings), at first use.
        if (w.name == "token_embd.weight") {
            d.deferred = true;
            return w;
        }
        if (Status s = upload_weight(w.name, d); !s.ok()) return Error{s.message()};
        return w;
    }

    Result<Tensor> alloc(int64_t rows, int64_t cols) override {
        if (rows < 1 || cols < 1 || rows > (int64_t(1) << 40) / cols)
            return Error{"cuda alloc: bad shape " + std::to_string(rows) + " x " + std::to_string(cols)};
        auto mem = device_alloc(size_t(rows * cols) * sizeof(float), "activations");
        if (!mem.ok()) return mem.error();
        // Every matmul input is one of these tensors: size the quantized
        // activations and the per-token arrays for the largest.
        if (cols % 32 == 0)
            if (Status s = reserve_act(rows, cols / 32); !s.ok()) return Error{s.message()};
        if (Status s = reserve_tokens(rows); !s.ok()) return Error{s.message()};
        if (Status s = reserve_embed(rows * cols); !s.ok()) return Error{s.message()};
        return Tensor{static_cast<float*>(*mem), rows, cols};
    }

    Status init_kv_cache(const KvCacheShape& s) override {
        if (s.n_layers < 1 || s.n_slots < 1 || s.n_ctx < 1 || s.n_kv_heads < 1 || s.head_dim < 1)
            return Error{"kv cache: every dimension must be positive"};
        if (s.page_size < 32 || s.page_size % 32 != 0 || s.n_pages < 0)
            return Error{"kv cache: pages of " + std::to_string(s.page_size) +
                         " positions (the attention kernels need a multiple of 32)"};
        if (!cuda::attention_supported(n_heads_hint(s), s.n_kv_heads, s.head_dim))
            return Error{"cuda: attention with " + std::to_string(n_heads_hint(s)) + " query heads, " +
                         std::to_string(s.n_kv_heads) + " KV heads and head dimension " +
                         std::to_string(s.head_dim) + " is not supported (head dimension a multiple of 32 up to 256)"};
        auto k = device_alloc(s.bytes() / 2, "the KV cache (K)");
        if (!k.ok()) return Error{k.error().message};
        auto v = device_alloc(s.bytes() / 2, "the KV cache (V)");
        if (!v.ok()) return Error{v.error().message};
        pages_.init(s);
        auto table = device_alloc(pages_.entries().size() * sizeof(int32_t), "the KV page tables");
        if (!table.ok()) return Error{table.error().message};
        kv_shape_ = s;
        k_ = static_cast<uint16_t*>(*k);
        v_ = static_cast<uint16_t*>(*v);
        pages_dev_ = static_cast<int32_t*>(*table);
        const size_t ws = cuda::attention_workspace_bytes(token_capacity_, n_heads_hint(s), s.head_dim, s.n_ctx);
        if (ws > 0) {
            auto w = device_alloc(ws, "the attention workspace");
            if (!w.ok()) return Error{w.error().message};
            attn_ws_ = static_cast<float*>(*w);
        }
        return {};
    }

    void upload(const float* host, Tensor dst) override {
        check(cudaMemcpyAsync(dst.data, host, size_t(dst.rows * dst.cols) * sizeof(float), cudaMemcpyHostToDevice,
                              stream_),
              "upload");
        check(cudaStreamSynchronize(stream_), "upload");
    }

    void download(Tensor src, float* host) override {
        finish_step();
        check(cudaMemcpyAsync(host, src.data, size_t(src.rows * src.cols) * sizeof(float), cudaMemcpyDeviceToHost,
                              stream_),
              "download");
        check(cudaStreamSynchronize(stream_), "download");
    }

    void argmax_rows(Tensor x, int32_t* host) override {
        finish_step();
        if (x.rows <= 0) return;
        if (x.rows > token_capacity_) {
            note(Error{"cuda: greedy picks of " + std::to_string(x.rows) + " rows exceed the workspace"});
            return;
        }
        cuda::argmax_rows(x.data, x.rows, x.cols, picks_dev_, stream_);
        launched("argmax_rows");
        check(cudaMemcpyAsync(picks_host_, picks_dev_, size_t(x.rows) * sizeof(int32_t), cudaMemcpyDeviceToHost,
                              stream_),
              "greedy picks");
        check(cudaStreamSynchronize(stream_), "greedy picks");
        std::memcpy(host, picks_host_, size_t(x.rows) * sizeof(int32_t));
    }

    // ---- per-batch state --------------------------------------------------------

    Status map_kv_pages(int slot, const std::vector<int32_t>& pages) override { return pages_.map(slot, pages); }

    void set_batch(const BatchLayout& layout) override {
        finish_step();
        // Before the step's capture or replay, which read the tables.
        if (pages_dev_ && pages_.take_changed())
            check(cudaMemcpyAsync(pages_dev_, pages_.entries().data(), pages_.entries().size() * sizeof(int32_t),
                                  cudaMemcpyHostToDevice, stream_),
                  "KV page tables");
        const int64_t n = int64_t(layout.pos.size());
        if (n > token_capacity_) {
            note(Error{"cuda: batch of " + std::to_string(n) + " tokens exceeds the workspace"});
            return;
        }
        std::memcpy(pos_host_, layout.pos.data(), size_t(n) * sizeof(int32_t));
        std::memcpy(slot_host_, layout.slot.data(), size_t(n) * sizeof(int32_t));
        tiles_ = {};
        attn_kind_ = cuda::AttnBatch::Decode;
        for (int64_t t = 1; t < n; ++t)
            if (layout.slot[size_t(t)] == layout.slot[size_t(t - 1)]) attn_kind_ = cuda::AttnBatch::Prefill;
        attn_few_ = cuda::attention_few_units(layout.pos.data(), n, kv_shape_.n_kv_heads, kv_shape_.n_ctx);
        begin_step(n, layout.n_logits);
        if (replaying_) return;  // the graph copies the arrays
        check(cudaMemcpyAsync(pos_dev_, pos_host_, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "batch positions");
        check(cudaMemcpyAsync(slot_dev_, slot_host_, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "batch slots");
    }

    // ---- operations -------------------------------------------------------------

    void embed(const Weight& table, const std::vector<int32_t>& tokens, Tensor out) override {
        // Rows dequantized on the host with the reference code (the CPU's
        // bits), then one copy: a token's row is 2-16 KiB, not worth a kernel.
        const auto* base = static_cast<const uint8_t*>(table.host);
        const int64_t n = int64_t(tokens.size());
        if (n * table.cols > embed_capacity_) {
            note(Error{"cuda: embedding of " + std::to_string(n) + " tokens exceeds the workspace"});
            return;
        }
        // A thread takes at least 64 rows (tens of microseconds), so a decode
        // step's rows stay on this thread: a team waits for its slowest
        // member, and on a host whose cores are busy (a server's connections)
        // that wait was milliseconds a step (LOG s12).
        constexpr int64_t kRowsPerThread = 64;
        const int threads = int(std::clamp<int64_t>(n / kRowsPerThread, 1, omp_get_max_threads()));
        Status err;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
        for (int64_t t = 0; t < n; ++t) {
            Status s = quant::dequantize_row(table.type, base + size_t(tokens[size_t(t)]) * table.row_bytes,
                                             embed_host_ + t * table.cols, table.cols);
            if (!s.ok()) {
#pragma omp critical
                err = s;
            }
        }
        if (!err.ok()) note(err);
        if (replaying_) return;  // the graph holds the copy
        check(cudaMemcpyAsync(out.data, embed_host_, size_t(n * table.cols) * sizeof(float), cudaMemcpyHostToDevice,
                              stream_),
              "embedding rows");
    }

    void rms_norm(Tensor x, const Weight& w, float eps, Tensor out) override {
        if (replaying_) return;
        if (!left_out(kLeaveRmsNorm))
            cuda::rms_norm(x.data, w ? vec(w) : nullptr, eps, out.data, x.rows, x.cols, stream_);
        launched("rms_norm");
    }

    void add_rms_norm(Tensor x, Tensor y, const Weight& w, float eps) override {
        if (!joined_add_norm_) return Backend::add_rms_norm(x, y, w, eps);
        if (replaying_) return;
        if (!left_out(kLeaveRmsNorm))
            cuda::add_rms_norm(x.data, y.data, w ? vec(w) : nullptr, eps, x.rows, x.cols, stream_);
        launched("add_rms_norm");
    }

    void matmul(const Weight& w, Tensor x, Tensor y, const Weight* bias) override {
        matmul_shared(x, {{&w, y, bias}});
    }

    // The integer-kernel matrices share one quantization of x, made again
    // only when a matrix needs the other activation group (K-quants next to
    // legacy types). Consecutive matrices that take mmvq with the same type
    // and layout run as one launch over all their rows (q, k and v; gate and
    // up); the biases are added after every product.
    void matmul_shared(Tensor x, std::initializer_list<MatmulTarget> targets) override {
        if (replaying_) return;
        const int64_t n = x.rows;
        cuda::DevAct a{act_qs_, act_d_, act_sum_, x.cols / 32, 0, act_sum_split_};  // group 0: x not quantized yet
        cuda::MatmulPart run[cuda::kMmvqMaxParts];
        int n_run = 0;
        auto flush = [&] {
            if (n_run > 0 && !left_out(kLeaveMatmulInt)) cuda::mmvq_parts(run, n_run, a, int(n), stream_);
            n_run = 0;
        };
        for (const MatmulTarget& t : targets) {
            auto& d = *static_cast<DeviceWeight*>(t.w->impl);
            if (Status s = ensure_on_device(*t.w, d); !s.ok()) return note(s);
            if (!cuda::int_type(d.dev.type)) {
                if (!left_out(kLeaveMatmulFloat)) cuda::matmul_float(d.dev, x.data, n, t.y.data, stream_);
                continue;
            }
            if (const int group = cuda::act_group(d.dev.type); a.group != group) {
                flush();  // the pending parts read the current quantization
                a.group = group;
                if (!left_out(kLeaveQuantize)) cuda::quantize_act(x.data, x.cols, n, x.cols, a, stream_);
            }
            const IntKernel kernel = int_kernel(d.dev, n);
            if (left_out(kLeaveMatmulInt) && kernel != IntKernel::mmvq) continue;  // mmvq's parts: at flush
            switch (kernel) {
                case IntKernel::mmq_batch: cuda::mmq_batch(d.dev, a, int(n), t.y.data, t.y.cols, stream_); continue;
                case IntKernel::mmq: cuda::mmq(d.dev, a, n, t.y.data, t.y.cols, stream_); continue;
                case IntKernel::mmvq: break;  // joins the pending parts below
            }
            if (n_run > 0 && (n_run == mmvq_max_parts_ || !cuda::mmvq_parts_compatible(run[0].w, d.dev))) flush();
            run[n_run++] = cuda::MatmulPart{d.dev, t.y.data, t.y.cols};
        }
        flush();
        for (const MatmulTarget& t : targets)
            if (t.bias) cuda::add_bias(t.y.data, vec(*t.bias), n, t.y.cols, stream_);
        launched("matmul");
    }

    // At decode (mmvq), the product added to y as it is written: the bits of
    // matmul then add, without the add's launch.
    void matmul_add(const Weight& w, Tensor x, Tensor y, Tensor scratch) override {
        auto& d = *static_cast<DeviceWeight*>(w.impl);
        if (Status s = ensure_on_device(w, d); !s.ok()) return note(s);
        if (!joined_matmul_add_ || left_out(kLeaveAdd) || !cuda::int_type(d.dev.type) ||
            int_kernel(d.dev, x.rows) != IntKernel::mmvq)
            return Backend::matmul_add(w, x, y, scratch);
        if (replaying_) return;
        const cuda::DevAct a = quantized_for(d.dev, x);
        if (left_out(kLeaveMatmulInt)) return;  // the product and its add are one kernel here
        const cuda::MatmulPart part{d.dev, y.data, y.cols, /*add=*/true};
        cuda::mmvq_parts(&part, 1, a, int(x.rows), stream_);
        launched("matmul_add");
    }

    // The integer kernel for n tokens: the K-quants' decode-batch kernel from
    // its crossover with mmvq to its limit, else mmvq up to 8 and mmq beyond.
    // All give the same bits (kernels.h). The crossovers are the sandbox's
    // (bench/cuda/matmul on an H200, docs/perf/LOG.md g32): q4_K from 3
    // tokens, q6_K from 4. Past 32 tokens a matrix of many rows fills the GPU
    // with mmq's tiles, which then win (g34: from 40 tokens, 54 against 58
    // us for 11,008 rows, 117 against 143 for 32,000), unless mmq_batch
    // streams them (g43: q4_K at 11,008 rows and 64 tokens 47 us against
    // mmq's 54, and the 7B step at 64 sequences +5.8% against mmq for them).
    enum class IntKernel { mmq_batch, mmvq, mmq };
    IntKernel int_kernel(const cuda::DevWeight& w, int64_t n) const {
        const int64_t from = mmq_batch_min_ > 0 ? mmq_batch_min_ : w.type == cuda::WType::Q6_K ? 4 : 3;
        const bool many_rows = n > 32 && w.rows > mmq_batch_rows_ && !cuda::mmq_batch_streams(w, int(n));
        if (cuda::mmq_batch_type(w.type) && n >= from && n <= cuda::kMmqBatchMaxTokens && !many_rows)
            return IntKernel::mmq_batch;
        return n <= cuda::kMmvqMaxTokens ? IntKernel::mmvq : IntKernel::mmq;
    }

    void rope(Tensor x, int n_heads, int head_dim, const RopeParams& rope) override {
        if (replaying_) return;
        cuda::rope(x.data, x.rows, pos_dev_, rope_args(n_heads, head_dim, rope), stream_);
        launched("rope");
    }

    void prepare_attention(int layer, const AttentionInputs& in, const RopeParams& rope) override {
        if (replaying_) return;
        const cuda::RopeArgs r = rope_args(in.n_heads, in.head_dim, rope);
        if (!fused_attention_inputs_ || !cuda::prepare_attention_supported(kv_shape_.head_dim, r) ||
            in.head_dim != kv_shape_.head_dim || in.n_kv_heads != kv_shape_.n_kv_heads)
            return Backend::prepare_attention(layer, in, rope);
        const cuda::HeadNorms norms{in.q_norm ? vec(*in.q_norm) : nullptr, in.k_norm ? vec(*in.k_norm) : nullptr,
                                    in.norm_eps};
        if (!left_out(kLeavePrepareAttention))
            cuda::prepare_attention(kv_layer(layer), in.q.data, in.k.data, in.v.data, in.q.rows, in.n_heads, norms,
                                    r, slot_dev_, pos_dev_, stream_);
        launched("prepare_attention");
    }

    void kv_store(int layer, Tensor k, Tensor v) override {
        if (replaying_) return;
        cuda::kv_store(kv_layer(layer), k.data, v.data, k.rows, slot_dev_, pos_dev_, stream_);
        launched("kv_store");
    }

    void attention(int layer, Tensor q, int n_heads, float scale, int window, Tensor out) override {
        if (q.rows > token_capacity_) return;  // set_batch refused a batch too large
        const cuda::KvLayer kv = kv_layer(layer);
        const int tile_tokens = cuda::attention_tile_tokens(n_heads, kv.n_kv_heads, kv.head_dim, kv.n_ctx, window,
                                                            q.rows, attn_kind_, attn_ws_ != nullptr);
        // Only batches past 16 tokens that are not a token per sequence tile
        // by runs (else uniform tiles: the same bits, a pass per sequence in a tile).
        const cuda::AttnTiles tiles =
            tile_tokens > 0 && run_tiles_ ? step_tiles(q.rows, tile_tokens) : cuda::AttnTiles{};
        if (replaying_ || left_out(kLeaveAttention)) return;
        cuda::attention(kv, q.data, q.rows, n_heads, scale, window, slot_dev_, pos_dev_, out.data, attn_ws_,
                        attn_kind_, stream_, tiles, attn_few_);
        launched("attention");
    }

    // The step's attention tiles of tile_tokens tokens (cuda::attention_tiles),
    // made once a step and length, on the device before the kernel that reads
    // them. In a graph the grid is fixed at capture, so there the table has a
    // tile per token, as many as a step of n tokens can have: the step's own,
    // then empty ones (starting at n) that leave at once; it is made on the
    // host at capture and at each replay, and the graph copies it.
    cuda::AttnTiles step_tiles(int64_t n, int tile_tokens) {
        if (tiles_.tile_tokens == tile_tokens) return tiles_;
        const bool in_graph = capturing_ || replaying_;
        if (tiles_.tile_tokens != 0) {
            // Another length in the same step: the pending copy of the last
            // table must leave the host buffer before it is rewritten. A
            // capture cannot wait for that: uniform tiles, the same bits.
            if (in_graph) return {};
            check(cudaStreamSynchronize(stream_), "attention tiles");
        }
        int64_t count = cuda::attention_tiles(slot_host_, n, tile_tokens, tiles_host_);
        if (in_graph) {
            std::fill(tiles_host_ + count + 1, tiles_host_ + n + 1, int32_t(n));
            count = n;
        }
        if (!replaying_)
            check(cudaMemcpyAsync(tiles_dev_, tiles_host_, size_t(count + 1) * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  stream_),
                  "attention tiles");
        tiles_ = {tiles_dev_, count, tile_tokens};
        return tiles_;
    }

    void swiglu(Tensor gate, Tensor up) override {
        if (replaying_) return;
        cuda::swiglu(gate.data, up.data, gate.rows * gate.cols, stream_);
        launched("swiglu");
    }

    void geglu(Tensor gate, Tensor up) override {
        if (replaying_) return;
        cuda::geglu(gate.data, up.data, gate.rows * gate.cols, stream_);
        launched("geglu");
    }

    void scale(Tensor x, float s) override {
        if (replaying_) return;
        cuda::scale(x.data, s, x.rows * x.cols, stream_);
        launched("scale");
    }

    void add(Tensor x, Tensor y) override {
        if (replaying_) return;
        if (!left_out(kLeaveAdd)) cuda::add(x.data, y.data, x.rows * x.cols, stream_);
        launched("add");
    }

    void gather_rows(Tensor x, const std::vector<int32_t>& rows, Tensor out) override {
        const int64_t n = int64_t(rows.size());
        if (n > token_capacity_) {
            note(Error{"cuda: gather of " + std::to_string(n) + " rows exceeds the workspace"});
            return;
        }
        std::memcpy(rows_host_, rows.data(), size_t(n) * sizeof(int32_t));
        if (replaying_) return;
        check(cudaMemcpyAsync(rows_dev_, rows_host_, size_t(n) * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
              "gather rows");
        cuda::gather_rows(x.data, x.cols, rows_dev_, n, out.data, stream_);
        launched("gather_rows");
    }

    // ---- mixture of experts ----
    // The routing lives on the device: ids and weights per routed row, and
    // for prefill-sized batches their grouping by expert (one small kernel,
    // shared by the layer's three expert matmuls). Decode-sized batches run
    // each routed row as its own mat-vec, reading only the chosen experts.

    void route_experts(Tensor logits, int k) override {
        const int64_t n = logits.rows, n_pairs = n * k;
        if (k < 1 || k > logits.cols || logits.cols > kMaxExperts)
            return note(Error{"route_experts: " + std::to_string(k) + " of " + std::to_string(logits.cols) +
                              " experts cannot be routed (1 <= k <= experts <= " + std::to_string(kMaxExperts) + ")"});
        route_tokens_ = n;
        route_k_ = k;
        route_n_expert_ = int(logits.cols);
        if (replaying_) return;
        if (Status s = reserve_routing(n_pairs, route_n_expert_); !s.ok()) return note(s);
        cuda::route_experts(logits.data, n, route_n_expert_, k, route_ids_, route_w_, stream_);
        if (n > cuda::kMmvqMaxTokens) cuda::group_experts(route_ids_, n_pairs, route_n_expert_, route_groups_, stream_);
        launched("route_experts");
    }

    // Whether an input x (a row per token or per routed row), a set of
    // n_experts and an output of y_rows fit the current routing; if not, the
    // error is noted.
    bool fits_routing(const char* op, int64_t x_rows, size_t n_experts, int64_t y_rows) {
        const int64_t n_pairs = route_tokens_ * route_k_;
        if (n_pairs > 0 && (x_rows == n_pairs || x_rows * route_k_ == n_pairs) && y_rows == n_pairs &&
            n_experts == size_t(route_n_expert_))
            return true;
        note(Error{std::string(op) + ": " + std::to_string(x_rows) + " input rows and " + std::to_string(n_experts) +
                   " experts do not match the routing of " + std::to_string(route_tokens_) + " tokens over " +
                   std::to_string(route_n_expert_)});
        return false;
    }

    void matmul_experts(const std::vector<Weight>& experts, Tensor x, Tensor y) override {
        matmul_experts_shared(x, {{&experts, y}});
    }

    // The integer-kernel sets share one quantization of x, as in matmul_shared.
    void matmul_experts_shared(Tensor x, std::initializer_list<ExpertTarget> targets) override {
        const int64_t n_pairs = route_tokens_ * route_k_;
        cuda::DevAct a{act_qs_, act_d_, act_sum_, x.cols / 32, 0, act_sum_split_};  // group 0: x not quantized yet
        for (const ExpertTarget& t : targets) {
            const std::vector<Weight>& experts = *t.experts;
            const Tensor y = t.y;
            if (!fits_routing("matmul_experts", x.rows, experts.size(), y.rows)) return;
            if (replaying_) continue;
            auto table = expert_table(experts);
            if (!table.ok()) return note(table.error());
            const cuda::DevWeight& w = dev(experts[0]);
            const int per = x.rows == n_pairs ? 1 : route_k_;
            if (cuda::int_type(w.type)) {
                if (const int group = cuda::act_group(w.type); a.group != group) {
                    a.group = group;
                    if (!left_out(kLeaveQuantize)) cuda::quantize_act(x.data, x.cols, x.rows, x.cols, a, stream_);
                }
                if (route_tokens_ <= cuda::kMmvqMaxTokens)
                    cuda::mmvq_experts(*table, w, a, route_ids_, n_pairs, per, y.data, y.cols, stream_);
                else
                    cuda::mmq_experts(*table, w, a, route_groups_, n_pairs, route_n_expert_, per, y.data, y.cols,
                                      stream_);
            } else {
                cuda::matmul_float_experts(*table, w, x.data, route_ids_, n_pairs, per, y.data, stream_);
            }
        }
        launched("matmul_experts");
    }

    // At decode, with integer weights: gate and up of a routed row in one
    // warp and its SwiGLU in the same pass (mmvq_experts_swiglu, the bits of
    // the two matmuls and swiglu); otherwise those three steps.
    void matmul_experts_swiglu(Tensor x, const std::vector<Weight>& gate_exps, const std::vector<Weight>& up_exps,
                               Tensor gate, Tensor up) override {
        const int64_t n_pairs = route_tokens_ * route_k_;
        // One shape for both sets: the kernel reads them through one DevWeight.
        const bool fused = route_tokens_ <= cuda::kMmvqMaxTokens && !gate_exps.empty() && !up_exps.empty() &&
                           cuda::int_type(dev(gate_exps[0]).type) &&
                           cuda::mmvq_parts_compatible(dev(gate_exps[0]), dev(up_exps[0])) &&
                           dev(gate_exps[0]).rows == dev(up_exps[0]).rows &&
                           dev(gate_exps[0]).row_stride == dev(up_exps[0]).row_stride;
        if (!fused) return Backend::matmul_experts_swiglu(x, gate_exps, up_exps, gate, up);
        if (!fits_routing("matmul_experts_swiglu", x.rows, gate_exps.size(), gate.rows) ||
            !fits_routing("matmul_experts_swiglu", x.rows, up_exps.size(), up.rows))
            return;
        if (replaying_) return;
        auto gate_table = expert_table(gate_exps);
        if (!gate_table.ok()) return note(gate_table.error());
        auto up_table = expert_table(up_exps);
        if (!up_table.ok()) return note(up_table.error());
        const cuda::DevWeight& w = dev(gate_exps[0]);
        // The quantization stays when the kernel is left out: `quantize` is a kind of its own.
        const cuda::DevAct a = quantized_for(w, x);
        if (left_out(kLeaveExpertsGateUp)) return;
        cuda::mmvq_experts_swiglu(*gate_table, *up_table, w, a, route_ids_, n_pairs, x.rows == n_pairs ? 1 : route_k_,
                                  gate.data, gate.cols, stream_);
        launched("matmul_experts_swiglu");
    }

    void combine_experts(Tensor y, Tensor out) override {
        if (y.rows != route_tokens_ * route_k_ || out.rows != route_tokens_ || out.cols != y.cols)
            return note(Error{"combine_experts: shapes do not match the routing"});
        if (replaying_) return;
        cuda::combine_experts(y.data, route_w_, out.rows, route_k_, out.cols, out.data, stream_);
        launched("combine_experts");
    }

    // At decode, with integer weights: a token's k routed rows and their
    // weighted combine in one pass (mmvq_experts_combine, the bits of
    // matmul_experts then combine_experts; y is not written).
    void matmul_experts_combine(const std::vector<Weight>& experts, Tensor x, Tensor y, Tensor out) override {
        if (!combine_in_one_pass(experts, x)) return Backend::matmul_experts_combine(experts, x, y, out);
        experts_combine(experts, x, y, out, /*add=*/false);
    }

    // At decode, the combine added to out as it is written (the bits of the
    // combine then add).
    void matmul_experts_combine_add(const std::vector<Weight>& experts, Tensor x, Tensor y, Tensor out,
                                    Tensor scratch) override {
        if (!joined_matmul_add_ || left_out(kLeaveAdd) || !combine_in_one_pass(experts, x))
            return Backend::matmul_experts_combine_add(experts, x, y, out, scratch);
        experts_combine(experts, x, y, out, /*add=*/true);
    }

    bool combine_in_one_pass(const std::vector<Weight>& experts, Tensor x) const {
        return route_tokens_ <= cuda::kMmvqMaxTokens && !experts.empty() && x.rows == route_tokens_ * route_k_ &&
               cuda::int_type(dev(experts[0]).type);
    }

    // mmvq_experts_combine into out (or added to it), after the checks of the
    // two calls it stands for, y's included (it is not written).
    void experts_combine(const std::vector<Weight>& experts, Tensor x, Tensor y, Tensor out, bool add) {
        if (!fits_routing("matmul_experts_combine", x.rows, experts.size(), y.rows)) return;
        if (out.rows != route_tokens_ || out.cols != y.cols || out.cols != experts[0].rows)
            return note(Error{"matmul_experts_combine: an output of " + std::to_string(out.rows) + " x " +
                              std::to_string(out.cols) + " does not match the routing of " +
                              std::to_string(route_tokens_) + " tokens and experts of " +
                              std::to_string(experts[0].rows) + " rows"});
        if (replaying_) return;
        auto table = expert_table(experts);
        if (!table.ok()) return note(table.error());
        const cuda::DevWeight& w = dev(experts[0]);
        const cuda::DevAct a = quantized_for(w, x);
        if (left_out(kLeaveExpertsDown)) return;
        cuda::mmvq_experts_combine(*table, w, a, route_ids_, route_w_, route_tokens_, route_k_,
                                   out.data, out.cols, stream_, add);
        launched(add ? "matmul_experts_combine_add" : "matmul_experts_combine");
    }

    void all_reduce_sum(Tensor x) override {
        if (!nccl_) return note(Error{"cuda: all_reduce_sum on a backend that is not in an NCCL group"});
        if (replaying_) return;  // the graph holds the collective
        if (Status s = nccl_->all_reduce_sum(rank_, x.data, size_t(x.rows * x.cols), stream_); !s.ok()) note(s);
    }

    void synchronize() override {
        finish_step();
        check(cudaStreamSynchronize(stream_), "synchronize");
    }

    Status take_error() override {
        Status s = std::move(error_);
        error_ = {};
        return s;
    }

private:
    explicit CudaBackend(int device) : device_(device) {}

    // ---- error bookkeeping ----
    void note(const Status& s) {
        if (error_.ok()) error_ = s;
    }
    void check(cudaError_t e, const char* what) {
        if (e != cudaSuccess) note(cuda_failure(what, e));
    }
    void launched(const char* what) { check(cudaGetLastError(), what); }

    // ---- memory ----
    Result<void*> device_alloc(size_t bytes, const std::string& what) {
        void* p = nullptr;
        if (cudaError_t e = cudaMalloc(&p, bytes == 0 ? 1 : bytes); e != cudaSuccess) {
            cudaGetLastError();  // an allocation failure is not sticky; clear it
            size_t free_b = 0, total_b = 0;
            cudaMemGetInfo(&free_b, &total_b);
            return Error{"cuda: out of memory on GPU " + std::to_string(device_) + " allocating " + mib(bytes) +
                         " for " + what + " (" + mib(free_b) + " free of " + mib(total_b) + "; " +
                         mib(device_bytes_) + " already held by tern)"};
        }
        device_allocs_.push_back(p);
        device_bytes_ += bytes;
        return p;
    }
    Result<void*> host_alloc(size_t bytes, const std::string& what) {
        void* p = nullptr;
        if (cudaError_t e = cudaMallocHost(&p, bytes == 0 ? 1 : bytes); e != cudaSuccess) {
            cudaGetLastError();
            return Error{"cuda: cannot allocate " + mib(bytes) + " of pinned host memory for " + what};
        }
        host_allocs_.push_back(p);
        return p;
    }

    // The embedding table (or a matrix of a type without kernels) is uploaded
    // at its first matmul, never inside a graph capture: the first step of a
    // shape runs eagerly.
    Status ensure_on_device(const Weight& w, DeviceWeight& d) {
        if (!d.deferred || d.dev.data) return {};
        if (!cuda::int_type(d.dev.type) && d.dev.type != cuda::WType::F32 && d.dev.type != cuda::WType::F16 &&
            d.dev.type != cuda::WType::BF16)
            return Error{"cuda: tensor '" + w.name + "' has type " + tensor_type_name(uint32_t(w.type)) +
                         ", which has no CUDA matmul kernel (use --backend cpu)"};
        if (capturing_) return Error{"cuda: internal error: first use of '" + w.name + "' inside a graph capture"};
        return upload_weight(w.name, d);
    }

    // A copy from pageable host memory, complete on return. On our stream, not
    // the legacy one: a plain cudaMemcpy may return before its DMA lands, and the
    // legacy stream does not order against a non-blocking stream.
    cudaError_t copy_to_device(void* dst, const void* src, size_t bytes) {
        cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_);
        return e == cudaSuccess ? cudaStreamSynchronize(stream_) : e;
    }
    // The same for a weight's rows, packed on the device.
    cudaError_t copy_rows_to_device(void* dst, const DeviceWeight& d) {
        const size_t row = d.file_bytes / size_t(d.dev.rows);
        if (d.host_stride == row) return copy_to_device(dst, d.host, d.file_bytes);
        cudaError_t e = cudaMemcpy2DAsync(dst, row, d.host, d.host_stride, row, size_t(d.dev.rows),
                                          cudaMemcpyHostToDevice, stream_);
        return e == cudaSuccess ? cudaStreamSynchronize(stream_) : e;
    }

    Status upload_weight(const std::string& name, DeviceWeight& d) {
        const bool pad = d.dev.type == cuda::WType::Q6_K && pad_q6k_;
        const int64_t blocks = int64_t(d.file_bytes) / int64_t(tensor_type_info(uint32_t(d.dev.type))->block_bytes);
        const size_t bytes = pad ? size_t(blocks) * 224 : d.file_bytes;
        auto mem = device_alloc(bytes, "weight '" + name + "'");
        if (!mem.ok()) return Error{mem.error().message};
        if (!pad) {
            if (cudaError_t e = copy_rows_to_device(*mem, d); e != cudaSuccess)
                return cuda_failure("uploading '" + name + "'", e);
        } else {
            // Upload raw through a scratch buffer, repack on the device.
            void* raw = nullptr;
            if (cudaError_t e = cudaMalloc(&raw, d.file_bytes); e != cudaSuccess) {
                cudaGetLastError();
                return Error{"cuda: out of memory repacking '" + name + "' (" + mib(d.file_bytes) + ")"};
            }
            cudaError_t e = copy_rows_to_device(raw, d);
            if (e == cudaSuccess) {
                cuda::pad_q6_K(static_cast<const uint8_t*>(raw), static_cast<uint8_t*>(*mem), blocks, stream_);
                e = cudaGetLastError();
                if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
            }
            cudaFree(raw);
            if (e != cudaSuccess) return cuda_failure("repacking '" + name + "'", e);
            d.dev.block_stride = 224;
            d.dev.row_stride = (d.dev.cols / 256) * 224;
        }
        d.dev.data = static_cast<const uint8_t*>(*mem);
        return {};
    }

    // rows of blocks_per_row blocks: their planes and their split sums. The
    // buffers only grow: a tensor that fitted before still fits, whichever
    // count grew.
    Status reserve_act(int64_t rows, int64_t blocks_per_row) {
        const int64_t need_blocks = rows * blocks_per_row, need_split = rows * quant::split_sum_count(blocks_per_row);
        if (need_blocks <= act_blocks_ && need_split <= act_split_) return {};
        const int64_t blocks = std::max(need_blocks, act_blocks_), split_count = std::max(need_split, act_split_);
        auto qs = device_alloc(size_t(blocks) * 32, "quantized activations");
        if (!qs.ok()) return Error{qs.error().message};
        auto d = device_alloc(size_t(blocks) * sizeof(float), "activation scales");
        if (!d.ok()) return Error{d.error().message};
        auto s = device_alloc(size_t(blocks) * sizeof(int32_t), "activation sums");
        if (!s.ok()) return Error{s.error().message};
        auto split = device_alloc(size_t(split_count) * sizeof(uint16_t), "activation sums (split)");
        if (!split.ok()) return Error{split.error().message};
        act_qs_ = static_cast<int8_t*>(*qs);
        act_d_ = static_cast<float*>(*d);
        act_sum_ = static_cast<int32_t*>(*s);
        act_sum_split_ = static_cast<uint16_t*>(*split);
        act_blocks_ = blocks;
        act_split_ = split_count;
        return {};
    }

    Status reserve_tokens(int64_t n) {
        if (n <= token_capacity_) return {};
        // positions, slots, gathered rows and greedy picks: n each; attention tiles: n + 1
        const size_t ints = size_t(n) * 5 + 1;
        auto pos = device_alloc(ints * sizeof(int32_t), "batch arrays");
        if (!pos.ok()) return Error{pos.error().message};
        auto host = host_alloc(ints * sizeof(int32_t), "batch arrays");
        if (!host.ok()) return Error{host.error().message};
        pos_dev_ = static_cast<int32_t*>(*pos);
        slot_dev_ = pos_dev_ + n;
        rows_dev_ = slot_dev_ + n;
        tiles_dev_ = rows_dev_ + n;
        picks_dev_ = tiles_dev_ + n + 1;
        pos_host_ = static_cast<int32_t*>(*host);
        slot_host_ = pos_host_ + n;
        rows_host_ = slot_host_ + n;
        tiles_host_ = rows_host_ + n;
        picks_host_ = tiles_host_ + n + 1;
        token_capacity_ = n;
        return {};
    }

    Status reserve_embed(int64_t floats) {
        if (floats <= embed_capacity_) return {};
        auto host = host_alloc(size_t(floats) * sizeof(float), "embedding rows");
        if (!host.ok()) return Error{host.error().message};
        embed_host_ = static_cast<float*>(*host);
        embed_capacity_ = floats;
        return {};
    }

    // The routing's device arrays, grown (never inside a capture: a shape's
    // first step runs eagerly) to the largest batch seen.
    Status reserve_routing(int64_t n_pairs, int n_expert) {
        const int64_t tiles = cuda::expert_max_tiles(n_pairs, n_expert);
        if (n_pairs <= route_pair_capacity_ && tiles <= route_tile_capacity_) return {};
        if (capturing_) return Error{"cuda: internal error: the routing grows inside a graph capture"};
        const int64_t pairs = std::max(n_pairs, route_pair_capacity_);
        const int64_t tile_cap = std::max(tiles, route_tile_capacity_);
        auto ints = device_alloc(size_t(2 * pairs + 2 * kMaxExperts + 1) * sizeof(int32_t), "the expert routing");
        if (!ints.ok()) return Error{ints.error().message};
        auto w = device_alloc(size_t(pairs) * sizeof(float), "the expert weights");
        if (!w.ok()) return Error{w.error().message};
        auto t = device_alloc(size_t(tile_cap) * sizeof(int2), "the expert tiles");
        if (!t.ok()) return Error{t.error().message};
        route_ids_ = static_cast<int32_t*>(*ints);
        route_groups_.pairs = route_ids_ + pairs;
        route_groups_.start = route_groups_.pairs + pairs;
        route_groups_.count = route_groups_.start + kMaxExperts + 1;
        route_groups_.tiles = static_cast<int2*>(*t);
        route_w_ = static_cast<float*>(*w);
        route_pair_capacity_ = pairs;
        route_tile_capacity_ = tile_cap;
        return {};
    }

    // The device array of an expert set's matrices, made at its first use
    // (outside any capture, as above) and kept by its first expert's handle.
    Result<const uint8_t* const*> expert_table(const std::vector<Weight>& experts) {
        const void* key = experts[0].impl;
        if (auto it = expert_tables_.find(key); it != expert_tables_.end()) return it->second;
        if (capturing_) return Error{"cuda: internal error: first use of an expert set inside a graph capture"};
        const DeviceWeight& d0 = *static_cast<const DeviceWeight*>(experts[0].impl);
        std::vector<const uint8_t*> ptrs;
        for (const Weight& e : experts) {
            auto& d = *static_cast<DeviceWeight*>(e.impl);
            if (d.dev.type != d0.dev.type || d.dev.rows != d0.dev.rows || d.dev.cols != d0.dev.cols ||
                d.dev.block_stride != d0.dev.block_stride || !d.dev.data)
                return Error{"cuda: expert '" + e.name + "' differs in type or shape from '" + experts[0].name + "'"};
            ptrs.push_back(d.dev.data);
        }
        auto mem = device_alloc(ptrs.size() * sizeof(const uint8_t*), "an expert table");
        if (!mem.ok()) return mem.error();
        if (cudaError_t e = copy_to_device(*mem, ptrs.data(), ptrs.size() * sizeof(const uint8_t*)); e != cudaSuccess)
            return cuda_failure("uploading an expert table", e);
        return expert_tables_[key] = static_cast<const uint8_t* const*>(*mem);
    }

    static int n_heads_hint(const KvCacheShape& s) { return s.n_heads > 0 ? s.n_heads : s.n_kv_heads; }

    // The rope kernels' arguments for heads of x.
    cuda::RopeArgs rope_args(int n_heads, int head_dim, const RopeParams& rope) {
        cuda::RopeArgs r;
        r.n_heads = n_heads;
        r.head_dim = head_dim;
        r.n_dims = rope.n_dims;
        r.neox = rope.neox;
        r.freq_base = rope.freq_base;
        r.freq_scale = rope.freq_scale;
        r.attn_factor = rope.attn_factor;
        r.freq_factors = rope.freq_factors ? vec(*rope.freq_factors) : nullptr;
        r.inv_freq = inv_freq_table(rope);
        return r;
    }

    // The rotary inverse frequencies, computed on the host exactly as the CPU
    // backend computes them, uploaded once per RoPE configuration.
    const double* inv_freq_table(const RopeParams& rope) {
        // One table per distinct RoPE (Gemma 3's sliding and global layers have two),
        // made on first use, before any capture replays it.
        const auto key = std::make_tuple(rope.n_dims, rope.freq_base, rope.freq_factors ? rope.freq_factors->host : nullptr);
        if (auto it = inv_freq_.find(key); it != inv_freq_.end()) return it->second;
        if (capturing_) return nullptr;  // never allocate inside a capture; the kernel computes them
        const int half = rope.n_dims / 2;
        std::vector<double> inv(size_t(half > 0 ? half : 1));
        std::vector<float> factors;
        if (rope.freq_factors) {
            factors.resize(size_t(rope.freq_factors->cols));
            if (!quant::dequantize_row(rope.freq_factors->type, rope.freq_factors->host, factors.data(),
                                       rope.freq_factors->cols).ok() ||
                rope.freq_factors->cols < half)
                return nullptr;
        }
        for (int i = 0; i < half; ++i) {
            inv[size_t(i)] = std::pow(double(rope.freq_base), -2.0 * i / double(rope.n_dims));
            if (rope.freq_factors) inv[size_t(i)] /= double(factors[size_t(i)]);
        }
        auto mem = device_alloc(inv.size() * sizeof(double), "rotary frequencies");
        if (!mem.ok() || copy_to_device(*mem, inv.data(), inv.size() * sizeof(double)) != cudaSuccess) return nullptr;
        return inv_freq_[key] = static_cast<const double*>(*mem);
    }

    const float* vec(const Weight& w) const { return static_cast<const DeviceWeight*>(w.impl)->vec; }
    static const cuda::DevWeight& dev(const Weight& w) { return static_cast<const DeviceWeight*>(w.impl)->dev; }

    // x quantized as w's integer kernels read it, in the activation workspace.
    cuda::DevAct quantized_for(const cuda::DevWeight& w, Tensor x) {
        const cuda::DevAct a{act_qs_, act_d_, act_sum_, x.cols / 32, cuda::act_group(w.type), act_sum_split_};
        if (!left_out(kLeaveQuantize)) cuda::quantize_act(x.data, x.cols, x.rows, x.cols, a, stream_);
        return a;
    }

    cuda::KvLayer kv_layer(int layer) const {
        const KvCacheShape& s = kv_shape_;
        const size_t per_layer =
            size_t(s.pool_pages()) * size_t(s.page_size) * size_t(s.n_kv_heads) * size_t(s.head_dim);
        cuda::KvLayer kv;
        kv.k = k_ + size_t(layer) * per_layer;
        kv.v = v_ + size_t(layer) * per_layer;
        kv.pages = pages_dev_;
        kv.page_size = s.page_size;
        kv.pages_per_slot = s.pages_per_slot();
        kv.n_slots = s.n_slots;
        kv.n_ctx = s.n_ctx;
        kv.n_kv_heads = s.n_kv_heads;
        kv.head_dim = s.head_dim;
        return kv;
    }

    // ---- CUDA graphs -------------------------------------------------------------
    struct Graph {
        int seen = 0;
        cudaGraphExec_t exec = nullptr;
    };

    // A step's graph is keyed by its token count, logits rows and attention
    // launch. Steps of up to kGraphMaxTokens tokens, where launching the
    // kernels one by one costs more than running them, are captured: decode
    // steps, and steps that carry prompt tokens beside them (their kernels
    // read the tokens' slots and positions from the device, and attention
    // its tiles: step_tiles).
    static constexpr int64_t kGraphMaxTokens = 64;
    void begin_step(int64_t n, int n_logits) {
        if (!graphs_enabled_ || n > kGraphMaxTokens || n_logits < 0) return;
        const GraphKey key{n, n_logits, attn_kind_, attn_few_};
        Graph& g = graphs_[key];
        if (g.exec) {
            replaying_ = true;
            replay_key_ = key;
            return;
        }
        if (++g.seen < 2 || !error_.ok()) return;
        if (cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
            capturing_ = true;
            replay_key_ = key;
        } else {
            cudaGetLastError();
        }
    }

    // Ends a step: instantiates a capture, or launches the replayed graph.
    void finish_step() {
        if (capturing_) {
            capturing_ = false;
            cudaGraph_t graph = nullptr;
            cudaError_t e = cudaStreamEndCapture(stream_, &graph);
            if (e == cudaSuccess && error_.ok()) {
                cudaGraphExec_t exec = nullptr;
                e = cudaGraphInstantiate(&exec, graph, 0);
                if (e == cudaSuccess) {
                    graphs_[replay_key_].exec = exec;
                    ++graphs_captured_;
                }
            }
            if (graph) cudaGraphDestroy(graph);
            if (e != cudaSuccess) {
                note(cuda_failure("capturing a step", e));
                graphs_enabled_ = false;
                return;
            }
            // The captured work has not run yet: run it now.
            check(cudaGraphLaunch(graphs_[replay_key_].exec, stream_), "graph launch");
        } else if (replaying_) {
            replaying_ = false;
            // The host-side parts of the step are in the pinned buffers the graph copies from.
            check(cudaGraphLaunch(graphs_[replay_key_].exec, stream_), "graph launch");
        }
    }

    int device_;
    std::shared_ptr<NcclGroup> nccl_;  // the group of a tensor-parallel rank, else null
    int rank_ = 0;
    cudaStream_t stream_ = nullptr;
    bool pad_q6k_ = true;
    bool graphs_enabled_ = true;
    uint64_t graphs_captured_ = 0;
    // Fewest tokens that take mmq_batch (0: each type's crossover);
    // TERN_MMQ_BATCH_MIN=65 turns it off, for A/B runs.
    int64_t mmq_batch_min_ = 0;
    // Rows past which more than 32 tokens take mmq where mmq_batch does not
    // stream them (TERN_MMQ_BATCH_ROWS, for A/B runs).
    int64_t mmq_batch_rows_ = 8192;
    // q/k norms, rope and kv_store in one launch (TERN_CUDA_PREPARE_ATTENTION=0: apart, for A/B runs).
    bool fused_attention_inputs_ = true;
    // add_rms_norm in one launch (TERN_CUDA_ADD_NORM=0: rms_norm then add, for A/B runs).
    bool joined_add_norm_ = true;
    // matmul_add and matmul_experts_combine_add at decode as one launch
    // (TERN_CUDA_MATMUL_ADD=0: the product, then add, for A/B runs).
    bool joined_matmul_add_ = true;
    uint32_t left_out_ = 0;  // LeftOut flags (TERN_CUDA_LEAVE_OUT)
    bool left_out(LeftOut k) const { return (left_out_ & k) != 0; }
    // Prefill attention tiled by runs of one sequence (TERN_ATTN_RUN_TILES=0:
    // tiles of consecutive tokens whatever their sequences, for A/B runs).
    bool run_tiles_ = true;
    // Matrices one mmvq launch may take (TERN_MMVQ_PARTS=1: one each, for A/B runs).
    int mmvq_max_parts_ = cuda::kMmvqMaxParts;
    std::deque<DeviceWeight> weights_;
    std::vector<void*> device_allocs_, host_allocs_;
    size_t device_bytes_ = 0;

    int8_t* act_qs_ = nullptr;
    float* act_d_ = nullptr;
    int32_t* act_sum_ = nullptr;
    uint16_t* act_sum_split_ = nullptr;
    int64_t act_split_ = 0;  // values in act_sum_split_
    int64_t act_blocks_ = 0;

    int32_t *pos_dev_ = nullptr, *slot_dev_ = nullptr, *rows_dev_ = nullptr, *tiles_dev_ = nullptr,
            *picks_dev_ = nullptr;
    int32_t *pos_host_ = nullptr, *slot_host_ = nullptr, *rows_host_ = nullptr, *tiles_host_ = nullptr,
            *picks_host_ = nullptr;
    cuda::AttnTiles tiles_;  // this step's attention tiles (step_tiles), tile_tokens 0: none yet
    int64_t token_capacity_ = 0;
    float* embed_host_ = nullptr;
    int64_t embed_capacity_ = 0;

    std::map<std::tuple<int, float, const void*>, const double*> inv_freq_;

    // The current routing (route_experts) and its device arrays.
    int64_t route_tokens_ = 0;
    int route_k_ = 0, route_n_expert_ = 0;
    int32_t* route_ids_ = nullptr;
    float* route_w_ = nullptr;
    cuda::ExpertGroups route_groups_;
    int64_t route_pair_capacity_ = 0, route_tile_capacity_ = 0;
    std::map<const void*, const uint8_t* const*> expert_tables_;

    KvCacheShape kv_shape_;
    uint16_t *k_ = nullptr, *v_ = nullptr;
    KvPageTable pages_;              // the host copy, sent to pages_dev_ when it changes
    int32_t* pages_dev_ = nullptr;
    float* attn_ws_ = nullptr;

    cuda::AttnBatch attn_kind_ = cuda::AttnBatch::Prefill;  // of the current step
    bool attn_few_ = false;  // cuda::attention_few_units of the current step

    using GraphKey = std::tuple<int64_t, int, cuda::AttnBatch, bool>;
    std::map<GraphKey, Graph> graphs_;
    bool capturing_ = false, replaying_ = false;
    GraphKey replay_key_{0, 0, cuda::AttnBatch::Prefill, false};
    Status error_;
};

}  // namespace

Result<std::unique_ptr<Backend>> make_cuda_backend(int device, std::shared_ptr<CommGroup> group, int rank) {
    return CudaBackend::create(device, std::move(group), rank);
}

}  // namespace tern::backend
