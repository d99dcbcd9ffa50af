// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The `--exec` spawn row (issue 8, item 5): what a supervised handler process
// costs per message. `dedup worker --exec /bin/true --no-shell` (this same
// executable, a Redis stream, the memory store) against a plain loop that spawns
// the same command once per message (posix_spawn + waitpid on as many threads:
// no broker, no store, no supervision), alternating round by round. The ratio of
// a round is the loop's time over the worker's time for the same messages; the
// worker's time runs from the messages' publication (the worker is started and
// its group made before) until its group has read and acked them all.
// scripts/bench_exec_spawn.sh is the same comparison as a script, with the
// `sh -c` rows and a build against another build.
//
// Each row also gives the CPU time per message, which the other work on a
// shared machine disturbs far less than the wall time: the loop's (this
// process and the commands it reaped: getrusage) against the worker's (its
// threads and the handlers it reaped: /proc/PID/stat) plus the Redis server's
// (INFO cpu; it also serves the group polls of this bench, a few per
// millisecond of worker time at most).

#ifdef DEDUP_WITH_REDIS_STREAMS

#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench.h"
#include "bench/child.h"
#include "bench/redis_fixture.h"
#include "bench/util.h"

extern char** environ;

namespace dedup::bench {
namespace {

constexpr const char* kCommand = "/bin/true";
// Messages per round: a spawn costs about a millisecond, so a round of the
// default plan's 5,000 would take seconds each way; 2,000 is what the script uses.
constexpr uint64_t kMaxMessages = 2000;

// CPU seconds of this process plus those of the children it reaped.
double OwnCpuSeconds() {
  double s = 0;
  for (int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    rusage u{};
    getrusage(who, &u);
    s += static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) / 1e6;
  }
  return s;
}

// CPU seconds of process `pid` and of the children it reaped (utime, stime,
// cutime, cstime of /proc/PID/stat); NaN when unreadable.
double ProcessTreeCpuSeconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = stat.rfind(')');  // the command name may hold spaces
  if (close == std::string::npos) return NAN;
  std::istringstream fields(stat.substr(close + 2));
  std::string f;
  double ticks = 0;
  // Fields 3.. follow the name; utime..cstime are fields 14..17.
  for (int i = 3; i <= 17 && fields >> f; ++i) {
    if (i >= 14) ticks += std::atof(f.c_str());
  }
  return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// CPU seconds the Redis server has used (INFO cpu); NaN when not told.
double RedisCpuSeconds(RedisConn& redis) {
  const std::string info = redis.Command({"INFO", "cpu"});
  double s = 0;
  for (const char* field : {"used_cpu_sys:", "used_cpu_user:"}) {
    const size_t at = info.find(field);
    if (at == std::string::npos) return NAN;
    s += std::atof(info.c_str() + at + std::strlen(field));
  }
  return s;
}

// Seconds for `n` spawns of kCommand on `threads` threads; NaN if one failed.
// *cpu: the CPU seconds they took (this process and the commands).
double PlainLoop(uint64_t n, int threads, double* cpu) {
  const double cpu0 = OwnCpuSeconds();
  std::atomic<uint64_t> next{0};
  std::atomic<uint64_t> failed{0};
  char* argv[] = {const_cast<char*>(kCommand), nullptr};
  const auto t0 = Clk::now();
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      while (next.fetch_add(1) < n) {
        pid_t pid;
        if (posix_spawn(&pid, kCommand, nullptr, nullptr, argv, environ) != 0) {
          failed.fetch_add(1);
          continue;
        }
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) failed.fetch_add(1);
      }
    });
  }
  for (auto& t : ts) t.join();
  const double s = Seconds(Clk::now() - t0);
  *cpu = OwnCpuSeconds() - cpu0;
  return failed.load() == 0 ? s : NAN;
}

// 1 when group ARGV[1] of stream KEYS[1] exists (ARGV[2] empty), or has read
// ARGV[2] entries and has none pending.
constexpr const char* kGroupScript = R"(
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local t = {}
  for i = 1, #g, 2 do t[g[i]] = g[i + 1] end
  if t['name'] == ARGV[1] then
    if ARGV[2] == '' then return 1 end
    if t['pending'] == 0 and t['entries-read'] == tonumber(ARGV[2]) then return 1 end
    return 0
  end
end
return 0)";

