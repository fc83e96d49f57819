// The HTTP front of the scheduler: an OpenAI-compatible API
// (/v1/chat/completions, /v1/completions, /v1/models), /health, Prometheus
// /metrics and a chat page at /, over the event-driven HTTP layer of http.h.
// A request is parsed and submitted on an I/O thread; its answer (a whole
// response, or a stream of server-sent events) is handed to the HTTP layer
// from the scheduler's callbacks, so neither side ever waits on the other or
// on a client. The server listens before the model is loaded and answers 503
// ("loading") until attach() hands it the engine.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "base/result.h"
#include "runtime/engine.h"
#include "runtime/scheduler.h"
#include "server/http.h"
#include "server/tool_calls.h"
#include "text/chat_format.h"


namespace tern::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;               // 0: any free port (see port())
    std::string api_key;           // empty: no authentication
    size_t max_body = 1 << 20;     // bytes; larger bodies get 413
    int http_threads = 2;          // I/O threads serving every connection
    int max_connections = 1000;    // open at once; more are answered 503
    int header_timeout_s = 10;     // to receive a request's headers
    int timeout_s = 600;           // to receive a body, and for each write
    int default_max_tokens = 256;
};

// How prompts become tokens for this model (the chat template lives with
// the caller, which knows the model's format).
struct PromptBuilder {
    struct Chat {
        std::vector<int32_t> tokens;
        bool opens_reasoning = false;  // the prompt ends inside a <think> section (text/reasoning.h)
    };
    std::function<Result<Chat>(const text::ChatRequest&)> chat;
    std::function<std::vector<int32_t>(std::string_view)> completion;
    std::vector<std::string> chat_stops;  // the template's end-of-turn strings
    ToolFormat tool_format = ToolFormat::Generic;  // how the model writes tool calls (tool_calls.h)
};

class Server {
public:
    explicit Server(ServerOptions options);
    ~Server();

    // Binds the socket; fails naming the address.
    Status bind();
    int port() const;
    // Serves until stop(); call from one thread. Returns at once if stop() came first.
    void run();
    // Makes the model available; /health turns "ok".
    void attach(runtime::Engine& engine, runtime::Scheduler& scheduler, PromptBuilder prompts,
                std::string model_name);
    // Refuses new requests, ends in-flight streams with an error event (the
    // scheduler's shutdown does that), then stops listening; when run() is
    // under way, returns only once it has. Safe at any moment, from any thread.
    void stop();

private:
    class SseStream;
    void route(const http::Request& req, std::shared_ptr<http::Reply> reply);
    void handle_generate(bool chat, const http::Request& req, std::shared_ptr<http::Reply> reply);
    void answer(const http::Request& req, http::Reply& reply, http::Response res);
    void count(const std::string& endpoint, int status);
    std::string metrics_text();
    // The vocabulary as grammars see it, built by the first request with one.
    std::shared_ptr<const runtime::GrammarVocab> grammar_vocab();

    ServerOptions options_;
    std::atomic<bool> ready_{false};
    std::atomic<bool> stopping_{false};
    std::atomic<bool> run_started_{false}, run_ended_{false};
    runtime::Engine* engine_ = nullptr;
    runtime::Scheduler* scheduler_ = nullptr;
    PromptBuilder prompts_;
    std::string model_name_;
    std::atomic<uint64_t> next_id_{1};
    std::mutex grammar_mu_;
    std::shared_ptr<const runtime::GrammarVocab> grammar_vocab_;
    std::mutex metrics_mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
    // Last: destroyed first, so no I/O thread outlives the members above.
    std::unique_ptr<http::HttpServer> http_;
};

// The chat page served at / (HTML with its CSS and JS inline).
std::string_view chat_page_html();

}  // namespace tern::server
