// The forward pass on the CPU backend against the plain f32 reference
// (tests/support/reference_forward), on synthetic models of every weight type
// tern writes and every family's shape (GQA llama, qwen2 with biases and tied
// output, qwen3 with per-head q/k norms, gemma3 with sliding-window layers,
// phi3, the mixtures of experts qwen3moe and mixtral); and
// prefill of N tokens against token-by-token decode.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>

#include <unistd.h>

#include "backend/backend.h"
#include "backend/cpu/ops.h"
#include "base/fp16.h"
#include "gguf/gguf.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/support/reference_forward.h"
#include "tests/support/test_seed.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/test_shapes.h"

namespace {

using namespace tern;

struct Case {
    const char* shape;
    quant::FileType ftype;
    double tolerance;  // relative L2 error of the logits against the f32 reference
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.shape << "/ftype" << int(c.ftype); }

// The engine quantizes activations to 8 bits per 32 (src/quant/act_quant.h) and
// keeps K/V in f16; the reference does neither. With random weights that error
// is about 1/127/sqrt(3) per matmul input, compounded over layers.
constexpr double kFloatTol = 2e-3;
constexpr double kQuantTol = 3e-2;
// The gemma3 shape has six layers where the others have two or three, and the
// error compounds through them (its f32 and f16 cases stay under kFloatTol).
constexpr double kQuantTol6 = 5e-2;

using test::shape_named;

std::string write_model(const Case& c, uint64_t seed) {
    model::SynthOptions o;
    o.shape = shape_named(c.shape);
    o.ftype = c.ftype;
    o.seed = seed;
    o.n_threads = 2;
    auto r = test::write_temp_model(
        "forward-" + std::string(c.shape) + "-" + std::to_string(int(c.ftype)) + "-" + std::to_string(seed), o);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? *r : std::string();
}

double rel_error(std::span<const float> a, std::span<const float> b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

// Whether some row's k-th largest router logit is within 1e-4 (relative) of
// the next one: the boundary a float rounding can move.
bool has_near_tie(const test::Route& r) {
    for (int64_t t = 0; t < r.rows; ++t) {
        std::vector<float> v(r.logits.begin() + t * r.n_expert, r.logits.begin() + (t + 1) * r.n_expert);
        std::sort(v.begin(), v.end(), std::greater<float>());
        if (r.k >= r.n_expert) continue;
        const float a = v[size_t(r.k - 1)], b = v[size_t(r.k)];
        if (double(a) - double(b) <= 1e-4 * std::max(1.0, std::fabs(double(a)))) return true;
    }
    return false;
}

class ForwardVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardVsReference, LogitsAgree) {
    const Case c = GetParam();
    const uint64_t seed = tern::test::run_seed() + 7919u * uint32_t(c.ftype) + uint32_t(c.shape[0]);
    const std::string path = write_model(c, seed);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto be = std::make_unique<test::RoutingRecorder>(backend::make_cpu_backend(2));
    auto m = model::load_model(**file, *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    auto fwd = model::Forward::create(*m, *be, 16, 1, 64);
    ASSERT_TRUE(fwd.ok()) << fwd.error().message;

    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int32_t> tok(0, m->hp.n_vocab - 1);
    std::vector<int32_t> tokens(11);
    for (auto& t : tokens) t = tok(rng);

    model::Batch batch;
    for (size_t i = 0; i < tokens.size(); ++i) batch.add(tokens[i], int32_t(i), 0, true);
    model::Logits logits;
    ASSERT_TRUE((*fwd)->run(batch, logits).ok());

    ref::ReferenceForward reference(**file, m->hp, 64);
    // Float files route as exact arithmetic does, except where the k-th and
    // the next router logit are a near tie (rounding decides those);
    // quantized activations may break any close pair the other way. There
    // the reference follows the engine's choice (its weights still its own).
    const auto routes = be->take_routes();
    if (m->hp.n_expert > 0) {
        ASSERT_EQ(routes.size(), size_t(m->hp.n_layer));
        std::vector<std::vector<int32_t>> ids;
        bool near_tie = false;
        for (const test::Route& r : routes) {
            ids.push_back(r.ids);
            near_tie = near_tie || has_near_tie(r);
        }
        if (c.tolerance > kFloatTol || near_tie) reference.force_experts(ids);
    }
    const auto want = reference.run(tokens);
    const size_t nv = size_t(m->hp.n_vocab);
    double worst = 0;
    for (size_t t = 0; t < tokens.size(); ++t) {
        std::vector<float> got(logits.begin() + int64_t(t * nv), logits.begin() + int64_t((t + 1) * nv));
        for (float v : got) ASSERT_TRUE(std::isfinite(v));
        const double err = rel_error(got, want[t]);
        worst = std::max(worst, err);
        EXPECT_LT(err, c.tolerance) << c.shape << " ftype " << int(c.ftype) << " token " << t << " seed " << seed;
    }
    std::printf("  %s ftype %d: worst relative logit error %.2e (tolerance %.0e)\n", c.shape, int(c.ftype), worst,
                c.tolerance);
    std::filesystem::remove(path);
}

INSTANTIATE_TEST_SUITE_P(
    Types, ForwardVsReference,
    ::testing::Values(Case{"tiny", quant::FileType::ALL_F32, kFloatTol}, Case{"tiny", quant::FileType::F16, kFloatTol},
                      Case{"tiny", quant::FileType::BF16, kFloatTol}, Case{"tiny", quant::FileType::Q8_0, kQuantTol},
                      Case{"tiny", quant::FileType::Q4_0, kQuantTol}, Case{"tiny", quant::FileType::Q4_1, kQuantTol},
                      Case{"tiny", quant::FileType::Q5_0, kQuantTol}, Case{"tiny", quant::FileType::Q5_1, kQuantTol},
                      Case{"tiny", quant::FileType::Q2_K, kQuantTol}, Case{"tiny", quant::FileType::Q3_K_M, kQuantTol},
                      Case{"tiny", quant::FileType::Q4_K_M, kQuantTol}, Case{"tiny", quant::FileType::Q5_K_M, kQuantTol},
                      Case{"tiny", quant::FileType::Q6_K, kQuantTol}, Case{"qwen2", quant::FileType::ALL_F32, kFloatTol},
                      Case{"qwen2", quant::FileType::Q4_K_M, kQuantTol}, Case{"qwen2", quant::FileType::Q8_0, kQuantTol},
                      Case{"qwen3", quant::FileType::ALL_F32, kFloatTol}, Case{"qwen3", quant::FileType::F16, kFloatTol},
                      Case{"qwen3", quant::FileType::Q4_K_M, kQuantTol}, Case{"qwen3", quant::FileType::Q8_0, kQuantTol},
                      Case{"gemma3", quant::FileType::ALL_F32, kFloatTol}, Case{"gemma3", quant::FileType::F16, kFloatTol},
                      Case{"gemma3", quant::FileType::Q4_K_M, kQuantTol6}, Case{"gemma3", quant::FileType::Q8_0, kQuantTol6},
                      Case{"gemma3", quant::FileType::Q5_0, kQuantTol6},
                      Case{"phi3", quant::FileType::ALL_F32, kFloatTol}, Case{"phi3", quant::FileType::Q4_K_M, kQuantTol},
                      Case{"phi3", quant::FileType::Q8_0, kQuantTol},
                      Case{"qwen3moe", quant::FileType::ALL_F32, kFloatTol}, Case{"qwen3moe", quant::FileType::F16, kFloatTol},
                      Case{"qwen3moe", quant::FileType::Q4_K_M, kQuantTol}, Case{"qwen3moe", quant::FileType::Q8_0, kQuantTol},
                      Case{"qwen3moe", quant::FileType::Q4_0, kQuantTol},
                      Case{"mixtral", quant::FileType::ALL_F32, kFloatTol}, Case{"mixtral", quant::FileType::Q4_K_M, kQuantTol},
                      Case{"mixtral", quant::FileType::Q5_1, kQuantTol}),
    [](const ::testing::TestParamInfo<Case>& i) {
        return std::string(i.param.shape) + "_" + std::to_string(int(i.param.ftype));
    });

// Prefill of a prompt and token-by-token decode of the same tokens compute the
// same thing row by row, so with batch-invariant kernels they agree exactly.
TEST(Forward, PrefillEqualsTokenByTokenDecode) {
  for (const char* shape : {"tiny", "qwen3", "gemma3", "phi3", "qwen3moe", "mixtral"}) {
    SCOPED_TRACE(shape);
    const uint64_t seed = tern::test::run_seed() + std::hash<std::string>{}(shape);
    const std::string path = write_model(Case{shape, quant::FileType::Q4_K_M, 0}, seed);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto be = backend::make_cpu_backend(2);
    auto m = model::load_model(**file, *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    auto fwd = model::Forward::create(*m, *be, 32, 2, 64);
    ASSERT_TRUE(fwd.ok());
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int32_t> tok(0, m->hp.n_vocab - 1);
    std::vector<int32_t> tokens(20);
    for (auto& t : tokens) t = tok(rng);

    model::Batch prefill;  // slot 0, all at once
    for (size_t i = 0; i < tokens.size(); ++i) prefill.add(tokens[i], int32_t(i), 0, true);
    model::Logits all;
    ASSERT_TRUE((*fwd)->run(prefill, all).ok());

    const size_t nv = size_t(m->hp.n_vocab);
    for (size_t i = 0; i < tokens.size(); ++i) {  // slot 1, one token per call
        model::Batch one;
        one.add(tokens[i], int32_t(i), 1, true);
        model::Logits got;
        ASSERT_TRUE((*fwd)->run(one, got).ok());
        for (size_t j = 0; j < nv; ++j)
            ASSERT_EQ(got[j], all[i * nv + j]) << "token " << i << " logit " << j << " seed " << seed;
    }
    std::filesystem::remove(path);
  }
}

// A vocabulary so wide that the output head runs in pieces (Forward::
// logits_rows): every row of a prefill that wants all its logits is the row
// one-token decode gives, on both sides of each piece's edge; and greedy
// picks in place of rows, piece by piece.
TEST(Forward, OutputHeadInPiecesEqualsOneRowAtATime) {
    const uint64_t seed = tern::test::run_seed();
    model::SynthOptions o;
    o.shape = *model::synth_preset("tiny");
    o.shape.n_vocab = 300000;
    o.shape.n_embd = 32;
    o.shape.n_head = 2;
    o.shape.n_head_kv = 2;
    o.shape.n_ff = 64;
    o.shape.n_layer = 1;
    o.ftype = quant::FileType::Q8_0;  // rows of 32: the narrow model quantizes
    o.seed = seed;
    o.n_threads = 2;
    auto path = test::write_temp_model("forward-wide-vocab-" + std::to_string(seed), o);
    ASSERT_TRUE(path.ok()) << path.error().message;
    auto file = gguf::File::open(*path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto be = backend::make_cpu_backend(2);
    auto m = model::load_model(**file, *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    const int n_tokens = 150;
    const int64_t piece = model::Forward::logits_rows(m->hp.n_vocab, n_tokens);
    ASSERT_EQ(piece, model::Forward::kLogitsMinRows);  // 300,000 floats a row: the floor
    ASSERT_EQ(model::Forward::logits_rows(32000, n_tokens), n_tokens);  // a 32k vocabulary: one piece
    auto fwd = model::Forward::create(*m, *be, n_tokens, 2, n_tokens);
    ASSERT_TRUE(fwd.ok()) << fwd.error().message;

    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int32_t> tok(0, int32_t(m->hp.n_vocab) - 1);
    std::vector<int32_t> tokens(static_cast<size_t>(n_tokens), 0);
    for (auto& t : tokens) t = tok(rng);
    model::Batch prefill;  // slot 0, every row's logits, in three pieces
    for (size_t i = 0; i < tokens.size(); ++i) prefill.add(tokens[i], int32_t(i), 0, true);
    model::Logits all;
    all.assign(tokens.size() * size_t(m->hp.n_vocab), std::nanf(""));
    ASSERT_TRUE((*fwd)->run(prefill, all).ok());
    ASSERT_EQ(all.size(), tokens.size() * size_t(m->hp.n_vocab));

    const size_t nv = size_t(m->hp.n_vocab);
    const std::vector<size_t> checked = {0, size_t(piece) - 1, size_t(piece), 2 * size_t(piece) - 1,
                                         2 * size_t(piece), tokens.size() - 1};
    model::Logits got;
    for (size_t i = 0; i < tokens.size(); ++i) {  // slot 1, one token per call
        model::Batch one;
        one.add(tokens[i], int32_t(i), 1, true);
        ASSERT_TRUE((*fwd)->run(one, got).ok());
        if (std::find(checked.begin(), checked.end(), i) == checked.end()) continue;
        for (size_t j = 0; j < nv; ++j)
            ASSERT_EQ(got[j], all[i * nv + j]) << "token " << i << " logit " << j << " seed " << seed;
    }

    // Rows that want only their greedy pick (slot 1 again, the same tokens):
    // the pick is the row's argmax_first, the rows that want their logits are
    // written as without picks, and a piece whose rows all want picks is not
    // copied back (its poison stays). Pieces: picks only, mixed, rows only.
    model::Batch picked;
    for (size_t i = 0; i < tokens.size(); ++i) {
        const bool only_pick = int64_t(i) < piece || (int64_t(i) < 2 * piece && rng() % 2);
        picked.add(tokens[i], int32_t(i), 1, true, only_pick);
    }
    got.assign(tokens.size() * nv, std::nanf(""));
    model::Pass::Picks picks(tokens.size(), -7);
    ASSERT_TRUE((*fwd)->run(picked, got, &picks).ok());
    ASSERT_EQ(picks.size(), tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
        const float* row = all.data() + i * nv;
        if (picked.pick_only[i]) {
            ASSERT_EQ(picks[i], int32_t(backend::cpu::argmax_first(row, int64_t(nv)))) << "row " << i << " seed " << seed;
            if (int64_t(i) < piece) {
                ASSERT_TRUE(std::isnan(got[i * nv])) << "row " << i << " of a piece of picks was copied";
            }
        } else {
            for (size_t j = 0; j < nv; ++j)
                ASSERT_EQ(got[i * nv + j], row[j]) << "row " << i << " logit " << j << " seed " << seed;
        }
    }
    // Without picks asked for, the flags are ignored: every row is written.
    ASSERT_TRUE((*fwd)->run(picked, got).ok());
    for (size_t j = 0; j < nv; ++j) ASSERT_EQ(got[j], all[j]) << "logit " << j;
    std::filesystem::remove(*path);
}

// A tiny Q8_0 model on one CPU thread and its forward pass: batches of up
// to 4 tokens, one slot of 8 positions.
struct TinyPass {
    std::string path;
    std::unique_ptr<gguf::File> file;
    std::unique_ptr<backend::Backend> be;
    std::optional<model::Model> m;
    std::unique_ptr<model::Forward> fwd;
    ~TinyPass() {
        if (!path.empty()) std::filesystem::remove(path);
    }
};

void open_tiny_pass(TinyPass& t, uint64_t seed) {
    t.path = write_model(Case{"tiny", quant::FileType::Q8_0, 0}, seed);
    auto file = gguf::File::open(t.path);
    ASSERT_TRUE(file.ok());
    t.file = std::move(*file);
    t.be = backend::make_cpu_backend(1);
    auto m = model::load_model(*t.file, *t.be);
    ASSERT_TRUE(m.ok());
    t.m.emplace(std::move(*m));
    auto fwd = model::Forward::create(*t.m, *t.be, 4, 1, 8);
    ASSERT_TRUE(fwd.ok());
    t.fwd = std::move(*fwd);
}

TEST(Forward, RejectsBadBatches) {
    TinyPass t;
    ASSERT_NO_FATAL_FAILURE(open_tiny_pass(t, 7));
    auto& fwd = t.fwd;
    const model::Model* m = &*t.m;
    model::Logits logits;
    model::Batch b;
    EXPECT_FALSE(fwd->run(b, logits).ok());  // empty
    b.add(m->hp.n_vocab, 0, 0, true);
    EXPECT_FALSE(fwd->run(b, logits).ok());  // token outside the vocabulary
    b = {};
    b.add(1, 8, 0, true);
    EXPECT_FALSE(fwd->run(b, logits).ok());  // position past the context
    b = {};
    b.add(1, 0, 1, true);
    EXPECT_FALSE(fwd->run(b, logits).ok());  // slot that does not exist
    b = {};
    for (int i = 0; i < 5; ++i) b.add(1, i, 0, false);
    EXPECT_FALSE(fwd->run(b, logits).ok());  // larger than the workspace
    b = {};
    b.add(1, 0, 0, true);
    b.pick_only.clear();
    model::Pass::Picks picks;
    EXPECT_FALSE(fwd->run(b, logits, &picks).ok());  // pick flags that do not match the logits rows
    EXPECT_TRUE(fwd->run(b, logits).ok());           // without picks the flags are not read
}

// A backend that captures steps of up to 8 tokens as graphs (the CPU's
// kernels underneath), recording what the pass tells it of each step.
class GraphLikeBackend : public test::ForwardingBackend {
public:
    GraphLikeBackend() : ForwardingBackend(backend::make_cpu_backend(1)) {}
    int graph_tokens() const override { return 8; }
    void set_batch(const backend::BatchLayout& layout) override {
        n_logits = layout.n_logits;
        gathered.clear();
        ForwardingBackend::set_batch(layout);
    }
    void gather_rows(backend::Tensor x, const std::vector<int32_t>& rows, backend::Tensor out) override {
        gathered.insert(gathered.end(), rows.begin(), rows.end());
        ForwardingBackend::gather_rows(x, rows, out);
    }
    int n_logits = -1;
    std::vector<int32_t> gathered;  // the head's rows of the last step
};

// On a backend that replays steps as graphs, a step of up to its graph size
// that wants logits runs the head on a row per token (the wanted rows, then
// the last repeated), so one graph serves its token count; the rows and
// picks that come back are the plain pass's, bit for bit. Larger steps, and
// a step that asks for a row twice, keep a row per logits row.
TEST(Forward, AGraphCapturingBackendGetsAHeadRowPerTokenAndTheSameLogits) {
    const uint64_t seed = tern::test::run_seed() + 9;
    SCOPED_TRACE("seed " + std::to_string(seed));
    const std::string path = write_model(Case{"tiny", quant::FileType::Q8_0, 0}, seed);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto plain_be = backend::make_cpu_backend(1);
    GraphLikeBackend graph_be;
    auto plain_m = model::load_model(**file, *plain_be);
    auto graph_m = model::load_model(**file, graph_be);
    ASSERT_TRUE(plain_m.ok() && graph_m.ok());
    auto plain = model::Forward::create(*plain_m, *plain_be, 12, 4, 32);
    auto graph = model::Forward::create(*graph_m, graph_be, 12, 4, 32);
    ASSERT_TRUE(plain.ok() && graph.ok());
    ASSERT_EQ((*graph)->graph_tokens(), 8);

    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int32_t> tok(0, int32_t(plain_m->hp.n_vocab) - 1);
    const size_t nv = size_t(plain_m->hp.n_vocab);
    struct Step {
        model::Batch batch;
        int want_n_logits;
        std::vector<int32_t> want_rows;
    };
    std::vector<Step> steps;
    {  // 4 prompt tokens of slot 0 (the last wants logits) beside 2 decoding tokens: 6 head rows
        Step s;
        for (int p = 0; p < 4; ++p) s.batch.add(tok(rng), p, 0, p == 3, true);
        s.batch.add(tok(rng), 0, 1, true, false);
        s.batch.add(tok(rng), 0, 2, true, true);
        s.want_n_logits = 6;
        s.want_rows = {3, 4, 5, 5, 5, 5};
        steps.push_back(s);
    }
    {  // 10 tokens, past the graph size: only the wanted rows
        Step s;
        for (int p = 0; p < 9; ++p) s.batch.add(tok(rng), 4 + p, 0, p == 8, false);
        s.batch.add(tok(rng), 1, 1, true, true);
        s.want_n_logits = 2;
        s.want_rows = {8, 9};
        steps.push_back(s);
    }
    {  // one token asked for three times: more rows than tokens, no padding
        Step s;
        s.batch.add(tok(rng), 2, 1, true, false);
        s.batch.add(tok(rng), 0, 3, false);
        s.batch.logits_for = {0, 0, 0};
        s.batch.pick_only = {0, 1, 0};
        s.want_n_logits = 3;
        s.want_rows = {0, 0, 0};
        steps.push_back(s);
    }
    for (size_t i = 0; i < steps.size(); ++i) {
        SCOPED_TRACE("step " + std::to_string(i));
        const model::Batch& b = steps[i].batch;
        model::Logits want, got;
        model::Pass::Picks want_picks, got_picks;
        ASSERT_TRUE((*plain)->run(b, want, &want_picks).ok());
        got.assign(want.size(), std::nanf(""));
        ASSERT_TRUE((*graph)->run(b, got, &got_picks).ok());
        EXPECT_EQ(graph_be.n_logits, steps[i].want_n_logits);
        EXPECT_EQ(graph_be.gathered, steps[i].want_rows);
        ASSERT_EQ(got.size(), b.logits_for.size() * nv);
        for (size_t r = 0; r < b.logits_for.size(); ++r) {
            if (b.pick_only[r]) {
                EXPECT_EQ(got_picks[r], want_picks[r]) << "row " << r;
                continue;
            }
            for (size_t j = 0; j < nv; ++j)
                ASSERT_EQ(fp32_to_bits(got[r * nv + j]), fp32_to_bits(want[r * nv + j])) << "row " << r << " logit " << j;
        }
    }
    std::filesystem::remove(path);
}

// The issue time is the host's part of a run before it first waits for the
// backend (on the CPU, nearly all of it): measured anew each run that gets
// that far, within the run's own time, and left alone by a refused batch.
TEST(Forward, IssueTimeIsTheRunsHostPartBeforeItWaits) {
    TinyPass t;
    ASSERT_NO_FATAL_FAILURE(open_tiny_pass(t, 8));
    auto& fwd = t.fwd;
    const model::Model* m = &*t.m;
    EXPECT_EQ(fwd->last_issue_seconds(), 0.0) << "nothing has run";
    model::Logits logits;
    for (bool want_logits : {true, false}) {
        model::Batch b;
        for (int i = 0; i < 4; ++i) b.add(1 + i, i, 0, want_logits && i == 3);
        const auto t0 = std::chrono::steady_clock::now();
        ASSERT_TRUE(fwd->run(b, logits).ok());
        const double run = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        const double issue = fwd->last_issue_seconds();
        EXPECT_GT(issue, 0.0) << want_logits;
        EXPECT_LE(issue, run) << want_logits;
        model::Batch bad;
        bad.add(m->hp.n_vocab, 0, 0, true);
        EXPECT_FALSE(fwd->run(bad, logits).ok());
        EXPECT_EQ(fwd->last_issue_seconds(), issue) << "a refused batch measures nothing";
    }
}

}  // namespace

namespace {

// A model file whose metadata names an architecture tern does not run.
TEST(ModelLoad, UnknownArchitectureIsNamed) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("tern-unknown-arch-" + std::to_string(::getpid()) + ".gguf"))
            .string();
    gguf::Writer w;
    w.set_string("general.architecture", "gpt9000");
    ASSERT_TRUE(w.add_tensor("token_embd.weight", TensorType::F32, {8, 4}).ok());
    ASSERT_TRUE(w.begin(path).ok());
    std::vector<float> zeros(32, 0.5f);
    ASSERT_TRUE(w.write_tensor_data(zeros.data(), zeros.size() * sizeof(float)).ok());
    ASSERT_TRUE(w.finish().ok());
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto hp = model::read_hparams(**file);
    ASSERT_FALSE(hp.ok());
    EXPECT_NE(hp.error().message.find("unsupported architecture 'gpt9000'"), std::string::npos) << hp.error().message;
    std::filesystem::remove(path);
}

// A llama file missing a layer tensor is rejected with the tensor's name.
TEST(ModelLoad, MissingTensorIsNamed) {
    const std::string path = write_model(Case{"tiny", quant::FileType::Q8_0, 0}, 11);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok());
    // Rewrite the file without blk.1.ffn_up.weight.
    const std::string cut = path + ".cut.gguf";
    gguf::Writer w;
    for (const auto& kv : (*file)->metadata()) w.set(kv.key, kv.value);
    std::vector<const gguf::TensorInfo*> keep;
    for (const auto& t : (*file)->tensors())
        if (t.name != "blk.1.ffn_up.weight") {
            ASSERT_TRUE(w.add_tensor(t.name, t.type(), std::vector<int64_t>(t.ne, t.ne + t.n_dims)).ok());
            keep.push_back(&t);
        }
    ASSERT_TRUE(w.begin(cut).ok());
    for (const auto* t : keep) ASSERT_TRUE(w.write_tensor_data(t->data, t->n_bytes).ok());
    ASSERT_TRUE(w.finish().ok());
    auto cut_file = gguf::File::open(cut);
    ASSERT_TRUE(cut_file.ok());
    auto be = backend::make_cpu_backend(1);
    auto m = model::load_model(**cut_file, *be);
    ASSERT_FALSE(m.ok());
    EXPECT_NE(m.error().message.find("'blk.1.ffn_up.weight' is missing"), std::string::npos) << m.error().message;
    std::filesystem::remove(path);
    std::filesystem::remove(cut);
}

// A copy of a file with its metadata edited (set: added or replaced; a key
// named in drop: left out); the tensors as they are.
std::string rewrite_metadata(const gguf::File& f, const std::string& path,
                             const std::vector<std::pair<std::string, gguf::Value>>& set,
                             const std::vector<std::string>& drop) {
    gguf::Writer w;
    for (const auto& kv : f.metadata())
        if (std::find(drop.begin(), drop.end(), kv.key) == drop.end()) w.set(kv.key, kv.value);
    for (const auto& [k, v] : set) w.set(k, v);
    for (const auto& t : f.tensors())
        EXPECT_TRUE(w.add_tensor(t.name, t.type(), std::vector<int64_t>(t.ne, t.ne + t.n_dims)).ok());
    EXPECT_TRUE(w.begin(path).ok());
    for (const auto& t : f.tensors()) EXPECT_TRUE(w.write_tensor_data(t.data, t.n_bytes).ok());
    EXPECT_TRUE(w.finish().ok());
    return path;
}

// A mixture of experts loads as its metadata says: each expert's matrices as
// views of the stacked tensors, the router beside them, no dense FFN.
TEST(ModelLoad, MixtureOfExpertsLayersAndTheirMetadata) {
    const std::string path = write_model(Case{"qwen3moe", quant::FileType::Q8_0, 0}, 5);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok());
    auto be = backend::make_cpu_backend(1);
    auto m = model::load_model(**file, *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(m->hp.n_expert, 8);
    EXPECT_EQ(m->hp.n_expert_used, 3);
    EXPECT_EQ(m->hp.n_ff, 256);  // expert_feed_forward_length, not feed_forward_length (768)
    for (const model::Layer& L : m->layers) {
        ASSERT_TRUE(L.has_experts());
        EXPECT_FALSE(L.w_gate || L.w_up || L.w_down);
        ASSERT_EQ(L.gate_exps.size(), 8u);
        ASSERT_EQ(L.down_exps.size(), 8u);
        EXPECT_EQ(L.ffn_router.rows, 8);
        EXPECT_EQ(L.gate_exps[7].rows, 256);
        EXPECT_EQ(L.down_exps[7].cols, 256);
        EXPECT_EQ(L.down_exps[7].rows, 256);
        EXPECT_EQ(static_cast<const uint8_t*>(L.up_exps[3].host) - static_cast<const uint8_t*>(L.up_exps[0].host),
                  ptrdiff_t(3 * 256 * L.up_exps[0].row_bytes));
    }
    std::filesystem::remove(path);
}

// Expert metadata that cannot be run is refused, naming what is wrong: a
// llama declaring experts but carrying a dense FFN, more experts used than
// exist, experts on an architecture without them, qwen3moe without a count.
TEST(ModelLoad, ExpertMetadataErrorsAreNamed) {
    auto load_error = [](const std::string& p) {
        auto f = gguf::File::open(p);
        if (!f.ok()) return "open: " + f.error().message;
        auto be = backend::make_cpu_backend(1);
        auto m = model::load_model(**f, *be);
        return m.ok() ? std::string("loaded") : m.error().message;
    };
    const std::string dense = write_model(Case{"tiny", quant::FileType::Q8_0, 0}, 6);
    auto dense_file = gguf::File::open(dense);
    ASSERT_TRUE(dense_file.ok());
    const std::string declared = rewrite_metadata(
        **dense_file, dense + ".experts.gguf",
        {{"llama.expert_count", gguf::Value::of_u32(8)}, {"llama.expert_used_count", gguf::Value::of_u32(2)}}, {});
    std::string e = load_error(declared);
    EXPECT_NE(e.find("'blk.0.ffn_gate_exps.weight' is missing"), std::string::npos) << e;
    EXPECT_NE(e.find("dense FFN"), std::string::npos) << e;

    const std::string moe = write_model(Case{"qwen3moe", quant::FileType::Q8_0, 0}, 6);
    auto moe_file = gguf::File::open(moe);
    ASSERT_TRUE(moe_file.ok());
    e = load_error(rewrite_metadata(**moe_file, moe + ".used.gguf", {{"qwen3moe.expert_used_count", gguf::Value::of_u32(9)}}, {}));
    EXPECT_NE(e.find("'qwen3moe.expert_used_count' = 9 is out of range [1, 8]"), std::string::npos) << e;
    e = load_error(rewrite_metadata(**moe_file, moe + ".count.gguf", {}, {"qwen3moe.expert_count"}));
    EXPECT_NE(e.find("'qwen3moe.expert_count' is missing"), std::string::npos) << e;

    const std::string qwen3 = write_model(Case{"qwen3", quant::FileType::Q8_0, 0}, 6);
    auto qwen3_file = gguf::File::open(qwen3);
    ASSERT_TRUE(qwen3_file.ok());
    e = load_error(rewrite_metadata(**qwen3_file, qwen3 + ".experts.gguf", {{"qwen3.expert_count", gguf::Value::of_u32(4)}}, {}));
    EXPECT_NE(e.find("qwen3 with qwen3.expert_count = 4 is not supported"), std::string::npos) << e;
    for (const std::string& p : {dense, declared, moe, moe + ".used.gguf", moe + ".count.gguf", qwen3, qwen3 + ".experts.gguf"})
        std::filesystem::remove(p);
}

// LongRoPE (phi3): a cache longer than the original context rotates with the
// long factors, a shorter one with the short factors, and the attention factor
// scales both; the engine follows the reference either way, and the choice
// changes the logits.
TEST(Forward, LongRopeFactorsFollowTheCacheLength) {
    const std::string path = write_model(Case{"phi3", quant::FileType::ALL_F32, 0}, 17);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok());
    auto be = backend::make_cpu_backend(2);
    auto m = model::load_model(**file, *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(m->hp.rope_orig_ctx, 32);
    EXPECT_GT(m->hp.rope.attn_factor, 1.0f);
    ASSERT_TRUE(m->rope_long && m->rope_short);
    EXPECT_EQ(model::rope_factors(*m, 32), &m->rope_short);
    EXPECT_EQ(model::rope_factors(*m, 33), &m->rope_long);
    const std::vector<int32_t> tokens = {5, 900, 17, 311, 64, 2, 1000, 77, 401, 12, 9, 300};
    model::Logits by_ctx[2];
    const int ctxs[2] = {24, 64};
    for (int i = 0; i < 2; ++i) {
        auto fwd = model::Forward::create(*m, *be, 16, 1, ctxs[i]);
        ASSERT_TRUE(fwd.ok()) << fwd.error().message;
        model::Batch batch;
        for (size_t t = 0; t < tokens.size(); ++t) batch.add(tokens[t], int32_t(t), 0, t + 1 == tokens.size());
        ASSERT_TRUE((*fwd)->run(batch, by_ctx[i]).ok());
        ref::ReferenceForward reference(**file, m->hp, ctxs[i]);
        const auto want = reference.run(tokens);
        EXPECT_LT(rel_error(by_ctx[i], want.back()), kFloatTol) << "n_ctx " << ctxs[i];
    }
    EXPECT_GT(rel_error(by_ctx[0], by_ctx[1]), 10 * kFloatTol) << "long and short factors gave the same logits";
    std::filesystem::remove(path);
}

// A llama file that carries q/k/v biases (as some conversions do) has them
// loaded and used, not dropped.
TEST(ModelLoad, LlamaFileWithBiasesUsesThem) {
    const std::string path = write_model(Case{"qwen2", quant::FileType::ALL_F32, 0}, 3);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok());
    // The same file as architecture "llama": its qwen2.* keys renamed.
    std::vector<std::pair<std::string, gguf::Value>> set = {{"general.architecture", gguf::Value::of_string("llama")}};
    std::vector<std::string> drop;
    for (const auto& kv : (*file)->metadata())
        if (kv.key.rfind("qwen2.", 0) == 0) {
            set.push_back({"llama." + kv.key.substr(6), kv.value});
            drop.push_back(kv.key);
        }
    const std::string as_llama = rewrite_metadata(**file, path + ".llama.gguf", set, drop);
    auto f = gguf::File::open(as_llama);
    ASSERT_TRUE(f.ok());
    auto be = backend::make_cpu_backend(1);
    auto m = model::load_model(**f, *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_EQ(m->hp.arch, "llama");
    EXPECT_TRUE(m->layers[0].bq && m->layers[0].bk && m->layers[0].bv);
    std::filesystem::remove(path);
    std::filesystem::remove(as_llama);
}

// Gemma 3's sliding layers: every sixth layer global by default; the period
// or a bool per layer from attention.sliding_window_pattern; the local RoPE
// base from rope.freq_base_swa; what cannot be honoured is an error naming it.
TEST(ModelLoad, Gemma3SlidingLayersAndItsMetadata) {
    const std::string path = write_model(Case{"gemma3", quant::FileType::Q8_0, 0}, 5);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok());
    auto hp = model::read_hparams(**file);
    ASSERT_TRUE(hp.ok()) << hp.error().message;
    EXPECT_EQ(hp->swa_window, 5);
    EXPECT_EQ(hp->sliding, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0}));
    EXPECT_FLOAT_EQ(hp->rope_swa.freq_base, 10000.0f);
    EXPECT_FLOAT_EQ(hp->embd_scale, 16.0f);  // sqrt(256)
    EXPECT_FLOAT_EQ(hp->attn_scale, 1.0f / std::sqrt(128.0f));

    auto reread = [&](const std::vector<std::pair<std::string, gguf::Value>>& set,
                      const std::vector<std::string>& drop) {
        const std::string edited = rewrite_metadata(**file, path + ".edit.gguf", set, drop);
        auto f = gguf::File::open(edited);
        EXPECT_TRUE(f.ok());
        auto r = model::read_hparams(**f);
        std::filesystem::remove(edited);
        return r;
    };
    auto period = reread({{"gemma3.attention.sliding_window_pattern", gguf::Value::of_u32(3)},
                          {"gemma3.rope.freq_base_swa", gguf::Value::of_f32(5000.0f)}}, {});
    ASSERT_TRUE(period.ok()) << period.error().message;
    EXPECT_EQ(period->sliding, (std::vector<uint8_t>{1, 1, 0, 1, 1, 0}));
    EXPECT_FLOAT_EQ(period->rope_swa.freq_base, 5000.0f);
    std::vector<gguf::Value> flags;
    for (bool b : {false, true, false, true, true, true}) flags.push_back(gguf::Value::of_bool(b));
    auto per_layer = reread({{"gemma3.attention.sliding_window_pattern",
                              gguf::Value::of_array(gguf::ValueType::BOOL, flags)}}, {});
    ASSERT_TRUE(per_layer.ok()) << per_layer.error().message;
    EXPECT_EQ(per_layer->sliding, (std::vector<uint8_t>{0, 1, 0, 1, 1, 1}));

    flags.pop_back();
    auto short_array = reread({{"gemma3.attention.sliding_window_pattern",
                                gguf::Value::of_array(gguf::ValueType::BOOL, flags)}}, {});
    ASSERT_FALSE(short_array.ok());
    EXPECT_NE(short_array.error().message.find("5 entries for 6 layers"), std::string::npos);
    auto no_window = reread({}, {"gemma3.attention.sliding_window"});
    ASSERT_FALSE(no_window.ok());
    EXPECT_NE(no_window.error().message.find("'gemma3.attention.sliding_window' is missing"), std::string::npos);
    auto other_v = reread({{"gemma3.attention.value_length", gguf::Value::of_u32(64)}}, {});
    ASSERT_FALSE(other_v.ok());
    EXPECT_NE(other_v.error().message.find("value_length = 64"), std::string::npos);
    auto capped = reread({{"gemma3.final_logit_softcapping", gguf::Value::of_f32(30.0f)}}, {});
    ASSERT_FALSE(capped.ok());
    EXPECT_NE(capped.error().message.find("final_logit_softcapping"), std::string::npos);
    std::filesystem::remove(path);
}

}  // namespace

