// The operation interface between a model's forward pass and the hardware.
// A forward pass is written once against these calls; a backend (cpu, cuda)
// decides where memory lives and how weights are stored ("registration"), and
// never knows which model it runs.
//
// Conventions: activations are f32 matrices, row-major, one row per token.
// A weight matrix W has `rows` outputs and `cols` inputs (GGUF ne[1], ne[0]);
// matmul computes y[t][r] = sum_k W[r][k] * x[t][k]. All calls on one backend
// are issued from one thread, in order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/result.h"
#include "gguf/gguf.h"

namespace tern::backend {

// Activations: rows x cols f32, in the backend's memory.
struct Tensor {
    float* data = nullptr;
    int64_t rows = 0;
    int64_t cols = 0;
    float* row(int64_t r) const { return data + r * cols; }
};

// A registered weight: its GGUF type and shape, and the backend's own handle.
// How a registered weight's host bytes are arranged.
enum class WeightLayout : uint8_t {
    gguf_rows,      // GGUF blocks, row after row at row_bytes
    interleaved16,  // the CPU's groups of sixteen rows (quant/interleave.h); row_bytes unused
};

struct Weight {
    std::string name;
    TensorType type = TensorType::F32;
    int64_t cols = 0;         // ne[0], the input dimension (1-D tensors: the length)
    int64_t rows = 1;         // ne[1] (product of ne[1..3])
    const void* host = nullptr;  // GGUF bytes in the mapping (registered: the backend's copy, in `layout`)
    size_t row_bytes = 0;     // bytes from one row to the next: at least the bytes of `cols`
                              // elements, more for a view of some of each row's columns
    void* impl = nullptr;     // backend-owned (device copy, repacked layout, ...)
    WeightLayout layout = WeightLayout::gguf_rows;
    explicit operator bool() const { return host != nullptr; }
};

// Rotary embedding parameters of a model.
struct RopeParams {
    int n_dims = 0;              // rotated dimensions per head (<= head_dim)
    bool neox = false;           // pairs (i, i + n_dims/2) instead of (2i, 2i+1)
    float freq_base = 10000.0f;
    float freq_scale = 1.0f;     // linear scaling: position multiplied by this
    const Weight* freq_factors = nullptr;  // f32 [n_dims/2] divisors of each frequency (llama3, LongRoPE), or null
    float attn_factor = 1.0f;    // cos and sin multiplied by this (LongRoPE's rope.scaling.attn_factor)
};

// Which sequence (KV slot) and position each token of a batch belongs to.
struct BatchLayout {
    std::vector<int32_t> slot;  // KV-cache slot per token
    std::vector<int32_t> pos;   // position within its sequence
    int n_logits = -1;          // rows the step will gather for logits (-1: not known)
};

// The most experts a mixture-of-experts layer may have (route_experts).
constexpr int kMaxExperts = 256;

// Positions per KV page: a multiple of 32, so that every 32-position chunk
// the attention kernels take (aligned to absolute positions) lies in one page.
constexpr int kKvPageSize = 32;

// Per-layer K and V, f16, in a pool of pages of page_size positions, each
// [pos][n_kv_heads][head_dim]. A slot (sequence) reaches its positions
// through its page table (Backend::map_kv_pages): position p of slot s lies
// in page table[s][p / page_size] at row p % page_size.
struct KvCacheShape {
    int n_layers = 0;
    int n_slots = 0;
    int n_ctx = 0;               // positions per slot at most
    int n_kv_heads = 0;
    int head_dim = 0;
    int n_heads = 0;             // query heads (sizes per-head attention scratch; 0: n_kv_heads)
    int page_size = kKvPageSize;
    int n_pages = 0;             // the pool; 0: every slot's whole context
    int pages_per_slot() const { return (n_ctx + page_size - 1) / page_size; }
    int pool_pages() const { return n_pages > 0 ? n_pages : n_slots * pages_per_slot(); }
    // Bytes of one page over every layer, K and V.
    size_t page_bytes() const {
        return size_t(2) * n_layers * page_size * n_kv_heads * head_dim * sizeof(uint16_t);
    }
    size_t bytes() const { return size_t(pool_pages()) * page_bytes(); }
};

class Backend {
public:
    virtual ~Backend() = default;
    virtual std::string name() const = 0;

