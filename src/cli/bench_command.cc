// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup bench`: what the guard costs per message on each store, next to what a
// user would write instead, measured in one run on this machine.
//
//   dedup bench                      # a few minutes on 2 cores
//   dedup bench --quick --json       # seconds: the CI smoke test
//   dedup bench --full --plots docs --markdown docs/PERFORMANCE.figures.md
//
// Contenders of one worker count run interleaved in short rounds (A B C ... A B C
// ...), so that drift of a shared machine hits all of them alike; a ratio to a
// baseline is taken per round and the median of those ratios is reported.
//
// Baselines: std::unordered_map under one mutex (memory store), Get then Put on a
// plain RocksDB with bloom filters and the WAL on (RocksDB store), and the real
// `redis-benchmark` running the seed's SET task_id:__rand_int__ processing NX EX 60
// at the same connections and pipeline depth (Redis store). The Redis Streams
// worker is compared with itself without the guard.

#include <fcntl.h>
#include <malloc.h>
#include <nlohmann/json.hpp>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cli/command.h"
#include "cli/flags.h"
#include "core/redact.h"
#include "dedup/buffer.h"
#include "dedup/memory_store.h"
#include "dedup/store.h"
#ifdef DEDUP_WITH_ROCKSDB
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <rocksdb/version.h>

#include "dedup/rocksdb_store.h"
#endif
#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
#include <hiredis/hiredis.h>
#endif
#ifdef DEDUP_WITH_REDIS_STREAMS
#include "dedup/worker.h"
#endif

namespace dedup::cli {

void RegisterBench(CLI::App& root, CommandContext& ctx);

namespace {

using Clk = std::chrono::steady_clock;
using nlohmann::json;
using namespace std::chrono_literals;

std::atomic<bool> g_interrupted{false};
extern "C" void OnBenchInterrupt(int) { g_interrupted.store(true); }

// ---- small helpers ------------------------------------------------------------

double Seconds(Clk::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return !std::isfinite(x); }), v.end());
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The seed's key shape, as redis-benchmark's __rand_int__ makes it: 20 bytes.
std::string TaskKey(uint64_t n) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "task_id:%012llu",
                static_cast<unsigned long long>(n % 1'000'000'000'000ULL));
  return buf;
}

// Every thread of every round takes its own block of key numbers: keys are
// fresh (a message seen for the first time), never shared between contenders.
std::atomic<uint64_t> g_key_block{1};
uint64_t NextKeyBlock() { return g_key_block.fetch_add(1) * 100'000'000ULL; }

json Num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::string Fmt(const char* f, double v) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

// "1 234 567"
std::string Rate(double v) {
  if (!std::isfinite(v)) return "-";
  std::string s = std::to_string(static_cast<long long>(std::llround(v)));
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), " ");
  return s;
}

long RssBytes() {
  std::ifstream f("/proc/self/statm");
  long pages = 0, rss = 0;
  f >> pages >> rss;
  return rss * sysconf(_SC_PAGESIZE);
}

uint64_t DirBytes(const std::string& dir, const std::string& suffix = "") {
  uint64_t total = 0;
  std::error_code ec;
  for (auto& e : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    if (!suffix.empty() && e.path().extension() != suffix) continue;
    total += e.file_size(ec);
  }
  return total;
}

std::string MakeTempDir(const std::string& tag) {
  std::string t = (std::filesystem::temp_directory_path() / ("dedup-bench-" + tag + "-XXXXXX")).string();
  if (mkdtemp(t.data()) == nullptr) return "";
  return t;
}

// Log-linear latency histogram: 16 buckets per power of two of nanoseconds
// (about 4 % resolution), cheap enough to record every operation.
struct Hist {
  std::array<uint64_t, 64 * 16> b{};
  uint64_t n = 0;
  void Add(uint64_t ns) {
    if (ns == 0) ns = 1;
    const int e = 63 - __builtin_clzll(ns);
    const uint64_t sub = e >= 4 ? (ns >> (e - 4)) & 15 : (ns << (4 - e)) & 15;
    ++b[static_cast<size_t>(e) * 16 + sub];
    ++n;
  }
  void Merge(const Hist& o) {
    for (size_t i = 0; i < b.size(); ++i) b[i] += o.b[i];
    n += o.n;
  }
  // In microseconds; NaN when empty.
  double QuantileUs(double q) const {
    if (n == 0) return NAN;
    const uint64_t want = static_cast<uint64_t>(std::ceil(q * static_cast<double>(n)));
    uint64_t seen = 0;
    for (size_t i = 0; i < b.size(); ++i) {
      seen += b[i];
      if (seen >= want && b[i] > 0) {
        const double e = static_cast<double>(i / 16), sub = static_cast<double>(i % 16);
        return (16.0 + sub + 0.5) * std::pow(2.0, e) / 16.0 / 1000.0;
      }
    }
    return NAN;
  }
};

// ---- contenders ---------------------------------------------------------------

// One thread's work: `step(first_key_number)` handles `batch` messages and says
// whether all went as expected.
using Step = std::function<bool(uint64_t)>;

struct RoundResult {
  double rate = NAN;  // messages per second
  uint64_t messages = 0;
  uint64_t errors = 0;
  // Filled by external contenders (redis-benchmark), which keep their own latency.
  double p50_us = NAN, p99_us = NAN;
};

struct Contender {
  std::string id;        // "memory/claim/b1": unique within a worker count
  std::string store;     // memory | rocksdb | redis
  std::string label;     // what a reader sees
  std::string op;        // claim | claim+complete | process_once | baseline
  int batch = 1;
  std::vector<std::string> baselines;  // ids of the contenders it is compared with
  // In-process contenders: a Step per thread, made at the start of each round.
  std::function<Step(int thread)> make_step;
  // External contenders run a round themselves.
  std::function<RoundResult(double seconds, double expected_rate)> external;

  // Results.
  std::vector<double> rates;
  std::vector<double> ext_p50, ext_p99;
  Hist hist;
  uint64_t errors = 0, messages = 0;
};

RoundResult RunInProcess(Contender& c, int threads, double seconds) {
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int> ready{0};
  std::vector<Hist> hists(static_cast<size_t>(threads));
  std::vector<uint64_t> done(static_cast<size_t>(threads)), errs(static_cast<size_t>(threads));
  std::vector<std::thread> ts;
  const int batch = c.batch;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      Step step = c.make_step(t);
      uint64_t key = NextKeyBlock();
      Hist& h = hists[static_cast<size_t>(t)];
      uint64_t n = 0, e = 0;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (!stop.load(std::memory_order_relaxed)) {
        const auto t0 = Clk::now();
        const bool ok = step(key);
        const auto t1 = Clk::now();
        h.Add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
        key += static_cast<uint64_t>(batch);
        n += static_cast<uint64_t>(batch);
        if (!ok) ++e;
      }
      done[static_cast<size_t>(t)] = n;
      errs[static_cast<size_t>(t)] = e;
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = Clk::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& t : ts) t.join();
  const double secs = Seconds(Clk::now() - start);
  RoundResult r;
  for (int t = 0; t < threads; ++t) {
    r.messages += done[static_cast<size_t>(t)];
    r.errors += errs[static_cast<size_t>(t)];
    c.hist.Merge(hists[static_cast<size_t>(t)]);
  }
  r.rate = static_cast<double>(r.messages) / secs;
  return r;
}

// ---- Redis plumbing -------------------------------------------------------------

struct RedisTarget {
  std::string host = "127.0.0.1";
  int port = 0;
  std::string user, password;
  std::string base_uri;  // redis://[auth@]host:port
  bool own = false;      // started by this command: free to FLUSHALL
};

std::optional<RedisTarget> ParseRedisUri(const std::string& uri, std::string* error) {
  RedisTarget t;
  std::string rest = uri;
  if (rest.rfind("redis://", 0) != 0) {
    // Echoed only when it looks like a URI: a bare word may be a password.
    *error = "--redis must be redis://[user:password@]host:port, got " +
             (uri.find("://") != std::string::npos ? "'" + internal::RedactUri(uri) + "'"
                                                   : std::string("a value without a scheme"));
    return std::nullopt;
  }
  rest = rest.substr(8);
  if (auto q = rest.find_first_of("?/"); q != std::string::npos) rest = rest.substr(0, q);
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    const std::string auth = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (auto c = auth.find(':'); c != std::string::npos) {
      t.user = auth.substr(0, c);
      t.password = auth.substr(c + 1);
    } else {
      t.password = auth;
    }
  }
  const auto colon = rest.rfind(':');
  t.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  t.port = colon == std::string::npos ? 6379 : std::atoi(rest.c_str() + colon + 1);
  if (t.host.empty() || t.port <= 0 || t.port > 65535 ||
      t.host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:") !=
          std::string::npos) {
    *error = "--redis: cannot read host:port of '" + internal::RedactUri(uri) + "'";
    return std::nullopt;
  }
  t.base_uri = uri.substr(0, uri.find('?'));
  return t;
}

