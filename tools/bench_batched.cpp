// `tern bench --batched`: throughput with many sequences at once, in the
// conventions of llama.cpp's llama-batched-bench so the tables can be set side
// by side. For each combination of --npp, --ntg and --npl: B = npl sequences,
// each in its own KV slot, first evaluate their prompts (B x PP random tokens
// in forward calls of up to -b tokens, logits for each prompt's last token:
// T_PP), then generate TG tokens each, one step per token carrying one token
// of every sequence with its logits (T_TG). N_KV = B x (PP + TG) cache
// entries; S_PP = B x PP / T_PP, S_TG = B x TG / T_TG, S = N_KV / (T_PP + T_TG).
// Sampling is not timed: the tokens are random valid ids drawn beforehand.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/bench_util.h"
#include "tools/fail.h"

namespace tern::tools {
namespace {

struct BatchedRun {
    int pp = 0, tg = 0, pl = 0;
    double t_pp = 0, t_tg = 0;  // seconds, medians over the repetitions
    int64_t n_kv() const { return int64_t(pl) * (pp + tg); }
    double s_pp() const { return t_pp > 0 ? double(pl) * pp / t_pp : 0; }
    double s_tg() const { return t_tg > 0 ? double(pl) * tg / t_tg : 0; }
    double s_all() const { return t_pp + t_tg > 0 ? double(n_kv()) / (t_pp + t_tg) : 0; }
};

double median_of(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// One measurement: seconds of the prompt phase and of the generation phase.
std::pair<double, double> run_once(const char* cmd, runtime::Engine& e, int pp, int tg, int pl, int batch,
                                   std::mt19937_64& rng) {
    model::Pass& fwd = e.forward();
    const text::Tokenizer& tok = e.tokenizer();
    const int n_vocab = tok.n_vocab();
    const size_t step = size_t(std::max(1, std::min(batch, fwd.max_tokens())));
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(pl));
    for (auto& p : prompts) {
        p = random_tokens(rng, pp, n_vocab);
        if (tok.vocab().add_bos && tok.bos_id() >= 0) p[0] = tok.bos_id();  // as a fresh sequence starts
    }
    std::vector<std::vector<int32_t>> gen(static_cast<size_t>(tg));
    for (auto& g : gen) g = random_tokens(rng, pl, n_vocab);

    model::Logits logits;
    logits.reserve(size_t(pl) * size_t(n_vocab));  // made before the clock starts (page-locked on a GPU)
    auto run = [&](const model::Batch& b) {
        if (Status s = fwd.run(b, logits); !s.ok()) fail(cmd, "forward pass: " + s.message());
    };
    // Prompts back to back, sequence by sequence, cut into calls of `step` tokens.
    auto t0 = std::chrono::steady_clock::now();
    model::Batch b;
    for (int s = 0; s < pl; ++s)
        for (int i = 0; i < pp; ++i) {
            b.add(prompts[size_t(s)][size_t(i)], i, s, i + 1 == pp);
            if (b.size() == step) {
                run(b);
                b = model::Batch();
            }
        }
    if (b.size() > 0) run(b);
    const double t_pp = seconds_since(t0);

    t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < tg; ++i) {
        model::Batch d;
        for (int s = 0; s < pl; ++s) d.add(gen[size_t(i)][size_t(s)], pp + i, s, true);
        run(d);
    }
    return {t_pp, seconds_since(t0)};
}

nlohmann::ordered_json to_json(const ModelInfo& m, const BatchedRun& r, int batch, int threads, uint64_t device_bytes) {
    nlohmann::ordered_json j = model_json(m);
    j["tp"] = m.tp;
    j["n_batch"] = batch;
    j["n_threads"] = threads;
    j["gpu_mem_mib"] = mib_of(device_bytes);  // 0 on the CPU
    // llama-batched-bench's JSONL names.
    j["pp"] = r.pp;
    j["tg"] = r.tg;
    j["pl"] = r.pl;
    j["n_kv"] = r.n_kv();
    j["t_pp"] = r.t_pp;
    j["speed_pp"] = r.s_pp();
    j["t_tg"] = r.t_tg;
    j["speed_tg"] = r.s_tg();
    j["t"] = r.t_pp + r.t_tg;
    j["speed"] = r.s_all();
    return j;
}

}  // namespace

