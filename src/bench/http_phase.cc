// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The HTTP phase of `dedup bench` (`--phase http`; built only with `dedup serve`,
// DEDUP_WITH_SERVE): what the HTTP hop costs.
//
//   1. claims of new keys through a real `dedup serve --store rocksdb:…` process
//      (this executable, HTTP/1.1 keep-alive over loopback, one connection per
//      client thread, TCP_NODELAY) next to the same store, same options
//      (RocksDB, sync=none), called in this process: claims/s, p50/p99 per claim;
//   2. the Idempotency-Key proxy's added latency: one client POSTs to a small
//      application in this process directly, then through `dedup serve --proxy`
//      with a new key per request (claim, forward, complete), then repeating one
//      key (replays answered from the store).
//
// Contenders alternate round by round; figures are medians over rounds, ratios
// medians of per-round ratios. Ports: serve on 8085 (8086 if taken), the proxy on
// 8087 (8088), the application on a free port (docs/PORTS.md).

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <functional>
#include <optional>
#include <thread>

#include "bench/bench.h"
#include "bench/child.h"
#include "dedup/store.h"

namespace dedup::bench {
namespace {

struct HttpRun {
  double per_s = 0, p50_us = NAN, p99_us = NAN;
  uint64_t failed = 0;
};

// Runs `op(thread, n)` on `threads` threads for `seconds` (n: a fresh key number
// per call); a thread stops at its first failed call.
HttpRun Measure(int threads, double seconds, const std::function<bool(int, uint64_t)>& op) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> failed{0};
  std::vector<Hist> hists(static_cast<size_t>(threads));
  std::vector<std::thread> ts;
  const auto t0 = Clk::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      const uint64_t base = NextKeyBlock();
      Hist& h = hists[static_cast<size_t>(t)];
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const auto a = Clk::now();
        if (!op(t, base + i)) {
          ++failed;
          return;
        }
        h.Add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clk::now() - a).count()));
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : ts) th.join();
  Hist all;
  for (auto& h : hists) all.Merge(h);
  HttpRun r;
  r.per_s = static_cast<double>(all.n) / Seconds(Clk::now() - t0);
  r.p50_us = all.QuantileUs(0.5);
  r.p99_us = all.QuantileUs(0.99);
  r.failed = failed.load();
  return r;
}

// `dedup serve ARGS` of this same executable, killed if this process dies.
pid_t SpawnServe(const std::vector<std::string>& args) {
  std::vector<std::string> all = {"serve"};
  all.insert(all.end(), args.begin(), args.end());
  return SpawnSelf(all);
}

void StopServe(pid_t pid) {
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
}

// Starts `dedup serve ARGS --listen 127.0.0.1:PORT` on the first of `ports` where
// it answers `health` while still running; nullopt if none did.
std::optional<std::pair<pid_t, int>> StartServe(const std::vector<std::string>& args, std::vector<int> ports,
                                                const std::string& health) {
  for (int port : ports) {
    auto a = args;
    a.insert(a.end(), {"--listen", "127.0.0.1:" + std::to_string(port), "--quiet"});
    const pid_t pid = SpawnServe(a);
    for (int i = 0; i < 400; ++i) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) break;  // exited: the port is taken, or worse
      httplib::Client c("127.0.0.1", port);
      if (auto r = c.Get(health); r && r->status == 200 && waitpid(pid, &st, WNOHANG) == 0) {
        return std::make_pair(pid, port);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    kill(pid, SIGKILL);
    int st = 0;
    waitpid(pid, &st, 0);
  }
  return std::nullopt;
}

std::unique_ptr<httplib::Client> Client(int port) {
  auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
  c->set_keep_alive(true);
  c->set_tcp_nodelay(true);  // else a POST in two writes waits ~40 ms for a delayed ACK
  return c;
}

template <typename F>
double MedianOf(const std::vector<HttpRun>& v, F f) {
  std::vector<double> x;
  for (const auto& r : v) x.push_back(f(r));
  return Median(x);
}

uint64_t FailedOf(const std::vector<HttpRun>& v) {
  uint64_t n = 0;
  for (const auto& r : v) n += r.failed;
  return n;
}

std::string Us(double v) { return Fmt(v < 100 ? "%.1f" : "%.0f", v); }

}  // namespace

