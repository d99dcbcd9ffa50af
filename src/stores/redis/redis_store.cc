// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "stores/redis/redis_store.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstring>
#include <limits>
#include <functional>
#include <optional>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/duration.h"
#include "core/printable.h"
#include "core/state_machine.h"
#include "core/uri.h"
#include "stores/open_backends.h"
#include "redis/client.h"
#include "redis/options.h"
#include "redis/scripts.h"
#include "stores/redis/record_format.h"
#include "stores/redis/redis_scripts.h"

namespace dedup {
namespace {

using redis::Command;
using redis::ErrorReplyStatus;
using redis::IsError;
using redis::Node;
using redis::Reply;
using redis::ReplyText;
using redis::WithoutScriptLocation;

enum ScriptId : size_t {
  kClaim = 0, kExtend, kComplete, kRelease, kInspect, kCompleteAck, kForget, kCompleteBatch,
  kCompleteAckStream, kUnclaim, kNumScripts
};

// The embedded scripts, in ScriptId order.
const redis::ScriptSet& Scripts() {
  static const redis::ScriptSet scripts = [] {
    static constexpr std::string_view kOrder[kNumScripts] = {
        "claim", "extend", "complete", "release", "inspect", "complete_ack", "forget",
        "complete_batch", "complete_ack_stream", "unclaim"};
    std::vector<std::pair<std::string_view, std::string_view>> list;
    for (std::string_view name : kOrder) {
      for (const auto& e : redis::kEmbeddedScripts) {
        if (e.name == name) list.emplace_back(e.name, e.body);
      }
    }
    return redis::ScriptSet(list);
  }();
  return scripts;
}

const std::string& Sha(ScriptId id) { return Scripts().all()[id].sha; }

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

using redis::kCompleted2;
using redis::kFormat2;
using redis::kHasFp2;
using redis::kInProgress2;

class RedisStore final : public Store {
 public:
  RedisStore(redis::ConnectionOptions c, std::string prefix, std::string description,
             std::function<void(const std::string&)> on_warning)
      : prefix_(std::move(prefix)), description_(std::move(description)), cluster_(c.cluster),
        db_(c.db), endpoint_(c.endpoints.front()),
        server_identity_(internal::RedisServerIdentity(endpoint_.host, endpoint_.port, db_)),
        on_warning_(std::move(on_warning)), client_(std::move(c), &Scripts()) {}

  // Same server: plain Redis, same database, same host (localhost = 127.0.0.1)
  // and port, and a Redis stream. A false "yes" only costs the combined XACK (it
  // acks nothing, and the caller acks the usual way), never an ack before the
  // completion.
  bool CanCompleteWithAck(const BrokerAck& ack) const override {
    return !cluster_ && ack.kind == "redis-stream" && ack.server == server_identity_;
  }

  // complete_ack.lua: complete and, only if OK, XACK the entry, in one round
  // trip. The stream key is on this (single) server; KEYS[2] is it. Other
  // statuses are plain completions (a failed one is dead-lettered first).
  StatusOr<AckedWrite> CompleteWithAck(std::string_view key, Token token, Millis retention,
                                       CompletionStatus status, std::string_view result,
                                       const BrokerAck& ack) override {
    DEDUP_RETURN_IF_ERROR(ValidateComplete(key, token, retention, status, result));
    if (!CanCompleteWithAck(ack)) return Store::CompleteWithAck(key, token, retention, status, result, ack);
    std::string rkey = RedisKey(key);
    if (status != CompletionStatus::kOk) {
      StatusOr<WriteResult> w = Complete(key, token, retention, status, result);
      if (!w.ok()) return w.status();
      return AckedWrite{*w, false};
    }
    Command c;
    c.args = {"EVALSHA",
              Sha(kCompleteAck),
              "2",
              rkey,
              std::string(ack.target),
              token.ToHex(),
              std::to_string(retention.count()),
              std::to_string(static_cast<int>(CompletionStatus::kOk)),
              std::string(result),
              std::string(ack.group),
              std::string(ack.id)};
    StatusOr<Reply> r = Exec("complete", rkey, std::move(c));
    if (!r.ok()) return r.status();
    if ((*r)->type != REDIS_REPLY_INTEGER || (*r)->integer < 0 || (*r)->integer > 2) {
      return BadReply("complete");
    }
    return AckedWrite{(*r)->integer >= 1 ? WriteResult::kOk : WriteResult::kLost,
                      (*r)->integer == 2};
  }

  // Every call of this store (its connections') waits at most `grace` for a
  // reply from now on, and a claim whose reply is lost is not tried again
  // (ClaimAgain): a try on a new connection would wait the grace once more.
  void StopWaiting(Millis grace) override { client_.StopWaiting(grace); }

  Status Start() {
    DEDUP_RETURN_IF_ERROR(client_.Start());
    // Every primary must answer (and be Redis 7+) before the store is handed out.
    // Then the ACL user must be allowed what dedup sends (a clear error now, not
    // after the first handler ran), and the settings that can double messages are
    // reported, once per primary.
    for (Node* n : client_.router().Primaries()) {
      std::string info;
      DEDUP_RETURN_IF_ERROR(CheckVersion(n, &info));
      DEDUP_RETURN_IF_ERROR(CheckPermissions(n));
      CheckSettings(n, info);
    }
    return Status::Ok();
  }

