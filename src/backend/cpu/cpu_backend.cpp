// The CPU backend: weight matrices copied into huge-page memory where it can
// be had (the quantized ones in the interleaved layout of quant/interleave.h
// on AVX-512; else read in place from the GGUF mapping),
// activations in host memory, OpenMP threads over independent rows, an f16
// KV cache of pages laid out [layer][page][pos in page][kv_head][head_dim].
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_page_table.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "backend/cpu/parallel.h"
#include "backend/cpu/weight_arena.h"
#include "backend/host_group.h"
#include "base/fp16.h"
#include "quant/act_quant.h"
#include "quant/dot.h"
#include "quant/interleave.h"
#include "quant/quant.h"

namespace tern::backend {
namespace {

// TERN_CPU_WEIGHT_COPY=0 reads every weight in place from the mapping, for
// A/B runs and for machines whose memory the copies would crowd.
bool weight_copies_on() {
    const char* v = std::getenv("TERN_CPU_WEIGHT_COPY");
    return !(v && std::string(v) == "0");
}

// Matrices of the types with an interleaved layout (quant/interleave.h: q4_0,
// q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K) are registered in it where the
// AVX-512 path runs; TERN_CPU_INTERLEAVE=0 keeps their GGUF rows, for A/B runs.
bool interleave_on() {
    const char* v = std::getenv("TERN_CPU_INTERLEAVE");
    return !(v && std::string(v) == "0") && quant::simd_path_best() == quant::SimdPath::avx512;
}

// n zeroed values from calloc: a large block (past the C library's mmap
// threshold) comes straight from fresh pages, which it knows are zero, so
// nothing is written and memory is taken only as rows are used. The forward
// pass's workspace holds logits for a whole batch (512 x 262,144 floats for
// Gemma 3) and the KV pool a context that a run may never reach.
template <class T>
class ZeroedArray {
public:
    ZeroedArray() = default;
    explicit ZeroedArray(size_t n) : data_(static_cast<T*>(std::calloc(n ? n : 1, sizeof(T)))) {
        if (!data_) throw std::bad_alloc();
    }
    T* data() { return data_.get(); }
    T& operator[](size_t i) { return data_.get()[i]; }

private:
    struct Free {
        void operator()(T* p) const { std::free(p); }
    };
    std::unique_ptr<T[], Free> data_;
};

class CpuBackend final : public Backend {
public:
    CpuBackend(int threads, std::shared_ptr<CommGroup> group, int rank, bool grouped_kquant_acts)
        : threads_(threads > 0 ? threads : omp_get_num_procs()),
          group_(std::move(group)),
          host_(dynamic_cast<HostGroup*>(group_.get())),
          rank_(rank),
          arena_(weight_copies_on() ? cpu::WeightArena::available_budget() : 0) {
        omp_set_num_threads(threads_);
        matmul_opt_.grouped_kquant_acts = grouped_kquant_acts;
    }

    std::string name() const override { return "cpu"; }

    // Matrices are copied into the arena (a view: its rows at their stride), else read in place.
    Result<Weight> register_weight(const Weight& described) override {
        Weight w = described;
        w.impl = nullptr;
        if (w.type != TensorType::F32 && w.rows == 1) {
            // 1-D parameters (norm scales, biases) are used as f32 by every op.
            auto& f = small_f32_.emplace_back(size_t(w.cols));
            if (Status s = quant::dequantize_row(w.type, w.host, f.data(), w.cols); !s.ok())
                return Error{"tensor '" + w.name + "': " + s.message()};
            w.impl = f.data();
        }
        if (w.rows > 1 && !interleave(w)) {
            // Matrices stream from huge pages where memory allows (weight_arena.h).
            const size_t span = weight_span(w);
            if (const void* copy = arena_.copy(w.host, span)) w.host = copy;
        }
        return w;
    }

