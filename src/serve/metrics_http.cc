// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "serve/metrics_http.h"

#include <httplib.h>

#include <thread>

#include "serve/http_server.h"

namespace dedup::serve {

struct MetricsEndpoint::Impl {
  // With serve's deadlines for a request's head, body and answer (http_server.h).
  HttpServer http;
  std::thread thread;
};

MetricsEndpoint::MetricsEndpoint() : impl_(std::make_unique<Impl>()) {}

MetricsEndpoint::~MetricsEndpoint() {
  impl_->http.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

Status MetricsEndpoint::Start(int port, std::function<std::string()> body) {
  // serve's setup (HttpServer::Configure): its deadlines and answers (408, 414,
  // 431), with two threads and a scrape's small bodies.
  HttpServerOptions options;
  options.threads = 2;
  options.max_connections = 2;
  options.max_body_bytes = 1024;
  impl_->http.Configure(options);
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