#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
struct RedisConn {
  redisContext* c = nullptr;
  std::string auth_error;  // the server's answer to AUTH when it refused it
  // Why the connection is unusable, for a message ("" when it is fine).
  std::string Why() const {
    if (c == nullptr) return "cannot allocate a connection";
    if (c->err != 0) return c->errstr;
    return auth_error;
  }
  explicit RedisConn(const RedisTarget& t) {
    timeval tv{5, 0};
    c = redisConnectWithTimeout(t.host.c_str(), t.port, tv);
    if (c != nullptr && c->err == 0) {
      redisSetTimeout(c, tv);
      if (!t.password.empty()) {
        redisReply* r = t.user.empty()
                            ? static_cast<redisReply*>(redisCommand(c, "AUTH %s", t.password.c_str()))
                            : static_cast<redisReply*>(redisCommand(c, "AUTH %s %s", t.user.c_str(),
                                                                    t.password.c_str()));
        if (r != nullptr && r->type == REDIS_REPLY_ERROR) {
          auth_error = "AUTH refused: " + std::string(r->str, r->len);  // never echoes it
        }
        if (r) freeReplyObject(r);
      }
    }
  }
  ~RedisConn() {
    if (c) redisFree(c);
  }
  bool ok() const { return c != nullptr && c->err == 0; }
  // The reply as text (status, string, integer), or "" on failure.
  std::string Command(const std::vector<std::string>& args) {
    if (!ok()) return "";
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    auto* r = static_cast<redisReply*>(
        redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()));
    if (!r) return "";
    std::string out;
    if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
      out.assign(r->str, r->len);
    } else if (r->type == REDIS_REPLY_INTEGER) {
      out = std::to_string(r->integer);
    }
    freeReplyObject(r);
    return out;
  }
  long long InfoField(const std::string& section, const std::string& field) {
    const std::string text = Command({"INFO", section});
    const auto at = text.find(field + ":");
    if (at == std::string::npos) return -1;
    return std::atoll(text.c_str() + at + field.size() + 1);
  }
  // Sends `cmds` as one pipeline; returns how many replies were errors or missing.
  size_t Pipeline(const std::vector<std::vector<std::string>>& cmds) {
    if (!ok()) return cmds.size();
    for (auto& args : cmds) {
      std::vector<const char*> argv;
      std::vector<size_t> lens;
      for (auto& a : args) {
        argv.push_back(a.data());
        lens.push_back(a.size());
      }
      redisAppendCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data());
    }
    size_t bad = 0;
    for (size_t i = 0; i < cmds.size(); ++i) {
      void* r = nullptr;
      if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) {
        bad += cmds.size() - i;
        break;
      }
      if (static_cast<redisReply*>(r)->type == REDIS_REPLY_ERROR) ++bad;
      freeReplyObject(r);
    }
    return bad;
  }
};

// A redis-server of our own on 127.0.0.1, in a temporary directory, stopped by PID.
class OwnRedis {
 public:
  ~OwnRedis() { Stop(); }
  bool Start(std::string* error) {
    dir_ = MakeTempDir("redis");
    for (int port = 6420; port <= 6429; ++port) {
      RedisTarget probe;
      probe.port = port;
      {
        RedisConn c(probe);
        if (c.ok()) continue;  // something listens there
      }
      const pid_t pid = fork();
      if (pid < 0) break;
      if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        const int devnull = open("/dev/null", O_RDWR);
        dup2(devnull, 1);
        dup2(devnull, 2);
        const std::string p = std::to_string(port), log = dir_ + "/redis.log";
        execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--dir",
               dir_.c_str(), "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile",
               log.c_str(), "--protected-mode", "no", static_cast<char*>(nullptr));
        _exit(127);
      }
      pid_ = pid;
      target_.port = port;
      target_.own = true;
      target_.base_uri = "redis://127.0.0.1:" + p(port);
      for (int i = 0; i < 200; ++i) {
        RedisConn c(target_);
        if (c.ok() && c.Command({"PING"}) == "PONG") return true;
        int st = 0;
        if (waitpid(pid_, &st, WNOHANG) == pid_) {  // exited: port taken meanwhile?
          pid_ = -1;
          break;
        }
        std::this_thread::sleep_for(25ms);
      }
      Stop();
    }
    *error = "could not start redis-server on a free port in 6420-6429 (is redis-server installed?)";
    return false;
  }
  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st = 0;
      for (int i = 0; i < 100 && waitpid(pid_, &st, WNOHANG) == 0; ++i) std::this_thread::sleep_for(50ms);
      if (waitpid(pid_, &st, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &st, 0);
      }
      pid_ = -1;
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      dir_.clear();
    }
  }
  const RedisTarget& target() const { return target_; }

 private:
  static std::string p(int port) { return std::to_string(port); }
  pid_t pid_ = -1;
  std::string dir_;
  RedisTarget target_;
};

// Runs `redis-benchmark ... --csv SET task_id:__rand_int__ processing NX EX 60`.
RoundResult RunRedisBenchmark(const RedisTarget& t, int connections, int pipeline, uint64_t requests) {
  std::string cmd = "redis-benchmark -h " + t.host + " -p " + std::to_string(t.port);
  if (!t.password.empty()) {
    // Quoted for the shell; the password is never printed.
    std::string q = "'";
    for (char ch : t.password) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    q += "'";
    cmd += (t.user.empty() ? "" : " --user " + t.user) + " -a " + q + " --no-auth-warning";
  }
  cmd += " -c " + std::to_string(connections) + " -P " + std::to_string(pipeline) + " -n " +
         std::to_string(requests) +
         " -r 1000000000 --csv SET task_id:__rand_int__ processing NX EX 60 2>/dev/null";
  RoundResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    r.errors = 1;
    return r;
  }
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
  // "SET task_id:__rand_int__ ...","rps","avg","min","p50","p95","p99","max"
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("\"SET", 0) != 0) continue;
    std::vector<std::string> cols;
    for (size_t i = 0; i < line.size();) {
      const size_t a = line.find('"', i);
      if (a == std::string::npos) break;
      const size_t b = line.find('"', a + 1);
      if (b == std::string::npos) break;
      cols.push_back(line.substr(a + 1, b - a - 1));
      i = b + 1;
    }
    if (cols.size() >= 7) {
      r.rate = std::atof(cols[1].c_str());
      r.p50_us = std::atof(cols[4].c_str()) * 1000;
      r.p99_us = std::atof(cols[6].c_str()) * 1000;
      r.messages = requests;
    }
  }
  if (st != 0 || !std::isfinite(r.rate) || r.rate <= 0) {
    r.errors = 1;
    r.rate = NAN;
  }
  return r;
}
#endif  // DEDUP_WITH_REDIS || DEDUP_WITH_REDIS_STREAMS

// ---- settings -----------------------------------------------------------------

struct BenchFlags {
  bool quick = false, full = false, json = false, no_progress = false;
  bool no_redis = false, no_rocksdb = false, no_worker = false;
  std::string redis_uri;
  std::string plots_dir;
  std::string markdown;
  std::vector<int> workers;
  int rounds = 0;
  Millis round{0};
  std::string command_line;
};

struct Plan {
  std::vector<int> workers;
  int rounds;
  double round_s;
  std::vector<uint64_t> memory_records;        // memory + rocksdb
  std::vector<uint64_t> redis_memory_records;
  std::vector<uint64_t> retained_levels;
  double retained_window_s;
  int retained_windows;
  uint64_t worker_messages;
  int worker_rounds;
  std::string mode;
};

