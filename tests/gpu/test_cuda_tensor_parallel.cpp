// Tensor parallelism on GPUs through NCCL (model/tensor_parallel, backend/cuda/nccl_group).
//  - One rank: the NCCL path (the shard is the whole model, an all-reduce over
//    one GPU after each row-parallel matmul, captured in the decode graphs)
//    gives the plain single-GPU path's logits bit for bit over a 40-token
//    prefill and 24 decode steps (the later ones graph replays).
//  - Two ranks, where two GPUs are visible: per position, max |tp2 - tp1| <=
//    tolerance * max |tp1| (3e-2 quantized, as on the CPU: the split changes
//    where the activations are quantized-and-summed; 1e-3 f16, whose GPU matmul
//    sums in float), top-1 agreeing at >= 99% of the positions whose margin
//    exceeds the tolerance, and a second run (other KV slot) with the same bits.
//    The Engine's --tp 2 gives the same logits as TpForward.
// NCCL is opened at run time; where it cannot be, the tests say so and skip.
// Fewer than two GPUs: the two-rank test says so and skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "gguf/gguf.h"
#include "gpu_test_util.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/synth.h"
#include "model/tensor_parallel.h"
#include "runtime/engine.h"
#include "sequence.h"
#include "tests/support/test_seed.h"
#include "tests/support/test_shapes.h"

