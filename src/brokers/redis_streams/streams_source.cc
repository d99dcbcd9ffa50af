// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/redis_streams/streams_source.h"

#include <hiredis/hiredis.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "brokers/key_spec.h"
#include "brokers/redis_streams/stream_conn.h"
#include "core/sha256.h"
#include "core/uri.h"

namespace dedup {

using streams::ConnOptions;
using streams::IsError;
using streams::ReplyText;
using streams::StreamConn;
using SteadyTime = std::chrono::steady_clock::time_point;
using SteadyClock = std::chrono::steady_clock;

namespace {

// The idle time a hand-back (Retry(0)) gives an entry: longer than any
// consumer's reclaim min-idle (lease + 5 s by default), so that every worker's
// next XAUTOCLAIM takes it; a day, so that Redis's clock takes it as a past
// delivery time (it would take an idle time longer than its clock as "now").
constexpr Millis kHandBackIdle{86'400'000};

// [id, [f1, v1, f2, v2 ...]]. A nil field list (entry deleted from the stream
// while pending) gives has_body = false.
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

class StreamsSource;

// What the in-progress signal and the hand-back of one delivery share; it may
// outlive the delivery (the signal is sent by the source's own thread).
struct EntryClock {
  std::mutex mu;
  // When this consumer last had the entry's idle time set to 0 (delivered to
  // it, or an in-progress XCLAIM answered): taken after Redis's reply, so that
  // the time since is at most the entry's idle time while no other consumer
  // took it meanwhile.
  SteadyTime reset = SteadyClock::now();
  bool handed_back = false;  // Retry(0): no more in-progress signals
};

class StreamDelivery final : public Delivery {
 public:
  StreamDelivery(StreamsSource* source, StreamMessage m, std::string key, std::string key_error,
                 uint32_t count);
  Status Ack() override;
  Status Retry(Millis after) override;
  Status DeadLetter(std::string_view reason) override;
  Status InProgress() override;
  const BrokerAck* fused_ack() const override { return &ack_; }
  void MarkAcked() override {}
  void set_delivery_count(uint32_t n) { delivery_count_ = n; }

 private:
  StreamsSource* source_;
  BrokerAck ack_;
  const std::shared_ptr<EntryClock> clock_ = std::make_shared<EntryClock>();
};

class StreamsSource final : public MessageSource {
 public:
  explicit StreamsSource(WorkerOptions o)
      : o_(std::move(o)), server_(internal::RedisServerIdentity(o_.host, o_.port, o_.db)), fetch_conn_(Conn()) {}
  ~StreamsSource() override {
    {
      std::lock_guard lock(progress_mu_);
      progress_stop_ = true;
    }
    progress_cv_.notify_all();
    if (progress_thread_.joinable()) progress_thread_.join();
  }

  ConnOptions Conn() const { return StreamConnOptions(o_); }

  Status CreateGroup(StreamConn* conn) {
    auto r = conn->Run({"XGROUP", "CREATE", o_.stream, o_.group, "0", "MKSTREAM"});
    if (!r.ok()) return r.status();
    if (IsError(r->get()) && ReplyText(r->get()).rfind("BUSYGROUP", 0) != 0) {
      return Status::FailedPrecondition("redis " + conn->Name() + ": XGROUP CREATE " +
                                        o_.stream + " " + o_.group + ": " + ReplyText(r->get()));
    }
    return Status::Ok();
  }
  Status CreateGroup() { return CreateGroup(&fetch_conn_); }

