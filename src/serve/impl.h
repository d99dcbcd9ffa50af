// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The inside of Server, shared by server.cc (listener, auth, bounds, metrics),
// api.cc (/v1), page.cc (/ and its assets) and proxy.cc (proxy mode).

#ifndef DEDUP_SRC_SERVE_IMPL_H_
#define DEDUP_SRC_SERVE_IMPL_H_

#include <httplib.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "serve/http_server.h"
#include "serve/metrics.h"
#include "serve/server.h"

namespace dedup::serve {

// "localhost", "::1" / "[::1]" or an address of 127.0.0.0/8 (as written: the
// caller lower-cases a name it took from a request).
bool IsLoopback(const std::string& host);

class Heartbeats;  // proxy.cc

// Proxy mode: the application behind the proxy (proxy.cc).
struct ProxyTarget {
  ProxyTarget();
  ~ProxyTarget();
  std::string host;
  int port = 80;
  // Idle keep-alive connections to the application, reused across requests.
  std::mutex mu;
  std::vector<std::unique_ptr<httplib::Client>> idle;
  // Extends the claims of requests in flight.
  std::unique_ptr<Heartbeats> heartbeats;
};

// What serve learns of a request before cpp-httplib reads its body, for the
// handler and the logger that answer the same request.
struct RequestContext {
  // When routing began (the latency histogram's start).
  std::chrono::steady_clock::time_point start;
  // The Content-Type header(s) when it was a form or multipart one. cpp-httplib
  // would parse such a body into req.params / req.files and leave req.body empty
  // (multipart), or refuse it over 8 KiB (form-urlencoded); serve hides the header
  // before the body is read, so that req.body holds the bytes as sent, and the
  // proxy gives it back when it forwards. Empty otherwise.
  std::vector<std::string> hidden_content_type;
};

// The context of each request in flight, found by the request's own object: the
// pre-routing handler makes it (Begin), the route's handler reads it (Find), the
// logger, which cpp-httplib calls last for every request, takes it away (Take).
// cpp-httplib 0.11 (Debian 12) gives a request no room of our own
// (Response::user_data came in 0.33), and a thread-local would carry one
// request's context into the next one its thread answers.
class RequestContexts {
 public:
  // A fresh context for `req`.
  RequestContext& Begin(const httplib::Request& req);
  // Null when `req` was never routed (cpp-httplib refused its head itself).
  const RequestContext* Find(const httplib::Request& req) const;
  std::optional<RequestContext> Take(const httplib::Request& req);
  size_t size() const;

 private:
  mutable std::mutex mu_;
  // Node-based: an entry stays put while other requests come and go.
  std::unordered_map<const httplib::Request*, RequestContext> map_;
};

class Server::Impl {
 public:
  Impl(Store* store, ServeOptions options);
  ~Impl();

  Store* store;
  ServeOptions o;
  HttpServer http;
  metrics::Registry registry;
  // Where the API, page and metrics live: "" in API mode, "/_dedup" in proxy mode.
  std::string base;
  int bound_port = 0;
  std::unique_ptr<ProxyTarget> proxy;
  RequestContexts contexts;

  // ---- responses
  void SendJson(httplib::Response& res, int status, const nlohmann::json& body) const;
  // application/problem+json (RFC 9457), as the Idempotency-Key draft suggests.
  void SendProblem(httplib::Response& res, int status, const std::string& title,
                   const std::string& detail) const;
  // A store or argument failure, mapped to its HTTP status (400, 503, 504, 500).
  void SendStatus(httplib::Response& res, const Status& s) const;
  // The text with the store's password replaced by "***".
  std::string Redact(std::string text) const;

  // ---- auth: true when no token is configured, or the request carries it.
  bool HasToken(const httplib::Request& req, bool allow_cookie) const;

  // ---- metrics used by more than one file
  metrics::Counter* Outcome(const std::string& name, const std::string& help,
                            const std::string& label, const std::string& value);

  void RegisterApi();
  void RegisterPage();
  Status SetUpProxy();
  void RegisterProxy();
  std::string RenderMetrics() const { return registry.Render(); }
};

// The pairs of a Cookie header ("a=1; b=2" -> "a=1", "b=2"), without the spaces
// around them; the one cookie splitter of serve (the page's token, the proxy's
// filter of it).
std::vector<std::string_view> CookiePairs(std::string_view header);

// Text a client sent (a header, a parameter's name) as shown in an error or a
// log: printable, at most max_bytes of it.
std::string Shown(std::string_view text, size_t max_bytes = 128);

// ASCII lower case (header names and media types).
std::string Lower(std::string s);

// Millisecond wall time on this host (for "lease left" in the API and page).
int64_t HostNowMillis();

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_IMPL_H_
