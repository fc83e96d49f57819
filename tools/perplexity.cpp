// `tern perplexity -m MODEL -f TEXT`: the chunked perplexity GGUF tools
// report (see runtime/perplexity.h), with a running value after each chunk
// and the final estimate with its standard error.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/perplexity.h"
#include "tools/commands.h"
#include "tools/common_options.h"
#include "tools/fail.h"

namespace tern::tools {
namespace {

constexpr const char* kCmd = "perplexity";
constexpr int kDefaultCtx = 512;

struct PerplexityCliOptions {
    ModelFlags model;
    std::optional<std::string> text_file;
    int chunks = -1;
};

void run_perplexity(const PerplexityCliOptions& o, const CLI::App& cmd) {
    reject_extras(kCmd, cmd);
    if (!o.text_file) fail(kCmd, "no text: give the file to score with -f FILE");
    if (o.chunks == 0 || o.chunks < -1) fail(kCmd, "--chunks must be -1 (all) or positive (got " + std::to_string(o.chunks) + ")");
    const int n_ctx = o.model.ctx > 0 ? o.model.ctx : kDefaultCtx;
    if (o.model.ctx < 0) fail(kCmd, "--ctx must be positive (got " + std::to_string(o.model.ctx) + ")");
    if (n_ctx < 4) fail(kCmd, "--ctx must be at least 4 for perplexity (got " + std::to_string(n_ctx) + ")");

    std::ifstream in(*o.text_file, std::ios::binary);
    if (!in) fail(kCmd, "cannot open text file " + *o.text_file);
    std::ostringstream ss;
    ss << in.rdbuf();
    if (in.bad()) fail(kCmd, "cannot read text file " + *o.text_file);
    const std::string text = ss.str();

    const std::string path = resolve_model_path(kCmd, o.model.model);
    std::unique_ptr<runtime::Engine> engine = open_engine(kCmd, path, o.model, n_ctx);
    if (o.model.verbose) print_model_summary(*engine, path);

    // Special-token text in a corpus is ordinary text.
    const std::vector<int32_t> tokens = tokenize_prompt(engine->tokenizer(), text, false);
    if (int64_t(tokens.size()) < runtime::perplexity_min_tokens(n_ctx))
        fail(kCmd, *o.text_file + " has " + std::to_string(tokens.size()) + " tokens; a context of " +
                       std::to_string(n_ctx) + " needs at least " +
                       std::to_string(runtime::perplexity_min_tokens(n_ctx)) +
                       " (two chunks): use a longer text or a smaller --ctx");
    const int all_chunks = int(tokens.size() / size_t(n_ctx));
    const int n_chunks = o.chunks < 0 ? all_chunks : std::min(o.chunks, all_chunks);
    std::fprintf(stderr, "perplexity: %zu tokens, %d chunks of %d (scoring the last %d positions of each), batch %d\n",
                 tokens.size(), n_chunks, n_ctx, n_ctx - 1 - n_ctx / 2, engine->forward().max_tokens());

    runtime::PerplexityOptions popt;
    popt.n_ctx = n_ctx;
    popt.max_chunks = o.chunks;
    auto on_chunk = [](const runtime::PerplexityProgress& p) {
        if (p.chunk == 1)
            std::fprintf(stderr, "perplexity: %.2f s per chunk, about %.0f s in all\n", p.chunk_ms / 1000.0,
                         p.chunk_ms / 1000.0 * p.n_chunks);
        std::printf("[%d] %.4f\n", p.chunk, p.ppl);
        std::fflush(stdout);
    };
    auto result = runtime::compute_perplexity(*engine, tokens, popt, on_chunk);
    if (!result.ok()) fail(kCmd, result.error().message);
    std::printf("Final estimate: PPL = %.4f +/- %.5f\n", result->ppl, result->ppl_error);
    std::fprintf(stderr, "perplexity: %lld tokens scored in %d chunks, %.2f s (%.1f tokens/s evaluated)\n",
                 static_cast<long long>(result->n_scored), result->n_chunks, result->total_ms / 1000.0,
                 result->total_ms > 0 ? double(result->n_chunks) * n_ctx * 1000.0 / result->total_ms : 0.0);
}

}  // namespace

void add_perplexity_command(CLI::App& app) {
    auto o = std::make_shared<PerplexityCliOptions>();
    CLI::App* cmd = app.add_subcommand("perplexity", "Perplexity of the model over a text file, chunked as GGUF tools do");
    add_model_flags(cmd, kCmd, o->model, "Tokens per chunk (default 512)");
    cmd->add_option("-f,--file", o->text_file, "Text file to score")->type_name("FILE");
    add_int_option(cmd, kCmd, "--chunks", o->chunks, "Score at most this many chunks (default -1: all)");
    cmd->callback([o, cmd] { run_perplexity(*o, *cmd); });
}

}  // namespace tern::tools
