// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The worker's one-round-trip complete + ack (complete_ack.lua) on a real
// redis-server: started on 127.0.0.1 on a free port in 6440-6449, in a temporary
// directory, stopped by PID. Round trips are counted on the server with MONITOR,
// which shows commands a client sent ("[0 127.0.0.1:port]") apart from those a
// script ran ("[0 lua]").

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dedup/buffer.h"
#include "redis_admin.h"
#include "test_process.h"
#include "dedup/worker.h"
#include "stores/redis/redis_store.h"
#include "core/uri.h"

extern char** environ;

namespace dedup {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

using testing::PortFree;
using testing::Spawn;
using testing::Admin;
using testing::AdminList;

// redis-server on the first free port in 6440-6449, stopped by PID.
class Server {
 public:
  Server() {
    char tmpl[] = "/tmp/dedup-worker-ack.XXXXXX";
    dir_ = mkdtemp(tmpl) ? tmpl : "";
    for (int p = 6440; p <= 6449 && port_ == 0; ++p) {
      if (!PortFree(p)) continue;
      pid_ = Spawn({"redis-server", "--port", std::to_string(p), "--bind", "127.0.0.1", "--dir",
                    dir_, "--save", "", "--appendonly", "no", "--daemonize", "no"});
      if (pid_ <= 0) break;
      for (auto until = SteadyClock::now() + 5s; SteadyClock::now() < until;
           std::this_thread::sleep_for(20ms)) {
        if (Admin(p, {"PING"}) == "PONG") {
          port_ = p;
          break;
        }
        int st;
        if (waitpid(pid_, &st, WNOHANG) == pid_) {  // lost the port race
          pid_ = -1;
          break;
        }
      }
      if (port_ == 0 && pid_ > 0) Kill();
    }
  }
  ~Server() {
    Kill();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  int port() const { return port_; }

 private:
  void Kill() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    int st;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

// MONITOR on its own connection; counts what clients sent and what scripts ran,
// until it sees ECHO of the stop marker.
class Monitor {
 public:
  explicit Monitor(int port) {
    timeval tv{5, 0};
    c_ = redisConnectWithTimeout("127.0.0.1", port, tv);
    auto* r = static_cast<redisReply*>(redisCommand(c_, "MONITOR"));
    if (r) freeReplyObject(r);
    thread_ = std::thread([this] {
      while (true) {
        void* v = nullptr;
        if (redisGetReply(c_, &v) != REDIS_OK || v == nullptr) return;
        auto* r = static_cast<redisReply*>(v);
        std::string line(r->str ? r->str : "", r->str ? r->len : 0);
        freeReplyObject(r);
        if (line.find("\"dedup-test-stop\"") != std::string::npos) return;
        std::lock_guard lock(mu_);
        lines_.push_back(line);
      }
    });
  }
  // Waits until every command sent before this call was seen.
  void Finish(int port) {
    Admin(port, {"ECHO", "dedup-test-stop"});
    thread_.join();
    redisFree(c_);
  }
  // Commands named `cmd` (e.g. "\"XACK\""), sent by a client (from_lua = false)
  // or run by a script (true).
  int Count(const std::string& cmd, bool from_lua) {
    std::lock_guard lock(mu_);
    int n = 0;
    for (const std::string& l : lines_) {
      const size_t at = l.find("] ");
      if (at == std::string::npos || l.compare(at + 2, cmd.size(), cmd) != 0) continue;
      const bool lua = l.find(" lua]") != std::string::npos && l.find(" lua]") < at + 1;
      if (lua == from_lua) ++n;
    }
    return n;
  }

  void Dump() {
    std::lock_guard lock(mu_);
    for (const std::string& l : lines_) std::printf("%s\n", l.substr(0, 160).c_str());
  }

 private:
  redisContext* c_ = nullptr;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> lines_;
};

struct RunResult {
  WorkerMetrics metrics;
  int client_xack = 0, lua_xack = 0, client_evalsha = 0, client_set = 0;
};

// Publishes n messages to `stream` and runs a Worker over them with a Buffer on a
// Redis store on the same server, database `db`.
RunResult RunWorker(int port, int db, const std::string& stream, int n) {
  for (int i = 0; i < n; ++i) {
    Admin(port, {"XADD", stream, "*", "id", stream + "-" + std::to_string(i), "v", "x"});
  }
  RedisStoreOptions so;
  so.hosts = {"127.0.0.1:" + std::to_string(port)};
  so.db = db;
  auto store = OpenRedisStore(so);
  EXPECT_TRUE(store.ok()) << store.status().ToString();
  Buffer buffer(store->get(), BufferOptions{});
  WorkerOptions wo;
  wo.host = "127.0.0.1";
  wo.port = port;
  wo.stream = stream;
  wo.group = "g";
  wo.consumer = "c1";
  wo.block = Millis(50);
  auto w = Worker::Open(wo);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  Monitor mon(port);
  std::thread run([&] {
    Status s = (*w)->Run(&buffer, [](const StreamMessage&, ClaimGuard&) {
      return HandlerResult::Done("ok");
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  for (auto until = SteadyClock::now() + 30s;
       SteadyClock::now() < until && (*w)->metrics().acked < static_cast<uint64_t>(n);) {
    std::this_thread::sleep_for(10ms);
  }
  (*w)->Stop();
  run.join();
  mon.Finish(port);
  RunResult r;
  r.metrics = (*w)->metrics();
  r.client_xack = mon.Count("\"XACK\"", false);
  r.lua_xack = mon.Count("\"XACK\"", true);
  // One EVALSHA per script run. The first ones of a script on a fresh server
  // answer NOSCRIPT and are sent again as EVAL (once per script and server, not
  // per message): those resends are not counted.
  r.client_evalsha = mon.Count("\"EVALSHA\"", false);
  r.client_set = mon.Count("\"SET\"", false);
  if (std::getenv("WORKER_ACK_TEST_DUMP")) mon.Dump();
  return r;
}

TEST(WorkerAck, OneRoundTripForCompleteAndAckOnTheSameRedis) {
  Server server;
  if (server.port() == 0) GTEST_SKIP() << "no redis-server, or no free port in 6440-6449";
  const int n = 200;

  // Store on database 1: another keyspace, so the two-round-trip path.
  RunResult two = RunWorker(server.port(), 1, "s-two", n);
  EXPECT_EQ(two.metrics.acked, static_cast<uint64_t>(n));
  EXPECT_EQ(two.metrics.acked_with_complete, 0u);
  // Acks of finished messages are coalesced (Consumer max_ack_delay): fewer XACKs
  // than messages, each acking several entries.
  EXPECT_GE(two.client_xack, 1);
  EXPECT_LT(two.client_xack, n);
  EXPECT_EQ(two.metrics.acked_in_batches, static_cast<uint64_t>(n));
  EXPECT_EQ(two.lua_xack, 0);
  // Completions are coalesced too (Consumer batch_completions): one script call
  // per Buffer::CompleteBatch (complete_batch.lua, or complete.lua for one alone),
  // plus at most one EVALSHA per script sent again after NOSCRIPT on first use
  // from a pipeline.
  EXPECT_EQ(two.metrics.completed_in_batches, static_cast<uint64_t>(n));
  EXPECT_GE(two.client_evalsha, static_cast<int>(two.metrics.complete_batches));
  EXPECT_LE(two.client_evalsha, static_cast<int>(two.metrics.complete_batches) + 2);
  EXPECT_EQ(two.client_set, n);      // the claim (pipelined by batch claims)

  // Store on database 0 of the stream's server: complete and ack in one script.
  RunResult one = RunWorker(server.port(), 0, "s-one", n);
  EXPECT_EQ(one.metrics.acked, static_cast<uint64_t>(n));
  EXPECT_EQ(one.metrics.acked_with_complete, static_cast<uint64_t>(n));
  EXPECT_EQ(one.client_xack, 0);     // no XACK round trip of its own
  // Every XACK ran inside complete_ack.lua / complete_ack_stream.lua, which acks
  // the entries of one batch with one XACK.
  EXPECT_GE(one.lua_xack, 1);
  EXPECT_LE(one.lua_xack, static_cast<int>(one.metrics.complete_batches));
  EXPECT_EQ(one.metrics.completed_in_batches, static_cast<uint64_t>(n));
  // complete_ack_stream.lua (complete_ack.lua for one alone): one per batch.
  EXPECT_GE(one.client_evalsha, static_cast<int>(one.metrics.complete_batches));
  EXPECT_LE(one.client_evalsha, static_cast<int>(one.metrics.complete_batches) + 2);
  EXPECT_EQ(one.client_set, n);
  EXPECT_EQ(Admin(server.port(), {"XLEN", "s-one"}), std::to_string(n));
  // Nothing pending.
  EXPECT_EQ(Admin(server.port(), {"EVAL",
                                "return redis.call('XPENDING', KEYS[1], 'g')[1]", "1", "s-one"}),
            "0");

  const double before = double(two.client_evalsha + two.client_xack) / n;
  const double after = double(one.client_evalsha + one.client_xack) / n;
  std::printf("round trips per message for complete+ack: separate %.2f, fused %.2f "
              "(%.1f completions per batch)\n",
              before, after, double(n) / std::max<double>(1, one.metrics.complete_batches));
  std::printf("round trips per message (claim+complete+ack): separate %.2f, fused %.2f\n",
              double(two.client_set + two.client_evalsha + two.client_xack) / n,
              double(one.client_set + one.client_evalsha + one.client_xack) / n);
  // 200 messages fetched several at a time: batches of more than one, so fewer
  // round trips than messages for complete + ack, fused or not.
  EXPECT_LT(after, 1.0);
  EXPECT_LT(before, 2.0);
  // Not compared with each other: the two runs' batch sizes depend on timing (on a
  // busy machine the fused run may get smaller batches and so more round trips per
  // message). What fusing saves is asserted per batch above: no XACK round trip of
  // its own, and one script call per completion batch.
}

// The hook itself: LOST acks nothing (the entry stays pending), a failed
// completion does not use it, OK acks.
TEST(WorkerAck, LostDoesNotAck) {
  Server server;
  if (server.port() == 0) GTEST_SKIP() << "no redis-server, or no free port in 6440-6449";
  const int port = server.port();
  ASSERT_EQ(Admin(port, {"XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"}), "OK");
  const std::string id = Admin(port, {"XADD", "s", "*", "id", "k"});
  ASSERT_EQ(AdminList(port, {"XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"}).size(), 1u);
  const auto pending = [&] {
    return Admin(port, {"EVAL", "return redis.call('XPENDING', KEYS[1], 'g')[1]", "1", "s"});
  };
  ASSERT_EQ(pending(), "1");

  RedisStoreOptions so;
  so.hosts = {"127.0.0.1:" + std::to_string(port)};
  auto store = OpenRedisStore(so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string here = internal::RedisServerIdentity("127.0.0.1", port, 0);
  const auto ack_on = [](std::string_view server, std::string_view id) {
    return BrokerAck{"redis-stream", server, "s", "g", id};
  };
  const std::string other_db = internal::RedisServerIdentity("127.0.0.1", port, 1);
  const std::string other_port = internal::RedisServerIdentity("127.0.0.1", port + 1, 0);
  const std::string local = internal::RedisServerIdentity("localhost", port, 0);
  EXPECT_TRUE((*store)->CanCompleteWithAck(ack_on(here, id)));
  EXPECT_TRUE((*store)->CanCompleteWithAck(ack_on(local, id)));
  EXPECT_FALSE((*store)->CanCompleteWithAck(ack_on(other_db, id)));
  EXPECT_FALSE((*store)->CanCompleteWithAck(ack_on(other_port, id)));
  EXPECT_FALSE((*store)->CanCompleteWithAck(BrokerAck{"amqp", here, "s", "g", id}));
  // Forwarded by StoreWrapper: a wrapped store keeps the capability.
  StoreWrapper wrapped(store->get());
  EXPECT_TRUE(wrapped.CanCompleteWithAck(ack_on(here, id)));

  ClaimRequest req;
  req.key = "k";
  req.lease = Millis(30'000);
  req.retention = Millis(60'000);
  auto c = (*store)->Claim(req);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->acquired());

  const BrokerAck ack = ack_on(here, id);
  // A stale owner (another token): LOST, nothing acked.
  auto w = wrapped.CompleteWithAck("k", Token::Random(), req.retention, CompletionStatus::kOk,
                                   "r", ack);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->write, WriteResult::kLost);
  EXPECT_FALSE(w->acked);
  EXPECT_EQ(pending(), "1");
  // The owner: OK and acked, in one script.
  w = wrapped.CompleteWithAck("k", c->token, req.retention, CompletionStatus::kOk, "r", ack);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ(w->write, WriteResult::kOk);
  EXPECT_TRUE(w->acked);
  EXPECT_EQ(pending(), "0");

  // A failed completion is recorded but never acks (dead-letter comes first).
  ASSERT_TRUE(AdminList(port, {"XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"}).empty());
  const std::string id2 = Admin(port, {"XADD", "s", "*", "id", "f"});
  ASSERT_EQ(AdminList(port, {"XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"}).size(), 1u);
  req.key = "f";
  auto f = (*store)->Claim(req);
  ASSERT_TRUE(f.ok() && f->acquired());
  auto wf = (*store)->CompleteWithAck("f", f->token, req.retention, CompletionStatus::kFailed,
                                      "bad", ack_on(here, id2));
  ASSERT_TRUE(wf.ok());
  EXPECT_EQ(wf->write, WriteResult::kOk);
  EXPECT_FALSE(wf->acked);
  EXPECT_EQ(pending(), "1");

  // OK completion, entry no longer pending: completed, reported not acked.
  req.key = "g2";
  auto g2 = (*store)->Claim(req);
  ASSERT_TRUE(g2.ok() && g2->acquired());
  auto wg = (*store)->CompleteWithAck("g2", g2->token, req.retention, CompletionStatus::kOk, "",
                                      ack_on(here, id));
  ASSERT_TRUE(wg.ok());
  EXPECT_EQ(wg->write, WriteResult::kOk);
  EXPECT_FALSE(wg->acked);
}

// complete_ack_stream.lua (what the store sends for a batch of fused
// completions): LOST acks nothing; the OK ones of a batch are acked
// with one XACK and answer acked only when every one of them was acked.
TEST(WorkerAck, BatchAcksOnlyWhatCompleted) {
  Server server;
  if (server.port() == 0) GTEST_SKIP() << "no redis-server, or no free port in 6440-6449";
  const int port = server.port();
  ASSERT_EQ(Admin(port, {"XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"}), "OK");
  std::vector<std::string> ids;
  for (const char* k : {"a", "b", "c", "d"}) ids.push_back(Admin(port, {"XADD", "s", "*", "id", k}));
  ASSERT_EQ(AdminList(port, {"XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"}).size(), 1u);
  const auto pending = [&] {
    return Admin(port, {"EVAL", "return redis.call('XPENDING', KEYS[1], 'g')[1]", "1", "s"});
  };
  ASSERT_EQ(pending(), "4");
  RedisStoreOptions so;
  so.hosts = {"127.0.0.1:" + std::to_string(port)};
  auto store = OpenRedisStore(so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string here = internal::RedisServerIdentity("127.0.0.1", port, 0);
  std::vector<BrokerAck> acks;
  for (const std::string& id : ids) acks.push_back(BrokerAck{"redis-stream", here, "s", "g", id});
  std::vector<Token> tokens;
  for (const char* k : {"a", "b", "c", "d"}) {
    ClaimRequest req;
    req.key = k;
    auto c = (*store)->Claim(req);
    ASSERT_TRUE(c.ok() && c->acquired());
    tokens.push_back(c->token);
  }
  const auto req = [&](size_t i, Token t) {
    CompleteRequest q;
    q.key = std::string_view("abcd").substr(i, 1);
    q.token = t;
    q.ack = &acks[i];
    return q;
  };
  // a OK, b LOST (a stale token): one XACK for a alone; b stays pending.
  std::vector<CompleteRequest> first = {req(0, tokens[0]), req(1, Token::Random())};
  auto w = (*store)->CompleteBatch(first);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_EQ((*w)[0].write, WriteResult::kOk);
  EXPECT_TRUE((*w)[0].acked);
  EXPECT_EQ((*w)[1].write, WriteResult::kLost);
  EXPECT_FALSE((*w)[1].acked);
  EXPECT_EQ(pending(), "3");
  // c's entry is no longer pending: the XACK of c and d acks one of two, so
  // neither answers acked (the caller acks them itself); both are completed.
  ASSERT_EQ(Admin(port, {"XACK", "s", "g", ids[2]}), "1");
  std::vector<CompleteRequest> second = {req(1, tokens[1]), req(2, tokens[2]), req(3, tokens[3])};
  second[0].status = CompletionStatus::kFailed;  // never fused: completed, not acked
  w = (*store)->CompleteBatch(second);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (const AckedWrite& a : *w) {
    EXPECT_EQ(a.write, WriteResult::kOk);
    EXPECT_FALSE(a.acked);
  }
  EXPECT_EQ(pending(), "1");  // b (failed: the caller dead-letters it); d was acked
}

// A fused batch after SCRIPT FLUSH: every run of the batch (complete_ack_stream
// for two groups, complete_batch between) answers NOSCRIPT, is sent again once
// with its script's body, and runs once: a second run would answer LOST. The
// tokens hold the bytes Lua patterns treat specially (% NUL ] - ^), sent as
// 8 raw bytes.
TEST(WorkerAck, FusedBatchAfterScriptFlushRunsOnce) {
  Server server;
  if (server.port() == 0) GTEST_SKIP() << "no redis-server, or no free port in 6440-6449";
  const int port = server.port();
  ASSERT_EQ(Admin(port, {"XGROUP", "CREATE", "s", "g", "$", "MKSTREAM"}), "OK");
  ASSERT_EQ(Admin(port, {"XGROUP", "CREATE", "s", "h", "$"}), "OK");
  std::vector<std::string> ids;
  for (const char* k : {"a", "b", "c", "d", "e"}) ids.push_back(Admin(port, {"XADD", "s", "*", "id", k}));
  ASSERT_EQ(AdminList(port, {"XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", ">"}).size(), 1u);
  ASSERT_EQ(AdminList(port, {"XREADGROUP", "GROUP", "h", "c", "STREAMS", "s", ">"}).size(), 1u);
  const auto pending = [&](const char* group) {
    return Admin(port, {"EVAL", "return redis.call('XPENDING', KEYS[1], ARGV[1])[1]", "1", "s",
                      group});
  };
  RedisStoreOptions so;
  so.hosts = {"127.0.0.1:" + std::to_string(port)};
  auto store = OpenRedisStore(so);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const std::string here = internal::RedisServerIdentity("127.0.0.1", port, 0);
  // IN_PROGRESS records (fence 1, attempt 1) written with chosen tokens.
  const uint64_t toks[5] = {0x25005d2d5e000001, 0x5d5e2d25005d0025, 0x00000000000000ff,
                            0x2500000000000000, 0x5e5d2d2525255d00};
  const char* keys[5] = {"a", "b", "c", "d", "e"};
  for (int i = 0; i < 5; ++i) {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(toks[i]));
    ASSERT_EQ(Admin(port, {"EVAL",
                         "return redis.call('SET', KEYS[1], 'A' .. struct.pack('>I4I4', "
                         "tonumber(string.sub(ARGV[1], 1, 8), 16), tonumber(string.sub(ARGV[1], "
                         "9), 16)) .. '\\1\\1\\5', 'PX', 600000)",
                         "1", std::string("dedup:") + keys[i], hex}),
              "OK");
  }
  std::vector<BrokerAck> acks;
  for (int i = 0; i < 5; ++i) {
    acks.push_back(BrokerAck{"redis-stream", here, "s", i < 3 ? "g" : "h", ids[i]});
  }
  std::vector<std::string> results;
  for (int i = 0; i < 5; ++i) results.push_back(std::string("r\0%]", 4) + keys[i]);
  std::vector<CompleteRequest> batch;
  for (int i = 0; i < 5; ++i) {
    CompleteRequest q;
    q.key = keys[i];
    q.token = Token{toks[i]};
    q.ack = &acks[i];
    q.result = results[i];
    batch.push_back(q);
  }
  batch[2].status = CompletionStatus::kFailed;  // a complete_batch run between the two
  ASSERT_EQ(Admin(port, {"SCRIPT", "FLUSH"}), "OK");
  auto w = (*store)->CompleteBatch(batch);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ((*w)[i].write, WriteResult::kOk) << keys[i];
    EXPECT_EQ((*w)[i].acked, i != 2) << keys[i];
    auto r = (*store)->Inspect(keys[i]);
    ASSERT_TRUE(r.ok() && r->has_value()) << keys[i];
    EXPECT_EQ((*r)->state, RecordState::kCompleted) << keys[i];
    EXPECT_EQ((*r)->token, Token{toks[i]}) << keys[i];
    EXPECT_EQ((*r)->result, results[i]) << keys[i];
  }
  EXPECT_EQ(pending("g"), "3");  // a, b acked; c failed (the caller's), d, e are h's
  EXPECT_EQ(pending("h"), "3");  // d, e acked
}

// The fused path is what a wrapped store runs too: a StoreWrapper (e.g. a
// counting one, as dedup bench uses) keeps one round trip per complete + ack.
TEST(WorkerAck, WrappedStoreKeepsTheFusedAck) {
  Server server;
  if (server.port() == 0) GTEST_SKIP() << "no redis-server, or no free port in 6440-6449";
  const int n = 50;
  for (int i = 0; i < n; ++i) {
    Admin(server.port(), {"XADD", "w", "*", "id", "w-" + std::to_string(i)});
  }
  RedisStoreOptions so;
  so.hosts = {"127.0.0.1:" + std::to_string(server.port())};
  auto store = OpenRedisStore(so);
  ASSERT_TRUE(store.ok());
  StoreWrapper wrapped(store->get());
  Buffer buffer(&wrapped, BufferOptions{});
  WorkerOptions wo;
  wo.port = server.port();
  wo.stream = "w";
  wo.group = "g";
  wo.consumer = "c1";
  wo.block = Millis(50);
  auto w = Worker::Open(wo);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  std::thread run([&] {
    Status s = (*w)->Run(&buffer, [](const StreamMessage&, ClaimGuard&) {
      return HandlerResult::Done();
    });
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  for (auto until = SteadyClock::now() + 30s;
       SteadyClock::now() < until && (*w)->metrics().acked < static_cast<uint64_t>(n);) {
    std::this_thread::sleep_for(10ms);
  }
  (*w)->Stop();
  run.join();
  EXPECT_EQ((*w)->metrics().acked, static_cast<uint64_t>(n));
  EXPECT_EQ((*w)->metrics().acked_with_complete, static_cast<uint64_t>(n));
}

}  // namespace
}  // namespace dedup
