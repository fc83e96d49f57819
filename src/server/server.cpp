#include "server/server.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/request.h"

namespace tern::server {
namespace {

using nlohmann::json;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    res.set_content(error_body(e), "application/json");
}

// What the scheduler thread hands to the HTTP thread of one request.
struct Channel {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::string> pieces;
    bool done = false;
    std::string error;  // set with done when the request failed
    runtime::GenerateResult result;
};

runtime::RequestCallbacks callbacks_for(const std::shared_ptr<Channel>& ch) {
    runtime::RequestCallbacks cb;
    cb.on_text = [ch](std::string_view piece) {
        std::lock_guard<std::mutex> lock(ch->mu);
        ch->pieces.emplace_back(piece);
        ch->cv.notify_one();
    };
    cb.on_done = [ch](const runtime::GenerateResult& r) {
        std::lock_guard<std::mutex> lock(ch->mu);
        ch->result = r;
        ch->done = true;
        ch->cv.notify_one();
    };
    cb.on_error = [ch](const std::string& message) {
        std::lock_guard<std::mutex> lock(ch->mu);
        ch->error = message.empty() ? "generation failed" : message;
        ch->done = true;
        ch->cv.notify_one();
    };
    return cb;
}

const char* finish_name(runtime::FinishReason f) {
    return f == runtime::FinishReason::Length ? "length" : "stop";
}

json usage_json(const runtime::GenerateResult& r) {
    return {{"prompt_tokens", r.n_prompt_total},
            {"completion_tokens", r.n_generated},
            {"total_tokens", r.n_prompt_total + r.n_generated}};
}

json timings_json(const runtime::GenerateResult& r) {
    return {{"prompt_n", r.n_prompt},         {"prompt_ms", r.prompt_ms},
            {"prompt_per_second", r.prompt_tps()}, {"predicted_n", r.n_generated},
            {"predicted_ms", r.generate_ms},  {"predicted_per_second", r.generate_tps()}};
}

int64_t unix_now() {
    return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
}

// Known routes keep their name in the metrics; anything else is "other".
std::string metric_endpoint(const std::string& path) {
    for (const char* p : {"/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/"})
        if (path == p) return path;
    return "other";
}

}  // namespace

Server::Server(ServerOptions options) : options_(std::move(options)), http_(std::make_unique<httplib::Server>()) {
    const size_t n_threads = size_t(std::max(2, options_.http_threads));
    http_->new_task_queue = [n_threads] { return new httplib::ThreadPool(n_threads); };
    http_->set_read_timeout(options_.timeout_s, 0);
    http_->set_write_timeout(options_.timeout_s, 0);
    http_->set_keep_alive_timeout(2);
    http_->set_payload_max_length(options_.max_body);
    install_routes();
}

Server::~Server() = default;

Status Server::bind() {
    if (options_.port == 0) {
        port_ = http_->bind_to_any_port(options_.host);
        if (port_ <= 0) return Error{"cannot bind to " + options_.host + " (any port)"};
    } else {
        if (!http_->bind_to_port(options_.host, options_.port))
            return Error{"cannot bind to " + options_.host + ":" + std::to_string(options_.port) +
                         " (in use, or not an address of this machine)"};
        port_ = options_.port;
    }
    return {};
}

void Server::run() {
    run_started_.store(true);
    if (!stopping_.load()) http_->listen_after_bind();
    run_ended_.store(true);
}

void Server::attach(runtime::Engine& engine, runtime::Scheduler& scheduler, PromptBuilder prompts,
                    std::string model_name) {
    engine_ = &engine;
    scheduler_ = &scheduler;
    prompts_ = std::move(prompts);
    model_name_ = std::move(model_name);
    ready_.store(true);
}

