// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Small helpers every bench phase uses: clocks, medians, the key shape, number
// formatting, process and directory sizes, and a cheap latency histogram.

#ifndef DEDUP_BENCH_UTIL_H_
#define DEDUP_BENCH_UTIL_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "dedup/store.h"

namespace dedup::bench {

// Options for the bench's own stores: the bench starts its servers without
// persistence on purpose, so the store's warnings about that are not printed.
OpenOptions QuietOpen();

using Clk = std::chrono::steady_clock;
using nlohmann::json;

// Set by the command's SIGINT/SIGTERM handler: every phase stops early.
void RequestStop();
bool StopRequested();

double Seconds(Clk::duration d);
double Median(std::vector<double> v);  // NaN-free median; NaN when empty

// The seed's key shape, as redis-benchmark's __rand_int__ makes it: 20 bytes.
std::string TaskKey(uint64_t n);
// Writes TaskKey(n) into buf (at least 21 bytes); returns its length. No allocation.
size_t TaskKeyInto(uint64_t n, char* buf);

// Every thread of every round takes its own block of key numbers: keys are
// fresh (a message seen for the first time), never shared between contenders.
uint64_t NextKeyBlock();

json Num(double v);                        // null when not finite
std::string Fmt(const char* f, double v);  // "-" when not finite
std::string Rate(double v);                // "1 234 567"

// Waits until no other thread of this process is running, waiting for a CPU or
// in an uninterruptible wait (disk I/O): state R or D in /proc/self/task, three
// looks in a row 1 ms apart, and at most `max_s`. Returns the seconds waited.
// What it waits for is the work a round left behind in background threads (a
// store's writer, a RocksDB flush or compaction, a materialization of the claim
// log), which a busy machine delays but does not hide: a thread preempted by
// another process is still R.
double AwaitQuiet(double max_s);

long RssBytes();
uint64_t DirBytes(const std::string& dir, const std::string& suffix = "");
std::string MakeTempDir(const std::string& tag);

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
  double QuantileUs(double q) const;
  double MaxUs() const;
};

}  // namespace dedup::bench

#endif  // DEDUP_BENCH_UTIL_H_
