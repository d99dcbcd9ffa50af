// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "serve/metrics_http.h"

#include <httplib.h>

#include <thread>

#include "serve/http_server.h"

namespace dedup::serve {

struct MetricsEndpoint::Impl {
  // With serve's deadlines for a request's head and body (http_server.h).
  HttpServer http;
  std::thread thread;
};

MetricsEndpoint::MetricsEndpoint() : impl_(std::make_unique<Impl>()) {}

MetricsEndpoint::~MetricsEndpoint() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Status MetricsEndpoint::Start(int port, std::function<std::string()> body) {
  impl_->http.new_task_queue = [] { return new httplib::ThreadPool(2); };
  impl_->http.set_payload_max_length(1024);
  impl_->http.Get("/metrics", [body = std::move(body)](const httplib::Request&,
                                                        httplib::Response& res) {
    res.set_content(body(), "text/plain; version=0.0.4; charset=utf-8");
  });
  if (!impl_->http.bind_to_port("127.0.0.1", port)) {
    return Status::Unavailable("metrics: cannot listen on 127.0.0.1:" + std::to_string(port));
  }
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
  return Status::Ok();
}

}  // namespace dedup::serve
