// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "bench/plan.h"

namespace dedup::bench {

Plan MakePlan(const BenchOptions& o) {
  Plan p;
  if (o.quick) {
    p = {{1, 2}, 2, 0.05, {10'000}, {10'000}, {10'000, 100'000}, 0.05, 2, 500, 1, "quick"};
  } else if (o.full) {
    p = {{1, 2, 8, 32},
         9,
         0.3,
         {100'000, 1'000'000},
         {100'000, 1'000'000},
         {10'000, 100'000, 1'000'000, 10'000'000},
         0.3,
         5,
         20'000,
         5,
         "full"};
  } else {
    p = {{1, 2, 8, 32}, 5, 0.2,      {100'000, 1'000'000}, {100'000}, {10'000, 100'000, 1'000'000}, 0.2, 5,
         5'000,         3, "default"};
  }
  if (!o.workers.empty()) p.workers = o.workers;
  if (o.rounds > 0) p.rounds = o.rounds;
  if (o.round_s > 0) p.round_s = o.round_s;
  return p;
}

}  // namespace dedup::bench
