#include "server/server.h"

#include <chrono>
#include <cstdio>
#include <deque>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "server/json_value.h"
#include "server/piece_event.h"
#include "server/request.h"
#include "text/reasoning.h"

namespace tern::server {
namespace {

using nlohmann::json;

http::Response json_response(int status, std::string body) {
    http::Response r;
    r.status = status;
    r.body = std::move(body);
    return r;
}

http::Response error_response(const ApiError& e) { return json_response(e.status, error_body(e)); }

// OpenAI's tool_calls array: ids unique within the server's run.
json tool_calls_json(const ToolReply& tr, const std::string& response_id) {
    json calls = json::array();
    for (size_t i = 0; i < tr.calls.size(); ++i)
        calls.push_back({{"id", "call_" + response_id.substr(response_id.find('-') + 1) + "_" + std::to_string(i)},
                         {"type", "function"},
                         {"function", {{"name", tr.calls[i].name}, {"arguments", tr.calls[i].arguments}}}});
    return calls;
}

const char* finish_name(runtime::FinishReason f) {
    return f == runtime::FinishReason::Length ? "length" : "stop";
}

// prompt_tokens_details.cached_tokens: the prompt's tokens whose K/V came from
// kept pages (OpenAI's field for a reused prompt prefix).
json usage_json(const runtime::GenerateResult& r) {
    return {{"prompt_tokens", r.n_prompt_total},
            {"completion_tokens", r.n_generated},
            {"total_tokens", r.n_prompt_total + r.n_generated},
            {"prompt_tokens_details", {{"cached_tokens", r.n_prompt_cached}}}};
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

Server::Server(ServerOptions options) : options_(std::move(options)) {
    http::Limits limits;
    limits.max_body = options_.max_body;
    limits.header_timeout_s = options_.header_timeout_s;
    limits.body_timeout_s = options_.timeout_s;
    limits.write_timeout_s = options_.timeout_s;
    limits.max_connections = options_.max_connections;
    limits.io_threads = std::max(1, options_.http_threads);
    // Statuses the HTTP layer answers itself get an OpenAI error body, and are counted.
    auto errors = [this](int status, const std::string& message) {
        ApiError e{status, message, status >= 500 ? "server_error" : "invalid_request_error", "", ""};
        if (status == 413) e.code = "payload_too_large";
        if (status == 503) e.code = "too_many_connections";
        count("other", status);
        return error_response(e);
    };
    http_ = std::make_unique<http::HttpServer>(
        limits, [this](const http::Request& req, std::shared_ptr<http::Reply> reply) { route(req, std::move(reply)); },
        errors);
}

Server::~Server() { stop(); }

Status Server::bind() { return http_->bind(options_.host, options_.port); }

int Server::port() const { return http_->port(); }

void Server::run() {
    run_started_.store(true);
    if (!stopping_.load()) http_->run();
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
    if (stopping_.exchange(true)) return;
    // The shutdown fails every request: streams get their error event, which
    // the HTTP layer gets a moment to write before it stops.
    if (scheduler_) scheduler_->shutdown();
    http_->stop();
    while (run_started_.load() && !run_ended_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

std::shared_ptr<const runtime::GrammarVocab> Server::grammar_vocab() {
    std::lock_guard<std::mutex> lock(grammar_mu_);
    if (!grammar_vocab_) grammar_vocab_ = runtime::GrammarVocab::make(engine_->tokenizer());
    return grammar_vocab_;
}

void Server::count(const std::string& endpoint, int status) {
    std::lock_guard<std::mutex> lock(metrics_mu_);
    ++requests_[{endpoint, status}];
}

// Counted when the status is final and before the response is written, so a
// client that has read a response finds it in /metrics.
void Server::answer(const http::Request& req, http::Reply& reply, http::Response res) {
    count(metric_endpoint(req.path), res.status);
    reply.send(std::move(res));
}

void Server::route(const http::Request& req, std::shared_ptr<http::Reply> reply) {
    const bool get = req.method == "GET", post = req.method == "POST";
    if (!options_.api_key.empty() && req.path != "/health" && req.path != "/") {
        const std::string auth = req.header("Authorization");
        if (auth != "Bearer " + options_.api_key)
            return answer(req, *reply,
                          error_response(ApiError{401,
                                                  auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'"
                                                               : "invalid API key",
                                                  "authentication_error", "", "invalid_api_key"}));
    }
    if (get && req.path == "/health") {
        if (ready_.load() && !stopping_.load()) return answer(req, *reply, json_response(200, R"({"status":"ok"})"));
        return answer(req, *reply,
                      json_response(503, stopping_.load() ? R"({"status":"stopping"})" : R"({"status":"loading"})"));
    }
    if (get && req.path == "/") {
        http::Response r;
        r.content_type = "text/html; charset=utf-8";
        r.body = std::string(chat_page_html());
        return answer(req, *reply, std::move(r));
    }
    if (get && req.path == "/metrics") {
        http::Response r;
        r.content_type = "text/plain; version=0.0.4";
        count("/metrics", 200);  // this very request is in the text
        r.body = metrics_text();
        return reply->send(std::move(r));
    }
    if (get && req.path == "/v1/models") {
        if (!ready_.load())
            return answer(req, *reply, error_response(ApiError{503, "the model is loading", "server_error", "", "loading"}));
        json m = {{"id", model_name_}, {"object", "model"}, {"created", unix_now()}, {"owned_by", "tern"},
                  {"meta", {{"n_ctx", scheduler_->n_ctx()}, {"n_vocab", engine_->n_vocab()},
                            {"n_slots", scheduler_->n_slots()}}}};
        return answer(req, *reply, json_response(200, dump_json(json{{"object", "list"}, {"data", json::array({m})}})));
    }
    if (post && (req.path == "/v1/chat/completions" || req.path == "/v1/completions"))
        return handle_generate(req.path == "/v1/chat/completions", req, std::move(reply));
    answer(req, *reply,
           error_response(ApiError{404, "no route " + req.method + " " + req.path, "invalid_request_error", "",
                                   "not_found"}));
}

// What a streamed request's pieces go through: the scheduler's delivery
// thread calls push() from its callbacks, possibly before the HTTP side has started the
// stream (the submit races the first token), so pieces wait here until
// begin(); after that they go straight to the reply. A reply that reports its
// client gone cancels the request.
class Server::SseStream {
public:
    SseStream(std::shared_ptr<http::Reply> reply, std::shared_ptr<std::atomic<bool>> cancelled)
        : reply_(std::move(reply)), cancelled_(std::move(cancelled)) {}
    void push(std::string event, bool last) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!started_) {
            held_.push_back(std::move(event));
            ended_ = ended_ || last;
            return;
        }
        send(std::move(event), last);
    }
    void begin(std::string first_event) {
        std::lock_guard<std::mutex> lock(mu_);
        started_ = true;
        reply_->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
        if (!first_event.empty()) send(std::move(first_event), false);
        for (std::string& e : held_) send(std::move(e), false);
        held_.clear();
        if (ended_) reply_->end();
    }

private:
    void send(std::string event, bool last) {
        if (!reply_->write(std::move(event))) cancelled_->store(true);
        if (last) reply_->end();
    }
    std::mutex mu_;
    std::shared_ptr<http::Reply> reply_;
    std::shared_ptr<std::atomic<bool>> cancelled_;
    std::deque<std::string> held_;
    bool started_ = false, ended_ = false;
};

void Server::handle_generate(bool chat, const http::Request& req, std::shared_ptr<http::Reply> reply) {
    auto fail = [&](const ApiError& e) { answer(req, *reply, error_response(e)); };
    if (stopping_.load()) return fail(ApiError{503, "the server is shutting down", "server_error", "", "shutting_down"});
    if (!ready_.load()) return fail(ApiError{503, "the model is loading", "server_error", "", "loading"});

    static thread_local std::mt19937_64 seed_gen{std::random_device{}()};
    ParseOutcome parsed = parse_request(chat ? Endpoint::Chat : Endpoint::Completion, req.body, seed_gen());
    if (!parsed.request) return fail(parsed.error);
    ParsedRequest& pr = *parsed.request;

    runtime::GenerationRequest g;
    // Tools: the model's own format when its template has one, else the
    // generic one; a grammar where the reply must be a call (tool_calls.h).
    const bool tools = chat && pr.tools.active();
    const ToolFormat tool_format = prompts_.tool_format;
    std::shared_ptr<const runtime::Grammar> call_grammar;
    if (tools) {
        if (tool_format == ToolFormat::Generic) {
            const std::string prompt = generic_tool_prompt(pr.tools);
            auto& msgs = pr.chat.messages;
            if (!msgs.empty() && msgs.front().role == "system")
                msgs.front().content += "\n\n" + prompt;
            else
                msgs.insert(msgs.begin(), text::ChatMessage("system", prompt));
        } else if (auto v = json_to_value(pr.tools.tools_json)) {
            pr.chat.tools = std::move(*v);
        }
        auto gbnf = tool_grammar(tool_format, pr.tools);
        if (!gbnf.ok()) return fail(ApiError{400, gbnf.error().message, "invalid_request_error", "tools", "unsupported_schema"});
        if (!gbnf->empty()) {
            auto parsed_grammar = runtime::Grammar::parse(*gbnf);
            if (!parsed_grammar.ok())
                return fail(ApiError{400, parsed_grammar.error().message, "invalid_request_error", "tools", "invalid_value"});
            call_grammar = std::move(*parsed_grammar);
        }
    }
    const ToolRequest tool_request = pr.tools;
    // Chat replies' <think> sections go to reasoning_content, split as the text streams.
    std::shared_ptr<text::ReasoningSplitter> splitter;
    if (chat) {
        auto built = prompts_.chat(pr.chat);
        if (!built.ok()) return fail(ApiError{400, built.error().message, "invalid_request_error", "messages", "invalid_value"});
        g.prompt = std::move(built->tokens);
        if (pr.split_reasoning) splitter = std::make_shared<text::ReasoningSplitter>(built->opens_reasoning);
    } else {
        g.prompt = prompts_.completion(pr.prompt);
    }
    const int n_ctx = scheduler_->n_ctx();
    if (int64_t(g.prompt.size()) >= n_ctx)
        return fail(ApiError{400,
                             "the prompt has " + std::to_string(g.prompt.size()) +
                                 " tokens and does not fit the context of " + std::to_string(n_ctx) +
                                 " tokens per sequence",
                             "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded"});
    g.options.sampling = pr.sampling;
    g.options.stop = pr.stop;
    if (pr.grammar || call_grammar) {
        g.options.grammar = pr.grammar ? pr.grammar : call_grammar;
        g.options.grammar_vocab = grammar_vocab();
    }
    if (chat)
        for (const std::string& s : prompts_.chat_stops) g.options.stop.push_back(s);
    // Capped by the room the context leaves after the prompt.
    const int room = n_ctx - int(g.prompt.size());
    g.options.max_tokens = std::min(pr.max_tokens.value_or(options_.default_max_tokens), room);

    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_.fetch_add(1));
    const int64_t created = unix_now();
    const std::string model = pr.model.empty() ? model_name_ : pr.model;
    const char* object = chat ? "chat.completion" : "text_completion";
    const std::string endpoint = metric_endpoint(req.path);
    std::shared_ptr<std::atomic<bool>> cancelled = g.cancelled;
    // A client gone before its answer is complete stops its generation.
    reply->on_abandon([cancelled] { cancelled->store(true); });

    std::shared_ptr<SseStream> stream;
    std::string first_event;  // a chat stream opens with the assistant's role
    if (!pr.stream) {
        // Answered from the scheduler's delivery thread when the text is complete.
        auto parts = std::make_shared<text::ReasoningSplitter::Pieces>();
        auto take = [parts](const text::ReasoningSplitter::Pieces& p) {
            parts->reasoning += p.reasoning;
            parts->content += p.content;
        };
        g.callbacks.on_text = [=](std::string_view piece) {
            if (splitter) take(splitter->push(piece));
            else parts->content += piece;
        };
        g.callbacks.on_done = [=, this](const runtime::GenerateResult& r) {
            if (splitter) take(splitter->finish());
            json choice = {{"index", 0}, {"finish_reason", finish_name(r.finish)}};
            if (chat) {
                choice["message"] = {{"role", "assistant"}, {"content", parts->content}};
                if (!parts->reasoning.empty()) choice["message"]["reasoning_content"] = parts->reasoning;
                if (tools) {
                    // The content is what is not a call (for the generic format, the answer inside its JSON).
                    const ToolReply tr = parse_tool_reply(tool_format, parts->content, tool_request);
                    choice["message"]["content"] = tr.content;
                    if (!tr.calls.empty()) {
                        if (tr.content.empty()) choice["message"]["content"] = nullptr;
                        choice["message"]["tool_calls"] = tool_calls_json(tr, id);
                        choice["finish_reason"] = "tool_calls";
                    }
                }
            } else {
                choice["text"] = parts->content, choice["logprobs"] = nullptr;
            }
            json body = {{"id", id},         {"object", object},
                         {"created", created}, {"model", model},
                         {"choices", json::array({choice})}, {"usage", usage_json(r)},
                         {"timings", timings_json(r)}};
            count(endpoint, 200);
            reply->send(json_response(200, dump_json(body)));
        };
        g.callbacks.on_error = [=, this](const std::string& message) {
            count(endpoint, 500);
            reply->send(error_response(ApiError{500, message.empty() ? "generation failed" : message, "server_error", "", ""}));
        };
    } else {
        // Streaming: server-sent events, one chunk per piece of text.
        const std::string chunk_object = chat ? "chat.completion.chunk" : "text_completion";
        const bool include_usage = pr.include_usage;
        auto chunk = [=](const json& delta_or_text, const json& finish) {
            json choice = {{"index", 0}, {"finish_reason", finish}};
            if (chat)
                choice["delta"] = delta_or_text;
            else
                choice["text"] = delta_or_text, choice["logprobs"] = nullptr;
            json j = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                      {"choices", json::array({choice})}};
            if (include_usage) j["usage"] = nullptr;
            return "data: " + dump_json(j) + "\n\n";
        };
        stream = std::make_shared<SseStream>(reply, cancelled);
        if (chat) first_event = chunk(json{{"role", "assistant"}, {"content", ""}}, nullptr);
        // The events of a piece: a completion's text, a chat reply's content or reasoning.
        const PieceEvent text_event([&](const json& v) { return chunk(v, nullptr); });
        const PieceEvent content_event([&](const json& v) { return chunk(json{{"content", v}}, nullptr); });
        const PieceEvent reasoning_event([&](const json& v) { return chunk(json{{"reasoning_content", v}}, nullptr); });
        // The deltas of one piece: its reasoning, then its answer, each only when present.
        auto deltas = [=](const text::ReasoningSplitter::Pieces& p) {
            std::string out;
            if (!p.reasoning.empty()) out += reasoning_event(p.reasoning);
            if (!p.content.empty()) out += content_event(p.content);
            return out;
        };
        auto held = std::make_shared<std::string>();  // tools: the reply's content, parsed at its end
        g.callbacks.on_text = [=](std::string_view piece) {
            if (!chat) {
                stream->push(text_event(piece), false);
            } else if (tools) {
                const auto p = splitter ? splitter->push(piece) : text::ReasoningSplitter::Pieces{"", std::string(piece)};
                if (!p.reasoning.empty()) stream->push(reasoning_event(p.reasoning), false);
                *held += p.content;
            } else if (!splitter) {
                stream->push(content_event(piece), false);
            } else if (const std::string out = deltas(splitter->push(piece)); !out.empty()) {
                stream->push(out, false);
            }
        };
        g.callbacks.on_done = [=](const runtime::GenerateResult& result) {
            std::string out;
            std::string finish = finish_name(result.finish);
            if (tools) {
                // The whole reply is known now: its content, then one delta per call.
                text::ReasoningSplitter::Pieces rest = splitter ? splitter->finish() : text::ReasoningSplitter::Pieces{};
                if (!rest.reasoning.empty()) out += reasoning_event(rest.reasoning);
                *held += rest.content;
                const ToolReply tr = parse_tool_reply(tool_format, *held, tool_request);
                if (!tr.content.empty()) out += content_event(tr.content);
                const json calls = tool_calls_json(tr, id);
                for (size_t i = 0; i < calls.size(); ++i) {
                    json delta = calls[i];
                    delta["index"] = i;
                    out += chunk(json{{"tool_calls", json::array({delta})}}, nullptr);
                }
                if (!tr.calls.empty()) finish = "tool_calls";
            } else if (splitter) {
                out = deltas(splitter->finish());
            }
            out += chunk(chat ? json::object() : json(""), finish);
            if (include_usage) {
                json u = {{"id", id}, {"object", chunk_object}, {"created", created}, {"model", model},
                          {"choices", json::array()}, {"usage", usage_json(result)},
                          {"timings", timings_json(result)}};
                out += "data: " + dump_json(u) + "\n\n";
            }
            stream->push(out + "data: [DONE]\n\n", true);
        };
        g.callbacks.on_error = [=](const std::string& message) {
            const ApiError e{500, message.empty() ? "generation failed" : message, "server_error", "", ""};
            stream->push("data: " + error_body(e) + "\n\ndata: [DONE]\n\n", true);
        };
    }