void Server::stop() {
    stopping_.store(true);
    if (scheduler_) scheduler_->shutdown();
    // Give open streams a moment to write the error event the shutdown produced.
    for (int i = 0; i < 50 && open_streams_.load() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    http_->stop();
    // The HTTP library drops a stop that arrives before its accept loop has
    // begun, so repeat it until run() has returned. (run() checks stopping_
    // after marking itself started: either it sees the flag, or this loop sees
    // it started.)
    while (run_started_.load() && !run_ended_.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        if (!run_ended_.load()) http_->stop();
    }
}

void Server::install_routes() {
    httplib::Server& s = *http_;
    s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        if (options_.api_key.empty() || req.path == "/health" || req.path == "/") return httplib::Server::HandlerResponse::Unhandled;
        const std::string auth = req.get_header_value("Authorization");
        if (auth != "Bearer " + options_.api_key) {
            send_error(res, ApiError{401, auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'"
                                                       : "invalid API key",
                                     "authentication_error", "", "invalid_api_key"});
            return httplib::Server::HandlerResponse::Handled;
        }
        return httplib::Server::HandlerResponse::Unhandled;
    });
    // Statuses httplib sets itself (404, 413, 400 on unreadable requests) get an OpenAI error body.
    s.set_error_handler([max_body = options_.max_body](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        ApiError e{res.status, "request failed", "invalid_request_error", "", ""};
        if (res.status == 404) e = {404, "no route " + req.method + " " + req.path, "invalid_request_error", "", "not_found"};
        if (res.status == 413) e = {413, "the request body is larger than the limit of " + std::to_string(max_body) + " bytes",
                                    "invalid_request_error", "", "payload_too_large"};
        if (res.status >= 500) e.type = "server_error";
        res.set_content(error_body(e), "application/json");
    });
    // Counted when the status is final and before the response is written, so a
    // client that has read a response finds it in /metrics (httplib's logger
    // runs only after the write).
    s.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
        std::lock_guard<std::mutex> lock(metrics_mu_);
        ++requests_[{metric_endpoint(req.path), res.status}];
    });

    s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
        if (ready_.load() && !stopping_.load()) {
            res.set_content(R"({"status":"ok"})", "application/json");
        } else {
            res.status = 503;
            res.set_content(stopping_.load() ? R"({"status":"stopping"})" : R"({"status":"loading"})",
                            "application/json");
        }
    });
    s.Get("/", [](const httplib::Request&, httplib::Response& res) {
        res.set_content(std::string(chat_page_html()), "text/html; charset=utf-8");
    });
    s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
        res.set_content(metrics_text(), "text/plain; version=0.0.4");
    });
    s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
        if (!ready_.load()) return send_error(res, ApiError{503, "the model is loading", "server_error", "", "loading"});
        json m = {{"id", model_name_}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "tern"},
                  {"meta", {{"n_ctx", scheduler_->n_ctx()}, {"n_vocab", engine_->n_vocab()},
                            {"n_slots", scheduler_->n_slots()}}}};
        res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    s.Post("/v1/chat/completions",
           [this](const httplib::Request& req, httplib::Response& res) { handle_generate(true, req, res); });
    s.Post("/v1/completions",
           [this](const httplib::Request& req, httplib::Response& res) { handle_generate(false, req, res); });
}

