// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "serve/server.h"

#include <arpa/inet.h>
#include <strings.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <thread>

#include "core/duration.h"
#include "core/printable.h"
#include "core/redact.h"
#include "core/uri.h"
#include "serve/bytes.h"
#include "serve/impl.h"

namespace dedup::serve {

bool IsLoopback(const std::string& host) {
  if (host == "localhost" || host == "::1" || host == "[::1]") return true;
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
  return false;
}

namespace {

// An RFC 9110 field name: a token (no whitespace, no separators).
bool IsFieldName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) &&
        std::string_view("!#$%&'*+-.^_`|~").find(c) == std::string_view::npos) {
      return false;
    }
  }
  return true;
}

// Without a token (serve on loopback), a web page the operator visits can send
// requests to it too. Refused: a request from another origin to one of dedup's
// own routes that could change state, and any request to dedup's own routes (not
// a proxied one: the application behind has its own rules) whose Host does not
// name loopback (a DNS-rebound name, evil.example -> 127.0.0.1, is same-origin for the
// browser). With a token, the token is the guard (the page's cookie is
// SameSite=Strict and its writes carry a header no cross-site form can send), and
// a TLS reverse proxy in front may present any Origin and Host. Empty when the
// request may go on, else why not.
std::string BrowserRefusal(const httplib::Request& req, bool has_token, int* status) {
  if (has_token) return "";
  const std::string host = req.get_header_value("Host");
  // The one host:port grammar (core/uri.h); a Host it cannot read is not loopback.
  StatusOr<internal::HostPort> hp = internal::ParseHostPort(host, "Host");
  if (!host.empty() && !(hp.ok() && IsLoopback(Lower(hp->host)))) {
    *status = 421;
    return "Host '" + Shown(host) +
           "' is not a loopback name: without --auth-token-file, serve answers only "
           "requests addressed to 127.0.0.1, [::1] or localhost (DNS rebinding)";
  }
  if (req.method == "GET" || req.method == "HEAD") return "";
  *status = 403;
  static const char* kFix =
      ": to allow it, give serve a token with --auth-token-file and send it with the request";
  // Scheme and host compare case-insensitively, as the Host check above does.
  if (req.has_header("Origin") && Lower(req.get_header_value("Origin")) != "http://" + Lower(host)) {
    return "a request from the origin '" +
           Shown(req.get_header_value("Origin")) +
           "' may not change state here (cross-origin request, no token)" + kFix;
  }
  const std::string site = req.get_header_value("Sec-Fetch-Site");
  if (site == "cross-site" || site == "same-site") {
    return "a " + site + " request from a browser may not change state here (no token)" + kFix;
  }
  return "";
}

// The route a request took, as a metrics label and a log word: a fixed set,
// never the key or anything else a client chooses.
std::string RouteOf(const std::string& base, const httplib::Request& req, bool proxy) {
  const std::string& p = req.path;
  // A head cpp-httplib refused itself (its 400, 414): no path was read.
  if (p.empty()) return "other";
  if (proxy && p != base && p.rfind(base + "/", 0) != 0) return "proxy";
  const std::string rest = p.substr(base.size());
  if (rest == "/" || rest.empty()) return "page";
  if (rest.rfind("/assets/", 0) == 0) return "asset";
  if (rest == "/metrics") return "metrics";
  if (rest == "/healthz") return "healthz";
  if (rest == "/v1/info") return "info";
  if (rest == "/v1/keys") return "scan";
  if (rest.rfind("/v1/keys/", 0) == 0) {
    for (const char* op : {"claim", "extend", "complete", "release"}) {
      const std::string suffix = std::string("/") + op;
      if (rest.size() > suffix.size() &&
          rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) == 0 &&
          req.method == "POST") {
        return op;
      }
    }
    return req.method == "DELETE" ? "forget" : "inspect";
  }
  return "other";
}