    // --- memory and registration ---
    // Takes a weight as describe_weight() gives it, or a view of one (a
    // tensor-parallel shard: some rows, or some block-aligned columns of every
    // row with the full row stride), and returns it with the backend's handle.
    virtual Result<Weight> register_weight(const Weight& described) = 0;
    virtual Result<Tensor> alloc(int64_t rows, int64_t cols) = 0;   // freed with the backend
    // A slot is never cleared: attention reads only positions 0..pos of a
    // token's slot, and every one of those is written (kv_store) first.
    // When the pool holds every slot's whole context (shape.n_pages 0), slot
    // s starts mapped to pages s * pages_per_slot onwards; else no slot is
    // mapped until map_kv_pages.
    virtual Status init_kv_cache(const KvCacheShape& shape) = 0;
    // Maps positions [i * page_size, (i + 1) * page_size) of `slot` to pool
    // page pages[i], for every i < pages.size(); its later positions are
    // unmapped (no token may use them). Slots may share pages (a common
    // prompt prefix) as long as only one of them writes a shared page's
    // positions, before the others read them. Takes effect at the next
    // set_batch. A slot that does not exist, more pages than a slot's
    // context or a page outside the pool is an error, and nothing changes.
    virtual Status map_kv_pages(int slot, const std::vector<int32_t>& pages) = 0;
    virtual void upload(const float* host, Tensor dst) = 0;   // dst.rows*dst.cols floats
    virtual void download(Tensor src, float* host) = 0;
    // host[r] = the greedy pick of row r of x: the first index of its largest
    // value, NaN read as -inf, -1 when none is above -inf (the CPU's
    // cpu::argmax_first). Like download, the values are there on return; a
    // sampler that draws greedily then needs no row copied back.
    virtual void argmax_rows(Tensor x, int32_t* host) = 0;

    // --- per-batch state used by rope / kv_store / attention ---
    virtual void set_batch(const BatchLayout& layout) = 0;

    // --- operations ---
    // out[t] = table row tokens[t], dequantized.
    virtual void embed(const Weight& table, const std::vector<int32_t>& tokens, Tensor out) = 0;
    // out[t] = x[t] / rms(x[t]) * w   (w may be empty: no scale)
    virtual void rms_norm(Tensor x, const Weight& w, float eps, Tensor out) = 0;
    // x[t] += y[t] / rms(y[t]) * w: a block's output normalised and added to
    // the residual stream (Gemma 3's post-norms). The bits of rms_norm of y
    // then add, which is what this default does, leaving y normalised; a
    // backend may do it in one pass and leave y as it was. x and y are distinct.
    virtual void add_rms_norm(Tensor x, Tensor y, const Weight& w, float eps) {
        rms_norm(y, w, eps, y);
        add(x, y);
    }
    // y = x W^T (+ bias if given). x.cols == W.cols, y.cols == W.rows.
    virtual void matmul(const Weight& w, Tensor x, Tensor y, const Weight* bias = nullptr) = 0;
    // Several matrices on one input (q/k/v, gate/up): each target's y = x W^T
    // (+ bias), the bits matmul() would give. A backend prepares x once (its
    // activation quantization) for all of them; this default does not.
    struct MatmulTarget {
        const Weight* w;
        Tensor y;
        const Weight* bias = nullptr;
    };
    virtual void matmul_shared(Tensor x, std::initializer_list<MatmulTarget> targets) {
        for (const MatmulTarget& t : targets) matmul(*t.w, x, t.y, t.bias);
    }
    // y += x W^T: a block's last product added to the residual stream. The
    // bits of matmul into `scratch` (y's shape, distinct from x and y; left
    // undefined) then add, which is what this default does; a backend may
    // add as it writes.
    virtual void matmul_add(const Weight& w, Tensor x, Tensor y, Tensor scratch) {
        matmul(w, x, scratch);
        add(y, scratch);
    }
    // Rotates the first rope.n_dims dims of each head of x (rows: tokens, cols: n_heads*head_dim)
    // by the positions of the current batch.
    virtual void rope(Tensor x, int n_heads, int head_dim, const RopeParams& rope) = 0;
    // Writes K and V rows of the current batch into the cache at (slot, pos).
    virtual void kv_store(int layer, Tensor k, Tensor v) = 0;
    // What attention() reads, made ready: each head of q and k normalised on
    // its own where its weight is given (RMSNorm over head_dim, before RoPE:
    // Gemma 3, Qwen3), q and k rotated by rope, k and v written to the cache.
    // The bits of rms_norm (a row per head), rope, rope and kv_store called in
    // that order, which is what this default does; a backend may do it in one
    // pass.
    struct AttentionInputs {
        Tensor q, k, v;  // a row per token: n_heads (q) or n_kv_heads (k, v) heads of head_dim
        int n_heads = 0, n_kv_heads = 0, head_dim = 0;
        const Weight* q_norm = nullptr;  // head_dim weights, or null
        const Weight* k_norm = nullptr;
        float norm_eps = 0.0f;
    };
    virtual void prepare_attention(int layer, const AttentionInputs& in, const RopeParams& rope) {
        auto per_head = [&](Tensor t) { return Tensor{t.data, t.rows * (t.cols / in.head_dim), in.head_dim}; };
        if (in.q_norm) rms_norm(per_head(in.q), *in.q_norm, in.norm_eps, per_head(in.q));
        if (in.k_norm) rms_norm(per_head(in.k), *in.k_norm, in.norm_eps, per_head(in.k));
        this->rope(in.q, in.n_heads, in.head_dim, rope);
        this->rope(in.k, in.n_kv_heads, in.head_dim, rope);
        kv_store(layer, in.k, in.v);
    }
    // out[t] = softmax(q[t] K^T * scale) V over positions first..pos[t] of slot[t], per head,
    // with grouped-query heads (n_heads / n_kv_heads query heads share a KV head).
    // window 0: first = 0; window w > 0 (sliding-window layers): first = max(0, pos[t] - w + 1),
    // the last w positions.
    virtual void attention(int layer, Tensor q, int n_heads, float scale, int window, Tensor out) = 0;
    // gate = silu(gate) * up
    virtual void swiglu(Tensor gate, Tensor up) = 0;
    // gate = gelu(gate) * up, GELU in its tanh form (Gemma's gelu_pytorch_tanh)
    virtual void geglu(Tensor gate, Tensor up) = 0;
    // x *= s
    virtual void scale(Tensor x, float s) = 0;
    // x += y
    virtual void add(Tensor x, Tensor y) = 0;
    // out[i] = x[rows[i]]
    virtual void gather_rows(Tensor x, const std::vector<int32_t>& rows, Tensor out) = 0;

