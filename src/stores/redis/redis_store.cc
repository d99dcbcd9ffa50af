// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "stores/redis/redis_store.h"

#include <hiredis/hiredis.h>
#include <openssl/evp.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/redact.h"
#include "core/secret.h"
#include "core/uri.h"
#include "stores/open_backends.h"
#include "stores/redis/redis_client.h"
#include "stores/redis/redis_scripts.h"
#include "stores/redis/stream_ack.h"

namespace dedup {
namespace {

using redis::Command;
using redis::IsError;
using redis::Node;
using redis::Reply;
using redis::ReplyText;
using redis::Router;

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

std::string Sha1Hex(std::string_view body) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(body.data(), body.size(), md, &n, EVP_sha1(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

enum ScriptId : size_t {
  kClaim = 0, kExtend, kComplete, kRelease, kInspect, kCompleteAck, kNumScripts
};

struct Script {
  std::string_view name;
  std::string_view body;
  std::string sha;
};

std::vector<Script> LoadScripts() {
  static constexpr std::string_view kOrder[kNumScripts] = {"claim",   "extend",  "complete",
                                                           "release", "inspect", "complete_ack"};
  std::vector<Script> out;
  for (std::string_view name : kOrder) {
    for (const auto& e : redis::kEmbeddedScripts) {
      if (e.name == name) out.push_back({e.name, e.body, Sha1Hex(e.body)});
    }
  }
  return out;
}

const std::vector<Script>& Scripts() {
  static const std::vector<Script> scripts = LoadScripts();
  return scripts;
}

// A redirect or a reload: the command was not run and should be sent again.
bool NeedsResend(const redisReply* r) {
  if (!IsError(r)) return false;
  std::string_view e = ReplyText(r);
  return StartsWith(e, "NOSCRIPT") || StartsWith(e, "MOVED ") || StartsWith(e, "ASK ") ||
         StartsWith(e, "TRYAGAIN");
}

// "MOVED 3999 127.0.0.1:6381" → slot and address.
bool ParseRedirect(std::string_view e, uint16_t* slot, std::string* address) {
  const size_t a = e.find(' ');
  const size_t b = a == std::string_view::npos ? a : e.find(' ', a + 1);
  if (b == std::string_view::npos) return false;
  unsigned v = 0;
  auto [p, ec] = std::from_chars(e.data() + a + 1, e.data() + b, v);
  if (ec != std::errc() || v > 16383) return false;
  *slot = static_cast<uint16_t>(v);
  address->assign(e.substr(b + 1));
  return true;
}

// The canonical code for an error reply that is not a redirect.
Status ErrorReplyStatus(const std::string& where, std::string_view e) {
  const std::string msg = where + std::string(e);
  if (StartsWith(e, "NOAUTH") || StartsWith(e, "WRONGPASS")) return Status::Unauthenticated(msg);
  if (StartsWith(e, "NOPERM")) return Status::PermissionDenied(msg);
  if (StartsWith(e, "DEDUPCORRUPT") || StartsWith(e, "WRONGTYPE")) {
    return Status::DataLoss(where + "corrupt record: " + std::string(e) + " (nothing changed)");
  }
  if (StartsWith(e, "DEDUPARGS")) return Status::InvalidArgument(msg + " (nothing changed)");
  if (StartsWith(e, "OOM")) return Status::ResourceExhausted(msg);
  if (StartsWith(e, "LOADING") || StartsWith(e, "BUSY") || StartsWith(e, "CLUSTERDOWN") ||
      StartsWith(e, "READONLY") || StartsWith(e, "MASTERDOWN") || StartsWith(e, "TRYAGAIN") ||
      StartsWith(e, "MOVED") || StartsWith(e, "ASK")) {
    return Status::Unavailable(msg);
  }
  return Status::Internal(msg);
}

bool IntAt(const redisReply* r, size_t i, long long* out) {
  if (r->type != REDIS_REPLY_ARRAY || i >= r->elements ||
      r->element[i]->type != REDIS_REPLY_INTEGER) {
    return false;
  }
  *out = r->element[i]->integer;
  return true;
}

std::string StrAt(const redisReply* r, size_t i) {
  if (r->type != REDIS_REPLY_ARRAY || i >= r->elements) return {};
  return std::string(ReplyText(r->element[i]));
}

// "*", "?", "[", "]" and "\" are glob characters for SCAN MATCH.
std::string GlobEscape(std::string_view s) {
  std::string out;
  for (char c : s) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

// Record format 2, first byte: 010 version tag, has-fingerprint bit, status (2
// bits), state (2 bits). See docs/REDIS_PROTOCOL.md.
constexpr uint8_t kFormat2 = 0x40;
constexpr uint8_t kHasFp2 = 0x10;
constexpr uint8_t kInProgress2 = 1;
constexpr uint8_t kCompleted2 = 2;

// Unsigned LEB128: 7 bits per byte, least significant first, high bit = more.
void AppendVarint(std::string* s, uint64_t n) {
  while (n >= 128) {
    s->push_back(static_cast<char>((n & 127) | 128));
    n >>= 7;
  }
  s->push_back(static_cast<char>(n));
}

bool ReadVarint(std::string_view v, size_t* i, uint64_t* out) {
  uint64_t n = 0;
  for (int shift = 0; shift < 56; shift += 7) {
    if (*i >= v.size()) return false;
    const auto b = static_cast<uint8_t>(v[(*i)++]);
    n |= static_cast<uint64_t>(b & 127) << shift;
    if (b < 128) {
      // Canonical only, as record.lua: a last byte of 0 after others is padding.
      if (b == 0 && shift > 0) return false;
      *out = n;
      return true;
    }
  }
  return false;
}

class RedisStore final : public Store, public internal::StreamAckStore {
 public:
  RedisStore(const RedisStoreOptions& o, std::vector<redis::Endpoint> seeds)
      : prefix_(o.prefix), description_(o.description), cluster_(o.cluster), db_(o.db),
        endpoint_(seeds.empty() ? redis::Endpoint{} : seeds.front()),
        router_(std::move(seeds), o.cluster, MakeClientOptions(o)) {}

  // Same server: plain Redis, same database, same host (localhost = 127.0.0.1)
  // and port. A false "yes" only costs the combined XACK (it acks nothing and the
  // worker sends its own), never an ack before the completion.
  bool CanAckStreamOn(std::string_view host, int port, int db) const override {
    const auto norm = [](std::string_view h) -> std::string_view {
      return h == "localhost" || h == "::1" || h == "[::1]" ? "127.0.0.1" : h;
    };
    return !cluster_ && db == db_ && port == endpoint_.port &&
           norm(host) == norm(endpoint_.host);
  }

  Status Start() {
    DEDUP_RETURN_IF_ERROR(router_.Start());
    // Every primary must answer (and be Redis 7+) before the store is handed out.
    for (Node* n : router_.Primaries()) DEDUP_RETURN_IF_ERROR(CheckVersion(n));
    return Status::Ok();
  }

  // A claim is first tried as a plain SET … NX PX … GET carrying a fresh IN_PROGRESS
  // record (no Lua on the server: the same work as the textbook SET NX guard). A
  // nil reply means ACQUIRED; a COMPLETED record in the reply is answered here
  // (DUPLICATE / MISMATCH); any other record goes to claim.lua, which decides with
  // the server clock.
  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    DEDUP_RETURN_IF_ERROR(ValidateClaim(req));
    const Token token = Token::Random();
    std::string rkey = RedisKey(req.key);
    StatusOr<Reply> r = Exec("claim", rkey, FastClaimCommand(rkey, req, token));
    if (!r.ok()) return r.status();
    ClaimResult res;
    if (DecodeFastClaim(r->get(), req, token, &res)) return res;
    if ((*r)->type != REDIS_REPLY_STRING) return BadReply("claim");
    r = Exec("claim", rkey, ClaimCommand(rkey, req, token));
    if (!r.ok()) return r.status();
    return DecodeClaim("claim", r->get(), token);
  }

  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    for (size_t i = 0; i < reqs.size(); ++i) {
      Status s = ValidateClaim(reqs[i]);
      if (!s.ok()) return s.WithContext("batch request " + std::to_string(i));
    }
    std::vector<std::string> rkeys;
    std::vector<Command> cmds;
    std::vector<Token> tokens;
    rkeys.reserve(reqs.size());
    cmds.reserve(reqs.size());
    tokens.reserve(reqs.size());
    for (const ClaimRequest& req : reqs) {
      tokens.push_back(Token::Random());
      rkeys.push_back(RedisKey(req.key));
      cmds.push_back(FastClaimCommand(rkeys.back(), req, tokens.back()));
    }
    std::vector<Reply> replies;
    DEDUP_RETURN_IF_ERROR(ExecMany("claim batch", rkeys, cmds, &replies));
    std::vector<ClaimResult> out(reqs.size());
    std::vector<size_t> slow;
    for (size_t i = 0; i < reqs.size(); ++i) {
      const redisReply* r = replies[i].get();
      if (DecodeFastClaim(r, reqs[i], tokens[i], &out[i])) continue;
      if (IsError(r)) {
        return ErrorReplyStatus("redis " + description_ + ": claim batch: ", ReplyText(r));
      }
      if (r->type != REDIS_REPLY_STRING) return BadReply("claim batch");
      slow.push_back(i);
    }
    if (!slow.empty()) {
      std::vector<std::string> skeys;
      std::vector<Command> scmds;
      for (size_t i : slow) {
        skeys.push_back(rkeys[i]);
        scmds.push_back(ClaimCommand(rkeys[i], reqs[i], tokens[i]));
      }
      DEDUP_RETURN_IF_ERROR(ExecMany("claim batch", skeys, scmds, &replies));
      for (size_t j = 0; j < slow.size(); ++j) {
        StatusOr<ClaimResult> c = DecodeClaim("claim batch", replies[j].get(), tokens[slow[j]]);
        if (!c.ok()) return c.status();
        out[slow[j]] = std::move(c).value();
      }
    }
    return out;
  }

  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    DEDUP_RETURN_IF_ERROR(ValidateExtend(key, token, lease));
    std::string rkey = RedisKey(key);
    return Write("extend", rkey,
                 ScriptCommand(kExtend, rkey, {token.ToHex(), std::to_string(lease.count())}));
  }

  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    DEDUP_RETURN_IF_ERROR(ValidateComplete(key, token, retention, result));
    std::string rkey = RedisKey(key);
    if (internal::StreamAck* ack = internal::ScopedStreamAck::For(key);
        ack != nullptr && status == CompletionStatus::kOk && !cluster_) {
      return CompleteAck(rkey, token, retention, result, ack);
    }
    return Write("complete", rkey,
                 ScriptCommand(kComplete, rkey,
                               {token.ToHex(), std::to_string(retention.count()),
                                std::to_string(static_cast<int>(status)), std::string(result)}));
  }

  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    DEDUP_RETURN_IF_ERROR(ValidateRelease(key, token, retention));
    std::string rkey = RedisKey(key);
    return Write("release", rkey,
                 ScriptCommand(kRelease, rkey, {token.ToHex(), std::to_string(retention.count())}));
  }

