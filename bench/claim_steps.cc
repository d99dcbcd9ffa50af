// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Runs one memory contender of `dedup bench --phase throughput` (its very Step:
// key built in the loop, the same call) N times on one thread, with no clock or
// histogram around it, for instruction counts:
//
//   valgrind --tool=callgrind claim_steps memory/claim/b1 200000
//
// The difference between two runs of N and 2N steps, divided by N, is the
// instructions of one step without the start-up. See docs/PERFORMANCE.md.

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench/bench.h"

int main(int argc, char** argv) {
  using namespace dedup::bench;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s CONTENDER_ID STEPS  (e.g. memory/claim/b1 200000)\n", argv[0]);
    return 2;
  }
  const std::string id = argv[1];
  char* end = nullptr;
  const unsigned long long steps = std::strtoull(argv[2], &end, 10);
  if (end == argv[2] || *end != '\0') {
    std::fprintf(stderr, "STEPS must be a number, got '%s'\n", argv[2]);
    return 2;
  }
  BenchOptions options;
  Plan plan{};
  Results results;
  BenchContext ctx{options, plan, results, nullptr};
  std::vector<std::unique_ptr<Contender>> cs;
  ContenderGroup group(1, &cs);
  AddMemoryContenders(ctx, group);
  for (auto& c : cs) {
    if (c->id != id || !c->make_step) continue;
    Step step = c->make_step(0);
    const uint64_t first = NextKeyBlock();
    uint64_t failed = 0;
    for (uint64_t k = 0; k < steps; k += static_cast<uint64_t>(c->batch)) {
      if (!step(first + k)) ++failed;
    }
    std::printf("%s: %llu steps, %llu failed\n", id.c_str(), steps, static_cast<unsigned long long>(failed));
    return failed == 0 ? 0 : 1;
  }
  std::fprintf(stderr, "no memory contender '%s'; ids:", id.c_str());
  for (auto& c : cs) std::fprintf(stderr, " %s", c->id.c_str());
  std::fprintf(stderr, "\n");
  return 2;
}