namespace tern {
namespace {

constexpr int kPrompt = 40, kDecode = 24;

struct TpFile {
    std::string path;
    TpFile(const model::SynthShape& shape, quant::FileType ftype, const std::string& tag) {
        model::SynthOptions o;
        o.shape = shape;
        o.ftype = ftype;
        o.seed = test::run_seed() ^ uint64_t(ftype);
        o.n_threads = 4;
        path = (std::filesystem::temp_directory_path() /
                ("tern-cuda-tp-" + tag + "-" + std::to_string(o.seed) + ".gguf"))
                   .string();
        auto r = model::write_synth_model(path, o);
        EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    }
    ~TpFile() { std::filesystem::remove(path); }
};

int visible_gpus() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// An NCCL group over GPUs 0..n-1, or a skip naming why NCCL cannot be had.
std::shared_ptr<backend::CommGroup> nccl_group_or_skip(int n, std::string& why) {
    std::vector<int> devices;
    for (int i = 0; i < n; ++i) devices.push_back(i);
    auto g = backend::make_nccl_group(devices);
    if (!g.ok()) {
        why = g.error().message;
        return nullptr;
    }
    return *g;
}

Result<std::unique_ptr<model::TpForward>> nccl_tp(const model::Model& described,
                                                  std::shared_ptr<backend::CommGroup> group, int n_slots,
                                                  int n_ctx) {
    return model::TpForward::create(
        described, group,
        [group](int rank) -> Result<std::unique_ptr<backend::Backend>> {
            return backend::make_cuda_backend(rank, group, rank);
        },
        kPrompt, n_slots, n_ctx);
}

class CudaTensorParallel : public gpu_test::GpuTest {};

TEST_F(CudaTensorParallel, OneRankThroughNcclEqualsThePlainPath) {
    const TpFile f(test::llama_shape(1024, 8, 4, 1024), quant::FileType::Q4_K_M, "one");
    auto file = gguf::File::open(f.path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    std::string why;
    auto group = nccl_group_or_skip(1, why);
    if (!group) GTEST_SKIP() << "NCCL is not available: " << why;

    auto be = backend::make_cuda_backend(0);
    ASSERT_TRUE(be.ok()) << be.error().message;
    auto plain_model = model::load_model(**file, **be);
    ASSERT_TRUE(plain_model.ok()) << plain_model.error().message;
    auto plain = model::Forward::create(*plain_model, **be, kPrompt, 1, kPrompt + kDecode);
    ASSERT_TRUE(plain.ok()) << plain.error().message;

    auto described = model::describe_model(**file);
    ASSERT_TRUE(described.ok()) << described.error().message;
    auto tp = nccl_tp(*described, group, 1, kPrompt + kDecode);
    ASSERT_TRUE(tp.ok()) << tp.error().message;

    const size_t nv = size_t(described->hp.n_vocab);
    std::mt19937 rng(test::run_seed());
    std::uniform_int_distribution<int32_t> tok(0, described->hp.n_vocab - 1);
    std::vector<int32_t> prompt(kPrompt);
    for (auto& t : prompt) t = tok(rng);
    std::vector<int32_t> follow;
    std::vector<float> want, got;
    gpu_test::run_sequence(**plain, 0, prompt, kDecode, follow, nv, want);
    gpu_test::run_sequence(**tp, 0, prompt, kDecode, follow, nv, got);
    if (HasFatalFailure()) return;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
        ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
            << "position " << i / nv << " logit " << i % nv << ": " << got[i] << " vs " << want[i];
}

struct TwoRankCase {
    const char* name;
    model::SynthShape shape;
    quant::FileType ftype;
    double tolerance;
};

class CudaTensorParallelTwo : public gpu_test::GpuTest, public ::testing::WithParamInterface<TwoRankCase> {};

TEST_P(CudaTensorParallelTwo, TwoRanksMatchOneAndRepeatExactly) {
    const TwoRankCase& c = GetParam();
    if (visible_gpus() < 2) GTEST_SKIP() << "needs two GPUs; " << visible_gpus() << " visible";
    const TpFile f(c.shape, c.ftype, c.name);
    auto file = gguf::File::open(f.path);
    ASSERT_TRUE(file.ok()) << file.error().message;
    std::string why;
    auto group = nccl_group_or_skip(2, why);
    if (!group) GTEST_SKIP() << "NCCL is not available: " << why;

    auto described = model::describe_model(**file);
    ASSERT_TRUE(described.ok()) << described.error().message;
    auto one = nccl_tp(*described, nccl_group_or_skip(1, why), 1, kPrompt + kDecode);
    ASSERT_TRUE(one.ok()) << one.error().message;
    auto two = nccl_tp(*described, group, 2, kPrompt + kDecode);
    ASSERT_TRUE(two.ok()) << two.error().message;
    EXPECT_GT((*two)->rank_backend(1).device_bytes(), 0u);

    const size_t nv = size_t(described->hp.n_vocab);
    std::mt19937 rng(test::run_seed() ^ 0x5eedu);
    std::uniform_int_distribution<int32_t> tok(0, described->hp.n_vocab - 1);
    std::vector<int32_t> prompt(kPrompt);
    for (auto& t : prompt) t = tok(rng);
    std::vector<int32_t> follow;
    std::vector<float> want, got, again;
    gpu_test::run_sequence(**one, 0, prompt, kDecode, follow, nv, want);
    gpu_test::run_sequence(**two, 0, prompt, kDecode, follow, nv, got);
    gpu_test::run_sequence(**two, 1, prompt, kDecode, follow, nv, again);
    if (HasFatalFailure()) return;
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(again.size(), got.size());
    EXPECT_EQ(std::memcmp(again.data(), got.data(), got.size() * sizeof(float)), 0)
        << "a second two-rank run gave other bits";

    double worst = 0;
    int clear = 0, agree = 0;
    for (size_t p = 0; p < want.size() / nv; ++p) {
        const float* w = want.data() + p * nv;
        const float* g = got.data() + p * nv;
        double peak = 0, diff = 0;
        for (size_t j = 0; j < nv; ++j) {
            ASSERT_TRUE(std::isfinite(g[j])) << "position " << p << " logit " << j;
            peak = std::max(peak, std::fabs(double(w[j])));
            diff = std::max(diff, std::fabs(double(g[j]) - double(w[j])));
        }
        worst = std::max(worst, diff / peak);
        EXPECT_LE(diff, c.tolerance * peak) << "position " << p;
        std::vector<float> sorted(w, w + nv);
        std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
        if (sorted[0] - sorted[1] > c.tolerance * peak) {
            ++clear;
            agree += gpu_test::argmax(g, nv) == gpu_test::argmax(w, nv);
        }
    }
    const int positions = int(want.size() / nv);
    ASSERT_GE(clear, positions / 4) << "too few positions with a clear top-1 to judge";
    EXPECT_GE(agree, 0.99 * clear) << agree << " of " << clear << " clear top-1 picks agree";
    std::printf("  %s TP=2 vs TP=1: worst logit error %.2e of max |logit| (tolerance %.0e), top-1 %d/%d clear\n",
                c.name, worst, c.tolerance, agree, clear);

    // The Engine's --tp 2 runs the same ranks: its prefill logits are the TpForward's.
    runtime::EngineOptions eo;
    eo.backend = "cuda";
    eo.tp = 2;
    eo.n_ctx = kPrompt + kDecode;
    eo.max_batch = kPrompt;
    auto engine = runtime::Engine::open(f.path, eo);
    ASSERT_TRUE(engine.ok()) << engine.error().message;
    EXPECT_EQ((*engine)->tp(), 2);
    model::Batch b;
    for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], int32_t(i), 0, true);
    model::Logits via_engine;
    ASSERT_TRUE((*engine)->forward().run(b, via_engine).ok());
    ASSERT_EQ(via_engine.size(), size_t(kPrompt) * nv);
    EXPECT_EQ(std::memcmp(via_engine.data(), got.data(), via_engine.size() * sizeof(float)), 0)
        << "the Engine's two ranks gave other bits than TpForward's";
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaTensorParallelTwo,
    ::testing::Values(
        // GQA, K-quants: each rank takes 2 KV heads (4 query heads x 128 = 512 of Wo's columns) and 512 FFN columns.
        TwoRankCase{"llama_gqa_q4_k_m", test::llama_shape(1024, 8, 4, 1024), quant::FileType::Q4_K_M, 3e-2},
        TwoRankCase{"llama_gqa_q6_k", test::llama_shape(1024, 8, 4, 1024), quant::FileType::Q6_K, 3e-2},
        TwoRankCase{"llama_f16", test::llama_shape(256, 4, 4, 1024), quant::FileType::F16, 1e-3},
        TwoRankCase{"llama_q8_0", test::llama_shape(256, 4, 4, 1024), quant::FileType::Q8_0, 3e-2},
        // qwen2: q/k/v biases shard with their rows; the tied output is rows of the embedding table.
        TwoRankCase{"qwen2_q8_0", test::qwen2_tied_shape(), quant::FileType::Q8_0, 3e-2}),
    [](const ::testing::TestParamInfo<TwoRankCase>& i) { return std::string(i.param.name); });

}  // namespace
}  // namespace tern