    // --- mixture of experts (Mixtral, Qwen3-MoE) ---
    // Routes each token of the current batch (logits: a row per token, a
    // column per expert) to the k experts of largest logit, the largest first
    // (ties: the lower index; NaN counts as -inf, in the ranking and the
    // weights), weighted by the softmax
    // over those k logits: exp(l_j - l_0) / sum_i exp(l_i - l_0), summed in
    // order (a softmax over every expert renormalised over the chosen ones).
    // The routing is held for the calls below until the next route_experts.
    // 1 <= k <= logits.cols <= kMaxExperts.
    virtual void route_experts(Tensor logits, int k) = 0;
    // Expert matmuls of the routing: y row t*k + j = x_row W_e^T, e the j-th
    // expert of token t. x_row is x row t when x has a row per token (the FFN
    // input, which a token's k experts share), row t*k + j when it has k per
    // token. experts[e] is expert e's matrix; all have one type and shape.
    // Each output row has the bits matmul() gives that row alone.
    virtual void matmul_experts(const std::vector<Weight>& experts, Tensor x, Tensor y) = 0;
    // Several expert sets on one input (gate and up): each target's y as
    // matmul_experts gives it. A backend prepares x once (its activation
    // quantization) for all of them; this default does not.
    struct ExpertTarget {
        const std::vector<Weight>* experts;
        Tensor y;
    };
    virtual void matmul_experts_shared(Tensor x, std::initializer_list<ExpertTarget> targets) {
        for (const ExpertTarget& t : targets) matmul_experts(*t.experts, x, t.y);
    }
    // The gated input of the experts' down matrix: gate = silu(x gate_exps^T) *
    // (x up_exps^T) for the routed rows, up left as scratch. The bits of
    // matmul_experts_shared on both sets then swiglu, which is what this
    // default does; a backend may do it in one pass.
    virtual void matmul_experts_swiglu(Tensor x, const std::vector<Weight>& gate_exps,
                                       const std::vector<Weight>& up_exps, Tensor gate, Tensor up) {
        matmul_experts_shared(x, {{&gate_exps, gate}, {&up_exps, up}});
        swiglu(gate, up);
    }
    // out[t] = the sum over j of weight(t, j) * y[t*k + j]: w_0 y_0 rounded,
    // then fma(w_j, y_j, sum) for j = 1..k-1 in order.
    virtual void combine_experts(Tensor y, Tensor out) = 0;
    // combine_experts of matmul_experts(experts, x, y): the bits of both
    // calls, which is what this default does (y as they leave it); a backend
    // may do it in one pass, leaving y unwritten.
    virtual void matmul_experts_combine(const std::vector<Weight>& experts, Tensor x, Tensor y, Tensor out) {
        matmul_experts(experts, x, y);
        combine_experts(y, out);
    }
    // out += that combine: the bits of matmul_experts_combine into `scratch`
    // (out's shape, distinct from x, y and out; left undefined) then add,
    // which is what this default does; a backend may add as it writes,
    // leaving y unwritten.
    virtual void matmul_experts_combine_add(const std::vector<Weight>& experts, Tensor x, Tensor y, Tensor out,
                                            Tensor scratch) {
        matmul_experts_combine(experts, x, y, scratch);
        add(out, scratch);
    }
    // Waits until all issued work is done.
    virtual void synchronize() = 0;
    // The first error any operation hit since the last call (operations are
    // issued without a status each, as a GPU queue would run them), then clears it.
    virtual Status take_error() = 0;

