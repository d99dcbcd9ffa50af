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
  ~MetricsEndpoint();  // stops the listener and joins its thread
  MetricsEndpoint(const MetricsEndpoint&) = delete;
  MetricsEndpoint& operator=(const MetricsEndpoint&) = delete;

  // Answers GET /metrics on 127.0.0.1:port with body() (Prometheus text format)
  // from a thread of its own. Unavailable when the port cannot be bound.
  Status Start(int port, std::function<std::string()> body);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_METRICS_HTTP_H_