    // Writes w's rows into the arena in the interleaved layout and points w
    // there; false (w unchanged) where the type has none or memory is short.
    bool interleave(Weight& w) {
        if (!interleave_ || !quant::dot_group_kernel(w.type, quant::SimdPath::avx512)) return false;
        const size_t bytes = quant::interleaved_bytes(w.type, w.rows, w.cols);
        if (bytes == 0) return false;
        auto* dst = static_cast<uint8_t*>(arena_.reserve(bytes));
        if (!dst) return false;
        const size_t stride = w.row_bytes ? w.row_bytes : quant::row_bytes(w.type, w.cols);
        // Threads take runs of groups (the first touch of the arena's pages).
        constexpr int64_t kRun = 64;
        const int64_t groups = (w.rows + quant::kGroupRows - 1) / quant::kGroupRows;
        const int64_t runs = (groups + kRun - 1) / kRun;
        bool ok = true;
#pragma omp parallel for schedule(static) if (runs > 1) reduction(&& : ok)
        for (int64_t i = 0; i < runs; ++i)
            ok = quant::interleave_groups(w.type, w.host, stride, w.rows, w.cols, dst, i * kRun,
                                          std::min(groups, (i + 1) * kRun))
                     .ok() &&
                 ok;
        if (!ok) return false;  // (the reserved bytes stay unused)
        w.host = dst;
        w.layout = WeightLayout::interleaved16;
        return true;
    }

    Result<Tensor> alloc(int64_t rows, int64_t cols) override {
        if (rows < 1 || cols < 1 || rows > (int64_t(1) << 40) / cols)
            return Error{"cpu alloc: bad shape " + std::to_string(rows) + " x " + std::to_string(cols)};
        try {
            auto& buf = buffers_.emplace_back(size_t(rows * cols));
            return Tensor{buf.data(), rows, cols};
        } catch (const std::bad_alloc&) {
            return Error{"cpu alloc: out of memory for " + std::to_string(rows * cols * 4) + " bytes"};
        }
    }

    Status init_kv_cache(const KvCacheShape& s) override {
        if (s.n_layers < 1 || s.n_slots < 1 || s.n_ctx < 1 || s.n_kv_heads < 1 || s.head_dim < 1)
            return Error{"kv cache: every dimension must be positive"};
        if (s.page_size < 1 || (s.page_size & (s.page_size - 1)) != 0 || s.n_pages < 0)
            return Error{"kv cache: pages of " + std::to_string(s.page_size) + " positions (not a power of two)"};
        try {
            kv_shape_ = s;
            const size_t half = s.bytes() / 2 / sizeof(uint16_t);
            k_ = ZeroedArray<uint16_t>(half);
            v_ = ZeroedArray<uint16_t>(half);
            pages_.init(s);
        } catch (const std::bad_alloc&) {
            return Error{"kv cache: out of memory for " + std::to_string(s.bytes()) + " bytes"};
        }
        return {};
    }

    void upload(const float* host, Tensor dst) override {
        std::memcpy(dst.data, host, size_t(dst.rows * dst.cols) * sizeof(float));
    }
    void download(Tensor src, float* host) override {
        std::memcpy(host, src.data, size_t(src.rows * src.cols) * sizeof(float));
    }

    void argmax_rows(Tensor x, int32_t* host) override {
        cpu::parallel_for(x.rows, x.rows > 1, [&](int64_t r) { host[r] = int32_t(cpu::argmax_first(x.row(r), x.cols)); });
    }

    Status map_kv_pages(int slot, const std::vector<int32_t>& pages) override { return pages_.map(slot, pages); }

    void set_batch(const BatchLayout& layout) override {
        layout_ = layout;
        for (CachedRope& r : rope_tables_) r.rows = 0;  // tables of the last batch's positions
    }

    void embed(const Weight& table, const std::vector<int32_t>& tokens, Tensor out) override {
        const auto* base = static_cast<const uint8_t*>(table.host);
        for (int64_t t = 0; t < int64_t(tokens.size()); ++t) {
            const int64_t token = tokens[size_t(t)];
            if (token < 0 || token >= table.rows) {
                note(Error{"embed: token " + std::to_string(token) + " is outside the table's " +
                           std::to_string(table.rows) + " rows"});
                continue;
            }
            const void* row = base + size_t(token) * table.row_bytes;
            if (table.layout == WeightLayout::interleaved16) {
                // The token's row read back from its group (a table whose
                // type has the layout is registered in it, tied or not).
                embed_row_.resize(quant::row_bytes(table.type, table.cols));
                if (Status s = quant::deinterleave_row(table.type, table.host, table.rows, table.cols, token,
                                                       embed_row_.data());
                    !s.ok()) {
                    note(s);
                    continue;
                }
                row = embed_row_.data();
            }
            if (Status s = quant::dequantize_row(table.type, row, out.row(t), table.cols); !s.ok()) note(s);
        }
    }

    void rms_norm(Tensor x, const Weight& w, float eps, Tensor out) override {
        cpu::rms_norm(x.data, w ? f32(w) : nullptr, eps, out.data, x.rows, x.cols);
    }

