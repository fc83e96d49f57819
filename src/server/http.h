// An event-driven HTTP/1.1 server (Boost.Asio, requests parsed by
// Boost.Beast): a few I/O threads serve every connection, so a client that
// sends its request slowly, never finishes it, or reads its stream slowly
// holds no thread and delays nobody. Deadlines bound each phase (headers,
// body, each write); a connection past the limit is answered 503 and closed.
// Handlers run on an I/O thread and must not block: they answer through a
// Reply, from any thread, whenever the answer is ready (a whole response, or
// a chunked stream written piece by piece).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/result.h"

namespace tern::server::http {

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Request {
    std::string method;  // "GET", "POST", ...
    std::string target;  // as sent: "/v1/models?x=1"
    std::string path;    // target without its query
    Headers headers;     // as sent
    std::string body;
    // The first header of that name (case-insensitive), or "".
    std::string header(std::string_view name) const;
};

struct Response {
    int status = 200;
    std::string content_type = "application/json";
    std::string body;
    Headers headers;  // besides Content-Type, Content-Length and Connection
};

// The answer to one request. Exactly one of send() or start_stream() is
// called, once; after start_stream(), write() any number of times, then
// end(). Every call may come from any thread and never blocks.
class Reply {
public:
    virtual ~Reply() = default;
    virtual void send(Response response) = 0;
    // A chunked response; its body is what write() hands over.
    virtual void start_stream(int status, std::string content_type, Headers headers) = 0;
    // false once the client is gone (or so far behind that it was dropped):
    // the caller should stop producing.
    virtual bool write(std::string data) = 0;
    virtual void end() = 0;
    // Called once, from an I/O thread, if the connection closes before the
    // answer is complete (a client that went away, a deadline, stop()).
    // Set before answering; a Reply whose connection is already gone calls it at once.
    virtual void on_abandon(std::function<void()> callback) = 0;
};

using Handler = std::function<void(const Request&, std::shared_ptr<Reply>)>;

// Bodies for the errors the HTTP layer answers itself (400 unreadable
// request, 413 body too large, 431 headers too large, 503 too many
// connections; a client past a deadline is closed unanswered): status and
// message in, response out.
using ErrorResponder = std::function<Response(int status, const std::string& message)>;

struct Limits {
    size_t max_body = 1 << 20;          // bytes; larger bodies get 413
    size_t max_header = 32 << 10;       // bytes of request line and headers; more gets 431
    int header_timeout_s = 10;          // from a connection's opening to its first request's last header
    int body_timeout_s = 600;           // for the rest of the body
    int write_timeout_s = 600;          // for each write to the client
    int keep_alive_s = 5;               // from an answer to the next request's last header
    int max_connections = 1000;         // open at once; more are answered 503 and closed
    size_t max_backlog = 64 << 20;      // bytes queued for a client that reads slower than its stream grows
    int io_threads = 2;
};

class HttpServer {
public:
    HttpServer(Limits limits, Handler handler, ErrorResponder errors);
    ~HttpServer();
    HttpServer(const HttpServer&) = delete;
    HttpServer& operator=(const HttpServer&) = delete;

    // Binds and listens; port 0 picks a free one (see port()). Fails naming the address.
    Status bind(const std::string& host, int port);
    int port() const;
    // Serves on limits.io_threads threads (this one among them) until stop().
    // Returns at once if stop() came first.
    void run();
    // Closes the listener and every connection, and makes run() return. Safe
    // at any moment, from any thread, more than once.
    void stop();
    // Connections open now.
    int connections() const;

    struct Impl;  // http.cpp's

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace tern::server::http