// Hides a form or multipart Content-Type from cpp-httplib before it reads the
// body (see RequestContext::hidden_content_type), keeping it in `hidden`. The
// request is the server's own object, handed to the pre-routing handler as
// const: changing its headers there is how the body read that follows is kept raw.
void HideFormContentType(const httplib::Request& req, std::vector<std::string>* hidden) {
  hidden->clear();
  bool form = false;
  auto [first, last] = req.headers.equal_range("Content-Type");
  for (auto it = first; it != last; ++it) {
    const std::string v = Lower(it->second);
    form = form || v.rfind("multipart/form-data", 0) == 0 ||
           v.rfind("application/x-www-form-urlencoded", 0) == 0;
  }
  if (!form) return;
  for (auto it = first; it != last; ++it) hidden->push_back(it->second);
  const_cast<httplib::Request&>(req).headers.erase("Content-Type");
}

}  // namespace

RequestContext& RequestContexts::Begin(const httplib::Request& req) {
  std::lock_guard lock(mu_);
  return map_[&req] = RequestContext{};
}

const RequestContext* RequestContexts::Find(const httplib::Request& req) const {
  std::lock_guard lock(mu_);
  auto it = map_.find(&req);
  return it == map_.end() ? nullptr : &it->second;
}

std::optional<RequestContext> RequestContexts::Take(const httplib::Request& req) {
  std::lock_guard lock(mu_);
  auto it = map_.find(&req);
  if (it == map_.end()) return std::nullopt;
  std::optional<RequestContext> out(std::move(it->second));
  map_.erase(it);
  return out;
}

size_t RequestContexts::size() const {
  std::lock_guard lock(mu_);
  return map_.size();
}

