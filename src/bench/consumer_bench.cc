// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "bench/consumer_bench.h"

#ifdef DEDUP_WITH_REDIS_STREAMS

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "brokers/redis_streams/stream_conn.h"
#include "brokers/redis_streams/streams_source.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/store.h"

namespace dedup::bench {
namespace {

using json = nlohmann::json;
using Clk = std::chrono::steady_clock;

// Counts store calls: each is one round trip on a server store. Forwards the
// fused-ack capability (StoreWrapper does), so the path measured is users' path.
class ConsumerRoundTrips : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    ++calls;
    return StoreWrapper::Claim(req);
  }
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    ++calls;
    return StoreWrapper::ClaimBatch(reqs);
  }
  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    ++calls;
    return StoreWrapper::Extend(key, token, lease);
  }
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    ++calls;
    return StoreWrapper::Complete(key, token, retention, status, result);
  }
  StatusOr<AckedWrite> CompleteWithAck(std::string_view key, Token token, Millis retention,
                                       CompletionStatus status, std::string_view result,
                                       const BrokerAck& ack) override {
    ++calls;
    return StoreWrapper::CompleteWithAck(key, token, retention, status, result, ack);
  }
  StatusOr<std::vector<AckedWrite>> CompleteBatch(
      std::span<const CompleteRequest> reqs) override {
    ++calls;
    return StoreWrapper::CompleteBatch(reqs);
  }
  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    ++calls;
    return StoreWrapper::Release(key, token, retention);
  }
  std::atomic<uint64_t> calls{0};
};

struct ConsumerContender {
  std::string id, label;
  std::unique_ptr<Store> store;  // null: no guard
  std::unique_ptr<ConsumerRoundTrips> counter;
  std::unique_ptr<Buffer> buffer;
  std::vector<double> rates, cmds, trips, ratios;
  uint64_t errors = 0;
  std::vector<double> batch_sizes;  // outcomes per completer batch, per round
};

// A contender with no figures yet (`store` null: no guard).
ConsumerContender MakeContender(std::string id, std::string label, std::unique_ptr<Store> store) {
  ConsumerContender c;
  c.id = std::move(id);
  c.label = std::move(label);
  c.store = std::move(store);
  return c;
}

long long TotalCommands(streams::StreamConn& c) {
  auto r = c.Run({"INFO", "stats"});
  if (!r.ok()) return -1;
  const std::string text = streams::ReplyText(r->get());
  const std::string key = "total_commands_processed:";
  const size_t at = text.find(key);
  return at == std::string::npos ? -1 : std::atoll(text.c_str() + at + key.size());
}

}  // namespace

