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
//     error handler HttpServer installs (not cpp-httplib's 400), and the
//     connection closed;
//   * writes the answer on the same stream: each write within the write timeout
//     (10 s without progress, as cpp-httplib's), the whole answer within
//     `response_timeout` of its first byte. A client that does not read its
//     answers (pipelined requests, a large answer) is given up at the first of
//     them, without an answer, and its connection reset.
// So each connection holds its thread for at most keep-alive timeout + head
// deadline + body deadline + the handler's time + response deadline per request.
//
// And at most `max_waiting` connections at once hold a thread while they wait
// for a request head (idle, or a head still arriving), so that connections that
// send nothing, or a head that never ends, cannot take every thread however
// often they come back: when that many wait, a new connection must bring its
// whole head at once (within kWaitingFullGrace), else it is answered 503 and
// closed, and a kept-alive connection is closed after its answer instead of
// waiting for the next (the answer says Connection: close: a connection takes
// its place for that wait as its answer is about to say it is kept, so places
// filling while the answer is written cannot close it; a client not told would
// send its next request on a closed connection, and fail). The moment counts from the connection's accept: one
// that waited its turn in the queue (where a slow client's connections that
// come back wait too) must have its head there already, so shedding those
// costs a thread no wait. What is left is said in docs/SERVE.md.
//
// serve and the worker's metrics listener (metrics_http.h) both configure theirs
// with Configure(): the same deadlines, timeouts, threads and answers.

#ifndef DEDUP_SRC_SERVE_HTTP_SERVER_H_
#define DEDUP_SRC_SERVE_HTTP_SERVER_H_

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>

#include "dedup/status.h"

