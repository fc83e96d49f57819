// Tensor parallelism's arithmetic on the CPU (model/tensor_parallel): the plan
// (every head, FFN column and vocabulary row owned exactly once, split points
// on block boundaries, clear errors when a model cannot be divided), the
// zero-copy weight views, and the simulated tensor-parallel forward, which must
// give the unsharded forward's logits over a prefill and decode steps, for
// float and quantized files, GQA llama and qwen2 with biases; and the Engine
// with --tp on the CPU backend (the path `tern run --backend cpu --tp N` takes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <numeric>
#include <random>
#include <string>

#include "backend/backend.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ops.h"
#include "gguf/gguf.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tensor_parallel.h"
#include "quant/quant.h"
#include "runtime/engine.h"
#include "tests/support/test_shapes.h"
#include "tests/support/test_seed.h"

namespace {

using namespace tern;

// ---- the plan, on models described by their weights' types and shapes only ----

backend::Weight shaped(const std::string& name, TensorType t, int64_t cols, int64_t rows) {
    backend::Weight w;
    w.name = name;
    w.type = t;
    w.cols = cols;
    w.rows = rows;
    return w;
}

model::Model fake_model(int n_head, int n_head_kv, int head_dim, int n_ff, int n_vocab,
                        const std::vector<TensorType>& down_types, TensorType wo_type) {
    model::Model m;
    model::Hparams& h = m.hp;
    h.arch = "llama";
    h.n_head = n_head;
    h.n_head_kv = n_head_kv;
    h.head_dim = head_dim;
    h.n_embd = n_head * head_dim;
    h.n_ff = n_ff;
    h.n_vocab = n_vocab;
    h.n_layer = int(down_types.size());
    static const char kByte = 0;  // plan only needs the output head to be present
    m.output = shaped("output.weight", TensorType::F32, h.n_embd, n_vocab);
    m.output.host = &kByte;
    for (size_t il = 0; il < down_types.size(); ++il) {
        model::Layer L;
        const std::string p = "blk." + std::to_string(il) + ".";
        L.wo = shaped(p + "attn_output.weight", wo_type, int64_t(n_head) * head_dim, h.n_embd);
        L.w_down = shaped(p + "ffn_down.weight", down_types[il], n_ff, h.n_embd);
        m.layers.push_back(L);
    }
    return m;
}

int64_t block_elems(TensorType t) { return tensor_type_info(uint32_t(t))->block_elems; }

TEST(TensorParallelPlan, EveryHeadColumnAndRowOwnedOnceOnBlockBoundaries) {
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const TensorType types[] = {TensorType::F32, TensorType::F16, TensorType::Q8_0, TensorType::Q4_0,
                                TensorType::Q4_K, TensorType::Q6_K};
    const int rank_counts[] = {1, 2, 3, 4, 8};
    int planned = 0;
    for (int trial = 0; trial < 300; ++trial) {
        const int n_ranks = rank_counts[rng() % 5];
        const int n_head_kv = n_ranks * int(1 + rng() % 3);
        const int group = int(1 + rng() % 4);
        std::vector<TensorType> down(1 + rng() % 3);
        for (auto& t : down) t = types[rng() % 6];
        int64_t align = 1;
        for (TensorType t : down) align = std::lcm(align, block_elems(t));
        const int n_ff = int(align * int64_t(n_ranks + rng() % 40));
        const int n_vocab = int(n_ranks + rng() % 5000);
        auto m = fake_model(n_head_kv * group, n_head_kv, 64, n_ff, n_vocab, down, TensorType::Q8_0);
        auto plan = model::plan_tensor_parallel(m.hp, m, n_ranks);
        ASSERT_TRUE(plan.ok()) << plan.error().message;
        ++planned;
        ASSERT_EQ(plan->n_ranks, n_ranks);
        ASSERT_EQ(plan->ranks.size(), size_t(n_ranks));
        EXPECT_EQ(plan->group, group);
        EXPECT_EQ(plan->ff_align, align);
        int kv_next = 0;
        int64_t ff_next = 0, vocab_next = 0;
        int64_t ff_min = n_ff, ff_max = 0, v_min = n_vocab, v_max = 0;
        for (const model::TpRank& r : plan->ranks) {
            // Contiguous, non-empty, in order: each unit has exactly one owner.
            EXPECT_EQ(r.kv_head_begin, kv_next);
            EXPECT_EQ(r.kv_head_end - r.kv_head_begin, n_head_kv / n_ranks);
            EXPECT_EQ(r.ff_begin, ff_next);
            EXPECT_GT(r.ff_end, r.ff_begin);
            EXPECT_EQ(r.vocab_begin, vocab_next);
            EXPECT_GT(r.vocab_end, r.vocab_begin);
            for (TensorType t : down) EXPECT_EQ(r.ff_begin % block_elems(t), 0) << tensor_type_name(uint32_t(t));
            kv_next = r.kv_head_end;
            ff_next = r.ff_end;
            vocab_next = r.vocab_end;
            ff_min = std::min(ff_min, r.ff_end - r.ff_begin);
            ff_max = std::max(ff_max, r.ff_end - r.ff_begin);
            v_min = std::min(v_min, r.vocab_end - r.vocab_begin);
            v_max = std::max(v_max, r.vocab_end - r.vocab_begin);
        }
        EXPECT_EQ(kv_next, n_head_kv);
        EXPECT_EQ(ff_next, n_ff);
        EXPECT_EQ(vocab_next, n_vocab);
        EXPECT_LE(ff_max - ff_min, align) << "FFN split as evenly as the blocks allow";
        EXPECT_LE(v_max - v_min, 1) << "vocabulary split as evenly as possible";
    }
    EXPECT_EQ(planned, 300);
}

void expect_error_mentions(const Result<model::TpPlan>& plan, const std::vector<std::string>& words) {
    ASSERT_FALSE(plan.ok());
    for (const std::string& w : words)
        EXPECT_NE(plan.error().message.find(w), std::string::npos) << "'" << w << "' not in: " << plan.error().message;
}

TEST(TensorParallelPlan, ErrorsNameWhatDoesNotDivide) {
    // 2 KV heads over 4 ranks.
    auto m = fake_model(8, 2, 64, 1024, 1000, {TensorType::Q8_0}, TensorType::Q8_0);
    expect_error_mentions(model::plan_tensor_parallel(m.hp, m, 4), {"n_head_kv = 2", "4 ranks"});
    // 3 KV heads over 2 ranks.
    m = fake_model(6, 3, 64, 1024, 1000, {TensorType::Q8_0}, TensorType::Q8_0);
    expect_error_mentions(model::plan_tensor_parallel(m.hp, m, 2), {"n_head_kv = 3", "2 ranks"});
    // A q4_K W_down of width 512 has two 256-element blocks per row: not four parts.
    m = fake_model(8, 4, 64, 512, 1000, {TensorType::Q8_0, TensorType::Q4_K}, TensorType::Q8_0);
    expect_error_mentions(model::plan_tensor_parallel(m.hp, m, 4),
                          {"n_ff = 512", "multiples of 256", "blk.1.ffn_down.weight", "2 parts", "4 ranks"});
    EXPECT_TRUE(model::plan_tensor_parallel(m.hp, m, 2).ok());
    // A q4_K Wo whose per-rank share (one 64-wide head) is a quarter block.
    m = fake_model(4, 4, 64, 1024, 1000, {TensorType::Q8_0}, TensorType::Q4_K);
    expect_error_mentions(model::plan_tensor_parallel(m.hp, m, 4),
                          {"blk.0.attn_output.weight", "q4_K", "1 query heads = 64 input columns"});
    EXPECT_TRUE(model::plan_tensor_parallel(m.hp, m, 1).ok());
    // Fewer vocabulary rows than ranks, and no ranks at all.
    m = fake_model(4, 4, 64, 1024, 3, {TensorType::F32}, TensorType::F32);
    expect_error_mentions(model::plan_tensor_parallel(m.hp, m, 4), {"3 vocabulary rows", "4 ranks"});
    expect_error_mentions(model::plan_tensor_parallel(m.hp, m, 0), {"0 ranks"});
}

// ---- weight views ----

struct HostMatrix {
    std::vector<uint8_t> bytes;
    backend::Weight w;
};

HostMatrix random_matrix(std::mt19937_64& rng, TensorType t, int64_t rows, int64_t cols) {
    std::normal_distribution<float> nd(0.0f, 1.0f);
    HostMatrix m;
    const size_t rb = quant::row_bytes(t, cols);
    m.bytes.resize(size_t(rows) * rb);
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
        for (float& v : row) v = nd(rng);
        EXPECT_TRUE(quant::quantize_row(t, row.data(), m.bytes.data() + size_t(r) * rb, cols).ok());
    }
    m.w = shaped("m", t, cols, rows);
    m.w.host = m.bytes.data();
    m.w.row_bytes = rb;
    return m;
}

