// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// serve's HttpServer (src/serve/http_server.h) in-process, against raw sockets,
// for what the shell tests cannot force from outside serve: the server's send
// buffer made small (SO_SNDBUF on the listener, which each accepted connection
// inherits), so that an answer stalls in its head, or at once, at a byte the
// test chooses. Ports 8117-8118 and
// 8140-8143 (docs/PORTS.md).

#include "serve/http_server.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>
#include <string_view>

namespace dedup::serve {
namespace {

using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// An HttpServer on 127.0.0.1:port, set up by `setup`, whose connections have a
// send buffer of about 8 KiB (Linux doubles the 4 KiB asked), listening on its
// own thread until destroyed.
class TestServer {
 public:
  TestServer(int port, const HttpServerOptions& options, std::chrono::seconds write_timeout,
             const std::function<void(HttpServer&)>& setup) {
    server_.Configure(options);
    server_.set_write_timeout(write_timeout);
    server_.set_socket_options([](socket_t sock) {
      httplib::default_socket_options(sock);
      const int small = 4096;
      ::setsockopt(sock, SOL_SOCKET, SO_SNDBUF, &small, sizeof(small));
    });
    setup(server_);
    bound_ = server_.bind_to_port("127.0.0.1", port);
    if (!bound_) return;
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    for (int i = 0; i < 500 && !server_.is_running(); ++i) std::this_thread::sleep_for(10ms);
  }
  ~TestServer() {
    server_.stop();
    if (thread_.joinable()) thread_.join();
  }
  bool bound() const { return bound_; }

 private:
  HttpServer server_;
  std::thread thread_;
  bool bound_ = false;
};

// A client socket connected to 127.0.0.1:port; rcvbuf > 0 sets its receive
// buffer before connecting (so that its window is that small). -1 on failure.
int Connect(int port, int rcvbuf = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  for (size_t at = 0; at < data.size();) {
    const ssize_t n = ::send(fd, data.data() + at, data.size() - at, MSG_NOSIGNAL);
    if (n <= 0) return false;
    at += static_cast<size_t>(n);
  }
  return true;
}

// Reads one answer (head, then Content-Length bytes of body) within `timeout`,
// after the `got` bytes of it already read; its head in *head. False when the
// connection ended first or time ran out.
bool ReadAnswer(int fd, std::chrono::milliseconds timeout, std::string* head,
                std::string got = "") {
  const auto until = SteadyClock::now() + timeout;
  size_t head_end = std::string::npos;
  size_t want = std::string::npos;
  char buf[65536];
  while (want == std::string::npos || got.size() < want) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - SteadyClock::now());
    if (left <= 0ms) return false;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return false;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    got.append(buf, static_cast<size_t>(n));
    if (head_end == std::string::npos && (head_end = got.find("\r\n\r\n")) != std::string::npos) {
      *head = got.substr(0, head_end + 4);
      const size_t cl = head->find("Content-Length: ");
      if (cl == std::string::npos) return false;
      want = head_end + 4 + std::stoull(head->substr(cl + 16));
    }
  }
  return true;
}

// Sends `raw` on a new connection to 127.0.0.1:port, ends its side, and returns
// all that came back within 3 s (or until the server closed).
std::string Exchange(int port, const std::string& raw) {
  const int fd = Connect(port);
  if (fd < 0) return "(no connection)";
  SendAll(fd, raw);
  ::shutdown(fd, SHUT_WR);
  std::string got;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 3000) <= 0) break;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return got;
}

// A server on `port` whose every GET and POST answers 200 and counts a request
// to /smuggled in *smuggled.
std::unique_ptr<TestServer> SmuggleServer(int port, std::atomic<int>* smuggled) {
  HttpServerOptions options;
  options.threads = 2;
  options.max_connections = 2;
  return std::make_unique<TestServer>(port, options, 10s, [smuggled](HttpServer& http) {
    auto answer = [smuggled](const httplib::Request& req, httplib::Response& res) {
      if (req.path == "/smuggled") ++*smuggled;
      res.set_content("ok", "text/plain");
    };
    http.Get(".*", answer);
    http.Post(".*", answer);
  });
}

