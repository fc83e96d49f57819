// `tern serve -m MODEL`: an OpenAI-compatible HTTP server with continuous
// batching over --parallel sequences. It listens first (answering 503 while
// the model loads), then serves until SIGINT or SIGTERM, when it refuses new
// requests, ends in-flight streams with an error event and exits 0.
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "runtime/scheduler.h"
#include "server/server.h"
#include "text/reasoning.h"
#include "tools/commands.h"
#include "tools/common_options.h"
#include "tools/fail.h"

namespace tern::tools {
namespace {

constexpr const char* kCmd = "serve";

struct ServeOptions {
    ModelFlags model;
    server::ServerOptions http;
    int parallel = 4;
    int kv_tokens = 0;
    int max_queue = 64;
    int max_body = 1 << 20;
    float itl_stretch = 0;
    bool no_warmup = false;
};

void run_serve(const ServeOptions& o, const CLI::App& cmd) {
    reject_extras(kCmd, cmd);
    if (o.parallel < 1 || o.parallel > 256) fail(kCmd, "--parallel must be between 1 and 256 (got " + std::to_string(o.parallel) + ")");
    if (o.kv_tokens < 0) fail(kCmd, "--kv-tokens must be 0 (automatic) or more (got " + std::to_string(o.kv_tokens) + ")");
    if (o.max_queue < 0) fail(kCmd, "--max-queue must be 0 or more (got " + std::to_string(o.max_queue) + ")");
    if (!(o.itl_stretch == 0 || (o.itl_stretch > 1 && o.itl_stretch <= 100)))
        fail(kCmd, "--itl-stretch must be 0 (no cap) or above 1 and at most 100 (got " + std::to_string(o.itl_stretch) + ")");
    if (o.max_body < 1) fail(kCmd, "--max-body must be at least 1 byte (got " + std::to_string(o.max_body) + ")");
    if (o.http.port < 0 || o.http.port > 65535) fail(kCmd, "--port must be between 0 and 65535 (got " + std::to_string(o.http.port) + ")");
    if (o.http.timeout_s < 1) fail(kCmd, "--timeout must be at least 1 second (got " + std::to_string(o.http.timeout_s) + ")");
    if (o.http.http_threads < 1 || o.http.http_threads > 64)
        fail(kCmd, "--http-threads must be between 1 and 64 (got " + std::to_string(o.http.http_threads) + ")");
    if (o.http.max_connections < 1)
        fail(kCmd, "--max-connections must be at least 1 (got " + std::to_string(o.http.max_connections) + ")");
    if (o.http.header_timeout_s < 1)
        fail(kCmd, "--header-timeout must be at least 1 second (got " + std::to_string(o.http.header_timeout_s) + ")");
    if (o.model.threads < 0) fail(kCmd, "--threads must be 0 (all cores) or more");
    if (o.model.ctx < 0) fail(kCmd, "--ctx must be 0 (the model's default) or more");
    if (o.model.gpu < 0) fail(kCmd, "--gpu must be 0 or more (got " + std::to_string(o.model.gpu) + ")");
    if (o.model.tp < 1 || o.model.tp > 64)
        fail(kCmd, "--tp must be between 1 and 64 (got " + std::to_string(o.model.tp) + ")");
    if (o.model.batch < o.parallel) fail(kCmd, "--batch must be at least --parallel (every sequence needs a token per step)");
    const std::string path = resolve_model_path(kCmd, o.model.model);

    // Signals are taken by one thread with sigwait; every thread started
    // from here on inherits the blocked mask.
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    // A client that hangs up mid-response must cost an EPIPE, not the process.
    signal(SIGPIPE, SIG_IGN);

    server::ServerOptions http = o.http;
    http.max_body = size_t(o.max_body);
    server::Server srv(http);
    if (Status s = srv.bind(); !s.ok()) fail(kCmd, s.message());
    std::fprintf(stderr, "tern serve: listening on http://%s:%d\n", http.host.c_str(), srv.port());
    std::thread http_thread([&srv] { srv.run(); });

    std::mutex stop_mu;
    bool stop_requested = false;
    std::thread signal_thread([&] {
        int sig = 0;
        sigwait(&sigs, &sig);
        {
            std::lock_guard<std::mutex> lock(stop_mu);
            stop_requested = true;
        }
        srv.stop();
    });
    auto finish = [&] {
        http_thread.join();
        {
            std::lock_guard<std::mutex> lock(stop_mu);
            if (!stop_requested) kill(getpid(), SIGTERM);  // the listener ended on its own: wake the signal thread
        }
        signal_thread.join();
    };

    runtime::EngineOptions eo;
    eo.backend = o.model.backend;
    eo.gpu = o.model.gpu;
    eo.tp = o.model.tp;
    eo.load_progress = load_progress_bar();
    eo.threads = o.model.threads;
    eo.n_ctx = o.model.ctx;
    eo.n_slots = o.parallel;
    eo.kv_tokens = o.kv_tokens > 0 ? o.kv_tokens : runtime::kKvTokensFit;
    eo.max_batch = o.model.batch;
    auto opened = runtime::Engine::open(path, eo);
    if (!opened.ok()) {
        srv.stop();
        finish();
        fail(kCmd, "cannot load " + path + ": " + opened.error().message);
    }
    std::unique_ptr<runtime::Engine> engine = std::move(*opened);
    if (o.model.verbose) print_model_summary(*engine, path);

    const text::ChatFormat format = chat_format_of(kCmd, *engine);
    server::PromptBuilder prompts;
    const text::Tokenizer tok = engine->tokenizer();
    prompts.chat = [tok, format](const text::ChatRequest& chat) -> Result<server::PromptBuilder::Chat> {
        auto p = tokenize_chat(tok, format, chat);
        if (!p.ok()) return p.error();
        return server::PromptBuilder::Chat{std::move(p->tokens), text::prompt_opens_reasoning(p->text)};
    };
    // Completion prompts are plain text: text spelling a control token stays text.
    prompts.completion = [tok](std::string_view prompt) { return tokenize_prompt(tok, prompt, false); };
    prompts.chat_stops = format.stop_strings();
    prompts.tool_format = format.uses_template() ? server::tool_format_of(engine->chat_template()) : server::ToolFormat::Generic;

    runtime::SchedulerOptions so;
    so.max_queue = o.max_queue;
    so.itl_stretch = o.itl_stretch;
    so.warm_up_tokens = o.no_warmup ? 0 : engine->forward().graph_tokens();
    runtime::Scheduler scheduler(*engine, so);
    if (!scheduler.warm_up_status().ok())
        std::fprintf(stderr, "tern serve: %s (serving without it)\n", scheduler.warm_up_status().message().c_str());
    else if (const runtime::SchedulerStats st = scheduler.stats(); st.warm_up_tokens > 0)
        std::fprintf(stderr, "tern serve: steps of 1-%d tokens wanting logits captured as graphs in %.2f s\n",
                     st.warm_up_tokens, st.warm_up_seconds);
    {
        std::lock_guard<std::mutex> lock(stop_mu);
        if (!stop_requested)
            srv.attach(*engine, scheduler, std::move(prompts), std::filesystem::path(path).stem().string());
    }
    const std::string ranks = engine->tp() > 1 ? ", tensor parallel over " + std::to_string(engine->tp()) + " ranks" : "";
    const int64_t kv_tokens = int64_t(engine->forward().kv_pool_pages()) * engine->forward().kv_page_size();
    std::fprintf(stderr, "tern serve: model loaded on %s (%d sequences of up to %d tokens, KV memory for %lld tokens%s)\n",
                 backend_display_name(*engine).c_str(), o.parallel, engine->n_ctx(), static_cast<long long>(kv_tokens),
                 ranks.c_str());
    finish();
    scheduler.shutdown();
    std::fprintf(stderr, "tern serve: stopped\n");
}

}  // namespace

void add_serve_command(CLI::App& app) {
    auto o = std::make_shared<ServeOptions>();
    CLI::App* cmd = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API with a chat page");
    add_model_flags(cmd, kCmd, o->model, "Context size per sequence in tokens (default 0: the model's, at most 4096)");
    cmd->add_option("--host", o->http.host, "Address to listen on (default 127.0.0.1)")->type_name("ADDR");
    add_int_option(cmd, kCmd, "--port", o->http.port, "Port to listen on; 0 = any free port (default 8080)");
    add_int_option(cmd, kCmd, "--parallel", o->parallel, "Sequences decoded at once, each with its own KV slot (default 4)");
    add_int_option(cmd, kCmd, "--kv-tokens", o->kv_tokens,
                   "KV memory for all sequences together, in tokens (at least --ctx); sequences take it as they grow, "
                   "share the pages of common prompt prefixes, and wait or pause when it is full (default 0: "
                   "--parallel x --ctx, or on a GPU as much of that as free memory holds)");
    cmd->add_option("--api-key", o->http.api_key, "Require 'Authorization: Bearer KEY' on the API (not on /health)")
        ->type_name("KEY");
    add_int_option(cmd, kCmd, "--max-queue", o->max_queue, "Requests waiting for a slot before 503 (default 64)");
    add_float_option(cmd, kCmd, "--itl-stretch", o->itl_stretch,
                     "While sequences decode, a step takes only the prompt tokens that keep it within this many "
                     "times what its decoding sequences alone take, learned from the steps' times, and at least 8; "
                     "longer prompts span steps (default 0: as many as --batch holds)");
    cmd->add_flag("--no-warmup", o->no_warmup,
                  "Start serving without first capturing the steps of 1 to 64 tokens as CUDA graphs; each shape "
                  "is then captured the second time it runs, milliseconds that land in some streams' gaps between "
                  "tokens");
    add_int_option(cmd, kCmd, "--max-body", o->max_body, "Largest request body in bytes (default 1048576)");
    add_int_option(cmd, kCmd, "--timeout", o->http.timeout_s,
                   "Seconds to receive a request body, and for each write to a client (default 600)");
    add_int_option(cmd, kCmd, "--header-timeout", o->http.header_timeout_s,
                   "Seconds for a new connection to send its request headers (default 10)");
    add_int_option(cmd, kCmd, "--max-connections", o->http.max_connections,
                   "Connections open at once; more are answered 503 (default 1000)");
    add_int_option(cmd, kCmd, "--http-threads", o->http.http_threads,
                   "Threads serving HTTP I/O for every connection (default 2)");
    add_int_option(cmd, kCmd, "--max-tokens", o->http.default_max_tokens, "Default max_tokens of a request (default 256)");
    cmd->callback([o, cmd] { run_serve(*o, *cmd); });
}

}  // namespace tern::tools
