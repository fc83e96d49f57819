// The event-driven HTTP/1.1 server of http.h. Each connection runs on its own
// strand of one io_context served by a few threads: it reads a request under
// a deadline (Beast's parser enforces the header and body limits), hands it
// to the handler, and writes whatever the Reply queues, in order, one write at
// a time under a deadline. Reply calls from other threads are posted to the
// strand, so the scheduler never waits on a socket.
#include "server/http.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <thread>

namespace tern::server::http {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;

std::string Request::header(std::string_view name) const {
    auto same = [](std::string_view a, std::string_view b) {
        return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
                   return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
               });
    };
    for (const auto& [k, v] : headers)
        if (same(k, name)) return v;
    return {};
}

namespace {

const char* reason(int status) {
    switch (status) {
        case 200: return "OK";
        case 400: return "Bad Request";
        case 401: return "Unauthorized";
        case 404: return "Not Found";
        case 413: return "Payload Too Large";
        case 431: return "Request Header Fields Too Large";
        case 500: return "Internal Server Error";
        case 503: return "Service Unavailable";
        default: return "Status";
    }
}

// The status line and headers; a Content-Length for a whole body, or chunked.
std::string head_bytes(int status, const std::string& content_type, const Headers& headers,
                       std::optional<size_t> content_length, bool keep_alive) {
    std::string h = "HTTP/1.1 " + std::to_string(status) + " " + reason(status) + "\r\n";
    if (!content_type.empty()) h += "Content-Type: " + content_type + "\r\n";
    for (const auto& [k, v] : headers) h += k + ": " + v + "\r\n";
    if (content_length)
        h += "Content-Length: " + std::to_string(*content_length) + "\r\n";
    else
        h += "Transfer-Encoding: chunked\r\n";
    h += keep_alive ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    return h;
}

std::string chunk_bytes(const std::string& data) {
    char size[24];
    std::snprintf(size, sizeof size, "%zx\r\n", data.size());
    return size + data + "\r\n";
}

}  // namespace

struct HttpServer::Impl {
    Limits limits;
    Handler handler;
    ErrorResponder errors;
    std::atomic<int> n_connections{0};
    std::atomic<int> open_answers{0};  // requests read whose answer is not yet written
    std::atomic<bool> stopping{false};
    int port = 0;
    // Last, so they go first: the connections the io_context still holds are
    // destroyed with it, and they use the members above.
    asio::io_context ioc;
    tcp::acceptor acceptor{ioc};

    void accept();
};

namespace {

class Connection;

// A Reply bound to one request of one connection; calls for a request that
// is no longer the connection's current one are ignored.
class ConnReply final : public Reply {
public:
    ConnReply(std::shared_ptr<Connection> c, uint64_t seq) : conn_(std::move(c)), seq_(seq) {}
    void send(Response response) override;
    void start_stream(int status, std::string content_type, Headers headers) override;
    bool write(std::string data) override;
    void end() override;
    void on_abandon(std::function<void()> callback) override;

private:
    std::shared_ptr<Connection> conn_;
    uint64_t seq_;
};

class Connection : public std::enable_shared_from_this<Connection> {
public:
    Connection(tcp::socket socket, HttpServer::Impl& server) : stream_(std::move(socket)), server_(server) {
        server_.n_connections.fetch_add(1);
    }
    ~Connection() { server_.n_connections.fetch_sub(1); }

    void start() { read_request(server_.limits.header_timeout_s); }

    // Over the connection limit: one 503, then close.
    void reject(const std::string& message) {
        keep_alive_ = false;
        ++seq_;
        queue_response(server_.errors(503, message));
    }

    // ---- called through ConnReply, on any thread ----
    void post(std::function<void()> f) { asio::post(stream_.get_executor(), std::move(f)); }
    bool alive() const { return !dead_.load(); }
    bool reserve_backlog(size_t n) {
        if (backlog_.fetch_add(n) + n <= server_.limits.max_backlog) return true;
        backlog_.fetch_sub(n);
        return false;
    }

