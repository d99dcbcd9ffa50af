// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "serve/metrics.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace dedup::metrics {
namespace {

std::string FormatDouble(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.17g", v);
  // Prefer the short form when it round-trips (0.001 rather than 0.0010000000000000000208).
  char shorter[64];
  std::snprintf(shorter, sizeof(shorter), "%g", v);
  return std::strtod(shorter, nullptr) == v ? shorter : buf;
}

// Appends one label to rendered labels "{...}" (or starts them).
std::string WithLabel(const std::string& rendered, const std::string& name,
                      const std::string& value) {
  std::string extra = RenderLabels({{name, value}});
  if (rendered.empty()) return extra;
  return rendered.substr(0, rendered.size() - 1) + "," + extra.substr(1);
}

}  // namespace

const std::vector<double>& LatencyBuckets() {
  static const std::vector<double> kBuckets = {0.00005, 0.0001, 0.00025, 0.0005, 0.001,
                                               0.0025,  0.005,  0.01,    0.025,  0.05,
                                               0.1,     0.25,   0.5,     1,      2.5,
                                               5,       10};
  return kBuckets;
}

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), buckets_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds_->size(); ++i) buckets_[i].store(0);
}

void Histogram::Observe(double seconds) {
  size_t i = 0;
  while (i < bounds_->size() && seconds > (*bounds_)[i]) ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
  const double nanos = seconds > 0 ? seconds * 1e9 : 0;
  sum_nanos_.fetch_add(static_cast<uint64_t>(nanos), std::memory_order_relaxed);
}

std::vector<uint64_t> Histogram::Cumulative() const {
  std::vector<uint64_t> out(bounds_->size() + 1);
  uint64_t acc = 0;
  for (size_t i = 0; i <= bounds_->size(); ++i) {
    acc += buckets_[i].load(std::memory_order_relaxed);
    out[i] = acc;
  }
  return out;
}

double Histogram::sum() const {
  return static_cast<double>(sum_nanos_.load(std::memory_order_relaxed)) / 1e9;
}

std::string RenderLabels(const std::vector<std::pair<std::string, std::string>>& labels) {
  if (labels.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i) out += ',';
    out += labels[i].first;
    out += "=\"";
    for (char c : labels[i].second) {
      if (c == '\\') out += "\\\\";
      else if (c == '"') out += "\\\"";
      else if (c == '\n') out += "\\n";
      else out += c;
    }
    out += '"';
  }
  return out + "}";
}

Registry::Family& Registry::FamilyFor(const std::string& name, const std::string& type,
                                      const std::string& help) {
  auto [it, inserted] = families_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.help = help;
  } else if (it->second.type != type) {
    throw std::logic_error("metric " + name + " registered as " + it->second.type +
                           " and " + type);
  }
  return it->second;
}

Counter* Registry::GetCounter(const std::string& name, const std::string& help,
                              const std::vector<std::pair<std::string, std::string>>& labels) {
  std::lock_guard lock(mu_);
  Family& f = FamilyFor(name, "counter", help);
  auto& slot = f.counters[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Counter>();
  return slot.get();
}

Histogram* Registry::GetHistogram(const std::string& name, const std::string& help,
                                  const std::vector<std::pair<std::string, std::string>>& labels,
                                  const std::vector<double>& bounds) {
  std::lock_guard lock(mu_);
  Family& f = FamilyFor(name, "histogram", help);
  if (f.bounds.empty()) f.bounds = bounds;
  auto& slot = f.histograms[RenderLabels(labels)];
  if (!slot) slot = std::make_unique<Histogram>(&f.bounds);
  return slot.get();
}

void Registry::AddGauge(const std::string& name, const std::string& help,
                        const std::vector<std::pair<std::string, std::string>>& labels,
                        std::function<double()> value) {
  std::lock_guard lock(mu_);
  FamilyFor(name, "gauge", help).funcs[RenderLabels(labels)] = std::move(value);
}

void Registry::AddCounterFunc(const std::string& name, const std::string& help,
                              const std::vector<std::pair<std::string, std::string>>& labels,
                              std::function<double()> value) {
  std::lock_guard lock(mu_);
  FamilyFor(name, "counter", help).funcs[RenderLabels(labels)] = std::move(value);
}

void Registry::AddBuildInfo(const std::string& version) {
  AddGauge("dedup_build_info", "The dedup build: always 1, with the version as a label.",
           {{"version", version}}, [] { return 1.0; });
}

std::string Registry::Render() const {
  std::lock_guard lock(mu_);
  std::string out;
  for (const auto& [name, f] : families_) {
    out += "# HELP " + name + " " + f.help + "\n";
    out += "# TYPE " + name + " " + f.type + "\n";
    for (const auto& [labels, c] : f.counters) {
      out += name + labels + " " + std::to_string(c->value()) + "\n";
    }
    for (const auto& [labels, g] : f.funcs) {
      out += name + labels + " " + FormatDouble(g()) + "\n";
    }
    for (const auto& [labels, h] : f.histograms) {
      const std::vector<uint64_t> cum = h->Cumulative();
      for (size_t i = 0; i < cum.size(); ++i) {
        const double le = i < f.bounds.size() ? f.bounds[i] : INFINITY;
        out += name + "_bucket" + WithLabel(labels, "le", FormatDouble(le)) + " " +
               std::to_string(cum[i]) + "\n";
      }
      out += name + "_sum" + labels + " " + FormatDouble(h->sum()) + "\n";
      out += name + "_count" + labels + " " + std::to_string(cum.back()) + "\n";
    }
  }
  return out;
}

}  // namespace dedup::metrics