std::vector<float> dequantized_row(const backend::Weight& w, int64_t r) {
    std::vector<float> out(size_t(w.cols));
    const auto* row = static_cast<const uint8_t*>(w.host) + size_t(r) * w.row_bytes;
    EXPECT_TRUE(quant::dequantize_row(w.type, row, out.data(), w.cols).ok());
    return out;
}

// A weight a backend holds in its own layout (the CPU's interleaved rows) has
// no GGUF rows to view: refused by name.
TEST(TensorParallelViews, RegistrationLayoutsAreRefused) {
    std::mt19937_64 rng(test::run_seed());
    HostMatrix m = random_matrix(rng, TensorType::Q8_0, 32, 64);
    m.w.layout = backend::WeightLayout::interleaved16;
    for (auto view : {model::weight_rows(m.w, 0, 16), model::weight_cols(m.w, 0, 32)}) {
        ASSERT_FALSE(view.ok());
        EXPECT_NE(view.error().message.find("registration layout"), std::string::npos) << view.error().message;
        EXPECT_NE(view.error().message.find(m.w.name), std::string::npos) << view.error().message;
    }
}

TEST(TensorParallelViews, RowAndColumnSlicesReadTheRightBlocks) {
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    for (TensorType t : {TensorType::F32, TensorType::F16, TensorType::Q8_0, TensorType::Q4_K, TensorType::Q6_K}) {
        SCOPED_TRACE(tensor_type_name(uint32_t(t)));
        const int64_t be = block_elems(t) == 1 ? 32 : block_elems(t);
        const int64_t rows = 37, cols = 4 * be;
        HostMatrix m = random_matrix(rng, t, rows, cols);
        auto rv = model::weight_rows(m.w, 5, 30);
        ASSERT_TRUE(rv.ok()) << rv.error().message;
        EXPECT_EQ(rv->rows, 25);
        EXPECT_EQ(rv->cols, cols);
        EXPECT_EQ(dequantized_row(*rv, 3), dequantized_row(m.w, 8));
        auto cv = model::weight_cols(m.w, be, 3 * be);
        ASSERT_TRUE(cv.ok()) << cv.error().message;
        EXPECT_EQ(cv->cols, 2 * be);
        EXPECT_EQ(cv->row_bytes, m.w.row_bytes);  // the stride stays the full row's
        for (int64_t r : {int64_t(0), int64_t(17), rows - 1}) {
            const std::vector<float> full = dequantized_row(m.w, r);
            EXPECT_EQ(dequantized_row(*cv, r), std::vector<float>(full.begin() + be, full.begin() + 3 * be));
        }
        // The CPU matmul honours the stride: partial products over column slices sum to the full product.
        const int64_t n_tok = 3;
        std::vector<float> x(size_t(n_tok * cols));
        std::normal_distribution<float> nd(0.0f, 1.0f);
        for (float& v : x) v = nd(rng);
        model::Logits want(size_t(n_tok * rows)), sum(size_t(n_tok * rows), 0.0f);
        ASSERT_TRUE(backend::cpu::matmul(m.w, x.data(), n_tok, want.data()).ok());
        for (int64_t c0 = 0; c0 < cols; c0 += 2 * be) {
            auto part_w = model::weight_cols(m.w, c0, c0 + 2 * be);
            ASSERT_TRUE(part_w.ok());
            std::vector<float> xs(size_t(n_tok * 2 * be)), part(size_t(n_tok * rows));
            for (int64_t tk = 0; tk < n_tok; ++tk)
                std::copy_n(x.begin() + tk * cols + c0, 2 * be, xs.begin() + tk * 2 * be);
            const Status s = backend::cpu::matmul(*part_w, xs.data(), n_tok, part.data());
            ASSERT_TRUE(s.ok()) << s.message();
            for (size_t i = 0; i < sum.size(); ++i) sum[i] += part[i];
        }
        for (size_t i = 0; i < sum.size(); ++i) EXPECT_NEAR(sum[i], want[i], 1e-4f * (1.0f + std::fabs(want[i])));
        if (block_elems(t) > 1) {
            EXPECT_FALSE(model::weight_cols(m.w, be / 2, 2 * be).ok());  // mid-block split
        }
        EXPECT_FALSE(model::weight_rows(m.w, 10, 10).ok());
        EXPECT_FALSE(model::weight_rows(m.w, 0, rows + 1).ok());
        EXPECT_FALSE(model::weight_cols(m.w, 0, cols + be).ok());
    }
}

