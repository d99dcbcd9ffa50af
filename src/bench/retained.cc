// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Claims of new keys (1 thread) as retained records grow: the store is filled to
// each level with ClaimBatch of 1000, then claimed in windows.

#include "bench/bench.h"
#include "bench/rocksdb_fixture.h"
#include "dedup/memory_store.h"

namespace dedup::bench {

void RunRetained(BenchContext& ctx) {
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
      for (int w = 0; w < ctx.plan.retained_windows && !ctx.Stop(); ++w) {
        rates.push_back(RunInProcess(c, 1, ctx.plan.retained_window_s).rate);
      }
      json row = {{"store", t.name},
                  {"retained", level},
                  {"claims_per_s", Num(Median(rates))},
                  {"windows", rates},
                  {"fill_s", fill_s},
                  {"fill_errors", fill_errors},
                  {"p50_us", Num(c.hist.QuantileUs(0.5))},
                  {"p99_us", Num(c.hist.QuantileUs(0.99))}};
      if (t.name == "memory") row["rss_bytes"] = RssBytes();
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
}

}  // namespace dedup::bench
