// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The memory store in a long-lived process: claims of new keys, one thread, for
// a long run, counted per 200 ms window, with `records` retained records in a
// process that has first allocated and freed gigabytes (as a worker that has run
// for days has). A store whose cost depends on the allocator's history shows
// here as collapsed windows and a long latency tail.
//
// It runs in a process of its own (RunPhaseInChild): the heap history is the one
// this phase makes, the same in every run, not whatever the earlier phases left.
//
// Windows are counted twice: in wall time (what a caller sees, including the
// time other processes on the machine take the core) and in the thread's own CPU
// time (what the store costs: a stall in the allocator or in page faults burns
// CPU time and shows there too; a preemption by another process does not).
//
// Steady state, as a long-lived worker has it: the retained records are kept for
// an hour; the claims of the run are kept for 2 s (lease 1 s + retention 1 s),
// so that the store also reclaims while it serves and stays near `records`.

#include <malloc.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <random>
#include <thread>

#include "bench/bench.h"
#include "bench/child.h"
#include "dedup/memory_store.h"

namespace dedup::bench {

using namespace std::chrono_literals;

namespace {

struct StallPlan {
  uint64_t records;
  double run_s;
  uint64_t churn_bytes;
};

StallPlan MakeStallPlan(const Plan& p) {
  if (p.mode == "quick") return {100'000, 1.0, 64ull << 20};
  if (p.mode == "full") return {10'000'000, 20.0, 2ull << 30};
  return {1'000'000, 6.0, 1ull << 30};
}

// Allocates about `bytes` in strings of 24 to 280 bytes, frees a random half,
// allocates again, frees everything in random order: a heap that has been used.
void Churn(uint64_t bytes) {
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<size_t> size(24, 280);
  for (int round = 0; round < 2; ++round) {
    std::vector<std::string> v;
    uint64_t got = 0;
    while (got < bytes / 2) {
      const size_t n = size(rng);
      v.emplace_back(n, 'x');
      got += n + 32;
    }
    std::shuffle(v.begin(), v.end(), rng);
    for (size_t i = 0; i < v.size(); i += 2) std::string().swap(v[i]);
    for (size_t i = 0; i < v.size(); i += 2) v[i].assign(size(rng), 'y');
    std::shuffle(v.begin(), v.end(), rng);
    v.clear();
    v.shrink_to_fit();
  }
}

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

json Measure(BenchContext& ctx) {
  const StallPlan sp = MakeStallPlan(ctx.plan);
  const auto t0 = Clk::now();
  Churn(sp.churn_bytes);
  const double churn_s = Seconds(Clk::now() - t0);
  const long rss_after_churn = RssBytes();

  auto store = NewMemoryStore();
  const auto t1 = Clk::now();
  uint64_t fill_errors = 0;
  {
    std::vector<std::string> keys(1000);
    std::vector<ClaimRequest> reqs(1000);
    const uint64_t base = NextKeyBlock();
    for (uint64_t at = 0; at < sp.records && !ctx.Stop(); at += 1000) {
      const size_t m = static_cast<size_t>(std::min<uint64_t>(1000, sp.records - at));
      for (size_t i = 0; i < m; ++i) {
        keys[i] = TaskKey(base + at + i);
        reqs[i] = BenchClaim(keys[i]);
        reqs[i].retention = 3600s;
      }
      auto r = store->ClaimBatch(std::span(reqs.data(), m));
      if (!r.ok()) fill_errors += m;
      if (at % 1'000'000 == 0) ctx.Say("memory stall: filling " + Rate(static_cast<double>(at)));
    }
  }
  const double fill_s = Seconds(Clk::now() - t1);
  ctx.Say("memory stall: " + Rate(static_cast<double>(sp.records)) + " retained, claiming");

  // Warm-up to the steady state: the first claims of the run expire after 2 s,
  // from then on every claim also reclaims about one record. Not counted.
  ctx.Say("memory stall: warming up to the steady state");
  {
    const uint64_t warm = NextKeyBlock();
    const auto until = Clk::now() + 3s;
    for (uint64_t i = 0; Clk::now() < until && !ctx.Stop(); ++i) {
      const std::string key = TaskKey(warm + i);
      ClaimRequest req = BenchClaim(key);
      req.lease = 1s;
      req.retention = 1s;
      if (!store->Claim(req).ok()) ++fill_errors;
    }
  }
  ctx.Say("memory stall: measuring");
  // One thread for the whole run; every call timed; counted per 200 ms window.
  constexpr double kWindow = 0.2;
  const size_t windows = static_cast<size_t>(sp.run_s / kWindow);
  std::vector<uint64_t> per_window(windows, 0);
  Hist hist;
  uint64_t errors = 0, slow = 0, over_50us = 0;
  const uint64_t base = NextKeyBlock();
  const auto start = Clk::now();
  const auto window_ns = static_cast<int64_t>(kWindow * 1e9);
  uint64_t k = base;
  // CPU-time windows: the thread's CPU clock is read every 256 calls.
  std::vector<double> cpu_rates;
  double cpu_mark = ThreadCpuSeconds();
  uint64_t cpu_calls = 0;
  // What the kernel did to this thread during the run: a call that lost the
  // core to another process (an involuntary context switch) or took a page
  // fault is slow for a reason the histogram alone does not tell.
  rusage ru0{}, ru1{};
  getrusage(RUSAGE_THREAD, &ru0);
  for (;;) {
    if ((k & 255) == 0) {
      const double c = ThreadCpuSeconds();
      if (c - cpu_mark >= kWindow) {
        cpu_rates.push_back(static_cast<double>(cpu_calls) / (c - cpu_mark));
        cpu_mark = c;
        cpu_calls = 0;
      }
    }
    ++cpu_calls;
    const auto a = Clk::now();
    const size_t w = static_cast<size_t>((a - start).count() / window_ns);
    if (w >= windows || ctx.Stop()) break;
    const std::string key = TaskKey(k++);
    ClaimRequest req = BenchClaim(key);
    req.lease = 1s;
    req.retention = 1s;
    auto r = store->Claim(req);
    const auto b = Clk::now();
    const uint64_t ns = static_cast<uint64_t>((b - a).count());
    hist.Add(ns);
    if (ns > 50'000) ++over_50us;
    if (ns > 1'000'000) ++slow;
    if (!r.ok() || !r->acquired()) ++errors;
    ++per_window[w];
  }
  getrusage(RUSAGE_THREAD, &ru1);
  std::vector<double> rates;
  for (uint64_t n : per_window) rates.push_back(static_cast<double>(n) / kWindow);
  const double median = Median(rates);
  const double worst = rates.empty() ? NAN : *std::min_element(rates.begin(), rates.end());
  const double cpu_median = Median(cpu_rates);
  const double cpu_worst = cpu_rates.empty() ? NAN : *std::min_element(cpu_rates.begin(), cpu_rates.end());
  return {{"records", sp.records},
          {"churn_bytes", sp.churn_bytes},
          {"churn_s", churn_s},
          {"rss_after_churn_bytes", rss_after_churn},
          {"fill_s", fill_s},
          {"fill_errors", fill_errors},
          {"run_s", sp.run_s},
          {"window_s", kWindow},
          {"windows", rates},
          {"median_claims_per_s", Num(median)},
          {"worst_window_ratio", Num(worst / median)},
          {"cpu_windows", cpu_rates},
          {"cpu_median_claims_per_s", Num(cpu_median)},
          {"cpu_worst_window_ratio", Num(cpu_worst / cpu_median)},
          {"p50_us", Num(hist.QuantileUs(0.5))},
          {"p99_us", Num(hist.QuantileUs(0.99))},
          {"p999_us", Num(hist.QuantileUs(0.999))},
          {"p9999_us", Num(hist.QuantileUs(0.9999))},
          {"max_us", Num(hist.MaxUs())},
          {"calls_over_50us", over_50us},
          {"calls_over_1ms", slow},
          {"involuntary_context_switches", ru1.ru_nivcsw - ru0.ru_nivcsw},
          {"minor_page_faults", ru1.ru_minflt - ru0.ru_minflt},
          {"calls", hist.n},
          {"errors", errors},
          {"rss_bytes", RssBytes()}};
}

std::string StallMarkdown(const json& s) {
  auto g = [&](const char* k) { return s.contains(k) && s[k].is_number() ? s[k].get<double>() : NAN; };
  std::string o = "\n### Memory store in a long-lived process (own process, one thread)\n\n";
  o += "Claims of new keys for " + Fmt("%.0f", g("run_s")) + " s with " + Rate(g("records")) +
       " retained records, after allocating and freeing " + Fmt("%.1f", g("churn_bytes") / (1 << 30)) +
       " GiB; claims kept 2 s, so the store reclaims as it serves (3 s of warm-up to that steady state, not "
       "counted).\n\n";
  o += "| claims/s (median wall window) | worst wall window / median | claims per CPU-second (median "
       "CPU window) | worst CPU window / median | p50 µs | p99 µs | p99.9 µs | p99.99 µs | max µs | calls > "
       "50 µs | calls > 1 ms | involuntary context switches | page faults | RSS "
       "|\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  o += "| " + Rate(g("median_claims_per_s")) + " | " + Fmt("%.2f", g("worst_window_ratio")) + " | " +
       Rate(g("cpu_median_claims_per_s")) + " | " + Fmt("%.2f", g("cpu_worst_window_ratio")) + " | " +
       Fmt("%.2f", g("p50_us")) + " | " + Fmt("%.2f", g("p99_us")) + " | " + Fmt("%.2f", g("p999_us")) + " | " +
       Fmt("%.1f", g("p9999_us")) + " | " + Fmt("%.0f", g("max_us")) + " | " + Rate(g("calls_over_50us")) +
       " | " + Rate(g("calls_over_1ms")) +
       " | " + Rate(g("involuntary_context_switches")) + " | " + Rate(g("minor_page_faults")) + " | " +
       Fmt("%.0f MiB", g("rss_bytes") / (1 << 20)) + " |\n\nWall windows (claims/s):";
  if (s.contains("windows")) {
    for (auto& w : s["windows"]) o += " " + Rate(w.get<double>());
  }
  o += "\n\nCPU windows (claims per CPU-second):";
  if (s.contains("cpu_windows")) {
    for (auto& w : s["cpu_windows"]) o += " " + Rate(w.get<double>());
  }
  return o + "\n";
}

}  // namespace

void RunMemoryStall(BenchContext& ctx) {
  json s;
  if (ctx.options.isolated_child) {
    s = Measure(ctx);
  } else {
    std::string error;
    ctx.Say("memory stall: in its own process");
    auto r = RunPhaseInChild(ctx, "memory_stall", &error);
    if (!r) {
      ctx.Skip("memory stall: " + error);
      return;
    }
    s = *r;
  }
  ctx.results.sections.push_back({"memory_stall", s, s.is_object() ? StallMarkdown(s) : ""});
}

void MemoryStallGoals(BenchContext& ctx) {
  const Section* s = ctx.results.FindSection("memory_stall");
  const bool have = s != nullptr && s->data.is_object();
  auto g = [&](const char* k) {
    return have && s->data.contains(k) && s->data[k].is_number() ? s->data[k].get<double>() : NAN;
  };
  const std::string at = have ? Rate(g("records")) : "10^7";
  ctx.results.AddGoal("memory store, long run with " + at + " retained: no 200 ms window below 0.5x the median",
                      g("worst_window_ratio"), 0.5, false, "wall time; shared machine");
  ctx.results.AddGoal("memory store, long run with " + at +
                          " retained: no 200 ms CPU-time window below 0.5x the median",
                      g("cpu_worst_window_ratio"), 0.5, false, "the thread's CPU time: what the store costs");
  ctx.results.AddGoal("memory store, long run with " + at + " retained: p99.9 <= 50 µs", g("p999_us"), 50.0,
                      true, "", "n");
}

}  // namespace dedup::bench