Plan MakePlan(const BenchFlags& f) {
  Plan p;
  if (f.quick) {
    p = {{1, 2}, 2, 0.05, {10'000}, {10'000}, {10'000, 100'000}, 0.05, 2, 500, 1, "quick"};
  } else if (f.full) {
    p = {{1, 2, 8, 32}, 9, 0.3, {100'000, 1'000'000}, {100'000, 1'000'000},
         {10'000, 100'000, 1'000'000, 10'000'000}, 0.3, 5, 20'000, 5, "full"};
  } else {
    p = {{1, 2, 8, 32}, 5, 0.2, {100'000, 1'000'000}, {100'000},
         {10'000, 100'000, 1'000'000}, 0.2, 5, 5'000, 3, "default"};
  }
  if (!f.workers.empty()) p.workers = f.workers;
  if (f.rounds > 0) p.rounds = f.rounds;
  if (f.round.count() > 0) p.round_s = static_cast<double>(f.round.count()) / 1000.0;
  return p;
}

// Progress on stderr, only when it is a terminal.
struct Progress {
  bool on = false;
  Clk::time_point start = Clk::now();
  void Say(const std::string& what) {
    if (!on) return;
    std::fprintf(stderr, "\r\033[K  [%5.1f s] %s", Seconds(Clk::now() - start), what.c_str());
    std::fflush(stderr);
  }
  void Done() {
    if (on) std::fputs("\r\033[K", stderr);
  }
};

// ---- the stores under test ------------------------------------------------------

struct ClaimOps {
  static ClaimRequest Req(std::string_view key) {
    ClaimRequest r;
    r.key = key;
    r.lease = 60s;
    r.retention = 600s;
    return r;
  }
};

// Steps of the three dedup operations on `store`, and of ProcessOnce on `buffer`.
std::function<Step(int)> StoreStep(Store* store, Buffer* buffer, const std::string& op, int batch) {
  return [=](int) -> Step {
    if (op == "process_once") {
      return [=](uint64_t k) {
        const std::string key = TaskKey(k);
        Processed p = buffer->ProcessOnce(key, "", [](ClaimGuard&) { return HandlerResult::Done(); });
        return p.status.ok() && p.action == BrokerAction::kAck && p.ran;
      };
    }
    const bool complete = op == "claim+complete";
    if (batch == 1) {
      return [=](uint64_t k) {
        const std::string key = TaskKey(k);
        auto r = store->Claim(ClaimOps::Req(key));
        if (!r.ok() || !r->acquired()) return false;
        if (complete) {
          auto c = store->Complete(key, r->token, 600s, CompletionStatus::kOk, "");
          return c.ok() && *c == WriteResult::kOk;
        }
        return true;
      };
    }
    auto keys = std::make_shared<std::vector<std::string>>(static_cast<size_t>(batch));
    auto reqs = std::make_shared<std::vector<ClaimRequest>>(static_cast<size_t>(batch));
    return [=](uint64_t k) {
      for (int i = 0; i < batch; ++i) {
        (*keys)[static_cast<size_t>(i)] = TaskKey(k + static_cast<uint64_t>(i));
        (*reqs)[static_cast<size_t>(i)] = ClaimOps::Req((*keys)[static_cast<size_t>(i)]);
      }
      auto r = store->ClaimBatch(*reqs);
      if (!r.ok()) return false;
      bool ok = true;
      for (int i = 0; i < batch; ++i) {
        const ClaimResult& cr = (*r)[static_cast<size_t>(i)];
        if (!cr.acquired()) {
          ok = false;
          continue;
        }
        if (complete) {
          auto c = store->Complete((*keys)[static_cast<size_t>(i)], cr.token, 600s,
                                   CompletionStatus::kOk, "");
          ok = ok && c.ok() && *c == WriteResult::kOk;
        }
      }
      return ok;
    };
  };
}

// Counts the store calls the Buffer makes: on the Redis store each is one round
// trip (one EVALSHA, or one pipeline for ClaimBatch).
class CountingStore : public StoreWrapper {
 public:
  using StoreWrapper::StoreWrapper;
  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    calls.fetch_add(1, std::memory_order_relaxed);
    return target()->Claim(req);
  }
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    calls.fetch_add(1, std::memory_order_relaxed);
    return target()->ClaimBatch(reqs);
  }
  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    calls.fetch_add(1, std::memory_order_relaxed);
    return target()->Extend(key, token, lease);
  }
  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    calls.fetch_add(1, std::memory_order_relaxed);
    return target()->Complete(key, token, retention, status, result);
  }
  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    calls.fetch_add(1, std::memory_order_relaxed);
    return target()->Release(key, token, retention);
  }
  std::atomic<uint64_t> calls{0};
};

// The memory baseline: key -> state in one std::unordered_map under one mutex.
struct MapBaseline {
  std::mutex mu;
  std::unordered_map<std::string, int> map;
};

#ifdef DEDUP_WITH_ROCKSDB
// The RocksDB baseline: the claim a user writes by hand. Get; if absent, Put.
// Bloom filters on, WAL on and not synced (as the store's default), own directory.
// Not even atomic across threads (no lock): the most generous baseline.
struct RocksBaseline {
  std::string dir;
  std::unique_ptr<rocksdb::DB> db;
  rocksdb::WriteOptions wo;
  static std::unique_ptr<RocksBaseline> Open(std::string* error) {
    auto b = std::make_unique<RocksBaseline>();
    b->dir = MakeTempDir("rocksdb-baseline");
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::BlockBasedTableOptions t;
    t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
    t.whole_key_filtering = true;
    o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
    o.memtable_prefix_bloom_size_ratio = 0.05;
    o.memtable_whole_key_filtering = true;
    rocksdb::DB* db = nullptr;
    rocksdb::Status s = rocksdb::DB::Open(o, b->dir, &db);
    if (!s.ok()) {
      *error = "baseline rocksdb: " + s.ToString();
      return nullptr;
    }
    b->db.reset(db);
    b->wo.sync = false;
    b->wo.disableWAL = false;
    return b;
  }
  bool Claim(const std::string& key) {
    std::string v;
    rocksdb::Status s = db->Get(rocksdb::ReadOptions(), key, &v);
    if (s.ok()) return false;  // exists: someone else's
    if (!s.IsNotFound()) return false;
    // state, token, deadline: about what a hand-written record holds.
    return db->Put(wo, key, "processing:0123456789abcdef:1700000000000").ok();
  }
  ~RocksBaseline() {
    db.reset();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};

struct OwnRocks {
  std::string dir;
  std::unique_ptr<RocksDBStore> store;
  static std::unique_ptr<OwnRocks> Open(std::string* error) {
    auto r = std::make_unique<OwnRocks>();
    r->dir = MakeTempDir("rocksdb");
    RocksDBStoreOptions o;
    o.path = r->dir;
    o.sync = SyncMode::kNone;  // WAL on, not synced: the store's default
    auto s = RocksDBStore::Open(o);
    if (!s.ok()) {
      *error = s.status().ToString();
      return nullptr;
    }
    r->store = std::move(s).value();
    return r;
  }
  ~OwnRocks() {
    store.reset();
    std::error_code ec;
    if (!dir.empty()) std::filesystem::remove_all(dir, ec);
  }
};
#endif

// ---- the run -------------------------------------------------------------------

struct Goal {
  std::string what;
  std::string measured;  // "2.41x"
  double value = NAN;
  double target = NAN;
  bool lower_is_better = false;
  std::string status;  // met | not met | not measured
  std::string note;
};

class Bench {
 public:
  Bench(const BenchFlags& f, Plan p) : f_(f), p_(std::move(p)) {}

  int Run();

 private:
  bool SetUpRedis();
  void Throughput();
  void MemoryPerRecord();
  void Retained();
  void StreamsWorker();
  void EvaluateGoals();
  void PrintTable();
  std::string Markdown() const;
  void Plots();
  json ToJson() const;

  bool Stop() const { return g_interrupted.load(); }
  void Skip(const std::string& what) { skipped_.push_back(what); }

