// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Proxy mode: Stripe's idempotency keys for any HTTP application, on dedup's
// claims. A request with an Idempotency-Key header is
//
//   claimed      key = key_prefix + the header's value; the fingerprint is the
//                SHA-256 of method, target, Authorization, Content-Type and body;
//   ACQUIRED  -> forwarded once, the claim heartbeated (extend every lease/3)
//                while the application works; its response (status, headers
//                but hop-by-hop, Set-Cookie, Date and Content-Length (kept for
//                a HEAD: its GET's length), and the body up to
//                max_response_bytes) is recorded with complete, then
//                sent. No answer from the application, or a 429 / 503 (retry
//                later; a gateway's 503 is an unknown outcome, as no answer is):
//                the claim is released (a retry forwards again) and the client
//                gets 502, or the 429 / 503.
//   DUPLICATE -> the recorded response, with `Idempotent-Replayed: true`;
//   BUSY      -> 409 with Retry-After (the first request is still in flight);
//   MISMATCH  -> 422 (same key, different request);
//   store error -> 503 with Retry-After, nothing forwarded (fail closed).
//
// A forwarded claimed request carries its fence in Dedup-Fence. Requests without
// the header pass through, but for hop-by-hop headers and dedup's own
// Dedup-Token, Dedup-Fence (their '_' variants too) and dedup_token cookie.

#include <cctype>
#include <condition_variable>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/printable.h"
#include "core/redact.h"
#include "core/uri.h"
#include "serve/bytes.h"
#include "serve/impl.h"

namespace dedup::serve {


namespace {

using Json = nlohmann::json;

bool IsHopByHop(const std::string& name) {
  static const char* kHop[] = {"connection", "keep-alive", "proxy-connection", "transfer-encoding",
                               "te", "trailer", "upgrade", "proxy-authorization",
                               "proxy-authenticate", "content-length"};
  const std::string lower = Lower(name);
  for (const char* h : kHop) {
    if (lower == h) return true;
  }
  return false;
}

// Headers that describe a response's body (RFC 9110 8, 8.8; RFC 9530 digests).
bool IsRepresentationHeader(const std::string& name) {
  static const char* kRepr[] = {"content-type",     "content-encoding", "content-language",
                                "content-location", "content-range",    "content-md5",
                                "content-digest",   "repr-digest",      "digest",
                                "etag",             "last-modified"};
  const std::string lower = Lower(name);
  for (const char* h : kRepr) {
    if (lower == h) return true;
  }
  return false;
}

// Headers cpp-httplib adds to a server-side request for the handler's use.
bool IsLocalPseudoHeader(const std::string& name) {
  return name == "REMOTE_ADDR" || name == "REMOTE_PORT" || name == "LOCAL_ADDR" ||
         name == "LOCAL_PORT";
}

// A header name as WSGI, CGI, PHP and Rack see it: case and '-' versus '_' do not
// matter (both become HTTP_DEDUP_FENCE). Dedup's own headers are matched in this
// form, or an underscore variant would reach the application as one of them.
std::string FieldKey(const std::string& name) {
  std::string k = Lower(name);
  for (char& c : k) c = c == '_' ? '-' : c;
  return k;
}

// A Cookie header without dedup's own dedup_token cookie (a browser that opened
// the page before it was set for /_dedup/ only may still send it everywhere);
// nullopt when it has none, and the line goes on as sent.
std::optional<std::string> WithoutDedupCookie(const std::string& cookies) {
  std::string out;
  bool ours = false;
  for (std::string_view part : CookiePairs(cookies)) {
    if (part.substr(0, 12) == "dedup_token=") {
      ours = true;
      continue;
    }
    if (!out.empty()) out += "; ";
    out += part;
  }
  if (!ours) return std::nullopt;
  return out;
}

// The key an Idempotency-Key value names: the draft's Structured Field string
// ("..." whose only escapes are \" and \\) unescaped, or a bare value (as Stripe
// takes it) as is. Nullopt, and why in *why, for a quoted value with another
// escape or a bare quote, and for a bare value with a comma: frameworks join
// repeated header lines with ", ", and an application that splits them would take
// another key than ours.
std::optional<std::string> IdempotencyKeyOf(const std::string& value, std::string* why) {
  // A control byte (a TAB inside the value: a field's value may hold one) in
  // either form: a key a client could not have meant.
  for (char c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      *why = "Idempotency-Key: the value holds a control byte (a tab?)";
      return std::nullopt;
    }
  }
  if (!value.empty() && value.front() == '"' && (value.size() < 2 || value.back() != '"')) {
    *why = "Idempotency-Key: a value that begins with a quote is a Structured Field string "
           "and must end with one";
    return std::nullopt;
  }
  if (value.size() < 2 || value.front() != '"' || value.back() != '"') {
    if (value.find(',') == std::string::npos) return value;
    *why = "Idempotency-Key: a bare value holds no comma (repeated header lines are joined "
           "with \", \", so it may name two keys); quote it as a Structured Field string";
    return std::nullopt;
  }
  std::string key;
  for (size_t i = 1; i + 1 < value.size(); ++i) {
    char c = value[i];
    if (c == '\\' && i + 2 < value.size() && (value[i + 1] == '"' || value[i + 1] == '\\')) {
      c = value[++i];
    } else if (c == '\\' || c == '"') {
      *why = "Idempotency-Key: a quoted value (a Structured Field string) may escape only "
             "\\\" and \\\\, and holds no bare quote";
      return std::nullopt;
    }
    key += c;
  }
  return key;
}

struct Upstream {
  int status = 0;
  httplib::Headers headers;
  std::string body;
};

// cpp-httplib names its errors by their enumerator ("Connection"): said in words.
std::string DescribeError(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "could not connect (nothing listening, or unreachable)";
    case httplib::Error::ConnectionTimeout: return "connecting timed out (5 s)";
    case httplib::Error::Read:
      return "no whole response: the connection closed, failed or timed out (60 s) while "
             "reading it";
    case httplib::Error::Write: return "the request could not be sent (connection failed)";
    case httplib::Error::Canceled: return "the request was cancelled";
    default: return "cpp-httplib error " + httplib::to_string(e);
  }
}