namespace {

// Llama 3's per-frequency divisors (rope_freqs.weight) and linear RoPE scaling
// go through the engine and the reference the same way, and do change the result.
TEST(Forward, RopeFrequencyFactorsAndLinearScalingMatchReference) {
    const uint64_t seed = tern::test::run_seed();
    const std::string base = write_model(Case{"tiny", quant::FileType::ALL_F32, 0}, seed);
    auto src = gguf::File::open(base);
    ASSERT_TRUE(src.ok());
    const auto hp0 = model::read_hparams(**src);
    ASSERT_TRUE(hp0.ok());
    const int half = hp0->rope.n_dims / 2;
    std::vector<float> factors(static_cast<size_t>(half));
    for (int i = 0; i < half; ++i) factors[size_t(i)] = 1.0f + 0.37f * float(i);

    const std::string path = base + ".rope.gguf";
    gguf::Writer w;
    for (const auto& kv : (*src)->metadata()) w.set(kv.key, kv.value);
    w.set_string("llama.rope.scaling.type", "linear");
    w.set_f32("llama.rope.scaling.factor", 2.0f);
    for (const auto& t : (*src)->tensors())
        ASSERT_TRUE(w.add_tensor(t.name, t.type(), std::vector<int64_t>(t.ne, t.ne + t.n_dims)).ok());
    ASSERT_TRUE(w.add_tensor("rope_freqs.weight", TensorType::F32, {half}).ok());
    ASSERT_TRUE(w.begin(path).ok());
    for (const auto& t : (*src)->tensors()) ASSERT_TRUE(w.write_tensor_data(t.data, t.n_bytes).ok());
    ASSERT_TRUE(w.write_tensor_data(factors.data(), factors.size() * sizeof(float)).ok());
    ASSERT_TRUE(w.finish().ok());

    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto be = backend::make_cpu_backend(1);
    auto m = model::load_model(**file, *be);
    ASSERT_TRUE(m.ok()) << m.error().message;
    EXPECT_FLOAT_EQ(m->hp.rope.freq_scale, 0.5f);
    ASSERT_TRUE(bool(m->rope_freqs));
    auto fwd = model::Forward::create(*m, *be, 16, 1, 64);
    ASSERT_TRUE(fwd.ok());

    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::uniform_int_distribution<int32_t> tok(0, m->hp.n_vocab - 1);
    std::vector<int32_t> tokens(12);
    for (auto& t : tokens) t = tok(rng);
    model::Batch batch;
    for (size_t i = 0; i < tokens.size(); ++i) batch.add(tokens[i], int32_t(i), 0, true);
    model::Logits logits;
    ASSERT_TRUE((*fwd)->run(batch, logits).ok());

    ref::ReferenceForward scaled(**file, m->hp), plain(**src, *hp0);
    const auto want = scaled.run(tokens);
    const auto unscaled = plain.run(tokens);
    const size_t nv = size_t(m->hp.n_vocab);
    // Every position agrees with the scaled reference, and some position is
    // far from the plain model's logits: the scaling took effect. (Position 0
    // has no rotation; random weights dilute the effect at any one position
    // to a few times the agreement tolerance: over 200 seeds the largest
    // change was at least 0.027.)
    double moved = 0;
    for (size_t p = 0; p < tokens.size(); ++p) {
        const std::vector<float> got(logits.begin() + int64_t(p * nv), logits.begin() + int64_t((p + 1) * nv));
        EXPECT_LT(rel_error(got, want[p]), kFloatTol) << "position " << p << ", seed " << seed;
        moved = std::max(moved, rel_error(got, unscaled[p]));
    }
    EXPECT_GT(moved, 4 * kFloatTol) << "seed " << seed;
    std::filesystem::remove(base);
    std::filesystem::remove(path);
}

}  // namespace
