// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The JSON API over the SPEC operations (docs/openapi.yaml):
//
//   POST   /v1/keys/{key}/claim      201 ACQUIRED · 200 DUPLICATE (Idempotent-Replayed: true)
//                                    409 BUSY (Retry-After) · 422 MISMATCH · 410 EXHAUSTED
//   POST   /v1/keys/{key}/extend     200 OK · 412 LOST
//   POST   /v1/keys/{key}/complete   200 OK · 412 LOST
//   POST   /v1/keys/{key}/release    200 OK · 412 LOST
//   GET    /v1/keys/{key}            200 the record · 404
//   DELETE /v1/keys/{key}            200 forgotten · 404
//   GET    /v1/keys?prefix=&limit=&after=   one page of records, by key
//   GET    /v1/info                  the store (no password), version, host time
//
// {key} is percent-encoded bytes; JSON carries bytes as described in bytes.h.
// Store failures are problem+json: 400 bad argument, 503 (Retry-After) store
// unavailable, 504 deadline, 500 otherwise.

#include <algorithm>
#include <chrono>
#include <cmath>

#include "core/printable.h"
#include "core/uri.h"
#include "serve/bytes.h"
#include "serve/impl.h"

namespace dedup::serve {
namespace {

using Json = nlohmann::json;

constexpr size_t kScanCap = 10'000;  // records read per listing, before paging
constexpr size_t kMaxPage = 1'000;

// Bytes as {"<name>": text when UTF-8, "<name>_b64": base64} into j.
void PutBytes(Json& j, const std::string& name, const std::string& bytes) {
  if (IsValidUtf8(bytes)) j[name] = bytes;
  j[name + "_b64"] = Base64Encode(bytes);
}

// Reads optional bytes given as "<name>" (text) or "<name>_b64"; not both.
StatusOr<std::optional<std::string>> GetBytes(const Json& j, const std::string& name) {
  const bool text = j.contains(name), b64 = j.contains(name + "_b64");
  if (text && b64) {
    return Status::InvalidArgument("give " + name + " or " + name + "_b64, not both");
  }
  if (text) {
    if (!j[name].is_string()) return Status::InvalidArgument(name + " must be a string");
    return std::optional<std::string>(j[name].get<std::string>());
  }
  if (b64) {
    if (!j[name + "_b64"].is_string()) {
      return Status::InvalidArgument(name + "_b64 must be a string");
    }
    auto d = Base64Decode(j[name + "_b64"].get<std::string>());
    if (!d) return Status::InvalidArgument(name + "_b64 is not base64");
    return std::optional<std::string>(std::move(*d));
  }
  return std::optional<std::string>();
}


// The body as a JSON object of the fields in `known` only, each at most once: a
// misspelt field ("lease": 5000) is named, not ignored in favour of the default,
// and a repeated one ({"status":"ok","status":"failed"}) is refused, where the
// parser alone keeps the last and the client meant one of them (as a repeated
// query parameter is refused). A repeat inside a nested value is refused too.
StatusOr<Json> ParseBody(const httplib::Request& req,
                         std::initializer_list<std::string_view> known) {
  if (req.body.empty()) return Json::object();
  std::vector<std::vector<std::string>> open;  // the names of each object being read
  std::vector<std::string> names;              // the body's own, in order, repeats kept
  std::string nested_repeat;
  bool repeated = false;
  const Json::parser_callback_t note = [&](int, Json::parse_event_t ev, Json& parsed) {
    switch (ev) {
      case Json::parse_event_t::object_start:
        open.emplace_back();
        break;
      case Json::parse_event_t::object_end:
        if (open.size() == 1) names = std::move(open.back());
        if (!open.empty()) open.pop_back();
        break;
      case Json::parse_event_t::key: {
        if (open.empty() || !parsed.is_string()) break;
        std::vector<std::string>& here = open.back();
        const std::string& name = parsed.get_ref<const std::string&>();
        if (open.size() > 1 && !repeated &&
            std::find(here.begin(), here.end(), name) != here.end()) {
          repeated = true;
          nested_repeat = name;
        }
        here.push_back(name);
        break;
      }
      default:
        break;
    }
    return true;
  };
  Json j = Json::parse(req.body, note, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Status::InvalidArgument("the request body must be a JSON object");
  }
  DEDUP_RETURN_IF_ERROR(internal::CheckParamNames(names, known, {"field", "the request body"}));
  if (repeated) {
    return Status::InvalidArgument("member '" + internal::PrintableCut(nested_repeat, 64) +
                                   "' is given twice in one object of the request body "
                                   "(give it once)");
  }
  return j;
}

// The query parameters of the request's target, of those in `known` only, each
// at most once: a misspelt one (DELETE ?froce=true) is named, not ignored in
// favour of the default. Read from the target, not req.params, which cpp-httplib
// also fills from a form-encoded body (curl -d sends one).
StatusOr<httplib::Params> QueryParams(const httplib::Request& req,
                                      std::initializer_list<std::string_view> known) {
  constexpr internal::ParamPlace kQuery{"parameter", "the query string"};
  httplib::Params params;
  if (const size_t q = req.target.find('?'); q != std::string::npos) {
    const std::string query = req.target.substr(q + 1);
    httplib::detail::parse_query_text(query, params);
    // Repeats are counted from the target itself: parse_query_text drops an exact
    // repeat (?force=true&force=true), which is refused as any other repeat is.
    std::vector<std::string> given;
    for (size_t at = 0; at <= query.size();) {
      size_t end = query.find('&', at);
      if (end == std::string::npos) end = query.size();
      const std::string pair = query.substr(at, end - at);
      at = end + 1;
      if (pair.empty()) continue;
      given.push_back(httplib::detail::decode_url(pair.substr(0, pair.find('=')), true));
    }
    DEDUP_RETURN_IF_ERROR(internal::CheckParamRepeats(given, kQuery));
  }
  std::vector<std::string> names;  // each once: the repeats were checked above
  for (const auto& [name, value] : params) {
    if (names.empty() || names.back() != name) names.push_back(name);
  }
  DEDUP_RETURN_IF_ERROR(internal::CheckParamNames(names, known, kQuery));
  return params;
}

// The first value of a query parameter, or "".
std::string Param(const httplib::Params& params, const std::string& name) {
  auto it = params.find(name);
  return it == params.end() ? std::string() : it->second;
}

// A non-negative integer field, or `def` when absent.
StatusOr<int64_t> GetInt(const Json& j, const char* name, int64_t def) {
  if (!j.contains(name)) return def;
  const Json& v = j[name];
  if (!v.is_number_integer() || v.get<int64_t>() < 0) {
    return Status::InvalidArgument(std::string(name) + " must be a non-negative integer");
  }
  return v.get<int64_t>();
}

// A duration field in milliseconds, or `def` when absent: one message for every
// value that is not one (0, -5, 1.5, "30s"), naming the field and the value.
StatusOr<Millis> GetMillis(const Json& j, const char* name, int64_t def) {
  if (!j.contains(name)) return Millis(def);
  const Json& v = j[name];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || Millis(v.get<int64_t>()) > kMaxDuration) {
    return Status::InvalidArgument(std::string(name) +
                                   " must be a whole number of milliseconds from 1 to " +
                                   std::to_string(kMaxDuration.count()) + " (10 years), got " +
                                   internal::PrintableCut(v.dump(), 32));
  }
  return Millis(v.get<int64_t>());
}

StatusOr<Token> GetToken(const Json& j) {
  if (!j.contains("token") || !j["token"].is_string()) {
    return Status::InvalidArgument("token (16 hex digits, from the claim) is required");
  }
  auto t = Token::FromHex(j["token"].get<std::string>());
  if (!t) return Status::InvalidArgument("token must be 16 lower-case hex digits, not all 0");
  return *t;
}

// `result_bytes`: the size of the result (a listing reads none: ScanResult's).
Json RecordJson(const Record& r, int64_t now, bool with_result, uint64_t result_bytes) {
  Json j = Json::object();
  PutBytes(j, "key", r.key);
  j["state"] = RecordStateName(r.state);
  j["fence"] = r.fence;
  j["attempt"] = r.attempt;
  if (r.state == RecordState::kInProgress) {
    j["lease_deadline_ms"] = r.lease_deadline;
    j["lease_left_ms"] = std::max<int64_t>(0, r.lease_deadline - now);
  }
  j["retention_deadline_ms"] = r.retention_deadline;
  j["retention_left_ms"] = std::max<int64_t>(0, r.retention_deadline - now);
  if (r.state == RecordState::kCompleted) j["status"] = CompletionStatusName(r.status);
  j["has_fingerprint"] = !r.fingerprint.empty();
  j["result_bytes"] = result_bytes;
  if (with_result && r.state == RecordState::kCompleted) PutBytes(j, "result", r.result);
  return j;
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void Server::Impl::RegisterApi() {
  auto& s = *this;
  const std::string keys = base + "/v1/keys/";
  const std::string claim_help = "Claims answered through the API, by outcome.";
  auto* claim_seconds = registry.GetHistogram(
      "dedup_serve_claim_duration_seconds", "Time the store took to answer a claim.");
  auto* write_seconds = registry.GetHistogram(
      "dedup_serve_write_duration_seconds",
      "Time the store took to answer an extend, complete or release.");

  // Handlers for /v1/keys/{key}/<op>. The key is everything between.
  auto write_op = [&s, write_seconds](const std::string& op) {
    return [&s, op, write_seconds](const httplib::Request& req, httplib::Response& res) {
      if (auto q = QueryParams(req, {}); !q.ok()) return s.SendStatus(res, q.status());
      const std::string key = req.matches[1];
      auto body = op == "extend"     ? ParseBody(req, {"token", "lease_ms"})
                  : op == "complete" ? ParseBody(req, {"token", "retention_ms", "status",
                                                       "result", "result_b64"})
                                     : ParseBody(req, {"token", "retention_ms"});
      if (!body.ok()) return s.SendStatus(res, body.status());
      auto token = GetToken(*body);
      if (!token.ok()) return s.SendStatus(res, token.status());
      const auto t0 = std::chrono::steady_clock::now();
      StatusOr<WriteResult> r = Status::Internal("unreachable");
      if (op == "extend") {
        auto lease = GetMillis(*body, "lease_ms", 30'000);
        if (!lease.ok()) return s.SendStatus(res, lease.status());
        r = s.store->Extend(key, *token, *lease);
      } else if (op == "complete") {
        auto retention = GetMillis(*body, "retention_ms", 86'400'000);
        if (!retention.ok()) return s.SendStatus(res, retention.status());
        CompletionStatus cs = CompletionStatus::kOk;
        if (body->contains("status")) {
          const Json& st = (*body)["status"];
          auto parsed = st.is_string() ? ParseCompletionStatus(st.get<std::string>())
                                       : std::nullopt;
          if (!parsed || *parsed == CompletionStatus::kExhausted) {
            return s.SendStatus(res, Status::InvalidArgument("status must be \"ok\" or \"failed\""));
          }
          cs = *parsed;
        }
        auto result = GetBytes(*body, "result");
        if (!result.ok()) return s.SendStatus(res, result.status());
        r = s.store->Complete(key, *token, *retention, cs,
                              result->value_or(std::string()));
      } else {
        auto retention = GetMillis(*body, "retention_ms", 86'400'000);
        if (!retention.ok()) return s.SendStatus(res, retention.status());
        r = s.store->Release(key, *token, *retention);
      }
      write_seconds->Observe(SecondsSince(t0));
      if (!r.ok()) {
        s.registry.GetCounter("dedup_serve_writes_total",
                              "Extend, complete and release calls, by operation and result.",
                              {{"op", op}, {"result", "error"}})->Inc();
        return s.SendStatus(res, r.status());
      }
      const bool ok = *r == WriteResult::kOk;
      s.registry.GetCounter("dedup_serve_writes_total",
                            "Extend, complete and release calls, by operation and result.",
                            {{"op", op}, {"result", ok ? "ok" : "lost"}})->Inc();
      s.SendJson(res, ok ? 200 : 412, {{"result", WriteResultName(*r)}});
    };
  };

  http.Post(keys + R"(([\s\S]+)/claim)", [&s, claim_seconds, claim_help](
                                               const httplib::Request& req,
                                               httplib::Response& res) {
    if (auto q = QueryParams(req, {}); !q.ok()) return s.SendStatus(res, q.status());
    auto body = ParseBody(req, {"lease_ms", "retention_ms", "max_attempts", "fingerprint",
                                "fingerprint_b64"});
    if (!body.ok()) return s.SendStatus(res, body.status());
    ClaimRequest c;
    const std::string key = req.matches[1];
    c.key = key;
    auto lease = GetMillis(*body, "lease_ms", 30'000);
    auto retention = GetMillis(*body, "retention_ms", 86'400'000);
    auto max_attempts = GetInt(*body, "max_attempts", 0);
    auto fingerprint = GetBytes(*body, "fingerprint");
    for (const Status& st : {lease.status(), retention.status(), max_attempts.status(),
                             fingerprint.status()}) {
      if (!st.ok()) return s.SendStatus(res, st);
    }
    if (*max_attempts > UINT32_MAX) {
      return s.SendStatus(res, Status::InvalidArgument("max_attempts is too large"));
    }
    c.lease = *lease;
    c.retention = *retention;
    c.max_attempts = static_cast<uint32_t>(*max_attempts);
    const std::string fp = fingerprint->value_or(std::string());
    c.fingerprint = fp;
    const auto t0 = std::chrono::steady_clock::now();
    auto r = s.store->Claim(c);
    claim_seconds->Observe(SecondsSince(t0));
    if (!r.ok()) {
      s.Outcome("dedup_serve_claims_total", claim_help, "outcome", "error")->Inc();
      return s.SendStatus(res, r.status());
    }
    std::string outcome(ClaimOutcomeName(r->outcome));
    s.Outcome("dedup_serve_claims_total", claim_help, "outcome", Lower(outcome))->Inc();
    Json j = {{"outcome", outcome}, {"fence", r->fence}};
    switch (r->outcome) {
      case ClaimOutcome::kAcquired:
        j["token"] = r->token.ToHex();
        j["attempt"] = r->attempt;
        j["lease_ms"] = c.lease.count();
        return s.SendJson(res, 201, j);
      case ClaimOutcome::kBusy: {
        j["attempt"] = r->attempt;
        j["lease_left_ms"] = r->lease_left.count();
        const int64_t secs = std::max<int64_t>(1, (r->lease_left.count() + 999) / 1000);
        res.set_header("Retry-After", std::to_string(secs));
        return s.SendJson(res, 409, j);
      }
      case ClaimOutcome::kDuplicate:
        j["attempt"] = r->attempt;
        j["status"] = CompletionStatusName(r->status);
        PutBytes(j, "result", r->result);
        res.set_header("Idempotent-Replayed", "true");
        return s.SendJson(res, 200, j);
      case ClaimOutcome::kMismatch:
        j["detail"] = "the key was claimed with a different fingerprint";
        return s.SendJson(res, 422, j);
      case ClaimOutcome::kExhausted:
        j["attempt"] = r->attempt;
        return s.SendJson(res, 410, j);
    }
  });
  for (const char* op : {"extend", "complete", "release"}) {
    http.Post(keys + R"(([\s\S]+)/)" + op, write_op(op));
  }

  http.Get(keys + R"(([\s\S]+))", [&s](const httplib::Request& req, httplib::Response& res) {
    if (auto q = QueryParams(req, {}); !q.ok()) return s.SendStatus(res, q.status());
    auto r = s.store->Inspect(std::string(req.matches[1]));
    if (!r.ok()) return s.SendStatus(res, r.status());
    if (!r->has_value()) return s.SendProblem(res, 404, "Not Found", "no record of this key");
    s.SendJson(res, 200, RecordJson(**r, HostNowMillis(), /*with_result=*/true, (*r)->result.size()));
  });

  http.Delete(keys + R"(([\s\S]+))", [&s](const httplib::Request& req, httplib::Response& res) {
    auto q = QueryParams(req, {"force"});
    if (!q.ok()) return s.SendStatus(res, q.status());
    ForgetOptions o;
    if (q->count("force")) {
      const std::string f = Param(*q, "force");
      if (f != "true" && f != "false" && f != "1" && f != "0") {
        return s.SendStatus(res, Status::InvalidArgument("force must be true or false"));
      }
      o.force = f == "true" || f == "1";
    }
    auto count = [&s](const char* result) {
      s.Outcome("dedup_serve_forgets_total", "Records forgotten through the API or the page.",
                "result", result)->Inc();
    };
    auto r = s.store->Forget(std::string(req.matches[1]), o);
    // The refusals of a forget, with force off: the key's lease is running, or
    // the key holds no record but something else (a Redis key of another type).
    if (!r.ok() && r.status().code() == StatusCode::kFailedPrecondition) {
      count("refused");
      return s.SendProblem(res, 409, "Conflict", r.status().message());
    }
    if (!r.ok()) return s.SendStatus(res, r.status());
    count(*r ? "removed" : "absent");
    if (!*r) return s.SendProblem(res, 404, "Not Found", "no record of this key");
    s.SendJson(res, 200, {{"forgotten", true}});
  });

  http.Get(base + "/v1/keys", [&s](const httplib::Request& req, httplib::Response& res) {
    auto q = QueryParams(req, {"prefix", "limit", "after"});
    if (!q.ok()) return s.SendStatus(res, q.status());
    const std::string prefix = Param(*q, "prefix");
    size_t limit = 100;
    if (q->count("limit")) {
      // Digits only (the one count parser): strtoul took "+5" and " 5" (from
      // ?limit=%205) as 5.
      const auto v = internal::ParseCount(Param(*q, "limit"), "limit");
      if (!v.ok() || *v < 1 || *v > static_cast<long long>(kMaxPage)) {
        return s.SendStatus(res, Status::InvalidArgument("limit must be 1 to 1000"));
      }
      limit = static_cast<size_t>(*v);
    }
    // `after` given, even empty: the page after that key ("" is the cursor of a
    // page that ended with the empty key, which a stray key under the store's
    // prefix can be). Not given: the first page.
    std::string after;
    bool has_after = false;
    if (q->count("after")) {
      auto a = Base64Decode(Param(*q, "after"));
      if (!a) return s.SendStatus(res, Status::InvalidArgument("after is not a cursor"));
      after = std::move(*a);
      has_after = true;
    }
    // The listing shows no results: they are not read (up to 1 MiB each, and
    // 10,000 records a request).
    ScanOptions so;
    so.with_results = false;
    auto r = s.store->Scan(prefix, kScanCap, so);
    if (!r.ok()) return s.SendStatus(res, r.status());
    // Records and undecodable records, listed together in key order: a page
    // holds up to `limit` of both, and its cursor is the last key it shows.
    struct Listed {
      Record* rec;
      uint64_t result_bytes;
    };
    std::vector<Listed> all;
    all.reserve(r->records.size());
    for (size_t i = 0; i < r->records.size(); ++i) {
      all.push_back({&r->records[i], r->ResultBytes(i)});
    }
    std::vector<UndecodableRecord>& bad = r->undecodable;
    std::sort(all.begin(), all.end(),
              [](const Listed& a, const Listed& b) { return a.rec->key < b.rec->key; });
    std::sort(bad.begin(), bad.end(),
              [](const UndecodableRecord& a, const UndecodableRecord& b) { return a.key < b.key; });
    auto it = all.begin();
    auto bit = bad.begin();
    if (has_after) {
      it = std::upper_bound(all.begin(), all.end(), after,
                            [](const std::string& k, const Listed& l) { return k < l.rec->key; });
      bit = std::upper_bound(bad.begin(), bad.end(), after,
                             [](const std::string& k, const UndecodableRecord& u) {
                               return k < u.key;
                             });
    }
    const int64_t now = HostNowMillis();
    Json records = Json::array(), undecodable = Json::array();
    const std::string* last = nullptr;
    for (size_t n = 0; n < limit && (it != all.end() || bit != bad.end()); ++n) {
      if (bit == bad.end() || (it != all.end() && it->rec->key < bit->key)) {
        records.push_back(RecordJson(*it->rec, now, /*with_result=*/false, it->result_bytes));
        last = &it->rec->key;
        ++it;
      } else {
        Json u = Json::object();
        PutBytes(u, "key", bit->key);
        u["why"] = bit->why;
        undecodable.push_back(std::move(u));
        last = &bit->key;
        ++bit;
      }
    }
    Json j = {{"records", records},
              {"undecodable", undecodable},
              {"now_ms", now},
              {"truncated", r->size() >= kScanCap}};
    j["next"] = (it != all.end() || bit != bad.end()) && last != nullptr
                    ? Json(Base64Encode(*last, /*url=*/true))
                    : Json();
    s.SendJson(res, 200, j);
  });

  http.Get(base + "/v1/info", [&s](const httplib::Request& req, httplib::Response& res) {
    if (auto q = QueryParams(req, {}); !q.ok()) return s.SendStatus(res, q.status());
    Json j = {{"store", s.store->Describe()},
              {"version", s.o.version},
              {"now_ms", HostNowMillis()},
              {"proxy", !s.o.proxy.empty()},
              {"auth", !s.o.auth_token.empty()}};
    if (!s.o.proxy.empty()) {
      j["lease_ms"] = s.o.lease.count();
      j["retention_ms"] = s.o.retention.count();
    }
    s.SendJson(res, 200, j);
  });
}

}  // namespace dedup::serve