// Sends the request on to the application, with the Content-Type serve hid from
// cpp-httplib given back (RequestContext::hidden_content_type) and the claim's
// fence in Dedup-Fence when it has one (0: not claimed). Unavailable when no
// response came.
StatusOr<Upstream> Forward(ProxyTarget& t, const httplib::Request& req,
                           const std::vector<std::string>& hidden_content_type,
                           uint64_t fence) {
  std::unique_ptr<httplib::Client> cli;
  {
    std::lock_guard lock(t.mu);
    if (!t.idle.empty()) {
      cli = std::move(t.idle.back());
      t.idle.pop_back();
    }
  }
  if (!cli) {
    cli = std::make_unique<httplib::Client>(t.host, t.port);
    cli->set_keep_alive(true);
    cli->set_tcp_nodelay(true);  // headers and body go out in separate writes
    cli->set_url_encode(false);  // the target goes on as the client sent it
    cli->set_decompress(false);  // and the body comes back as the application sent it
    cli->set_connection_timeout(std::chrono::seconds(5));
    cli->set_read_timeout(std::chrono::seconds(60));
    cli->set_write_timeout(std::chrono::seconds(60));
  }
  httplib::Request fwd;
  fwd.method = req.method;
  fwd.path = req.target;
  for (const auto& [k, v] : req.headers) {
    if (IsHopByHop(k) || IsLocalPseudoHeader(k) || FieldKey(k) == "dedup-token" ||
        FieldKey(k) == "dedup-fence") {
      continue;
    }
    if (Lower(k) == "cookie") {
      if (auto kept = WithoutDedupCookie(v)) {
        if (!kept->empty()) fwd.headers.emplace(k, *kept);
        continue;
      }
    }
    fwd.headers.emplace(k, v);
  }
  for (const std::string& v : hidden_content_type) fwd.headers.emplace("Content-Type", v);
  // The application's fencing token: a run that a takeover superseded (this proxy
  // killed mid-request, a retry after the lease) has a lower fence than the next.
  if (fence != 0) fwd.headers.emplace("Dedup-Fence", std::to_string(fence));
  fwd.body = req.body;
  auto res = cli->send(fwd);
  if (!res) {
    // The application's address is not in it: the 502 goes to the proxy's clients.
    return Status::Unavailable("the application did not answer: " + DescribeError(res.error()));
  }
  Upstream up{res->status, res->headers, std::move(res->body)};
  {
    std::lock_guard lock(t.mu);
    if (t.idle.size() < 64) t.idle.push_back(std::move(cli));
  }
  return up;
}

