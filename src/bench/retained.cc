// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Claims of new keys (1 thread) as retained records grow: the store is filled to
// each level with ClaimBatch of 1000, then claimed in windows.
//
// And a memory store growing from empty (MeasureGrowth): its index tables double
// as it fills, every shard at about the same time (keys spread evenly), so that
// a store that did each doubling in one call stalled for a whole window or more
// (issue 11 item 1; docs/DESIGN.md, "Memory store: growth without a stall").

#include <algorithm>

#include "bench/bench.h"
#include "bench/rocksdb_fixture.h"
#include "dedup/memory_store.h"
#include "stores/memory/memory_store_internal.h"

namespace dedup::bench {

namespace {

// Claims of new keys (kept 600 s) into a fresh memory store from one thread for
// `run_s`, every call timed, counted per 200 ms window of wall time; each
// window also notes the records at its end, the index doublings begun in it
// (over all shards) and its longest call. From empty the store crosses every
// doubling of its 64 shards' tables: at ~1.6 M, 3.1 M, 6.3 M, 12.6 M records,
// ... (3/4 of a shard's table, times 64).
json MeasureGrowth(BenchContext& ctx, double run_s) {
  auto store = NewMemoryStore();
  constexpr double kWindow = 0.2;
  const size_t windows = std::max<size_t>(1, static_cast<size_t>(run_s / kWindow + 0.5));
  std::vector<uint64_t> calls(windows, 0), records(windows, 0), doublings(windows, 0);
  std::vector<double> longest_us(windows, 0);
  Hist hist;
  uint64_t errors = 0, over_1ms = 0;
  const uint64_t base = NextKeyBlock();
  const auto window_ns = static_cast<int64_t>(kWindow * 1e9);
  uint64_t k = base, doublings_mark = 0;
  size_t at = 0;  // the window being counted
  char buf[32];
  const auto start = Clk::now();
  for (;;) {
    const auto a = Clk::now();
    const size_t w = static_cast<size_t>((a - start).count() / window_ns);
    if (w != at || ctx.Stop()) {
      const uint64_t d = internal::MemoryStoreIndex(store.get()).doublings;
      doublings[at] = d - doublings_mark;
      doublings_mark = d;
      for (size_t i = at; i < std::min(w, windows); ++i) records[i] = k - base;  // a call may span windows
      at = w;
      if (w >= windows || ctx.Stop()) break;
    }
    const size_t n = TaskKeyInto(k++, buf);
    const auto r = store->Claim(BenchClaim(std::string_view(buf, n)));
    const uint64_t ns = static_cast<uint64_t>((Clk::now() - a).count());
    hist.Add(ns);
    if (ns > 1'000'000) ++over_1ms;
    longest_us[w] = std::max(longest_us[w], static_cast<double>(ns) / 1e3);
    if (!r.ok() || !r->acquired()) ++errors;
    ++calls[w];
  }
  std::vector<double> rates;
  for (uint64_t c : calls) rates.push_back(static_cast<double>(c) / kWindow);
  const double median = Median(rates);
  const auto worst = std::min_element(rates.begin(), rates.end());
  const internal::MemoryStoreIndexStats st = internal::MemoryStoreIndex(store.get());
  return {{"run_s", run_s},
          {"window_s", kWindow},
          {"windows", rates},
          {"records", records},
          {"doublings", doublings},
          {"longest_us", longest_us},
          {"median_claims_per_s", Num(median)},
          {"worst_window_ratio", Num(*worst / median)},
          {"worst_window", worst - rates.begin()},
          {"p50_us", Num(hist.QuantileUs(0.5))},
          {"p99_us", Num(hist.QuantileUs(0.99))},
          {"p999_us", Num(hist.QuantileUs(0.999))},
          {"max_us", Num(hist.MaxUs())},
          {"calls_over_1ms", over_1ms},
          {"calls", hist.n},
          {"errors", errors},
          {"records_at_end", k - base},
          {"index_doublings", st.doublings},
          {"most_growth_work", st.most_growth_work},
          {"rss_bytes", RssBytes()}};
}

std::string GrowthMarkdown(const json& s) {
  auto g = [&](const char* k) { return s.contains(k) && s[k].is_number() ? s[k].get<double>() : NAN; };
  std::string o = "\n### Memory store growing from empty (one thread)\n\n";
  o += "Claims of new keys (kept 600 s) into a fresh memory store for " + Fmt("%.0f", g("run_s")) +
       " s, up to " + Rate(g("records_at_end")) +
       " records; its 64 shards' index tables double as it grows, all at about the same records.\n\n";
  o += "| claims/s (median window) | worst window / median | p50 µs | p99 µs | p99.9 µs | longest call µs | calls > "
       "1 ms | index doublings | RSS |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  o += "| " + Rate(g("median_claims_per_s")) + " | " + Fmt("%.2f", g("worst_window_ratio")) + " | " +
       Fmt("%.2f", g("p50_us")) + " | " + Fmt("%.2f", g("p99_us")) + " | " + Fmt("%.2f", g("p999_us")) + " | " +
       Fmt("%.0f", g("max_us")) + " | " + Rate(g("calls_over_1ms")) + " | " + Rate(g("index_doublings")) + " | " +
       Fmt("%.0f MiB", g("rss_bytes") / (1 << 20)) + " |\n\n";
  o += "Windows (claims/s, records at the window's end, index doublings begun in it, longest call µs):";
  if (s.contains("windows")) {
    for (size_t i = 0; i < s["windows"].size(); ++i) {
      o += " " + Rate(s["windows"][i].get<double>()) + " (" + Rate(s["records"][i].get<double>()) + ", " +
           std::to_string(s["doublings"][i].get<uint64_t>()) + ", " + Fmt("%.0f", s["longest_us"][i].get<double>()) +
           ")";
    }
  }
  return o + "\n";
}

}  // namespace

void RunRetained(BenchContext& ctx) {
  {
    const double run_s = ctx.plan.mode == "quick" ? 0.4 : ctx.plan.mode == "full" ? 8.0 : 3.0;
    ctx.Say("memory store growing from empty: " + Fmt("%.1f", run_s) + " s");
    const json g = MeasureGrowth(ctx, run_s);
    ctx.results.sections.push_back({"memory_growth", g, GrowthMarkdown(g)});
  }
  struct Target {
    std::string name;
    Store* store;
  };
  std::vector<Target> targets;
  auto mem = NewMemoryStore();
  targets.push_back({"memory", mem.get()});
#ifdef DEDUP_WITH_ROCKSDB
  std::unique_ptr<OwnRocks> rocks;
  if (!ctx.options.no_rocksdb) {
    std::string error;
    rocks = OwnRocks::Open(&error);
    if (rocks) targets.push_back({"rocksdb", rocks->store.get()});
  }
#endif
  for (auto& t : targets) {
    uint64_t filled = 0;
    const uint64_t fill_base = NextKeyBlock();
    for (uint64_t level : ctx.plan.retained_levels) {
      if (ctx.Stop()) return;
      // Fill with ClaimBatch of 1000 (records stay retained: 600 s past a 60 s lease).
      const auto t0 = Clk::now();
      std::vector<std::string> keys(1000);
      std::vector<ClaimRequest> reqs(1000);
      uint64_t fill_errors = 0;
      while (filled < level && !ctx.Stop()) {
        const size_t m = static_cast<size_t>(std::min<uint64_t>(1000, level - filled));
        for (size_t i = 0; i < m; ++i) {
          // Blocks of 10^8 per NextKeyBlock: 10^7 records stay inside one.
          keys[i] = TaskKey(fill_base + filled + i);
          reqs[i] = BenchClaim(keys[i]);
        }
        auto r = t.store->ClaimBatch(std::span(reqs.data(), m));
        if (!r.ok()) ++fill_errors;
        filled += m;
        if (filled % 100'000 == 0) {
          ctx.Say("retained records: " + t.name + " filling " + Rate(static_cast<double>(filled)) + "/" +
                  Rate(static_cast<double>(level)));
        }
      }
      const double fill_s = Seconds(Clk::now() - t0);
      ctx.Say("retained records: " + t.name + " at " + Rate(static_cast<double>(level)));
      Contender c;
      c.batch = 1;
      c.make_step = StoreStep(t.store, nullptr, "claim", 1);
      std::vector<double> rates;
      RunInProcess(c, 1, ctx.plan.retained_window_s);  // warm-up, not counted
      c.hist = Hist();
      const size_t doublings0 = internal::MemoryStoreIndex(t.store).doublings;
      for (int w = 0; w < ctx.plan.retained_windows && !ctx.Stop(); ++w) {
        rates.push_back(RunInProcess(c, 1, ctx.plan.retained_window_s).rate);
      }
      const double median = Median(rates);
      const double worst = rates.empty() ? NAN : *std::min_element(rates.begin(), rates.end());
      json row = {{"store", t.name},
                  {"retained", level},
                  {"claims_per_s", Num(median)},
                  {"windows", rates},
                  {"worst_window_ratio", Num(worst / median)},
                  {"fill_s", fill_s},
                  {"fill_errors", fill_errors},
                  {"p50_us", Num(c.hist.QuantileUs(0.5))},
                  {"p99_us", Num(c.hist.QuantileUs(0.99))},
                  {"p999_us", Num(c.hist.QuantileUs(0.999))},
                  {"max_us", Num(c.hist.MaxUs())}};
      if (t.name == "memory") {
        row["rss_bytes"] = RssBytes();
        // Doublings of shards' index tables begun in the windows (those at 10^6
        // and 10^7 cross the doubling of every shard: at ~1.6 M and ~12.6 M).
        row["index_doublings"] = internal::MemoryStoreIndex(t.store).doublings - doublings0;
      }
#ifdef DEDUP_WITH_ROCKSDB
      if (t.name == "rocksdb") row["dir_bytes"] = DirBytes(rocks->dir);
#endif
      ctx.results.retained.push_back(row);
    }
  }
}

void RetainedGoals(BenchContext& ctx) {
  for (const char* store : {"memory", "rocksdb"}) {
    double lo = NAN, hi = NAN;
    uint64_t hi_level = 0;
    for (auto& row : ctx.results.retained) {
      if (row["store"] != store) continue;
      const uint64_t level = row["retained"];
      const double v = row["claims_per_s"].is_number() ? row["claims_per_s"].get<double>() : NAN;
      if (level == 10'000) lo = v;
      if (level == 10'000'000) hi = v;
      hi_level = std::max(hi_level, level);
    }
    ctx.results.AddGoal(std::string(store) + " store: claims with 10^7 retained >= 0.5x with 10^4", hi / lo,
                        0.5, false, std::isfinite(hi) ? "" : "10^7 runs with --full only");
  }
  // The windows of the levels that cross a doubling (as many as the plan's
  // windows take), then the growth from empty, which crosses several.
  double worst = NAN, longest = NAN;
  std::string which;
  for (auto& row : ctx.results.retained) {
    if (row["store"] != "memory" || !row["worst_window_ratio"].is_number()) continue;
    const double v = row["worst_window_ratio"].get<double>();
    if (!(v >= worst)) {
      worst = v;
      which = Rate(row["retained"].get<double>());
    }
    if (row["max_us"].is_number() && !(row["max_us"].get<double>() <= longest)) longest = row["max_us"].get<double>();
  }
  ctx.results.AddGoal("memory store, retained levels: no 200 ms window below 0.5x its level's median", worst, 0.5,
                      false, "worst at " + which + "; longest call " + Fmt("%.0f", longest) + " µs");
  const Section* s = ctx.results.FindSection("memory_growth");
  auto g = [&](const char* k) {
    return s != nullptr && s->data.contains(k) && s->data[k].is_number() ? s->data[k].get<double>() : NAN;
  };
  const std::string to = Rate(g("records_at_end"));
  ctx.results.AddGoal("memory store growing from empty to " + to + ": no 200 ms window below 0.5x the median",
                      g("worst_window_ratio"), 0.5, false,
                      "longest call " + Fmt("%.0f", g("max_us")) + " µs; wall time, shared machine");
  ctx.results.AddGoal("memory store growing from empty to " + to + ": p99.9 <= 50 µs", g("p999_us"), 50.0, true,
                      "", "n");
}

}  // namespace dedup::bench