std::string Tail(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string s = ss.str();
  while (!s.empty() && s.back() == '\n') s.pop_back();
  const size_t at = s.rfind('\n');
  return at == std::string::npos ? s : s.substr(at + 1);
}

// Seconds for a running `dedup worker --exec kCommand --no-shell` to take `n`
// messages published at once on its stream (its start-up, connection and group
// creation not counted: they are not per message); NaN (and *error) if it did not.
// The group is first asked after `quiet` (a bound below the worker's time: the
// loop's), then every 2 ms: the polls cost CPU the worker competes for.
// *cpu, *redis_cpu: the CPU seconds of the worker (with its handlers) and of
// the Redis server over the same span.
double WorkerRun(const BenchContext& ctx, RedisConn& redis, const std::string& stream, uint64_t n,
                 int concurrency, const std::string& err_path, Clk::duration quiet, double* cpu,
                 double* redis_cpu, std::string* error) {
  std::vector<std::vector<std::string>> xadds;
  xadds.reserve(n);
  for (uint64_t i = 1; i <= n; ++i) {
    xadds.push_back({"XADD", stream, "*", "id", "m" + std::to_string(i), "payload", "x"});
  }
  const std::string broker = ctx.redis_target.Uri("stream=" + stream + "&group=g");
  const pid_t pid = SpawnSelf({"worker", "--broker", broker, "--store", "memory:", "--exec", kCommand,
                               "--no-shell", "--concurrency", std::to_string(concurrency),
                               "--summary-interval", "0"},
                              err_path);
  if (pid < 0) {
    *error = "fork failed";
    return NAN;
  }
  // Polls until the group answers `want` (see kGroupScript); false when the
  // worker exited, time ran out or the bench is stopped.
  auto wait_for = [&](const std::string& want, const char* what) {
    const auto give_up = Clk::now() + std::chrono::seconds(120);
    while (Clk::now() < give_up && !ctx.Stop()) {
      int st = 0;
      if (waitpid(pid, &st, WNOHANG) == pid) {
        *error = std::string("the worker exited ") + what + ": " + Tail(err_path);
        return false;
      }
      if (redis.Command({"EVAL", kGroupScript, "1", stream, "g", want}) == "1") return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    if (error->empty()) *error = std::string("the worker was not done ") + what + " within 120 s";
    return false;
  };
  double s = NAN;
  if (wait_for("", "before its group existed")) {
    const double cpu0 = ProcessTreeCpuSeconds(pid);
    const double redis0 = RedisCpuSeconds(redis);
    const auto t0 = Clk::now();
    if (redis.Pipeline(xadds) != 0) {
      *error = "XADD of the round's messages failed";
    } else {
      std::this_thread::sleep_until(t0 + quiet);
      if (wait_for(std::to_string(n), "before it took every message")) {
        s = Seconds(Clk::now() - t0);
        *cpu = ProcessTreeCpuSeconds(pid) - cpu0;
        *redis_cpu = RedisCpuSeconds(redis) - redis0;
      }
    }
  }
  kill(pid, SIGTERM);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  redis.Command({"DEL", stream});
  return s;
}

}  // namespace