// A header value of the application's as it may go on to the client. cpp-httplib
// (0.11) percent-decodes every header value its client reads, and an application's
// "%0D%0A" became a line break in ours: a header line of its own (or a second
// answer) to the client. CR, LF and NUL are replaced with SP (RFC 9110 5.5); the
// decoding itself cannot be undone here (docs/SERVE.md).
std::string FieldValue(std::string v) {
  for (char& c : v) {
    if (c == '\r' || c == '\n' || c == '\0') c = ' ';
  }
  return v;
}

// Copies an application response (live or recorded) into ours. To a HEAD
// (`head`), the application's Content-Length goes on too: the length its GET
// would have (RFC 9110 9.3.2), where the empty body would make cpp-httplib
// say 0.
void SendUpstream(const Upstream& up, httplib::Response& res, bool head) {
  res.status = up.status;
  std::string content_type, length;
  for (const auto& [kk, vv] : up.headers) {
    const std::string k = FieldValue(kk);
    const std::string v = FieldValue(vv);
    if (head && length.empty() && Lower(k) == "content-length" && !v.empty() &&
        v.find_first_not_of("0123456789") == std::string::npos) {
      length = v;
    }
    if (IsHopByHop(k)) continue;
    if (Lower(k) == "content-type") {
      content_type = v;
      continue;
    }
    res.headers.emplace(k, v);
  }
  if (!length.empty()) res.set_header("Content-Length", length);
  if (!content_type.empty()) {
    res.set_content(up.body, content_type);
  } else {
    res.body = up.body;
  }
}

// The recorded form of a response, kept as the claim's result. The answer to a
// HEAD (`head`) keeps its Content-Length: it is the length its GET would have,
// not its own (empty) body's, and a replay without it said 0.
std::string EncodeRecording(const Upstream& up, size_t max_body, bool head) {
  Json headers = Json::array();
  for (const auto& [k, v] : up.headers) {
    const std::string l = Lower(k);
    const bool kept_length = head && l == "content-length";
    if ((IsHopByHop(k) && !kept_length) || l == "set-cookie" || l == "date") continue;
    // JSON holds text: bytes that are not UTF-8 went in as U+FFFD, and the
    // replay differed from the live answer ("caf\xe9" came back "caf\xef\xbf\xbd").
    // Such a field is kept as base64, byte for byte.
    if (internal::IsValidUtf8(k) && internal::IsValidUtf8(v)) {
      headers.push_back({k, v});
    } else {
      headers.push_back({{"name_b64", Base64Encode(k)}, {"value_b64", Base64Encode(v)}});
    }
  }
  Json j = {{"v", 1}, {"status", up.status}, {"headers", headers}};
  auto dump = [&j] { return j.dump(-1, ' ', false, Json::error_handler_t::replace); };
  // Within the store's bound on a result, or complete would be refused and the key
  // left in progress (a retry 409, then the application run again): the body is
  // dropped first, then the headers (the status is always kept).
  if (up.body.size() <= max_body) {
    j["body_b64"] = Base64Encode(up.body);
    std::string text = dump();
    if (text.size() <= kMaxResultBytes) return text;
    j.erase("body_b64");
  }
  j["body_omitted_bytes"] = up.body.size();
  std::string text = dump();
  if (text.size() <= kMaxResultBytes) return text;
  j["headers"] = Json::array();
  j["headers_omitted"] = true;
  return dump();
}