    // Tensor parallelism: x = the sum of x over every rank of the group this
    // backend was made in (make_*_backend's `group`), the same bits on every
    // rank. Every rank calls it at the same points of a pass. Like the
    // operations it only enqueues; a failure shows at take_error(). A backend
    // made without a group reports an error.
    virtual void all_reduce_sum(Tensor x) = 0;

    // Device memory this backend holds (weights, KV cache, workspace), in bytes;
    // 0 for a backend that uses host memory.
    virtual size_t device_bytes() const { return 0; }
    // Device memory still free for this backend to take, in bytes; 0 for a
    // backend that uses host memory (no bound is known).
    virtual size_t free_device_bytes() const { return 0; }

    // Steps of up to this many tokens, which the backend captures as a graph
    // on their second run and replays from then on, a graph for each token
    // count, count of logits rows (BatchLayout::n_logits) and kind of step:
    // a token from each sequence, or not. 0 for a backend that captures
    // none. A capture costs its step milliseconds of host time, so a server
    // runs these steps before it serves (runtime::Scheduler's warm-up).
    virtual int graph_tokens() const { return 0; }
    // Steps captured so far.
    virtual uint64_t graphs_captured() const { return 0; }
};

// The matrix view of a GGUF tensor (name, type, shape, host bytes, row stride),
// or an error naming a type no backend reads or a row that is not whole blocks.
// What register_weight() takes.
Result<Weight> describe_weight(const gguf::TensorInfo& t);

// The host bytes a weight's rows occupy, first row to the end of the last
// row's columns (a view's rows are row_bytes apart, wider than its columns).
size_t weight_span(const Weight& w);

// The ranks of one tensor-parallel model and how they exchange partial sums.
// Each kind of group serves one kind of backend: a host group joins CPU
// backends (in one process, one thread per rank), an NCCL group joins CUDA
// backends on several GPUs of one host.
class CommGroup {
public:
    virtual ~CommGroup() = default;
    virtual int size() const = 0;
    virtual std::string kind() const = 0;  // "host", "nccl"
    // A rank that stops in the middle of a pass calls this so that ranks
    // waiting for it give up (a host group; NCCL ranks never stop mid-pass,
    // since their operations only enqueue). begin_pass() clears it.
    virtual void abandon(int /*rank*/) {}
    virtual void begin_pass() {}
};

// A group of n_ranks CPU backends in one process: an all-reduce is a
// rendezvous where each rank sums every rank's partial in rank order, so
// every rank gets the same bits whatever the thread timing.
std::shared_ptr<CommGroup> make_host_group(int n_ranks);

// One NCCL communicator per GPU of `devices` (rank r on devices[r]), in this
// process. NCCL is loaded when this is called (libnccl.so.2, or the file
// TERN_NCCL_LIBRARY names), so a build of tern runs on machines without it;
// the error says what is missing.
Result<std::shared_ptr<CommGroup>> make_nccl_group(const std::vector<int>& devices);

// The CPU backend; threads <= 0 means all cores. Given a host group, it is
// rank `rank` of it. grouped_kquant_acts: K-quant matrices read activations
// quantized as the CUDA backend's do (cpu::MatmulOptions), for comparing the
// two backends on the same activations.
std::unique_ptr<Backend> make_cpu_backend(int threads = 0, std::shared_ptr<CommGroup> group = nullptr, int rank = 0,
                                          bool grouped_kquant_acts = false);

// The CUDA backend on GPU `device`, or an error naming why it cannot be had
// (a build without CUDA, no driver, no such device). Given an NCCL group, it
// is rank `rank` of it and `device` must be that rank's GPU.
Result<std::unique_ptr<Backend>> make_cuda_backend(int device = 0, std::shared_ptr<CommGroup> group = nullptr,
                                                   int rank = 0);

}  // namespace tern::backend