  const BenchFlags& f_;
  Plan p_;
  Progress progress_;
  bool redis_ = false;
  RedisTarget redis_target_;
  std::string redis_version_;
#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
  std::unique_ptr<OwnRedis> own_redis_;
#endif
  // Results.
  std::map<int, std::vector<std::unique_ptr<Contender>>> groups_;  // by workers
  std::map<int, std::map<std::string, std::map<std::string, std::vector<double>>>> ratios_;
  json memory_ = json::array();
  json retained_ = json::array();
  json worker_ = nullptr;
  std::vector<Goal> goals_;
  std::vector<std::string> skipped_;
  double elapsed_s_ = 0;
};

bool Bench::SetUpRedis() {
#if defined(DEDUP_WITH_REDIS)
  if (f_.no_redis) {
    Skip("redis store: --no-redis");
    return false;
  }
  std::string error;
  if (!f_.redis_uri.empty()) {
    auto t = ParseRedisUri(f_.redis_uri, &error);
    if (!t) {
      std::fprintf(stderr, "dedup bench: %s\n", error.c_str());
      return false;
    }
    redis_target_ = *t;
  } else {
    own_redis_ = std::make_unique<OwnRedis>();
    if (!own_redis_->Start(&error)) {
      Skip("redis store: " + error);
      own_redis_.reset();
      return false;
    }
    redis_target_ = own_redis_->target();
  }
  RedisConn c(redis_target_);
  if (!c.ok() || c.Command({"PING"}) != "PONG") {
    std::string why = c.Why();
    if (why.empty()) why = "PING was not answered PONG (a password is needed: redis://:PASS@host)";
    Skip("redis store: no answer to PING from " + redis_target_.host + ":" +
         std::to_string(redis_target_.port) + " (" + why + ")");
    if (!f_.redis_uri.empty()) {
      std::fprintf(stderr, "dedup bench: --redis %s: %s\n",
                   internal::RedactUri(f_.redis_uri).c_str(), why.c_str());
    }
    return false;
  }
  const std::string info = c.Command({"INFO", "server"});
  if (auto at = info.find("redis_version:"); at != std::string::npos) {
    redis_version_ = info.substr(at + 14, info.find('\r', at) - at - 14);
  }
  if (std::system("command -v redis-benchmark >/dev/null 2>&1") != 0) {
    Skip("redis-benchmark baseline: redis-benchmark not found in PATH");
  }
  return true;
#else
  Skip("redis store: not compiled in (DEDUP_WITH_REDIS=OFF)");
  return false;
#endif
}

void Bench::Throughput() {
  for (int threads : p_.workers) {
    if (Stop()) return;
    auto& cs = groups_[threads];
    // Everything a contender needs lives until the end of its worker count.
    std::vector<std::unique_ptr<Store>> stores;
    std::vector<std::unique_ptr<Buffer>> buffers;
    auto map = std::make_shared<MapBaseline>();
    BufferOptions bo;
    bo.lease = 60s;
    bo.retention = 600s;

    auto add = [&](std::string store, std::string label, std::string op, int batch,
                   std::vector<std::string> baselines) -> Contender& {
      auto c = std::make_unique<Contender>();
      c->id = store + "/" + op + "/b" + std::to_string(batch);
      c->store = std::move(store);
      c->label = std::move(label);
      c->op = std::move(op);
      c->batch = batch;
      c->baselines = std::move(baselines);
      cs.push_back(std::move(c));
      return *cs.back();
    };
    auto add_store_ops = [&](const std::string& name, const std::function<std::unique_ptr<Store>()>& open,
                             const std::vector<std::string>& b1, const std::vector<std::string>& b16) {
      for (const char* op : {"claim", "claim+complete", "process_once"}) {
        for (int batch : {1, 16}) {
          if (std::string(op) == "process_once" && batch != 1) continue;
          std::unique_ptr<Store> s = open();
          if (!s) return;
          Store* sp = s.get();
          stores.push_back(std::move(s));
          Buffer* bp = nullptr;
          if (std::string(op) == "process_once") {
            buffers.push_back(std::make_unique<Buffer>(sp, bo));
            bp = buffers.back().get();
          }
          std::string label = std::string("dedup ") + (std::string(op) == "process_once" ? "ProcessOnce" : op);
          if (batch > 1) label += " (ClaimBatch " + std::to_string(batch) + ")";
          Contender& c = add(name, label, op, batch, batch == 1 ? b1 : b16);
          c.make_step = StoreStep(sp, bp, op, batch);
        }
      }
    };

    // memory
    {
      Contender& b = add("memory", "unordered_map + mutex", "baseline", 1, {});
      b.make_step = [map](int) -> Step {
        return [map](uint64_t k) {
          std::string key = TaskKey(k);
          std::lock_guard lock(map->mu);
          return map->map.try_emplace(std::move(key), 1).second;
        };
      };
      add_store_ops("memory", [] { return NewMemoryStore(); }, {"memory/baseline/b1"},
                    {"memory/baseline/b1"});
    }
#ifdef DEDUP_WITH_ROCKSDB
    std::shared_ptr<RocksBaseline> rb;
    std::vector<std::unique_ptr<OwnRocks>> rocks;
    if (!f_.no_rocksdb) {
      std::string error;
      rb = RocksBaseline::Open(&error);
      if (!rb) {
        Skip("rocksdb baseline: " + error);
      } else {
        Contender& b = add("rocksdb", "RocksDB Get, then Put if absent", "baseline", 1, {});
        b.make_step = [rb](int) -> Step { return [rb](uint64_t k) { return rb->Claim(TaskKey(k)); }; };
      }
      std::vector<std::string> vs = {"rocksdb/baseline/b1"};
      if (redis_) vs.push_back("redis/baseline/b1");
      add_store_ops(
          "rocksdb",
          [&]() -> std::unique_ptr<Store> {
            std::string e;
            auto r = OwnRocks::Open(&e);
            if (!r) {
              Skip("rocksdb store: " + e);
              return nullptr;
            }
            // The Store is borrowed from OwnRocks, which owns the directory.
            struct Borrowed : StoreWrapper {
              using StoreWrapper::StoreWrapper;
            };
            auto s = std::make_unique<Borrowed>(r->store.get());
            rocks.push_back(std::move(r));
            return s;
          },
          vs, vs);
    }
#else
    if (threads == p_.workers.front()) Skip("rocksdb store: not compiled in (DEDUP_WITH_ROCKSDB=OFF)");
#endif
#ifdef DEDUP_WITH_REDIS
    if (redis_) {
      const RedisTarget t = redis_target_;
      for (int depth : {1, 16}) {
        Contender& b = add("redis", "redis-benchmark SET NX EX (-P " + std::to_string(depth) + ")",
                           "baseline", depth, {});
        b.external = [t, threads, depth](double seconds, double expected) {
          const double guess = std::isfinite(expected) ? expected : 20'000.0 * depth;
          const uint64_t n = static_cast<uint64_t>(
              std::clamp(guess * seconds, 1000.0 * depth, 50'000'000.0));
          return RunRedisBenchmark(t, threads, depth, n);
        };
      }
      const std::string sep = redis_target_.base_uri.find('?') == std::string::npos ? "?" : "&";
      const std::string uri = redis_target_.base_uri + sep + "prefix=&pool=" + std::to_string(threads);
      add_store_ops(
          "redis",
          [&]() -> std::unique_ptr<Store> {
            auto s = OpenStore(uri);
            if (!s.ok()) {
              Skip("redis store: " + s.status().ToString());
              return nullptr;
            }
            return std::move(s).value();
          },
          {"redis/baseline/b1"}, {"redis/baseline/b16"});
    }
#endif

    // Interleaved rounds: every contender once per round, in order.
    for (int round = 0; round < p_.rounds && !Stop(); ++round) {
      std::map<std::string, double> rate;
      for (size_t i = 0; i < cs.size() && !Stop(); ++i) {
        Contender& c = *cs[i];
        progress_.Say(std::to_string(threads) + " workers, round " + std::to_string(round + 1) + "/" +
                      std::to_string(p_.rounds) + ": " + c.store + " " + c.label);
        RoundResult r;
        if (c.external) {
          r = c.external(p_.round_s, Median(c.rates));
          c.ext_p50.push_back(r.p50_us);
          c.ext_p99.push_back(r.p99_us);
        } else {
          r = RunInProcess(c, threads, p_.round_s);
        }
        c.rates.push_back(r.rate);
        c.errors += r.errors;
        c.messages += r.messages;
        rate[c.id] = r.rate;
      }
      for (auto& c : cs) {
        for (const std::string& b : c->baselines) {
          if (rate.count(c->id) && rate.count(b)) ratios_[threads][c->id][b].push_back(rate[c->id] / rate[b]);
        }
      }
    }
    // Stores close here, before the next worker count.
    buffers.clear();
    stores.clear();
#ifdef DEDUP_WITH_ROCKSDB
    rocks.clear();
    rb.reset();
#endif
#ifdef DEDUP_WITH_REDIS
    if (redis_ && redis_target_.own) RedisConn(redis_target_).Command({"FLUSHALL"});
#endif
  }
}

void Bench::MemoryPerRecord() {
  auto fill_store = [](Store* s, uint64_t n, uint64_t first, bool complete) -> uint64_t {
    uint64_t errors = 0;
    std::vector<std::string> keys(1000);
    std::vector<ClaimRequest> reqs(1000);
    for (uint64_t at = 0; at < n && !g_interrupted.load(); at += 1000) {
      const size_t m = static_cast<size_t>(std::min<uint64_t>(1000, n - at));
      for (size_t i = 0; i < m; ++i) {
        keys[i] = TaskKey(first + at + i);
        reqs[i] = ClaimOps::Req(keys[i]);
      }
      auto r = s->ClaimBatch(std::span(reqs.data(), m));
      if (!r.ok()) {
        errors += m;
        continue;
      }
      if (!complete) continue;
      for (size_t i = 0; i < m; ++i) {
        auto c = s->Complete(keys[i], (*r)[i].token, 600s, CompletionStatus::kOk, "");
        if (!c.ok()) ++errors;
      }
    }
    return errors;
  };
  for (uint64_t n : p_.memory_records) {
    if (Stop()) return;
    progress_.Say("memory per record: memory store, " + Rate(static_cast<double>(n)) + " records");
    {
      malloc_trim(0);
      const long before = RssBytes();
      auto s = NewMemoryStore();
      const uint64_t e = fill_store(s.get(), n, NextKeyBlock(), true);
      const long after = RssBytes();
      malloc_trim(0);
      const long before_b = RssBytes();
      {
        std::unordered_map<std::string, int> m;
        const uint64_t base = NextKeyBlock();
        for (uint64_t i = 0; i < n; ++i) m.try_emplace(TaskKey(base + i), 1);
        const long after_b = RssBytes();
        memory_.push_back({{"store", "memory"}, {"records", n}, {"measure", "process RSS growth"},
                           {"bytes_per_record", static_cast<double>(after - before) / static_cast<double>(n)},
                           {"baseline", "unordered_map<string,int>"},
                           {"baseline_bytes_per_record",
                            static_cast<double>(after_b - before_b) / static_cast<double>(n)},
                           {"errors", e}});
      }
      s.reset();
      malloc_trim(0);
    }
#ifdef DEDUP_WITH_ROCKSDB
    if (!f_.no_rocksdb && !Stop()) {
      progress_.Say("memory per record: rocksdb store, " + Rate(static_cast<double>(n)) + " records");
      std::string error;
      auto r = OwnRocks::Open(&error);
      auto b = RocksBaseline::Open(&error);
      if (r && b) {
        const uint64_t e = fill_store(r->store.get(), n, NextKeyBlock(), true);
        (void)r->store->CompactNow();
        const uint64_t base = NextKeyBlock();
        for (uint64_t i = 0; i < n; ++i) b->Claim(TaskKey(base + i));
        (void)b->db->Flush(rocksdb::FlushOptions());
        (void)b->db->CompactRange(rocksdb::CompactRangeOptions(), nullptr, nullptr);
        memory_.push_back({{"store", "rocksdb"}, {"records", n},
                           {"measure", "SST bytes on disk after flush + full compaction"},
                           {"bytes_per_record", static_cast<double>(DirBytes(r->dir, ".sst")) / static_cast<double>(n)},
                           {"dir_bytes", DirBytes(r->dir)},
                           {"baseline", "RocksDB Get+Put, value 42 bytes"},
                           {"baseline_bytes_per_record",
                            static_cast<double>(DirBytes(b->dir, ".sst")) / static_cast<double>(n)},
                           {"errors", e}});
      } else {
        Skip("rocksdb memory per record: " + error);
      }
    }
#endif
  }
#ifdef DEDUP_WITH_REDIS
  if (!redis_) return;
  if (!redis_target_.own) {
    Skip("redis memory per record: only on a server this command starts (it writes up to 1M keys "
         "and FLUSHALLs)");
    return;
  }
  for (uint64_t n : p_.redis_memory_records) {
    if (Stop()) return;
    progress_.Say("memory per record: redis store, " + Rate(static_cast<double>(n)) + " records");
    RedisConn c(redis_target_);
    c.Command({"FLUSHALL"});
    const long long before = c.InfoField("memory", "used_memory");
    auto s = OpenStore(redis_target_.base_uri + "?prefix=&pool=4");
    if (!s.ok()) {
      Skip("redis memory per record: " + s.status().ToString());
      return;
    }
    // Four threads fill; each ClaimBatch is one pipeline.
    std::atomic<uint64_t> errors{0};
    const uint64_t base = NextKeyBlock();
    std::vector<std::thread> ts;
    for (int t = 0; t < 4; ++t) {
      ts.emplace_back([&, t] {
        const uint64_t per = n / 4 + (static_cast<uint64_t>(t) < n % 4 ? 1 : 0);
        uint64_t first = base + static_cast<uint64_t>(t) * 25'000'000ULL;
        errors += [&] {
          // fill_store with 64-deep pipelines.
          uint64_t e = 0;
          std::vector<std::string> keys(64);
          std::vector<ClaimRequest> reqs(64);
          for (uint64_t at = 0; at < per && !g_interrupted.load(); at += 64) {
            const size_t m = static_cast<size_t>(std::min<uint64_t>(64, per - at));
            for (size_t i = 0; i < m; ++i) {
              keys[i] = TaskKey(first + at + i);
              reqs[i] = ClaimOps::Req(keys[i]);
            }
            auto r = (*s)->ClaimBatch(std::span(reqs.data(), m));
            if (!r.ok()) {
              e += m;
              continue;
            }
            for (size_t i = 0; i < m; ++i) {
              auto w = (*s)->Complete(keys[i], (*r)[i].token, 600s, CompletionStatus::kOk, "");
              if (!w.ok()) ++e;
            }
          }
          return e;
        }();
      });
    }
    for (auto& t : ts) t.join();
    const long long after = c.InfoField("memory", "used_memory");
    c.Command({"FLUSHALL"});
    const long long before_b = c.InfoField("memory", "used_memory");
    const uint64_t bbase = NextKeyBlock();
    uint64_t berr = 0;
    for (uint64_t at = 0; at < n; at += 1000) {
      std::vector<std::vector<std::string>> cmds;
      for (uint64_t i = at; i < std::min<uint64_t>(n, at + 1000); ++i) {
        cmds.push_back({"SET", TaskKey(bbase + i), "processing", "NX", "EX", "600"});
      }
      berr += c.Pipeline(cmds);
    }
    const long long after_b = c.InfoField("memory", "used_memory");
    c.Command({"FLUSHALL"});
    memory_.push_back({{"store", "redis"}, {"records", n}, {"measure", "INFO memory used_memory growth"},
                       {"bytes_per_record", static_cast<double>(after - before) / static_cast<double>(n)},
                       {"baseline", "SET task_id:<id> processing NX EX 600"},
                       {"baseline_bytes_per_record", static_cast<double>(after_b - before_b) / static_cast<double>(n)},
                       {"errors", errors.load() + berr}});
  }
#endif
}

void Bench::Retained() {
  struct Target {
    std::string name;
    Store* store;
  };
  std::vector<Target> targets;
  auto mem = NewMemoryStore();
  targets.push_back({"memory", mem.get()});
#ifdef DEDUP_WITH_ROCKSDB
  std::unique_ptr<OwnRocks> rocks;
  if (!f_.no_rocksdb) {
    std::string error;
    rocks = OwnRocks::Open(&error);
    if (rocks) targets.push_back({"rocksdb", rocks->store.get()});
  }
#endif
  for (auto& t : targets) {
    uint64_t filled = 0;
    const uint64_t fill_base = NextKeyBlock();
    for (uint64_t level : p_.retained_levels) {
      if (Stop()) return;
      // Fill with ClaimBatch of 1000 (records stay retained: 600 s past a 60 s lease).
      const auto t0 = Clk::now();
      std::vector<std::string> keys(1000);
      std::vector<ClaimRequest> reqs(1000);
      uint64_t fill_errors = 0;
      while (filled < level && !Stop()) {
        const size_t m = static_cast<size_t>(std::min<uint64_t>(1000, level - filled));
        for (size_t i = 0; i < m; ++i) {
          // Blocks of 10^8 per NextKeyBlock: 10^7 records stay inside one.
          keys[i] = TaskKey(fill_base + filled + i);
          reqs[i] = ClaimOps::Req(keys[i]);
        }
        auto r = t.store->ClaimBatch(std::span(reqs.data(), m));
        if (!r.ok()) ++fill_errors;
        filled += m;
        if (filled % 100'000 == 0) {
          progress_.Say("retained records: " + t.name + " filling " + Rate(static_cast<double>(filled)) + "/" +
                        Rate(static_cast<double>(level)));
        }
      }
      const double fill_s = Seconds(Clk::now() - t0);
      progress_.Say("retained records: " + t.name + " at " + Rate(static_cast<double>(level)));
      Contender c;
      c.batch = 1;
      c.make_step = StoreStep(t.store, nullptr, "claim", 1);
      std::vector<double> rates;
      RunInProcess(c, 1, p_.retained_window_s);  // warm-up, not counted
      c.hist = Hist();
      for (int w = 0; w < p_.retained_windows && !Stop(); ++w) {
        rates.push_back(RunInProcess(c, 1, p_.retained_window_s).rate);
      }
      json row = {{"store", t.name}, {"retained", level}, {"claims_per_s", Num(Median(rates))},
                  {"windows", rates}, {"fill_s", fill_s}, {"fill_errors", fill_errors},
                  {"p50_us", Num(c.hist.QuantileUs(0.5))}, {"p99_us", Num(c.hist.QuantileUs(0.99))}};
      if (t.name == "memory") row["rss_bytes"] = RssBytes();
#ifdef DEDUP_WITH_ROCKSDB
      if (t.name == "rocksdb") row["dir_bytes"] = DirBytes(rocks->dir);
#endif
      retained_.push_back(row);
    }
  }
}

void Bench::StreamsWorker() {
#if defined(DEDUP_WITH_REDIS_STREAMS) && defined(DEDUP_WITH_REDIS)
  if (f_.no_worker) {
    Skip("streams worker: --no-worker");
    return;
  }
  if (!redis_) {
    Skip("streams worker: needs Redis");
    return;
  }
  const int concurrency = 8;
  auto store = OpenStore(redis_target_.base_uri + "?prefix=bench:dedup:&pool=" + std::to_string(concurrency));
  if (!store.ok()) {
    Skip("streams worker: " + store.status().ToString());
    return;
  }
  BufferOptions bo;
  bo.lease = 60s;
  bo.retention = 600s;
  CountingStore counting(store->get());
  Buffer buffer(&counting, bo);
  std::vector<double> plain_rates, dedup_rates, ratios, plain_cmds, dedup_cmds, store_calls;
  uint64_t errors = 0;
  static std::atomic<uint64_t> stream_no{0};
  auto round = [&](bool with_dedup) -> std::tuple<double, double, double> {
    RedisConn c(redis_target_);
    const std::string stream = "bench:stream:" + std::to_string(getpid()) + ":" + std::to_string(stream_no++);
    const uint64_t base = NextKeyBlock();
    for (uint64_t at = 0; at < p_.worker_messages; at += 1000) {
      std::vector<std::vector<std::string>> cmds;
      for (uint64_t i = at; i < std::min<uint64_t>(p_.worker_messages, at + 1000); ++i) {
        cmds.push_back({"XADD", stream, "*", "id", TaskKey(base + i), "body", "x"});
      }
      errors += c.Pipeline(cmds);
    }
    WorkerOptions o;
    o.host = redis_target_.host;
    o.port = redis_target_.port;
    o.password = redis_target_.password;
    o.has_password = !redis_target_.password.empty();
    o.stream = stream;
    o.group = "bench";
    o.consumer = "bench";
    o.concurrency = concurrency;
    o.block = 50ms;
    o.reclaim_interval = 60s;
    auto w = Worker::Open(o);
    if (!w.ok()) {
      ++errors;
      return {NAN, NAN, NAN};
    }
    const uint64_t calls0 = counting.calls.load();
    const long long cmds0 = c.InfoField("stats", "total_commands_processed");
    Worker* wp = w->get();
    const auto t0 = Clk::now();
    std::thread runner([&] {
      if (with_dedup) {
        (void)wp->Run(&buffer, [](const StreamMessage&, ClaimGuard&) { return HandlerResult::Done(); });
      } else {
        (void)wp->RunWith([](const StreamMessage&) {
          Processed p;
          p.ran = true;
          p.action = BrokerAction::kAck;
          p.claim.outcome = ClaimOutcome::kAcquired;
          return p;
        });
      }
    });
    const auto deadline = t0 + 120s;
    while (wp->metrics().acked < p_.worker_messages && Clk::now() < deadline && !Stop()) {
      std::this_thread::sleep_for(1ms);
    }
    const double secs = Seconds(Clk::now() - t0);
    const uint64_t acked = wp->metrics().acked;
    wp->Stop();
    runner.join();
    const long long cmds1 = c.InfoField("stats", "total_commands_processed");
    c.Command({"DEL", stream, stream + ":dead"});
    if (acked < p_.worker_messages) ++errors;
    const double n = static_cast<double>(std::max<uint64_t>(acked, 1));
    // Minus the INFO call itself. Redis counts the commands a script calls too.
    return {static_cast<double>(acked) / secs, static_cast<double>(cmds1 - cmds0 - 1) / n,
            static_cast<double>(counting.calls.load() - calls0) / n};
  };
  for (int r = 0; r < p_.worker_rounds && !Stop(); ++r) {
    progress_.Say("streams worker, round " + std::to_string(r + 1) + "/" + std::to_string(p_.worker_rounds) +
                  ": without dedup");
    auto [pr, pc, pn] = round(false);
    (void)pn;
    progress_.Say("streams worker, round " + std::to_string(r + 1) + "/" + std::to_string(p_.worker_rounds) +
                  ": with dedup (redis store)");
    auto [dr, dc, dn] = round(true);
    store_calls.push_back(dn);
    plain_rates.push_back(pr);
    dedup_rates.push_back(dr);
    plain_cmds.push_back(pc);
    dedup_cmds.push_back(dc);
    ratios.push_back(dr / pr);
  }
  const double ratio = Median(ratios);
  worker_ = {{"concurrency", concurrency}, {"messages_per_round", p_.worker_messages},
             {"store", "redis (same server as the stream)"},
             {"without_dedup_msgs_per_s", Num(Median(plain_rates))},
             {"with_dedup_msgs_per_s", Num(Median(dedup_rates))},
             {"ratio", Num(ratio)}, {"dedup_cost", Num(1 - ratio)},
             {"commands_per_msg_without", Num(Median(plain_cmds))},
             {"commands_per_msg_with", Num(Median(dedup_cmds))},
             {"store_round_trips_per_msg", Num(Median(store_calls))},
             {"rounds_without", plain_rates}, {"rounds_with", dedup_rates}, {"errors", errors}};
#else
  Skip("streams worker: not compiled in (DEDUP_WITH_REDIS_STREAMS / DEDUP_WITH_REDIS off)");
#endif
}

// Median of the per-round ratios of `id` to `baseline` at `threads` workers.
struct RatioLookup {
  const std::map<int, std::map<std::string, std::map<std::string, std::vector<double>>>>& r;
  double operator()(int threads, const std::string& id, const std::string& baseline) const {
    auto a = r.find(threads);
    if (a == r.end()) return NAN;
    auto b = a->second.find(id);
    if (b == a->second.end()) return NAN;
    auto c = b->second.find(baseline);
    return c == b->second.end() ? NAN : Median(c->second);
  }
};

void Bench::EvaluateGoals() {
  RatioLookup ratio{ratios_};
  auto add = [&](std::string what, double v, double target, bool lower = false, std::string note = "",
                 std::string unit = "x") {
    Goal g;
    g.what = std::move(what);
    g.value = v;
    g.target = target;
    g.lower_is_better = lower;
    g.note = std::move(note);
    if (!std::isfinite(v)) {
      g.status = "not measured";
      g.measured = "-";
    } else {
      g.status = (lower ? v <= target : v >= target) ? "met" : "not met";
      g.measured = unit == "%" ? Fmt("%.0f %%", v * 100) : Fmt(unit == "x" ? "%.2fx" : "%.2f", v);
    }
    goals_.push_back(std::move(g));
  };
  auto has = [&](int t) { return std::find(p_.workers.begin(), p_.workers.end(), t) != p_.workers.end(); };
  for (int t : {1, 2}) {
    add("memory store claim >= " + std::string(t == 1 ? "2" : "3") + "x unordered_map+mutex, " +
            std::to_string(t) + " thread" + (t > 1 ? "s" : ""),
        has(t) ? ratio(t, "memory/claim/b1", "memory/baseline/b1") : NAN, t == 1 ? 2.0 : 3.0);
  }
  for (int t : p_.workers) {
    add("rocksdb store claim (WAL on) >= 3x Get+Put, " + std::to_string(t) + " threads",
        ratio(t, "rocksdb/claim/b1", "rocksdb/baseline/b1"), 3.0);
  }
  for (int t : p_.workers) {
    add("rocksdb store claim >= 10x SET NX EX (-P 1), " + std::to_string(t) + " threads/connections",
        ratio(t, "rocksdb/claim/b1", "redis/baseline/b1"), 10.0);
  }
  for (int t : p_.workers) {
    for (int d : {1, 16}) {
      add("redis store claim >= 0.9x redis-benchmark, " + std::to_string(t) + " connections, depth " +
              std::to_string(d),
          ratio(t, "redis/claim/b" + std::to_string(d), "redis/baseline/b" + std::to_string(d)), 0.9);
    }
  }
  if (worker_.is_object()) {
    add("streams worker: dedup costs <= 20 % of its throughput", worker_["dedup_cost"].is_number()
                                                                     ? worker_["dedup_cost"].get<double>()
                                                                     : NAN,
        0.2, true, "", "%");
    add("streams worker: <= 2 round trips per message for dedup",
        worker_["store_round_trips_per_msg"].is_number() ? worker_["store_round_trips_per_msg"].get<double>()
                                                          : NAN,
        2.0, true, "store calls per message; each is one round trip on the Redis store", "n");
  } else {
    add("streams worker: dedup costs <= 20 % of its throughput", NAN, 0.2, true);
    add("streams worker: <= 2 round trips per message for dedup", NAN, 2.0, true);
  }
  for (const char* store : {"memory", "rocksdb"}) {
    double lo = NAN, hi = NAN;
    uint64_t hi_level = 0;
    for (auto& row : retained_) {
      if (row["store"] != store) continue;
      const uint64_t level = row["retained"];
      const double v = row["claims_per_s"].is_number() ? row["claims_per_s"].get<double>() : NAN;
      if (level == 10'000) lo = v;
      if (level == 10'000'000) hi = v;
      hi_level = std::max(hi_level, level);
    }
    add(std::string(store) + " store: claims with 10^7 retained >= 0.5x with 10^4", hi / lo, 0.5, false,
        std::isfinite(hi) ? "" : "10^7 runs with --full only");
  }
}

// ---- output ---------------------------------------------------------------------

std::string Bench::Markdown() const {
  RatioLookup ratio{ratios_};
  std::ostringstream o;
  o << "<!-- generated by `dedup bench`; do not edit by hand -->\n\n";
  o << "Command: `" << f_.command_line << "` (" << p_.mode << " plan: " << p_.rounds << " rounds of "
    << Fmt("%.0f", p_.round_s * 1000) << " ms per contender, contenders interleaved). Run took "
    << Fmt("%.0f", elapsed_s_) << " s.\n\n";
  struct utsname u {};
  uname(&u);
  o << "Machine: " << std::thread::hardware_concurrency() << " cores, " << u.sysname << " " << u.release
    << " " << u.machine;
  if (!redis_version_.empty()) o << ", Redis " << redis_version_ << " (server on the same machine)";
#ifdef DEDUP_WITH_ROCKSDB
  o << ", RocksDB " << ROCKSDB_MAJOR << "." << ROCKSDB_MINOR << "." << ROCKSDB_PATCH;
#endif
  o << ".\n\n";
  o << "### Throughput (messages/s, median of rounds) and latency per call (µs)\n\n";
  o << "| workers | store | contender | msgs/s | p50 | p99 | p99.9 | ratio to baseline |\n";
  o << "|---:|---|---|---:|---:|---:|---:|---|\n";
  for (auto& [threads, cs] : groups_) {
    for (auto& c : cs) {
      std::string rs;
      for (auto& b : c->baselines) {
        const double v = ratio(threads, c->id, b);
        if (!rs.empty()) rs += ", ";
        rs += Fmt("%.2fx", v) + " " + (b.rfind("redis/baseline", 0) == 0 ? "SET NX EX" : "baseline");
      }
      const bool ext = static_cast<bool>(c->external);
      o << "| " << threads << " | " << c->store << " | " << c->label << (c->errors ? " (errors!)" : "") << " | "
        << Rate(Median(c->rates)) << " | "
        << Fmt("%.1f", ext ? Median(c->ext_p50) : c->hist.QuantileUs(0.5)) << " | "
        << Fmt("%.1f", ext ? Median(c->ext_p99) : c->hist.QuantileUs(0.99)) << " | "
        << Fmt("%.1f", ext ? NAN : c->hist.QuantileUs(0.999)) << " | " << (rs.empty() ? "—" : rs) << " |\n";
    }
  }
  if (!memory_.empty()) {
    o << "\n### Memory per retained record\n\n| store | records | bytes/record | baseline | baseline bytes/record | measure |\n|---|---:|---:|---|---:|---|\n";
    for (auto& m : memory_) {
      o << "| " << m["store"].get<std::string>() << " | " << Rate(m["records"].get<double>()) << " | "
        << Fmt("%.1f", m["bytes_per_record"].get<double>()) << " | " << m["baseline"].get<std::string>() << " | "
        << Fmt("%.1f", m["baseline_bytes_per_record"].get<double>()) << " | " << m["measure"].get<std::string>()
        << " |\n";
    }
  }
  if (!retained_.empty()) {
    o << "\n### Claims of new keys (1 thread) as retained records grow\n\n| store | retained | claims/s | vs 10^4 | p50 µs | p99 µs |\n|---|---:|---:|---:|---:|---:|\n";
    std::map<std::string, double> first;
    for (auto& r : retained_) {
      const std::string s = r["store"];
      const double v = r["claims_per_s"].is_number() ? r["claims_per_s"].get<double>() : NAN;
      if (!first.count(s)) first[s] = v;
      o << "| " << s << " | " << Rate(r["retained"].get<double>()) << " | " << Rate(v) << " | "
        << Fmt("%.2fx", v / first[s]) << " | "
        << Fmt("%.2f", r["p50_us"].is_number() ? r["p50_us"].get<double>() : NAN) << " | "
        << Fmt("%.2f", r["p99_us"].is_number() ? r["p99_us"].get<double>() : NAN) << " |\n";
    }
  }
  if (worker_.is_object()) {
    auto g = [&](const char* k) { return worker_[k].is_number() ? worker_[k].get<double>() : NAN; };
    o << "\n### Redis Streams worker, no-op handler, concurrency " << worker_["concurrency"].get<int>() << ", "
      << worker_["messages_per_round"].get<uint64_t>() << " messages per round\n\n"
      << "| | msgs/s | Redis commands per message (incl. those run inside scripts) |\n|---|---:|---:|\n"
      << "| without dedup (RunWith: ack only) | " << Rate(g("without_dedup_msgs_per_s")) << " | "
      << Fmt("%.2f", g("commands_per_msg_without")) << " |\n"
      << "| with dedup (Run + Buffer on the Redis store) | " << Rate(g("with_dedup_msgs_per_s")) << " | "
      << Fmt("%.2f", g("commands_per_msg_with")) << " |\n\n"
      << "Ratio with/without (median of rounds): " << Fmt("%.2f", g("ratio")) << "; dedup costs "
      << Fmt("%.0f %%", g("dedup_cost") * 100) << " of throughput and "
      << Fmt("%.2f", g("store_round_trips_per_msg")) << " store round trips per message.\n";
  }
  o << "\n### Goals\n\n| goal | measured | status |\n|---|---:|---|\n";
  for (auto& g : goals_) {
    o << "| " << g.what << (g.note.empty() ? "" : " (" + g.note + ")") << " | " << g.measured << " | "
      << (g.status == "met" ? "**met**" : g.status == "not met" ? "**not met**" : g.status) << " |\n";
  }
  if (!skipped_.empty()) {
    o << "\nSkipped or left out in this run:\n\n";
    for (auto& s : skipped_) o << "- " << s << "\n";
  }
  return o.str();
}

void Bench::PrintTable() {
  // The terminal table is the Markdown one: readable as is, pasteable.
  std::fputs(Markdown().c_str(), stdout);
}

json Bench::ToJson() const {
  RatioLookup ratio{ratios_};
  json j;
  j["command"] = f_.command_line;
  j["mode"] = p_.mode;
  j["rounds"] = p_.rounds;
  j["round_ms"] = p_.round_s * 1000;
  j["elapsed_s"] = elapsed_s_;
  j["cores"] = std::thread::hardware_concurrency();
  j["redis_version"] = redis_version_;
  j["throughput"] = json::array();
  for (auto& [threads, cs] : groups_) {
    for (auto& c : cs) {
      const bool ext = static_cast<bool>(c->external);
      json row = {{"workers", threads}, {"id", c->id}, {"store", c->store}, {"contender", c->label},
                  {"op", c->op}, {"batch", c->batch}, {"msgs_per_s", Num(Median(c->rates))},
                  {"rounds", json::array()}, {"messages", c->messages}, {"errors", c->errors},
                  {"p50_us", Num(ext ? Median(c->ext_p50) : c->hist.QuantileUs(0.5))},
                  {"p99_us", Num(ext ? Median(c->ext_p99) : c->hist.QuantileUs(0.99))},
                  {"p999_us", Num(ext ? NAN : c->hist.QuantileUs(0.999))}, {"ratios", json::object()}};
      for (double r : c->rates) row["rounds"].push_back(Num(r));
      for (auto& b : c->baselines) row["ratios"][b] = Num(ratio(threads, c->id, b));
      j["throughput"].push_back(row);
    }
  }
  j["memory_per_record"] = memory_;
  j["retained"] = retained_;
  j["streams_worker"] = worker_;
  j["goals"] = json::array();
  for (auto& g : goals_) {
    j["goals"].push_back({{"goal", g.what}, {"value", Num(g.value)}, {"target", g.target},
                          {"status", g.status}, {"note", g.note}});
  }
  j["skipped"] = skipped_;
  return j;
}

void Bench::Plots() {
  if (f_.plots_dir.empty()) return;
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    Skip("plots: gnuplot not found in PATH");
    return;
  }
  std::error_code ec;
  std::filesystem::create_directories(f_.plots_dir, ec);
  const std::string tmp = MakeTempDir("plots");
  std::vector<std::string> stores;
  for (auto& [t, cs] : groups_) {
    for (auto& c : cs) {
      if (std::find(stores.begin(), stores.end(), c->store) == stores.end()) stores.push_back(c->store);
    }
  }
  auto quote = [](const std::string& s) {
    std::string q = "'";
    for (char ch : s) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    return q + "'";
  };
  auto run = [&](const std::string& script_path) {
    return std::system(("gnuplot " + quote(script_path) + " 2>/dev/null").c_str()) == 0;
  };
  for (const std::string& store : stores) {
    // One data file per contender: workers, msgs/s.
    std::map<std::string, std::string> files;  // label -> file
    std::vector<std::string> order;
    for (auto& [t, cs] : groups_) {
      for (auto& c : cs) {
        if (c->store != store) continue;
        if (!files.count(c->label)) {
          // Named per store: every store gets its own files, never another's.
          files[c->label] = tmp + "/w_" + store + "_" + std::to_string(files.size()) + ".dat";
          order.push_back(c->label);
        }
        std::ofstream(files[c->label], std::ios::app) << t << " " << Median(c->rates) << "\n";
      }
    }
    const std::string png = f_.plots_dir + "/bench_workers_" + store + ".png";
    std::ofstream gp(tmp + "/w.gp");
    gp << "set terminal pngcairo size 900,640 font 'sans,10'\nset output " << quote(png) << "\n"
       << "set title " << quote(store + " store: throughput against concurrent workers (" + p_.mode + " run)") << "\n"
       << "set xlabel 'concurrent workers (threads / connections)'\nset ylabel 'messages per second'\n"
       << "set termoption noenhanced\nset logscale x 2\nset logscale y\nset grid\nset key below\n"
       << "set format y '%.0s%c'\n"
       << "plot ";
    for (size_t i = 0; i < order.size(); ++i) {
      const bool base = order[i].find("dedup") == std::string::npos;
      gp << (i ? ", " : "") << quote(files[order[i]]) << " using 1:2 with linespoints lw 2 "
         << (base ? "dt 2 " : "") << "title " << quote(order[i]);
    }
    gp << "\n";
    gp.close();
    if (!run(tmp + "/w.gp")) Skip("plots: gnuplot failed on " + png);
  }
  if (!retained_.empty()) {
    std::map<std::string, std::string> files;
    for (auto& r : retained_) {
      const std::string s = r["store"];
      if (!files.count(s)) files[s] = tmp + "/r_" + s + ".dat";
      if (r["claims_per_s"].is_number()) {
        std::ofstream(files[s], std::ios::app) << r["retained"].get<uint64_t>() << " "
                                               << r["claims_per_s"].get<double>() << "\n";
      }
    }
    const std::string png = f_.plots_dir + "/bench_retained.png";
    std::ofstream gp(tmp + "/r.gp");
    gp << "set terminal pngcairo size 900,640 font 'sans,10'\nset output " << quote(png) << "\n"
       << "set title " << quote("claims of new keys (1 thread) against retained records (" + p_.mode + " run)") << "\n"
       << "set xlabel 'retained records'\nset ylabel 'claims per second'\nset logscale x\nset logscale y\n"
       << "set grid\nset format y '%.0s%c'\nset format x '10^{%L}'\nset key below\nplot ";
    size_t i = 0;
    for (auto& [s, file] : files) {
      gp << (i++ ? ", " : "") << quote(file) << " using 1:2 with linespoints lw 2 title " << quote(s + " store");
    }
    gp << "\n";
    gp.close();
    if (!run(tmp + "/r.gp")) Skip("plots: gnuplot failed on " + png);
  }
  std::filesystem::remove_all(tmp, ec);
}

int Bench::Run() {
  struct sigaction sa = {};
  sa.sa_handler = OnBenchInterrupt;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  progress_.on = isatty(STDERR_FILENO) == 1 && !f_.no_progress;
  const auto start = Clk::now();
  if (!f_.redis_uri.empty() && f_.no_redis) {
    std::fprintf(stderr, "dedup bench: --redis and --no-redis together\n");
    return kExitUsage;
  }
  redis_ = SetUpRedis();
  if (!redis_ && !f_.redis_uri.empty()) return kExitUsage;
  // Memory first: RSS growth is cleanest before the heap has been used.
  MemoryPerRecord();
  Throughput();
  Retained();
  StreamsWorker();
  progress_.Done();
  elapsed_s_ = Seconds(Clk::now() - start);
  EvaluateGoals();
  Plots();
#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
  own_redis_.reset();
#endif
  if (!f_.markdown.empty()) {
    std::ofstream md(f_.markdown);
    md << Markdown();
    if (!md) {
      std::fprintf(stderr, "dedup bench: cannot write %s\n", f_.markdown.c_str());
      return kExitUsage;
    }
  }
  if (f_.json) {
    std::fputs((ToJson().dump(2) + "\n").c_str(), stdout);
  } else {
    PrintTable();
  }
  if (g_interrupted.load()) {
    std::fprintf(stderr, "dedup bench: interrupted; figures above are partial\n");
    return kExitCheckFailed;
  }
  // Errors in the measured operations make the figures suspect: say so in the code.
  for (auto& [t, cs] : groups_) {
    for (auto& c : cs) {
      if (c->errors && c->op != "baseline") {
        std::fprintf(stderr, "dedup bench: %s (%d workers) had %llu failed calls\n", c->id.c_str(), t,
                     static_cast<unsigned long long>(c->errors));
        return kExitCheckFailed;
      }
    }
  }
  return kExitOk;
}

}  // namespace

