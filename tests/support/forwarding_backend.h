// Backends for tests that wrap another one: ForwardingBackend passes every
// call on (a test overrides the calls it watches), RoutingRecorder records
// the experts each route_experts call picks.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/cpu/ops.h"

namespace tern::test {

class ForwardingBackend : public backend::Backend {
public:
    explicit ForwardingBackend(std::unique_ptr<backend::Backend> inner) : be_(std::move(inner)) {}

    std::string name() const override { return be_->name(); }
    Result<backend::Weight> register_weight(const backend::Weight& w) override { return be_->register_weight(w); }
    Result<backend::Tensor> alloc(int64_t rows, int64_t cols) override { return be_->alloc(rows, cols); }
    Status init_kv_cache(const backend::KvCacheShape& s) override { return be_->init_kv_cache(s); }
    Status map_kv_pages(int slot, const std::vector<int32_t>& pages) override {
        return be_->map_kv_pages(slot, pages);
    }
    void upload(const float* host, backend::Tensor dst) override { be_->upload(host, dst); }
    void download(backend::Tensor src, float* host) override { be_->download(src, host); }
    void argmax_rows(backend::Tensor x, int32_t* host) override { be_->argmax_rows(x, host); }
    void set_batch(const backend::BatchLayout& layout) override { be_->set_batch(layout); }
    void embed(const backend::Weight& table, const std::vector<int32_t>& tokens, backend::Tensor out) override {
        be_->embed(table, tokens, out);
    }
    void rms_norm(backend::Tensor x, const backend::Weight& w, float eps, backend::Tensor out) override {
        be_->rms_norm(x, w, eps, out);
    }
    void add_rms_norm(backend::Tensor x, backend::Tensor y, const backend::Weight& w, float eps) override {
        be_->add_rms_norm(x, y, w, eps);
    }
    void matmul(const backend::Weight& w, backend::Tensor x, backend::Tensor y, const backend::Weight* bias) override {
        be_->matmul(w, x, y, bias);
    }
    void matmul_shared(backend::Tensor x, std::initializer_list<MatmulTarget> targets) override {
        be_->matmul_shared(x, targets);
    }
    void rope(backend::Tensor x, int n_heads, int head_dim, const backend::RopeParams& rope) override {
        be_->rope(x, n_heads, head_dim, rope);
    }
    void kv_store(int layer, backend::Tensor k, backend::Tensor v) override { be_->kv_store(layer, k, v); }
    void prepare_attention(int layer, const AttentionInputs& in, const backend::RopeParams& rope) override {
        be_->prepare_attention(layer, in, rope);
    }
    void attention(int layer, backend::Tensor q, int n_heads, float scale, int window, backend::Tensor out) override {
        be_->attention(layer, q, n_heads, scale, window, out);
    }
    void swiglu(backend::Tensor gate, backend::Tensor up) override { be_->swiglu(gate, up); }
    void geglu(backend::Tensor gate, backend::Tensor up) override { be_->geglu(gate, up); }
    void scale(backend::Tensor x, float s) override { be_->scale(x, s); }
    void add(backend::Tensor x, backend::Tensor y) override { be_->add(x, y); }
    void gather_rows(backend::Tensor x, const std::vector<int32_t>& rows, backend::Tensor out) override {
        be_->gather_rows(x, rows, out);
    }
    void route_experts(backend::Tensor logits, int k) override { be_->route_experts(logits, k); }
    void matmul_experts(const std::vector<backend::Weight>& experts, backend::Tensor x, backend::Tensor y) override {
        be_->matmul_experts(experts, x, y);
    }
    void matmul_experts_shared(backend::Tensor x, std::initializer_list<ExpertTarget> targets) override {
        be_->matmul_experts_shared(x, targets);
    }
    void matmul_experts_swiglu(backend::Tensor x, const std::vector<backend::Weight>& gate_exps,
                               const std::vector<backend::Weight>& up_exps, backend::Tensor gate,
                               backend::Tensor up) override {
        be_->matmul_experts_swiglu(x, gate_exps, up_exps, gate, up);
    }
    void combine_experts(backend::Tensor y, backend::Tensor out) override { be_->combine_experts(y, out); }
    void matmul_add(const backend::Weight& w, backend::Tensor x, backend::Tensor y, backend::Tensor scratch) override {
        be_->matmul_add(w, x, y, scratch);
    }
    void matmul_experts_combine_add(const std::vector<backend::Weight>& experts, backend::Tensor x, backend::Tensor y,
                                    backend::Tensor out, backend::Tensor scratch) override {
        be_->matmul_experts_combine_add(experts, x, y, out, scratch);
    }
    void matmul_experts_combine(const std::vector<backend::Weight>& experts, backend::Tensor x, backend::Tensor y,
                                backend::Tensor out) override {
        be_->matmul_experts_combine(experts, x, y, out);
    }
    void synchronize() override { be_->synchronize(); }
    Status take_error() override { return be_->take_error(); }
    void all_reduce_sum(backend::Tensor x) override { be_->all_reduce_sum(x); }
    size_t device_bytes() const override { return be_->device_bytes(); }
    int graph_tokens() const override { return be_->graph_tokens(); }
    uint64_t graphs_captured() const override { return be_->graphs_captured(); }

protected:
    std::unique_ptr<backend::Backend> be_;
};

// Records each route_experts call: its logits and the experts the CPU twin
// (cpu::route_top_k) picks from them, which are the backend's own picks. For
// the reference forward to follow the engine's routing
// (ReferenceForward::force_experts), and for comparing two backends' routing,
// where rounded activations may break a near tie of two logits either way.
struct Route {
    int64_t rows = 0;             // tokens
    int n_expert = 0, k = 0;
    std::vector<float> logits;    // rows x n_expert
    std::vector<int32_t> ids;     // rows x k
};

class RoutingRecorder final : public ForwardingBackend {
public:
    using ForwardingBackend::ForwardingBackend;

    // The route_experts calls since the last take, in order.
    std::vector<Route> take_routes() { return std::exchange(routes_, {}); }

    void route_experts(backend::Tensor logits, int k) override {
        Route r;
        r.rows = logits.rows;
        r.n_expert = int(logits.cols);
        r.k = k;
        r.logits.resize(size_t(logits.rows * logits.cols));
        be_->download(logits, r.logits.data());
        r.ids.resize(size_t(logits.rows * k));
        std::vector<float> weights(static_cast<size_t>(k));
        if (k >= 1 && k <= logits.cols && logits.cols <= backend::kMaxExperts)
            for (int64_t t = 0; t < logits.rows; ++t)
                backend::cpu::route_top_k(r.logits.data() + t * logits.cols, int(logits.cols), k, r.ids.data() + t * k,
                                          weights.data());
        routes_.push_back(std::move(r));
        be_->route_experts(logits, k);
    }

private:
    std::vector<Route> routes_;
};

}  // namespace tern::test
