// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "serve/metrics_http.h"

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "serve/http_server.h"

namespace dedup::serve {

struct MetricsEndpoint::Impl {
  // With serve's deadlines for a request's head, body and answer (http_server.h).
  HttpServer http;
  std::thread thread;
  std::atomic<bool> done{false};  // listen_after_bind() returned
};

MetricsEndpoint::MetricsEndpoint() : impl_(std::make_unique<Impl>()) {}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

Status MetricsEndpoint::Bind(int port) {
  // serve's setup (HttpServer::Configure): its deadlines and answers (408, 414,
  // 431), with two threads and a scrape's small bodies.
  HttpServerOptions options;
  options.threads = 2;
  options.max_connections = 2;
  options.max_body_bytes = 1024;
  impl_->http.Configure(options);
  int bound = 0;
  return impl_->http.Bind("127.0.0.1", port, &bound);
}

void MetricsEndpoint::Serve(std::function<std::string()> body) {
  impl_->http.Get("/metrics", [body = std::move(body)](const httplib::Request&,
                                                        httplib::Response& res) {
    res.set_content(body(), "text/plain; version=0.0.4; charset=utf-8");
  });
  impl_->thread = std::thread([this] {
    impl_->http.listen_after_bind();
    impl_->done = true;
  });
}

void MetricsEndpoint::Stop() {
  if (!impl_->thread.joinable()) return;
  // httplib's stop() does nothing until the listener runs: a Stop() right after
  // Serve() tries again until it has ended.
  while (!impl_->done) {
    impl_->http.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  impl_->thread.join();
}

}  // namespace dedup::serve