// A request that follows one on the same connection, which the server must not
// answer when it cannot know where the first one ended.
constexpr std::string_view kSmuggled = "GET /smuggled HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";

// An answer whose head does not fit the socket buffers (a large header, a client
// that reads nothing) is given up after one write timeout, not two: a write of
// the head that timed out was not the end (cpp-httplib ignores how the head's
// write went and goes on to the body, whose first write waited again).
TEST(ServeHttpServerTest, AnAnswerStalledInItsHeadIsGivenUpAfterOneWriteTimeout) {
  std::atomic<int64_t> handled_ns{0};
  std::atomic<int64_t> given_up_ns{0};
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               SteadyClock::now().time_since_epoch())
        .count();
  };
  HttpServerOptions options;
  options.threads = 1;
  options.max_connections = 1;
  TestServer server(8117, options, 1s, [&](HttpServer& http) {
    http.Get("/big-head", [&](const httplib::Request&, httplib::Response& res) {
      res.set_header("X-Big", std::string(1 << 20, 'h'));
      res.set_content("body", "text/plain");
      handled_ns = now_ns();
    });
    http.set_limit_handler([&](HttpServer::Limit limit, httplib::Response*) {
      if (limit == HttpServer::Limit::kResponseTimeout) given_up_ns = now_ns();
    });
  });
  ASSERT_TRUE(server.bound()) << "port 8117 is taken";
  const int fd = Connect(8117, /*rcvbuf=*/1024);
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(fd, "GET /big-head HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  // Reads nothing; waits for serve to give the answer up.
  for (int i = 0; i < 1000 && given_up_ns == 0; ++i) std::this_thread::sleep_for(10ms);
  ::close(fd);
  ASSERT_NE(handled_ns.load(), 0);
  ASSERT_NE(given_up_ns.load(), 0) << "the answer was never given up";
  const double seconds = static_cast<double>(given_up_ns - handled_ns) / 1e9;
  // One write timeout (1 s) and the scheduler's slack; two would be >= 2 s.
  EXPECT_LT(seconds, 1.8) << "given up " << seconds << " s after the handler ran";
  EXPECT_GE(seconds, 0.9) << "given up " << seconds << " s after the handler ran";
}

// An answer that says the connection is kept (no Connection: close) keeps it,
// even when the places for connections waiting for a request head
// (--max-waiting-connections) fill while that answer is being written: the
// client sends its next request on it, and a connection closed under it fails
// that request (a POST is not retried).
TEST(ServeHttpServerTest, AKeptAliveAnswerKeepsItsConnectionWhenTheWaitingPlacesFillMeanwhile) {
  HttpServerOptions options;
  options.threads = 2;
  options.max_connections = 2;
  options.max_waiting = 1;
  TestServer server(8118, options, 10s, [&](HttpServer& http) {
    http.Get("/big", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(std::string(4 << 20, 'b'), "application/octet-stream");
    });
    http.Get("/small", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    });
  });
  ASSERT_TRUE(server.bound()) << "port 8118 is taken";
  const int a = Connect(8118, /*rcvbuf=*/1024);
  ASSERT_GE(a, 0);
  ASSERT_TRUE(SendAll(a, "GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"));
  // The answer's first bytes came: serve decided whether it keeps the
  // connection, and is now held in writing the rest.
  char first = 0;
  pollfd p{a, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 5000), 1);
  ASSERT_EQ(::recv(a, &first, 1, 0), 1);
  // Meanwhile another connection takes the one waiting place (it sends nothing).
  const int idle = Connect(8118);
  ASSERT_GE(idle, 0);
  std::this_thread::sleep_for(300ms);
  // Now the client reads the whole answer.
  const int big = 1 << 22;
  ::setsockopt(a, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
  std::string head;
  ASSERT_TRUE(ReadAnswer(a, 10s, &head, std::string(1, first)))
      << "the first answer did not come whole";
  const bool announced = head.find("\r\nConnection: close\r\n") != std::string::npos;
  // Its next request on the same connection.
  std::string second;
  const bool answered = SendAll(a, "GET /small HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") &&
                        ReadAnswer(a, 3s, &second);
  ::close(a);
  ::close(idle);
  EXPECT_TRUE(announced || answered)
      << "the answer did not say Connection: close, and the next request on its connection "
         "was not answered";
  if (answered) EXPECT_EQ(second.rfind("HTTP/1.1 200 ", 0), 0u) << second;
}

