// Choosing the backend and loading onto it: which backend "auto", "cpu" and
// "cuda" select for what a build and machine offer, the errors when a GPU
// cannot be had, and the load-progress reports (one per registered weight,
// bytes adding up to the total, none for the CPU backend, none when a file
// fails its checks).
#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/gpu.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "quant/quant.h"
#include "runtime/engine.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/test_shapes.h"
#include "tests/support/test_seed.h"

namespace tern {
namespace {

using GpuList = Result<std::vector<backend::GpuInfo>>;

GpuList gpus_of(int n) {
    std::vector<backend::GpuInfo> v;
    for (int i = 0; i < n; ++i) {
        backend::GpuInfo g;
        g.index = i;
        g.name = "Test GPU " + std::to_string(i);
        v.push_back(g);
    }
    return v;
}

bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

std::string lower(std::string s) {
    for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
    return s;
}

TEST(ChooseBackend, ExplicitNamesAreKept) {
    for (bool built : {false, true})
        for (int n : {0, 1, 3}) {
            auto cpu = runtime::choose_backend("cpu", built, gpus_of(n));
            auto cuda = runtime::choose_backend("cuda", built, gpus_of(n));
            ASSERT_TRUE(cpu.ok() && cuda.ok());
            EXPECT_EQ(*cpu, "cpu");
            EXPECT_EQ(*cuda, "cuda");
        }
}

TEST(ChooseBackend, AutoNeedsACudaBuildAndAGpu) {
    const std::pair<bool, GpuList> cases[] = {
        {false, gpus_of(0)}, {false, gpus_of(2)}, {true, gpus_of(0)},
        {true, Error{"cudaGetDeviceCount: no CUDA-capable device is detected"}},
        {true, gpus_of(1)}, {true, gpus_of(4)},
    };
    for (const auto& [built, gpus] : cases) {
        auto choice = runtime::choose_backend("auto", built, gpus);
        ASSERT_TRUE(choice.ok());
        const bool any_gpu = gpus.ok() && !gpus->empty();
        EXPECT_EQ(*choice, built && any_gpu ? "cuda" : "cpu") << "built " << built << ", gpus listed " << any_gpu;
    }
}

TEST(ChooseBackend, UnknownNamesListTheAcceptedOnes) {
    for (const char* name : {"bogus", "CPU", "Cuda", "gpu", "", "cuda0", "metal"}) {
        auto choice = runtime::choose_backend(name, true, gpus_of(1));
        ASSERT_FALSE(choice.ok()) << name;
        EXPECT_TRUE(contains(choice.error().message, std::string("unknown backend '") + name + "'"))
            << choice.error().message;
        EXPECT_TRUE(contains(choice.error().message, "auto, cpu or cuda")) << choice.error().message;
    }
}

TEST(CheckGpu, SaysWhyAGpuCannotBeUsed) {
    const uint32_t seed = tern::test::run_seed() + 1;
    std::mt19937 rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    const int n = std::uniform_int_distribution<int>(1, 8)(rng);
    const int good = std::uniform_int_distribution<int>(0, n - 1)(rng);
    EXPECT_TRUE(runtime::check_gpu(good, gpus_of(n)).ok());

    Status past_end = runtime::check_gpu(n, gpus_of(n));
    ASSERT_FALSE(past_end.ok());
    EXPECT_TRUE(contains(past_end.message(), "there is no GPU " + std::to_string(n))) << past_end.message();
    EXPECT_TRUE(contains(past_end.message(), "found " + std::to_string(n) + ": 0: Test GPU 0")) << past_end.message();
    EXPECT_FALSE(runtime::check_gpu(-1, gpus_of(n)).ok());

    Status none = runtime::check_gpu(0, gpus_of(0));
    ASSERT_FALSE(none.ok());
    EXPECT_TRUE(contains(none.message(), "no CUDA GPU found")) << none.message();

    Status failed = runtime::check_gpu(0, Error{"cudaGetDeviceCount: CUDA driver version is insufficient"});
    ASSERT_FALSE(failed.ok());
    EXPECT_TRUE(contains(failed.message(), "cannot list the GPUs: cudaGetDeviceCount: CUDA driver version"))
        << failed.message();
}

// A CPU backend that records each weight registered with it.
class RecordingBackend : public test::ForwardingBackend {
public:
    RecordingBackend() : ForwardingBackend(backend::make_cpu_backend(1)) {}
    std::vector<std::pair<std::string, size_t>> registered;  // name, bytes