  StatusOr<std::vector<std::unique_ptr<Delivery>>> Fetch(size_t max, Millis wait) override {
    std::vector<std::unique_ptr<Delivery>> out;
    const SteadyTime now = SteadyClock::now();
    const int count = static_cast<int>(std::min<size_t>(max, 10'000));
    if (count <= 0) return out;
    Status s;
    if (!history_done_) {
      s = ReadGroup(history_from_, count, Millis(0), &out, /*history=*/true);
    } else if (now >= next_reclaim_) {
      next_reclaim_ = now + o_.reclaim_interval;
      s = Reclaim(count, &out);
    } else {
      s = ClaimDueRetries(count, &out);
      if (s.ok() && out.empty()) {
        const Millis until_next = std::chrono::duration_cast<Millis>(
            std::min(next_reclaim_, NextRetry()) - now);
        const Millis block = std::clamp(until_next, Millis(1), std::min(wait, o_.block));
        s = ReadGroup(">", count, block, &out, false);
      }
    }
    // A hand-back waits for Redis only while the last fetch got an answer.
    hand_back_off_.store(!s.ok(), std::memory_order_relaxed);
    if (!s.ok()) return s;
    return out;
  }

  std::string Describe() const override {
    return "redis-streams " + o_.host + ":" + std::to_string(o_.port) + " stream=" + o_.stream +
           " group=" + o_.group + " consumer=" + o_.consumer;
  }

  // One XACK for all: its one answer is each delivery's.
  std::vector<Status> AckBatch(std::span<Delivery* const> deliveries) override {
    if (deliveries.empty()) return {};
    std::vector<std::string> args = {"XACK", o_.stream, o_.group};
    for (Delivery* d : deliveries) args.push_back(d->id());
    Status s = Send(args, "XACK");
    if (!s.ok()) {
      for (Delivery* d : deliveries) LeavePending(d->id(), Millis(500));
    }
    return std::vector<Status>(deliveries.size(), s);
  }

  // ---- settlement, from any thread ----

  Status Ack(const std::string& id) {
    Status s = Send({"XACK", o_.stream, o_.group, id}, "XACK");
    // The outcome is recorded: fetch it again, the next run gets DUPLICATE and acks.
    if (!s.ok()) LeavePending(id, Millis(500));
    return s;
  }

  // Retry(0), the drain's hand-back: the entry stays pending (this consumer's)
  // but is handed to the whole group at once. XCLAIM ... IDLE sets its idle time
  // to kHandBackIdle (at least reclaim_min_idle), so the next XAUTOCLAIM of any
  // consumer of the group takes it, not only this consumer under this name or
  // another after reclaim_min_idle; JUSTID: Redis counts no delivery for it, the
  // XAUTOCLAIM that takes it does. Its min-idle is the time since this consumer
  // received the entry: an entry delivered again since (taken over by another
  // consumer) is idle for less and is left alone. Once one has failed, or the
  // last fetch did (Redis does not answer), none is sent until a fetch succeeds
  // again: a drain handing back many entries pays the timeout at most once, and
  // what is not handed back so comes back after the reclaim min-idle as before.
  //
  // Its min-idle counts from the entry's last idle reset by this consumer
  // (EntryClock: its delivery, or an in-progress XCLAIM), and no in-progress
  // signal follows it: one in flight is waited for (progress_send_mu_), later
  // ones are not sent; one sent after it would set the idle time back to 0.
  // (Not waited for when no hand-back is sent: with Redis not answering, every
  // hand-back of a drain would wait for a round trip's timeout.)
  Status HandBack(const std::string& id, EntryClock& clock) {
    LeavePending(id, Millis(0));  // and this consumer's own next fetch, if any
    if (hand_back_off_.load(std::memory_order_relaxed)) {
      std::lock_guard lock(clock.mu);
      clock.handed_back = true;
      return Status::Unavailable("redis " + fetch_conn_.Name() +
                                 ": XCLAIM not sent: the last fetch or hand-back got no answer");
    }
    SteadyTime reset;
    {
      std::lock_guard send(progress_send_mu_);
      std::lock_guard lock(clock.mu);
      clock.handed_back = true;
      reset = clock.reset;
    }
    const auto since = std::chrono::duration_cast<Millis>(SteadyClock::now() - reset);
    const Millis idle = std::max(o_.reclaim_min_idle, kHandBackIdle);
    Status s = Send({"XCLAIM", o_.stream, o_.group, o_.consumer,
                     std::to_string(std::max<int64_t>(0, since.count())), id, "IDLE",
                     std::to_string(idle.count()), "JUSTID"},
                    "XCLAIM");
    if (!s.ok()) hand_back_off_.store(true, std::memory_order_relaxed);
    return s;
  }

  // Delivery::InProgress(): the entry's idle time is set back to 0 with
  // `XCLAIM <stream> <group> <consumer> <min-idle> <id> JUSTID` (JUSTID: Redis
  // counts no delivery for it), so that no XAUTOCLAIM (of another worker, or of
  // this one) takes the entry while its handler runs; the Consumer calls it
  // once per heartbeat interval of its Buffer (lease / 3), well inside
  // reclaim_min_idle (lease + 5 s by default). Its min-idle is the time since
  // this consumer last reset the entry's idle time: an entry another consumer
  // took over since (idle for less) is left to it, not taken back. An entry
  // acked meanwhile is no longer pending and XCLAIM (without FORCE) leaves it
  // alone. The Consumer calls InProgress() with its own lock held, so it only
  // queues the id; the source's progress thread sends what is queued in one
  // pipelined round trip. A failed round trip is answered by the next
  // InProgress() (once).
  Status QueueProgress(const std::string& id, const std::shared_ptr<EntryClock>& clock) {
    Status last;
    {
      std::lock_guard lock(progress_mu_);
      progress_[id] = clock;
      last = std::exchange(progress_error_, Status::Ok());
      if (!progress_thread_.joinable()) progress_thread_ = std::thread([this] { ProgressLoop(); });
    }
    progress_cv_.notify_one();
    return last;
  }

  void LeavePending(const std::string& id, Millis after) {
    std::lock_guard lock(mu_);
    retry_[id] = SteadyClock::now() + std::max(after, Millis(1));
  }

  Status DeadLetter(const StreamDelivery& d, const std::vector<std::pair<std::string, std::string>>& fields,
                    std::string_view reason) {
    std::vector<std::string> args = {"XADD", o_.dead_stream, "*"};
    for (const auto& [k, v] : fields) {
      args.push_back(k);
      args.push_back(v);
    }
    args.insert(args.end(), {"reason", std::string(reason), "entry_id", d.id()});
    Status s = Send(args, "XADD");
    if (s.ok()) s = Send({"XACK", o_.stream, o_.group, d.id()}, "XACK");
    if (!s.ok()) LeavePending(d.id(), Millis(500));
    return s;
  }

  const WorkerOptions& options() const { return o_; }
  const std::string& server() const { return server_; }

 private:
  std::unique_ptr<StreamConn> PooledConn() {
    {
      std::lock_guard lock(pool_mu_);
      if (!pool_.empty()) {
        std::unique_ptr<StreamConn> c = std::move(pool_.back());
        pool_.pop_back();
        return c;
      }
    }
    return std::make_unique<StreamConn>(Conn());
  }
  void ReturnConn(std::unique_ptr<StreamConn> c) {
    std::lock_guard lock(pool_mu_);
    pool_.push_back(std::move(c));
  }

  // One command on a pooled connection; an error reply is Unavailable.
  Status Send(const std::vector<std::string>& args, const char* what) {
    std::unique_ptr<StreamConn> c = PooledConn();
    auto r = c->Run(args);
    Status s;
    if (!r.ok()) {
      s = r.status();
    } else if (IsError(r->get())) {
      s = Status::Unavailable("redis " + c->Name() + ": " + what + ": " + ReplyText(r->get()));
    }
    ReturnConn(std::move(c));
    return s;
  }

  void ProgressLoop() {
    std::unique_lock lock(progress_mu_);
    while (true) {
      progress_cv_.wait(lock, [this] { return !progress_.empty() || progress_stop_; });
      if (progress_stop_) return;
      std::map<std::string, std::shared_ptr<EntryClock>> batch;
      batch.swap(progress_);
      lock.unlock();
      Status s = SendProgress(batch);
      lock.lock();
      if (!s.ok()) progress_error_ = std::move(s);
    }
  }

  Status SendProgress(const std::map<std::string, std::shared_ptr<EntryClock>>& batch) {
    std::lock_guard send(progress_send_mu_);
    std::vector<std::vector<std::string>> cmds;
    std::vector<EntryClock*> clocks;
    const SteadyTime now = SteadyClock::now();
    for (const auto& [id, clock] : batch) {
      std::lock_guard lock(clock->mu);
      if (clock->handed_back) continue;
      const auto since = std::chrono::duration_cast<Millis>(now - clock->reset);
      cmds.push_back({"XCLAIM", o_.stream, o_.group, o_.consumer,
                      std::to_string(std::max<int64_t>(0, since.count())), id, "JUSTID"});
      clocks.push_back(clock.get());
    }
    if (cmds.empty()) return Status::Ok();
    std::unique_ptr<StreamConn> c = PooledConn();
    auto r = c->RunAll(cmds);
    const SteadyTime answered = SteadyClock::now();
    Status s;
    if (!r.ok()) {
      s = r.status();
    } else {
      for (size_t i = 0; i < clocks.size(); ++i) {
        const redisReply* rep = (*r)[i].get();
        if (IsError(rep)) {
          if (s.ok()) s = Status::Unavailable("redis " + c->Name() + ": XCLAIM: " + ReplyText(rep));
          continue;
        }
        // [id] when it was still this consumer's; [] when acked, deleted, or
        // taken over by another consumer.
        if (rep->type == REDIS_REPLY_ARRAY && rep->elements == 1) {
          std::lock_guard lock(clocks[i]->mu);
          clocks[i]->reset = answered;
        }
      }
    }
    ReturnConn(std::move(c));
    return s;
  }

  SteadyTime NextRetry() {
    std::lock_guard lock(mu_);
    SteadyTime t = SteadyTime::max();
    for (const auto& [id, when] : retry_) t = std::min(t, when);
    return t;
  }

  bool WaitingRetry(const std::string& id) {
    std::lock_guard lock(mu_);
    return retry_.contains(id);
  }

  std::string KeyOf(const StreamMessage& m, std::string* error) const {
    if (o_.key_from_content) return o_.key_prefix + internal::HexSha256(m.CanonicalPayload());
    // XADD takes a field name more than once ("id 1 id 2"): which one is the key
    // is then a guess (the first was taken, and a handler's JSON on stdin held the
    // last), so such an entry has no key.
    const std::string* key = nullptr;
    for (const auto& [k, v] : m.fields) {
      if (k != o_.key_field) continue;
      if (key != nullptr) {
        *error = "key field '" + o_.key_field + "' given twice in the entry";
        return {};
      }
      key = &v;
    }
    if (key == nullptr) {
      *error = "missing key field '" + o_.key_field + "'";
      return {};
    }
    if (key->empty()) *error = "empty key field '" + o_.key_field + "'";
    return key->empty() ? std::string() : o_.key_prefix + *key;
  }

  // Entries of a reply -> deliveries; deleted ones are XACKed here.
  Status Take(const redisReply* entries, bool skip_waiting, uint32_t count,
              std::vector<std::unique_ptr<Delivery>>* out, std::string* last_id) {
    std::vector<std::string> gone;
    for (size_t i = 0; i < entries->elements; ++i) {
      StreamMessage m;
      bool has_body = false;
      if (!ParseEntry(entries->element[i], &m, &has_body)) continue;
      if (last_id != nullptr) *last_id = m.id;
      if (!has_body) {
        gone.push_back(m.id);  // deleted from the stream: nothing left to process
        std::lock_guard lock(mu_);
        retry_.erase(m.id);
        continue;
      }
      if (skip_waiting && WaitingRetry(m.id)) continue;  // fetched when its time comes
      std::string error;
      std::string key = KeyOf(m, &error);
      out->push_back(std::make_unique<StreamDelivery>(this, std::move(m), std::move(key),
                                                      std::move(error), count));
    }
    if (!gone.empty()) {
      std::vector<std::string> args = {"XACK", o_.stream, o_.group};
      args.insert(args.end(), gone.begin(), gone.end());
      auto r = fetch_conn_.Run(args);
      if (!r.ok()) return r.status();
    }
    return Status::Ok();
  }

  Status ReadGroup(const std::string& from, int count, Millis block,
                   std::vector<std::unique_ptr<Delivery>>* out, bool history) {
    std::vector<std::string> args = {"XREADGROUP", "GROUP", o_.group, o_.consumer,
                                     "COUNT", std::to_string(count)};
    if (from == ">") {
      args.push_back("BLOCK");
      args.push_back(std::to_string(block.count()));
    }
    args.insert(args.end(), {"STREAMS", o_.stream, from});
    auto r = fetch_conn_.Run(args, block);
    if (!r.ok()) return r.status();
    const redisReply* rep = r->get();
    if (IsError(rep)) {
      // NOGROUP after a Redis restart that lost the group: create it again.
      if (ReplyText(rep).rfind("NOGROUP", 0) == 0) return CreateGroup();
      return Status::Unavailable("redis " + fetch_conn_.Name() + ": XREADGROUP: " +
                                 ReplyText(rep));
    }
    std::string last;
    size_t before = out->size();
    size_t seen = 0;
    if (rep->type == REDIS_REPLY_ARRAY) {
      for (size_t i = 0; i < rep->elements; ++i) {
        const redisReply* s = rep->element[i];
        if (s->type == REDIS_REPLY_ARRAY && s->elements == 2 &&
            s->element[1]->type == REDIS_REPLY_ARRAY) {
          seen += s->element[1]->elements;
          // New entries are delivered once; history entries were delivered
          // before (their count is asked of XPENDING below).
          DEDUP_RETURN_IF_ERROR(Take(s->element[1], history, history ? 0 : 1, out, &last));
        }
      }
    }
    // Redis does not count a re-read of the history as a delivery: + 1.
    if (history) FillDeliveryCounts(out, before, 1);
    if (history) {
      if (seen == 0) {
        history_done_ = true;
      } else {
        history_from_ = last;
      }
    }
    return Status::Ok();
  }

  Status Reclaim(int count, std::vector<std::unique_ptr<Delivery>>* out) {
    auto r = fetch_conn_.Run({"XAUTOCLAIM", o_.stream, o_.group, o_.consumer,
                              std::to_string(o_.reclaim_min_idle.count()), reclaim_cursor_,
                              "COUNT", std::to_string(count)});
    if (!r.ok()) return r.status();
    const redisReply* rep = r->get();
    if (IsError(rep)) {
      if (ReplyText(rep).rfind("NOGROUP", 0) == 0) return CreateGroup();
      return Status::Unavailable("redis " + fetch_conn_.Name() + ": XAUTOCLAIM: " +
                                 ReplyText(rep));
    }
    // Redis 7: [next-cursor, [entries], [deleted ids]].
    if (rep->type != REDIS_REPLY_ARRAY || rep->elements < 2) {
      return Status::Internal("XAUTOCLAIM: unexpected reply shape");
    }
    reclaim_cursor_ = ReplyText(rep->element[0]);
    if (reclaim_cursor_.empty()) reclaim_cursor_ = "0-0";
    if (rep->element[1]->type == REDIS_REPLY_ARRAY) {
      const size_t before = out->size();
      DEDUP_RETURN_IF_ERROR(Take(rep->element[1], true, 0, out, nullptr));
      FillDeliveryCounts(out, before, 0);  // XAUTOCLAIM counted itself
    }
    return Status::Ok();
  }

  // Own entries whose retry time has come: XCLAIM them (min-idle 0) to reset
  // their idle time and read their current fields.
  Status ClaimDueRetries(int count, std::vector<std::unique_ptr<Delivery>>* out) {
    std::vector<std::string> ids;
    {
      std::lock_guard lock(mu_);
      const SteadyTime now = SteadyClock::now();
      for (auto it = retry_.begin(); it != retry_.end() && static_cast<int>(ids.size()) < count;) {
        if (it->second <= now) {
          ids.push_back(it->first);
          it = retry_.erase(it);
        } else {
          ++it;
        }
      }
    }
    if (ids.empty()) return Status::Ok();
    std::vector<std::string> args = {"XCLAIM", o_.stream, o_.group, o_.consumer, "0"};
    args.insert(args.end(), ids.begin(), ids.end());
    auto r = fetch_conn_.Run(args);
    if (!r.ok() || IsError(r->get()) || r->get()->type != REDIS_REPLY_ARRAY) {
      for (const auto& id : ids) LeavePending(id, Millis(500));
      if (!r.ok()) return r.status();
      return Status::Unavailable("redis " + fetch_conn_.Name() + ": XCLAIM: " +
                                 ReplyText(r->get()));
    }
    const size_t before = out->size();
    DEDUP_RETURN_IF_ERROR(Take(r->get(), false, 0, out, nullptr));
    FillDeliveryCounts(out, before, 0);  // XCLAIM counted itself
    return Status::Ok();
  }

  // XAUTOCLAIM, XCLAIM and XREADGROUP of the history return entries without
  // their delivery count: XPENDING tells it, for every id of (*out)[from...], in
  // one pipelined round trip; `add` is added to Redis's count. Counts stay 0 when
  // Redis does not answer (the deliveries are good without them).
  void FillDeliveryCounts(std::vector<std::unique_ptr<Delivery>>* out, size_t from,
                          uint32_t add) {
    if (out->size() <= from) return;
    std::vector<std::vector<std::string>> cmds;
    cmds.reserve(out->size() - from);
    for (size_t i = from; i < out->size(); ++i) {
      const std::string& id = (*out)[i]->id();
      cmds.push_back({"XPENDING", o_.stream, o_.group, id, id, "1"});
    }
    auto r = fetch_conn_.RunAll(cmds);
    if (!r.ok()) return;
    for (size_t i = from; i < out->size(); ++i) {
      // [[id, consumer, idle ms, delivery count]]
      const redisReply* p = (*r)[i - from].get();
      if (p == nullptr || p->type != REDIS_REPLY_ARRAY || p->elements != 1) continue;
      const redisReply* e = p->element[0];
      if (e == nullptr || e->type != REDIS_REPLY_ARRAY || e->elements < 4 ||
          e->element[3]->type != REDIS_REPLY_INTEGER || e->element[3]->integer < 0) {
        continue;
      }
      const auto n = static_cast<uint64_t>(e->element[3]->integer) + add;
      static_cast<StreamDelivery*>((*out)[i].get())
          ->set_delivery_count(static_cast<uint32_t>(std::min<uint64_t>(n, UINT32_MAX)));
    }
  }

  WorkerOptions o_;
  const std::string server_;
  // Fetch runs on one thread at a time: its connection and cursors need no lock.
  StreamConn fetch_conn_;
  bool history_done_ = false;
  std::string history_from_ = "0";
  SteadyTime next_reclaim_ = SteadyClock::now();
  std::string reclaim_cursor_ = "0-0";

  std::mutex mu_;
  std::map<std::string, SteadyTime> retry_;  // own entries left pending, by id
  std::atomic<bool> hand_back_off_{false};   // the last fetch or a hand-back since failed

  std::mutex pool_mu_;
  std::vector<std::unique_ptr<StreamConn>> pool_;  // for settlements

  // The in-progress signal (QueueProgress): ids queued since the last round,
  // the last round's failure, and the thread that sends them; a round in
  // flight holds progress_send_mu_ (HandBack waits for it).
  std::mutex progress_mu_;
  std::condition_variable progress_cv_;
  std::map<std::string, std::shared_ptr<EntryClock>> progress_;
  Status progress_error_;
  bool progress_stop_ = false;
  std::thread progress_thread_;
  std::mutex progress_send_mu_;
};

StreamDelivery::StreamDelivery(StreamsSource* source, StreamMessage m, std::string key,
                               std::string key_error, uint32_t count)
    : source_(source) {
  id_ = std::move(m.id);
  key_ = std::move(key);
  key_error_ = std::move(key_error);
  payload_ = m.CanonicalPayload();
  delivery_count_ = count;
  attributes_ = std::move(m.fields);
  ack_.kind = "redis-stream";
  ack_.server = source_->server();
  ack_.target = source_->options().stream;
  ack_.group = source_->options().group;
  ack_.id = id_;
}

Status StreamDelivery::Ack() { return source_->Ack(id_); }

Status StreamDelivery::Retry(Millis after) {
  if (after.count() == 0) return source_->HandBack(id_, *clock_);
  source_->LeavePending(id_, after);
  return Status::Ok();
}

Status StreamDelivery::DeadLetter(std::string_view reason) {
  return source_->DeadLetter(*this, attributes_, reason);
}

Status StreamDelivery::InProgress() {
  {
    std::lock_guard lock(clock_->mu);
    if (clock_->handed_back) return Status::Ok();
  }
  return source_->QueueProgress(id_, clock_);
}

}  // namespace

streams::ConnOptions StreamConnOptions(const WorkerOptions& o) {
  ConnOptions c;
  c.host = o.host;
  c.port = o.port;
  c.user = o.user;
  c.password = o.password;
  c.has_password = o.has_password;
  c.db = o.db;
  c.timeout = o.timeout;
  return c;
}

StatusOr<std::unique_ptr<MessageSource>> OpenRedisStreamsSource(WorkerOptions o, Millis lease) {
  if (o.stream.empty()) return Status::InvalidArgument("redis streams: stream is empty");
  if (o.group.empty()) return Status::InvalidArgument("redis streams: group is empty");
  if (o.key_field.empty()) return Status::InvalidArgument("redis streams: key field is empty");
  DEDUP_RETURN_IF_ERROR(brokers::CheckKeyPrefix(o.key_prefix, o.key_from_content, "redis streams"));
  if (o.block.count() < 1) o.block = Millis(1);
  if (o.timeout.count() <= 0) {
    return Status::InvalidArgument("redis streams: timeout must be positive");
  }
  if (o.reclaim_interval.count() <= 0) {
    return Status::InvalidArgument("redis streams: reclaim interval must be positive");
  }
  if (o.reclaim_min_idle.count() < 0) {
    return Status::InvalidArgument("redis streams: reclaim min-idle must not be negative");
  }
  if (o.reclaim_min_idle.count() == 0) o.reclaim_min_idle = lease + Millis(5'000);
  if (o.consumer.empty()) {
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    o.consumer = std::string(host) + "-" + std::to_string(getpid());
  }
  if (o.dead_stream.empty()) o.dead_stream = o.stream + ":dead";
  auto s = std::make_unique<StreamsSource>(std::move(o));
  DEDUP_RETURN_IF_ERROR(s->CreateGroup());
  return std::unique_ptr<MessageSource>(std::move(s));
}

}  // namespace dedup
