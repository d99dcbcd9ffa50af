// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The Consumer on RabbitMQ and on NATS JetStream with a no-op handler: with dedup
// (Consumer::Make + a Buffer on RocksDB, and on Redis when the bench has one)
// against the same Consumer acking without a guard (MakeWith), rounds
// interleaved; and, on NATS, the broker's own publish-side dedup (Nats-Msg-Id)
// against publishing without it. The brokers are the ones the environment names
// (DEDUP_BENCH_AMQP_URI=amqp://user:pw@host:port/, DEDUP_BENCH_NATS_URI=nats://
// host:port; tests/with_rabbitmq.sh and tests/with_nats.sh start private ones);
// without them the phase is skipped. Its rows are Section "broker_consumers".

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "bench/bench.h"
#include "bench/render.h"
#include "dedup/consumer.h"
#ifdef DEDUP_WITH_RABBITMQ
#include "brokers/rabbitmq/rabbitmq_source.h"
#endif
#ifdef DEDUP_WITH_NATS
#include "brokers/nats/nats_source.h"
#endif

namespace dedup::bench {

using namespace std::chrono_literals;

namespace {

#if defined(DEDUP_WITH_RABBITMQ) || defined(DEDUP_WITH_NATS)
// One broker under test: publishes n messages to a fresh queue / stream and opens
// a source on it.
struct BrokerUnderTest {
  std::string name;
  std::function<Status(const std::string& q, uint64_t base, uint64_t n)> publish;
  std::function<StatusOr<std::unique_ptr<MessageSource>>(const std::string& q)> open;
};

// Messages per second through one Consumer until n are acked (NaN on failure).
double ConsumeRound(BenchContext& ctx, const BrokerUnderTest& b, Buffer* buffer, uint64_t n,
                    uint64_t* errors) {
  static std::atomic<uint64_t> queue_no{0};
  const std::string q = "bench" + std::to_string(getpid()) + "x" + std::to_string(queue_no++);
  if (!b.publish(q, NextKeyBlock(), n).ok()) {
    ++*errors;
    return NAN;
  }
  auto src = b.open(q);
  if (!src.ok()) {
    ++*errors;
    return NAN;
  }
  ConsumerOptions co;
  co.concurrency = 8;
  co.log_name = "bench " + b.name;
  auto c = buffer != nullptr
               ? Consumer::Make(src->get(), buffer,
                                [](const Delivery&, ClaimGuard&) { return HandlerResult::Done(); }, co)
               : Consumer::MakeWith(src->get(),
                                    [](const Delivery&) {
                                      Processed p;
                                      p.ran = true;
                                      p.action = BrokerAction::kAck;
                                      p.claim.outcome = ClaimOutcome::kAcquired;
                                      return p;
                                    },
                                    co);
  if (!c.ok()) {
    ++*errors;
    return NAN;
  }
  Consumer* cp = c->get();
  const auto t0 = Clk::now();
  std::thread runner([cp] { (void)cp->Run(); });
  const auto deadline = t0 + 120s;
  while (cp->metrics().acked < n && Clk::now() < deadline && !ctx.Stop()) std::this_thread::sleep_for(1ms);
  const double secs = Seconds(Clk::now() - t0);
  const uint64_t acked = cp->metrics().acked;
  cp->Stop();
  runner.join();
  if (acked < n) ++*errors;
  return static_cast<double>(acked) / secs;
}
#endif

json MeasureBrokers(BenchContext& ctx) {
  std::vector<BrokerUnderTest> brokers;
#ifdef DEDUP_WITH_RABBITMQ
  if (const char* u = std::getenv("DEDUP_BENCH_AMQP_URI")) {
    const std::string base = u;
    brokers.push_back(
        {"rabbitmq",
         [base](const std::string& q, uint64_t first, uint64_t n) {
           auto o = rabbitmq::ParseRabbitMqUri(base + "?queue=" + q);
           if (!o.ok()) return o.status();
           rabbitmq::RabbitMqPublisher p(*o);
           DEDUP_RETURN_IF_ERROR(p.DeclareTopology());
           rabbitmq::AmqpMessage m;
           m.body = "x";
           for (uint64_t i = 0; i < n; ++i) {
             m.message_id = TaskKey(first + i);
             DEDUP_RETURN_IF_ERROR(p.Send("", q, m));
             if (i % 256 == 255) DEDUP_RETURN_IF_ERROR(p.WaitConfirms());
           }
           return p.WaitConfirms();
         },
         [base](const std::string& q) {
           return rabbitmq::OpenRabbitMqSource(base + "?queue=" + q + "&prefetch=64");
         }});
  }
#endif
#ifdef DEDUP_WITH_NATS
  if (const char* u = std::getenv("DEDUP_BENCH_NATS_URI")) {
    const std::string base = u;
    auto uri = [base](const std::string& q) {
      return base + "?stream=" + q + "&consumer=c&subject=" + q + ".in&key=header:Dedup-Key";
    };
    brokers.push_back({"nats",
                       [uri](const std::string& q, uint64_t first, uint64_t n) {
                         auto o = nats::ParseNatsUri(uri(q), false);
                         if (!o.ok()) return o.status();
                         auto p = nats::NatsPublisher::Open(*o);
                         if (!p.ok()) return p.status();
                         for (uint64_t i = 0; i < n; ++i) {
                           DEDUP_RETURN_IF_ERROR((*p)->Publish(TaskKey(first + i), "x", nullptr));
                         }
                         return Status::Ok();
                       },
                       [uri](const std::string& q) { return nats::OpenNatsSource(uri(q)); }});
  }
#endif
  if (brokers.empty()) {
    ctx.Skip("broker consumers: set DEDUP_BENCH_AMQP_URI and/or DEDUP_BENCH_NATS_URI");
    return nullptr;
  }
#if defined(DEDUP_WITH_RABBITMQ) || defined(DEDUP_WITH_NATS)
  const uint64_t n = ctx.plan.worker_messages;
  BufferOptions bo;
  bo.lease = 60s;
  bo.retention = 600s;
  std::vector<std::pair<std::string, std::unique_ptr<Store>>> stores;
  std::string rocks_dir;
#ifdef DEDUP_WITH_ROCKSDB
  rocks_dir = MakeTempDir("broker-consumers");
  if (auto s = OpenStore("rocksdb:" + rocks_dir); s.ok()) stores.emplace_back("rocksdb", std::move(s).value());
#endif
  if (ctx.redis) {
    if (auto s = OpenStore(ctx.redis_target.Uri("prefix=bench:brokers:&pool=8"), QuietOpen()); s.ok()) {
      stores.emplace_back("redis", std::move(s).value());
    }
  }
  json out = json::object();
  for (const BrokerUnderTest& b : brokers) {
    json rows = json::object();
    for (auto& [store_name, store] : stores) {
      auto buffer = Buffer::Create(store.get(), bo);
      if (!buffer.ok()) continue;
      std::vector<double> plain, guarded, ratios;
      uint64_t errors = 0;
      for (int r = 0; r < ctx.plan.worker_rounds && !ctx.Stop(); ++r) {
        ctx.Say(b.name + " consumer, " + store_name + " buffer, round " + std::to_string(r + 1));
        const double p = ConsumeRound(ctx, b, nullptr, n, &errors);
        const double g = ConsumeRound(ctx, b, buffer->get(), n, &errors);
        plain.push_back(p);
        guarded.push_back(g);
        ratios.push_back(g / p);
      }
      rows[store_name] = {{"without_dedup_msgs_per_s", Num(Median(plain))},
                          {"with_dedup_msgs_per_s", Num(Median(guarded))},
                          {"ratio", Num(Median(ratios))},
                          {"rounds_without", plain},
                          {"rounds_with", guarded},
                          {"errors", errors}};
    }
    out[b.name] = rows;
  }
#ifdef DEDUP_WITH_NATS
  if (const char* u = std::getenv("DEDUP_BENCH_NATS_URI")) {
    // Publish-side: n messages + 10 % repeats, with Nats-Msg-Id (the stream drops
    // repeats in its window) and without (a header only; the stream keeps them).
    std::vector<double> with_id, without_id;
    uint64_t dropped = 0;
    for (int r = 0; r < ctx.plan.worker_rounds && !ctx.Stop(); ++r) {
      for (int msgid = 1; msgid >= 0; --msgid) {
        const std::string q = "benchpub" + std::to_string(getpid()) + "x" + std::to_string(r * 2 + msgid);
        auto o = nats::ParseNatsUri(std::string(u) + "?stream=" + q + "&subject=" + q + ".in" +
                                        (msgid ? "" : "&key=header:Dedup-Key"),
                                    false);
        if (!o.ok()) continue;
        auto p = nats::NatsPublisher::Open(*o);
        if (!p.ok()) continue;
        const uint64_t base = NextKeyBlock();
        const auto t0 = Clk::now();
        uint64_t sent = 0, drops = 0;
        for (uint64_t i = 0; i < n; ++i) {
          bool dup = false;
          if ((*p)->Publish(TaskKey(base + i), "x", &dup).ok()) ++sent;
          if (i % 10 == 9 && (*p)->Publish(TaskKey(base + i), "x", &dup).ok()) {
            ++sent;
            drops += dup;
          }
        }
        (msgid ? with_id : without_id).push_back(static_cast<double>(sent) / Seconds(Clk::now() - t0));
        if (msgid) dropped = drops;
      }
    }
    out["nats_publish"] = {{"with_msg_id_msgs_per_s", Num(Median(with_id))},
                           {"without_msg_id_msgs_per_s", Num(Median(without_id))},
                           {"repeats_dropped_by_stream", dropped},
                           {"repeats_published", n / 10}};
  }
#endif
  stores.clear();
  if (!rocks_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(rocks_dir, ec);
  }
  out["messages_per_round"] = n;
  out["concurrency"] = 8;
  return out;
#endif
}

std::string BrokersMarkdown(const json& d) {
  if (!d.is_object()) return "";
  std::ostringstream o;
  o << "\n### The Consumer on RabbitMQ and NATS, no-op handler, concurrency 8, "
    << d["messages_per_round"].get<uint64_t>() << " messages per round\n\n"
    << "| broker | buffer | without dedup msgs/s | with dedup msgs/s | ratio (median of rounds) |\n"
    << "|---|---|---:|---:|---:|\n";
  for (const char* b : {"rabbitmq", "nats"}) {
    if (!d.contains(b)) continue;
    for (auto& [store, row] : d[b].items()) {
      auto g = [&](const char* k) { return row[k].is_number() ? row[k].get<double>() : NAN; };
      o << "| " << b << " | " << store << " | " << Rate(g("without_dedup_msgs_per_s")) << " | "
        << Rate(g("with_dedup_msgs_per_s")) << " | " << Fmt("%.2f", g("ratio")) << " |\n";
    }
  }
  if (d.contains("nats_publish")) {
    const json& p = d["nats_publish"];
    auto g = [&](const char* k) { return p[k].is_number() ? p[k].get<double>() : NAN; };
    o << "\nNATS publish with 10 % repeats: " << Rate(g("with_msg_id_msgs_per_s"))
      << " msgs/s with Nats-Msg-Id (" << p["repeats_dropped_by_stream"].get<uint64_t>() << " of "
      << p["repeats_published"].get<uint64_t>() << " repeats dropped by the stream), "
      << Rate(g("without_msg_id_msgs_per_s")) << " msgs/s without.\n";
  }
  return o.str();
}

}  // namespace

std::vector<std::string> PlotBrokerConsumers(const json& d, const std::string& dir,
                                             const std::string& mode) {
  std::vector<std::string> problems;
  if (!d.is_object()) return problems;
  auto num = [](const json& row, const char* k) {
    return row.contains(k) && row[k].is_number() ? row[k].get<double>() : NAN;
  };
  const std::string tmp = MakeTempDir("broker-plots");
  // Consume: one cluster per broker and buffer, without a guard beside with dedup.
  size_t rows = 0;
  {
    std::ofstream f(tmp + "/consume.dat");
    for (const char* b : {"rabbitmq", "nats"}) {
      if (!d.contains(b) || !d[b].is_object()) continue;
      for (auto& [store, row] : d[b].items()) {
        const double without = num(row, "without_dedup_msgs_per_s");
        const double with = num(row, "with_dedup_msgs_per_s");
        if (std::isnan(without) || std::isnan(with)) continue;
        f << "\"" << b << " / " << store << "\" " << without << " " << with << "\n";
        ++rows;
      }
    }
  }
  // Publish on NATS: the broker's own dedup (Nats-Msg-Id) beside none.
  bool publish = false;
  if (d.contains("nats_publish")) {
    const json& p = d["nats_publish"];
    const double with = num(p, "with_msg_id_msgs_per_s");
    const double without = num(p, "without_msg_id_msgs_per_s");
    if (!std::isnan(with) && !std::isnan(without)) {
      std::ofstream(tmp + "/publish.dat") << "\"10 % repeats\" " << without << " " << with << "\n";
      publish = true;
    }
  }
  std::error_code ec;
  if (rows == 0 && !publish) {
    std::filesystem::remove_all(tmp, ec);
    return problems;
  }
  std::filesystem::create_directories(dir, ec);
  const std::string png = dir + "/bench_brokers.png";
  std::ofstream gp(tmp + "/b.gp");
  gp << "set terminal pngcairo size 1100,560 font 'sans,10'\nset output " << GnuplotQuote(png) << "\n"
     << "set termoption noenhanced\n"
     << "set multiplot title "
     << GnuplotQuote("RabbitMQ and NATS JetStream: no-op handler, concurrency 8, " +
                     std::to_string(d.value("messages_per_round", uint64_t{0})) +
                     " messages a round, medians of rounds (" + mode + " run)")
     << "\n"
     << "set style data histogram\nset style histogram cluster gap 1\n"
     << "set style fill solid 0.85 border -1\nset boxwidth 0.9\nset grid ytics\nset yrange [0:*]\n"
     << "set key below\nset ylabel 'messages per second'\nset format y '%.0s%c'\n";
  // Side by side, the consume panel (up to four clusters) wider than the publish one.
  const double split = rows > 0 && publish ? 0.68 : 1.0;
  if (rows > 0) {
    gp << "set origin 0,0\nset size " << split << ",0.95\nset xlabel 'broker / buffer'\n"
       << "set title 'consume: the Consumer with dedup against acking without a guard'\n"
       << "plot " << GnuplotQuote(tmp + "/consume.dat")
       << " using 2:xtic(1) title 'Consumer acking without a guard', '' using 3 title "
          "'Consumer with dedup'\n";
  }
  if (publish) {
    gp << "set origin " << (rows > 0 ? split : 0.0) << ",0\nset size " << (rows > 0 ? 1 - split : 1.0)
       << ",0.95\nset xlabel ' '\n"
       << "set title " << GnuplotQuote("NATS publish: the stream's Nats-Msg-Id dedup")
       << "\nplot " << GnuplotQuote(tmp + "/publish.dat")
       << " using 2:xtic(1) title 'without Nats-Msg-Id', '' using 3 title "
          "'with (the stream drops repeats)'\n";
  }
  gp << "unset multiplot\n";
  gp.close();
  if (!RunGnuplot(tmp + "/b.gp")) problems.push_back("plots: gnuplot failed on " + png);
  std::filesystem::remove_all(tmp, ec);
  return problems;
}

void RunBrokerConsumers(BenchContext& ctx) {
  json d = MeasureBrokers(ctx);
  std::string md = BrokersMarkdown(d);
  ctx.results.sections.push_back({"broker_consumers", std::move(d), std::move(md)});
}

}  // namespace dedup::bench