void run_batched_bench(const char* cmd, const std::string& path, const ModelFlags& flags,
                       const BatchedBenchOptions& o) {
    if (o.output != "md" && o.output != "json" && o.output != "csv")
        fail(cmd, "-o: unknown format '" + o.output + "' (choose md, json or csv)");
    if (o.reps < 1) fail(cmd, "-r must be at least 1 (got " + std::to_string(o.reps) + ")");
    const std::vector<int> npps = parse_list(cmd, "--npp", o.npp, 1);
    const std::vector<int> ntgs = parse_list(cmd, "--ntg", o.ntg, 0);
    const std::vector<int> npls = parse_list(cmd, "--npl", o.npl, 1);
    const int max_pl = *std::max_element(npls.begin(), npls.end());
    const int n_ctx = *std::max_element(npps.begin(), npps.end()) + *std::max_element(ntgs.begin(), ntgs.end());

    std::unique_ptr<runtime::Engine> engine = open_engine(cmd, path, flags, n_ctx, max_pl);
    const ModelInfo info = describe_model(*engine, path);
    const uint64_t device_bytes = engine->device_bytes();
    if (flags.verbose) print_model_summary(*engine, path);
    std::mt19937_64 rng(0x5b1e7c3d);  // fixed: every run draws the same token ids

    // Warm-up at the widest step: weights uploaded at first use, the decode
    // step's CUDA graph captured.
    run_once(cmd, *engine, std::min(npps.front(), 32), std::min(4, n_ctx - std::min(npps.front(), 32)), max_pl,
             flags.batch, rng);

    const bool md = o.output == "md";
    if (md) {
        std::printf("model: %s (%s, %s), backend %s, n_batch %d, threads %d, %d slots of %d positions\n\n",
                    info.type.c_str(), format_size(info.size).c_str(), format_params(info.n_params).c_str(),
                    info.backend.c_str(), flags.batch, flags.threads, max_pl, n_ctx);
        std::printf("| %6s | %6s | %4s | %7s | %8s | %9s | %8s | %9s | %8s | %9s | %12s |\n", "PP", "TG", "B", "N_KV",
                    "T_PP s", "S_PP t/s", "T_TG s", "S_TG t/s", "T s", "S t/s", "gpu mem");
        std::printf("|-------:|-------:|-----:|--------:|---------:|----------:|---------:|----------:|---------:|"
                    "----------:|-------------:|\n");
    }
    std::vector<nlohmann::ordered_json> rows;
    for (int pp : npps)
        for (int tg : ntgs)
            for (int pl : npls) {
                std::vector<double> t_pp, t_tg;
                for (int r = 0; r < o.reps; ++r) {
                    if (flags.verbose)
                        std::fprintf(stderr, "bench: PP %d, TG %d, B %d: run %d of %d\n", pp, tg, pl, r + 1, o.reps);
                    const auto [a, b] = run_once(cmd, *engine, pp, tg, pl, flags.batch, rng);
                    t_pp.push_back(a);
                    t_tg.push_back(b);
                }
                BatchedRun run{pp, tg, pl, median_of(t_pp), median_of(t_tg)};
                if (md) {
                    std::printf("| %6d | %6d | %4d | %7lld | %8.3f | %9.2f | %8.3f | %9.2f | %8.3f | %9.2f | %12s |\n",
                                pp, tg, pl, static_cast<long long>(run.n_kv()), run.t_pp, run.s_pp(), run.t_tg,
                                run.s_tg(), run.t_pp + run.t_tg, run.s_all(),
                                format_device_mem(info, device_bytes).c_str());
                    std::fflush(stdout);
                }
                rows.push_back(to_json(info, run, flags.batch, flags.threads, device_bytes));
            }
    if (md) {
        std::printf("\nbuild: tern %s, peak RSS %s\n", TERN_VERSION, format_size(peak_rss_bytes()).c_str());
    } else if (o.output == "json") {
        std::printf("%s\n", nlohmann::ordered_json(rows).dump(2).c_str());
    } else {
        std::string head;
        for (const auto& [key, v] : rows.front().items()) head += (head.empty() ? "" : ",") + key;
        std::printf("%s\n", head.c_str());
        for (const auto& j : rows) std::printf("%s\n", csv_row(j).c_str());
    }
    std::fflush(stdout);
}

}  // namespace tern::tools