// ---- the simulated tensor-parallel forward against the unsharded one ----


struct TpCase {
    const char* name;
    model::SynthShape shape;
    quant::FileType ftype;
    std::vector<int> rank_counts;
    double tolerance;  // max |logit difference| / max |logit| per position
};

void PrintTo(const TpCase& c, std::ostream* os) { *os << c.name; }

// Float weights: the ranks' partial sums add in another order than one long
// dot product, so only rounding differs. Quantized: activations are quantized
// per 32-element block in both runs and every split point is block aligned, so
// each rank's partial is exactly a subset of the unsharded dot product's block
// terms; the rounding of the sums differs, which can then move an activation
// across a quantization step in a later layer.
// The quantized bound is the forward test's (test_forward.cpp): about twice
// the worst 1.4e-2 seen over ~50 runs of every case.
constexpr double kFloatTol = 1e-4;
constexpr double kQuantTol = 3e-2;

constexpr int kPrompt = 20, kDecode = 8;

// Rows of logits for a prompt then kDecode single-token steps; the decode
// tokens are given (greedy picks of the unsharded run) so every runner sees the same sequence.
using RunFn = std::function<Status(const model::Batch&, model::Logits&)>;

std::vector<std::vector<float>> run_sequence(const RunFn& run, const std::vector<int32_t>& tokens, size_t n_vocab,
                                             std::vector<int32_t>* greedy_out) {
    std::vector<std::vector<float>> rows;
    model::Batch prefill;
    for (int i = 0; i < kPrompt; ++i) prefill.add(tokens[size_t(i)], i, 0, true);
    model::Logits logits;
    const Status s = run(prefill, logits);
    EXPECT_TRUE(s.ok()) << s.message();
    if (!s.ok()) return rows;
    for (int i = 0; i < kPrompt; ++i)
        rows.emplace_back(logits.begin() + int64_t(size_t(i) * n_vocab), logits.begin() + int64_t(size_t(i + 1) * n_vocab));
    for (int step = 0; step < kDecode; ++step) {
        int32_t next;
        if (greedy_out) {
            const auto& last = rows.back();
            next = int32_t(std::max_element(last.begin(), last.end()) - last.begin());
            greedy_out->push_back(next);
        } else {
            next = tokens[size_t(kPrompt + step)];
        }
        model::Batch one;
        one.add(next, kPrompt + step, 0, true);
        const Status d = run(one, logits);
        EXPECT_TRUE(d.ok()) << d.message();
        if (!d.ok()) return rows;
        rows.emplace_back(logits.begin(), logits.end());
    }
    return rows;
}