namespace dedup::serve {

struct RequestDeadlines {
  // The whole head (request line and header fields), counted from when serve
  // starts reading it: its first byte, or when the connection got a thread if
  // it waited for one. Default: 10 s.
  std::chrono::milliseconds header_timeout{10'000};
  // The whole body, counted from the end of the head. Default: 30 s.
  std::chrono::milliseconds body_timeout{30'000};
  // The whole answer, counted from its first byte written (an interim
  // 100 Continue aside) until its last is handed to the kernel. Default: 30 s.
  std::chrono::milliseconds response_timeout{30'000};
  // A head larger than this as sent is refused before it is parsed (431; 414
  // when its request line alone is longer than cpp-httplib's 8 KiB), so that
  // no client grows one without bound within the deadline. Default: 80 KiB.
  size_t max_head_bytes = 80 * 1024;
};

struct HttpServerOptions {
  RequestDeadlines deadlines;
  // Threads that always wait for connections, and connections answered at once
  // (ConnectionPool): 1 <= threads <= max_connections.
  size_t threads = 16;
  size_t max_connections = 256;
  // Connections that may hold a thread while waiting for a request head (a
  // kept-alive one from when its answer is about to be written), at
  // most max_connections; 0: max_connections - max(1, max_connections / 4), at
  // least 1 (so that, with more than one thread, some are always left to
  // connections whose head has come).
  size_t max_waiting = 0;
  // Larger request bodies are answered 413.
  size_t max_body_bytes = 2 * 1024 * 1024;
};

class HttpServer : public httplib::Server {
 public:
  // What HttpServer ended itself.
  enum class Limit {
    kHeadTimeout,      // 408: the head missed its deadline (refused before parsing)
    kUriTooLong,       // 414: a request line over 8 KiB (refused before parsing)
    kHeadTooLarge,     // 431: a head over max_head_bytes (refused before parsing)
    kBodyTooLarge,     // 413: a Content-Length over max_body_bytes (refused before
                       // the body is read, and before any 100 Continue)
    kUnknownMethod,    // 501: a method cpp-httplib does not read (refused before
                       // parsing)
    kMalformedHead,    // 400: a header line cpp-httplib would skip without a word
                       // (a bare LF, obs-fold, no colon) or refuse with a bare 400
                       // (over 8 KiB once its '%' are escaped); refused before parsing
    kBodyTimeout,      // 408: the body missed its deadline (the request was parsed)
    kResponseTimeout,  // the answer was not written in time: given up, no answer
    kWaitingFull,      // 503: max_waiting connections wait for a head, and this new
                       // one's did not come at once
    kWaitingFullIdle,  // a kept-alive connection closed after its answer, as
                       // max_waiting connections waited for a head when the
                       // answer was about to be written (it said Connection:
                       // close): no answer of its own
  };
  // A new connection that finds max_waiting connections waiting for a head
  // must bring its whole head within this of its accept (or of its turn, when
  // the head's deadline is shorter).
  static constexpr std::chrono::milliseconds kWaitingFullGrace{100};
  // "head", "body" or "response" for the timeouts; "" for the others.
  static const char* TimeoutPart(Limit limit);
  // Told of each Limit on the connection's thread. For every one but
  // kResponseTimeout, `res` is the answer about to be sent, its status and a
  // default application/problem+json body set, which the handler may replace;
  // the connection is closed after it. For kResponseTimeout and
  // kWaitingFullIdle, `res` is null.
  using LimitHandler = std::function<void(Limit limit, httplib::Response* res)>;

  HttpServer();

  // All before listening. The one setup of serve's and the metrics listener's
  // servers: the options, cpp-httplib's read and write timeouts (10 s each), the
  // keep-alive timeout (5 s, 1000 requests), TCP_NODELAY, a ConnectionPool.
  void Configure(const HttpServerOptions& options);
  // Binds `host`:`port` (0: a free port, whose number goes to *bound). Errors
  // name the address and why: kUnavailable when another socket holds it (a
  // supervisor may try again: the other process may be on its way out),
  // kInvalidArgument when it cannot be bound here at all (not an address of this
  // host, a name that does not resolve, a port below 1024 without the right).
  Status Bind(const std::string& host, int port, int* bound);
  void set_limit_handler(LimitHandler handler) { limit_handler_ = std::move(handler); }
  // cpp-httplib's error handler (hides httplib::Server's): called for every
  // answer >= 400 but the 408 of a body that missed its deadline, which goes to
  // the limit handler.
  void set_error_handler(Handler handler) { error_handler_ = std::move(handler); }
  // cpp-httplib's post-routing handler (hides httplib::Server's): called just
  // before each answer is written, after HttpServer's, which takes the
  // connection's place for the wait for its next request, or says
  // Connection: close when max_waiting connections already wait for a head.
  void set_post_routing_handler(Handler handler) { post_routing_handler_ = std::move(handler); }
  // cpp-httplib's pre-routing handler (hides httplib::Server's): called before a
  // request is routed, after HttpServer's, which keeps cpp-httplib from adding
  // "Accept-Ranges: bytes" to a HEAD's answer (no route serves ranges; the GET
  // of the same route says nothing of them). An Accept-Ranges a handler sets
  // itself (an application's, through the proxy) is sent.
  void set_pre_routing_handler(HandlerWithResponse handler) {
    pre_routing_handler_ = std::move(handler);
  }

  const RequestDeadlines& deadlines() const { return deadlines_; }

 private:
  class ConnectionStream;

  bool process_and_close_socket(socket_t sock) override;
  // True when `req` (a request this server is answering, as handed to its
  // handlers) is being answered because its body did not arrive by its
  // deadline.
  bool BodyTimedOut(const httplib::Request& req) const;
  // Sets res's status and default body for `limit`, then tells the handler.
  void Refuse(Limit limit, httplib::Response& res, const std::string& why = "") const;

  RequestDeadlines deadlines_;
  size_t max_waiting_ = SIZE_MAX;
  size_t max_body_bytes_ = SIZE_MAX;
  // Connections holding a thread while they wait for a request head.
  std::atomic<size_t> waiting_{0};
  LimitHandler limit_handler_;
  Handler error_handler_;
  Handler post_routing_handler_;
  HandlerWithResponse pre_routing_handler_;
  // The requests being answered (once cpp-httplib has parsed their head), and
  // the connection each came on: how BodyTimedOut finds a request's state.
  mutable std::mutex answering_mu_;
  std::unordered_map<const httplib::Request*, ConnectionStream*> answering_;
};

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_HTTP_SERVER_H_
