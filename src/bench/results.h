// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The results of one `dedup bench` run, as a value: what every renderer
// (render.h: table, JSON, Markdown, gnuplot) reads, and nothing else.

#ifndef DEDUP_BENCH_RESULTS_H_
#define DEDUP_BENCH_RESULTS_H_

#include <cmath>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/contender.h"
#include "bench/util.h"

namespace dedup::bench {

struct Goal {
  std::string what;
  std::string measured;  // "2.41x"
  double value = NAN;
  double target = NAN;
  bool lower_is_better = false;
  std::string status;  // met | not met | not measured
  std::string note;
};

// A phase's own part of the report: `data` goes into the JSON under `key`,
// `markdown` (a "### ..." section, or empty) into the page, after the built-in
// sections and before the goals, in phase order.
struct Section {
  std::string key;
  json data;
  std::string markdown;
};

// ratios[workers][contender id][baseline id] = per-round ratios
using Ratios = std::map<int, std::map<std::string, std::map<std::string, std::vector<double>>>>;

struct Results {
  // About the run.
  std::string command_line, mode;
  int rounds = 0;
  double round_s = 0;
  double elapsed_s = 0;
  std::string redis_version;
  bool interrupted = false;
  std::string usage_error;  // set when the options cannot work (e.g. a bad --redis)

  // Throughput matrix: contenders by worker count, and their per-round ratios.
  std::map<int, std::vector<std::unique_ptr<Contender>>> groups;
  Ratios ratios;
  json memory = json::array();    // memory per retained record
  json retained = json::array();  // claims as retained records grow
  std::vector<Section> sections;  // phases' own sections (streams worker, ...)
  std::vector<Goal> goals;
  std::vector<std::string> skipped;

  // Median of the per-round ratios of `id` to `baseline` at `threads`; NaN if absent.
  double Ratio(int threads, const std::string& id, const std::string& baseline) const;
  const Section* FindSection(const std::string& key) const;
  // Adds a goal; `unit` is "x" (ratio), "%" or "n" (a plain number).
  void AddGoal(std::string what, double value, double target, bool lower_is_better = false,
               std::string note = "", std::string unit = "x");
  // True when a measured (non-baseline) contender had failed calls; names it.
  bool FailedCalls(std::string* which) const;
};

}  // namespace dedup::bench

#endif  // DEDUP_BENCH_RESULTS_H_
