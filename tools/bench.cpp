// `tern bench -m MODEL`: prompt-processing and generation speed in the
// conventions of llama-bench, so numbers can be set side by side: ppN
// evaluates N random tokens in batches from an empty cache, tgN evaluates N
// single tokens one after another from an empty cache; every combination of
// the comma lists is run once as a warm-up and then -r times, and t/s is the
// mean ± standard deviation over the runs. Tokenization and sampling are not
// part of what is timed: the tokens are random valid ids drawn beforehand.
// Besides llama-bench's columns, "gpu mem" is the device memory the backend
// holds once the weights and KV cache are in place (empty on the CPU), over
// every GPU of a tensor-parallel run (--tp N, shown in the backend column).
// `--batched` runs llama-batched-bench's many-sequence test instead
// (bench_batched.cpp).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backend/gpu.h"
#include "quant/mix.h"
#include "tools/bench_util.h"
#include "tools/commands.h"
#include "tools/common_options.h"
#include "tools/fail.h"

namespace tern::tools {

// ---- shared with `bench --batched` (bench_util.h) ----------------------------

std::vector<int> parse_list(const char* cmd, const std::string& flag, const std::string& text, int min_value) {
    std::vector<int> out;
    size_t pos = 0;
    while (pos <= text.size()) {
        const size_t comma = std::min(text.find(',', pos), text.size());
        const std::string item = text.substr(pos, comma - pos);
        size_t used = 0;
        int v = 0;
        try {
            v = std::stoi(item, &used);
        } catch (const std::exception&) {
            used = 0;
        }
        if (item.empty() || used != item.size())
            fail(cmd, flag + ": '" + item + "' is not an integer (expected a comma-separated list like 512,2048)");
        if (v < min_value) fail(cmd, flag + ": " + item + " is below " + std::to_string(min_value));
        out.push_back(v);
        pos = comma + 1;
    }
    return out;
}

uint64_t peak_rss_bytes() {
    struct rusage ru {};
    getrusage(RUSAGE_SELF, &ru);
    return uint64_t(ru.ru_maxrss) * 1024;  // Linux reports KiB
}

static std::string size_label_of(const gguf::File& f, uint64_t n_params) {
    if (auto label = f.get_string("general.size_label"); label && !label->empty()) return *label;
    char buf[32];
    const double p = double(n_params);
    if (p < 1e9) std::snprintf(buf, sizeof buf, "%.0fM", p / 1e6);
    else if (p < 10e9) std::snprintf(buf, sizeof buf, "%.1fB", p / 1e9);
    else std::snprintf(buf, sizeof buf, "%.0fB", p / 1e9);
    return buf;
}

ModelInfo describe_model(runtime::Engine& e, const std::string& path) {
    ModelInfo m;
    m.filename = path;
    uint64_t embedding = 0, experts = 0;
    bool tied = true;
    for (const gguf::TensorInfo& t : e.file().tensors()) {
        m.size += t.n_bytes;
        m.n_params += uint64_t(t.n_elements);
        if (t.name == "token_embd.weight") embedding = t.n_bytes;
        if (t.name == "output.weight") tied = false;
        if (t.name.find("_exps.weight") != std::string::npos) experts += t.n_bytes;
    }
    // A token reads one row of the embedding table, unless it is also the output head,
    // and of a mixture of experts only the experts it is routed to.
    const model::Hparams& hp = e.model().hp;
    const uint64_t unread_experts = hp.n_expert > 0 ? experts / uint64_t(hp.n_expert) *
                                                           uint64_t(hp.n_expert - hp.n_expert_used)
                                                     : 0;
    m.weight_bytes = m.size - (tied ? 0 : embedding) - unread_experts;
    std::string ftype = "?";
    if (auto id = e.file().get_int("general.file_type"); id && *id >= 0 && *id <= int64_t(UINT32_MAX))
        ftype = quant::file_type_name(uint32_t(*id)).value_or("?");
    m.type = e.model().hp.arch + " " + size_label_of(e.file(), m.n_params) + " " + ftype;
    m.backend = backend_display_name(e);
    m.on_device = m.backend != "CPU";
    m.tp = e.tp();
    if (m.tp > 1) m.backend += " tp=" + std::to_string(m.tp);
    return m;
}

double measure_host_copy_gbps(int threads) {
    const size_t bytes = size_t(64) << 20;
    const int n = std::max(1, threads);
    std::vector<char> src(bytes, 1), dst(bytes, 0);  // pages touched before timing
    double best = 0;
    for (int rep = 0; rep < 3; ++rep) {
        const auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel for num_threads(n) schedule(static)
        for (int i = 0; i < n; ++i) {
            const size_t begin = bytes * size_t(i) / size_t(n), end = bytes * size_t(i + 1) / size_t(n);
            std::memcpy(dst.data() + begin, src.data() + begin, end - begin);
        }
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (s > 0) best = std::max(best, 2.0 * double(bytes) / s / 1e9);
    }
    return best;
}

std::string format_size(uint64_t bytes) {
    char buf[32];
    const double mib = double(bytes) / (1024.0 * 1024.0);
    if (mib < 1024.0) std::snprintf(buf, sizeof buf, "%.2f MiB", mib);
    else std::snprintf(buf, sizeof buf, "%.2f GiB", mib / 1024.0);
    return buf;
}

double mib_of(uint64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

// The "gpu mem" cell: empty for a backend in host memory.
std::string format_device_mem(const ModelInfo& m, uint64_t bytes) {
    if (!m.on_device) return "";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.2f MiB", mib_of(bytes));
    return buf;
}

std::string format_params(uint64_t n) {
    char buf[32];
    if (n < 1000000000ull) std::snprintf(buf, sizeof buf, "%.2f M", double(n) / 1e6);
    else std::snprintf(buf, sizeof buf, "%.2f B", double(n) / 1e9);
    return buf;
}

double mean_of(const std::vector<double>& v) {
    double s = 0;
    for (double x : v) s += x;
    return v.empty() ? 0 : s / double(v.size());
}

// Sample standard deviation (n - 1); 0 for a single run.
double stddev_of(const std::vector<double>& v) {
    if (v.size() < 2) return 0;
    const double m = mean_of(v);
    double s = 0;
    for (double x : v) s += (x - m) * (x - m);
    return std::sqrt(s / double(v.size() - 1));
}

std::vector<int32_t> random_tokens(std::mt19937_64& rng, int n, int n_vocab) {
    std::uniform_int_distribution<int32_t> pick(0, n_vocab - 1);
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (int32_t& x : t) x = pick(rng);
    return t;
}

nlohmann::ordered_json model_json(const ModelInfo& m) {
    nlohmann::ordered_json j;
    j["build"] = std::string("tern ") + TERN_VERSION;
    j["model_filename"] = m.filename;
    j["model_type"] = m.type;
    j["model_size"] = m.size;
    j["model_n_params"] = m.n_params;
    j["backend"] = m.backend;
    return j;
}

static std::string csv_field(const std::string& s) {
    if (s.find_first_of(",\"\n ") == std::string::npos) return s;
    std::string q = "\"";
    for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
    return q + "\"";
}

std::string csv_row(const nlohmann::ordered_json& j) {
    std::string line;
    for (const auto& [key, v] : j.items()) {
        std::string cell;
        if (v.is_string()) {
            cell = v.get<std::string>();
        } else if (v.is_array()) {
            for (const auto& x : v) cell += (cell.empty() ? "" : " ") + x.dump();
        } else {
            cell = v.dump();
        }
        line += (line.empty() ? "" : ",") + csv_field(cell);
    }
    return line;
}

namespace {

constexpr const char* kCmd = "bench";

struct BenchCliOptions {
    ModelFlags model;  // threads/ctx/batch there are unused: bench takes lists
    std::string pp = "512";
    std::string tg = "128";
    std::string threads;  // empty: all cores
    std::string batch = "512";
    std::string depth = "0";  // tokens already in the cache when a test starts
    int reps = 5;
    std::string output = "md";
    bool batched = false;       // --batched: llama-batched-bench's test instead (bench_batched.cpp)
    BatchedBenchOptions many;   // its lists
};

struct TestRun {
    std::string name;  // "pp512", "tg128", "tg128 @ d4096"
    int n_prompt = 0, n_gen = 0, threads = 0, batch = 0, depth = 0;
    std::vector<double> ns;  // per repetition
    std::vector<double> ts;  // tokens per second per repetition
    uint64_t peak_rss = 0;   // bytes, after the test
    uint64_t device_bytes = 0;  // held by the backend with weights and KV cache in place
    double copy_gbps = 0;       // the device's measured copy rate (0: not measured)
};

// Nanoseconds to evaluate `tokens` at positions pos0.. in batches of
// `batch`, with logits for the last token only (as a prompt is evaluated).
double time_prompt(runtime::Engine& e, const std::vector<int32_t>& tokens, int batch, int pos0) {
    model::Pass& fwd = e.forward();
    const size_t step = size_t(std::min(batch, fwd.max_tokens()));
    model::Logits logits;
    logits.reserve(size_t(e.n_vocab()));  // its memory made before the clock starts (page-locked on a GPU)
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < tokens.size(); i += step) {
        model::Batch b;
        const size_t n = std::min(step, tokens.size() - i);
        for (size_t j = 0; j < n; ++j) b.add(tokens[i + j], pos0 + int32_t(i + j), 0, i + j + 1 == tokens.size());
        if (Status s = fwd.run(b, logits); !s.ok()) fail(kCmd, "forward pass: " + s.message());
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

// Nanoseconds to evaluate `tokens` one at a time at positions pos0.., each
// step producing logits (as generation does).
double time_generation(runtime::Engine& e, const std::vector<int32_t>& tokens, int pos0) {
    model::Pass& fwd = e.forward();
    model::Logits logits;
    logits.reserve(size_t(e.n_vocab()));
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < tokens.size(); ++i) {
        model::Batch b;
        b.add(tokens[i], pos0 + int32_t(i), 0, true);
        if (Status s = fwd.run(b, logits); !s.ok()) fail(kCmd, "forward pass: " + s.message());
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}

void run_test(runtime::Engine& e, TestRun& t, int reps, std::mt19937_64& rng) {
    const text::Tokenizer& tok = e.tokenizer();
    const int n_vocab = tok.n_vocab();
    const int n = t.n_prompt > 0 ? t.n_prompt : t.n_gen;
    for (int r = -1; r < reps; ++r) {  // r == -1: the warm-up, not recorded
        // The context a test starts after, evaluated untimed; then the test's
        // tokens. Both start the way a fresh sequence would.
        std::vector<int32_t> context = random_tokens(rng, t.depth, n_vocab);
        std::vector<int32_t> tokens = random_tokens(rng, n, n_vocab);
        std::vector<int32_t>& first = t.depth > 0 ? context : tokens;
        if (tok.vocab().add_bos && tok.bos_id() >= 0) first[0] = tok.bos_id();
        if (t.depth > 0) time_prompt(e, context, t.batch, 0);
        const double ns =
            t.n_prompt > 0 ? time_prompt(e, tokens, t.batch, t.depth) : time_generation(e, tokens, t.depth);
        if (r < 0) continue;
        t.ns.push_back(ns);
        t.ts.push_back(ns > 0 ? double(n) * 1e9 / ns : 0);
    }
    t.peak_rss = peak_rss_bytes();
}

// How close a generation test came to the floor: every weight is read once
// per token, so weight bytes x tokens/s is the bandwidth achieved, set
// against the device's measured copy rate (bytes read plus written).
double weight_gbps(const ModelInfo& m, const TestRun& t) { return double(m.weight_bytes) * mean_of(t.ts) / 1e9; }
double copy_share(const ModelInfo& m, const TestRun& t) {
    return t.copy_gbps > 0 ? weight_gbps(m, t) / t.copy_gbps : 0;
}

// The copy rate a generation test is set against: device-to-device on the
// GPU (times the ranks of a tensor-parallel run, which read their shares at
// once), else `host_gbps`, memcpy over the test's threads measured before the
// model was opened (so its buffers never add to the peak RSS). 0 when it
// cannot be had.
double copy_gbps_for(const runtime::Engine& e, double host_gbps) {
    if (e.backend_name() == "cpu") return host_gbps;
    auto r = backend::measure_gpu_copy_gbps(e.options().gpu);
    return r.ok() ? *r * e.tp() : 0;
}

// Markdown in llama-bench's layout; the batch column only when it is not the default.
// Generation rows add the weight bandwidth they reached and its share of the
// device's copy rate.
struct MarkdownTable {
    bool show_batch;
    void header() const {
        std::printf("| %-30s | %10s | %10s | %-10s | %12s | %7s |", "model", "size", "params", "backend", "gpu mem",
                    "threads");
        if (show_batch) std::printf(" %7s |", "n_batch");
        std::printf(" %15s | %20s | %12s | %7s |\n", "test", "t/s", "weights GB/s", "of copy");
        std::printf("| %s | %s: | %s: | %s | %s: | %s: |", std::string(30, '-').c_str(), std::string(9, '-').c_str(),
                    std::string(9, '-').c_str(), std::string(10, '-').c_str(), std::string(11, '-').c_str(),
                    std::string(6, '-').c_str());
        if (show_batch) std::printf(" %s: |", std::string(6, '-').c_str());
        std::printf(" %s: | %s: | %s: | %s: |\n", std::string(14, '-').c_str(), std::string(19, '-').c_str(),
                    std::string(11, '-').c_str(), std::string(6, '-').c_str());
    }
    void row(const ModelInfo& m, const TestRun& t) const {
        char ts[64];
        std::snprintf(ts, sizeof ts, "%.2f ± %.2f", mean_of(t.ts), stddev_of(t.ts));
        std::printf("| %-30s | %10s | %10s | %-10s | %12s | %7d |", m.type.c_str(), format_size(m.size).c_str(),
                    format_params(m.n_params).c_str(), m.backend.c_str(),
                    format_device_mem(m, t.device_bytes).c_str(), t.threads);
        if (show_batch) std::printf(" %7d |", t.batch);
        char gbps[32] = "", share[32] = "";
        if (t.n_gen > 0) {
            std::snprintf(gbps, sizeof gbps, "%.1f", weight_gbps(m, t));
            if (t.copy_gbps > 0) std::snprintf(share, sizeof share, "%.0f%%", 100.0 * copy_share(m, t));
        }
        // "±" is two bytes in UTF-8 but one column wide: pad by one more.
        std::printf(" %15s | %21s | %12s | %7s |\n", t.name.c_str(), ts, gbps, share);
        std::fflush(stdout);
    }
};

nlohmann::ordered_json to_json(const ModelInfo& m, const TestRun& t) {
    nlohmann::ordered_json j = model_json(m);
    j["gpu_mem_mib"] = mib_of(t.device_bytes);  // 0 on the CPU
    j["tp"] = m.tp;
    j["n_threads"] = t.threads;
    j["n_batch"] = t.batch;
    j["test"] = t.name;
    j["n_prompt"] = t.n_prompt;
    j["n_gen"] = t.n_gen;
    j["n_depth"] = t.depth;
    j["avg_ns"] = mean_of(t.ns);
    j["stddev_ns"] = stddev_of(t.ns);
    j["avg_ts"] = mean_of(t.ts);
    j["stddev_ts"] = stddev_of(t.ts);
    j["samples_ns"] = t.ns;
    j["samples_ts"] = t.ts;
    j["peak_rss_bytes"] = t.peak_rss;
    // Generation tests: weight bytes read per token, the bandwidth that makes,
    // and its share of the measured copy rate (null where not measured).
    using J = nlohmann::ordered_json;
    const bool gen = t.n_gen > 0;
    j["weight_bytes"] = m.weight_bytes;
    j["weight_gbps"] = gen ? J(weight_gbps(m, t)) : J();
    j["copy_gbps"] = t.copy_gbps > 0 ? J(t.copy_gbps) : J();
    j["copy_share"] = gen && t.copy_gbps > 0 ? J(copy_share(m, t)) : J();
    return j;
}

// --batched takes one thread count and one batch size, and its own lists
// instead of -p/-n; a flag of the other mode is an error, never ignored.
void run_batched(const BenchCliOptions& o, const CLI::App& cmd) {
    for (const char* flag : {"-p", "-n", "-d"})
        if (cmd.count(flag) > 0)
            fail(kCmd, std::string(flag) + " is not a --batched option (use --npp, --ntg and --npl)");
    const std::vector<int> threads = o.threads.empty() ? std::vector<int>{0} : parse_list(kCmd, "-t", o.threads, 0);
    const std::vector<int> batches = parse_list(kCmd, "-b", o.batch, 1);
    if (threads.size() != 1) fail(kCmd, "-t: --batched takes one thread count");
    if (batches.size() != 1) fail(kCmd, "-b: --batched takes one batch size");
    ModelFlags mf = o.model;
    mf.threads = threads.front() > 0 ? threads.front() : std::max(1, int(std::thread::hardware_concurrency()));
    mf.batch = batches.front();
    BatchedBenchOptions many = o.many;
    many.reps = cmd.count("-r") > 0 ? o.reps : 1;
    many.output = o.output;
    run_batched_bench(kCmd, resolve_model_path(kCmd, o.model.model), mf, many);
}

void run_bench(const BenchCliOptions& o, const CLI::App& cmd) {
    reject_extras(kCmd, cmd);
    if (o.batched) return run_batched(o, cmd);
    for (const char* flag : {"--npp", "--ntg", "--npl"})
        if (cmd.count(flag) > 0) fail(kCmd, std::string(flag) + " needs --batched");
    if (o.output != "md" && o.output != "json" && o.output != "csv")
        fail(kCmd, "-o: unknown format '" + o.output + "' (choose md, json or csv)");
    if (o.reps < 1) fail(kCmd, "-r must be at least 1 (got " + std::to_string(o.reps) + ")");
    const std::vector<int> pps = parse_list(kCmd, "-p", o.pp, 0);
    const std::vector<int> tgs = parse_list(kCmd, "-n", o.tg, 0);
    const int all_cores = std::max(1, int(std::thread::hardware_concurrency()));
    std::vector<int> threads = o.threads.empty() ? std::vector<int>{all_cores} : parse_list(kCmd, "-t", o.threads, 0);
    for (int& t : threads)
        if (t == 0) t = all_cores;
    const std::vector<int> batches = parse_list(kCmd, "-b", o.batch, 1);
    const std::vector<int> depths = parse_list(kCmd, "-d", o.depth, 0);
    int n_ctx = 1;
    bool any = false, any_gen = false;
    for (int n : pps) n_ctx = std::max(n_ctx, n), any = any || n > 0;
    for (int n : tgs) n_ctx = std::max(n_ctx, n), any = any || n > 0, any_gen = any_gen || n > 0;
    if (!any) fail(kCmd, "nothing to measure: -p and -n are all 0");
    n_ctx += *std::max_element(depths.begin(), depths.end());

    const std::string path = resolve_model_path(kCmd, o.model.model);
    const bool markdown = o.output == "md";
    const MarkdownTable table{batches.size() > 1 || batches.front() != 512};
    std::mt19937_64 rng(0x7e3b1c5d);  // fixed: every run of bench draws the same token ids
    std::vector<TestRun> done;
    ModelInfo info;
    for (size_t ti = 0; ti < threads.size(); ++ti) {
        ModelFlags mf = o.model;
        mf.threads = threads[ti];
        mf.batch = *std::max_element(batches.begin(), batches.end());
        // Not needed when the GPU was asked for: its rate is measured on the device.
        const double host_gbps = any_gen && o.model.backend != "cuda" ? measure_host_copy_gbps(threads[ti]) : 0;
        std::unique_ptr<runtime::Engine> engine = open_engine(kCmd, path, mf, n_ctx);
        const uint64_t device_bytes = engine->device_bytes();
        const double copy_gbps = any_gen ? copy_gbps_for(*engine, host_gbps) : 0;
        if (ti == 0) {
            info = describe_model(*engine, path);
            if (o.model.verbose) print_model_summary(*engine, path);
            if (markdown) table.header();
        }
        for (int batch : batches) {
            std::vector<TestRun> plan;
            auto add = [&](const char* kind, int n, int depth) {
                TestRun t;
                t.name = kind + std::to_string(n) + (depth > 0 ? " @ d" + std::to_string(depth) : "");
                (kind[0] == 'p' ? t.n_prompt : t.n_gen) = n;
                t.threads = threads[ti];
                t.batch = batch;
                t.depth = depth;
                t.device_bytes = device_bytes;
                t.copy_gbps = copy_gbps;
                plan.push_back(std::move(t));
            };
            for (int d : depths) {
                for (int n : pps)
                    if (n > 0) add("pp", n, d);
                for (int n : tgs)
                    if (n > 0) add("tg", n, d);
            }
            for (TestRun& t : plan) {
                if (o.model.verbose)
                    std::fprintf(stderr, "bench: %s, %d threads, batch %d: 1 warm-up + %d runs\n", t.name.c_str(),
                                 t.threads, t.batch, o.reps);
                run_test(*engine, t, o.reps, rng);
                if (markdown) table.row(info, t);
                done.push_back(std::move(t));
            }
        }
    }

    const std::string build = std::string("tern ") + TERN_VERSION;
    if (markdown) {
        std::printf("\nbuild: %s, peak RSS %s\n", build.c_str(), format_size(peak_rss_bytes()).c_str());
    } else if (o.output == "json") {
        nlohmann::ordered_json rows = nlohmann::ordered_json::array();
        for (const TestRun& t : done) rows.push_back(to_json(info, t));
        std::printf("%s\n", rows.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace).c_str());
    } else {
        bool first = true;
        for (const TestRun& t : done) {
            const nlohmann::ordered_json j = to_json(info, t);
            if (first) {
                std::string head;
                for (const auto& [key, v] : j.items()) head += (head.empty() ? "" : ",") + key;
                std::printf("%s\n", head.c_str());
                first = false;
            }
            std::printf("%s\n", csv_row(j).c_str());
        }
    }
    std::fflush(stdout);
}

}  // namespace

void add_bench_command(CLI::App& app) {
    auto o = std::make_shared<BenchCliOptions>();
    CLI::App* cmd = app.add_subcommand(
        "bench", "Measure prompt-processing (ppN) and generation (tgN) speed, llama-bench style");
    cmd->add_option("-m,--model", o->model.model,
                    std::string("GGUF model file (default: $TERN_MODEL, else ") + kDefaultModelFile + ")")
        ->type_name("FILE");
    cmd->add_option("-p,--n-prompt", o->pp, "Prompt lengths to test, comma-separated; 0 = none (default 512)")
        ->type_name("N,...");
    cmd->add_option("-n,--n-gen", o->tg, "Generation lengths to test, comma-separated; 0 = none (default 128)")
        ->type_name("N,...");
    cmd->add_option("-t,--threads", o->threads, "Thread counts to test, comma-separated (default: all cores)")
        ->type_name("N,...");
    cmd->add_option("-b,--batch", o->batch, "Prompt batch sizes to test, comma-separated (default 512)")
        ->type_name("N,...");
    cmd->add_option("-d,--depth", o->depth,
                    "Tokens already in the cache when each test starts, comma-separated (default 0); rows read "
                    "'tg128 @ d4096'")
        ->type_name("N,...");
    add_int_option(cmd, kCmd, "-r,--repetitions", o->reps,
                   "Timed runs per test, after one warm-up (default 5; --batched: 1, medians reported)");
    cmd->add_option("-o,--output", o->output, "Output format: md, json or csv (default md)")->type_name("FORMAT");
    cmd->add_flag("--batched", o->batched,
                  "Many sequences at once, llama-batched-bench style: PP prompt tokens then TG generated tokens for "
                  "each of B sequences, every combination of --npp, --ntg, --npl");
    cmd->add_option("--npp", o->many.npp, "--batched: prompt tokens per sequence, comma-separated (default 128)")
        ->type_name("N,...");
    cmd->add_option("--ntg", o->many.ntg, "--batched: generated tokens per sequence, comma-separated (default 128)")
        ->type_name("N,...");
    cmd->add_option("--npl", o->many.npl,
                    "--batched: parallel sequence counts, comma-separated (default 1,2,4,8,16,32)")
        ->type_name("N,...");
    add_backend_flags(cmd, kCmd, o->model);
    cmd->add_flag("-v,--verbose", o->model.verbose, "Print progress on stderr");
    cmd->allow_extras();
    cmd->callback([o, cmd] { run_bench(*o, *cmd); });
}

}  // namespace tern::tools
