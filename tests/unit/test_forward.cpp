// The llama-family forward pass on the CPU backend against the plain f32
// reference (tests/support/reference_forward), on synthetic models of every
// weight type tern writes and three shapes (GQA llama, qwen2 with biases and
// tied output, qwen3 with per-head q/k norms); and prefill of N tokens against
// token-by-token decode.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/synth.h"
#include "tests/support/reference_forward.h"
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

using test::shape_named;

std::string write_model(const Case& c, uint64_t seed) {
    model::SynthOptions o;
    o.shape = shape_named(c.shape);
    o.ftype = c.ftype;
    o.seed = seed;
    o.n_threads = 2;
    const std::string path = (std::filesystem::temp_directory_path() /
                              ("tern-forward-" + std::string(c.shape) + "-" + std::to_string(int(c.ftype)) + "-" +
                               std::to_string(seed) + ".gguf")).string();
    auto r = model::write_synth_model(path, o);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return path;
}

double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
    double num = 0, den = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / den);
}

class ForwardVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardVsReference, LogitsAgree) {
    const Case c = GetParam();
    std::random_device rd;
    const uint64_t seed = rd();
    const std::string path = write_model(c, seed);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    auto be = backend::make_cpu_backend(2);
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
    std::vector<float> logits;
    ASSERT_TRUE((*fwd)->run(batch, logits).ok());

    ref::ReferenceForward reference(**file, m->hp);
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
                      Case{"qwen3", quant::FileType::Q4_K_M, kQuantTol}, Case{"qwen3", quant::FileType::Q8_0, kQuantTol}),
    [](const ::testing::TestParamInfo<Case>& i) {
        return std::string(i.param.shape) + "_" + std::to_string(int(i.param.ftype));
    });

// Prefill of a prompt and token-by-token decode of the same tokens compute the
// same thing row by row, so with batch-invariant kernels they agree exactly.
TEST(Forward, PrefillEqualsTokenByTokenDecode) {
  for (const char* shape : {"tiny", "qwen3"}) {
    SCOPED_TRACE(shape);
    std::random_device rd;
    const uint64_t seed = rd();
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
    std::vector<float> all;
    ASSERT_TRUE((*fwd)->run(prefill, all).ok());

    const size_t nv = size_t(m->hp.n_vocab);
    for (size_t i = 0; i < tokens.size(); ++i) {  // slot 1, one token per call
        model::Batch one;
        one.add(tokens[i], int32_t(i), 1, true);
        std::vector<float> got;
        ASSERT_TRUE((*fwd)->run(one, got).ok());
        for (size_t j = 0; j < nv; ++j)
            ASSERT_EQ(got[j], all[i * nv + j]) << "token " << i << " logit " << j << " seed " << seed;
    }
    std::filesystem::remove(path);
  }
}

TEST(Forward, RejectsBadBatches) {
    const std::string path = write_model(Case{"tiny", quant::FileType::Q8_0, 0}, 7);
    auto file = gguf::File::open(path);
    ASSERT_TRUE(file.ok());
    auto be = backend::make_cpu_backend(1);
    auto m = model::load_model(**file, *be);
    ASSERT_TRUE(m.ok());
    auto fwd = model::Forward::create(*m, *be, 4, 1, 8);
    ASSERT_TRUE(fwd.ok());
    std::vector<float> logits;
    model::Batch b;
    EXPECT_FALSE((*fwd)->run(b, logits).ok());  // empty
    b.add(m->hp.n_vocab, 0, 0, true);
    EXPECT_FALSE((*fwd)->run(b, logits).ok());  // token outside the vocabulary
    b = {};
    b.add(1, 8, 0, true);
    EXPECT_FALSE((*fwd)->run(b, logits).ok());  // position past the context
    b = {};
    b.add(1, 0, 1, true);
    EXPECT_FALSE((*fwd)->run(b, logits).ok());  // slot that does not exist
    b = {};
    for (int i = 0; i < 5; ++i) b.add(1, i, 0, false);
    EXPECT_FALSE((*fwd)->run(b, logits).ok());  // larger than the workspace
    std::filesystem::remove(path);
}

}  // namespace

namespace {

// A model file whose metadata names an architecture tern does not run.
TEST(ModelLoad, UnknownArchitectureIsNamed) {
    const std::string path = (std::filesystem::temp_directory_path() / "tern-unknown-arch.gguf").string();
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

}  // namespace

namespace {

// Llama 3's per-frequency divisors (rope_freqs.weight) and linear RoPE scaling
// go through the engine and the reference the same way, and do change the result.
TEST(Forward, RopeFrequencyFactorsAndLinearScalingMatchReference) {
    std::random_device rd;
    const uint64_t seed = rd();
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
    std::vector<float> logits;
    ASSERT_TRUE((*fwd)->run(batch, logits).ok());

    ref::ReferenceForward scaled(**file, m->hp), plain(**src, *hp0);
    const auto want = scaled.run(tokens);
    const auto unscaled = plain.run(tokens);
    const size_t nv = size_t(m->hp.n_vocab);
    const size_t last = tokens.size() - 1;
    std::vector<float> got(logits.begin() + int64_t(last * nv), logits.end());
    EXPECT_LT(rel_error(got, want[last]), kFloatTol) << "seed " << seed;
    // Far from the plain model's logits: the scaling took effect.
    EXPECT_GT(rel_error(got, unscaled[last]), 10 * kFloatTol) << "seed " << seed;
    std::filesystem::remove(base);
    std::filesystem::remove(path);
}

}  // namespace