std::optional<Upstream> DecodeRecording(const std::string& text) {
  Json j = Json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || j.value("v", 0) != 1 || !j.contains("status")) {
    return std::nullopt;
  }
  Upstream up;
  up.status = j["status"].get<int>();
  const bool body_kept = j.contains("body_b64");
  for (const auto& h : j["headers"]) {
    std::string name, value;
    if (h.is_object()) {  // bytes that are not UTF-8 (EncodeRecording)
      auto n = Base64Decode(h.value("name_b64", std::string()));
      auto v = Base64Decode(h.value("value_b64", std::string()));
      if (!n || !v) return std::nullopt;
      name = std::move(*n);
      value = std::move(*v);
    } else {
      name = h[0].get<std::string>();
      value = h[1].get<std::string>();
    }
    // Without the body, the headers that describe it (its type, coding, validators)
    // would describe the empty body sent instead: a cache or a client would take
    // it for the complete representation.
    if (!body_kept && IsRepresentationHeader(name)) continue;
    up.headers.emplace(std::move(name), std::move(value));
  }
  if (j.value("headers_omitted", false)) {
    up.headers.emplace("Dedup-Replay-Headers", "omitted, over the recording bound");
  }
  if (body_kept) {
    auto b = Base64Decode(j["body_b64"].get<std::string>());
    if (!b) return std::nullopt;
    up.body = std::move(*b);
  } else {
    up.headers.emplace("Dedup-Replay-Body",
                       "omitted: " + std::to_string(j.value("body_omitted_bytes", 0)) +
                           " bytes, over the recording bound");
  }
  return up;
}

}  // namespace

// Extends the claims of every request in flight, each every lease/3, from one
// thread: a request adds its claim before forwarding and removes it after, and
// neither waits for another thread to be scheduled (a thread per request made
// the proxy's p99 hostage to the scheduler on a loaded machine).
class Heartbeats {
 public:
  explicit Heartbeats(Store* store) : store_(store), thread_([this] { Loop(); }) {}
  ~Heartbeats() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  uint64_t Add(std::string key, Token token, Millis lease) {
    std::lock_guard lock(mu_);
    const uint64_t id = ++next_id_;
    claims_[id] = Claim{std::move(key), token, lease, Clock::now() + lease / 3, false};
    cv_.notify_all();
    return id;
  }
  // Stops extending; true when an extend answered LOST meanwhile.
  bool Remove(uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = claims_.find(id);
    const bool lost = it != claims_.end() && it->second.lost;
    if (it != claims_.end()) claims_.erase(it);
    return lost;
  }

 private:
  using Clock = std::chrono::steady_clock;
  struct Claim {
    std::string key;
    Token token;
    Millis lease;
    Clock::time_point due;
    bool lost;
  };
  void Loop() {
    std::unique_lock lock(mu_);
    while (!stop_) {
      auto next = Clock::time_point::max();
      std::vector<std::pair<uint64_t, Claim>> due;
      const auto now = Clock::now();
      for (auto& [id, c] : claims_) {
        if (c.lost) continue;
        if (c.due <= now) {
          due.emplace_back(id, c);
          c.due = now + c.lease / 3;
        }
        next = std::min(next, c.due);
      }
      if (!due.empty()) {
        lock.unlock();
        std::vector<uint64_t> lost;
        for (const auto& [id, c] : due) {
          auto r = store_->Extend(c.key, c.token, c.lease);
          if (r.ok() && *r == WriteResult::kLost) lost.push_back(id);
        }
        lock.lock();
        for (uint64_t id : lost) {
          if (auto it = claims_.find(id); it != claims_.end()) it->second.lost = true;
        }
        continue;
      }
      if (next == Clock::time_point::max()) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, next);
      }
    }
  }

  Store* store_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  uint64_t next_id_ = 0;
  std::map<uint64_t, Claim> claims_;
  std::thread thread_;
};

