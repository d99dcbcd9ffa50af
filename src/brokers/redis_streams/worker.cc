// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// One reader thread (the caller of Run) talks to the consumer group: it re-reads
// this consumer's own pending entries, takes over idle ones of others
// (XAUTOCLAIM), re-claims its own entries whose retry time has come (XCLAIM) and
// reads new ones (XREADGROUP >). It hands entries to `concurrency` handler
// threads, each with its own connection for XACK / XADD. An entry is held by at
// most one place in this process at a time (`held_`), so a reclaim never starts a
// second local run of an entry that is queued, running or waiting to retry.

#include <hiredis/hiredis.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "brokers/redis_streams/stream_conn.h"
#include "core/printable.h"
#include "core/secret.h"
#include "core/uri.h"
#include "dedup/worker.h"
#include "stores/redis/stream_ack.h"

namespace dedup {

using streams::ConnOptions;
using streams::IsError;
using streams::ReplyPtr;
using streams::ReplyText;
using streams::StreamConn;
using SteadyTime = std::chrono::steady_clock::time_point;

namespace {

std::string HexSha256(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(data.data(), data.size(), digest, &len, EVP_sha256(), nullptr);
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned i = 0; i < len; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 15]);
  }
  return out;
}

// Appends a length-prefixed string, so that field boundaries cannot be forged.
void AppendFramed(std::string* out, std::string_view s) {
  *out += std::to_string(s.size());
  out->push_back(':');
  out->append(s);
}

// [id, [f1, v1, f2, v2 ...]] -> StreamMessage. A nil field list (entry deleted
// from the stream while pending) gives has_body = false.
bool ParseEntry(const redisReply* e, StreamMessage* m, bool* has_body) {
  if (e == nullptr || e->type != REDIS_REPLY_ARRAY || e->elements != 2) return false;
  const redisReply* id = e->element[0];
  const redisReply* kv = e->element[1];
  if (id == nullptr || id->type != REDIS_REPLY_STRING) return false;
  m->id.assign(id->str, id->len);
  *has_body = kv != nullptr && kv->type == REDIS_REPLY_ARRAY;
  if (!*has_body) return true;
  for (size_t i = 0; i + 1 < kv->elements; i += 2) {
    m->fields.emplace_back(std::string(kv->element[i]->str, kv->element[i]->len),
                           std::string(kv->element[i + 1]->str, kv->element[i + 1]->len));
  }
  return true;
}

}  // namespace

std::string StreamMessage::CanonicalPayload() const {
  std::string out;
  for (const auto& [k, v] : fields) {
    AppendFramed(&out, k);
    AppendFramed(&out, v);
  }
  return out;
}

std::string WorkerMetrics::ToPrometheus() const {
  const std::pair<const char*, uint64_t> rows[] = {
      {"messages", messages},         {"acquired", acquired},   {"duplicates", duplicates},
      {"busy", busy},                 {"takeovers", takeovers}, {"lost_leases", lost_leases},
      {"retries", retries},           {"dead_lettered", dead_lettered},
      {"store_errors", store_errors}, {"acked", acked},         {"reclaimed", reclaimed},
      {"broker_errors", broker_errors}, {"acked_with_complete", acked_with_complete}};
  std::string out;
  for (const auto& [name, v] : rows) {
    out += "# TYPE dedup_worker_" + std::string(name) + "_total counter\n";
    out += "dedup_worker_" + std::string(name) + "_total " + std::to_string(v) + "\n";
  }
  return out;
}

std::string WorkerMetrics::Summary() const {
  return "messages=" + std::to_string(messages) + " acquired=" + std::to_string(acquired) +
         " duplicates=" + std::to_string(duplicates) + " busy=" + std::to_string(busy) +
         " takeovers=" + std::to_string(takeovers) + " lost_leases=" +
         std::to_string(lost_leases) + " retries=" + std::to_string(retries) +
         " dead_lettered=" + std::to_string(dead_lettered) + " store_errors=" +
         std::to_string(store_errors) + " acked=" + std::to_string(acked) +
         " reclaimed=" + std::to_string(reclaimed) + " broker_errors=" +
         std::to_string(broker_errors) + " acked_with_complete=" +
         std::to_string(acked_with_complete);
}

