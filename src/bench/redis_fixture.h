// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The Redis the bench measures: a target parsed from --redis, or a redis-server
// of our own on 127.0.0.1:6420-6429 (stopped by PID, dies with us), a connection
// of the Redis client layer (src/redis) for setup and INFO, and the
// redis-benchmark baseline.

#ifndef DEDUP_BENCH_REDIS_FIXTURE_H_
#define DEDUP_BENCH_REDIS_FIXTURE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench/contender.h"
#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
#include "redis/client.h"
#endif

namespace dedup::bench {

struct RedisTarget {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string user, password;
  std::string base_uri;  // redis://[auth@]host:port[/db], without its query
  // The --redis URI's parameters that every URI made from it keeps, as written:
  // timeout= and password_file= ("" or e.g. "timeout=2s&password_file=/run/pw");
  // the store's pool= and spin= are the bench's own.
  std::string keep_params;
  // The password came from password_file= or $DEDUP_REDIS_PASSWORD, not from the
  // URI: redis-benchmark, which takes one only on its command line (which ps
  // shows to every user), is left out.
  bool password_off_command_line = false;
  bool own = false;      // started by this command: free to FLUSHALL
  // base_uri with keep_params and `params` ("prefix=x&pool=4") as its query.
  std::string Uri(const std::string& params) const;
};

// --redis, read by the one Redis URI parser (src/redis/options.h): one server.
std::optional<RedisTarget> ParseRedisUri(const std::string& uri, std::string* error);

#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
struct RedisConn {
  std::unique_ptr<redis::Connection> conn;  // null once a command failed
  std::string open_error;  // why the connection could not be opened (no password in it)
  explicit RedisConn(const RedisTarget& t);
  bool ok() const { return conn != nullptr; }
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
