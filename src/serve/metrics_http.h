// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// A /metrics listener on the same HTTP stack as `dedup serve` (cpp-httplib), for
// long-running commands that expose only metrics (the worker's --metrics-port).
// Loopback only: it has no token.

#ifndef DEDUP_SRC_SERVE_METRICS_HTTP_H_
#define DEDUP_SRC_SERVE_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>

#include "dedup/status.h"

namespace dedup::serve {

class MetricsEndpoint {
 public:
  MetricsEndpoint();
  ~MetricsEndpoint();  // Stop()
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Binds 127.0.0.1:port, answering nothing yet (connections wait in the
  // backlog). Unavailable when the port cannot be bound. Separate from Serve()
  // so that a caller can find a port in use before it creates anything else.
  Status Bind(int port);
  // After Bind(): answers GET /metrics with body() (Prometheus text format)
  // from a thread of its own until Stop().
  void Serve(std::function<std::string()> body);
  // Stops the listener and joins its thread; body() is not called after.
  // Idempotent; the destructor calls it.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_METRICS_HTTP_H_