    std::string name() const override { return "recording"; }
    Result<backend::Weight> register_weight(const backend::Weight& w) override {
        registered.emplace_back(w.name, size_t(w.rows) * quant::row_bytes(w.type, w.cols));
        return be_->register_weight(w);
    }
};

struct SynthFile {
    std::string path;
    ~SynthFile() {
        std::error_code ec;
        std::filesystem::remove(path, ec);
    }
};

// A tiny llama, or a qwen2 with biases and tied output, with random weights.
std::string write_synth(std::mt19937_64& rng, bool qwen2, const std::string& tag) {
    model::SynthOptions o;
    o.shape = *model::synth_preset("tiny");
    if (qwen2) {
        o.shape.preset = "custom";
        o.shape.arch = "qwen2";
        o.shape.tied_output = true;
        o.shape.n_layer = 3;
        o.shape.tokenizer = model::SynthTokenizer::Gpt2Bpe;
        o.shape.bpe_pre = "qwen2";
    }
    const quant::FileType types[] = {quant::FileType::Q8_0, quant::FileType::Q4_K_M,
                                     quant::FileType::ALL_F32};
    o.ftype = types[rng() % 3];
    o.seed = rng();
    o.n_threads = 2;
    auto r = test::write_temp_model("engine-backend-" + tag, o);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().message);
    return r.ok() ? *r : std::string();
}

TEST(LoadProgress, OneReportPerWeightAddingUpToTheTotal) {
    const uint64_t seed = tern::test::run_seed() + 2;
    std::mt19937_64 rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    for (bool qwen2 : {false, true}) {
        SynthFile f{write_synth(rng, qwen2, qwen2 ? "qwen2" : "llama")};
        auto file = gguf::File::open(f.path);
        ASSERT_TRUE(file.ok()) << file.error().message;
        RecordingBackend be;
        std::vector<std::pair<size_t, size_t>> reports;
        auto m = model::load_model(**file, be, [&](size_t done, size_t total) { reports.emplace_back(done, total); });
        ASSERT_TRUE(m.ok()) << m.error().message;

        // Every tensor of a synthetic file is a weight the model uses, each registered once.
        std::set<std::string> names;
        size_t file_bytes = 0;
        for (const gguf::TensorInfo& t : (*file)->tensors()) file_bytes += size_t(t.n_bytes);
        for (const auto& [name, bytes] : be.registered) EXPECT_TRUE(names.insert(name).second) << name;
        EXPECT_EQ(names.size(), (*file)->tensors().size());

        ASSERT_EQ(reports.size(), be.registered.size());
        size_t sum = 0;
        for (size_t i = 0; i < reports.size(); ++i) {
            sum += be.registered[i].second;
            EXPECT_EQ(reports[i].first, sum) << "after " << be.registered[i].first;
            EXPECT_EQ(reports[i].second, file_bytes);
        }
        EXPECT_EQ(reports.back().first, reports.back().second);
        if (qwen2) {
            EXPECT_EQ(m->output.host, m->token_embd.host);  // tied output still set
        }
    }
}

// A file with a bad tensor fails before the backend sees any weight.
TEST(LoadProgress, ABadFileRegistersNothing) {
    const uint64_t seed = tern::test::run_seed() + 3;
    std::mt19937_64 rng(seed);
    SCOPED_TRACE("seed " + std::to_string(seed));
    SynthFile f{write_synth(rng, false, "whole")};
    auto file = gguf::File::open(f.path);
    ASSERT_TRUE(file.ok());
    // Drop one tensor of the last layer (a random one), so every earlier tensor is fine.
    std::vector<const gguf::TensorInfo*> last_layer;
    for (const auto& t : (*file)->tensors())
        if (t.name.rfind("blk.1.", 0) == 0) last_layer.push_back(&t);
    ASSERT_FALSE(last_layer.empty());
    const std::string dropped = last_layer[rng() % last_layer.size()]->name;
    SynthFile cut{f.path + ".cut.gguf"};
    gguf::Writer w;
    for (const auto& kv : (*file)->metadata()) w.set(kv.key, kv.value);
    std::vector<const gguf::TensorInfo*> keep;
    for (const auto& t : (*file)->tensors())
        if (t.name != dropped) {
            ASSERT_TRUE(w.add_tensor(t.name, t.type(), std::vector<int64_t>(t.ne, t.ne + t.n_dims)).ok());
            keep.push_back(&t);
        }
    ASSERT_TRUE(w.begin(cut.path).ok());
    for (const auto* t : keep) ASSERT_TRUE(w.write_tensor_data(t->data, t->n_bytes).ok());
    ASSERT_TRUE(w.finish().ok());

    auto cut_file = gguf::File::open(cut.path);
    ASSERT_TRUE(cut_file.ok());
    RecordingBackend be;
    int reports = 0;
    auto m = model::load_model(**cut_file, be, [&](size_t, size_t) { ++reports; });
    ASSERT_FALSE(m.ok());
    EXPECT_TRUE(contains(m.error().message, "'" + dropped + "' is missing")) << m.error().message;
    EXPECT_TRUE(be.registered.empty());
    EXPECT_EQ(reports, 0);
}

class EngineBackend : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        std::mt19937_64 rng(tern::test::run_seed() + 4);
        file_ = new SynthFile{write_synth(rng, false, "engine")};
    }
    static void TearDownTestSuite() {
        delete file_;
        file_ = nullptr;
    }
    static runtime::EngineOptions options(const std::string& backend) {
        runtime::EngineOptions o;
        o.backend = backend;
        o.threads = 1;
        o.n_ctx = 64;
        o.max_batch = 16;
        return o;
    }
    static SynthFile* file_;
};
SynthFile* EngineBackend::file_ = nullptr;