    const runtime::SubmitResult sub = scheduler_->submit(std::move(g));
    if (sub.admission != runtime::Admission::Accepted) {
        switch (sub.admission) {
            case runtime::Admission::QueueFull: return fail(ApiError{503, sub.message, "server_error", "", "queue_full"});
            case runtime::Admission::ShuttingDown: return fail(ApiError{503, sub.message, "server_error", "", "shutting_down"});
            default: return fail(ApiError{400, sub.message, "invalid_request_error", "", "invalid_value"});
        }
    }
    if (stream) {
        count(endpoint, 200);
        stream->begin(std::move(first_event));
    }
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
        std::snprintf(buf, sizeof buf, "%.10g", v);  // counters grow: keep their last digits
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
    metric("tern_step_forward_seconds_total", "counter", "Seconds inside the steps' forward calls.", st.forward_seconds);
    metric("tern_step_forward_issue_seconds_total", "counter",
           "Of those, seconds before each forward call first waited for the device: issuing its work (on the CPU, "
           "all of it).",
           st.forward_issue_seconds);
    line("# HELP tern_step_host_seconds_total Seconds of the steps' own host work, by part: building the batch, "
         "drawing the next tokens, and their text (the callbacks run beside the next step).");
    line("# TYPE tern_step_host_seconds_total counter");
    const char* parts[runtime::SchedulerStats::kHostParts] = {"batch", "draw", "text"};
    for (int p = 0; p < runtime::SchedulerStats::kHostParts; ++p) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.10g", st.host_seconds[size_t(p)]);
        line(std::string("tern_step_host_seconds_total{part=\"") + parts[p] + "\"} " + buf);
    }
    metric("tern_kv_pages", "gauge", "Pages of the KV pool.", st.kv_pages);
    metric("tern_kv_page_tokens", "gauge", "Positions per KV page.", st.kv_page_size);
    metric("tern_kv_pages_held", "gauge", "KV pages held by running sequences.", st.kv_pages_held);
    metric("tern_kv_pages_kept", "gauge", "KV pages kept for their tokens (prompt prefixes), held or not.",
           st.kv_pages_kept);
    metric("tern_prefix_tokens_reused_total", "counter", "Prompt tokens whose K/V came from kept pages.",
           double(st.prefix_tokens_reused));
    metric("tern_graphs_captured_total", "counter",
           "Forward steps captured as CUDA graphs: at start by the warm-up, then each new shape met while serving.",
           double(st.graphs_captured));
    metric("tern_preemptions_total", "counter", "Sequences paused for want of KV pages (resumed later).",
           double(st.preemptions));
    // A Prometheus histogram: cumulative buckets by upper bound, a sum and a count, per kind of step.
    line("# HELP tern_step_seconds Wall time of whole scheduler steps (a decoding stream's gap between tokens), "
         "by what they carried.");
    line("# TYPE tern_step_seconds histogram");
    const char* kinds[runtime::SchedulerStats::kStepKinds] = {"decode", "decode_and_prompt", "prompt"};
    for (int k = 0; k < runtime::SchedulerStats::kStepKinds; ++k) {
        const runtime::SchedulerStats::StepTimes& t = st.step_times[size_t(k)];
        const std::string kind = std::string("kind=\"") + kinds[k] + "\"";
        uint64_t below = 0;
        char buf[96];
        for (size_t b = 0; b < runtime::SchedulerStats::kStepBounds.size(); ++b) {
            below += t.in_bucket[b];
            std::snprintf(buf, sizeof buf, "%g", runtime::SchedulerStats::kStepBounds[b]);
            line("tern_step_seconds_bucket{" + kind + ",le=\"" + buf + "\"} " + std::to_string(below));
        }
        line("tern_step_seconds_bucket{" + kind + ",le=\"+Inf\"} " + std::to_string(t.count));
        std::snprintf(buf, sizeof buf, "%.10g", t.seconds);
        line("tern_step_seconds_sum{" + kind + "} " + buf);
        line("tern_step_seconds_count{" + kind + "} " + std::to_string(t.count));
    }
    return out;
}

}  // namespace tern::server
