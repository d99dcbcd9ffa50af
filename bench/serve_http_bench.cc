// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The HTTP row of the benchmarks (docs/PERFORMANCE.md, "dedup serve"):
//
//   1. claims of new keys through `dedup serve` on RocksDB (a real `dedup serve`
//      process, HTTP/1.1 keep-alive over loopback) next to the same store, same
//      options, called in this process: claims/s and p50/p99 per claim;
//   2. the Idempotency-Key proxy's added latency: one client sends requests to a
//      small C++ application directly, then through `dedup serve --proxy`
//      (a new key per request: claim, forward, complete), then repeats (replays).
//
// Contenders are interleaved round by round; ratios are medians of per-round
// ratios. The machine is shared: read medians and ratios, not single figures.
//
//   build/src/serve/dedup_http_bench build/src/cli/dedup [--seconds S] [--rounds R] [--threads 1,8] [--port 8085]

#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "dedup/store.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Run {
  double per_sec = 0;
  double p50_us = 0, p99_us = 0;
};

double Percentile(std::vector<double>& v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

double Median(std::vector<double> v) { return Percentile(v, 0.5); }

// Runs `op(thread, i)` on `threads` threads for `seconds`; latency per call.
template <typename Op>
Run Measure(int threads, double seconds, Op op) {
  std::atomic<bool> stop{false};
  std::vector<std::vector<double>> lat(threads);
  std::vector<std::thread> ts;
  const auto t0 = Clock::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (uint64_t i = 0; !stop.load(std::memory_order_relaxed); ++i) {
        const auto a = Clock::now();
        if (!op(t, i)) {
          std::fprintf(stderr, "http_bench: an operation failed\n");
          std::exit(1);
        }
        lat[t].push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : ts) th.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  Run r;
  r.per_sec = all.size() / elapsed;
  r.p50_us = Percentile(all, 0.5);
  r.p99_us = Percentile(all, 0.99);
  return r;
}

pid_t Spawn(const std::vector<std::string>& argv) {
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // dies with the bench
    if (getppid() != parent) _exit(127);
    std::vector<char*> a;
    for (const auto& s : argv) a.push_back(const_cast<char*>(s.c_str()));
    a.push_back(nullptr);
    execv(a[0], a.data());
    _exit(127);
  }
  return pid;
}