    void matmul(const Weight& w, Tensor x, Tensor y, const Weight* bias) override {
        if (Status s = cpu::matmul(w, x.data, x.rows, y.data, matmul_opt_); !s.ok()) note(s);
        if (bias) add_bias(y, *bias);
    }

    // Integer-kernel matrices share one quantization of x, made again only
    // when a matrix reads the other grouping (cpu::reads_grouped_acts).
    void matmul_shared(Tensor x, std::initializer_list<MatmulTarget> targets) override {
        std::optional<bool> quantized;  // the grouping shared_xq_ holds for x
        if (x.rows == 1 && one_token_shared(x, targets, quantized)) return;
        for (const MatmulTarget& t : targets) {
            if (!quant::dot_int_type(t.w->type) || x.cols % quant::QK8A != 0) {
                matmul(*t.w, x, t.y, t.bias);
                continue;
            }
            if (const bool grouped = cpu::reads_grouped_acts(t.w->type, matmul_opt_); quantized != grouped) {
                try {
                    shared_xq_.resize(size_t(x.rows * (x.cols / quant::QK8A)));
                } catch (const std::bad_alloc&) {
                    return note(Error{"matmul: out of memory quantizing " + std::to_string(x.rows) + " x " +
                                      std::to_string(x.cols) + " activations"});
                }
                if (Status s = cpu::quantize_activations(x.data, x.rows, x.cols, shared_xq_.data(), matmul_opt_, grouped);
                    !s.ok())
                    return note(s);
                quantized = grouped;
            }
            if (Status s = cpu::matmul_q8a(*t.w, shared_xq_.data(), x.rows, t.y.data, matmul_opt_); !s.ok()) note(s);
            if (t.bias) add_bias(t.y, *t.bias);
        }
    }

    // One token into weights of integer types that read the same grouping:
    // one quantization and one parallel loop over all their row tiles
    // (matmul_q8a_one_token); false otherwise, with `quantized` set where x
    // was quantized already, so the caller's matrix-by-matrix loop reuses it.
    bool one_token_shared(Tensor x, std::initializer_list<MatmulTarget> targets, std::optional<bool>& quantized) {
        cpu::Q8aTarget parts[4];
        int n = 0;
        std::optional<bool> grouped;
        if (targets.size() > std::size(parts) || x.cols % quant::QK8A != 0) return false;
        for (const MatmulTarget& t : targets) {
            const bool g = cpu::reads_grouped_acts(t.w->type, matmul_opt_);
            if (!quant::dot_int_type(t.w->type) || t.w->cols != x.cols || (grouped && *grouped != g)) return false;
            grouped = g;
            parts[n++] = cpu::Q8aTarget{t.w, t.y.data};
        }
        try {
            shared_xq_.resize(size_t(x.cols / quant::QK8A));
        } catch (const std::bad_alloc&) {
            return false;
        }
        if (!cpu::quantize_activations(x.data, 1, x.cols, shared_xq_.data(), matmul_opt_, *grouped).ok()) return false;
        quantized = grouped;
        if (!cpu::matmul_q8a_one_token(parts, n, shared_xq_.data(), matmul_opt_)) return false;
        for (const MatmulTarget& t : targets)
            if (t.bias) add_bias(t.y, *t.bias);
        return true;
    }

    void rope(Tensor x, int n_heads, int head_dim, const RopeParams& rope) override {
        cpu::rope_apply(x.data, x.rows, n_heads, head_dim, rope.neox, rope_table(rope, x.rows));
    }

    // The batch's table for these parameters: computed by the first layer to
    // ask, reused by the rest (Gemma 3's local and global layers use two).
    const cpu::RopeTable& rope_table(const RopeParams& rope, int64_t rows) {
        auto same = [&](const CachedRope& r) {  // every field rope_table reads (not neox: rope_apply's)
            const RopeParams& k = r.params;
            return r.rows >= rows && k.n_dims == rope.n_dims && k.freq_base == rope.freq_base &&
                   k.freq_scale == rope.freq_scale && k.attn_factor == rope.attn_factor &&
                   k.freq_factors == rope.freq_factors;
        };
        for (CachedRope& r : rope_tables_)
            if (same(r)) return r.table;
        CachedRope& r = rope_tables_[next_rope_table_];
        next_rope_table_ = (next_rope_table_ + 1) % rope_tables_.size();
        cpu::rope_table(layout_.pos.data(), rows, rope, rope.freq_factors ? f32(*rope.freq_factors) : nullptr,
                        r.table);
        r.rows = rows;
        r.params = rope;
        return r.table;
    }

