// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Redis store benchmarks, run by bench/redis_bench.sh next to redis-benchmark:
//
//   redis_bench claim URI THREADS DEPTH SECONDS
//       claims of fresh keys "task_id:<12 digits>" for SECONDS; DEPTH 1 = Claim(),
//       DEPTH > 1 = ClaimBatch() of DEPTH keys (one pipeline per round trip).
//       Prints "claims/s N".
//   redis_bench memory URI RECORDS THREADS
//       RECORDS claims + completes (empty result, 1 day retention); prints the
//       server's used_memory growth per record.

#include <hiredis/hiredis.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/uri.h"
#include "dedup/store.h"

using namespace std::chrono;
using namespace dedup;

namespace {

// "task_id:" and 12 zero-padded digits, like redis-benchmark's __rand_int__ key.
std::string TaskKey(uint64_t n) {
  std::string k = "task_id:000000000000";
  for (size_t i = k.size(); i-- > 8 && n > 0; n /= 10) k[i] = static_cast<char>('0' + n % 10);
  return k;
}

long long UsedMemory(const std::string& uri) {
  auto u = internal::ParseUri(uri);
  std::string hosts = u->hosts;
  const size_t colon = hosts.rfind(':');
  redisContext* c = redisConnect(hosts.substr(0, colon).c_str(), std::stoi(hosts.substr(colon + 1)));
  auto* r = static_cast<redisReply*>(redisCommand(c, "INFO memory"));
  std::string text(r->str, r->len);
  freeReplyObject(r);
  redisFree(c);
  const size_t at = text.find("used_memory:");
  return std::stoll(text.substr(at + 12));
}

int Claim(const std::string& uri, int threads, int depth, int seconds) {
  auto store = OpenStore(uri + "&pool=" + std::to_string(threads));
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  std::atomic<uint64_t> next{static_cast<uint64_t>(
      duration_cast<microseconds>(system_clock::now().time_since_epoch()).count() % 1'000'000'000)};
  std::atomic<uint64_t> done{0}, errors{0};
  const auto until = steady_clock::now() + std::chrono::seconds(seconds);
  std::vector<std::thread> ts;
  const auto t0 = steady_clock::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      std::vector<std::string> keys(depth);
      std::vector<ClaimRequest> reqs(depth);
      while (steady_clock::now() < until) {
        for (int i = 0; i < depth; ++i) {
          keys[i] = TaskKey(next++);
          reqs[i].key = keys[i];
          reqs[i].lease = 60s;
          reqs[i].retention = 60s;
        }
        if (depth == 1) {
          auto r = (*store)->Claim(reqs[0]);
          if (!r.ok() && errors++ == 0) std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
        } else {
          auto r = (*store)->ClaimBatch(reqs);
          if (!r.ok() && errors++ == 0) std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
        }
        done += depth;
      }
    });
  }
  for (auto& t : ts) t.join();
  const double secs = duration<double>(steady_clock::now() - t0).count();
  std::printf("claims/s %.0f (threads %d, depth %d, %llu claims, %llu errors)\n", done / secs,
              threads, depth, static_cast<unsigned long long>(done.load()),
              static_cast<unsigned long long>(errors.load()));
  return errors == 0 ? 0 : 1;
}

int Memory(const std::string& uri, uint64_t records, int threads) {
  auto store = OpenStore(uri + "&pool=" + std::to_string(threads));
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  const long long before = UsedMemory(uri);
  std::atomic<uint64_t> next{0}, errors{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      std::vector<std::string> keys(64);
      std::vector<ClaimRequest> reqs(64);
      for (;;) {
        const uint64_t first = next.fetch_add(64);
        if (first >= records) return;
        const size_t n = static_cast<size_t>(std::min<uint64_t>(64, records - first));
        for (size_t i = 0; i < n; ++i) {
          keys[i] = TaskKey(first + i);
          reqs[i].key = keys[i];
          reqs[i].lease = 60s;
          reqs[i].retention = 86'400s;
        }
        auto r = (*store)->ClaimBatch(std::span(reqs.data(), n));
        if (!r.ok()) { errors++; continue; }
        for (size_t i = 0; i < n; ++i) {
          auto w = (*store)->Complete(keys[i], (*r)[i].token, 86'400s, CompletionStatus::kOk, {});
          if (!w.ok() || *w != WriteResult::kOk) errors++;
        }
      }
    });
  }
  for (auto& t : ts) t.join();
  const long long after = UsedMemory(uri);
  std::printf("bytes/record %.1f (%llu completed records, used_memory %lld -> %lld, %llu errors)\n",
              static_cast<double>(after - before) / records,
              static_cast<unsigned long long>(records), before, after,
              static_cast<unsigned long long>(errors.load()));
  return errors == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "claim" && argc == 6) {
    return Claim(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]));
  }
  if (mode == "memory" && argc == 5) {
    return Memory(argv[2], std::strtoull(argv[3], nullptr, 10), std::atoi(argv[4]));
  }
  std::fprintf(stderr,
               "usage: redis_bench claim URI THREADS DEPTH SECONDS\n"
               "       redis_bench memory URI RECORDS THREADS\n");
  return 2;
}