  // A claim is first tried as a plain SET … NX PX … carrying a fresh IN_PROGRESS
  // record (no Lua on the server: the same work as the textbook SET NX guard). A
  // reply that says it was written means ACQUIRED; any other record goes to
  // claim.lua, which decides with the server clock. While claims meet records (a
  // second since one did), the SET also carries GET, so that a COMPLETED record
  // comes back with it and is answered here (DUPLICATE / MISMATCH) without a
  // second round trip; without GET the server does one lookup less per claim
  // (docs/DESIGN.md, "Redis claims"). Either way the answers are the same.
  //
  // A claim whose commands may have reached the server and got no answer (the
  // client never sends them again itself) is tried again here with the same token,
  // always with GET: an IN_PROGRESS record under that token is the earlier try's
  // and answers ACQUIRED, never BUSY on the caller's own claim, and nothing runs
  // twice (the SET … NX finds the record and writes nothing). See ClaimAgain.
  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    DEDUP_RETURN_IF_ERROR(ValidateClaim(req));
    const Token token = Token::Random();
    const int64_t start = redis::SteadyMillis();
    bool lost = false;  // some try was sent and got no answer
    for (int tries = 1;; ++tries) {
      bool sent = false;
      StatusOr<ClaimResult> r = ClaimOnce(req, token, tries > 1, &sent);
      if (r.ok()) return r;
      if (!ClaimAgain(r.status(), sent, tries, start, req.lease)) {
        return lost && !sent ? EarlierTryLost(r.status(), req.lease) : r.status();
      }
      lost = lost || sent;
    }
  }

  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    DEDUP_RETURN_IF_ERROR(ValidateClaimBatch(reqs));
    BatchScratch& scratch = Scratch();
    redis::CommandBuffer& cmds = scratch.cmds;
    std::vector<Reply>& replies = scratch.replies;
    std::vector<Token>& tokens = scratch.tokens;
    std::vector<size_t>& pending = scratch.pending;  // requests not answered yet
    std::vector<size_t>& slow = scratch.slow;        // met a record: claim.lua decides
    std::vector<size_t>& left = scratch.left;        // no answer this try
    tokens.clear();
    pending.clear();
    for (size_t i = 0; i < reqs.size(); ++i) {
      tokens.push_back(Token::Random());
      pending.push_back(i);
    }
    std::vector<ClaimResult> out(reqs.size());
    const int64_t start = redis::SteadyMillis();
    Millis lease = kMaxDuration;
    for (const ClaimRequest& q : reqs) lease = std::min(lease, q.lease);
    // Per request: a try sent it and got no answer, and no later try answered it
    // (its record may be on the server, under a token nobody will hold).
    std::vector<bool>& unknown = scratch.unknown;
    std::vector<bool>& got_none = scratch.got_none;  // per command of one ExecMany
    unknown.assign(reqs.size(), false);
    // Every try sends the claims that have no answer yet, with the same tokens
    // (ClaimAgain); the nodes that answered keep their answers. A batch that fails
    // in the end releases the claims it made (ReleaseAcquired).
    for (int tries = 1;; ++tries) {
      const bool with_get = tries > 1 || WithGet();
      cmds.Clear();
      for (size_t i : pending) AppendFastClaim(&cmds, reqs[i], tokens[i], with_get);
      bool sent = false;
      Status failed = client_.ExecMany("claim batch", cmds, &replies, &sent, &got_none);
      slow.clear();
      left.clear();
      // Every reply is read, also past a bad one: the claims answered after it
      // were made on the server all the same, and are released with the others.
      std::optional<Status> bad_fast;
      for (size_t j = 0; j < pending.size(); ++j) {
        const size_t i = pending[j];
        const redisReply* r = replies[j].get();
        if (r == nullptr) {  // its node failed
          if (got_none[j]) unknown[i] = true;
          left.push_back(i);
          continue;
        }
        unknown[i] = false;  // answered with the same token: an earlier try is known
        if (DecodeFastClaim(r, reqs[i], tokens[i], with_get, &out[i])) continue;
        if (IsError(r)) {
          if (!bad_fast) bad_fast = ClaimError("claim batch", reqs[i].key, ReplyText(r));
          continue;
        }
        if (!FoundRecord(r, with_get)) {
          if (!bad_fast) bad_fast = BadReply("claim batch");
          continue;
        }
        slow.push_back(i);
      }
      if (bad_fast) {
        ReleaseAcquired(reqs, tokens, out);
        return EarlierTriesLost(*bad_fast, lease, reqs, unknown, sent);
      }
      if (!slow.empty()) {
        std::vector<std::string> skeys;
        std::vector<Command> scmds;
        for (size_t i : slow) {
          skeys.push_back(RedisKey(reqs[i].key));
          scmds.push_back(ClaimCommand(skeys.back(), reqs[i], tokens[i]));
        }
        std::vector<Reply> sreplies;
        bool slow_sent = false;
        Status s = ExecMany("claim batch", skeys, scmds, &sreplies, &slow_sent, &got_none);
        sent = sent || slow_sent;
        if (failed.ok()) failed = s;
        std::optional<Status> bad;
        for (size_t j = 0; j < slow.size(); ++j) {
          if (j >= sreplies.size() || sreplies[j] == nullptr) {
            if (got_none[j]) unknown[slow[j]] = true;
            left.push_back(slow[j]);  // claim.lua may have run: the next try sees
            continue;
          }
          StatusOr<ClaimResult> c =
              DecodeClaim("claim batch", reqs[slow[j]].key, sreplies[j].get(), tokens[slow[j]]);
          if (!c.ok()) {
            if (!bad) bad = c.status();
            continue;  // the others may have acquired: they are released below
          }
          out[slow[j]] = std::move(c).value();
        }
        if (bad) {
          ReleaseAcquired(reqs, tokens, out);
          return EarlierTriesLost(*bad, lease, reqs, unknown, sent);
        }
      }
      if (left.empty()) return out;
      if (failed.ok()) failed = Status::Internal(description_ +
                                                 ": claim batch: a reply is missing");
      if (!ClaimAgain(failed, sent, tries, start, lease)) {
        ReleaseAcquired(reqs, tokens, out);
        return EarlierTriesLost(failed, lease, reqs, unknown, sent);
      }
      std::sort(left.begin(), left.end());  // in request order, as the batch is
      pending.swap(left);
    }
  }

  // One try of Claim with `token`; `*sent` as redis::Client::Exec says.
  StatusOr<ClaimResult> ClaimOnce(const ClaimRequest& req, Token token, bool force_get,
                                  bool* sent) {
    const bool with_get = force_get || WithGet();
    // Kept per thread: a claim allocates no command buffer.
    thread_local redis::CommandBuffer cmd;
    cmd.Clear();
    AppendFastClaim(&cmd, req, token, with_get);
    // Error replies stay replies (as in ClaimBatch): ClaimError names the key sent.
    StatusOr<Reply> r = client_.Call("claim", cmd, sent);
    if (!r.ok()) return r.status();
    if (IsError(r->get())) return ClaimError("claim", req.key, ReplyText(r->get()));
    ClaimResult res;
    if (DecodeFastClaim(r->get(), req, token, with_get, &res)) return res;
    if (!FoundRecord(r->get(), with_get)) return BadReply("claim");
    std::string rkey = RedisKey(req.key);
    r = client_.Call("claim", rkey, ClaimCommand(rkey, req, token), sent);
    if (!r.ok()) return r.status();
    return DecodeClaim("claim", req.key, r->get(), token);
  }