json RunConsumerBench(const ConsumerBenchOptions& o) {
  streams::ConnOptions co;
  co.host = o.host;
  co.port = o.port;
  co.user = o.user;
  co.password = o.password;
  co.has_password = !o.password.empty();
  co.timeout = Millis(10'000);
  streams::StreamConn conn(co);
  std::string auth = o.password.empty() ? "" : o.user + ":" + o.password + "@";
  const std::string redis_uri = "redis://" + auth + o.host + ":" + std::to_string(o.port);

  std::vector<ConsumerContender> cs;
  cs.push_back(MakeContender("none", "no guard (ack only)", nullptr));
  {
    auto s = OpenStore(redis_uri + "?prefix=bench:consumer:&pool=" + std::to_string(o.concurrency),
                       QuietOpen());
    if (s.ok()) {
      cs.push_back(MakeContender("redis", "dedup, Redis store on the stream's server", std::move(s).value()));
    }
  }
  std::string rocks_dir;
  if (!o.scratch_dir.empty()) {
    rocks_dir = o.scratch_dir + "/consumer-bench-" + std::to_string(getpid());
    auto s = OpenStore("rocksdb:" + rocks_dir);
    if (s.ok()) {
      cs.push_back(MakeContender("rocksdb", "dedup, RocksDB store", std::move(s).value()));
    }
  }
  BufferOptions bo;
  bo.lease = Millis(60'000);
  bo.retention = Millis(600'000);
  for (ConsumerContender& c : cs) {
    if (c.store == nullptr) continue;
    c.counter = std::make_unique<ConsumerRoundTrips>(c.store.get());
    c.buffer = std::make_unique<Buffer>(c.counter.get(), bo);
  }

  static std::atomic<uint64_t> stream_no{0};
  // Publishes n entries with one script call.
  const char* publish_lua =
      "for i = 1, tonumber(ARGV[2]) do redis.call('XADD', KEYS[1], '*', 'id', ARGV[1] .. i, "
      "'body', 'x') end return 1";
  auto run = [&](ConsumerContender& c, int round) {
    const std::string stream = "bench:consumer:" + std::to_string(getpid()) + ":" +
                               std::to_string(stream_no++);
    const std::string prefix = stream + ":" + c.id + ":" + std::to_string(round) + ":";
    auto p = conn.Run({"EVAL", publish_lua, "1", stream, prefix, std::to_string(o.messages)});
    if (!p.ok() || streams::IsError(p->get())) {
      ++c.errors;
      return;
    }
    WorkerOptions wo;
    wo.host = o.host;
    wo.port = o.port;
    wo.user = o.user;
    wo.password = o.password;
    wo.has_password = !o.password.empty();
    wo.stream = stream;
    wo.group = "bench";
    wo.consumer = "bench";
    wo.block = Millis(50);
    wo.reclaim_interval = Millis(60'000);
    wo.reclaim_min_idle = Millis(120'000);
    auto source = OpenRedisStreamsSource(wo, bo.lease);
    if (!source.ok()) {
      ++c.errors;
      return;
    }
    ConsumerOptions copt;
    copt.concurrency = o.concurrency;
    copt.fetch_wait = Millis(50);
    StatusOr<std::unique_ptr<Consumer>> made = Status::Internal("unset");
    if (c.buffer == nullptr) {
      made = Consumer::MakeWith(source->get(), [](const Delivery&) {
        Processed p;
        p.ran = true;
        p.action = BrokerAction::kAck;
        p.claim.outcome = ClaimOutcome::kAcquired;
        return p;
      }, copt);
    } else {
      made = Consumer::Make(source->get(), c.buffer.get(),
                            [](const Delivery&, ClaimGuard&) { return HandlerResult::Done(); },
                            copt);
    }
    if (!made.ok()) {
      ++c.errors;
      return;
    }
    Consumer* consumer = made->get();
    const uint64_t calls0 = c.counter ? c.counter->calls.load() : 0;
    const long long cmds0 = TotalCommands(conn);
    const auto t0 = Clk::now();
    std::thread runner([consumer] { (void)consumer->Run(); });
    const auto deadline = t0 + std::chrono::seconds(120);
    while (consumer->metrics().acked < o.messages && Clk::now() < deadline &&
           !(o.stop && o.stop())) {
      std::this_thread::sleep_for(Millis(1));
    }
    const double secs = std::chrono::duration<double>(Clk::now() - t0).count();
    const uint64_t acked = consumer->metrics().acked;
    consumer->Stop();
    runner.join();
    const long long cmds1 = TotalCommands(conn);
    (void)conn.Run({"DEL", stream, stream + ":dead"});
    if (acked < o.messages) ++c.errors;
    const double n = static_cast<double>(std::max<uint64_t>(acked, 1));
    c.rates.push_back(static_cast<double>(acked) / secs);
    // Minus the INFO call itself; Redis counts the commands scripts run too.
    c.cmds.push_back(cmds0 < 0 || cmds1 < 0 ? NAN : static_cast<double>(cmds1 - cmds0 - 1) / n);
    c.trips.push_back(c.counter ? static_cast<double>(c.counter->calls.load() - calls0) / n : 0.0);
    // The completer's Buffer::CompleteBatch calls (one store call each).
    if (const ConsumerMetrics m = consumer->metrics(); m.complete_batches > 0) {
      c.batch_sizes.push_back(static_cast<double>(m.completed_in_batches) /
                              static_cast<double>(m.complete_batches));
    }
  };

  for (int r = 0; r < o.rounds && !(o.stop && o.stop()); ++r) {
    for (ConsumerContender& c : cs) {
      if (o.progress) {
        o.progress("consumer, round " + std::to_string(r + 1) + "/" + std::to_string(o.rounds) +
                   ": " + c.label);
      }
      run(c, r);
    }
    for (ConsumerContender& c : cs) {
      if (c.rates.size() == cs[0].rates.size() && !cs[0].rates.empty()) {
        c.ratios.push_back(c.rates.back() / cs[0].rates.back());
      }
    }
  }
  json out = {{"concurrency", o.concurrency}, {"messages_per_round", o.messages},
              {"rows", json::array()}};
  for (ConsumerContender& c : cs) {
    const double ratio = c.id == "none" ? 1.0 : Median(c.ratios);
    json row = {{"id", c.id},
                {"label", c.label},
                {"msgs_per_s", Num(Median(c.rates))},
                {"ratio", Num(ratio)},
                {"dedup_cost", c.id == "none" ? json(nullptr) : Num(1 - ratio)},
                {"commands_per_msg", Num(Median(c.cmds))},
                {"store_round_trips_per_msg", c.id == "none" ? json(nullptr) : Num(Median(c.trips))},
                {"completions_per_batch",
                 c.batch_sizes.empty() ? json(nullptr) : Num(Median(c.batch_sizes))},
                {"rounds", c.rates},
                {"errors", c.errors}};
    out["rows"].push_back(row);
    if (c.id != "none") {
      out[c.id + "_dedup_cost"] = Num(1 - ratio);
      out[c.id + "_store_round_trips_per_msg"] = Num(Median(c.trips));
    }
  }
  cs.clear();  // stores close before their directory goes
  if (!rocks_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(rocks_dir, ec);
  }
  return out;
}

std::string ConsumerBenchMarkdown(const json& r) {
  if (!r.is_object() || !r.contains("rows")) return "";
  auto fmt = [](const json& v, const char* f) {
    if (!v.is_number()) return std::string("n/a");
    char buf[64];
    std::snprintf(buf, sizeof buf, f, v.get<double>());
    return std::string(buf);
  };
  std::string o = "\n### Consumer on Redis Streams, no-op handler, concurrency " +
                  std::to_string(r["concurrency"].get<int>()) + ", " +
                  std::to_string(r["messages_per_round"].get<uint64_t>()) +
                  " messages per round\n\n"
                  "| contender | msgs/s (median) | ratio to no guard | dedup cost | Redis commands "
                  "per message | store round trips per message | completions per store call |\n"
                  "|---|---:|---:|---:|---:|---:|---:|\n";
  for (const json& row : r["rows"]) {
    o += "| " + row["label"].get<std::string>() + " | " + fmt(row["msgs_per_s"], "%.0f") + " | " +
         fmt(row["ratio"], "%.2f") + " | " + (row["dedup_cost"].is_number() ? fmt(json(row["dedup_cost"].get<double>() * 100), "%.0f %%") : std::string("-")) + " | " +
         fmt(row["commands_per_msg"], "%.2f") + " | " +
         fmt(row["store_round_trips_per_msg"], "%.2f") + " | " +
         (row.contains("completions_per_batch") ? fmt(row["completions_per_batch"], "%.1f")
                                                : std::string("n/a")) +
         " |\n";
  }
  return o;
}

void RunConsumerRows(BenchContext& ctx) {
  if (ctx.options.no_worker) {
    ctx.Skip("consumer rows: --no-worker");
    return;
  }
  if (!ctx.redis) {
    ctx.Skip("consumer rows: need Redis");
    return;
  }
  ConsumerBenchOptions o;
  o.host = ctx.redis_target.host;
  o.port = ctx.redis_target.port;
  o.user = ctx.redis_target.user;
  o.password = ctx.redis_target.password;
  o.messages = ctx.plan.worker_messages;
  o.rounds = ctx.plan.worker_rounds;
  o.concurrency = 8;
#ifdef DEDUP_WITH_ROCKSDB
  const std::string scratch = ctx.options.no_rocksdb ? "" : MakeTempDir("consumer");
  o.scratch_dir = scratch;
#endif
  o.progress = [&ctx](const std::string& what) { ctx.Say(what); };
  o.stop = [&ctx] { return ctx.Stop(); };
  json rows = RunConsumerBench(o);
#ifdef DEDUP_WITH_ROCKSDB
  if (!scratch.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(scratch, ec);
  }
#endif
  std::string md = ConsumerBenchMarkdown(rows);
  ctx.results.sections.push_back({"consumer", std::move(rows), std::move(md)});
}

void ConsumerRowsGoals(BenchContext& ctx) {
  const Section* s = ctx.results.FindSection("consumer");
  const json rows = s ? s->data : json(nullptr);
  auto num = [&](const char* k) {
    return rows.is_object() && rows.contains(k) && rows[k].is_number() ? rows[k].get<double>() : NAN;
  };
  ctx.results.AddGoal("consumer, Redis store on the stream's server: dedup costs <= 20 % of throughput",
                      num("redis_dedup_cost"), 0.2, true, "", "%");
  ctx.results.AddGoal("consumer, RocksDB store: dedup costs <= 10 % of throughput",
                      num("rocksdb_dedup_cost"), 0.1, true, "", "%");
  ctx.results.AddGoal("consumer, Redis store: <= 1 store round trip per message",
                      num("redis_store_round_trips_per_msg"), 1.0, true,
                      "store calls per message; each is one round trip on the Redis store", "n");
}

}  // namespace dedup::bench

#else  // !DEDUP_WITH_REDIS_STREAMS

#include "bench/bench.h"

namespace dedup::bench {

void RunConsumerRows(BenchContext& ctx) {
  ctx.Skip("consumer rows: not compiled in (DEDUP_WITH_REDIS_STREAMS off)");
}
void ConsumerRowsGoals(BenchContext&) {}

}  // namespace dedup::bench

#endif  // DEDUP_WITH_REDIS_STREAMS
