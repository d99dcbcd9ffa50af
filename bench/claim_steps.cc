// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Runs one memory or RocksDB contender of `dedup bench --phase throughput` (its
// very Step: key built in the loop, the same call) N times on one thread, with
// no clock or histogram around it, for instruction counts:
//
//   valgrind --tool=callgrind claim_steps memory/claim/b1 200000
//   valgrind --tool=callgrind claim_steps rocksdb/claim/b1 200000
//
// The difference between two runs of N and 2N steps, divided by N, is the
// instructions of one step without the start-up. See docs/PERFORMANCE.md.
//
// With a third argument `timed`, it also reads the clocks around every step and
// prints, to stderr: the steps' wall time and the calling thread's CPU time, the
// process's CPU time (every thread: a store's writer too), the close's, the
// steps that took over 1 ms (a caller that waited for something, did a writer's
// work, or was preempted), with the time spent in them, the caller's context
// switches (voluntary: it blocked), and the caller's wall time split into
// blocked and preempted (schedstat); then every thread that ran during the
// steps, by name (a RocksDB store's writer is dedup-claimlog, its materializer
// dedup-materlz), with its CPU time and context switches. Natively, not under
// callgrind.

#include <dirent.h>
#include <sys/resource.h>
#include <time.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bench/bench.h"

namespace {

double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// The calling thread's context switches: voluntary (it blocked: a lock, a
// condition variable, I/O) and involuntary (preempted: load, not the store).
void Switches(long* voluntary, long* involuntary) {
  rusage u{};
  getrusage(RUSAGE_THREAD, &u);
  *voluntary = u.ru_nvcsw;
  *involuntary = u.ru_nivcsw;
}

// The calling thread's time on a CPU and waiting for one (runnable, not run:
// preempted), from /proc/thread-self/schedstat, in seconds; the rest of the
// wall time it was blocked (a lock, a condition variable, I/O).
void SchedSeconds(double* run, double* runnable) {
  unsigned long long r = 0, w = 0;
  if (FILE* f = std::fopen("/proc/thread-self/schedstat", "r")) {
    if (std::fscanf(f, "%llu %llu", &r, &w) != 2) r = w = 0;
    std::fclose(f);
  }
  *run = static_cast<double>(r) * 1e-9;
  *runnable = static_cast<double>(w) * 1e-9;
}

// One thread of the process as /proc shows it: its name, its time on a CPU
// (schedstat, ns) and its context switches, voluntary (it blocked) and not.
struct TaskStat {
  std::string name;
  double run = 0;
  long voluntary = 0, involuntary = 0;
};

// Every thread of this process, by id.
std::map<long, TaskStat> Tasks() {
  std::map<long, TaskStat> out;
  DIR* d = opendir("/proc/self/task");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const long tid = std::strtol(e->d_name, nullptr, 10);
    const std::string dir = std::string("/proc/self/task/") + e->d_name;
    TaskStat t;
    if (FILE* f = std::fopen((dir + "/schedstat").c_str(), "r")) {
      unsigned long long r = 0;
      if (std::fscanf(f, "%llu", &r) == 1) t.run = static_cast<double>(r) * 1e-9;
      std::fclose(f);
    }
    if (FILE* f = std::fopen((dir + "/status").c_str(), "r")) {
      char line[256];
      while (std::fgets(line, sizeof line, f) != nullptr) {
        if (std::strncmp(line, "Name:", 5) == 0) {
          char name[64] = {};
          if (std::sscanf(line + 5, "%63s", name) == 1) t.name = name;
        }
        std::sscanf(line, "voluntary_ctxt_switches: %ld", &t.voluntary);
        std::sscanf(line, "nonvoluntary_ctxt_switches: %ld", &t.involuntary);
      }
      std::fclose(f);
    }
    out[tid] = t;
  }
  closedir(d);
  return out;
}

double WallSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dedup::bench;
  if (argc != 3 && !(argc == 4 && std::strcmp(argv[3], "timed") == 0)) {
    std::fprintf(stderr, "usage: %s CONTENDER_ID STEPS [timed]  (e.g. memory/claim/b1 200000)\n",
                 argv[0]);
    return 2;
  }
  const std::string id = argv[1];
  const bool timed = argc == 4;
  char* end = nullptr;
  const unsigned long long steps = std::strtoull(argv[2], &end, 10);
  if (end == argv[2] || *end != '\0') {
    std::fprintf(stderr, "STEPS must be a number, got '%s'\n", argv[2]);
    return 2;
  }
  BenchOptions options;
  Plan plan{};
  plan.workers = {1};
  Results results;
  BenchContext ctx{options, plan, results, nullptr};
  std::vector<std::unique_ptr<Contender>> cs;
  ContenderGroup group(1, &cs);
  if (id.starts_with("rocksdb/")) {
    AddRocksDBContenders(ctx, group);
  } else {
    AddMemoryContenders(ctx, group);
  }
  for (auto& c : cs) {
    if (c->id != id || !c->make_step) continue;
    Step step = c->make_step(0);
    const uint64_t first = NextKeyBlock();
    uint64_t failed = 0, slow = 0;
    double slow_s = 0, max_s = 0;
    const double wall0 = WallSeconds();
    const double cpu0 = CpuSeconds(CLOCK_THREAD_CPUTIME_ID);
    const double proc0 = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID);
    long vol0 = 0, invol0 = 0;
    Switches(&vol0, &invol0);
    double run0 = 0, runnable0 = 0;
    SchedSeconds(&run0, &runnable0);
    const std::map<long, TaskStat> tasks0 = timed ? Tasks() : std::map<long, TaskStat>();
    for (uint64_t k = 0; k < steps; k += static_cast<uint64_t>(c->batch)) {
      if (!timed) {
        if (!step(first + k)) ++failed;
        continue;
      }
      const double t0 = WallSeconds();
      if (!step(first + k)) ++failed;
      const double d = WallSeconds() - t0;
      if (d > 1e-3) {
        ++slow;
        slow_s += d;
      }
      if (d > max_s) max_s = d;
    }
    if (timed) {
      const double wall = WallSeconds() - wall0;
      const double cpu = CpuSeconds(CLOCK_THREAD_CPUTIME_ID) - cpu0;
      const double proc = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - proc0;
      long vol = 0, invol = 0;
      Switches(&vol, &invol);
      double run = 0, runnable = 0;
      SchedSeconds(&run, &runnable);
      run -= run0;
      runnable -= runnable0;
      const std::map<long, TaskStat> tasks1 = Tasks();
      group.Release();  // closes the stores: what they still hold is written
      const double close_wall = WallSeconds() - wall0 - wall;
      const double close_proc = CpuSeconds(CLOCK_PROCESS_CPUTIME_ID) - proc0 - proc;
      const double n = static_cast<double>(steps);
      std::fprintf(stderr,
                   "%s: %llu steps: wall %.3f s (%.0f/s), caller CPU %.3f s (%.3f us a step), "
                   "process CPU %.3f s (%.3f us a step); steps over 1 ms: %llu, %.3f s in all, "
                   "longest %.1f ms; caller's context switches: %ld voluntary (it waited), %ld "
                   "involuntary (preempted); caller blocked %.3f s, preempted %.3f s; close: wall "
                   "%.3f s, process CPU %.3f s\n",
                   id.c_str(), steps, wall, n / wall, cpu, cpu * 1e6 / n, proc, proc * 1e6 / n,
                   static_cast<unsigned long long>(slow), slow_s, max_s * 1e3, vol - vol0, invol - invol0,
                   wall - run - runnable, runnable, close_wall, close_proc);
      // Every thread that ran during the steps (the caller, a store's writer and
      // materializer, RocksDB's own): CPU a step and context switches.
      for (const auto& [tid, t1] : tasks1) {
        TaskStat t0;
        if (auto it = tasks0.find(tid); it != tasks0.end()) t0 = it->second;
        const double run_s = t1.run - t0.run;
        const long v = t1.voluntary - t0.voluntary, iv = t1.involuntary - t0.involuntary;
        if (run_s <= 0 && v == 0 && iv == 0) continue;
        std::fprintf(stderr, "  thread %ld %-16s CPU %.3f s (%.3f us a step), switches %ld voluntary, %ld involuntary\n",
                     tid, t1.name.c_str(), run_s, run_s * 1e6 / n, v, iv);
      }
    }
    std::printf("%s: %llu steps, %llu failed\n", id.c_str(), steps, static_cast<unsigned long long>(failed));
    return failed == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "no contender '%s'; ids:", id.c_str());
  for (auto& c : cs) std::fprintf(stderr, " %s", c->id.c_str());
  std::fprintf(stderr, "\n");
  return 2;
}