// A header line cpp-httplib skips without a word (one that ends in a bare LF,
// an obs-fold continuation, one without a colon) is refused, 400, and the
// connection closed: a peer in front that reads it (RFC 9112 2.2 lets it take a
// bare LF as a line's end; 5.2 lets it unfold obs-fold) saw another request
// than serve: "Transfer-Encoding: chunked" there framed the body otherwise than
// serve's Content-Length, and what was body to it was a request of its own to
// serve (request smuggling). RFC 9112 5.2: a server rejects obs-fold with 400 or
// replaces it with SP; it never drops what follows the fold.
TEST(ServeHttpServerTest, AHeadLineCppHttplibWouldSkipIsRefused) {
  std::atomic<int> smuggled{0};
  const auto server = SmuggleServer(8140, &smuggled);
  ASSERT_TRUE(server->bound()) << "port 8140 is taken";
  const std::string body = "0\r\n\r\n";
  for (const std::string& line : {std::string("Transfer-Encoding: chunked\n"),
                                  std::string("X-Fold: a\r\n chunked\r\n"),
                                  std::string("Transfer-Encoding\r\n")}) {
    const std::string got =
        Exchange(8140, "POST /first HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\n" + line +
                           "\r\n" + body + std::string(kSmuggled));
    EXPECT_EQ(got.rfind("HTTP/1.1 400 ", 0), 0u) << "for the line '" << line << "': " << got;
    EXPECT_EQ(got.find("HTTP/1.1", 1), std::string::npos)
        << "for the line '" << line << "', more than one answer: " << got;
  }
  EXPECT_EQ(smuggled.load(), 0) << "a request after an unclear head was answered";
}

// A Transfer-Encoding field with an empty value, which cpp-httplib drops (its
// body then framed by Content-Length alone), where a peer in front may frame the
// body otherwise: refused unrun (400, not 'chunked', and beside a
// Content-Length), and the connection ends after the answer.
TEST(ServeHttpServerTest, AnEmptyTransferEncodingEndsTheConnection) {
  std::atomic<int> smuggled{0};
  const auto server = SmuggleServer(8141, &smuggled);
  ASSERT_TRUE(server->bound()) << "port 8141 is taken";
  const std::string got = Exchange(
      8141, "POST /first HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nTransfer-Encoding:\r\n"
            "\r\n0\r\n\r\n" + std::string(kSmuggled));
  EXPECT_EQ(got.rfind("HTTP/1.1 400 ", 0), 0u) << got;
  EXPECT_NE(got.find("\r\nConnection: close\r\n"), std::string::npos) << got;
  EXPECT_EQ(smuggled.load(), 0) << "the request after it was answered: " << got;
}