    void kv_store(int layer, Tensor k, Tensor v) override {
        const int64_t width = int64_t(kv_shape_.n_kv_heads) * kv_shape_.head_dim;
        cpu::parallel_for(k.rows, k.rows > 1, [&](int64_t t) {
            const int32_t page = pages_.page(layout_.slot[size_t(t)], layout_.pos[size_t(t)]);
            if (page == KvPageTable::kUnmapped) return;  // the forward pass refuses such batches
            const size_t at = kv_offset(layer, page, layout_.pos[size_t(t)] % kv_shape_.page_size);
            cpu::detail::fp32_row_to_fp16(k.row(t), &k_[at], width);
            cpu::detail::fp32_row_to_fp16(v.row(t), &v_[at], width);
        });
    }

    // Tiles of up to kAttentionTileTokens consecutive batch tokens of one
    // sequence at consecutive positions (a prefill's run; a decode step's
    // tokens are tiles of one), one (tile, KV head) pair per iteration.
    void attention(int layer, Tensor q, int n_heads, float scale, int window, Tensor out) override {
        const KvCacheShape& s = kv_shape_;
        const int group = n_heads / s.n_kv_heads;
        tiles_.clear();
        for (int64_t t = 0; t < q.rows; ++t) {
            const bool extends = !tiles_.empty() && t - tiles_.back() < cpu::kAttentionTileTokens &&
                                 layout_.slot[size_t(t)] == layout_.slot[size_t(t - 1)] &&
                                 layout_.pos[size_t(t)] == layout_.pos[size_t(t - 1)] + 1;
            if (!extends) tiles_.push_back(t);
        }
        const int64_t n_tiles = int64_t(tiles_.size());
        const int64_t work = n_tiles * s.n_kv_heads;
        cpu::parallel_for_dynamic(work, work > 1 && layout_.pos[0] + q.rows > 64, [&](int64_t i) {
            const int64_t tile = i / s.n_kv_heads;
            const int kvh = int(i % s.n_kv_heads);
            const int64_t t0 = tiles_[size_t(tile)];
            const int n_t = int((tile + 1 < n_tiles ? tiles_[size_t(tile + 1)] : q.rows) - t0);
            int first[cpu::kAttentionTileTokens], last[cpu::kAttentionTileTokens];
            for (int t = 0; t < n_t; ++t) {
                last[t] = layout_.pos[size_t(t0 + t)];
                first[t] = window > 0 ? std::max(0, last[t] - window + 1) : 0;
            }
            const int64_t head0 = int64_t(kvh) * group * s.head_dim;  // first query head of the group
            const int32_t* table = pages_.slot_pages(layout_.slot[size_t(t0)]);
            const size_t layer0 = kv_offset(layer, 0, 0);
            const int64_t row_stride = int64_t(s.n_kv_heads) * s.head_dim;
            const int shift = std::countr_zero(unsigned(s.page_size));  // a power of two (init_kv_cache)
            const cpu::KvRows k{k_.data() + layer0, row_stride, table, shift};
            const cpu::KvRows v{v_.data() + layer0, row_stride, table, shift};
            if (n_t == 1) {  // decode: the one-token form, the same bits, faster alone
                cpu::attention_kv_group(q.row(t0) + head0, group, k, v, first[0], last[0] + 1 - first[0], kvh,
                                        s.head_dim, scale, out.row(t0) + head0);
                return;
            }
            const cpu::AttentionTile a{q.row(t0) + head0, q.cols, n_t, group, first, last, out.row(t0) + head0, out.cols};
            cpu::attention_tile(a, k, v, kvh, s.head_dim, scale);
        });
    }

    void swiglu(Tensor gate, Tensor up) override { cpu::swiglu(gate.data, up.data, gate.rows * gate.cols); }
    void geglu(Tensor gate, Tensor up) override { cpu::geglu(gate.data, up.data, gate.rows * gate.cols); }
    void scale(Tensor x, float s) override { cpu::scale(x.data, s, x.rows * x.cols); }

    void add(Tensor x, Tensor y) override {
        const int64_t n = x.rows * x.cols;
        cpu::parallel_for(n, n >= (1 << 15), [&](int64_t i) { x.data[i] += y.data[i]; });
    }

