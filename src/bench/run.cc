// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// bench::Run: sets up the Redis to measure, runs the phases of registry.cc in
// order, then lists their goals.

#include <algorithm>
#include <cstdlib>

#include "bench/bench.h"

namespace dedup::bench {

namespace {

#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
using OwnRedisPtr = std::unique_ptr<OwnRedis>;
#else
struct OwnRedis {};
using OwnRedisPtr = std::unique_ptr<OwnRedis>;
#endif

bool SetUpRedis(BenchContext& ctx, std::unique_ptr<OwnRedis>* own_redis) {
#if defined(DEDUP_WITH_REDIS)
  if (ctx.options.no_redis) {
    ctx.Skip("redis store: --no-redis");
    return false;
  }
  std::string error;
  if (!ctx.options.redis_uri.empty()) {
    auto t = ParseRedisUri(ctx.options.redis_uri, &error);
    if (!t) {
      ctx.results.usage_error = error;
      return false;
    }
    ctx.redis_target = *t;
  } else {
    *own_redis = std::make_unique<OwnRedis>();
    if (!(*own_redis)->Start(&error)) {
      ctx.Skip("redis store: " + error);
      own_redis->reset();
      return false;
    }
    ctx.redis_target = (*own_redis)->target();
  }
  RedisConn c(ctx.redis_target);
  if (!c.ok() || c.Command({"PING"}) != "PONG") {
    // Say why: refused, WRONGPASS, NOAUTH (never the password).
    const std::string why = !c.open_error.empty() ? c.open_error : "PING was not answered PONG";
    ctx.Skip("redis store: no answer to PING from " + ctx.redis_target.host + ":" +
             std::to_string(ctx.redis_target.port) + " (" + why + ")");
    return false;
  }
  const std::string info = c.Command({"INFO", "server"});
  if (auto at = info.find("redis_version:"); at != std::string::npos) {
    ctx.results.redis_version = info.substr(at + 14, info.find('\r', at) - at - 14);
  }
  if (std::system("command -v redis-benchmark >/dev/null 2>&1") != 0) {
    ctx.Skip("redis-benchmark baseline: redis-benchmark not found in PATH");
  }
  return true;
#else
  ctx.Skip("redis store: not compiled in (DEDUP_WITH_REDIS=OFF)");
  return false;
#endif
}

bool Wanted(const BenchOptions& o, const std::string& phase) {
  return o.only.empty() || std::find(o.only.begin(), o.only.end(), phase) != o.only.end();
}

}  // namespace

Results Run(const BenchOptions& options, std::function<void(const std::string&)> progress) {
  const Plan plan = MakePlan(options);
  Results results;
  results.command_line = options.command_line;
  results.mode = plan.mode;
  results.rounds = plan.rounds;
  results.round_s = plan.round_s;
  BenchContext ctx{options, plan, results, std::move(progress), false, RedisTarget()};
  const auto start = Clk::now();
  OwnRedisPtr own_redis;
  ctx.redis = SetUpRedis(ctx, &own_redis);
  if (!ctx.redis && !options.redis_uri.empty()) {
    // The Redis asked for does not work: nothing to measure against.
    if (results.usage_error.empty()) {
      results.usage_error = results.skipped.empty() ? "--redis: no answer" : results.skipped.back();
    }
    return results;
  }
  for (const PhaseEntry& p : Phases()) {
    if (!ctx.Stop() && Wanted(options, p.name)) p.run(ctx);
  }
  results.elapsed_s = Seconds(Clk::now() - start);
  for (const PhaseEntry& p : Phases()) {
    if (p.goals && Wanted(options, p.name)) p.goals(ctx);
  }
  results.interrupted = StopRequested();
  return results;
}

}  // namespace dedup::bench