  StatusOr<std::optional<Record>> Inspect(std::string_view key) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    std::string rkey = RedisKey(key);
    StatusOr<Reply> r = Exec("inspect", rkey, ScriptCommand(kInspect, rkey, {}));
    if (!r.ok()) return r.status();
    return DecodeRecord("inspect", r->get(), key);
  }

  StatusOr<bool> Forget(std::string_view key) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    std::string rkey = RedisKey(key);
    StatusOr<Reply> r = Exec("forget", rkey, Command{{"DEL", rkey}});
    if (!r.ok()) return r.status();
    if ((*r)->type != REDIS_REPLY_INTEGER) return BadReply("forget");
    return (*r)->integer > 0;
  }

  StatusOr<std::vector<Record>> Scan(std::string_view prefix, size_t limit) override {
    std::vector<Record> out;
    if (limit == 0) return out;
    const std::string pattern = GlobEscape(prefix_) + GlobEscape(prefix) + "*";
    std::set<std::string> seen;  // a migrating slot can show a key on two nodes
    for (Node* node : router_.Primaries()) {
      std::string cursor = "0";
      do {
        const Command scan{{"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"}};
        const Command* one[] = {&scan};
        std::vector<Reply> replies;
        DEDUP_RETURN_IF_ERROR(node->Pipeline(one, &replies, "scan"));
        const redisReply* r = replies[0].get();
        if (IsError(r)) return ErrorReplyStatus(Where(node, "scan"), ReplyText(r));
        if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
            r->element[1]->type != REDIS_REPLY_ARRAY) {
          return BadReply("scan");
        }
        cursor.assign(ReplyText(r->element[0]));
        std::vector<std::string> rkeys;
        std::vector<Command> cmds;
        for (size_t i = 0; i < r->element[1]->elements; ++i) {
          std::string k(ReplyText(r->element[1]->element[i]));
          if (!seen.insert(k).second) continue;
          cmds.push_back(ScriptCommand(kInspect, k, {}));
          rkeys.push_back(std::move(k));
        }
        std::vector<Reply> recs;
        DEDUP_RETURN_IF_ERROR(ExecMany("scan", rkeys, cmds, &recs));
        for (size_t i = 0; i < recs.size() && out.size() < limit; ++i) {
          StatusOr<std::optional<Record>> rec =
              DecodeRecord("scan", recs[i].get(), std::string_view(rkeys[i]).substr(prefix_.size()));
          if (!rec.ok()) return rec.status();
          if (rec->has_value()) out.push_back(std::move(**rec));
        }
        if (out.size() >= limit) return out;
      } while (cursor != "0");
    }
    return out;
  }

  std::string Describe() const override { return description_; }

 private:
  static redis::ClientOptions MakeClientOptions(const RedisStoreOptions& o) {
    redis::ClientOptions c;
    c.timeout = o.timeout;
    c.user = o.user;
    c.password = o.password;
    c.has_password = o.has_password;
    c.db = o.cluster ? 0 : o.db;
    c.pool_size = o.pool_size == 0 ? 1 : o.pool_size;
    return c;
  }

  std::string RedisKey(std::string_view key) const {
    std::string k;
    k.reserve(prefix_.size() + key.size());
    k += prefix_;
    k += key;
    return k;
  }

  static std::string Where(const Node* n, std::string_view op) {
    return "redis " + n->name() + ": " + std::string(op) + ": ";
  }

  Status BadReply(std::string_view op) const {
    return Status::Internal("redis " + description_ + ": " + std::string(op) +
                            ": unexpected reply from the server (is it Redis 7+?)");
  }

  Status CheckVersion(Node* n) {
    const Command info{{"INFO", "server"}};
    const Command* one[] = {&info};
    std::vector<Reply> replies;
    DEDUP_RETURN_IF_ERROR(n->Pipeline(one, &replies, "open"));
    if (IsError(replies[0].get())) {
      return ErrorReplyStatus(Where(n, "open: INFO"), ReplyText(replies[0].get()));
    }
    std::string_view text = ReplyText(replies[0].get());
    const size_t at = text.find("redis_version:");
    int major = 0;
    std::string version = "unknown";
    if (at != std::string_view::npos) {
      std::string_view v = text.substr(at + 14);
      v = v.substr(0, v.find_first_of("\r\n"));
      version.assign(v);
      std::from_chars(v.data(), v.data() + v.size(), major);
    }
    if (major < 7) {
      return Status::FailedPrecondition(Where(n, "open") + "needs Redis 7.0 or later, found " +
                                        version);
    }
    return Status::Ok();
  }

  static Command ScriptCommand(ScriptId id, const std::string& rkey,
                               std::initializer_list<std::string> args) {
    Command c;
    c.args.reserve(4 + args.size());
    c.args.emplace_back("EVALSHA");
    c.args.push_back(Scripts()[id].sha);
    c.args.emplace_back("1");
    c.args.push_back(rkey);
    for (const std::string& a : args) c.args.push_back(a);
    return c;
  }

  // The IN_PROGRESS record of a first claim, record format 2: flags, token, fence 1,
  // attempt 1, keep = retention, fingerprint.
  static std::string FreshRecord(const ClaimRequest& req, Token token) {
    std::string v;
    v.reserve(1 + 8 + 2 + 6 + 1 + req.fingerprint.size());
    v.push_back(static_cast<char>(kFormat2 | kInProgress2 | (req.fingerprint.empty() ? 0 : kHasFp2)));
    for (int i = 7; i >= 0; --i) v.push_back(static_cast<char>(token.value >> (8 * i)));
    v.push_back(1);  // fence
    v.push_back(1);  // attempt
    AppendVarint(&v, static_cast<uint64_t>(req.retention.count()));
    if (!req.fingerprint.empty()) {
      v.push_back(static_cast<char>(req.fingerprint.size()));
      v.append(req.fingerprint);
    }
    return v;
  }

  static Command FastClaimCommand(const std::string& rkey, const ClaimRequest& req, Token token) {
    Command c;
    c.args.reserve(7);
    c.args.emplace_back("SET");
    c.args.push_back(rkey);
    c.args.push_back(FreshRecord(req, token));
    c.args.emplace_back("NX");
    c.args.emplace_back("PX");
    c.args.push_back(std::to_string(req.lease.count() + req.retention.count()));
    c.args.emplace_back("GET");
    return c;
  }

  // The reply to FastClaimCommand. True when it settles the claim: nil (the record
  // was written: ACQUIRED) or a format-2 COMPLETED record (DUPLICATE or MISMATCH,
  // nothing written). False for anything else: error replies, and records that need
  // the server clock (claim.lua decides).
  static bool DecodeFastClaim(const redisReply* r, const ClaimRequest& req, Token token,
                              ClaimResult* out) {
    if (r->type == REDIS_REPLY_NIL) {
      *out = ClaimResult{};
      out->outcome = ClaimOutcome::kAcquired;
      out->token = token;
      out->fence = 1;
      out->attempt = 1;
      return true;
    }
    if (r->type != REDIS_REPLY_STRING) return false;
    const std::string_view v = ReplyText(r);
    if (v.size() < 11) return false;
    const auto flags = static_cast<uint8_t>(v[0]);
    const unsigned status = (flags >> 2) & 3;
    if ((flags & 0xe0) != kFormat2 || (flags & 3) != kCompleted2 || status > 2) return false;
    size_t i = 9;
    uint64_t fence = 0, attempt = 0;
    if (!ReadVarint(v, &i, &fence) || !ReadVarint(v, &i, &attempt)) return false;
    std::string_view fp;
    if (flags & kHasFp2) {
      if (i >= v.size()) return false;
      const size_t n = static_cast<uint8_t>(v[i]);
      if (n == 0 || n > kMaxFingerprintBytes || v.size() < i + 1 + n) return false;
      fp = v.substr(i + 1, n);
      i += 1 + n;
    }
    *out = ClaimResult{};
    out->fence = fence;
    out->attempt = static_cast<uint32_t>(attempt);
    if (!req.fingerprint.empty() && !fp.empty() && fp != req.fingerprint) {
      out->outcome = ClaimOutcome::kMismatch;
      return true;
    }
    out->outcome = ClaimOutcome::kDuplicate;
    out->status = static_cast<CompletionStatus>(status);
    out->result.assign(v.substr(i));
    return true;
  }

  static Command ClaimCommand(const std::string& rkey, const ClaimRequest& req, Token token) {
    return ScriptCommand(kClaim, rkey,
                         {token.ToHex(), std::to_string(req.lease.count()),
                          std::to_string(req.retention.count()), std::string(req.fingerprint),
                          std::to_string(req.max_attempts)});
  }

  // Runs one command on the node owning `rkey`, following MOVED / ASK, and loading
  // the script (EVAL) when the server answers NOSCRIPT. Other error replies are
  // returned as a status.
  StatusOr<Reply> Exec(std::string_view op, const std::string& rkey, Command cmd) {
    Node* node = router_.NodeFor(rkey);
    bool asking = false;
    Status last;
    static const Command asking_cmd{{"ASKING"}};
    std::vector<Reply> replies;
    for (int tries = 0; tries < 8; ++tries) {
      const Command* cmds[2] = {&asking_cmd, &cmd};
      DEDUP_RETURN_IF_ERROR(node->Pipeline(std::span<const Command* const>(cmds + (asking ? 0 : 1),
                                                                           asking ? 2 : 1),
                                           &replies, op));
      Reply r = std::move(replies.back());
      asking = false;
      if (!IsError(r.get())) return r;
      std::string_view e = ReplyText(r.get());
      uint16_t slot = 0;
      std::string address;
      if (StartsWith(e, "NOSCRIPT") && cmd.args[0] == "EVALSHA") {
        // The server lost its script cache (restart, failover, SCRIPT FLUSH):
        // EVAL runs the script and caches it again.
        for (const Script& s : Scripts()) {
          if (s.sha == cmd.args[1]) cmd.args[1].assign(s.body);
        }
        cmd.args[0] = "EVAL";
        return Exec(op, rkey, std::move(cmd));
      }
      if (StartsWith(e, "MOVED ") && ParseRedirect(e, &slot, &address)) {
        router_.OnMoved(slot, address);
        node = router_.NodeAt(address);
        continue;
      }
      if (StartsWith(e, "ASK ") && ParseRedirect(e, &slot, &address)) {
        node = router_.NodeAt(address);
        asking = true;
        continue;
      }
      if (StartsWith(e, "TRYAGAIN")) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20 << std::min(tries, 4)));
        continue;
      }
      return ErrorReplyStatus(Where(node, op), e);
    }
    return Status::Unavailable("redis " + node->name() + ": " + std::string(op) +
                               ": too many redirects (cluster resharding?)");
  }

  // Runs many commands, one pipeline per node, then resends on its own each one
  // answered with a redirect or NOSCRIPT. Replies are in the order of `cmds`; error
  // replies other than redirects are left for the caller.
  Status ExecMany(std::string_view op, const std::vector<std::string>& rkeys,
                  std::vector<Command>& cmds, std::vector<Reply>* replies) {
    replies->clear();
    replies->resize(cmds.size());
    std::map<Node*, std::vector<size_t>> groups;
    for (size_t i = 0; i < cmds.size(); ++i) groups[router_.NodeFor(rkeys[i])].push_back(i);
    std::vector<size_t> resend;
    for (auto& [node, idx] : groups) {
      std::vector<const Command*> ptrs;
      ptrs.reserve(idx.size());
      for (size_t i : idx) ptrs.push_back(&cmds[i]);
      std::vector<Reply> got;
      DEDUP_RETURN_IF_ERROR(node->Pipeline(ptrs, &got, op));
      for (size_t j = 0; j < idx.size(); ++j) {
        if (NeedsResend(got[j].get())) resend.push_back(idx[j]);
        (*replies)[idx[j]] = std::move(got[j]);
      }
    }
    std::sort(resend.begin(), resend.end());
    for (size_t i : resend) {
      StatusOr<Reply> r = Exec(op, rkeys[i], std::move(cmds[i]));
      if (!r.ok()) return r.status();
      (*replies)[i] = std::move(r).value();
    }
    return Status::Ok();
  }

  StatusOr<WriteResult> Write(std::string_view op, const std::string& rkey, Command cmd) {
    StatusOr<Reply> r = Exec(op, rkey, std::move(cmd));
    if (!r.ok()) return r.status();
    if ((*r)->type != REDIS_REPLY_INTEGER) return BadReply(op);
    return (*r)->integer == 1 ? WriteResult::kOk : WriteResult::kLost;
  }

  StatusOr<ClaimResult> DecodeClaim(std::string_view op, const redisReply* r, Token token) {
    if (IsError(r)) return ErrorReplyStatus("redis " + description_ + ": " + std::string(op) + ": ",
                                            ReplyText(r));
    long long outcome = 0, fence = 0, attempt = 0;
    if (!IntAt(r, 0, &outcome) || !IntAt(r, 1, &fence) || !IntAt(r, 2, &attempt) ||
        outcome < 0 || outcome > 4) {
      return BadReply(op);
    }
    ClaimResult res;
    res.outcome = static_cast<ClaimOutcome>(outcome);
    res.fence = static_cast<uint64_t>(fence);
    res.attempt = static_cast<uint32_t>(attempt);
    switch (res.outcome) {
      case ClaimOutcome::kAcquired:
        res.token = token;
        break;
      case ClaimOutcome::kBusy: {
        long long left = 0;
        if (!IntAt(r, 3, &left)) return BadReply(op);
        res.lease_left = Millis(left);
        break;
      }
      case ClaimOutcome::kDuplicate: {
        long long status = 0;
        if (!IntAt(r, 4, &status) || status < 0 || status > 2) return BadReply(op);
        res.status = static_cast<CompletionStatus>(status);
        res.result = StrAt(r, 5);
        break;
      }
      case ClaimOutcome::kMismatch:
      case ClaimOutcome::kExhausted:
        break;
    }
    return res;
  }

  StatusOr<std::optional<Record>> DecodeRecord(std::string_view op, const redisReply* r,
                                               std::string_view key) {
    if (IsError(r)) return ErrorReplyStatus("redis " + description_ + ": " + std::string(op) + ": ",
                                            ReplyText(r));
    if (r->type == REDIS_REPLY_NIL) return std::optional<Record>();
    long long state = 0, status = 0, fence = 0, attempt = 0, lease = 0, retention = 0;
    if (!IntAt(r, 0, &state) || !IntAt(r, 1, &status) || !IntAt(r, 3, &fence) ||
        !IntAt(r, 4, &attempt) || !IntAt(r, 5, &lease) || !IntAt(r, 6, &retention) ||
        r->elements != 9 || state < 1 || state > 3 || status < 0 || status > 2) {
      return BadReply(op);
    }
    std::optional<Token> token = Token::FromHex(StrAt(r, 2));
    if (!token) {
      return Status::DataLoss("redis " + description_ + ": " + std::string(op) +
                              ": corrupt record (token 0)");
    }
    Record rec;
    rec.key.assign(key);
    rec.state = static_cast<RecordState>(state);
    rec.token = *token;
    rec.fence = static_cast<uint64_t>(fence);
    rec.attempt = static_cast<uint32_t>(attempt);
    rec.lease_deadline = lease;
    rec.retention_deadline = retention;
    rec.fingerprint = StrAt(r, 7);
    rec.status = static_cast<CompletionStatus>(status);
    rec.result = StrAt(r, 8);
    return std::optional<Record>(std::move(rec));
  }

  // complete_ack.lua: complete and, only if OK, XACK the entry in `ack`, in one
  // round trip. The stream key is on this (single) server; KEYS[2] is it.
  StatusOr<WriteResult> CompleteAck(const std::string& rkey, Token token, Millis retention,
                                    std::string_view result, internal::StreamAck* ack) {
    Command c;
    c.args = {"EVALSHA",
              Scripts()[kCompleteAck].sha,
              "2",
              rkey,
              std::string(ack->stream),
              token.ToHex(),
              std::to_string(retention.count()),
              std::to_string(static_cast<int>(CompletionStatus::kOk)),
              std::string(result),
              std::string(ack->group),
              std::string(ack->entry_id)};
    ack->tried = true;
    ack->acked = false;
    StatusOr<Reply> r = Exec("complete", rkey, std::move(c));
    if (!r.ok()) return r.status();
    if ((*r)->type != REDIS_REPLY_INTEGER || (*r)->integer < 0 || (*r)->integer > 2) {
      return BadReply("complete");
    }
    ack->acked = (*r)->integer == 2;
    return (*r)->integer >= 1 ? WriteResult::kOk : WriteResult::kLost;
  }

  const std::string prefix_;
  const std::string description_;
  const bool cluster_;
  const int db_;
  const redis::Endpoint endpoint_;
  Router router_;
};