bool WaitHealthy(int port, const std::string& path) {
  for (int i = 0; i < 400; ++i) {
    httplib::Client c("127.0.0.1", port);
    if (auto r = c.Get(path); r && r->status == 200) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

void Stop(pid_t pid) {
  kill(pid, SIGTERM);
  int st = 0;
  waitpid(pid, &st, 0);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DEDUP_BINARY [--seconds S] [--rounds R] [--port P]\n", argv[0]);
    return 2;
  }
  const std::string dedup = argv[1];
  double seconds = 3;
  int rounds = 3, port = 8085;
  std::vector<int> thread_counts = {1, 8};
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string f = argv[i];
    if (f == "--seconds") seconds = std::stod(argv[i + 1]);
    else if (f == "--rounds") rounds = std::stoi(argv[i + 1]);
    else if (f == "--port") port = std::stoi(argv[i + 1]);
    else if (f == "--threads") {
      thread_counts.clear();
      std::string s = argv[i + 1];
      for (size_t at = 0; at <= s.size();) {
        size_t end = s.find(',', at);
        if (end == std::string::npos) end = s.size();
        thread_counts.push_back(std::stoi(s.substr(at, end - at)));
        at = end + 1;
      }
    }
  }
  const auto dir = std::filesystem::temp_directory_path() /
                   ("dedup-http-bench-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);

  // ---- 1. claims: in-process RocksDB vs through dedup serve on RocksDB -----------
  auto store = dedup::OpenStore("rocksdb:" + (dir / "inproc").string());
  if (!store.ok()) {
    std::fprintf(stderr, "http_bench: %s\n", store.status().ToString().c_str());
    return 1;
  }
  const pid_t serve = Spawn({dedup, "serve", "--store", "rocksdb:" + (dir / "served").string(),
                             "--listen", "127.0.0.1:" + std::to_string(port), "--quiet",
                             "--threads", "32"});
  if (!WaitHealthy(port, "/healthz")) {
    std::fprintf(stderr, "http_bench: dedup serve did not start on port %d\n", port);
    return 1;
  }
  std::printf("# claims of new keys, RocksDB (sync=none, the default), %d rounds of %.0f s\n",
              rounds, seconds);
  std::printf("| threads | in-process claims/s | p50 µs | p99 µs | through serve claims/s | p50 µs | p99 µs | serve / in-process |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int threads : thread_counts) {
    std::vector<double> ratios;
    std::vector<Run> inproc, http;
    for (int r = 0; r < rounds; ++r) {
      inproc.push_back(Measure(threads, seconds, [&](int t, uint64_t i) {
        const std::string key = "in-" + std::to_string(threads) + "-" + std::to_string(r) +
                                "-" + std::to_string(t) + "-" + std::to_string(i);
        dedup::ClaimRequest c;
        c.key = key;
        auto res = (*store)->Claim(c);
        return res.ok() && res->acquired();
      }));
      std::vector<std::unique_ptr<httplib::Client>> clients;
      for (int t = 0; t < threads; ++t) {
        clients.push_back(std::make_unique<httplib::Client>("127.0.0.1", port));
        clients.back()->set_keep_alive(true);
        clients.back()->set_tcp_nodelay(true);
      }
      http.push_back(Measure(threads, seconds, [&](int t, uint64_t i) {
        const std::string path = "/v1/keys/http-" + std::to_string(threads) + "-" +
                                 std::to_string(r) + "-" + std::to_string(t) + "-" +
                                 std::to_string(i) + "/claim";
        auto res = clients[t]->Post(path, "{}", "application/json");
        return res && res->status == 201;
      }));
      ratios.push_back(http.back().per_sec / inproc.back().per_sec);
    }
    auto med = [](const std::vector<Run>& v, double Run::*f) {
      std::vector<double> x;
      for (const auto& r : v) x.push_back(r.*f);
      return Median(x);
    };
    std::printf("| %d | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f | %.3f× |\n", threads,
                med(inproc, &Run::per_sec), med(inproc, &Run::p50_us), med(inproc, &Run::p99_us),
                med(http, &Run::per_sec), med(http, &Run::p50_us), med(http, &Run::p99_us),
                Median(ratios));
    std::fflush(stdout);
  }
  Stop(serve);

  // ---- 2. the proxy's added latency: bare app vs through serve --proxy -----------
  httplib::Server app;
  app.set_tcp_nodelay(true);
  app.Post("/charge", [](const httplib::Request& req, httplib::Response& res) {
    res.status = 201;
    res.set_content("{\"charged\":" + std::to_string(req.body.size()) + "}", "application/json");
  });
  const int app_port = port + 1, proxy_port = port + 2;
  std::thread app_thread([&] { app.listen("127.0.0.1", app_port); });
  const pid_t proxy = Spawn({dedup, "serve", "--store", "rocksdb:" + (dir / "proxy").string(),
                             "--listen", "127.0.0.1:" + std::to_string(proxy_port), "--quiet",
                             "--proxy", "http://127.0.0.1:" + std::to_string(app_port)});
  if (!WaitHealthy(proxy_port, "/_dedup/healthz")) {
    std::fprintf(stderr, "http_bench: dedup serve --proxy did not start on port %d\n", proxy_port);
    return 1;
  }
  std::printf("\n# one client, sequential POSTs with a 40-byte body; %d rounds of %.0f s\n",
              rounds, seconds);
  std::printf("| path | requests/s | p50 µs | p99 µs |\n|---|---:|---:|---:|\n");
  std::vector<double> bare50, bare99, new50, new99, rep50, rep99, bare_rps, new_rps, rep_rps;
  const std::string body = "{\"amount\":7,\"currency\":\"eur\",\"id\":42}  ";
  for (int r = 0; r < rounds; ++r) {
    httplib::Client direct("127.0.0.1", app_port), via("127.0.0.1", proxy_port);
    direct.set_keep_alive(true);
    via.set_keep_alive(true);
    direct.set_tcp_nodelay(true);
    via.set_tcp_nodelay(true);
    Run bare = Measure(1, seconds, [&](int, uint64_t) {
      auto res = direct.Post("/charge", body, "application/json");
      return res && res->status == 201;
    });
    Run fresh = Measure(1, seconds, [&](int, uint64_t i) {
      httplib::Headers h = {{"Idempotency-Key", "b-" + std::to_string(r) + "-" + std::to_string(i)}};
      auto res = via.Post("/charge", h, body, "application/json");
      return res && res->status == 201 && !res->has_header("Idempotent-Replayed");
    });
    Run replay = Measure(1, seconds, [&](int, uint64_t) {
      httplib::Headers h = {{"Idempotency-Key", "b-" + std::to_string(r) + "-0"}};
      auto res = via.Post("/charge", h, body, "application/json");
      return res && res->status == 201 && res->has_header("Idempotent-Replayed");
    });
    bare50.push_back(bare.p50_us), bare99.push_back(bare.p99_us), bare_rps.push_back(bare.per_sec);
    new50.push_back(fresh.p50_us), new99.push_back(fresh.p99_us), new_rps.push_back(fresh.per_sec);
    rep50.push_back(replay.p50_us), rep99.push_back(replay.p99_us), rep_rps.push_back(replay.per_sec);
  }
  std::printf("| bare application | %.0f | %.0f | %.0f |\n", Median(bare_rps), Median(bare50), Median(bare99));
  std::printf("| through the proxy, new key (claim, forward, complete) | %.0f | %.0f | %.0f |\n",
              Median(new_rps), Median(new50), Median(new99));
  std::printf("| through the proxy, repeat (replayed) | %.0f | %.0f | %.0f |\n",
              Median(rep_rps), Median(rep50), Median(rep99));
  std::printf("\nproxy added latency, new key: p50 +%.0f µs, p99 +%.0f µs (medians over rounds)\n",
              Median(new50) - Median(bare50), Median(new99) - Median(bare99));
  Stop(proxy);
  app.stop();
  app_thread.join();
  store->reset();
  std::filesystem::remove_all(dir);
  return 0;
}
