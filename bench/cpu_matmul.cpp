// CPU matmul throughput (Google Benchmark): tokens/s and GB/s of weight bytes
// read, per (weight type, SIMD path, shape, tokens per call, threads). Shapes:
// 4096 x 4096 (a 7B-class projection), 576 x 1536 and 1536 x 576 (the FFN
// down and gate/up projections of a 135M model), 640 x 2048 (Gemma 3 270M's
// FFN down), 262144 x 640 (its output matrix: one and eight tokens). Weights
// lie in huge pages as the CPU backend keeps them; types with its
// interleaved layout run in it too on the AVX-512 path (names "q4_Kx16/...").
// One-token calls are bandwidth-bound, so GB/s against the machine's
// bandwidth is the number to quote; many-token calls (prefill) are
// compute-bound, so tokens/s is.
// Built by bench/CMakeLists.txt when Google Benchmark is installed:
//   ninja -C BUILD cpu_matmul
//   BUILD/bench/cpu_matmul --benchmark_filter='q4_K/avx512/4096x4096/t64/' [google-benchmark flags]
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/matmul.h"
#include "backend/cpu/weight_arena.h"
#include "quant/interleave.h"
#include "quant/quant.h"

namespace {

using namespace tern;

struct Shape {
    int64_t rows, cols;
};

// A rows x cols matrix of type t: 64 distinct quantized rows, repeated (the
// reference quantizers are too slow to fill 16M elements per benchmark).
std::vector<uint8_t> make_weights(TensorType t, Shape shape) {
    const int64_t rows = shape.rows, cols = shape.cols;
    std::mt19937 rng(1234);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    const size_t rb = quant::row_bytes(t, cols);
    std::vector<uint8_t> distinct(64 * rb);
    std::vector<float> row(cols);
    for (int r = 0; r < 64; ++r) {
        for (float& v : row) v = normal(rng);
        (void)quant::quantize_row(t, row.data(), distinct.data() + r * rb, cols);
    }
    std::vector<uint8_t> w(size_t(rows) * rb);
    for (int64_t r = 0; r < rows; ++r) std::memcpy(w.data() + r * rb, distinct.data() + (r % 64) * rb, rb);
    return w;
}

void bm_matmul(benchmark::State& state, TensorType t, quant::SimdPath path, Shape shape, int64_t n_tokens,
               int threads, bool interleaved) {
    const int64_t rows = shape.rows, cols = shape.cols;
    if (!quant::simd_path_available(path)) {
        state.SkipWithError("path not available on this CPU");
        return;
    }
    const std::vector<uint8_t> bytes = make_weights(t, shape);
    backend::Weight w;
    w.name = std::string("bench");
    w.type = t;
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = quant::row_bytes(t, cols);
    // Where the CPU backend keeps weights: huge pages (backend/cpu/weight_arena.h),
    // as GGUF rows or in its registration layout (quant/interleave.h).
    backend::cpu::WeightArena arena(size_t(1) << 34);
    if (interleaved) {
        auto* at = static_cast<uint8_t*>(arena.reserve(quant::interleaved_bytes(t, rows, cols)));
        if (!at || !quant::interleave_rows(t, bytes.data(), w.row_bytes, rows, cols, at).ok()) {
            state.SkipWithError("no interleaved layout for this shape, or no memory");
            return;
        }
        w.host = at;
        w.layout = backend::WeightLayout::interleaved16;
    } else {
        w.host = arena.copy(bytes.data(), bytes.size());
        if (!w.host) {
            state.SkipWithError("no memory for the weights");
            return;
        }
    }
    std::mt19937 rng(99);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(size_t(n_tokens * cols)), out(size_t(n_tokens * rows));
    for (float& v : x) v = normal(rng);
    backend::cpu::MatmulOptions opt;
    opt.path = path;
    opt.n_threads = threads;
    for (auto _ : state) {
        const Status s = backend::cpu::matmul(w, x.data(), n_tokens, out.data(), opt);
        if (!s.ok()) {
            state.SkipWithError(s.message().c_str());
            return;
        }
        benchmark::DoNotOptimize(out.data());
        benchmark::ClobberMemory();
    }
    const size_t read = interleaved ? quant::interleaved_bytes(t, rows, cols) : bytes.size();
    state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(read));
    state.counters["tokens/s"] =
        benchmark::Counter(double(n_tokens) * double(state.iterations()), benchmark::Counter::kIsRate);
    state.counters["weight_GB/s"] = benchmark::Counter(double(read) * 1e-9 * double(state.iterations()),
                                                       benchmark::Counter::kIsRate);
}

const int kRegistered = [] {
    const TensorType types[] = {TensorType::Q4_K, TensorType::Q4_1, TensorType::Q8_0, TensorType::Q4_0,
                                TensorType::Q5_K, TensorType::Q6_K, TensorType::Q3_K, TensorType::Q2_K,
                                TensorType::Q5_0, TensorType::Q5_1, TensorType::F16};
    const quant::SimdPath paths[] = {quant::SimdPath::scalar, quant::SimdPath::avx2, quant::SimdPath::avx512};
    const Shape shapes[] = {{4096, 4096}, {576, 1536}, {1536, 576}, {640, 2048}, {262144, 640}};
    for (TensorType t : types)
        for (quant::SimdPath p : paths)
            for (Shape shape : shapes)
                for (int64_t n : {1, 8, 64, 512})
                    for (int threads : {1, 2})
                        for (const bool interleaved : {false, true}) {
                            // The layout's kernels are AVX-512's (other paths read rows back).
                            if (interleaved && (p != quant::SimdPath::avx512 ||
                                                quant::interleaved_bytes(t, shape.rows, shape.cols) == 0))
                                continue;
                            if (shape.rows > 100000 && n > 8) continue;
                            const std::string name =
                                tensor_type_name(uint32_t(t)) + (interleaved ? "x16/" : "/") +
                                quant::simd_path_name(p) + "/" + std::to_string(shape.rows) + "x" +
                                std::to_string(shape.cols) + "/t" + std::to_string(n) + "/" +
                                std::to_string(threads) + "thread" + (threads > 1 ? "s" : "");
                            auto* b = benchmark::RegisterBenchmark(name.c_str(), bm_matmul, t, p, shape, n, threads,
                                                                   interleaved);
                            b->Unit(benchmark::kMicrosecond);
                            // One thread: rates from this thread's CPU time, which a busy machine
                            // disturbs least. Several: wall time.
                            if (threads != 1) b->UseRealTime();
                        }
    return 0;
}();

}  // namespace

BENCHMARK_MAIN();