// A mixture of experts whose 4 KV heads and 512-wide experts divide over 2 and 4 ranks.
model::SynthShape moe_tp_shape(const std::string& arch) {
    model::SynthShape s = test::moe_shape(arch);
    s.n_embd = 512;
    s.n_head = 8;
    s.n_head_kv = 4;
    s.n_ff = 512;
    return s;
}

class CpuTp : public ::testing::TestWithParam<TpCase> {};

TEST_P(CpuTp, EqualsUnshardedForward) {
    const TpCase& c = GetParam();
    const uint64_t seed = test::run_seed();
    SCOPED_TRACE(std::string(c.name) + " seed " + std::to_string(seed));
    model::SynthOptions o;
    o.shape = c.shape;
    o.ftype = c.ftype;
    o.seed = seed;
    o.n_threads = 2;
    auto written = test::write_temp_model("tp-" + std::string(c.name) + "-" + std::to_string(seed), o);
    ASSERT_TRUE(written.ok()) << written.error().message;
    const std::string path = *written;
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto be = backend::make_cpu_backend(2);
    auto m = model::load_model(**file, *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const size_t nv = size_t(m->hp.n_vocab);
    // The ranks view the file's rows (a registered model may hold the CPU's own layout).
    auto described = model::describe_model(**file);
    ASSERT_TRUE(described.ok()) << described.error().message;

    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int32_t> tok(0, m->hp.n_vocab - 1);
    std::vector<int32_t> tokens(kPrompt);
    for (auto& t : tokens) t = tok(rng);

    auto whole = model::Forward::create(*m, *be, kPrompt, 1, 64);
    ASSERT_TRUE(whole.ok()) << whole.error().message;
    std::vector<int32_t> greedy;
    const auto want = run_sequence([&](const model::Batch& b, model::Logits& l) { return (*whole)->run(b, l); },
                                   tokens, nv, &greedy);
    ASSERT_EQ(want.size(), size_t(kPrompt + kDecode));
    tokens.insert(tokens.end(), greedy.begin(), greedy.end());

    for (int n_ranks : c.rank_counts) {
        SCOPED_TRACE("TP=" + std::to_string(n_ranks));
        auto tp = model::make_cpu_tensor_parallel(*described, n_ranks, kPrompt, 1, 64);
        ASSERT_TRUE(tp.ok()) << tp.error().message;
        const auto got = run_sequence([&](const model::Batch& b, model::Logits& l) { return (*tp)->run(b, l); },
                                      tokens, nv, nullptr);
        ASSERT_EQ(got.size(), want.size());
        double worst = 0;
        int clear = 0, agree = 0;
        for (size_t p = 0; p < want.size(); ++p) {
            ASSERT_EQ(got[p].size(), nv);
            double peak = 0, diff = 0;
            for (size_t j = 0; j < nv; ++j) {
                ASSERT_TRUE(std::isfinite(got[p][j])) << "position " << p << " logit " << j;
                peak = std::max(peak, std::fabs(double(want[p][j])));
                diff = std::max(diff, std::fabs(double(got[p][j]) - want[p][j]));
            }
            worst = std::max(worst, diff / peak);
            EXPECT_LE(diff, c.tolerance * peak) << "position " << p;
            // Top-1 where the unsharded margin exceeds the tolerance. (Over twice
            // the tolerance the logit bound above would already decide it;
            // between one and two times it, a pick can still flip.)
            std::vector<float> sorted = want[p];
            std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
            if (sorted[0] - sorted[1] > c.tolerance * peak) {
                ++clear;
                const auto top = [](const std::vector<float>& v) { return std::max_element(v.begin(), v.end()) - v.begin(); };
                agree += top(got[p]) == top(want[p]);
            }
        }
        // Greedy picks, every other row: each the argmax_first of its gathered row.
        model::Batch picked;
        for (int i = 0; i < kPrompt; ++i) picked.add(tokens[size_t(i)], i, 0, true, i % 2 == 0);
        model::Logits rows;
        model::Pass::Picks picks;
        ASSERT_TRUE((*tp)->run(picked, rows, &picks).ok());
        EXPECT_GT((*tp)->last_issue_seconds(), 0.0);  // the ranks' longest
        ASSERT_EQ(picks.size(), size_t(kPrompt));
        for (size_t i = 0; i < size_t(kPrompt); i += 2)
            ASSERT_EQ(picks[i], int32_t(backend::cpu::argmax_first(rows.data() + i * nv, int64_t(nv)))) << "row " << i;
        ASSERT_GE(clear, int(want.size()) / 4) << "too few positions with a clear top-1 to judge";
        EXPECT_GE(agree, 0.99 * clear) << agree << " of " << clear << " clear top-1 picks agree";
        std::printf("  %s TP=%d: worst logit error %.2e of max |logit| (tolerance %.0e), top-1 %d/%d clear\n", c.name,
                    n_ranks, worst, c.tolerance, agree, clear);
    }
    std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(
    Models, CpuTp,
    ::testing::Values(
        // MHA llama; Q8_0 at TP=4 splits Wo at one 64-wide head, two 32-blocks.
        TpCase{"llama_f32", test::llama_shape(256, 4, 4, 1024), quant::FileType::ALL_F32, {2, 4}, kFloatTol},
        TpCase{"llama_q8_0", test::llama_shape(256, 4, 4, 1024), quant::FileType::Q8_0, {2, 4}, kQuantTol},
        // GQA (2 query heads per KV head); K-quant splits need 256-element shares:
        // 4 ranks x 2 heads x 128 = Wo's 1024 columns, n_ff 1024 = 4 x 256.
        TpCase{"llama_gqa_f16", test::llama_shape(1024, 8, 4, 1024), quant::FileType::F16, {2, 4}, kFloatTol},
        TpCase{"llama_gqa_q4_k_m", test::llama_shape(1024, 8, 4, 1024), quant::FileType::Q4_K_M, {2, 4}, kQuantTol},
        TpCase{"llama_gqa_q6_k", test::llama_shape(1024, 8, 4, 1024), quant::FileType::Q6_K, {2, 4}, kQuantTol},
        // qwen2: q/k/v biases shard with their rows; tied output (the embedding's rows).
        TpCase{"qwen2_f32", test::qwen2_tied_shape(), quant::FileType::ALL_F32, {2}, kFloatTol},
        TpCase{"qwen2_q8_0", test::qwen2_tied_shape(), quant::FileType::Q8_0, {2}, kQuantTol},
        // Per-head q/k norms: replicated on every rank, applied to its own heads.
        TpCase{"qwen3_q8_0", test::qwen3_shape(), quant::FileType::Q8_0, {2, 4}, kQuantTol},
        // gemma3: post-norms after the all-reduce, sliding-window layers, 4 KV heads of 128.
        TpCase{"gemma3_q8_0", test::gemma3_shape(512, 8, 4, 128, 1024), quant::FileType::Q8_0, {2, 4}, kQuantTol},
        // phi3: views of the fused tensors' rows, sharded again; LongRoPE factors replicated.
        TpCase{"phi3_q8_0", test::phi3_shape(512, 8, 4, 1024), quant::FileType::Q8_0, {2, 4}, kQuantTol},
        // Mixtures of experts: every expert split like the dense FFN, the router replicated. Float
        // files only: rounded activations could break a near tie of two router logits differently
        // on the ranks' summed residual than on the unsharded one, and pick another expert.
        TpCase{"qwen3moe_f32", moe_tp_shape("qwen3moe"), quant::FileType::ALL_F32, {2, 4}, kFloatTol},
        TpCase{"mixtral_f16", moe_tp_shape("llama"), quant::FileType::F16, {2, 4}, kFloatTol}),
    [](const ::testing::TestParamInfo<TpCase>& i) { return std::string(i.param.name); });

// A batch one rank rejects ends the call on every rank with that error (no
// rank is left waiting for the others' partials), and the next batch runs.
TEST(CpuTensorParallel, ErrorsReachTheCallerAndLeaveTheRanksUsable) {
    model::SynthOptions o;
    o.shape = test::llama_shape(256, 4, 2, 512);
    o.ftype = quant::FileType::Q8_0;
    o.seed = test::run_seed();
    auto written = test::write_temp_model("tp-errors-" + std::to_string(o.seed), o);
    ASSERT_TRUE(written.ok()) << written.error().message;
    const std::string path = *written;
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok());
    auto m = model::describe_model(**file);
    ASSERT_TRUE(m.ok());
    auto bad = model::make_cpu_tensor_parallel(*m, 4, 4, 1, 8);
    ASSERT_FALSE(bad.ok());
    EXPECT_NE(bad.error().message.find("n_head_kv = 2"), std::string::npos) << bad.error().message;

    auto tp = model::make_cpu_tensor_parallel(*m, 2, 4, 1, 8);
    ASSERT_TRUE(tp.ok()) << tp.error().message;
    model::Logits logits;
    model::Batch b;
    b.add(m->hp.n_vocab, 0, 0, true);
    const Status s = (*tp)->run(b, logits);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("outside the vocabulary"), std::string::npos) << s.message();
    b = {};
    b.add(1, 0, 0, true);
    const Status ok = (*tp)->run(b, logits);
    ASSERT_TRUE(ok.ok()) << ok.message();
    EXPECT_EQ(logits.size(), size_t(m->hp.n_vocab));
    std::filesystem::remove(path);
}

