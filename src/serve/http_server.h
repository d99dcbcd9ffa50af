// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// serve's HTTP server: cpp-httplib's, with a deadline for each request's head
// and one for its body.
//
// cpp-httplib 0.11 bounds each read of a request (its read timeout), never the
// whole: a client that sends a byte of its head or body within every read
// timeout held its connection's thread for as long as it kept sending, and
// --max-connections such clients held every thread (a slowloris). The place
// cpp-httplib gives a server to take over a connection is the virtual
// process_and_close_socket (its SSLServer overrides it the same way). HttpServer
// takes it over and, for each request on the connection:
//   * waits for its first byte for at most the keep-alive timeout, as
//     cpp-httplib does, then closes (no request was begun: no answer);
//   * reads the whole head itself, within `header_timeout` and `max_head_bytes`;
//     else answers 408 (or 414 / 431) and closes the connection;
//   * hands the request to cpp-httplib (Server::process_request) on a stream
//     whose reads end at `body_timeout` after the head (each one also within the
//     read timeout, as before). A body that misses it is answered 408 by the
//     error handler (BodyTimedOut()), and the connection closed.
// So each connection holds its thread for at most keep-alive timeout + head
// deadline + body deadline + the handler's time per request. What is left to a
// client that keeps opening slow connections is said in docs/SERVE.md.

#ifndef DEDUP_SRC_SERVE_HTTP_SERVER_H_
#define DEDUP_SRC_SERVE_HTTP_SERVER_H_

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <unordered_map>

namespace dedup::serve {

struct RequestDeadlines {
  // The whole head (request line and header fields), counted from when serve
  // starts reading it: its first byte, or when the connection got a thread if
  // it waited for one. Default: 10 s.
  std::chrono::milliseconds header_timeout{10'000};
  // The whole body, counted from the end of the head. Default: 30 s.
  std::chrono::milliseconds body_timeout{30'000};
  // A head larger than this as sent is refused before it is parsed (431; 414
  // when its request line alone is longer than cpp-httplib's 8 KiB), so that
  // no client grows one without bound within the deadline. Default: 80 KiB.
  size_t max_head_bytes = 80 * 1024;
};

class HttpServer : public httplib::Server {
 public:
  // Fills the answer to a request refused before cpp-httplib read it: its status
  // (408, 414 or 431) is set; the connection is closed after it. Called on the
  // connection's thread.
  using RefusalHandler = std::function<void(httplib::Response& res)>;

  // Both before listening.
  void set_deadlines(const RequestDeadlines& deadlines) { deadlines_ = deadlines; }
  void set_refusal_handler(RefusalHandler handler) { refusal_handler_ = std::move(handler); }

  // True when `req` (a request this server is answering, as handed to its
  // handlers) is being answered because its body did not arrive by its
  // deadline: the error handler's 408 instead of cpp-httplib's 400. The
  // connection is closed after the answer.
  bool BodyTimedOut(const httplib::Request& req) const;

 private:
  class ConnectionStream;

  bool process_and_close_socket(socket_t sock) override;

  RequestDeadlines deadlines_;
  RefusalHandler refusal_handler_;
  // The requests being answered (once cpp-httplib has parsed their head), and
  // the connection each came on: how BodyTimedOut finds a request's state.
  mutable std::mutex answering_mu_;
  std::unordered_map<const httplib::Request*, const ConnectionStream*> answering_;
};

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_HTTP_SERVER_H_
