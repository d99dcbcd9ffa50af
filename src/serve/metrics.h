// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// A small metrics registry with Prometheus text exposition (format 0.0.4), in
// Prometheus's conventions: names start with `dedup_`, counters end in `_total`,
// durations are histograms in seconds, and labels carry small closed sets
// (outcome, route, operation) — never a key or anything a client chooses.
//
// Not tied to HTTP: `dedup serve` exposes it on its own listener, and any other
// long-running part (the worker) can register its families in one and render it.
//
// A Registry is safe for concurrent use. Families and series are created once
// (under a lock) and never removed, so the returned pointers stay valid for the
// registry's lifetime; Inc() and Observe() are lock-free.

#ifndef DEDUP_SRC_SERVE_METRICS_H_
#define DEDUP_SRC_SERVE_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dedup::metrics {

class Counter {
 public:
  void Inc(uint64_t n = 1) { v_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return v_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> v_{0};
};

class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double seconds);
  // Cumulative counts per bound (+Inf last), the sum and the count.
  std::vector<uint64_t> Cumulative() const;
  double sum() const;
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }

 private:
  const std::vector<double>* bounds_;
  std::unique_ptr<std::atomic<uint64_t>[]> buckets_;  // bounds_->size() + 1
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> sum_nanos_{0};
};

// Latency buckets from 50 µs to 10 s, for store calls and HTTP requests.
const std::vector<double>& LatencyBuckets();

class Registry {
 public:
  // A counter series: `name` must end in _total; `labels` are name=value pairs in
  // a fixed order per family. The same name and labels give the same Counter.
  Counter* GetCounter(const std::string& name, const std::string& help,
                      const std::vector<std::pair<std::string, std::string>>& labels = {});
  Histogram* GetHistogram(const std::string& name, const std::string& help,
                          const std::vector<std::pair<std::string, std::string>>& labels = {},
                          const std::vector<double>& bounds = LatencyBuckets());
  // A counter whose value is read when rendering, for counts another part keeps
  // (e.g. the Consumer's). `value` must never decrease.
  void AddCounterFunc(const std::string& name, const std::string& help,
                      const std::vector<std::pair<std::string, std::string>>& labels,
                      std::function<double()> value);
  // A gauge whose value is read when rendering.
  void AddGauge(const std::string& name, const std::string& help,
                const std::vector<std::pair<std::string, std::string>>& labels,
                std::function<double()> value);
  // dedup_build_info{version=...} 1.
  void AddBuildInfo(const std::string& version);

  // Every family, sorted by name, in the Prometheus text format.
  std::string Render() const;

 private:
  struct Family {
    std::string type;  // counter, histogram, gauge
    std::string help;
    std::vector<double> bounds;
    std::map<std::string, std::unique_ptr<Counter>> counters;      // by rendered labels
    std::map<std::string, std::unique_ptr<Histogram>> histograms;  // by rendered labels
    std::map<std::string, std::function<double()>> funcs;          // by rendered labels
  };
  Family& FamilyFor(const std::string& name, const std::string& type, const std::string& help);

  mutable std::mutex mu_;
  std::map<std::string, Family> families_;
};

// `{a="x",b="y"}` with Prometheus escaping (\\, \", \n); "" when there are none.
std::string RenderLabels(const std::vector<std::pair<std::string, std::string>>& labels);

}  // namespace dedup::metrics

#endif  // DEDUP_SRC_SERVE_METRICS_H_