std::vector<std::string_view> CookiePairs(std::string_view header) {
  std::vector<std::string_view> out;
  while (!header.empty()) {
    size_t end = header.find(';');
    std::string_view part = header.substr(0, end);
    header = end == std::string_view::npos ? std::string_view() : header.substr(end + 1);
    while (!part.empty() && (part.front() == ' ' || part.front() == '\t')) part.remove_prefix(1);
    while (!part.empty() && (part.back() == ' ' || part.back() == '\t')) part.remove_suffix(1);
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

std::string Shown(std::string_view text, size_t max_bytes) {
  return internal::Printable(text.substr(0, max_bytes));
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

int64_t HostNowMillis() { return Clock::System()->NowMillis(); }

Status ValidateServeOptions(const ServeOptions& o) {
  if (o.host.empty()) return Status::InvalidArgument("--listen: no address");
  if (o.port < 0 || o.port > 65535) {
    return Status::InvalidArgument("--listen: port must be 0 to 65535, got " +
                                   std::to_string(o.port));
  }
  if (!o.auth_token.empty() && o.auth_token.size() < 16) {
    return Status::InvalidArgument("--auth-token-file: the token must be at least 16 characters");
  }
  for (char c : o.auth_token) {
    if (c <= ' ' || c == 0x7f || c == ';' || c == ',') {
      return Status::InvalidArgument(
          "--auth-token-file: the token must be printable ASCII without spaces, ';' or ','");
    }
  }
  // A malformed address ("[::1", "[::1]x", "[nope]") is named as such, not as an
  // address that is not loopback (which suggested a token would make it work).
  if (o.host.find_first_of("[]") != std::string::npos) {
    in6_addr a6{};
    const bool bracketed = o.host.size() > 2 && o.host.front() == '[' && o.host.back() == ']';
    const std::string inside = bracketed ? o.host.substr(1, o.host.size() - 2) : "";
    if (!bracketed || inet_pton(AF_INET6, inside.c_str(), &a6) != 1) {
      return Status::InvalidArgument("--listen: malformed address '" + o.host +
                                     "': write an IPv6 address in brackets, [::1]:8077");
    }
  }
  if (!IsLoopback(o.host) && o.auth_token.empty()) {
    return Status::InvalidArgument("--listen " + o.host +
                                   " is not a loopback address: give --auth-token-file too");
  }
  if (!o.proxy.empty() && o.proxy.rfind("http://", 0) != 0) {
    // Nothing after the ':' of another scheme is shown: "u:PASSWORD" given
    // where the URL belongs.
    const std::optional<std::string_view> scheme = internal::UriScheme(o.proxy);
    if (!scheme) {
      return Status::InvalidArgument(
          "--proxy: give the application as http://HOST:PORT (the value given has no scheme)");
    }
    // "localhost:3000": a host and port, http:// left out.
    const std::string_view after = std::string_view(o.proxy).substr(scheme->size() + 1);
    if (!after.empty() && after.find_first_not_of("0123456789") == std::string_view::npos) {
      return Status::InvalidArgument(
          "--proxy: give the application as http://HOST:PORT (the value given has no scheme: "
          "write http://" + o.proxy + ")");
    }
    if (*scheme != "http") {
      return Status::InvalidArgument("--proxy: give the application as http://HOST:PORT (scheme " +
                                     internal::SchemeForMessage(*scheme) + " is not http)");
    }
    return Status::InvalidArgument("--proxy: give the application as http://HOST:PORT, got '" +
                                   internal::RedactUri(o.proxy) + "'");
  }
  if (o.lease <= Millis(0) || o.lease > kMaxDuration) {
    return Status::InvalidArgument("--lease must be > 0 and at most 10 years");
  }
  // Extended every lease/3 while the application works: a few ms cannot be kept
  // (a concurrent repeat would be forwarded while the first still runs).
  if (!o.proxy.empty() && o.lease < Millis(1000)) {
    return Status::InvalidArgument("--lease must be at least 1s in proxy mode (it is extended "
                                   "every lease/3 while the application works), got " +
                                   std::to_string(o.lease.count()) + "ms");
  }
  if (o.retention <= Millis(0) || o.retention > kMaxDuration) {
    return Status::InvalidArgument("--retention must be > 0 and at most 10 years");
  }
  if (o.max_response_bytes > kMaxResultBytes / 4 * 3 - 16 * 1024) {
    return Status::InvalidArgument("--max-response-bytes: at most " +
                                   std::to_string(kMaxResultBytes / 4 * 3 - 16 * 1024) +
                                   " (a recorded response is stored base64-encoded in a result)");
  }
  if (o.max_body_bytes < 1024) return Status::InvalidArgument("--max-body-bytes: at least 1024");
  if (o.threads < 1 || o.threads > 1024) {
    return Status::InvalidArgument("--threads must be 1 to 1024");
  }
  if (o.max_connections != 0 && (o.max_connections < o.threads || o.max_connections > 16384)) {
    return Status::InvalidArgument("--max-connections must be at least --threads (" +
                                   std::to_string(o.threads) + ") and at most 16384, got " +
                                   std::to_string(o.max_connections));
  }
  const int max_connections =
      o.max_connections != 0 ? o.max_connections : std::max(256, o.threads);
  if (o.max_waiting_connections < 0 || o.max_waiting_connections > max_connections) {
    return Status::InvalidArgument(
        "--max-waiting-connections must be 1 to --max-connections (" +
        std::to_string(max_connections) + "), or 0 for the default, got " +
        std::to_string(o.max_waiting_connections));
  }
  if (o.header_timeout <= Millis(0) || o.header_timeout > kMaxDuration) {
    return Status::InvalidArgument("--header-timeout must be > 0 and at most 10 years, got " +
                                   std::to_string(o.header_timeout.count()) + "ms");
  }
  if (o.body_timeout <= Millis(0) || o.body_timeout > kMaxDuration) {
    return Status::InvalidArgument("--body-timeout must be > 0 and at most 10 years, got " +
                                   std::to_string(o.body_timeout.count()) + "ms");
  }
  if (o.response_timeout <= Millis(0) || o.response_timeout > kMaxDuration) {
    return Status::InvalidArgument("--response-timeout must be > 0 and at most 10 years, got " +
                                   std::to_string(o.response_timeout.count()) + "ms");
  }
  if (o.key_prefix.size() >= kMaxKeyBytes) {
    return Status::InvalidArgument("--key-prefix is longer than a key may be");
  }
  return Status::Ok();
}

Server::Impl::Impl(Store* s, ServeOptions options) : store(s), o(std::move(options)) {
  base = o.proxy.empty() ? "" : "/_dedup";
}

Server::Impl::~Impl() = default;

std::string Server::Impl::Redact(std::string text) const {
  if (o.secret_to_redact.empty()) return text;
  for (const std::string& secret : {o.secret_to_redact, PercentEncode(o.secret_to_redact)}) {
    for (size_t at = text.find(secret); at != std::string::npos; at = text.find(secret, at)) {
      text.replace(at, secret.size(), "***");
      at += 3;
    }
  }
  return text;
}

void Server::Impl::SendJson(httplib::Response& res, int status,
                            const nlohmann::json& body) const {
  res.status = status;
  // Not redacted: records, keys, results and names are data, not messages, and
  // hold no URI (/v1/info's store is Describe(), redacted where it is made). A
  // password that is also a word ("dedup") would change them.
  res.set_content(body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/json");
}

void Server::Impl::SendProblem(httplib::Response& res, int status, const std::string& title,
                               const std::string& detail) const {
  res.status = status;
  // The message alone: the rest is the answer's own words.
  nlohmann::json j = {{"type", "about:blank"}, {"title", title}, {"status", status},
                      {"detail", Redact(detail)}};
  res.set_content(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                  "application/problem+json");
}

void Server::Impl::SendStatus(httplib::Response& res, const Status& s) const {
  int http = 500;
  switch (s.code()) {
    case StatusCode::kInvalidArgument: http = 400; break;
    case StatusCode::kNotFound: http = 404; break;
    case StatusCode::kUnavailable: http = 503; break;
    case StatusCode::kDeadlineExceeded: http = 504; break;
    case StatusCode::kUnauthenticated: http = 401; break;
    case StatusCode::kPermissionDenied: http = 403; break;
    case StatusCode::kResourceExhausted: http = 429; break;
    case StatusCode::kFailedPrecondition: http = 503; break;
    default: http = 500;
  }
  if (s.retryable()) res.set_header("Retry-After", "1");
  SendProblem(res, http, std::string(StatusCodeName(s.code())), s.message());
}

bool Server::Impl::HasToken(const httplib::Request& req, bool allow_cookie) const {
  if (o.auth_token.empty()) return true;
  // The scheme in any case (RFC 9110 11.1): "bearer T" was refused with 401.
  const std::string bearer = req.get_header_value("Authorization");
  if (bearer.size() > 7 && strncasecmp(bearer.c_str(), "Bearer ", 7) == 0 &&
      ConstantTimeEquals(bearer.substr(7), o.auth_token)) {
    return true;
  }
  if (req.has_header("Dedup-Token") &&
      ConstantTimeEquals(req.get_header_value("Dedup-Token"), o.auth_token)) {
    return true;
  }
  if (!allow_cookie) return false;
  // The page's cookie; state-changing calls must also carry the page's header,
  // which a cross-site form cannot send (SameSite=Strict already keeps the cookie
  // from cross-site requests in current browsers).
  if (req.method != "GET" && req.method != "HEAD" &&
      req.get_header_value("X-Requested-With") != "dedup-page") {
    return false;
  }
  const std::string cookies = req.get_header_value("Cookie");
  for (std::string_view part : CookiePairs(cookies)) {
    if (part.substr(0, 12) == "dedup_token=" &&
        ConstantTimeEquals(std::string(part.substr(12)), o.auth_token)) {
      return true;
    }
  }
  return false;
}

metrics::Counter* Server::Impl::Outcome(const std::string& name, const std::string& help,
                                        const std::string& label, const std::string& value) {
  return registry.GetCounter(name, help, {{label, value}});
}

StatusOr<std::unique_ptr<Server>> Server::Create(Store* store, ServeOptions options) {
  if (store == nullptr) return Status::InvalidArgument("serve: no store");
  DEDUP_RETURN_IF_ERROR(ValidateServeOptions(options));
  auto impl = std::make_unique<Impl>(store, std::move(options));
  Impl& s = *impl;
  s.registry.AddBuildInfo(s.o.version);

  // A connection holds a thread until it closes: slow or idle clients must not
  // hold every thread (connection_pool.h, docs/SERVE.md "Slow clients").
  const int max_connections =
      s.o.max_connections != 0 ? s.o.max_connections : std::max(256, s.o.threads);
  // A head larger than the header bound allows, with room for the request line
  // and the spaces a client may put around values, is refused before it is
  // parsed. Read and write timeouts and keep-alive: HttpServer::Configure.
  HttpServerOptions http;
  http.deadlines.header_timeout = s.o.header_timeout;
  http.deadlines.body_timeout = s.o.body_timeout;
  http.deadlines.response_timeout = s.o.response_timeout;
  http.deadlines.max_head_bytes = s.o.max_header_bytes + 16 * 1024;
  http.threads = static_cast<size_t>(s.o.threads);
  http.max_connections = static_cast<size_t>(max_connections);
  http.max_waiting = static_cast<size_t>(s.o.max_waiting_connections);
  http.max_body_bytes = s.o.max_body_bytes;
  s.http.Configure(http);

  // Before the body is read: header bounds, then the token.
  s.http.set_pre_routing_handler([&s](const httplib::Request& req, httplib::Response& res) {
    RequestContext& ctx = s.contexts.Begin(req);
    ctx.start = std::chrono::steady_clock::now();
    HideFormContentType(req, &ctx.hidden_content_type);
    size_t bytes = req.target.size();
    for (const auto& [k, v] : req.headers) bytes += k.size() + v.size() + 4;
    if (req.headers.size() > s.o.max_header_count || bytes > s.o.max_header_bytes) {
      s.SendProblem(res, 431, "Request Header Fields Too Large",
                    "at most " + std::to_string(s.o.max_header_count) + " header fields and " +
                        std::to_string(s.o.max_header_bytes) + " bytes of headers");
      return httplib::Server::HandlerResponse::Handled;
    }
    // RFC 9112 5.1: whitespace between a field name and its colon is refused with
    // 400. cpp-httplib keeps it in the name ("Dedup-Fence "), so the proxy did not
    // see its own header there, and a lenient application trims it and does.
    for (const auto& [k, v] : req.headers) {
      if (IsFieldName(k)) continue;
      s.SendProblem(res, 400, "Bad Request",
                    "header field name '" + Shown(k) +
                        "' is malformed (no whitespace before the colon, RFC 9112 5.1)");
      return httplib::Server::HandlerResponse::Handled;
    }
    // A '%' not followed by two hex digits (RFC 3986 2.1) was taken as the
    // byte itself: /v1/keys/a%/claim and /v1/keys/a%25/claim named one key.
    // The API's own routes only; the proxy hands the target on as sent.
    if (s.o.proxy.empty() || req.target.rfind("/_dedup/", 0) == 0) {
      const std::string& t = req.target;
      for (size_t i = t.find('%'); i != std::string::npos; i = t.find('%', i + 1)) {
        if (i + 2 < t.size() && std::isxdigit(static_cast<unsigned char>(t[i + 1])) &&
            std::isxdigit(static_cast<unsigned char>(t[i + 2]))) {
          continue;
        }
        s.SendProblem(res, 400, "Bad Request",
                      "the request target has a '%' at byte " + std::to_string(i) +
                          " that is not followed by two hex digits (RFC 3986 2.1: write '%25' "
                          "for a percent sign)");
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    // RFC 9110 5.5: a field value with a CR, LF or NUL is refused (or each
    // replaced with SP before forwarding). cpp-httplib ends a header line at LF
    // only and keeps a bare CR in the value, and an application behind the proxy
    // whose parser ends lines at a bare CR too (Python's does) read what followed
    // as a header line of its own (a forged Dedup-Fence).
    for (const auto& [k, v] : req.headers) {
      if (v.find_first_of(std::string_view("\r\n\0", 3)) == std::string::npos) continue;
      s.SendProblem(res, 400, "Bad Request",
                    "header field '" + Shown(k) +
                        "' holds a CR, LF or NUL in its value (RFC 9110 5.5)");
      return httplib::Server::HandlerResponse::Handled;
    }
    const bool proxied = s.proxy && req.path != s.base && req.path.rfind(s.base + "/", 0) != 0;
    if (proxied) {
      // The application's own Authorization header passes through; dedup's token
      // travels in Dedup-Token.
      if (!s.o.auth_token.empty() && !(req.has_header("Dedup-Token") &&
                                       ConstantTimeEquals(req.get_header_value("Dedup-Token"),
                                                          s.o.auth_token))) {
        s.SendProblem(res, 401, "Unauthorized", "this proxy needs its token in Dedup-Token");
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    }
    int refused = 0;
    if (const std::string why = BrowserRefusal(req, !s.o.auth_token.empty(), &refused);
        !why.empty()) {
      s.SendProblem(res, refused, refused == 421 ? "Misdirected Request" : "Forbidden", why);
      return httplib::Server::HandlerResponse::Handled;
    }
    // The page can be opened once as /?token=T: the token moves into an HttpOnly
    // cookie and the browser is sent to / without it.
    if (!s.o.auth_token.empty() && req.method == "GET" && req.has_param("token") &&
        (req.path == s.base + "/" || req.path == s.base)) {
      if (ConstantTimeEquals(req.get_param_value("token"), s.o.auth_token)) {
        // For dedup's own paths only: in proxy mode the application behind must
        // never see the token.
        res.set_header("Set-Cookie", "dedup_token=" + s.o.auth_token +
                                         "; HttpOnly; SameSite=Strict; Path=" + s.base + "/");
        res.set_redirect(s.base + "/", 303);
        return httplib::Server::HandlerResponse::Handled;
      }
    }
    if (req.path == s.base + "/healthz") return httplib::Server::HandlerResponse::Unhandled;
    if (!s.HasToken(req, /*allow_cookie=*/true)) {
      res.set_header("WWW-Authenticate", "Bearer realm=\"dedup\"");
      s.SendProblem(res, 401, "Unauthorized",
                    "give the token as 'Authorization: Bearer T' (or open the page as /?token=T)");
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });

  // Per request: a count by route and status class, a latency histogram by route,
  // and a log line. Neither carries the key.
  s.http.set_logger([&s](const httplib::Request& req, const httplib::Response& res) {
    const std::string route = RouteOf(s.base, req, s.proxy != nullptr);
    s.registry
        .GetCounter("dedup_serve_requests_total", "HTTP requests answered, by route and status.",
                    {{"route", route}, {"code", std::to_string(res.status)}})
        ->Inc();
    const std::optional<RequestContext> ctx = s.contexts.Take(req);
    if (!ctx) return;  // never routed: cpp-httplib answered its head itself
    s.registry
        .GetHistogram("dedup_serve_request_duration_seconds",
                      "Time from routing a request to its response, by route.", {{"route", route}})
        ->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - ctx->start)
                      .count());
    if (s.o.log) s.o.log(req.method + " " + route + " " + std::to_string(res.status));
  });
  s.http.set_exception_handler(
      [&s](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "unknown error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        s.SendProblem(res, 500, "Internal Server Error", what);
      });
  // What HttpServer ended itself (http_server.h): the timeouts counted by part;
  // the answers say which flag. A request refused before it was parsed is
  // counted as route "other", since its path was not read; a body's 408 under
  // its route, by the logger.
  s.http.set_limit_handler([&s](HttpServer::Limit limit, httplib::Response* res) {
    using Limit = HttpServer::Limit;
    if (const std::string part = HttpServer::TimeoutPart(limit); !part.empty()) {
      s.registry
          .GetCounter("dedup_serve_request_timeouts_total",
                      "Requests whose head or body did not arrive within --header-timeout or "
                      "--body-timeout (answered 408, connection closed), or whose answer was "
                      "not taken within the write timeout or --response-timeout (connection "
                      "reset), by part.",
                      {{"part", part}})
          ->Inc();
    }
    if (limit == Limit::kWaitingFull || limit == Limit::kWaitingFullIdle) {
      s.registry
          .GetCounter("dedup_serve_shed_connections_total",
                      "Connections closed at once because --max-waiting-connections "
                      "connections were waiting for a request head: new ones whose head did "
                      "not come at once (answered 503), kept-alive ones after their answer.",
                      {{"state", limit == Limit::kWaitingFull ? "new" : "idle"}})
          ->Inc();
    }
    if (res == nullptr) return;  // kResponseTimeout, kWaitingFullIdle: no answer
    if (limit == Limit::kHeadTimeout) {
      s.SendProblem(*res, 408, "Request Timeout",
                    "the request head did not arrive within --header-timeout (" +
                        internal::FormatDuration(s.o.header_timeout) + ")");
    } else if (limit == Limit::kBodyTimeout) {
      s.SendProblem(*res, 408, "Request Timeout",
                    "the request body did not arrive within --body-timeout (" +
                        internal::FormatDuration(s.o.body_timeout) + ")");
      return;
    }
    s.registry
        .GetCounter("dedup_serve_requests_total", "HTTP requests answered, by route and status.",
                    {{"route", "other"}, {"code", std::to_string(res->status)}})
        ->Inc();
  });
  s.http.set_error_handler([&s](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return;  // a handler's own answer
    if (res.status == 413) {
      s.SendProblem(res, 413, "Payload Too Large",
                    "request bodies are limited to " + std::to_string(s.o.max_body_bytes) +
                        " bytes");
    } else if (res.status == 404) {
      s.SendProblem(res, 404, "Not Found", "no such route");
    } else if (res.status == 400) {
      s.SendProblem(res, 400, "Bad Request",
                    "the request could not be read (cpp-httplib refused its head or its body)");
    } else if (res.status >= 400) {
      s.SendProblem(res, res.status, "Error", "HTTP " + std::to_string(res.status));
    }
  });

  s.http.Get(s.base + "/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain");
  });
  s.http.Get(s.base + "/metrics", [&s](const httplib::Request&, httplib::Response& res) {
    // Names, labels and numbers: no message, no URI, nothing to redact.
    res.set_content(s.RenderMetrics(), "text/plain; version=0.0.4; charset=utf-8");
  });
  s.RegisterApi();
  s.RegisterPage();
  if (!s.o.proxy.empty()) {
    DEDUP_RETURN_IF_ERROR(s.SetUpProxy());
    s.RegisterProxy();
  }
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(); }

Status Server::Bind() {
  std::string host = impl_->o.host;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return impl_->http.Bind(host, impl_->o.port, &impl_->bound_port);
}

int Server::port() const { return impl_->bound_port; }

Status Server::Run() {
  if (!impl_->http.listen_after_bind()) {
    return Status::Unavailable("serve: the listener stopped with an error");
  }
  return Status::Ok();
}

void Server::Stop() { impl_->http.stop(); }

std::string Server::RenderMetrics() const { return impl_->RenderMetrics(); }

}  // namespace dedup::serve