    void gather_rows(Tensor x, const std::vector<int32_t>& rows, Tensor out) override {
        for (size_t i = 0; i < rows.size(); ++i)
            std::memmove(out.row(int64_t(i)), x.row(rows[i]), size_t(x.cols) * sizeof(float));
    }

    void route_experts(Tensor logits, int k) override {
        if (k < 1 || k > logits.cols || logits.cols > kMaxExperts)
            return note(Error{"route_experts: " + std::to_string(k) + " of " + std::to_string(logits.cols) +
                              " experts cannot be routed (1 <= k <= experts <= " + std::to_string(kMaxExperts) + ")"});
        route_k_ = k;
        route_ids_.resize(size_t(logits.rows * k));
        route_w_.resize(size_t(logits.rows * k));
        for (int64_t t = 0; t < logits.rows; ++t)
            cpu::route_top_k(logits.row(t), int(logits.cols), k, &route_ids_[size_t(t * k)], &route_w_[size_t(t * k)]);
        // Each expert's routed rows, in order, for the expert matmuls that follow.
        expert_pairs_.assign(size_t(logits.cols), {});
        for (int64_t p = 0; p < int64_t(route_ids_.size()); ++p) expert_pairs_[size_t(route_ids_[size_t(p)])].push_back(p);
    }

    void matmul_experts(const std::vector<Weight>& experts, Tensor x, Tensor y) override {
        matmul_experts_shared(x, {{&experts, y}});
    }

    // Each expert's rows gathered (x quantized once for the sets whose type
    // reads quantized activations of one grouping), one matmul per expert,
    // the rows put back.
    void matmul_experts_shared(Tensor x, std::initializer_list<ExpertTarget> targets) override {
        const int64_t n_pairs = int64_t(route_ids_.size()), k = route_k_;
        const int64_t per = x.rows == n_pairs ? 1 : k;  // pairs per input row
        const int64_t xb = x.cols / quant::QK8A;
        std::optional<bool> quantized;  // the grouping shared_xq_ holds for x
        try {
            for (const ExpertTarget& t : targets) {
                const std::vector<Weight>& experts = *t.experts;
                const Tensor y = t.y;
                if (n_pairs == 0 || (x.rows != n_pairs && x.rows * k != n_pairs) || y.rows != n_pairs ||
                    experts.size() != expert_pairs_.size())
                    return note(Error{"matmul_experts: " + std::to_string(x.rows) + " input rows and " +
                                      std::to_string(experts.size()) + " experts do not match the routing of " +
                                      std::to_string(n_pairs / std::max<int64_t>(k, 1)) + " tokens over " +
                                      std::to_string(expert_pairs_.size())});
                const bool int_kernel = quant::dot_int_type(experts[0].type) && x.cols % quant::QK8A == 0;
                if (int_kernel) {
                    if (const bool grouped = cpu::reads_grouped_acts(experts[0].type, matmul_opt_); quantized != grouped) {
                        shared_xq_.resize(size_t(x.rows * xb));
                        if (Status s = cpu::quantize_activations(x.data, x.rows, x.cols, shared_xq_.data(), matmul_opt_,
                                                                 grouped);
                            !s.ok())
                            return note(s);
                        quantized = grouped;
                    }
                }
                for (size_t e = 0; e < experts.size(); ++e) {
                    const std::vector<int64_t>& pairs = expert_pairs_[e];
                    const int64_t n = int64_t(pairs.size());
                    if (n == 0) continue;
                    expert_y_.resize(size_t(n * y.cols));
                    Status s;
                    if (int_kernel) {
                        expert_xq_.resize(size_t(n * xb));
                        for (int64_t i = 0; i < n; ++i)
                            std::memcpy(&expert_xq_[size_t(i * xb)], &shared_xq_[size_t(pairs[size_t(i)] / per * xb)],
                                        size_t(xb) * sizeof(quant::block_q8a));
                        s = cpu::matmul_q8a(experts[e], expert_xq_.data(), n, expert_y_.data(), matmul_opt_);
                    } else {
                        expert_x_.resize(size_t(n * x.cols));
                        for (int64_t i = 0; i < n; ++i)
                            std::memcpy(&expert_x_[size_t(i * x.cols)], x.row(pairs[size_t(i)] / per),
                                        size_t(x.cols) * sizeof(float));
                        s = cpu::matmul(experts[e], expert_x_.data(), n, expert_y_.data(), matmul_opt_);
                    }
                    if (!s.ok()) return note(s);
                    for (int64_t i = 0; i < n; ++i)
                        std::memcpy(y.row(pairs[size_t(i)]), &expert_y_[size_t(i * y.cols)],
                                    size_t(y.cols) * sizeof(float));
                }
            }
        } catch (const std::bad_alloc&) {
            note(Error{"matmul_experts: out of memory for " + std::to_string(n_pairs) + " routed rows"});
        }
    }