StatusOr<WorkerOptions> WorkerOptionsFromUri(std::string_view text) {
  auto parsed = internal::ParseUri(text);
  if (!parsed.ok()) return parsed.status();
  const internal::Uri& u = *parsed;
  if (u.scheme != "redis") {
    return Status::InvalidArgument("broker URI '" + u.Redacted() +
                                   "': only redis:// (Redis Streams) is supported");
  }
  DEDUP_RETURN_IF_ERROR(u.CheckParams(
      {"stream", "group", "consumer", "key", "dead", "prefix", "block", "reclaim",
       internal::kPasswordFileParam}));
  // The streams live in database 0; a /N would silently be ignored.
  if (!u.path.empty() && u.path != "/" && u.path != "/0") {
    return Status::InvalidArgument("broker URI '" + u.Redacted() +
                                   "' names a database path; the Redis Streams broker uses "
                                   "database 0 only (drop the path)");
  }
  WorkerOptions o;
  std::string hosts = u.hosts.empty() ? "127.0.0.1:6379" : u.hosts;
  if (size_t c = hosts.rfind(':'); c != std::string::npos) {
    auto port = internal::ParseCount(hosts.substr(c + 1), "broker port");
    // Not echoed: in "redis://:PASS" (the '@' forgotten) the "port" is the password.
    if (!port.ok()) {
      return Status::InvalidArgument("broker URI '" + u.Redacted() +
                                     "': the port is not a whole number");
    }
    if (*port < 1 || *port > 65535) return Status::InvalidArgument("broker port out of range");
    o.port = static_cast<int>(*port);
    hosts.resize(c);
  }
  o.host = hosts;
  // Inline, password_file= or $DEDUP_REDIS_PASSWORD (core/secret.h).
  auto cred = internal::ResolveRedisCredentials(u);
  if (!cred.ok()) return cred.status();
  o.password = cred->password;
  o.has_password = cred->has_password;
  o.stream = u.Param("stream").value_or("");
  if (o.stream.empty()) {
    return Status::InvalidArgument("broker URI '" + u.Redacted() + "' needs stream=NAME");
  }
  o.group = u.Param("group").value_or("");
  o.consumer = u.Param("consumer").value_or("");
  if (auto k = u.Param("key")) {
    if (k->empty()) return Status::InvalidArgument("broker URI: key= is empty");
    if (*k == "sha256") {
      o.key_from_content = true;
    } else {
      o.key_field = *k;
    }
  }
  o.dead_stream = u.Param("dead").value_or("");
  o.key_prefix = u.Param("prefix").value_or("");
  if (auto b = u.Param("block")) {
    auto ms = internal::ParseDurationMillis(*b, "broker block");
    if (!ms.ok()) return ms.status();
    o.block = Millis(std::max(1LL, *ms));
  }
  if (auto r = u.Param("reclaim")) {
    auto ms = internal::ParseDurationMillis(*r, "broker reclaim");
    if (!ms.ok()) return ms.status();
    o.reclaim_min_idle = Millis(*ms);
  }
  return o;
}

class Worker::Impl {
 public:
  Impl(WorkerOptions o, std::atomic<bool>* stop) : o_(std::move(o)), stop_(stop) {}

  ConnOptions Conn() const {
    ConnOptions c;
    c.host = o_.host;
    c.port = o_.port;
    c.password = o_.password;
    c.has_password = o_.has_password;
    c.timeout = o_.timeout;
    return c;
  }

  Status CreateGroup() {
    StreamConn conn(Conn());
    auto r = conn.Run({"XGROUP", "CREATE", o_.stream, o_.group, "0", "MKSTREAM"});
    if (!r.ok()) return r.status();
    if (IsError(r->get()) && ReplyText(r->get()).rfind("BUSYGROUP", 0) != 0) {
      return Status::FailedPrecondition("redis " + conn.Name() + ": XGROUP CREATE " + o_.stream +
                                        " " + o_.group + ": " + ReplyText(r->get()));
    }
    return Status::Ok();
  }