namespace {

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Whether a connection to `target` reaches a listener bound to `listen`: the same
// name, or a loopback name where serve listens on loopback or on every address.
bool SameHostForListener(std::string listen, std::string target) {
  auto unbracket = [](std::string h) {
    if (h.size() > 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
    for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return h;
  };
  listen = unbracket(listen);
  target = unbracket(target);
  if (listen == target) return true;
  // "localhost" is 127.0.0.1 or ::1 (127.0.0.2 is another address).
  auto localhost = [](const std::string& a, const std::string& b) {
    return a == "localhost" && (b == "127.0.0.1" || b == "::1");
  };
  const bool any = listen == "0.0.0.0" || listen == "::" || listen.empty();
  return (any && IsLoopback(target)) || localhost(listen, target) || localhost(target, listen);
}

}  // namespace

ProxyTarget::ProxyTarget() = default;
ProxyTarget::~ProxyTarget() = default;

Status Server::Impl::SetUpProxy() {
  // http://HOST:PORT[/]
  std::string rest = o.proxy.substr(7);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  auto t = std::make_unique<ProxyTarget>();
  // Echoed redacted: "http://user:pass@h" holds a password.
  if (rest.empty() || rest.find('@') != std::string::npos) {
    return Status::InvalidArgument("--proxy: give the application as http://HOST:PORT, got '" +
                                   internal::RedactUri(o.proxy) + "'");
  }
  // Each request's own path and query are forwarded: a base path or query here
  // would be dropped, so it is named rather than read as part of the port.
  if (rest.find_first_of("/?#") != std::string::npos) {
    return Status::InvalidArgument(
        "--proxy: give the application as http://HOST:PORT, without a path, query or "
        "fragment (each request's own are forwarded), got '" + internal::RedactUri(o.proxy) +
        "'");
  }
  // The one host grammar (core/uri.h): it never echoes a port that is not a number
  // ("http://user:pass", the "@host" forgotten).
  StatusOr<internal::HostPort> hp = internal::ParseHostPort(rest, "--proxy");
  if (!hp.ok()) return hp.status();
  t->host = hp->host;
  if (hp->port != 0) t->port = hp->port;
  // Pointed at serve's own listener, every request would be forwarded to itself
  // until every connection thread waits on another: refused at start.
  if (t->port == o.port && SameHostForListener(o.host, t->host)) {
    return Status::InvalidArgument("--proxy " + internal::RedactUri(o.proxy) +
                                   " is this server's own --listen address: give the "
                                   "application's");
  }
  t->heartbeats = std::make_unique<Heartbeats>(store);
  proxy = std::move(t);
  return Status::Ok();
}

void Server::Impl::RegisterProxy() {
  auto& s = *this;
  const std::string help = "Requests through the idempotency proxy, by outcome.";
  auto* upstream_seconds = registry.GetHistogram(
      "dedup_proxy_upstream_duration_seconds",
      "Time the application took to answer a forwarded request.");
  auto* claim_seconds = registry.GetHistogram(
      "dedup_proxy_claim_duration_seconds", "Time the store took to answer the proxy's claim.");

  auto handler = [&s, help, upstream_seconds, claim_seconds](const httplib::Request& req,
                                                             httplib::Response& res) {
    auto count = [&](const char* outcome) { s.Outcome("dedup_proxy_requests_total", help,
                                                      "outcome", outcome)->Inc(); };
    // dedup's own paths (/_dedup, /_dedup/...) never reach the app
    if (req.path == s.base || req.path.rfind(s.base + "/", 0) == 0) {
      return s.SendProblem(res, 404, "Not Found", "no such route under " + s.base + "/");
    }
    // Made by the pre-routing handler, which every routed request passes.
    const RequestContext* ctx = s.contexts.Find(req);
    if (ctx == nullptr) {
      return s.SendProblem(res, 500, "Internal Server Error", "a request without its context");
    }
    const std::vector<std::string>& hidden_content_type = ctx->hidden_content_type;
    // An application on WSGI, CGI, PHP or Rack reads Idempotency_Key as
    // Idempotency-Key: a key the proxy did not claim under, or a second one.
    for (const auto& [k, v] : req.headers) {
      if (FieldKey(k) == "idempotency-key" && Lower(k) != "idempotency-key") {
        count("bad_key");
        return s.SendProblem(res, 400, "Bad Request",
                             "header '" + Shown(k) +
                                 "': many application frameworks read it as Idempotency-Key; "
                                 "send the key as Idempotency-Key only");
      }
    }
    if (!req.has_header("Idempotency-Key")) {
      const auto t0 = std::chrono::steady_clock::now();
      auto up = Forward(*s.proxy, req, hidden_content_type, /*fence=*/0);
      upstream_seconds->Observe(SecondsSince(t0));
      if (!up.ok()) {
        count("upstream_error");
        return s.SendProblem(res, 502, "Bad Gateway", up.status().message());
      }
      count("pass_through");
      return SendUpstream(*up, res, req.method == "HEAD");
    }
    // The draft's header is a Structured Field string ("..."); a bare token, as
    // Stripe takes it, is accepted too. One per request: the application gets
    // every line, and may take another than ours.
    if (req.get_header_value_count("Idempotency-Key") != 1) {
      count("bad_key");
      return s.SendProblem(res, 400, "Bad Request",
                           "give one Idempotency-Key per request, not " +
                               std::to_string(req.get_header_value_count("Idempotency-Key")));
    }
    std::string why;
    const std::optional<std::string> parsed =
        IdempotencyKeyOf(req.get_header_value("Idempotency-Key"), &why);
    if (!parsed) {
      count("bad_key");
      return s.SendProblem(res, 400, "Bad Request", why);
    }
    const std::string& idem = *parsed;
    if (idem.empty() || s.o.key_prefix.size() + idem.size() > kMaxKeyBytes) {
      count("bad_key");
      return s.SendProblem(res, 400, "Bad Request",
                           "Idempotency-Key must be 1 to " +
                               std::to_string(kMaxKeyBytes - s.o.key_prefix.size()) +
                               " bytes");
    }
    const std::string key = s.o.key_prefix + idem;
    // Authorization and Content-Type are part of the request: the same key sent
    // with another client's credentials was answered with the first client's
    // recorded response (its data), and the same bytes as another type replayed
    // too. Now such a request is a mismatch (422). A field's value holds no LF.
    const std::string fingerprint =
        Sha256(req.method + '\n' + req.target + "\nauthorization:" +
               req.get_header_value("Authorization") +
               "\ncontent-type:" + req.get_header_value("Content-Type") + '\n' + req.body);
    ClaimRequest c;
    c.key = key;
    c.lease = s.o.lease;
    c.retention = s.o.retention;
    c.fingerprint = fingerprint;
    const auto t0 = std::chrono::steady_clock::now();
    auto claim = s.store->Claim(c);
    claim_seconds->Observe(SecondsSince(t0));
    if (!claim.ok()) {
      count("store_error");
      res.set_header("Retry-After", "1");
      return s.SendProblem(res, 503, "Service Unavailable",
                           "the idempotency store could not decide: " + claim.status().ToString());
    }
    switch (claim->outcome) {
      case ClaimOutcome::kBusy: {
        count("busy");
        const int64_t secs = std::max<int64_t>(1, (claim->lease_left.count() + 999) / 1000);
        res.set_header("Retry-After", std::to_string(secs));
        return s.SendProblem(res, 409, "Conflict",
                             "a request with this Idempotency-Key is still being processed");
      }
      case ClaimOutcome::kMismatch:
        count("mismatch");
        return s.SendProblem(res, 422, "Unprocessable Content",
                             "this Idempotency-Key was used with a different request "
                             "(method, target, Authorization, Content-Type or body)");
      case ClaimOutcome::kExhausted:
        count("exhausted");
        return s.SendProblem(res, 410, "Gone", "this Idempotency-Key ran out of attempts");
      case ClaimOutcome::kDuplicate: {
        auto up = DecodeRecording(claim->result);
        if (!up) {
          count("store_error");
          return s.SendProblem(res, 500, "Internal Server Error",
                               "the recorded response of this key cannot be read");
        }
        count("replayed");
        SendUpstream(*up, res, req.method == "HEAD");
        res.set_header("Idempotent-Replayed", "true");
        return;
      }
      case ClaimOutcome::kAcquired:
        break;
    }
    const Token token = claim->token;
    const auto t1 = std::chrono::steady_clock::now();
    StatusOr<Upstream> up = Status::Internal("unreachable");
    bool lost = false;
    const uint64_t beat = s.proxy->heartbeats->Add(key, token, s.o.lease);
    up = Forward(*s.proxy, req, hidden_content_type, claim->fence);
    lost = s.proxy->heartbeats->Remove(beat);
    upstream_seconds->Observe(SecondsSince(t1));
    if (!up.ok()) {
      // Not answered: the effect may or may not have happened; give the key back
      // so that the client's retry forwards again (as a worker crash would).
      (void)s.store->Release(key, token, s.o.retention);
      count("upstream_error");
      return s.SendProblem(res, 502, "Bad Gateway", up.status().message());
    }
    if (up->status == 429 || up->status == 503) {
      // "Not processed, retry later" (RFC 6585, RFC 9110): recorded, it would be
      // replayed to every retry of the key for the whole retention. The key is
      // given back instead, so that the retry is forwarded. A 503 may also come
      // from a gateway in front of the application after the effect: the same
      // unknown outcome as no answer at all, which releases too (the fence is
      // there for it; docs/SERVE.md).
      auto released = lost ? StatusOr<WriteResult>(WriteResult::kLost)
                           : s.store->Release(key, token, s.o.retention);
      if (!released.ok() || *released != WriteResult::kOk) {
        // The key stays in progress until its lease runs out (store error), or
        // another owner has it (lost): the retry may get 409 meanwhile.
        count("unreleased");
        if (s.o.log) {
          s.o.log("proxy: claim not released after the application's " +
                  std::to_string(up->status) + ": " +
                  s.Redact(released.ok() ? std::string("lease lost")
                                         : released.status().ToString()));
        }
      } else {
        count("released");
      }
      return SendUpstream(*up, res, req.method == "HEAD");
    }
    auto done = lost ? StatusOr<WriteResult>(WriteResult::kLost)
                     : s.store->Complete(key, token, s.o.retention, CompletionStatus::kOk,
                                         EncodeRecording(*up, s.o.max_response_bytes,
                                                         req.method == "HEAD"));
    if (!done.ok() || *done != WriteResult::kOk) {
      // The application answered but the answer could not be recorded (lease
      // lost to a takeover, or the store failed): the client still gets it.
      count("unrecorded");
      if (s.o.log) {
        s.o.log("proxy: response not recorded: " +
                s.Redact(done.ok() ? std::string("lease lost") : done.status().ToString()));
      }
    } else {
      count("forwarded");
    }
    SendUpstream(*up, res, req.method == "HEAD");
  };
  const std::string any = R"([\s\S]*)";
  http.Get(any, handler);
  http.Post(any, handler);
  http.Put(any, handler);
  http.Patch(any, handler);
  http.Delete(any, handler);
  http.Options(any, handler);
}

}  // namespace dedup::serve
