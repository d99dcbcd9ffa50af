// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "bench/results.h"

namespace dedup::bench {

double Results::Ratio(int threads, const std::string& id, const std::string& baseline) const {
  auto a = ratios.find(threads);
  if (a == ratios.end()) return NAN;
  auto b = a->second.find(id);
  if (b == a->second.end()) return NAN;
  auto c = b->second.find(baseline);
  return c == b->second.end() ? NAN : Median(c->second);
}

const Section* Results::FindSection(const std::string& key) const {
  for (auto& s : sections) {
    if (s.key == key) return &s;
  }
  return nullptr;
}

void Results::AddGoal(std::string what, double v, double target, bool lower, std::string note,
                      std::string unit) {
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
  goals.push_back(std::move(g));
}

bool Results::FailedCalls(std::string* which) const {
  for (auto& [t, cs] : groups) {
    for (auto& c : cs) {
      if (c->errors && c->op != "baseline") {
        *which =
            c->id + " (" + std::to_string(t) + " workers) had " + std::to_string(c->errors) + " failed calls";
        return true;
      }
    }
  }
  return false;
}

}  // namespace dedup::bench