TEST_F(EngineBackend, CpuDrawsNoLoadProgress) {
    runtime::EngineOptions o = options("cpu");
    o.gpu = 5;  // read only by the cuda backend
    int reports = 0;
    o.load_progress = [&](size_t, size_t) { ++reports; };
    auto e = runtime::Engine::open(file_->path, o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ((*e)->backend_name(), "cpu");
    EXPECT_EQ((*e)->device_bytes(), 0u);
    EXPECT_EQ(reports, 0);
}

TEST_F(EngineBackend, AutoPicksWhatTheMachineOffers) {
    EXPECT_EQ(runtime::EngineOptions{}.backend, "auto");
    const bool built = backend::built_with_cuda();
    const GpuList gpus = built ? backend::list_gpus() : gpus_of(0);
    auto expected = runtime::choose_backend("auto", built, gpus);
    ASSERT_TRUE(expected.ok());
    runtime::EngineOptions o = options("auto");
    std::vector<std::pair<size_t, size_t>> reports;
    o.load_progress = [&](size_t done, size_t total) { reports.emplace_back(done, total); };
    auto e = runtime::Engine::open(file_->path, o);
    ASSERT_TRUE(e.ok()) << e.error().message;
    EXPECT_EQ(lower((*e)->backend_name()), *expected);
    if (*expected == "cpu") {
        EXPECT_TRUE(reports.empty());
    } else {
        // On a GPU: weights copied, reported as they go, and held on the device.
        ASSERT_FALSE(reports.empty());
        EXPECT_EQ(reports.back().first, reports.back().second);
        EXPECT_GE((*e)->device_bytes(), reports.back().second);
    }
}

TEST_F(EngineBackend, CudaThatCannotRunSaysWhy) {
    const bool built = backend::built_with_cuda();
    const GpuList gpus = built ? backend::list_gpus() : gpus_of(0);
    if (built && gpus.ok() && !gpus->empty()) GTEST_SKIP() << "a GPU is available here";
    auto e = runtime::Engine::open(file_->path, options("cuda"));
    ASSERT_FALSE(e.ok());
    const std::string& msg = e.error().message;
    EXPECT_TRUE(contains(msg, "backend cuda: ")) << msg;
    if (!built) {
        auto direct = backend::make_cuda_backend(0);
        ASSERT_FALSE(direct.ok());
        EXPECT_TRUE(contains(msg, direct.error().message)) << msg;  // the factory's reason, unchanged
        EXPECT_TRUE(contains(msg, "CUDA")) << msg;
    } else {
        EXPECT_TRUE(contains(msg, "GPU")) << msg;
    }
}

TEST_F(EngineBackend, BadNamesAndIndicesAreRefused) {
    auto bogus = runtime::Engine::open(file_->path, options("bogus"));
    ASSERT_FALSE(bogus.ok());
    EXPECT_TRUE(contains(bogus.error().message, "unknown backend 'bogus' (choose auto, cpu or cuda)"))
        << bogus.error().message;
    runtime::EngineOptions o = options("cuda");
    o.gpu = -1;
    auto negative = runtime::Engine::open(file_->path, o);
    ASSERT_FALSE(negative.ok());
    EXPECT_TRUE(contains(negative.error().message, "GPU index must be 0 or more (got -1)"))
        << negative.error().message;
    if (backend::built_with_cuda()) {
        auto gpus = backend::list_gpus();
        if (gpus.ok()) {
            o.gpu = int(gpus->size());  // one past the last
            auto missing = runtime::Engine::open(file_->path, o);
            ASSERT_FALSE(missing.ok());
            EXPECT_TRUE(contains(missing.error().message, "backend cuda: ")) << missing.error().message;
        }
    }
}

}  // namespace
}  // namespace tern
