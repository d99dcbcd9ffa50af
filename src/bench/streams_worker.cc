// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The Redis Streams worker with a no-op handler, with and without the guard
// (Run + Buffer on the Redis store, against RunWith: ack only), on the same
// Redis as the stream. Its rows are its own Section ("streams_worker").

#include <unistd.h>

#include <sstream>
#include <thread>
#include <tuple>

#include "bench/bench.h"
#ifdef DEDUP_WITH_REDIS_STREAMS
#include "dedup/worker.h"
#endif

namespace dedup::bench {

using namespace std::chrono_literals;

namespace {

std::string WorkerMarkdown(const json& worker) {
  std::ostringstream o;
  if (worker.is_object()) {
    auto g = [&](const char* k) { return worker[k].is_number() ? worker[k].get<double>() : NAN; };
    o << "\n### Redis Streams worker, no-op handler, concurrency " << worker["concurrency"].get<int>() << ", "
      << worker["messages_per_round"].get<uint64_t>() << " messages per round\n\n"
      << "| | msgs/s | Redis commands per message (incl. those run inside scripts) |\n|---|---:|---:|\n"
      << "| without dedup (RunWith: ack only) | " << Rate(g("without_dedup_msgs_per_s")) << " | "
      << Fmt("%.2f", g("commands_per_msg_without")) << " |\n"
      << "| with dedup (Run + Buffer on the Redis store) | " << Rate(g("with_dedup_msgs_per_s")) << " | "
      << Fmt("%.2f", g("commands_per_msg_with")) << " |\n\n"
      << "Ratio with/without (median of rounds): " << Fmt("%.2f", g("ratio")) << "; dedup costs "
      << Fmt("%.0f %%", g("dedup_cost") * 100) << " of throughput and "
      << Fmt("%.2f", g("store_round_trips_per_msg")) << " store round trips per message.\n";
  }
  return o.str();
}

json MeasureStreamsWorker(BenchContext& ctx);

}  // namespace

namespace {
json MeasureStreamsWorker(BenchContext& ctx) {
#if defined(DEDUP_WITH_REDIS_STREAMS) && defined(DEDUP_WITH_REDIS)
  if (ctx.options.no_worker) {
    ctx.Skip("streams worker: --no-worker");
    return nullptr;
  }
  if (!ctx.redis) {
    ctx.Skip("streams worker: needs Redis");
    return nullptr;
  }
  const int concurrency = 8;
  auto store =
      OpenStore(ctx.redis_target.base_uri + "?prefix=bench:dedup:&pool=" + std::to_string(concurrency));
  if (!store.ok()) {
    ctx.Skip("streams worker: " + store.status().ToString());
    return nullptr;
  }
  BufferOptions bo;
  bo.lease = 60s;
  bo.retention = 600s;
  CountingStore counting(store->get());
  Buffer buffer(&counting, bo);
  std::vector<double> plain_rates, dedup_rates, ratios, plain_cmds, dedup_cmds, store_calls;
  uint64_t errors = 0;
  static std::atomic<uint64_t> stream_no{0};
  auto round = [&](bool with_dedup) -> std::tuple<double, double, double> {
    RedisConn c(ctx.redis_target);
    const std::string stream = "bench:stream:" + std::to_string(getpid()) + ":" + std::to_string(stream_no++);
    const uint64_t base = NextKeyBlock();
    for (uint64_t at = 0; at < ctx.plan.worker_messages; at += 1000) {
      std::vector<std::vector<std::string>> cmds;
      for (uint64_t i = at; i < std::min<uint64_t>(ctx.plan.worker_messages, at + 1000); ++i) {
        cmds.push_back({"XADD", stream, "*", "id", TaskKey(base + i), "body", "x"});
      }
      errors += c.Pipeline(cmds);
    }
    WorkerOptions o;
    o.host = ctx.redis_target.host;
    o.user = ctx.redis_target.user;
    o.port = ctx.redis_target.port;
    o.password = ctx.redis_target.password;
    o.has_password = !ctx.redis_target.password.empty();
    o.stream = stream;
    o.group = "bench";
    o.consumer = "bench";
    o.concurrency = concurrency;
    o.block = 50ms;
    o.reclaim_interval = 60s;
    auto w = Worker::Open(o);
    if (!w.ok()) {
      ++errors;
      return {NAN, NAN, NAN};
    }
    const uint64_t calls0 = counting.calls.load();
    const long long cmds0 = c.InfoField("stats", "total_commands_processed");
    Worker* wp = w->get();
    const auto t0 = Clk::now();
    std::thread runner([&] {
      if (with_dedup) {
        (void)wp->Run(&buffer, [](const StreamMessage&, ClaimGuard&) { return HandlerResult::Done(); });
      } else {
        (void)wp->RunWith([](const StreamMessage&) {
          Processed p;
          p.ran = true;
          p.action = BrokerAction::kAck;
          p.claim.outcome = ClaimOutcome::kAcquired;
          return p;
        });
      }
    });
    const auto deadline = t0 + 120s;
    while (wp->metrics().acked < ctx.plan.worker_messages && Clk::now() < deadline && !ctx.Stop()) {
      std::this_thread::sleep_for(1ms);
    }
    const double secs = Seconds(Clk::now() - t0);
    const uint64_t acked = wp->metrics().acked;
    wp->Stop();
    runner.join();
    const long long cmds1 = c.InfoField("stats", "total_commands_processed");
    c.Command({"DEL", stream, stream + ":dead"});
    if (acked < ctx.plan.worker_messages) ++errors;
    const double n = static_cast<double>(std::max<uint64_t>(acked, 1));
    // Minus the INFO call itself. Redis counts the commands a script calls too.
    return {static_cast<double>(acked) / secs, static_cast<double>(cmds1 - cmds0 - 1) / n,
            static_cast<double>(counting.calls.load() - calls0) / n};
  };
  for (int r = 0; r < ctx.plan.worker_rounds && !ctx.Stop(); ++r) {
    ctx.Say("streams worker, round " + std::to_string(r + 1) + "/" + std::to_string(ctx.plan.worker_rounds) +
            ": without dedup");
    auto [pr, pc, pn] = round(false);
    (void)pn;
    ctx.Say("streams worker, round " + std::to_string(r + 1) + "/" + std::to_string(ctx.plan.worker_rounds) +
            ": with dedup (redis store)");
    auto [dr, dc, dn] = round(true);
    store_calls.push_back(dn);
    plain_rates.push_back(pr);
    dedup_rates.push_back(dr);
    plain_cmds.push_back(pc);
    dedup_cmds.push_back(dc);
    ratios.push_back(dr / pr);
  }
  const double ratio = Median(ratios);
  return {{"concurrency", concurrency},
          {"messages_per_round", ctx.plan.worker_messages},
          {"store", "redis (same server as the stream)"},
          {"without_dedup_msgs_per_s", Num(Median(plain_rates))},
          {"with_dedup_msgs_per_s", Num(Median(dedup_rates))},
          {"ratio", Num(ratio)},
          {"dedup_cost", Num(1 - ratio)},
          {"commands_per_msg_without", Num(Median(plain_cmds))},
          {"commands_per_msg_with", Num(Median(dedup_cmds))},
          {"store_round_trips_per_msg", Num(Median(store_calls))},
          {"rounds_without", plain_rates},
          {"rounds_with", dedup_rates},
          {"errors", errors}};
#else
  ctx.Skip("streams worker: not compiled in (DEDUP_WITH_REDIS_STREAMS / DEDUP_WITH_REDIS off)");
  return nullptr;
#endif
}

}  // namespace

void RunStreamsWorker(BenchContext& ctx) {
  json w = MeasureStreamsWorker(ctx);
  std::string md = w.is_object() ? WorkerMarkdown(w) : "";
  ctx.results.sections.push_back({"streams_worker", std::move(w), std::move(md)});
}

void StreamsWorkerGoals(BenchContext& ctx) {
  const Section* s = ctx.results.FindSection("streams_worker");
  const json worker = s ? s->data : json(nullptr);
  auto add = [&](auto&&... a) { ctx.results.AddGoal(a...); };
  if (worker.is_object()) {
    add("streams worker: dedup costs <= 20 % of its throughput",
        worker["dedup_cost"].is_number() ? worker["dedup_cost"].get<double>() : NAN, 0.2, true, "", "%");
    add("streams worker: <= 2 round trips per message for dedup",
        worker["store_round_trips_per_msg"].is_number() ? worker["store_round_trips_per_msg"].get<double>()
                                                        : NAN,
        2.0, true, "store calls per message; each is one round trip on the Redis store", "n");
  } else {
    add("streams worker: dedup costs <= 20 % of its throughput", NAN, 0.2, true);
    add("streams worker: <= 2 round trips per message for dedup", NAN, 2.0, true);
  }
}

}  // namespace dedup::bench