void RunHttp(BenchContext& ctx) {
  const bool quick = ctx.options.quick;
  const std::vector<int> thread_counts = !ctx.options.workers.empty() ? ctx.options.workers
                                         : quick                      ? std::vector<int>{1}
                                                                      : std::vector<int>{1, 8};
  const int rounds = quick ? 1 : std::max(3, std::min(ctx.plan.rounds, 5));
  const double round_s = ctx.options.round_s > 0 ? ctx.options.round_s : quick ? 0.1 : 2.0;
  const std::string dir = MakeTempDir("http");
  if (dir.empty()) {
    ctx.Skip("http: cannot make a temporary directory");
    return;
  }
  Section s;
  s.key = "http";
  s.data = json::object();
  s.data["rounds"] = rounds;
  s.data["round_s"] = round_s;
  std::string md = "### dedup serve (HTTP)\n\n";

  // ---- 1. claims: in-process RocksDB vs through dedup serve on RocksDB ----------
  auto store = OpenStore("rocksdb:" + dir + "/inproc");
  auto serve = StartServe({"--store", "rocksdb:" + dir + "/served", "--threads", "32"}, {8085, 8086}, "/healthz");
  if (!store.ok() || !serve) {
    ctx.Skip(!store.ok() ? "http: " + store.status().ToString()
                         : "http: dedup serve did not start on 127.0.0.1:8085 or 8086");
  } else {
    md += "Claims of new keys on RocksDB (sync=none), in this process and through `dedup serve` "
          "(HTTP/1.1 keep-alive over loopback, one connection per client thread); " +
          std::to_string(rounds) + " interleaved round(s) of " + Fmt("%.1f", round_s) + " s, medians.\n\n";
    md += "| client threads | in-process claims/s | p50 µs | p99 µs | through serve claims/s | p50 µs | p99 µs | "
          "serve / in-process | failed calls |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    s.data["claims"] = json::array();
    for (int threads : thread_counts) {
      std::vector<HttpRun> inproc, http;
      std::vector<double> ratios;
      for (int r = 0; r < rounds && !ctx.Stop(); ++r) {
        ctx.Say("http: claims, " + std::to_string(threads) + " threads, round " + std::to_string(r + 1) + "/" +
                std::to_string(rounds));
        inproc.push_back(Measure(threads, round_s, [&](int, uint64_t n) {
          const std::string key = TaskKey(n);  // ClaimRequest::key is a view
          ClaimRequest c;
          c.key = key;
          auto res = (*store)->Claim(c);
          return res.ok() && res->acquired();
        }));
        std::vector<std::unique_ptr<httplib::Client>> clients;
        for (int t = 0; t < threads; ++t) clients.push_back(Client(serve->second));
        http.push_back(Measure(threads, round_s, [&](int t, uint64_t n) {
          auto res = clients[static_cast<size_t>(t)]->Post("/v1/keys/" + TaskKey(n) + "/claim", "{}",
                                                           "application/json");
          return res && res->status == 201;
        }));
        ratios.push_back(http.back().per_s / inproc.back().per_s);
      }
      const double ratio = Median(ratios);
      s.data["claims"].push_back({{"threads", threads},
                                  {"in_process", {{"claims_per_s", Num(MedianOf(inproc, [](auto& r) { return r.per_s; }))},
                                                  {"p50_us", Num(MedianOf(inproc, [](auto& r) { return r.p50_us; }))},
                                                  {"p99_us", Num(MedianOf(inproc, [](auto& r) { return r.p99_us; }))},
                                                  {"failed", FailedOf(inproc)}}},
                                  {"serve", {{"claims_per_s", Num(MedianOf(http, [](auto& r) { return r.per_s; }))},
                                             {"p50_us", Num(MedianOf(http, [](auto& r) { return r.p50_us; }))},
                                             {"p99_us", Num(MedianOf(http, [](auto& r) { return r.p99_us; }))},
                                             {"failed", FailedOf(http)}}},
                                  {"serve_vs_in_process", Num(ratio)}});
      md += "| " + std::to_string(threads) + " | " + Rate(MedianOf(inproc, [](auto& r) { return r.per_s; })) +
            " | " + Us(MedianOf(inproc, [](auto& r) { return r.p50_us; })) + " | " +
            Us(MedianOf(inproc, [](auto& r) { return r.p99_us; })) + " | " +
            Rate(MedianOf(http, [](auto& r) { return r.per_s; })) + " | " +
            Us(MedianOf(http, [](auto& r) { return r.p50_us; })) + " | " +
            Us(MedianOf(http, [](auto& r) { return r.p99_us; })) + " | " + Fmt("%.3fx", ratio) + " | " +
            std::to_string(FailedOf(inproc) + FailedOf(http)) + " |\n";
    }
  }
  if (serve) StopServe(serve->first);

  // ---- 2. the proxy's added latency: bare application vs through serve --proxy ---
  httplib::Server app;
  app.set_tcp_nodelay(true);
  app.Post("/charge", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 201;
    res.set_content("{\"charged\":" + std::to_string(req.body.size()) + "}", "application/json");
  });
  const int app_port = app.bind_to_any_port("127.0.0.1");
  std::thread app_thread([&] { app.listen_after_bind(); });
  std::optional<std::pair<pid_t, int>> proxy;
  if (app_port > 0 && !ctx.Stop()) {
    proxy = StartServe({"--store", "rocksdb:" + dir + "/proxy", "--proxy", "http://127.0.0.1:" + std::to_string(app_port)},
                       {8087, 8088}, "/_dedup/healthz");
  }
  if (!proxy) {
    if (!ctx.Stop()) ctx.Skip("http: dedup serve --proxy did not start on 127.0.0.1:8087 or 8088");
  } else {
    const std::string body = "{\"amount\":7,\"currency\":\"eur\",\"id\":42}  ";  // 40 bytes
    std::vector<HttpRun> bare, fresh, replay;
    for (int r = 0; r < rounds && !ctx.Stop(); ++r) {
      ctx.Say("http: proxy, round " + std::to_string(r + 1) + "/" + std::to_string(rounds));
      auto direct = Client(app_port), via = Client(proxy->second);
      bare.push_back(Measure(1, round_s, [&](int, uint64_t) {
        auto res = direct->Post("/charge", body, "application/json");
        return res && res->status == 201;
      }));
      std::string first;
      fresh.push_back(Measure(1, round_s, [&](int, uint64_t n) {
        const std::string key = TaskKey(n);
        if (first.empty()) first = key;
        auto res = via->Post("/charge", {{"Idempotency-Key", key}}, body, "application/json");
        return res && res->status == 201 && !res->has_header("Idempotent-Replayed");
      }));
      replay.push_back(Measure(1, round_s, [&](int, uint64_t) {
        auto res = via->Post("/charge", {{"Idempotency-Key", first}}, body, "application/json");
        return res && res->status == 201 && res->has_header("Idempotent-Replayed");
      }));
    }
    md += "\nThe Idempotency-Key proxy: one client, sequential POSTs with a 40-byte body to an application "
          "in this process, directly and through `dedup serve --proxy` (RocksDB); medians of the rounds.\n\n"
          "| path | requests/s | p50 µs | p99 µs | failed calls |\n|---|---:|---:|---:|---:|\n";
    s.data["proxy"] = json::object();
    const std::pair<const char*, std::vector<HttpRun>*> paths[] = {
        {"bare application", &bare},
        {"through the proxy, new key (claim, forward, complete)", &fresh},
        {"through the proxy, repeat (replayed)", &replay}};
    const char* keys[] = {"bare", "new_key", "replay"};
    for (size_t i = 0; i < 3; ++i) {
      const auto& v = *paths[i].second;
      const double rps = MedianOf(v, [](auto& r) { return r.per_s; });
      const double p50 = MedianOf(v, [](auto& r) { return r.p50_us; });
      const double p99 = MedianOf(v, [](auto& r) { return r.p99_us; });
      s.data["proxy"][keys[i]] = {{"requests_per_s", Num(rps)}, {"p50_us", Num(p50)}, {"p99_us", Num(p99)},
                                  {"failed", FailedOf(v)}};
      md += std::string("| ") + paths[i].first + " | " + Rate(rps) + " | " + Us(p50) + " | " + Us(p99) + " | " +
            std::to_string(FailedOf(v)) + " |\n";
    }
    const double added50 = MedianOf(fresh, [](auto& r) { return r.p50_us; }) - MedianOf(bare, [](auto& r) { return r.p50_us; });
    const double added99 = MedianOf(fresh, [](auto& r) { return r.p99_us; }) - MedianOf(bare, [](auto& r) { return r.p99_us; });
    s.data["proxy"]["added_p50_us"] = Num(added50);
    s.data["proxy"]["added_p99_us"] = Num(added99);
    md += "\nThe proxy adds, per new key: p50 +" + Us(added50) + " µs, p99 +" + Us(added99) + " µs.\n";
    StopServe(proxy->first);
  }
  app.stop();
  app_thread.join();
  if (store.ok()) store->reset();  // closes the in-process store before its directory goes
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (s.data.contains("claims") || s.data.contains("proxy")) {
    s.markdown = md;
    ctx.results.sections.push_back(std::move(s));
  }
}

void HttpGoals(BenchContext& ctx) {
  const Section* s = ctx.results.FindSection("http");
  double p50 = NAN, added = NAN;
  if (s != nullptr && s->data.contains("claims")) {
    for (const auto& row : s->data["claims"]) {
      if (row["threads"] == 1 && row["serve"]["p50_us"].is_number()) p50 = row["serve"]["p50_us"];
    }
  }
  if (s != nullptr && s->data.contains("proxy") && s->data["proxy"]["added_p50_us"].is_number()) {
    added = s->data["proxy"]["added_p50_us"];
  }
  // Our targets (issue 12 names none): a claim over HTTP costs about one loopback
  // round trip, and the proxy (a claim, a second hop, a completion) well under 1 ms.
  ctx.results.AddGoal("serve: p50 of a claim over HTTP, 1 client, RocksDB <= 200 µs", p50, 200, true,
                      s != nullptr && s->data.contains("claims") ? "" : "needs 1 client thread", "n");
  ctx.results.AddGoal("serve --proxy: added p50 per new key <= 1000 µs", added, 1000, true, "", "n");
}

}  // namespace dedup::bench