void RegisterBench(CLI::App& root, CommandContext& ctx) {
  auto flags = std::make_shared<BenchFlags>();
  CLI::App* app = root.add_subcommand(
      "bench",
      "Measure what the guard costs per message on each store (memory, RocksDB, Redis), "
      "next to what a user would write instead, interleaved in one run; print a table, "
      "JSON, Markdown and plots. Default: a few minutes; --quick: seconds; --full: the whole "
      "matrix and 10^7 retained records.");
  auto* quick = app->add_flag("--quick", flags->quick, "Seconds: a smoke test (CI)");
  app->add_flag("--full", flags->full, "The whole matrix, 1M Redis records and 10^7 retained records")
      ->excludes(quick);
  app->add_option("--redis", flags->redis_uri,
                  "Benchmark this Redis (redis://[user:password@]host:port) instead of starting one "
                  "on 127.0.0.1:6420-6429. Keys written expire within 10 minutes; nothing is flushed.")
      ->type_name("URI");
  app->add_flag("--no-redis", flags->no_redis, "Leave the Redis store, redis-benchmark and the worker out");
  app->add_flag("--no-rocksdb", flags->no_rocksdb, "Leave the RocksDB store out");
  app->add_flag("--no-worker", flags->no_worker, "Leave the Redis Streams worker comparison out");
  app->add_option("--workers", flags->workers, "Concurrent workers to measure at (default 1 2 8 32)")
      ->check(CLI::Range(1, 256))
      ->delimiter(',');
  app->add_option("--rounds", flags->rounds, "Interleaved rounds per contender")->check(CLI::Range(1, 100));
  AddDurationOption(*app, "--round", &flags->round, "Length of one contender's round (default per plan)");
  app->add_flag("--json", flags->json, "Print everything as JSON instead of the table");
  app->add_option("--plots", flags->plots_dir, "Write PNG plots (gnuplot) into this directory")
      ->type_name("DIR");
  app->add_option("--markdown", flags->markdown, "Also write the figures as Markdown to this file")
      ->type_name("FILE");
  app->add_flag("--no-progress", flags->no_progress, "No progress line, even on a terminal");
  app->callback([flags, app, &ctx] {
    flags->command_line = "dedup bench";
    for (const auto* o : app->get_options()) {
      if (o->count() == 0 || o->get_name() == "--help") continue;
      flags->command_line += " " + o->get_name();
      if (o->get_items_expected_max() == 0) continue;  // a flag
      // Never print a password that may be in the Redis URI.
      if (o->get_name() == "--redis") {
        flags->command_line += " URI";
        continue;
      }
      for (const auto& r : o->results()) flags->command_line += " " + r;
    }
    Bench b(*flags, MakePlan(*flags));
    ctx.exit_code = b.Run();
  });
}

}  // namespace dedup::cli