    void combine_experts(Tensor y, Tensor out) override {
        const int64_t k = route_k_;
        if (y.rows != int64_t(route_ids_.size()) || out.rows * k != y.rows || out.cols != y.cols)
            return note(Error{"combine_experts: shapes do not match the routing"});
        cpu::parallel_for(out.rows, out.rows > 1, [&](int64_t t) {
            float* o = out.row(t);
            for (int64_t i = 0; i < out.cols; ++i) {
                float acc = route_w_[size_t(t * k)] * y.row(t * k)[i];
                for (int64_t j = 1; j < k; ++j) acc = std::fma(route_w_[size_t(t * k + j)], y.row(t * k + j)[i], acc);
                o[i] = acc;
            }
        });
    }

    void all_reduce_sum(Tensor x) override {
        if (!host_) return note(Error{"cpu: all_reduce_sum needs a host group (this backend " +
                                     std::string(group_ ? "is in a " + group_->kind() + " group)" : "has none)")});
        if (Status s = host_->all_reduce_sum(rank_, x.data, size_t(x.rows * x.cols)); !s.ok()) {
            group_->abandon(rank_);
            note(s);
        }
    }

    void synchronize() override {}

    Status take_error() override {
        Status s = std::move(error_);
        error_ = {};
        return s;
    }

private:
    // 1-D weights as f32: in place when the file stores f32, else the copy made at registration.
    static const float* f32(const Weight& w) {
        return w.impl ? static_cast<const float*>(w.impl) : static_cast<const float*>(w.host);
    }

    void add_bias(Tensor y, const Weight& bias) {
        const float* b = f32(bias);
        for (int64_t t = 0; t < y.rows; ++t)
            for (int64_t i = 0; i < y.cols; ++i) y.row(t)[i] += b[i];
    }

    void note(const Status& s) {
        if (error_.ok()) error_ = s;
    }

    // Halves before row `row` of pool page `page` in `layer`'s K (or V).
    size_t kv_offset(int layer, int32_t page, int row) const {
        const KvCacheShape& s = kv_shape_;
        return ((size_t(layer) * size_t(s.pool_pages()) + size_t(page)) * size_t(s.page_size) + size_t(row)) *
               size_t(s.n_kv_heads) * size_t(s.head_dim);
    }

    int threads_;
    std::shared_ptr<CommGroup> group_;
    HostGroup* host_;  // group_ when it is a host group (the only kind CPU ranks sum through), else null
    int rank_ = 0;
    std::deque<ZeroedArray<float>> buffers_;
    std::deque<std::vector<float>> small_f32_;
    cpu::WeightArena arena_;
    bool interleave_ = interleave_on();
    std::vector<uint8_t> embed_row_;
    std::vector<quant::block_q8a> shared_xq_;  // matmul_shared's quantized input
    // The routing of route_experts: k experts and weights per token, each
    // expert's routed rows, and the expert matmuls' gathered rows.
    int route_k_ = 0;
    std::vector<int32_t> route_ids_;
    std::vector<float> route_w_;
    std::vector<std::vector<int64_t>> expert_pairs_;
    std::vector<quant::block_q8a> expert_xq_;
    std::vector<float> expert_x_, expert_y_;
    cpu::MatmulOptions matmul_opt_;
    KvCacheShape kv_shape_;
    ZeroedArray<uint16_t> k_, v_;
    KvPageTable pages_;
    BatchLayout layout_;
    struct CachedRope {
        int64_t rows = 0;  // positions it holds: 0 until computed for this batch
        RopeParams params;
        cpu::RopeTable table;
    };
    std::array<CachedRope, 2> rope_tables_;  // this batch's tables
    size_t next_rope_table_ = 0;
    std::vector<int64_t> tiles_;  // attention: the first batch token of each tile
    Status error_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads, std::shared_ptr<CommGroup> group, int rank,
                                          bool grouped_kquant_acts) {
    return std::make_unique<CpuBackend>(threads, std::move(group), rank, grouped_kquant_acts);
}

}  // namespace tern::backend
