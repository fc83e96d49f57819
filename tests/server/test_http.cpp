// The event-driven HTTP layer (src/server/http.h) on loopback with a raw
// socket client: whole responses and pipelined requests on one connection,
// the errors the layer answers itself (400, 413, 431, 503 past the connection
// limit), a chunked stream written from another thread in order, and the
// abandon callback of a client that goes away mid-stream.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server/http.h"

namespace tern::server::http {
namespace {

// A connected loopback socket with a receive timeout; closed on destruction.
class Client {
public:
    explicit Client(int port) {
        fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
        timeval tv{10, 0};
        ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(uint16_t(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        connected_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    }
    ~Client() { close(); }
    bool connected() const { return connected_; }
    void send(const std::string& s) {
        size_t done = 0;
        while (done < s.size()) {
            const ssize_t n = ::send(fd_, s.data() + done, s.size() - done, MSG_NOSIGNAL);
            if (n <= 0) return;
            done += size_t(n);
        }
    }
    // Everything until the peer closes (or 10 s pass without a byte).
    std::string read_all() {
        std::string out;
        char buf[4096];
        for (;;) {
            const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) return out;
            out.append(buf, size_t(n));
        }
    }
    // Reads until `needle` has been seen `times` times.
    std::string read_until(const std::string& needle, int times = 1) {
        std::string out;
        char buf[4096];
        auto count = [&] {
            int c = 0;
            for (size_t at = out.find(needle); at != std::string::npos; at = out.find(needle, at + 1)) ++c;
            return c;
        };
        while (count() < times) {
            const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
            if (n <= 0) break;
            out.append(buf, size_t(n));
        }
        return out;
    }
    void close() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
    bool connected_ = false;
};

Response text(int status, std::string body) {
    Response r;
    r.status = status;
    r.content_type = "text/plain";
    r.body = std::move(body);
    return r;
}

// A server on a free loopback port, running on its own thread.
struct Running {
    HttpServer server;
    std::thread thread;
    Running(Limits limits, Handler handler)
        : server(limits, std::move(handler), [](int status, const std::string& m) { return text(status, m); }) {
        EXPECT_TRUE(server.bind("127.0.0.1", 0).ok());
        thread = std::thread([this] { server.run(); });
    }
    ~Running() {
        server.stop();
        thread.join();
    }
    int port() const { return server.port(); }
};

TEST(Http, WholeResponsesAndPipelinedRequests) {
    Running r(Limits{}, [](const Request& req, std::shared_ptr<Reply> reply) {
        reply->send(text(200, req.method + " " + req.path + " [" + req.body + "] " + req.header("x-tag")));
    });
    Client c(r.port());
    ASSERT_TRUE(c.connected());
    // Two requests in one write, the second closing the connection.
    c.send("GET /a?q=1 HTTP/1.1\r\nHost: x\r\nX-Tag: first\r\n\r\n"
           "POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\nx-tag: second\r\n\r\nhello");
    const std::string got = c.read_all();
    const size_t a = got.find("GET /a [] first"), b = got.find("POST /b [hello] second");
    ASSERT_NE(a, std::string::npos) << got;
    ASSERT_NE(b, std::string::npos) << got;
    EXPECT_LT(a, b) << "answers out of order: " << got;
    EXPECT_NE(got.find("Connection: keep-alive"), std::string::npos) << got;
    EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
}

TEST(Http, TheLayerAnswersMalformedAndOversizedRequests) {
    Limits limits;
    limits.max_body = 100;
    limits.max_header = 1024;
    std::atomic<int> handled{0};
    Running r(limits, [&](const Request&, std::shared_ptr<Reply> reply) {
        ++handled;
        reply->send(text(200, "ok"));
    });
    struct Case {
        std::string request, status;
    };
    const Case cases[] = {
        {"NOT HTTP AT ALL\r\n\r\n", "HTTP/1.1 400 "},
        {"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(2000, 'a') + "\r\n\r\n", "HTTP/1.1 431 "},
        {"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n" + std::string(101, 'b'), "HTTP/1.1 413 "},
    };
    for (const Case& k : cases) {
        Client c(r.port());
        ASSERT_TRUE(c.connected());
        c.send(k.request);
        const std::string got = c.read_all();
        EXPECT_EQ(got.rfind(k.status, 0), 0u) << got;
        EXPECT_NE(got.find("Connection: close"), std::string::npos) << got;
    }
    EXPECT_EQ(handled.load(), 0) << "a bad request reached the handler";
}

TEST(Http, AStreamWrittenFromAnotherThreadArrivesInOrder) {
    std::vector<std::thread> producers;
    Running r(Limits{}, [&](const Request&, std::shared_ptr<Reply> reply) {
        reply->start_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
        producers.emplace_back([reply] {
            for (int i = 0; i < 200; ++i) reply->write("piece " + std::to_string(i) + "\n");
            reply->end();
        });
    });
    {
        Client c(r.port());
        ASSERT_TRUE(c.connected());
        c.send("GET /s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        const std::string got = c.read_all();
        ASSERT_NE(got.find("Transfer-Encoding: chunked"), std::string::npos) << got.substr(0, 300);
        size_t at = 0;
        for (int i = 0; i < 200; ++i) {
            const size_t next = got.find("piece " + std::to_string(i) + "\n", at);
            ASSERT_NE(next, std::string::npos) << "piece " << i << " missing or out of order";
            at = next;
        }
        EXPECT_NE(got.find("\r\n0\r\n\r\n"), std::string::npos) << "no closing chunk";
    }
    for (std::thread& t : producers) t.join();
}

TEST(Http, AClientGoneMidStreamIsAbandoned) {
    std::atomic<bool> abandoned{false}, writes_failed{false};
    std::vector<std::thread> producers;
    Running r(Limits{}, [&](const Request&, std::shared_ptr<Reply> reply) {
        reply->on_abandon([&] { abandoned = true; });
        reply->start_stream(200, "text/plain", {});
        producers.emplace_back([&, reply] {
            const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
            while (std::chrono::steady_clock::now() < deadline) {
                if (!reply->write(std::string(1024, 'x'))) {
                    writes_failed = true;
                    return;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(2));
            }
        });
    });
    {
        Client c(r.port());
        ASSERT_TRUE(c.connected());
        c.send("GET /s HTTP/1.1\r\nHost: x\r\n\r\n");
        c.read_until("xxxx");
    }  // the client goes away
    for (std::thread& t : producers) t.join();
    EXPECT_TRUE(writes_failed.load()) << "write() kept succeeding after the client left";
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!abandoned && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_TRUE(abandoned.load());
}

TEST(Http, ConnectionsPastTheLimitGet503) {
    Limits limits;
    limits.max_connections = 3;
    Running r(limits, [](const Request&, std::shared_ptr<Reply> reply) { reply->send(text(200, "ok")); });
    std::vector<std::unique_ptr<Client>> held;
    for (int i = 0; i < 3; ++i) held.push_back(std::make_unique<Client>(r.port()));
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (r.server.connections() < 3 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ASSERT_EQ(r.server.connections(), 3);
    Client extra(r.port());
    extra.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    const std::string got = extra.read_all();
    EXPECT_EQ(got.rfind("HTTP/1.1 503 ", 0), 0u) << got;
    EXPECT_NE(got.find("too many connections"), std::string::npos) << got;
    // A held connection is still served.
    held[0]->send("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    EXPECT_EQ(held[0]->read_all().rfind("HTTP/1.1 200 ", 0), 0u);
}

}  // namespace
}  // namespace tern::server::http
