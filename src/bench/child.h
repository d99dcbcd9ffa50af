// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Running one phase in a process of its own: a fresh heap, untouched by the
// phases before it (which build and free stores of millions of records), so that
// what the phase measures is the store and the history the phase itself creates.

#ifndef DEDUP_BENCH_CHILD_H_
#define DEDUP_BENCH_CHILD_H_

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "bench/bench.h"

namespace dedup::bench {

// Runs `dedup bench --phase <phase> --json` of this same executable (with the
// plan flags of this run and --isolated-child) and returns the JSON section
// `phase` it printed, or nullopt (with *error) when the child failed. The child
// is killed if this process dies.
std::optional<json> RunPhaseInChild(const BenchContext& ctx, const std::string& phase, std::string* error);

// Starts `dedup ARGS` of this same executable, its stdout on /dev/null (the
// bench's own stdout may be JSON) and its stderr appended to `stderr_path` (empty:
// inherited). The child is killed if this process dies. -1 if fork failed.
pid_t SpawnSelf(const std::vector<std::string>& args, const std::string& stderr_path = "");

}  // namespace dedup::bench

#endif  // DEDUP_BENCH_CHILD_H_
