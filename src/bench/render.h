// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Renderers of a bench run's Results: Markdown (also the terminal table:
// readable as is, pasteable), JSON and gnuplot PNGs.

#ifndef DEDUP_BENCH_RENDER_H_
#define DEDUP_BENCH_RENDER_H_

#include <string>
#include <vector>

#include "bench/results.h"

namespace dedup::bench {

std::string RenderMarkdown(const Results& r);
inline std::string RenderTable(const Results& r) { return RenderMarkdown(r); }
json RenderJson(const Results& r);
// Writes bench_workers_<store>.png and bench_retained.png into `dir`; returns
// what could not be drawn (to be listed with the skipped items).
// Phases' own plots come from their sections (PlotBrokerConsumers, bench.h).
std::vector<std::string> RenderPlots(const Results& r, const std::string& dir);

// For plot writers: `s` as a single-quoted gnuplot string, and a gnuplot run of
// the script at `path` (true when it succeeded).
std::string GnuplotQuote(const std::string& s);
bool RunGnuplot(const std::string& path);

}  // namespace dedup::bench

#endif  // DEDUP_BENCH_RENDER_H_
