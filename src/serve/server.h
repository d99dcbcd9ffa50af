// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup serve`: one HTTP listener (cpp-httplib) in front of one Store, serving
//   * the JSON API over the SPEC operations under /v1 (api.cc),
//   * the web view of the records at / (page.cc),
//   * Prometheus metrics at /metrics,
// and, in proxy mode, the Idempotency-Key proxy in front of an HTTP application
// (proxy.cc): then every path goes to the application except those under
// /_dedup/, where the API, the page and the metrics move.
//
// Security: the listener binds to loopback unless told otherwise, and any other
// address needs an auth token, which every API call, the page, the metrics and the
// proxy then check (`Authorization: Bearer T`, the `Dedup-Token: T` header, or the
// page's cookie). Request bodies and header sizes are bounded. Nothing served,
// logged or measured carries the store URI's password.
//
// docs/SERVE.md is the user's guide; docs/openapi.yaml the API's contract.

#ifndef DEDUP_SRC_SERVE_SERVER_H_
#define DEDUP_SRC_SERVE_SERVER_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "dedup/clock.h"
#include "dedup/status.h"
#include "dedup/store.h"

namespace dedup::serve {

struct ServeOptions {
  // Address to listen on. Default: 127.0.0.1. Anything that is not loopback
  // (127.0.0.0/8, ::1, localhost) requires auth_token.
  std::string host = "127.0.0.1";
  // Port; 0 picks a free one (see Server::port()). Default: 8077.
  int port = 8077;
  // Clients must present this token; empty = no check (loopback only). At least
  // 16 characters.
  std::string auth_token;
  // Proxy mode: the application's base URL, "http://HOST:PORT". Empty = API only.
  std::string proxy;
  // Proxy mode: store keys are key_prefix + the Idempotency-Key header.
  std::string key_prefix = "idem:";
  // Proxy mode: how long a forwarded request holds its claim without a heartbeat
  // (extended every lease/3 while the application works), and how long a recorded
  // response is replayed. Defaults: 30 s, 24 h.
  Millis lease{30'000};
  Millis retention{24LL * 3600 * 1000};
  // Proxy mode: responses whose body is larger are forwarded but their body is
  // not recorded (a replay says so). Default: 512 KiB; at most what fits in a
  // stored result (kMaxResultBytes) once encoded.
  size_t max_response_bytes = 512 * 1024;
  // Request bodies larger than this get 413. Default: 2 MiB (a 1 MiB result in
  // base64 plus the JSON around it).
  size_t max_body_bytes = 2 * 1024 * 1024;
  // Requests with more header fields, or more header bytes, get 431. Each
  // header line is also bounded to 8 KiB by cpp-httplib itself.
  size_t max_header_count = 100;
  size_t max_header_bytes = 64 * 1024;
  // Threads that always wait for connections. A connection holds a thread from
  // its accept to its close (idle for up to 5 s between requests, and while it
  // sends a request, up to header_timeout + body_timeout). Default: 16.
  int threads = 16;
  // Connections answered at once: when every thread is busy, a new connection
  // gets a thread of its own (ended with it), up to this many threads in all;
  // beyond, connections wait their turn. At least `threads`; 0 = 256, or
  // `threads` when more.
  int max_connections = 0;
  // Connections that may hold a thread while they wait for a request head
  // (idle, or a head still arriving). When that many wait, a new connection
  // whose whole head does not come at once (100 ms) is answered 503 and closed,
  // and a kept-alive connection is closed after its answer (which says
  // Connection: close when they already waited as it was written): connections that
  // come back slow cannot take every thread. 1 to max_connections; 0 =
  // max_connections - max(1, max_connections / 4), at least 1.
  int max_waiting_connections = 0;
  // A request's whole head must arrive within header_timeout (counted from when
  // serve starts reading it) and its whole body within body_timeout after the
  // head; else it is answered 408 and its connection closed. They bound how long
  // a client that trickles its request holds a thread (each byte within the read
  // timeout, 10 s, no longer ends it). Defaults: 10 s, 30 s.
  Millis header_timeout{10'000};
  Millis body_timeout{30'000};
  // A whole answer must be written within response_timeout of its first byte
  // (each write, also within the write timeout, 10 s without progress); else it
  // is given up and its connection reset. They bound how long a client that
  // does not read its answers, or reads a large one slowly, holds a thread.
  // Default: 30 s.
  Millis response_timeout{30'000};
  // The store URI's password, replaced by "***" in every error message sent (a
  // problem's detail), in case a store's message ever carries it. Not in data
  // (records, keys, results) nor /metrics, which carry no message: a password
  // that is also a word ("dedup") changed them. Empty = none.
  std::string secret_to_redact;
  // "0.1.0", for dedup_build_info and /v1/info.
  std::string version = "dev";
  // One line per request to this sink (method, route, status, µs); null = quiet.
  std::function<void(const std::string&)> log;
};

// Checks the options alone (addresses, token, proxy URL, bounds): InvalidArgument
// naming the problem.
Status ValidateServeOptions(const ServeOptions& options);

class Server {
 public:
  // The store is not owned and must outlive the server.
  [[nodiscard]] static StatusOr<std::unique_ptr<Server>> Create(Store* store,
                                                                ServeOptions options);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the port: Unavailable when it cannot be bound.
  Status Bind();
  // The bound port (after Bind()).
  int port() const;
  // Serves until Stop(); returns when the listener closed.
  Status Run();
  // Async-signal-unsafe; call from another thread.
  void Stop();

  // The Prometheus exposition of this server's metrics.
  std::string RenderMetrics() const;

  class Impl;

 private:
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_SERVER_H_
