// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The Redis the bench measures: a target parsed from --redis, or a redis-server
// of our own on 127.0.0.1:6420-6429 (stopped by PID, dies with us), a small
// hiredis connection for setup and INFO, and the redis-benchmark baseline.

#ifndef DEDUP_BENCH_REDIS_FIXTURE_H_
#define DEDUP_BENCH_REDIS_FIXTURE_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/contender.h"

struct redisContext;

namespace dedup::bench {

struct RedisTarget {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string user, password;
  std::string base_uri;  // redis://[auth@]host:port
  bool own = false;      // started by this command: free to FLUSHALL
};

std::optional<RedisTarget> ParseRedisUri(const std::string& uri, std::string* error);

#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
struct RedisConn {
  redisContext* c = nullptr;
  explicit RedisConn(const RedisTarget& t);
  ~RedisConn();
  RedisConn(const RedisConn&) = delete;
  RedisConn& operator=(const RedisConn&) = delete;
  bool ok() const;
  // The reply as text (status, string, integer), or "" on failure.
  std::string Command(const std::vector<std::string>& args);
  long long InfoField(const std::string& section, const std::string& field);
  // Sends `cmds` as one pipeline; returns how many replies were errors or missing.
  size_t Pipeline(const std::vector<std::vector<std::string>>& cmds);
};

// A redis-server of our own on 127.0.0.1, in a temporary directory, stopped by PID.
class OwnRedis {
 public:
  ~OwnRedis() { Stop(); }
  bool Start(std::string* error);
  void Stop();
  const RedisTarget& target() const { return target_; }

 private:
  pid_t pid_ = -1;
  std::string dir_;
  RedisTarget target_;
};

// Runs `redis-benchmark ... --csv SET task_id:__rand_int__ processing NX EX 60`.
RoundResult RunRedisBenchmark(const RedisTarget& t, int connections, int pipeline, uint64_t requests);
#endif

}  // namespace dedup::bench

#endif  // DEDUP_BENCH_REDIS_FIXTURE_H_
