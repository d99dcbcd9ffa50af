// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The inside of Server, shared by server.cc (listener, auth, bounds, metrics),
// api.cc (/v1), page.cc (/ and its assets) and proxy.cc (proxy mode).

#ifndef DEDUP_SRC_SERVE_IMPL_H_
#define DEDUP_SRC_SERVE_IMPL_H_

#include <httplib.h>

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>
#include <string>
#include <string_view>

#include "serve/metrics.h"
#include "serve/server.h"

namespace dedup::serve {

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

class Server::Impl {
 public:
  Impl(Store* store, ServeOptions options);
  ~Impl();

  Store* store;
  ServeOptions o;
  httplib::Server http;
  metrics::Registry registry;
  // Where the API, page and metrics live: "" in API mode, "/_dedup" in proxy mode.
  std::string base;
  int bound_port = 0;
  std::unique_ptr<ProxyTarget> proxy;

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

// The Content-Type header(s) of the request being answered on this thread when
// it was a form or multipart one. cpp-httplib would parse such a body into
// req.params / req.files and leave req.body empty (multipart), or refuse it over
// 8 KiB (form-urlencoded); serve hides the header before the body is read, so
// that req.body holds the bytes as sent, and the proxy gives it back when it
// forwards. Empty otherwise.
const std::vector<std::string>& HiddenContentType();

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