void RunExecSpawn(BenchContext& ctx) {
  if (ctx.options.no_worker) {
    ctx.Skip("exec spawn: --no-worker");
    return;
  }
  if (!ctx.redis) {
    ctx.Skip("exec spawn: needs Redis");
    return;
  }
  if (access(kCommand, X_OK) != 0) {
    ctx.Skip(std::string("exec spawn: no ") + kCommand);
    return;
  }
  RedisConn redis(ctx.redis_target);
  if (!redis.ok()) {
    ctx.Skip("exec spawn: cannot connect to Redis: " + redis.open_error);
    return;
  }
  const uint64_t n = std::min<uint64_t>(ctx.plan.worker_messages, kMaxMessages);
  const int rounds = std::max(ctx.plan.worker_rounds, 3);
  const std::string dir = MakeTempDir("exec_spawn");
  const std::string err_path = dir + "/worker.err";
  json rows = json::array();
  std::string md = "### `dedup worker --exec /bin/true --no-shell` against a plain spawn loop\n\n" +
                   std::to_string(n) + " messages per round, " + std::to_string(rounds) +
                   " rounds, the two alternating; the worker on a Redis stream with the memory store, "
                   "started first, then timed from the messages' publication until its group has read and "
                   "acked every one; the loop "
                   "spawns the same command with posix_spawn + waitpid on as many threads.\n\n"
                   "CPU per message: the loop's process and commands; the worker's process and handlers, and "
                   "the Redis server's (which also answers this bench's polls of the group).\n\n"
                   "| concurrency | plain loop s (median) | worker s (median) | ratio loop / worker (median of rounds) "
                   "| loop CPU ms/msg | worker CPU ms/msg | Redis CPU ms/msg | CPU ratio loop / (worker + Redis) |\n"
                   "|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  int serial = 0;
  for (int c : {1, 2}) {
    std::vector<double> loop_s, worker_s, ratios, loop_cpu, worker_cpu, redis_cpu, cpu_ratios;
    std::string error;
    for (int r = 0; r < rounds && !ctx.Stop(); ++r) {
      ctx.Say("exec spawn: concurrency " + std::to_string(c) + ", round " + std::to_string(r + 1));
      double lc = NAN, wc = NAN, rc = NAN;
      const double l = PlainLoop(n, c, &lc);
      const std::string stream =
          "dedup-bench-spawn-" + std::to_string(getpid()) + "-" + std::to_string(++serial);
      // The worker runs what the loop runs and more: it is not done before half
      // the loop's time, so its group is not polled before.
      const auto quiet = std::chrono::duration_cast<Clk::duration>(
          std::chrono::duration<double>(std::isnan(l) ? 0.0 : l / 2));
      const double w = WorkerRun(ctx, redis, stream, n, c, err_path, quiet, &wc, &rc, &error);
      if (std::isnan(l) || std::isnan(w)) {
        if (error.empty()) error = std::string("a spawn of ") + kCommand + " failed in the plain loop";
        break;
      }
      loop_s.push_back(l);
      worker_s.push_back(w);
      ratios.push_back(l / w);
      const double per = 1e3 / static_cast<double>(n);
      loop_cpu.push_back(lc * per);
      worker_cpu.push_back(wc * per);
      redis_cpu.push_back(rc * per);
      if (!std::isnan(wc) && !std::isnan(rc) && wc + rc > 0) cpu_ratios.push_back(lc / (wc + rc));
    }
    if (!error.empty()) {
      ctx.Skip("exec spawn, concurrency " + std::to_string(c) + ": " + error);
      continue;
    }
    if (ratios.empty()) continue;
    const double ratio = Median(ratios);
    const double cpu_ratio = Median(cpu_ratios);
    rows.push_back({{"concurrency", c},
                    {"messages", n},
                    {"loop_s", loop_s},
                    {"worker_s", worker_s},
                    {"ratio", ratio},
                    {"loop_cpu_ms_per_msg", loop_cpu},
                    {"worker_cpu_ms_per_msg", worker_cpu},
                    {"redis_cpu_ms_per_msg", redis_cpu},
                    {"cpu_ratio", cpu_ratio}});
    char line[256];
    std::snprintf(line, sizeof line, "| %d | %.3f | %.3f | %.2fx | %.3f | %.3f | %.3f | %.2fx |\n", c,
                  Median(loop_s), Median(worker_s), ratio, Median(loop_cpu), Median(worker_cpu),
                  Median(redis_cpu), cpu_ratio);
    md += line;
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  if (!rows.empty()) ctx.results.sections.push_back({"exec_spawn", std::move(rows), md + "\n"});
}

void ExecSpawnGoals(BenchContext& ctx) {
  const Section* s = ctx.results.FindSection("exec_spawn");
  for (int c : {1, 2}) {
    double ratio = NAN;
    if (s != nullptr) {
      for (const json& row : s->data) {
        if (row.value("concurrency", 0) == c) ratio = row.value("ratio", NAN);
      }
    }
    ctx.results.AddGoal("dedup worker --exec --no-shell /bin/true >= 0.8x a plain spawn loop, concurrency " +
                            std::to_string(c),
                        ratio, 0.8);
  }
}

}  // namespace dedup::bench

#else  // !DEDUP_WITH_REDIS_STREAMS

#include "bench/bench.h"

namespace dedup::bench {

void RunExecSpawn(BenchContext& ctx) {
  ctx.Skip("exec spawn: not compiled in (DEDUP_WITH_REDIS_STREAMS off)");
}
void ExecSpawnGoals(BenchContext&) {}

}  // namespace dedup::bench

#endif  // DEDUP_WITH_REDIS_STREAMS