  // Whether a claim (or the unanswered part of a batch) that failed with `s` after
  // `tries` tries is tried once more, after a short wait: only when the failure may
  // have left its record on the server (`sent`: the commands were written, no
  // answer came), as the same token then finds that record and answers ACQUIRED.
  // A call that reached no server (down, refusing) fails at once as before. At
  // most kClaimTries tries, and none that would start past the lease from the
  // first try: the caller holds the lease from its call on.
  // Nor once the store was told to stop waiting (StopWaiting; its Aborted is not
  // retryable either).
  bool ClaimAgain(const Status& s, bool sent, int tries, int64_t start, Millis lease) {
    if (!s.retryable() || !sent || tries >= kClaimTries || client_.stopped_waiting()) return false;
    const int64_t wait = int64_t{20} << (tries - 1);
    if (redis::SteadyMillis() + wait >= start + lease.count()) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(wait));
    return true;
  }
  static constexpr int kClaimTries = 3;

  // The failure of a try that sent nothing (e.g. it could not reconnect) after an
  // earlier try was sent and lost its answer: that earlier try may have written
  // the claim's record, which nobody can complete, so say so.
  static Status EarlierTryLost(const Status& s, Millis lease,
                               const std::string& what = "the key may stay BUSY until its",
                               std::string_view which = "an earlier try") {
    return Status(s.code(), s.message() + "; " + std::string(which) +
                                " was sent and its answer lost (effect unknown: " + what +
                                " lease of " + internal::FormatDuration(lease) + " ends)");
  }

  // The failure of a batch: names the claims whose outcome is unknown (`unknown`:
  // sent by some try, answered by none), and none when every claim a lost try
  // sent was answered by a later one. Also when the last try was itself sent
  // (`last_sent`): its status is the first failure in node order, which may be
  // another node's (a refused connection) and say nothing of these; and when an
  // error reply (a WRONGTYPE) ends the batch.
  static Status EarlierTriesLost(const Status& s, Millis lease,
                                 std::span<const ClaimRequest> reqs,
                                 const std::vector<bool>& unknown, bool last_sent) {
    constexpr size_t kNamed = 3;
    size_t n = 0;
    std::string named;
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (!unknown[i]) continue;
      if (++n <= kNamed) named += (n > 1 ? ", '" : "'") + internal::Printable(reqs[i].key) + "'";
    }
    if (n == 0) return s;
    if (n > kNamed) named += ", ...";
    return EarlierTryLost(s, lease,
                          n == 1 ? "the claim of key " + named + " may stay BUSY until its"
                                 : "the claims of " + std::to_string(n) + " keys (" + named +
                                       ") may stay BUSY until their",
                          last_sent ? "a try" : "an earlier try");
  }

  // A batch that fails as a whole must not keep the claims it made on the way:
  // nobody holds their tokens, so those keys would answer BUSY until the lease
  // ends. They are undone (unclaim.lua): back to the attempt they had, so that
  // a batch failed by one corrupt key or one stalled node uses up no attempt
  // of the others (release.lua kept it: with max_attempts 1 each was EXHAUSTED
  // without a run). Best effort, one round trip per node; what cannot be undone
  // (its server unreachable, or a claim whose reply never came) stays
  // IN_PROGRESS until its lease ends, as a crashed owner's would, and is then
  // taken over.
  void ReleaseAcquired(std::span<const ClaimRequest> reqs, const std::vector<Token>& tokens,
                       const std::vector<ClaimResult>& out) {
    std::vector<std::string> keys;
    std::vector<Command> cmds;
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i].outcome != ClaimOutcome::kAcquired || out[i].token != tokens[i]) continue;
      keys.push_back(RedisKey(reqs[i].key));
      cmds.push_back(ScriptCommand(kUnclaim, keys.back(),
                                   {tokens[i].ToHex(), std::to_string(reqs[i].retention.count())}));
    }
    if (cmds.empty()) return;
    std::vector<Reply> ignored;
    (void)ExecMany("claim batch release", keys, cmds, &ignored);
  }

  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    DEDUP_RETURN_IF_ERROR(ValidateExtend(key, token, lease));
    std::string rkey = RedisKey(key);
    return Write("extend", rkey,
                 ScriptCommand(kExtend, rkey, {token.ToHex(), std::to_string(lease.count())}));
  }

  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    DEDUP_RETURN_IF_ERROR(ValidateComplete(key, token, retention, status, result));
    std::string rkey = RedisKey(key);
    return Write("complete", rkey,
                 ScriptCommand(kComplete, rkey,
                               {token.ToHex(), std::to_string(retention.count()),
                                std::to_string(static_cast<int>(status)), std::string(result)}));
  }

  // Plain Redis: one round trip, one script call per run of consecutive requests
  // of one kind (complete_batch.lua, or complete_ack_stream.lua for those with a
  // fusable ack to one stream and group, with one retention), pipelined in order
  // and written in place (no string per argument). Cluster: the keys of a batch
  // lie in many slots, so one complete.lua per key, pipelined per node (one round
  // trip per node the batch touches); acks are never fused there.
  StatusOr<std::vector<AckedWrite>> CompleteBatch(std::span<const CompleteRequest> reqs) override {
    DEDUP_RETURN_IF_ERROR(ValidateCompleteBatch(reqs));
    if (reqs.size() <= 1) return Store::CompleteBatch(reqs);  // the single scripts
    if (cluster_) return CompleteBatchCluster(reqs);
    const auto fused = [&](const CompleteRequest& q) {
      return q.ack != nullptr && q.status == CompletionStatus::kOk && CanCompleteWithAck(*q.ack);
    };
    BatchScratch& scratch = Scratch();
    redis::CommandBuffer& cmds = scratch.cmds;
    std::vector<CompleteRun>& runs = scratch.runs;
    runs.clear();
    for (size_t b = 0; b < reqs.size();) {
      const bool f = fused(reqs[b]);
      size_t e = b + 1;
      if (f) {
        const CompleteRequest& q = reqs[b];
        while (e < reqs.size() && fused(reqs[e]) && reqs[e].ack->target == q.ack->target &&
               reqs[e].ack->group == q.ack->group && reqs[e].retention == q.retention) {
          ++e;
        }
      } else {
        while (e < reqs.size() && !fused(reqs[e])) ++e;
      }
      runs.push_back({b, e, f});
      CommandWriter w{&cmds, nullptr};
      WriteCompleteRun(w, reqs, runs.back());
      b = e;
    }
    std::vector<Reply>& replies = scratch.replies;
    DEDUP_RETURN_IF_ERROR(client_.ExecMany("complete batch", cmds, &replies));
    std::vector<AckedWrite> out(reqs.size());
    for (size_t k = 0; k < runs.size(); ++k) {
      const CompleteRun& run = runs[k];
      if (redis::IsNoScript(replies[k].get())) {
        // The server lost its scripts (a restart, SCRIPT FLUSH): this call did
        // not run; it is sent again as one command, which loads the script.
        Command c;
        CommandWriter w{nullptr, &c};
        WriteCompleteRun(w, reqs, run);
        // Error replies stay replies: answered below as the first send's are.
        StatusOr<Reply> again =
            client_.Call("complete batch", RedisKey(reqs[run.begin].key), std::move(c));
        if (!again.ok()) return again.status();
        replies[k] = std::move(again).value();
      }
      const redisReply* r = replies[k].get();
      if (IsError(r)) {
        return BatchError(reqs, run.begin, run.end, ReplyText(r), /*others_sent=*/runs.size() > 1);
      }
      const long long max = run.fused ? 2 : 1;
      if (r->type != REDIS_REPLY_ARRAY || r->elements != run.end - run.begin) {
        return BadReply("complete batch");
      }
      for (size_t i = run.begin; i < run.end; ++i) {
        long long v = 0;
        if (!IntAt(r, i - run.begin, &v) || v < 0 || v > max) return BadReply("complete batch");
        out[i] = AckedWrite{v >= 1 ? WriteResult::kOk : WriteResult::kLost, v == 2};
      }
    }
    return out;
  }

  // The status of an error reply `e` to the script call of reqs[begin, end) (it
  // changed nothing: the scripts read every record before they write). A record
  // that cannot be read is named by its key: on this error path the call's keys
  // are inspected to find it. `others_sent`: the batch's other calls ran apart,
  // and may have recorded their completions.
  Status BatchError(std::span<const CompleteRequest> reqs, size_t begin, size_t end,
                    std::string_view e, bool others_sent) {
    std::string where = description_ + ": complete batch: ";
    const std::string_view bare = redis::WithoutScriptLocation(e);
    if (end - begin > 1 && (bare.starts_with("WRONGTYPE") || bare.starts_with("DEDUPCORRUPT"))) {
      // Every key of the call inspected in one pipeline (no results read).
      std::vector<std::string> rkeys;
      std::vector<Command> cmds;
      for (size_t i = begin; i < end; ++i) {
        rkeys.push_back(RedisKey(reqs[i].key));
        cmds.push_back(ScriptCommand(kInspect, rkeys.back(), {"noresult"}));
      }
      std::vector<Reply> replies;
      if (ExecMany("complete batch", rkeys, cmds, &replies).ok()) {
        for (size_t i = 0; i < replies.size(); ++i) {
          if (replies[i] != nullptr && IsError(replies[i].get())) {
            where += "key '" + internal::Printable(reqs[begin + i].key) + "': ";
            break;
          }
        }
      }
    } else if (end - begin == 1) {
      where += "key '" + internal::Printable(reqs[begin].key) + "': ";
    }
    Status st = ErrorReplyStatus(where, e);
    if (!others_sent) return st;
    return Status(st.code(), st.message() + " (the batch's other completions were sent on their "
                                            "own and may be recorded)");
  }

  // A cluster: one complete.lua per key, pipelined per node.
  StatusOr<std::vector<AckedWrite>> CompleteBatchCluster(std::span<const CompleteRequest> reqs) {
    std::vector<std::string> rkeys;
    std::vector<Command> cmds;
    for (const CompleteRequest& q : reqs) {
      rkeys.push_back(RedisKey(q.key));
      cmds.push_back(ScriptCommandOf(kComplete, rkeys.back(), CompleteArgs(q)));
    }
    std::vector<Reply> replies;
    DEDUP_RETURN_IF_ERROR(ExecMany("complete batch", rkeys, cmds, &replies));
    std::vector<AckedWrite> out(reqs.size());
    for (size_t k = 0; k < cmds.size(); ++k) {
      const redisReply* r = replies[k].get();
      if (IsError(r)) return BatchError(reqs, k, k + 1, ReplyText(r), /*others_sent=*/true);
      if (r->type != REDIS_REPLY_INTEGER || r->integer < 0 || r->integer > 1) {
        return BadReply("complete batch");
      }
      out[k] = AckedWrite{r->integer == 1 ? WriteResult::kOk : WriteResult::kLost, false};
    }
    return out;
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

  StatusOr<bool> Forget(std::string_view key, const ForgetOptions& options) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    std::string rkey = RedisKey(key);
    StatusOr<Reply> r =
        Exec("forget", rkey, ScriptCommand(kForget, rkey, {options.force ? "1" : "0"}));
    if (!r.ok()) return r.status();
    const redisReply* a = r->get();
    if (a->type != REDIS_REPLY_ARRAY || a->elements != 2 ||
        a->element[0]->type != REDIS_REPLY_INTEGER || a->element[1]->type != REDIS_REPLY_INTEGER ||
        a->element[0]->integer < 0 || a->element[0]->integer > 3) {
      return BadReply("forget");
    }
    if (a->element[0]->integer == 2) {
      return internal::LeasedForgetError(key, Millis(a->element[1]->integer));
    }
    return a->element[0]->integer != 0;
  }

  StatusOr<ScanResult> Scan(std::string_view prefix, size_t limit,
                            const ScanOptions& options) override {
    ScanResult out;
    if (limit == 0) return out;
    const std::string pattern = GlobEscape(prefix_) + GlobEscape(prefix) + "*";
    std::set<std::string> seen;  // a migrating slot can show a key on two nodes
    for (Node* node : client_.router().Primaries()) {
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
        std::vector<std::string> page;  // its keys not seen before
        for (size_t i = 0; i < r->element[1]->elements; ++i) {
          std::string k(ReplyText(r->element[1]->element[i]));
          // A key no call can name (the prefix alone, or over the limit) is not
          // the store's: no claim meets it, no Forget could remove it.
          const size_t n = k.size() - std::min(k.size(), prefix_.size());
          if (n == 0 || n > kMaxKeyBytes) continue;
          if (seen.insert(k).second) page.push_back(std::move(k));
        }
        // Inspected as many at a time as are still wanted: a page holds up to
        // about 1000 keys and a record up to kMaxResultBytes of result, and a
        // limit of 1 reads one record, not the page. Keys that answer no record
        // (past their retention, fence floors) leave some still wanted: the next
        // step takes at least twice as many, so a page of them costs a few round
        // trips, not one per key.
        size_t grow = 0;
        for (size_t at = 0; at < page.size() && out.size() < limit;) {
          const size_t step = std::min(page.size() - at, std::max(limit - out.size(), grow));
          grow = 2 * step;
          std::vector<std::string> rkeys(page.begin() + at, page.begin() + at + step);
          std::vector<Command> cmds;
          for (const std::string& k : rkeys) {
            cmds.push_back(options.with_results ? ScriptCommand(kInspect, k, {})
                                                : ScriptCommand(kInspect, k, {"noresult"}));
          }
          at += step;
          std::vector<Reply> recs;
          DEDUP_RETURN_IF_ERROR(ExecMany("scan", rkeys, cmds, &recs));
          for (size_t i = 0; i < recs.size() && out.size() < limit; ++i) {
            const std::string_view key = std::string_view(rkeys[i]).substr(prefix_.size());
            std::string why;
            uint64_t size = 0;
            StatusOr<std::optional<Record>> rec =
                DecodeRecord("scan", recs[i].get(), key, &why,
                             options.with_results ? nullptr : &size);
            if (!why.empty()) {
              out.undecodable.push_back({std::string(key), std::move(why)});
              continue;
            }
            if (!rec.ok()) return rec.status();
            if (rec->has_value()) {
              out.result_bytes.push_back(options.with_results ? (*rec)->result.size() : size);
              out.records.push_back(std::move(**rec));
            }
          }
        }
        if (out.size() >= limit) return out;
      } while (cursor != "0");
    }
    return out;
  }

  std::string Describe() const override { return description_; }

 private:
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

  // An error reply to a claim of `key`, as a status naming the key. A key that
  // holds another Redis type (a hash, a list, ...) answers WRONGTYPE, to the
  // claim's SET ... GET or to claim.lua's GET, whichever ran: Claim and
  // ClaimBatch say the same then (DataLoss, nothing changed).
  Status ClaimError(std::string_view op, std::string_view key, std::string_view error) const {
    const std::string where = description_ + ": " + std::string(op) + ": key '" +
                              internal::Printable(key) + "': ";
    if (error.substr(0, 9) == "WRONGTYPE") {
      return Status::DataLoss(where + "the Redis key '" + internal::Printable(RedisKey(key)) +
                              "' holds a value of another type (a hash, list, set, ...), not a "
                              "dedup record; nothing changed (" +
                              std::string(WithoutScriptLocation(error)) + ")");
    }
    return ErrorReplyStatus(where, error);
  }

  Status BadReply(std::string_view op) const {
    return Status::Internal(description_ + ": " + std::string(op) +
                            ": unexpected reply from the server (is it Redis 7+?)");
  }

  Status CheckVersion(Node* n, std::string* info_text) {
    const Command info{{"INFO"}};  // the default sections: server, memory, persistence, ...
    const Command* one[] = {&info};
    std::vector<Reply> replies;
    DEDUP_RETURN_IF_ERROR(n->Pipeline(one, &replies, "open"));
    if (IsError(replies[0].get())) {
      return ErrorReplyStatus(Where(n, "open: INFO"), ReplyText(replies[0].get()));
    }
    std::string_view text = ReplyText(replies[0].get());
    info_text->assign(text);
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

  // Runs a probe script (EVAL, no keys) that asks the server, with
  // redis.acl_check_cmd, whether the connection's user may run each command dedup
  // sends, on a key under the prefix; nothing is written. EVAL itself being refused
  // (or renamed away) is answered the same way.
  Status CheckPermissions(Node* n) {
    static constexpr std::string_view kProbe = R"(#!lua flags=no-writes
local k, sha, denied = ARGV[1], ARGV[2], {}
local checks = {{'EVALSHA', sha, '1', k}, {'EVAL', 'return 1', '1', k}, {'SET', k, 'v'},
  {'GET', k}, {'PEXPIRE', k, '1'}, {'PEXPIRETIME', k}, {'TIME'}}
for _, c in ipairs(checks) do
  if not redis.acl_check_cmd(unpack(c)) then denied[#denied + 1] = c[1] end
end
return denied)";
    const Command probe{{"EVAL", std::string(kProbe), "0", prefix_ + "acl-probe", Sha(kClaim)}};
    const Command* one[] = {&probe};
    std::vector<Reply> replies;
    DEDUP_RETURN_IF_ERROR(n->Pipeline(one, &replies, "open"));
    const redisReply* r = replies[0].get();
    const std::string user = client_.options().user.empty() ? "default" : client_.options().user;
    const std::string needs = "dedup needs EVALSHA, EVAL, SET, GET, PEXPIRE, PEXPIRETIME and TIME "
                              "on keys '" + prefix_ + "*'";
    if (IsError(r)) {
      const std::string_view e = ReplyText(r);
      if (e.starts_with("NOPERM")) {
        return Status::PermissionDenied(Where(n, "open") + "the Redis user '" + user +
                                        "' may not run EVAL; " + needs);
      }
      if (e.find("unknown command") != std::string_view::npos) {
        return Status::FailedPrecondition(Where(n, "open") +
                                          "EVAL is not available (renamed or disabled); " + needs);
      }
      return ErrorReplyStatus(Where(n, "open: permission check"), e);
    }
    if (r->type != REDIS_REPLY_ARRAY) return BadReply("open: permission check");
    if (r->elements == 0) return Status::Ok();
    std::string missing;
    for (size_t i = 0; i < r->elements; ++i) {
      if (i > 0) missing += ", ";
      missing += ReplyText(r->element[i]);
    }
    return Status::PermissionDenied(Where(n, "open") + "the Redis user '" + user +
                                    "' may not run " + missing + " on keys '" + prefix_ +
                                    "*'; " + needs + " (e.g. ACL SETUSER " + user + " +" +
                                    std::string(ReplyText(r->element[0])) + ")");
  }

  // The value of `field` in an INFO reply, if reported.
  static std::optional<std::string_view> InfoField(std::string_view info, std::string_view field) {
    size_t at = 0;
    while ((at = info.find(field, at)) != std::string_view::npos) {
      const size_t end = at + field.size();
      if ((at == 0 || info[at - 1] == '\n') && end < info.size() && info[end] == ':') {
        std::string_view v = info.substr(end + 1);
        return v.substr(0, v.find_first_of("\r\n"));
      }
      at = end;
    }
    return std::nullopt;
  }

  // The settings that let Redis forget records (warnings, never errors). Read from
  // INFO, which the version check needs anyway, so a CONFIG command forbidden by
  // ACL or renamed does not hide them.
  void CheckSettings(Node* n, std::string_view info) {
    if (!on_warning_) return;
    const std::string where = "redis " + n->name() + ": ";
    const std::optional<std::string_view> policy = InfoField(info, "maxmemory_policy");
    const std::optional<std::string_view> aof = InfoField(info, "aof_enabled");
    if (!policy || !aof) {
      on_warning_("note: " + where +
                  "could not check maxmemory-policy and appendonly (INFO does not report "
                  "them); dedup needs maxmemory-policy noeviction and appendonly yes, or "
                  "messages can be processed twice");
    }
    if (policy && *policy != "noeviction") {
      on_warning_("warning: " + where + "maxmemory-policy is " + std::string(*policy) +
                  ": when Redis reaches maxmemory it evicts dedup records (every record "
                  "has a TTL, so volatile-* policies evict them too), and a message whose "
                  "record was evicted is processed again. Fix: set maxmemory-policy "
                  "noeviction (CONFIG SET maxmemory-policy noeviction, and in redis.conf)");
    }
    if (aof && *aof == "0") {
      on_warning_("warning: " + where + "appendonly is no: a Redis restart forgets every "
                  "completion since the last RDB snapshot (all of them without snapshots), "
                  "and those messages are processed again. Fix: set appendonly yes "
                  "(CONFIG SET appendonly yes, and in redis.conf; appendfsync always "
                  "to lose nothing on a crash)");
    }
  }

  // complete.lua's ARGV for one request, appended (no vector per request).
  // One script call of a plain-Redis CompleteBatch: requests [begin, end), fused
  // (complete_ack_stream.lua) or not (complete_batch.lua).
  struct CompleteRun {
    size_t begin, end;
    bool fused;
  };
  // Kept per thread for the batch calls (ClaimBatch, CompleteBatch; neither calls
  // the other): the commands are written in place into one reused buffer, and the
  // vectors keep their room.
  struct BatchScratch {
    redis::CommandBuffer cmds;
    std::vector<Reply> replies;
    std::vector<Token> tokens;
    std::vector<size_t> pending, slow, left;  // ClaimBatch's requests by state
    std::vector<bool> unknown, got_none;      // ClaimBatch's, see there
    std::vector<CompleteRun> runs;
  };
  static BatchScratch& Scratch() {
    thread_local BatchScratch scratch;
    scratch.cmds.Clear();
    return scratch;
  }
  // Writes a command either in place into a CommandBuffer or, for a resend that
  // must load its script, as a Command.
  struct CommandWriter {
    redis::CommandBuffer* buf;
    Command* cmd;
    void Begin(size_t n) {
      if (buf != nullptr) return buf->Begin(n);
      cmd->args.reserve(n);
    }
    void Arg(std::string_view a, std::string_view b = {}) {
      if (buf != nullptr) return buf->Arg(a, b);
      std::string s;
      s.reserve(a.size() + b.size());
      cmd->args.push_back(std::move(s.append(a).append(b)));
    }
    void Key(std::string_view a, std::string_view b = {}) {
      if (buf != nullptr) return buf->Key(a, b);
      Arg(a, b);
    }
    void Number(uint64_t n) {
      if (buf != nullptr) return buf->Number(n);
      cmd->args.push_back(std::to_string(n));
    }
  };
  // EVALSHA complete_batch <n> <record keys> (token, retention, status, result)...
  // or EVALSHA complete_ack_stream <1 + n> <stream> <record keys> <group>
  // <retention> (token as 8 bytes, result, entry ID)...
  void WriteCompleteRun(CommandWriter& w, std::span<const CompleteRequest> reqs,
                        const CompleteRun& run) const {
    const size_t n = run.end - run.begin;
    const std::span<const CompleteRequest> rs = reqs.subspan(run.begin, n);
    char hex[Token::kHexDigits];
    if (run.fused) {
      const BrokerAck& ack = *rs[0].ack;
      w.Begin(6 + 4 * n);
      w.Arg("EVALSHA");
      w.Arg(Sha(kCompleteAckStream));
      w.Number(1 + n);
      w.Arg(ack.target);
      w.Key(prefix_, rs[0].key);
      for (size_t i = 1; i < n; ++i) w.Arg(prefix_, rs[i].key);
      w.Arg(ack.group);
      w.Number(static_cast<uint64_t>(rs[0].retention.count()));
      char raw[redis::kTokenBytes];
      for (const CompleteRequest& q : rs) {
        w.Arg(std::string_view(raw, redis::WriteToken(raw, q.token.value) - raw));
        w.Arg(q.result);
        w.Arg(q.ack->id);
      }
      return;
    }
    w.Begin(3 + 5 * n);
    w.Arg("EVALSHA");
    w.Arg(Sha(kCompleteBatch));
    w.Number(n);
    w.Key(prefix_, rs[0].key);
    for (size_t i = 1; i < n; ++i) w.Arg(prefix_, rs[i].key);
    for (const CompleteRequest& q : rs) {
      w.Arg(q.token.WriteHex(hex));
      w.Number(static_cast<uint64_t>(q.retention.count()));
      w.Number(static_cast<uint64_t>(q.status));
      w.Arg(q.result);
    }
  }

  static void AppendCompleteArgs(const CompleteRequest& q, std::vector<std::string>* args) {
    args->push_back(q.token.ToHex());
    args->push_back(std::to_string(q.retention.count()));
    args->push_back(std::to_string(static_cast<int>(q.status)));
    args->emplace_back(q.result);
  }
  static std::vector<std::string> CompleteArgs(const CompleteRequest& q) {
    std::vector<std::string> args;
    args.reserve(4);
    AppendCompleteArgs(q, &args);
    return args;
  }

  static Command ScriptCommandOf(ScriptId id, const std::string& rkey,
                                 std::vector<std::string> args) {
    Command c;
    c.args.reserve(4 + args.size());
    c.args.emplace_back("EVALSHA");
    c.args.push_back(Sha(id));
    c.args.emplace_back("1");
    c.args.push_back(rkey);
    for (std::string& a : args) c.args.push_back(std::move(a));
    return c;
  }

  static Command ScriptCommand(ScriptId id, const std::string& rkey,
                               std::initializer_list<std::string> args) {
    return ScriptCommandOf(id, rkey, std::vector<std::string>(args));
  }

  // The IN_PROGRESS record of a first claim, record format 2: flags, token, fence 1,
  // attempt 1, keep = retention, fingerprint. Written at `out` (room for
  // kMaxFreshRecord bytes); returns its size.
  static constexpr size_t kMaxFreshRecord =
      1 + redis::kTokenBytes + 2 + 10 + 1 + kMaxFingerprintBytes;
  static size_t FreshRecord(const ClaimRequest& req, Token token, char* out) {
    char* p = out;
    *p++ = static_cast<char>(kFormat2 | kInProgress2 | (req.fingerprint.empty() ? 0 : kHasFp2));
    p = redis::WriteToken(p, token.value);
    *p++ = 1;  // fence
    *p++ = 1;  // attempt
    p = redis::WriteVarint(p, static_cast<uint64_t>(req.retention.count()));
    if (!req.fingerprint.empty()) {
      *p++ = static_cast<char>(req.fingerprint.size());
      std::memcpy(p, req.fingerprint.data(), req.fingerprint.size());
      p += req.fingerprint.size();
    }
    return static_cast<size_t>(p - out);
  }

  // SET <prefix><key> <fresh record> NX PX <lease + retention> [GET], written in
  // place: no string is made for the key, the record or the number.
  void AppendFastClaim(redis::CommandBuffer* cmds, const ClaimRequest& req, Token token,
                       bool with_get) const {
    char rec[kMaxFreshRecord];
    const size_t n = FreshRecord(req, token, rec);
    cmds->Begin(with_get ? 7 : 6);
    cmds->Arg("SET");
    cmds->Key(prefix_, req.key);
    cmds->Arg(std::string_view(rec, n));
    cmds->Arg("NX");
    cmds->Arg("PX");
    cmds->Number(static_cast<uint64_t>(req.lease.count() + req.retention.count()));
    if (with_get) cmds->Arg("GET");
  }

  // Whether the next claims carry GET: while a claim met a record less than a
  // second ago. One clock read per call; a relaxed atomic shared by all threads.
  bool WithGet() const {
    return redis::SteadyMillis() < get_until_ms_.load(std::memory_order_relaxed);
  }
  void MetRecord() const {
    get_until_ms_.store(redis::SteadyMillis() + kGetWindowMs, std::memory_order_relaxed);
  }

  // True when the reply to the fast claim says a record was there (and nothing
  // was written): claim.lua decides.
  bool FoundRecord(const redisReply* r, bool with_get) const {
    const bool found = with_get ? r->type == REDIS_REPLY_STRING : r->type == REDIS_REPLY_NIL;
    if (found) MetRecord();
    return found;
  }

  // The reply to AppendFastClaim's command. True when it settles the claim: the
  // record was written (ACQUIRED: nil with GET, OK without), or, with GET, a
  // format-2 COMPLETED record came back (DUPLICATE or MISMATCH, nothing written).
  // False for anything else: error replies, and records that need the server clock
  // (claim.lua decides).
  bool DecodeFastClaim(const redisReply* r, const ClaimRequest& req, Token token,
                       bool with_get, ClaimResult* out) const {
    const bool written = with_get ? r->type == REDIS_REPLY_NIL
                                  : r->type == REDIS_REPLY_STATUS && ReplyText(r) == "OK";
    if (written) {
      *out = ClaimResult{};
      out->outcome = ClaimOutcome::kAcquired;
      out->token = token;
      out->fence = 1;
      out->attempt = 1;
      return true;
    }
    if (!with_get || r->type != REDIS_REPLY_STRING) return false;
    // Our own token: an earlier try of this very claim wrote it (its reply was
    // lost). A fresh random token meets no other record. The lease runs from that
    // try, which the caller's lease (counted from its call) does not outlast.
    uint64_t tok = 0, fence = 0, attempt = 0;
    if (redis::DecodeInProgressHead2(ReplyText(r), &tok, &fence, &attempt)) {
      if (tok != token.value) return false;
      *out = ClaimResult{};
      out->outcome = ClaimOutcome::kAcquired;
      out->token = token;
      out->fence = fence;
      out->attempt = static_cast<uint32_t>(attempt);
      return true;
    }
    redis::CompletedRecord2 rec;
    if (!redis::DecodeCompletedRecord2(ReplyText(r), &rec)) return false;
    MetRecord();
    const std::string_view fp = rec.fingerprint;
    *out = ClaimResult{};
    out->fence = rec.fence;
    out->attempt = static_cast<uint32_t>(rec.attempt);
    if (rec.status == CompletionStatus::kExhausted && rec.token == token.value) {
      // An earlier try of this claim exhausted the key (claim.lua writes the
      // exhausting claim's token): it answers as that try did.
      out->outcome = ClaimOutcome::kExhausted;
      return true;
    }
    if (!req.fingerprint.empty() && !fp.empty() && fp != req.fingerprint) {
      out->outcome = ClaimOutcome::kMismatch;
      return true;
    }
    out->outcome = ClaimOutcome::kDuplicate;
    out->status = rec.status;
    out->result.assign(rec.result);
    return true;
  }

  static Command ClaimCommand(const std::string& rkey, const ClaimRequest& req, Token token) {
    return ScriptCommand(kClaim, rkey,
                         {token.ToHex(), std::to_string(req.lease.count()),
                          std::to_string(req.retention.count()), std::string(req.fingerprint),
                          std::to_string(req.max_attempts)});
  }

  // One command on the node of `rkey`. An error reply is a status named as
  // every error of this store is: its description, the operation and (for a
  // call about one key, `names_key`) the key, as the claims name theirs.
  StatusOr<Reply> Exec(std::string_view op, const std::string& rkey, Command cmd,
                       bool names_key = true) {
    StatusOr<Reply> r = client_.Call(op, rkey, std::move(cmd));
    if (r.ok() && IsError(r->get())) {
      std::string where = description_ + ": " + std::string(op) + ": ";
      if (names_key) {
        where += "key '" + internal::Printable(std::string_view(rkey).substr(prefix_.size())) + "': ";
      }
      return ErrorReplyStatus(where, ReplyText(r->get()));
    }
    return r;
  }
  Status ExecMany(std::string_view op, const std::vector<std::string>& rkeys,
                  std::vector<Command>& cmds, std::vector<Reply>* replies,
                  bool* sent = nullptr, std::vector<bool>* unknown = nullptr) {
    return client_.ExecMany(op, rkeys, cmds, replies, sent, unknown);
  }

  StatusOr<WriteResult> Write(std::string_view op, const std::string& rkey, Command cmd) {
    StatusOr<Reply> r = Exec(op, rkey, std::move(cmd));
    if (!r.ok()) return r.status();
    if ((*r)->type != REDIS_REPLY_INTEGER) return BadReply(op);
    return (*r)->integer == 1 ? WriteResult::kOk : WriteResult::kLost;
  }

  StatusOr<ClaimResult> DecodeClaim(std::string_view op, std::string_view key, const redisReply* r,
                                    Token token) {
    if (IsError(r)) return ClaimError(op, key, ReplyText(r));
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

  // The record of `key` from inspect.lua's reply `r`. One that is stored but
  // cannot be decoded (not dedup's format, a key of another type, token 0) is
  // DataLoss naming the key (Printable), and `*undecodable` (if given) says why
  // in a few words: a scan lists it, so that `dedup forget` can remove it.
  StatusOr<std::optional<Record>> DecodeRecord(std::string_view op, const redisReply* r,
                                               std::string_view key,
                                               std::string* undecodable = nullptr,
                                               uint64_t* result_bytes = nullptr) {
    if (undecodable != nullptr && IsError(r)) {
      const std::string_view e = redis::WithoutScriptLocation(ReplyText(r));
      if (e.starts_with("WRONGTYPE")) {
        *undecodable = "the key holds a value of another type (a hash, list, set, ...)";
      } else if (e.starts_with("DEDUPCORRUPT ")) {
        *undecodable = redis::ScriptErrorWords(e);
      }
    }
    if (IsError(r)) {
      return ErrorReplyStatus(description_ + ": " + std::string(op) + ": key '" +
                                  internal::Printable(key) + "': ",
                              ReplyText(r));
    }
    if (r->type == REDIS_REPLY_NIL) return std::optional<Record>();
    long long state = 0, status = 0, fence = 0, attempt = 0, lease = 0, retention = 0;
    if (!IntAt(r, 0, &state) || !IntAt(r, 1, &status) || !IntAt(r, 3, &fence) ||
        !IntAt(r, 4, &attempt) || !IntAt(r, 5, &lease) || !IntAt(r, 6, &retention) ||
        r->elements != (result_bytes == nullptr ? 9u : 10u) || state < 1 || state > 3 ||
        status < 0 || status > 2) {
      return BadReply(op);
    }
    if (result_bytes != nullptr) {  // inspect.lua noresult: the result's length
      long long n = 0;
      if (!IntAt(r, 9, &n) || n < 0) return BadReply(op);
      *result_bytes = static_cast<uint64_t>(n);
    }
    std::optional<Token> token = Token::FromHex(StrAt(r, 2));
    if (!token) {
      if (undecodable != nullptr) *undecodable = "token 0";
      return Status::DataLoss(description_ + ": " + std::string(op) + ": key '" +
                              internal::Printable(key) + "': corrupt record (token 0)");
    }
    Record rec;
    rec.key.assign(key);
    rec.state = static_cast<RecordState>(state);
    rec.token = *token;
    rec.fence = static_cast<uint64_t>(fence);
    rec.attempt = static_cast<uint32_t>(attempt);
    rec.lease_deadline = lease;
    // PEXPIRETIME -1: the key has no expiry (PERSIST by hand): kept for ever.
    rec.retention_deadline = retention == -1 ? std::numeric_limits<int64_t>::max() : retention;
    rec.fingerprint = StrAt(r, 7);
    rec.status = static_cast<CompletionStatus>(status);
    rec.result = StrAt(r, 8);
    return std::optional<Record>(std::move(rec));
  }

  const std::string prefix_;
  const std::string description_;
  const bool cluster_;
  const int db_;
  const redis::Endpoint endpoint_;
  // The identity a fusable BrokerAck names (checked per completion: built once).
  const std::string server_identity_;
  const std::function<void(const std::string&)> on_warning_;
  redis::Client client_;
  // Claims carry GET until then (steady ms): see Claim().
  static constexpr int64_t kGetWindowMs = 1'000;
  mutable std::atomic<int64_t> get_until_ms_{0};
};

// The prefix escaped (Printable), as keys are: it begins every error and the
// worker's banner, and "?prefix=%1b%5b31m" put a raw ESC on the terminal.
std::string Describe(const redis::ConnectionOptions& c, const std::string& prefix) {
  return c.Describe() + "?prefix=" + internal::Printable(prefix);
}

StatusOr<std::unique_ptr<Store>> Open(redis::ConnectionOptions c, std::string prefix,
                                      std::string description,
                                      std::function<void(const std::string&)> on_warning) {
  DEDUP_RETURN_IF_ERROR(c.Validate());
  if (description.empty()) description = Describe(c, prefix);
  if (!on_warning) {
    // Not dropped: a Redis that evicts keys or forgets them at a restart makes
    // dedup process messages twice, and a library user who set nothing must
    // still hear of it.
    on_warning = [](const std::string& m) { std::fprintf(stderr, "dedup: %s\n", m.c_str()); };
  }
  auto store = std::make_unique<RedisStore>(std::move(c), std::move(prefix),
                                            std::move(description), std::move(on_warning));
  DEDUP_RETURN_IF_ERROR(store->Start());
  return std::unique_ptr<Store>(std::move(store));
}

}  // namespace

StatusOr<std::unique_ptr<Store>> OpenRedisStore(const RedisStoreOptions& options) {
  redis::ConnectionOptions c;
  for (const std::string& h : options.hosts) {
    StatusOr<redis::Endpoint> ep = redis::ParseEndpoint(h);
    if (!ep.ok()) return ep.status();
    c.endpoints.push_back(*ep);
  }
  c.cluster = options.cluster;
  c.user = options.user;
  c.password = options.password;
  c.has_password = options.has_password;
  c.db = options.db;
  c.timeout = options.timeout;
  c.pool_size = options.pool_size;
  c.auto_pipeline = options.auto_pipeline;
  return Open(std::move(c), options.prefix, options.description, options.on_warning);
}

namespace internal {

StatusOr<std::unique_ptr<Store>> OpenRedisFromUri(const Uri& uri, const OpenOptions& options) {
  StatusOr<redis::RedisUri> parsed = redis::ParseRedisUri(uri, {"prefix"});
  if (!parsed.ok()) return parsed.status();
  std::string prefix = parsed->uri.Param("prefix").value_or("dedup:");
  return Open(std::move(parsed->connection), std::move(prefix), std::string(),
              options.on_warning);
}

}  // namespace internal
}  // namespace dedup
