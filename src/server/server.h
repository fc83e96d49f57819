// The HTTP front of the scheduler: an OpenAI-compatible API
// (/v1/chat/completions, /v1/completions, /v1/models), /health, Prometheus
// /metrics and a chat page at /. HTTP threads parse requests, submit them to
// the scheduler and drain per-request channels; the scheduler never waits on
// a client. The server listens before the model is loaded and answers 503
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
#include "text/chat_template.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}

namespace tern::server {

struct ServerOptions {
    std::string host = "127.0.0.1";
    int port = 8080;               // 0: any free port (see port())
    std::string api_key;           // empty: no authentication
    size_t max_body = 1 << 20;     // bytes; larger bodies get 413
    int http_threads = 32;         // connections served at once
    int timeout_s = 600;           // socket read/write timeout
    int default_max_tokens = 256;
};

// How prompts become tokens for this model (the chat template lives with
// the caller, which knows the model's format).
struct PromptBuilder {
    std::function<Result<std::vector<int32_t>>(const std::vector<text::ChatMessage>&)> chat;
    std::function<std::vector<int32_t>(std::string_view)> completion;
    std::vector<std::string> chat_stops;  // the template's end-of-turn strings
};

class Server {
public:
    explicit Server(ServerOptions options);
    ~Server();

    // Binds the socket; fails naming the address.
    Status bind();
    int port() const { return port_; }
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
    void install_routes();
    void handle_generate(bool chat, const httplib::Request& req, httplib::Response& res);
    std::string metrics_text();

    ServerOptions options_;
    std::unique_ptr<httplib::Server> http_;
    int port_ = 0;
    std::atomic<bool> ready_{false};
    std::atomic<bool> stopping_{false};
    std::atomic<bool> run_started_{false}, run_ended_{false};
    std::atomic<int> open_streams_{0};
    runtime::Engine* engine_ = nullptr;
    runtime::Scheduler* scheduler_ = nullptr;
    PromptBuilder prompts_;
    std::string model_name_;
    std::atomic<uint64_t> next_id_{1};
    std::mutex metrics_mu_;
    std::map<std::pair<std::string, int>, uint64_t> requests_;  // (endpoint, status) -> count
};

// The chat page served at / (HTML with its CSS and JS inline).
std::string_view chat_page_html();

}  // namespace tern::server
