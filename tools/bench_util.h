// What `tern bench` and `tern bench --batched` share: the model's row of the
// table, list flags, formatting and the CSV writer.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "tools/common_options.h"

namespace tern::tools {

// The model as the table names it.
struct ModelInfo {
    std::string filename;
    std::string type;      // "llama 135M Q4_1"
    uint64_t size = 0;     // bytes of tensor data
    uint64_t n_params = 0;
    std::string backend;   // "CPU", "CUDA"; "CUDA tp=2" for a tensor-parallel run
    bool on_device = false;
    int tp = 1;
    uint64_t weight_bytes = 0;  // read per generated token: every tensor but the embedding table (unless tied)
};
ModelInfo describe_model(runtime::Engine& e, const std::string& path);
// The fields every JSON/CSV row starts with: build, model_filename,
// model_type, model_size, model_n_params, backend.
nlohmann::ordered_json model_json(const ModelInfo& m);

// A comma-separated list of integers of at least min_value; a bad item fails
// command `cmd` with a message naming the flag.
std::vector<int> parse_list(const char* cmd, const std::string& flag, const std::string& text, int min_value);

uint64_t peak_rss_bytes();
std::string format_size(uint64_t bytes);                            // "3.80 GiB"
std::string format_params(uint64_t n);                              // "6.74 B"
double mib_of(uint64_t bytes);
std::string format_device_mem(const ModelInfo& m, uint64_t bytes);  // "" for a backend in host memory
double mean_of(const std::vector<double>& v);
double stddev_of(const std::vector<double>& v);  // sample (n - 1); 0 for one value
std::vector<int32_t> random_tokens(std::mt19937_64& rng, int n, int n_vocab);
// memcpy bandwidth over `threads` threads, bytes read plus written, in GB/s:
// the best of a few copies of 64 MiB (past the last-level cache of most CPUs).
double measure_host_copy_gbps(int threads);
// One CSV line of a JSON object's values (arrays joined by spaces).
std::string csv_row(const nlohmann::ordered_json& j);

// `tern bench --batched`: llama-batched-bench's test (bench_batched.cpp).
// Every combination of the lists: npl sequences, each in its own KV slot,
// prefill npp prompt tokens each (batches of flags.batch tokens), then
// generate ntg tokens each, one token per sequence per step.
struct BatchedBenchOptions {
    std::string npp = "128", ntg = "128", npl = "1,2,4,8,16,32";
    int reps = 1;             // timed runs per combination (medians reported), after one warm-up
    std::string output = "md";
};
void run_batched_bench(const char* cmd, const std::string& path, const ModelFlags& flags,
                       const BatchedBenchOptions& o);

}  // namespace tern::tools