    // ---- on the strand ----
    void reply_send(uint64_t seq, Response r) {
        if (seq != seq_ || dead_ || replied_) return;
        queue_response(std::move(r));
    }
    void reply_start(uint64_t seq, int status, std::string content_type, Headers headers) {
        if (seq != seq_ || dead_ || replied_ || streaming_) return;
        streaming_ = true;
        enqueue(head_bytes(status, content_type, headers, std::nullopt, keep_alive_), false);
    }
    void reply_write(uint64_t seq, std::string data, size_t reserved) {
        if (seq != seq_ || dead_ || !streaming_ || replied_ || data.empty()) {
            backlog_.fetch_sub(reserved);
            return;
        }
        enqueue(chunk_bytes(data), true, reserved);
    }
    void reply_end(uint64_t seq) {
        if (seq != seq_ || dead_ || !streaming_ || replied_) return;
        replied_ = true;
        enqueue("0\r\n\r\n", false);
    }
    void reply_on_abandon(uint64_t seq, std::function<void()> cb) {
        if (seq != seq_) return;
        if (dead_) {
            if (!replied_) cb();
            return;
        }
        abandon_ = std::move(cb);
    }
    // Too far behind, or the server is stopping: close now.
    void drop() { close(); }
    uint64_t seq() const { return seq_; }

private:
    void read_request(int timeout_s) {
        parser_.emplace();
        parser_->header_limit(std::uint32_t(std::min<size_t>(server_.limits.max_header, UINT32_MAX)));
        parser_->body_limit(server_.limits.max_body);
        stream_.expires_after(std::chrono::seconds(timeout_s));
        bhttp::async_read_header(stream_, buffer_, *parser_,
                                 [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
    }

    void on_header(beast::error_code ec) {
        if (ec) return read_failed(ec);
        const auto& req = parser_->get();
        if (beast::iequals(req[bhttp::field::expect], "100-continue") && !parser_->is_done())
            enqueue("HTTP/1.1 100 Continue\r\n\r\n", false);
        if (parser_->is_done()) return on_request();
        stream_.expires_after(std::chrono::seconds(server_.limits.body_timeout_s));
        bhttp::async_read(stream_, buffer_, *parser_, [self = shared_from_this()](beast::error_code e, size_t) {
            if (e) return self->read_failed(e);
            self->on_request();
        });
    }

    // A read that ended without a request: quietly for a client that went
    // away or ran out of time (the stream closes the socket at a deadline),
    // else with the error the client earned.
    void read_failed(beast::error_code ec) {
        keep_alive_ = false;
        if (ec == bhttp::error::end_of_stream || ec == asio::error::eof || ec == asio::error::connection_reset ||
            ec == asio::error::operation_aborted || ec == beast::error::timeout || server_.stopping)
            return close();
        ++seq_;
        if (ec == bhttp::error::body_limit)
            return queue_response(server_.errors(413, "the request body is larger than the limit of " +
                                                          std::to_string(server_.limits.max_body) + " bytes"));
        if (ec == bhttp::error::header_limit)
            return queue_response(server_.errors(431, "the request headers are larger than the limit of " +
                                                          std::to_string(server_.limits.max_header) + " bytes"));
        queue_response(server_.errors(400, "unreadable HTTP request: " + ec.message()));
    }

    void on_request() {
        stream_.expires_never();
        auto msg = parser_->release();
        keep_alive_ = msg.keep_alive() && !server_.stopping;
        Request req;
        req.method = std::string(msg.method_string());
        req.target = std::string(msg.target());
        req.path = req.target.substr(0, req.target.find('?'));
        for (const auto& f : msg) req.headers.emplace_back(std::string(f.name_string()), std::string(f.value()));
        req.body = std::move(msg.body());
        ++seq_;
        replied_ = streaming_ = false;
        abandon_ = nullptr;
        answer_open_ = true;
        server_.open_answers.fetch_add(1);
        auto reply = std::make_shared<ConnReply>(shared_from_this(), seq_);
        try {
            server_.handler(req, reply);
        } catch (const std::exception& e) {
            reply_send(seq_, server_.errors(500, std::string("internal error: ") + e.what()));
        }
    }

    void queue_response(Response r) {
        replied_ = true;
        enqueue(head_bytes(r.status, r.content_type, r.headers, r.body.size(), keep_alive_) + r.body, false);
    }

    void enqueue(std::string bytes, bool counted, size_t reserved = 0) {
        if (!counted) {
            reserved = bytes.size();
            backlog_.fetch_add(reserved);
        }
        out_.push_back({std::move(bytes), reserved});
        pump();
    }

    void pump() {
        if (writing_ || out_.empty() || dead_) return;
        writing_ = true;
        stream_.expires_after(std::chrono::seconds(server_.limits.write_timeout_s));
        asio::async_write(stream_, asio::buffer(out_.front().bytes),
                          [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
    }

    void on_write(beast::error_code ec) {
        writing_ = false;
        backlog_.fetch_sub(out_.front().reserved);
        out_.pop_front();
        if (dead_) return;
        if (ec) return close();
        if (!out_.empty()) return pump();
        if (!replied_) {
            stream_.expires_never();  // streaming: the next piece comes when it comes
            return;
        }
        finish_answer();
        if (!keep_alive_ || server_.stopping) return close();
        read_request(server_.limits.keep_alive_s);
    }

    void finish_answer() {
        if (answer_open_) server_.open_answers.fetch_sub(1);
        answer_open_ = false;
    }

    void close() {
        if (dead_.exchange(true)) return;
        // Writes not yet started are dropped; one in flight completes with an error.
        while (out_.size() > (writing_ ? 1u : 0u)) {
            backlog_.fetch_sub(out_.back().reserved);
            out_.pop_back();
        }
        finish_answer();
        if (!replied_ && abandon_) {
            auto cb = std::move(abandon_);
            abandon_ = nullptr;
            cb();
        }
        beast::error_code ignored;
        stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
        stream_.socket().close(ignored);
    }

    struct Pending {
        std::string bytes;
        size_t reserved;  // bytes counted against the backlog
    };

    beast::tcp_stream stream_;
    HttpServer::Impl& server_;
    beast::flat_buffer buffer_;
    std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
    std::deque<Pending> out_;
    bool writing_ = false;
    bool keep_alive_ = true;
    bool replied_ = false;    // the current request's answer is complete (queued)
    bool streaming_ = false;  // its stream has started
    bool answer_open_ = false;  // counted in the server's open_answers
    uint64_t seq_ = 0;        // the current request
    std::function<void()> abandon_;
    std::atomic<bool> dead_{false};
    std::atomic<size_t> backlog_{0};
};

void ConnReply::send(Response response) {
    auto c = conn_;
    const uint64_t seq = seq_;
    c->post([c, seq, r = std::move(response)]() mutable { c->reply_send(seq, std::move(r)); });
}

void ConnReply::start_stream(int status, std::string content_type, Headers headers) {
    auto c = conn_;
    const uint64_t seq = seq_;
    c->post([c, seq, status, ct = std::move(content_type), h = std::move(headers)]() mutable {
        c->reply_start(seq, status, std::move(ct), std::move(h));
    });
}

bool ConnReply::write(std::string data) {
    auto c = conn_;
    if (!c->alive()) return false;
    const size_t n = data.size() + 16;  // with the chunk framing
    if (!c->reserve_backlog(n)) {
        c->post([c] { c->drop(); });
        return false;
    }
    const uint64_t seq = seq_;
    c->post([c, seq, d = std::move(data), n]() mutable { c->reply_write(seq, std::move(d), n); });
    return true;
}

void ConnReply::end() {
    auto c = conn_;
    const uint64_t seq = seq_;
    c->post([c, seq] { c->reply_end(seq); });
}

void ConnReply::on_abandon(std::function<void()> callback) {
    auto c = conn_;
    const uint64_t seq = seq_;
    c->post([c, seq, cb = std::move(callback)]() mutable { c->reply_on_abandon(seq, std::move(cb)); });
}

}  // namespace

void HttpServer::Impl::accept() {
    acceptor.async_accept(asio::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
        if (ec) {
            if (stopping || !acceptor.is_open()) return;
            // Out of descriptors and the like: try again shortly rather than spin.
            auto timer = std::make_shared<asio::steady_timer>(ioc, std::chrono::milliseconds(50));
            timer->async_wait([this, timer](beast::error_code) { accept(); });
            return;
        }
        // A stream's events are small writes a few milliseconds apart: under
        // Nagle's algorithm each would wait for the client's ACK of the one
        // before, which a client that delays its ACKs sends late. Sent at once.
        beast::error_code nodelay_ec;
        socket.set_option(tcp::no_delay(true), nodelay_ec);  // best effort: a socket without it still serves
        auto c = std::make_shared<Connection>(std::move(socket), *this);
        if (n_connections.load() > limits.max_connections)
            c->reject("too many connections (the limit is " + std::to_string(limits.max_connections) + ")");
        else
            c->start();
        accept();
    });
}

HttpServer::HttpServer(Limits limits, Handler handler, ErrorResponder errors) : impl_(std::make_unique<Impl>()) {
    impl_->limits = limits;
    impl_->handler = std::move(handler);
    impl_->errors = std::move(errors);
}

HttpServer::~HttpServer() {
    stop();
}

Status HttpServer::bind(const std::string& host, int port) {
    const std::string where = host + ":" + (port == 0 ? std::string("any port") : std::to_string(port));
    beast::error_code ec;
    tcp::resolver resolver(impl_->ioc);
    const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
    if (ec || found.empty())
        return Error{"cannot bind to " + where + ": no such address (" + (ec ? ec.message() : "none") + ")"};
    const tcp::endpoint ep = found.begin()->endpoint();
    auto& a = impl_->acceptor;
    a.open(ep.protocol(), ec);
    if (!ec) a.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) a.bind(ep, ec);
    if (!ec) a.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
        beast::error_code ignored;
        a.close(ignored);
        return Error{"cannot bind to " + where + " (" + ec.message() + ")"};
    }
    impl_->port = a.local_endpoint().port();
    return {};
}

int HttpServer::port() const { return impl_->port; }

int HttpServer::connections() const { return impl_->n_connections.load(); }

void HttpServer::run() {
    if (impl_->stopping || !impl_->acceptor.is_open()) return;
    impl_->accept();
    std::vector<std::thread> extra;
    for (int i = 1; i < std::max(1, impl_->limits.io_threads); ++i) extra.emplace_back([this] { impl_->ioc.run(); });
    impl_->ioc.run();
    for (std::thread& t : extra) t.join();
}

void HttpServer::stop() {
    if (impl_->stopping.exchange(true)) return;
    asio::post(impl_->ioc, [this] {
        beast::error_code ignored;
        impl_->acceptor.close(ignored);
    });
    // Answers under way (a stream's closing events, say) get a moment to be written.
    for (int i = 0; i < 100 && impl_->open_answers.load() > 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    impl_->ioc.stop();
}

}  // namespace tern::server::http