  Status Run(const Processor& process) {
    process_ = &process;
    for (int i = 0; i < o_.concurrency; ++i) threads_.emplace_back([this] { HandlerLoop(); });
    StreamConn conn(Conn());
    Millis backoff(100);
    bool history_done = false;
    std::string history_from = "0";
    SteadyTime next_reclaim = std::chrono::steady_clock::now();
    std::string reclaim_cursor = "0-0";
    while (!stop_->load()) {
      const SteadyTime now = std::chrono::steady_clock::now();
      Status s;
      const int free_slots = FreeSlots();
      if (free_slots <= 0) {
        std::unique_lock lock(mu_);
        room_cv_.wait_for(lock, Millis(50));
        continue;
      }
      if (!history_done) {
        // This consumer's own pending entries (a restart with the same name).
        s = ReadGroup(&conn, history_from, free_slots, Millis(0), &history_done, &history_from);
      } else if (now >= next_reclaim) {
        s = Reclaim(&conn, free_slots, &reclaim_cursor);
        next_reclaim = now + o_.reclaim_interval;
      } else if (s = ClaimDueRetries(&conn, free_slots); s.ok()) {
        const Millis wait = std::clamp(
            std::chrono::duration_cast<Millis>(std::min(next_reclaim, NextRetry()) - now),
            Millis(1), o_.block);
        s = ReadGroup(&conn, ">", free_slots, wait, nullptr, nullptr);
      }
      if (!s.ok()) {
        broker_errors_.fetch_add(1);
        Log("stream: " + s.ToString());
        std::this_thread::sleep_for(backoff);
        backoff = std::min(backoff * 2, Millis(1'000));
      } else {
        backoff = Millis(100);
      }
    }
    Drain();
    return Status::Ok();
  }

  WorkerMetrics Metrics() const {
    WorkerMetrics m;
    m.messages = messages_.load();
    m.acquired = acquired_.load();
    m.duplicates = duplicates_.load();
    m.busy = busy_.load();
    m.takeovers = takeovers_.load();
    m.lost_leases = lost_leases_.load();
    m.retries = retries_.load();
    m.dead_lettered = dead_lettered_.load();
    m.store_errors = store_errors_.load();
    m.acked = acked_.load();
    m.reclaimed = reclaimed_.load();
    m.broker_errors = broker_errors_.load();
    m.acked_with_complete = acked_with_complete_.load();
    return m;
  }

  WorkerOptions o_;
  // Set by Worker::Run when the Buffer's store can ack this stream in its
  // complete (a plain Redis store on the stream's server, database 0).
  bool combine_acks_ = false;

 private:
  struct Pending {
    SteadyTime not_before;
  };

  static void Log(const std::string& line) { std::fprintf(stderr, "dedup worker: %s\n", line.c_str()); }

  int FreeSlots() {
    std::lock_guard lock(mu_);
    return o_.concurrency * 2 - static_cast<int>(queue_.size()) - running_;
  }

  SteadyTime NextRetry() {
    std::lock_guard lock(mu_);
    SteadyTime t = SteadyTime::max();
    for (const auto& [id, p] : retry_) t = std::min(t, p.not_before);
    return t;
  }

  std::string KeyOf(const StreamMessage& m) const {
    if (o_.key_from_content) return o_.key_prefix + HexSha256(m.CanonicalPayload());
    for (const auto& [k, v] : m.fields) {
      if (k == o_.key_field) return v.empty() ? std::string() : o_.key_prefix + v;
    }
    return {};
  }

  // Queues an entry unless this process already holds it. Returns whether queued.
  bool Dispatch(StreamMessage m) {
    m.key = KeyOf(m);
    std::lock_guard lock(mu_);
    if (!held_.insert(m.id).second) return false;
    queue_.push_back(std::move(m));
    work_cv_.notify_one();
    return true;
  }

  // Entries of one stream reply ([[stream, [entries]]]) or an entry array.
  Status DispatchEntries(StreamConn* conn, const redisReply* entries, size_t* count,
                         std::string* last_id, bool from_reclaim) {
    std::vector<std::string> gone;
    for (size_t i = 0; i < entries->elements; ++i) {
      StreamMessage m;
      bool has_body = false;
      if (!ParseEntry(entries->element[i], &m, &has_body)) continue;
      if (last_id != nullptr) *last_id = m.id;
      ++*count;
      if (!has_body) {
        gone.push_back(m.id);  // deleted from the stream: nothing left to process
        continue;
      }
      if (Dispatch(std::move(m)) && from_reclaim) reclaimed_.fetch_add(1);
    }
    if (!gone.empty()) {
      std::vector<std::string> args = {"XACK", o_.stream, o_.group};
      args.insert(args.end(), gone.begin(), gone.end());
      auto r = conn->Run(args);
      if (!r.ok()) return r.status();
    }
    return Status::Ok();
  }

  Status ReadGroup(StreamConn* conn, const std::string& from, int count, Millis block,
                   bool* history_done, std::string* history_from) {
    std::vector<std::string> args = {"XREADGROUP", "GROUP", o_.group, o_.consumer,
                                     "COUNT", std::to_string(count)};
    if (from == ">") {
      args.push_back("BLOCK");
      args.push_back(std::to_string(block.count()));
    }
    args.insert(args.end(), {"STREAMS", o_.stream, from});
    auto r = conn->Run(args, block);
    if (!r.ok()) return r.status();
    const redisReply* rep = r->get();
    if (IsError(rep)) {
      // NOGROUP after a Redis restart that lost the group: create it again.
      if (ReplyText(rep).rfind("NOGROUP", 0) == 0) return CreateGroup();
      return Status::Unavailable("redis " + conn->Name() + ": XREADGROUP: " + ReplyText(rep));
    }
    size_t n = 0;
    std::string last;
    if (rep->type == REDIS_REPLY_ARRAY) {
      for (size_t i = 0; i < rep->elements; ++i) {
        const redisReply* s = rep->element[i];
        if (s->type == REDIS_REPLY_ARRAY && s->elements == 2 &&
            s->element[1]->type == REDIS_REPLY_ARRAY) {
          DEDUP_RETURN_IF_ERROR(DispatchEntries(conn, s->element[1], &n, &last, false));
        }
      }
    }
    if (history_done != nullptr) {
      if (n == 0) {
        *history_done = true;
      } else {
        *history_from = last;
      }
    }
    return Status::Ok();
  }

  Status Reclaim(StreamConn* conn, int count, std::string* cursor) {
    auto r = conn->Run({"XAUTOCLAIM", o_.stream, o_.group, o_.consumer,
                        std::to_string(o_.reclaim_min_idle.count()), *cursor, "COUNT",
                        std::to_string(count)});
    if (!r.ok()) return r.status();
    const redisReply* rep = r->get();
    if (IsError(rep)) {
      if (ReplyText(rep).rfind("NOGROUP", 0) == 0) return CreateGroup();
      return Status::Unavailable("redis " + conn->Name() + ": XAUTOCLAIM: " + ReplyText(rep));
    }
    // Redis 7: [next-cursor, [entries], [deleted ids]].
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 2) {
      return Status::Internal("XAUTOCLAIM: unexpected reply shape");
    }
    *cursor = ReplyText(rep->element[0]);
    if (cursor->empty()) *cursor = "0-0";
    size_t n = 0;
    if (rep->element[1]->type == REDIS_REPLY_ARRAY) {
      DEDUP_RETURN_IF_ERROR(DispatchEntries(conn, rep->element[1], &n, nullptr, true));
    }
    return Status::Ok();
  }

  // Own entries whose retry time has come: XCLAIM them (min-idle 0) to reset their
  // idle time and read their current fields; one that is gone (acked elsewhere)
  // comes back empty and is dropped.
  Status ClaimDueRetries(StreamConn* conn, int count) {
    std::vector<std::string> ids;
    {
      std::lock_guard lock(mu_);
      const SteadyTime now = std::chrono::steady_clock::now();
      for (auto it = retry_.begin(); it != retry_.end() && static_cast<int>(ids.size()) < count;) {
        if (it->second.not_before <= now) {
          ids.push_back(it->first);
          held_.erase(it->first);  // Dispatch takes it again
          it = retry_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (ids.empty()) return Status::Ok();
    std::vector<std::string> args = {"XCLAIM", o_.stream, o_.group, o_.consumer, "0"};
    args.insert(args.end(), ids.begin(), ids.end());
    auto r = conn->Run(args);
    if (!r.ok() || IsError(r->get()) || r->get()->type != REDIS_REPLY_ARRAY) {
      // Put them back: try again on the next round.
      std::lock_guard lock(mu_);
      for (const auto& id : ids) {
        held_.insert(id);
        retry_[id] = {std::chrono::steady_clock::now() + Millis(500)};
      }
      if (!r.ok()) return r.status();
      return Status::Unavailable("redis " + conn->Name() + ": XCLAIM: " + ReplyText(r->get()));
    }
    size_t n = 0;
    return DispatchEntries(conn, r->get(), &n, nullptr, false);
  }

  void HandlerLoop() {
    StreamConn conn(Conn());
    while (true) {
      StreamMessage m;
      {
        std::unique_lock lock(mu_);
        work_cv_.wait(lock, [this] { return !queue_.empty() || draining_; });
        if (draining_) return;  // queued entries stay pending in the group
        m = std::move(queue_.front());
        queue_.pop_front();
        ++running_;
      }
      Handle(&conn, m);
      {
        std::lock_guard lock(mu_);
        --running_;
      }
      room_cv_.notify_all();
    }
  }

  void LeavePending(const StreamMessage& m, Millis after) {
    retries_.fetch_add(1);
    std::lock_guard lock(mu_);
    retry_[m.id] = {std::chrono::steady_clock::now() + std::max(after, Millis(1))};
  }

  void Forget(const StreamMessage& m) {
    std::lock_guard lock(mu_);
    held_.erase(m.id);
  }

  void Handle(StreamConn* conn, const StreamMessage& m) {
    messages_.fetch_add(1);
    if (m.key.empty()) {
      DeadLetter(conn, m, "missing key field '" + o_.key_field + "'");
      return;
    }
    // With combine_acks_, a Complete(kOk) of this key by the Redis store runs
    // complete_ack.lua: the XACK goes in the completion's round trip, and only if
    // the completion is OK (src/stores/redis/stream_ack.h).
    internal::StreamAck ack{m.key, o_.stream, o_.group, m.id};
    Processed p;
    {
      internal::ScopedStreamAck scope(combine_acks_ ? &ack : nullptr);
      p = (*process_)(m);
    }
    if (!p.status.ok()) {
      if (p.status.code() == StatusCode::kInvalidArgument && !p.ran) {
        DeadLetter(conn, m, "bad key: " + p.status.message());
        return;
      }
      store_errors_.fetch_add(1);
    } else {
      switch (p.claim.outcome) {
        case ClaimOutcome::kAcquired:
          acquired_.fetch_add(1);
          if (p.claim.attempt > 1) takeovers_.fetch_add(1);
          break;
        case ClaimOutcome::kDuplicate: duplicates_.fetch_add(1); break;
        case ClaimOutcome::kBusy: busy_.fetch_add(1); break;
        default: break;
      }
      if (p.ran && p.completion == WriteResult::kLost) lost_leases_.fetch_add(1);
    }
    if (ack.acked) {
      // The outcome was recorded OK and the entry acked, atomically.
      acked_.fetch_add(1);
      acked_with_complete_.fetch_add(1);
      Forget(m);
      return;
    }
    // A duplicate of work that ended failed or exhausted was dead-lettered (maybe
    // not: the worker may have died before XADD): dead-letter it again.
    if (p.status.ok() && p.claim.outcome == ClaimOutcome::kDuplicate &&
        p.claim.status != CompletionStatus::kOk) {
      DeadLetter(conn, m, std::string("completed earlier as ") +
                              std::string(CompletionStatusName(p.claim.status)));
      return;
    }
    switch (p.action) {
      case BrokerAction::kAck: Ack(conn, m); return;
      case BrokerAction::kRetry: LeavePending(m, p.retry_after); return;
      case BrokerAction::kDeadLetter: DeadLetter(conn, m, p.reason); return;
    }
  }

  void Ack(StreamConn* conn, const StreamMessage& m) {
    auto r = conn->Run({"XACK", o_.stream, o_.group, m.id});
    if (!r.ok() || IsError(r->get())) {
      // The outcome is recorded: the next delivery gets DUPLICATE and acks.
      broker_errors_.fetch_add(1);
      LeavePending(m, Millis(500));
      return;
    }
    acked_.fetch_add(1);
    Forget(m);
  }

  void DeadLetter(StreamConn* conn, const StreamMessage& m, const std::string& reason) {
    std::vector<std::string> args = {"XADD", o_.dead_stream, "*"};
    for (const auto& [k, v] : m.fields) {
      args.push_back(k);
      args.push_back(v);
    }
    args.insert(args.end(), {"reason", reason, "entry_id", m.id});
    auto r = conn->Run(args);
    if (r.ok() && !IsError(r->get())) r = conn->Run({"XACK", o_.stream, o_.group, m.id});
    if (!r.ok() || IsError(r->get())) {
      broker_errors_.fetch_add(1);
      LeavePending(m, Millis(500));
      return;
    }
    dead_lettered_.fetch_add(1);
    Log("dead-lettered " + internal::Printable(m.id) + " (key '" + internal::Printable(m.key) +
        "'): " + internal::Printable(reason));
    Forget(m);
  }

  void Drain() {
    {
      std::unique_lock lock(mu_);
      queue_.clear();
      const auto done = [this] { return running_ == 0; };
      if (o_.drain_timeout.count() > 0) {
        room_cv_.wait_for(lock, o_.drain_timeout, done);
      } else {
        room_cv_.wait(lock, done);
      }
      draining_ = true;
    }
    work_cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }

  std::atomic<bool>* stop_;
  const Processor* process_ = nullptr;
  std::vector<std::thread> threads_;

  std::mutex mu_;
  std::condition_variable work_cv_, room_cv_;
  std::deque<StreamMessage> queue_;
  int running_ = 0;
  bool draining_ = false;
  std::set<std::string> held_;              // queued, running or waiting to retry
  std::map<std::string, Pending> retry_;    // left pending, by entry id

  std::atomic<uint64_t> messages_{0}, acquired_{0}, duplicates_{0}, busy_{0}, takeovers_{0},
      lost_leases_{0}, retries_{0}, dead_lettered_{0}, store_errors_{0}, acked_{0},
      reclaimed_{0}, broker_errors_{0}, acked_with_complete_{0};
};

Worker::Worker(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Worker::~Worker() = default;

StatusOr<std::unique_ptr<Worker>> Worker::Open(WorkerOptions o) {
  if (o.stream.empty()) return Status::InvalidArgument("worker: stream is empty");
  if (o.group.empty()) return Status::InvalidArgument("worker: group is empty");
  if (o.concurrency < 1 || o.concurrency > 4096) {
    return Status::InvalidArgument("worker: concurrency must be 1 to 4096");
  }
  if (o.key_field.empty()) return Status::InvalidArgument("worker: key field is empty");
  if (o.block.count() < 1) o.block = Millis(1);
  if (o.consumer.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    o.consumer = std::string(host) + "-" + std::to_string(getpid());
  }
  if (o.dead_stream.empty()) o.dead_stream = o.stream + ":dead";
  std::unique_ptr<Worker> w(new Worker(nullptr));
  w->impl_ = std::make_unique<Impl>(std::move(o), &w->stop_);
  DEDUP_RETURN_IF_ERROR(w->impl_->CreateGroup());
  return w;
}

Status Worker::RunWith(const Processor& process) {
  if (impl_->o_.reclaim_min_idle.count() <= 0) impl_->o_.reclaim_min_idle = Millis(35'000);
  return impl_->Run(process);
}

Status Worker::Run(Buffer* buffer, const Handler& handler) {
  if (impl_->o_.reclaim_min_idle.count() <= 0) {
    impl_->o_.reclaim_min_idle = buffer->options().lease + Millis(5'000);
  }
  const auto* acker = dynamic_cast<const internal::StreamAckStore*>(buffer->store());
  impl_->combine_acks_ =
      acker != nullptr && acker->CanAckStreamOn(impl_->o_.host, impl_->o_.port, 0);
  Processor p = [buffer, &handler](const StreamMessage& m) {
    return buffer->ProcessOnce(m.key, m.CanonicalPayload(),
                               [&](ClaimGuard& g) { return handler(m, g); });
  };
  return impl_->Run(p);
}

WorkerMetrics Worker::metrics() const { return impl_->Metrics(); }
const WorkerOptions& Worker::options() const { return impl_->o_; }

}  // namespace dedup