std::string Describe(const RedisStoreOptions& o) {
  std::string s = o.cluster ? "redis+cluster://" : "redis://";
  for (size_t i = 0; i < o.hosts.size(); ++i) s += (i ? "," : "") + o.hosts[i];
  if (!o.cluster && o.db != 0) s += "/" + std::to_string(o.db);
  s += "?prefix=" + o.prefix;
  return s;
}

}  // namespace

StatusOr<std::unique_ptr<Store>> OpenRedisStore(const RedisStoreOptions& options) {
  if (options.hosts.empty()) return Status::InvalidArgument("redis: no host given");
  if (options.timeout.count() <= 0) {
    return Status::InvalidArgument("redis: timeout must be positive");
  }
  std::vector<redis::Endpoint> seeds;
  for (const std::string& h : options.hosts) {
    StatusOr<redis::Endpoint> ep = redis::ParseEndpoint(h);
    if (!ep.ok()) return ep.status();
    seeds.push_back(*ep);
  }
  RedisStoreOptions o = options;
  if (o.description.empty()) o.description = Describe(o);
  auto store = std::make_unique<RedisStore>(o, std::move(seeds));
  DEDUP_RETURN_IF_ERROR(store->Start());
  return std::unique_ptr<Store>(std::move(store));
}

namespace internal {

StatusOr<std::unique_ptr<Store>> OpenRedisFromUri(const Uri& uri, const OpenOptions& /*options*/) {
  const bool cluster = uri.scheme == "redis+cluster";
  DEDUP_RETURN_IF_ERROR(uri.CheckParams({"prefix", "timeout", "pool", kPasswordFileParam}));
  if (!uri.has_authority || uri.hosts.empty()) {
    return Status::InvalidArgument("redis URI '" + uri.Redacted() +
                                   "' has no host (expected " + uri.scheme + "://HOST:PORT)");
  }
  RedisStoreOptions o;
  o.cluster = cluster;
  // Inline, password_file= or $DEDUP_REDIS_PASSWORD (core/secret.h).
  StatusOr<RedisCredentials> cred = ResolveRedisCredentials(uri);
  if (!cred.ok()) return cred.status();
  o.user = cred->user;
  o.password = cred->password;
  o.has_password = cred->has_password;
  std::string_view hosts = uri.hosts;
  while (!hosts.empty()) {
    const size_t comma = hosts.find(',');
    std::string_view h = hosts.substr(0, comma);
    if (h.empty()) return Status::InvalidArgument("redis URI has an empty host in '" + uri.hosts + "'");
    o.hosts.emplace_back(h);
    hosts = comma == std::string_view::npos ? std::string_view() : hosts.substr(comma + 1);
  }
  if (!cluster && o.hosts.size() > 1) {
    return Status::InvalidArgument("redis:// takes one host; use redis+cluster:// for a cluster, got '" +
                                   uri.hosts + "'");
  }
  if (!uri.path.empty() && uri.path != "/") {
    if (cluster) {
      return Status::InvalidArgument("redis+cluster:// takes no database path, got '" + uri.path +
                                     "'");
    }
    auto db = ParseCount(std::string_view(uri.path).substr(1), "redis: database");
    if (!db.ok()) return db.status();
    if (*db > 1'000'000) return Status::InvalidArgument("redis: database " + uri.path.substr(1) + " is too large");
    o.db = static_cast<int>(*db);
  }
  if (auto p = uri.Param("prefix")) o.prefix = *p;
  if (auto t = uri.Param("timeout")) {
    auto ms = ParseDurationMillis(*t, "redis: timeout");
    if (!ms.ok()) return ms.status();
    if (*ms <= 0) return Status::InvalidArgument("redis: timeout must be positive, got '" + *t + "'");
    o.timeout = Millis(*ms);
  }
  if (auto p = uri.Param("pool")) {
    auto n = ParseCount(*p, "redis: pool");
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > 1024) return Status::InvalidArgument("redis: pool must be 1 to 1024, got " + *p);
    o.pool_size = static_cast<size_t>(*n);
  }
  o.description = uri.Redacted();
  auto store = OpenRedisStore(o);
  // Host parsing echoes what it was given: a mistyped "redis://:PASS" makes the
  // password a host.
  if (!store.ok()) return Status(store.status().code(), RedactWords(store.status().message()));
  return store;
}

}  // namespace internal
}  // namespace dedup
