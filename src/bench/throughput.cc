// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The throughput matrix. Contenders of one worker count run interleaved in short
// rounds (A B C ... A B C ...), so that drift of a shared machine hits all of
// them alike; a ratio to a baseline is taken per round and the median of those
// ratios is reported. A round lasts until the work it left to background threads
// is done (RunRound), so that no round runs beside an earlier contender's.

#include "bench/bench.h"

namespace dedup::bench {

void RunThroughput(BenchContext& ctx) {
  const Plan& p = ctx.plan;
  for (int threads : p.workers) {
    if (ctx.Stop()) return;
    auto& cs = ctx.results.groups[threads];
    // Everything a contender needs lives until the end of its worker count.
    ContenderGroup group(threads, &cs);
    for (auto& [name, add] : ContenderSources()) add(ctx, group);

    // Interleaved rounds: every contender once per round, in order.
    for (int round = 0; round < p.rounds && !ctx.Stop(); ++round) {
      std::map<std::string, double> rate;
      for (size_t i = 0; i < cs.size() && !ctx.Stop(); ++i) {
        Contender& c = *cs[i];
        ctx.Say(std::to_string(threads) + " workers, round " + std::to_string(round + 1) + "/" +
                std::to_string(p.rounds) + ": " + c.store + " " + c.label);
        RoundResult r;
        if (c.external) {
          r = c.external(p.round_s, Median(c.rates));
          c.ext_p50.push_back(r.p50_us);
          c.ext_p99.push_back(r.p99_us);
        } else {
          r = RunRound(c, threads, p.round_s);
          c.tails.push_back(r.tail_s);
        }
        c.rates.push_back(r.rate);
        c.errors += r.errors;
        c.messages += r.messages;
        rate[c.id] = r.rate;
      }
      for (auto& c : cs) {
        for (const std::string& b : c->baselines) {
          if (rate.count(c->id) && rate.count(b)) {
            ctx.results.ratios[threads][c->id][b].push_back(rate[c->id] / rate[b]);
          }
        }
      }
    }
    // Stores close here, before the next worker count.
    group.Release();
#ifdef DEDUP_WITH_REDIS
    if (ctx.redis && ctx.redis_target.own) {
      // A FLUSHALL of millions of keys can outlast the connection's 5 s timeout on a
      // loaded machine; the next worker count's stores then failed to open (PING
      // unanswered) and its Redis rows went unmeasured. Send it again until it is
      // answered (the server finishes the first one meanwhile; at most about a minute).
      for (int i = 0; i < 12 && RedisConn(ctx.redis_target).Command({"FLUSHALL"}) != "OK"; ++i) {
      }
    }
#endif
  }
}

void ThroughputGoals(BenchContext& ctx) {
  Results& r = ctx.results;
  const std::vector<int>& workers = ctx.plan.workers;
  auto has = [&](int t) { return std::find(workers.begin(), workers.end(), t) != workers.end(); };
  for (int t : {1, 2}) {
    r.AddGoal("memory store claim >= " + std::string(t == 1 ? "2" : "3") + "x unordered_map+mutex, " +
                  std::to_string(t) + " thread" + (t > 1 ? "s" : ""),
              has(t) ? r.Ratio(t, "memory/claim/b1", "memory/baseline/b1") : NAN, t == 1 ? 2.0 : 3.0);
  }
  for (int t : workers) {
    r.AddGoal("rocksdb store claim (WAL on) >= 3x Get+Put, " + std::to_string(t) + " threads",
              r.Ratio(t, "rocksdb/claim/b1", "rocksdb/baseline/b1"), 3.0);
  }
  // Issue 11: a claim and its durable completion together at least as fast as
  // the hand-written Get + Put (which records nothing durable at completion).
  for (int t : workers) {
    r.AddGoal("rocksdb store claim+complete >= 1x Get+Put, " + std::to_string(t) + " threads",
              r.Ratio(t, "rocksdb/claim+complete/b1", "rocksdb/baseline/b1"), 1.0);
  }
  for (int t : workers) {
    r.AddGoal("rocksdb store claim >= 10x SET NX EX (-P 1), " + std::to_string(t) + " threads/connections",
              r.Ratio(t, "rocksdb/claim/b1", "redis/baseline/b1"), 10.0);
  }
  // Issue 11: single claims >= 0.9x at depth 1 (one caller per connection) and
  // depth 16 (16 callers sharing each connection); ClaimBatch 16 >= 1x of -P 16.
  for (int t : workers) {
    const std::string n = std::to_string(t) + " connections";
    r.AddGoal("redis store claim >= 0.9x redis-benchmark, " + n + ", depth 1",
              r.Ratio(t, "redis/claim/b1", "redis/baseline/b1"), 0.9);
    r.AddGoal("redis store claim >= 0.9x redis-benchmark, " + n + ", depth 16 (16 callers per connection)",
              r.Ratio(t, "redis/claim/c16", "redis/baseline/b16"), 0.9);
    r.AddGoal("redis store ClaimBatch 16 >= 1x redis-benchmark -P 16, " + n,
              r.Ratio(t, "redis/claim/b16", "redis/baseline/b16"), 1.0);
  }
}

}  // namespace dedup::bench