// The Engine's --tp on the CPU: the same weights over two ranks give one
// rank's logits within the quantized tolerance, report the backend and rank
// count, and a size that cannot divide the model is an error naming why.
TEST(CpuTensorParallel, EngineRunsRanksAndRefusesWhatCannotSplit) {
    model::SynthOptions o;
    o.shape = test::llama_shape(256, 4, 2, 512);
    o.ftype = quant::FileType::Q8_0;
    o.seed = test::run_seed();
    SCOPED_TRACE("seed " + std::to_string(o.seed));
    auto written = test::write_temp_model("tp-engine-" + std::to_string(o.seed), o);
    ASSERT_TRUE(written.ok()) << written.error().message;
    const std::string path = *written;
    runtime::EngineOptions eo;
    eo.backend = "cpu";
    eo.threads = 2;
    eo.n_ctx = 32;
    auto one = runtime::Engine::open(path, eo);
    ASSERT_TRUE(one.ok()) << one.error().message;
    eo.tp = 2;
    auto two = runtime::Engine::open(path, eo);
    ASSERT_TRUE(two.ok()) << two.error().message;
    EXPECT_EQ((*two)->tp(), 2);
    EXPECT_EQ((*two)->backend_name(), "cpu");
    EXPECT_EQ((*two)->device_bytes(), 0u);
    EXPECT_EQ((*two)->n_ctx(), 32);

    std::mt19937_64 rng(o.seed);
    model::Batch b;
    for (int i = 0; i < 12; ++i) b.add(int32_t(rng() % uint64_t(o.shape.n_vocab)), i, 0, true);
    model::Logits want, got;
    ASSERT_TRUE((*one)->forward().run(b, want).ok());
    ASSERT_TRUE((*two)->forward().run(b, got).ok());
    ASSERT_EQ(got.size(), want.size());
    const size_t nv = size_t(o.shape.n_vocab);
    for (size_t p = 0; p < want.size() / nv; ++p) {
        double peak = 0, diff = 0;
        for (size_t j = 0; j < nv; ++j) {
            peak = std::max(peak, std::fabs(double(want[p * nv + j])));
            diff = std::max(diff, std::fabs(double(got[p * nv + j]) - want[p * nv + j]));
        }
        EXPECT_LE(diff, kQuantTol * peak) << "position " << p;
    }

    eo.tp = 4;  // 2 KV heads over 4 ranks
    auto four = runtime::Engine::open(path, eo);
    ASSERT_FALSE(four.ok());
    EXPECT_NE(four.error().message.find("n_head_kv = 2 KV heads cannot be divided evenly over 4 ranks"),
              std::string::npos)
        << four.error().message;
    eo.tp = 0;
    auto none = runtime::Engine::open(path, eo);
    ASSERT_FALSE(none.ok());
    EXPECT_NE(none.error().message.find("between 1 and 64"), std::string::npos) << none.error().message;
    std::filesystem::remove(path);
}

}  // namespace