void Server::handle_generate(bool chat, const httplib::Request& req, httplib::Response& res) {
    if (stopping_.load()) return send_error(res, ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"});
    if (!ready_.load()) return send_error(res, ApiError{503, "the model is loading", "server_error", "", "loading"});

    static thread_local std::mt19937_64 seed_gen{std::random_device{}()};
    ParseOutcome parsed = parse_request(chat ? Endpoint::Chat : Endpoint::Completion, req.body, seed_gen());
    if (!parsed.request) return send_error(res, parsed.error);
    const ParsedRequest& pr = *parsed.request;

    runtime::GenerationRequest g;
    if (chat) {
        auto tokens = prompts_.chat(pr.messages);
        if (!tokens.ok()) return send_error(res, ApiError{400, tokens.error().message, "invalid_request_error", "messages", "invalid_value"});
        g.prompt = std::move(*tokens);
    } else {
        g.prompt = prompts_.completion(pr.prompt);
    }
    const int n_ctx = scheduler_->n_ctx();
    if (int64_t(g.prompt.size()) >= n_ctx)
        return send_error(res, ApiError{400,
                                        "the prompt has " + std::to_string(g.prompt.size()) +
                                            " tokens and does not fit the context of " + std::to_string(n_ctx) +
                                            " tokens per sequence",
                                        "invalid_request_error", chat ? "messages" : "prompt",
                                        "context_length_exceeded"});
    g.options.sampling = pr.sampling;
    g.options.stop = pr.stop;
    if (chat)
        for (const std::string& s : prompts_.chat_stops) g.options.stop.push_back(s);
    // Capped by the room the context leaves after the prompt.
    const int room = n_ctx - int(g.prompt.size());
    g.options.max_tokens = std::min(pr.max_tokens.value_or(options_.default_max_tokens), room);

    auto ch = std::make_shared<Channel>();
    g.callbacks = callbacks_for(ch);
    std::shared_ptr<std::atomic<bool>> cancelled = g.cancelled;
    const runtime::SubmitResult sub = scheduler_->submit(std::move(g));
    switch (sub.admission) {
        case runtime::Admission::Accepted: break;
        case runtime::Admission::QueueFull: return send_error(res, ApiError{503, sub.message, "server_error", "", "queue_full"});
        case runtime::Admission::ShuttingDown: return send_error(res, ApiError{503, sub.message, "server_error", "", "shutting_down"});
        case runtime::Admission::Invalid: return send_error(res, ApiError{400, sub.message, "invalid_request_error", "", "invalid_value"});
    }

    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_.fetch_add(1));
    const int64_t created = unix_now();
    const std::string model = pr.model.empty() ? model_name_ : pr.model;
    const char* object = chat ? "chat.completion" : "text_completion";

    if (!pr.stream) {
        std::unique_lock<std::mutex> lock(ch->mu);
        ch->cv.wait(lock, [&] { return ch->done; });
        if (!ch->error.empty()) return send_error(res, ApiError{500, ch->error, "server_error", "", ""});
        const runtime::GenerateResult& r = ch->result;
        json choice = {{"index", 0}, {"finish_reason", finish_name(r.finish)}};
        if (chat)
            choice["message"] = {{"role", "assistant"}, {"content", r.text}};
        else
            choice["text"] = r.text, choice["logprobs"] = nullptr;
        json body = {{"id", id},         {"object", object},
                     {"created", created}, {"model", model},
                     {"choices", json::array({choice})}, {"usage", usage_json(r)},
                     {"timings", timings_json(r)}};
        res.set_content(dump(body), "application/json");
        return;
    }

    // Streaming: server-sent events, one chunk per piece of text.
    const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
    auto chunk = [=](const json& delta_or_text, const json& finish) {
        json choice = {{"index", 0}, {"finish_reason", finish}};
        if (chat)
            choice["delta"] = delta_or_text;
        else
            choice["text"] = delta_or_text, choice["logprobs"] = nullptr;
        json j = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                  {"choices", json::array({choice})}};
        if (pr.include_usage) j["usage"] = nullptr;
        return "data: " + dump(j) + "\n\n";
    };
    const bool include_usage = pr.include_usage;
    auto first = std::make_shared<bool>(true);
    open_streams_.fetch_add(1);
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [=, this](size_t, httplib::DataSink& sink) {
            auto write = [&](const std::string& s) { return sink.write(s.data(), s.size()); };
            if (*first) {
                *first = false;
                if (chat && !write(chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr))) return false;
            }
            std::deque<std::string> pieces;
            bool done = false;
            std::string error;
            runtime::GenerateResult result;
            {
                std::unique_lock<std::mutex> lock(ch->mu);
                ch->cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return ch->done || !ch->pieces.empty(); });
                pieces.swap(ch->pieces);
                done = ch->done;
                if (done) error = ch->error, result = ch->result;
            }
            if (!sink.is_writable()) return false;  // the client went away; the releaser cancels
            std::string out;
            for (const std::string& p : pieces) out += chunk(chat ? json{{"content", p}} : json(p), nullptr);
            if (done) {
                if (!error.empty()) {
                    out += "data: " + error_body(ApiError{500, error, "server_error", "", ""}) + "\n\n";
                } else {
                    out += chunk(chat ? json::object() : json(""), finish_name(result.finish));
                    if (include_usage) {
                        json u = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                                  {"choices", json::array()}, {"usage", usage_json(result)},
                                  {"timings", timings_json(result)}};
                        out += "data: " + dump(u) + "\n\n";
                    }
                }
                out += "data: [DONE]\n\n";
            }
            if (!out.empty() && !write(out)) return false;
            if (done) sink.done();
            return true;
        },
        [this, cancelled](bool) {
            // Finished or not, nothing reads this request any more.
            cancelled->store(true);
            open_streams_.fetch_sub(1);
        });
}

std::string Server::metrics_text() {
    std::string out;
    auto line = [&out](const std::string& s) { out += s + "\n"; };
    line("# HELP tern_requests_total HTTP requests answered, by endpoint and status.");
    line("# TYPE tern_requests_total counter");
    {
        std::lock_guard<std::mutex> lock(metrics_mu_);
        for (const auto& [key, n] : requests_)
            line("tern_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
                 std::to_string(n));
    }
    runtime::SchedulerStats st;
    if (ready_.load()) st = scheduler_->stats();
    auto metric = [&](const char* name, const char* type, const char* help, double v) {
        line(std::string("# HELP ") + name + " " + help);
        line(std::string("# TYPE ") + name + " " + type);
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.6g", v);
        line(std::string(name) + " " + buf);
    };
    metric("tern_prompt_tokens_total", "counter", "Prompt tokens evaluated.", double(st.prompt_tokens));
    metric("tern_generated_tokens_total", "counter", "Tokens generated.", double(st.generated_tokens));
    metric("tern_queue_depth", "gauge", "Requests waiting for a sequence slot.", st.queue_depth);
    metric("tern_active_sequences", "gauge", "Sequences being prefilled or decoded.", st.active_sequences);
    metric("tern_prompt_tokens_per_second", "gauge", "Prompt tokens per second of per-request prefill time.",
           st.prompt_seconds > 0 ? double(st.prompt_tokens) / st.prompt_seconds : 0.0);
    metric("tern_generation_tokens_per_second", "gauge", "Generated tokens per second of per-request decode time.",
           st.generate_seconds > 0 ? double(st.generated_tokens) / st.generate_seconds : 0.0);
    metric("tern_forward_steps_total", "counter", "Batched forward calls.", double(st.steps));
    return out;
}

}  // namespace tern::server