// The places for connections waiting for a request head
// (--max-waiting-connections) are all free again after connections of every
// kind came and went: kept alive, pipelined, closed by the client mid-head or
// before its answer, HTTP/1.0, refused heads, Connection: close. Then as many
// idle connections as there are places each get one (none is shed), and one
// more is shed.
TEST(ServeHttpServerTest, TheWaitingPlacesAreAllFreeAfterChurn) {
  constexpr size_t kPlaces = 3;
  std::atomic<int> shed{0};
  HttpServerOptions options;
  options.threads = 8;
  options.max_connections = 8;
  options.max_waiting = kPlaces;
  TestServer server(8142, options, 10s, [&](HttpServer& http) {
    auto answer = [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok", "text/plain");
    };
    http.Get(".*", answer);
    http.Post(".*", answer);
    http.set_limit_handler([&](HttpServer::Limit limit, httplib::Response*) {
      if (limit == HttpServer::Limit::kWaitingFull || limit == HttpServer::Limit::kWaitingFullIdle) {
        ++shed;
      }
    });
  });
  ASSERT_TRUE(server.bound()) << "port 8142 is taken";
  const std::string get = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
  const std::vector<std::string> kinds = {
      get,
      get + get + get,
      get + "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
      "GET / HTTP/1.0\r\n\r\n",
      "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\n\r\nabc" + get,
      "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nBad line\r\n\r\n",
      "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nRange: items=9-1\r\nX: a%41\r\n\r\n" + get,
      "GET / HTTP/1.1\r\nHost: 127",
      "",
  };
  for (int round = 0; round < 10; ++round) {
    std::vector<std::thread> clients;
    for (size_t k = 0; k < kinds.size(); ++k) {
      clients.emplace_back([&, k, round] {
        const int fd = Connect(8142);
        if (fd < 0) return;
        SendAll(fd, kinds[k]);
        if ((round + k) % 2 == 0) {
          ::shutdown(fd, SHUT_WR);
          char buf[4096];
          pollfd p{fd, POLLIN, 0};
          while (::poll(&p, 1, 2000) > 0 && ::recv(fd, buf, sizeof(buf), 0) > 0) {
          }
        } else {
          std::this_thread::sleep_for(20ms);  // then closes without reading on
        }
        ::close(fd);
      });
    }
    for (std::thread& t : clients) t.join();
  }
  // Connections closed with a lingering close end within about a second.
  std::this_thread::sleep_for(2500ms);
  const int shed_before = shed.load();
  std::vector<int> idle;
  for (size_t i = 0; i < kPlaces; ++i) {
    idle.push_back(Connect(8142));
    std::this_thread::sleep_for(50ms);
  }
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(shed.load(), shed_before) << "an idle connection was shed with fewer than "
                                      << kPlaces << " waiting: places leaked";
  // One more, with every place taken, is shed.
  const int extra = Connect(8142);
  std::string head;
  EXPECT_TRUE(ReadAnswer(extra, 3s, &head));
  EXPECT_EQ(head.rfind("HTTP/1.1 503 ", 0), 0u) << head;
  ::close(extra);
  for (const int fd : idle) ::close(fd);
}

// A header line over cpp-httplib's 8 KiB bound (its CRLF and each '%' in its
// value written as "%25" counted, as serve escapes them) is refused with an
// answer that says so, not cpp-httplib's bare 400 (which serve's own error
// handler took for a POST without its body). One at the bound, '%' and all, is
// read.
TEST(ServeHttpServerTest, AHeaderLineOverTheBoundOnceEscapedIsRefusedSayingSo) {
  std::atomic<int> smuggled{0};
  const auto server = SmuggleServer(8143, &smuggled);
  ASSERT_TRUE(server->bound()) << "port 8143 is taken";
  const std::string request = "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  // "X-Pad: " (7) + value + CRLF (2) = 8192 bytes as sent.
  const std::string at_bound = "X-Pad: " + std::string(8183, 'a') + "\r\n";
  std::string got = Exchange(8143, request + at_bound + "\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 200 ", 0), 0u) << got.substr(0, 200);
  // As sent also 8192 bytes, but its one '%' is written "%25": 8194.
  const std::string escaped_over = "X-Pad: %" + std::string(8182, 'a') + "\r\n";
  got = Exchange(8143, request + escaped_over + "\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 400 ", 0), 0u) << got.substr(0, 200);
  EXPECT_NE(got.find("longer than 8 KiB"), std::string::npos) << got.substr(0, 400);
  // Over the bound as sent, no '%'.
  const std::string over = "X-Pad: " + std::string(8184, 'a') + "\r\n";
  got = Exchange(8143, request + over + "\r\n");
  EXPECT_EQ(got.rfind("HTTP/1.1 400 ", 0), 0u) << got.substr(0, 200);
  EXPECT_NE(got.find("longer than 8 KiB"), std::string::npos) << got.substr(0, 400);
}

}  // namespace
}  // namespace dedup::serve
