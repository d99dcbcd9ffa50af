// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Redis store benchmarks, run by bench/redis_bench.sh next to redis-benchmark:
//
//   redis_bench claim URI CONNECTIONS DEPTH SECONDS [single|batch]
//       claims of fresh keys "task_id:<12 digits>" for SECONDS on a store with
//       CONNECTIONS connections (pool=CONNECTIONS), like redis-benchmark -c
//       CONNECTIONS -P DEPTH:
//         single (default): CONNECTIONS x DEPTH threads each calling Claim(), so
//                  that DEPTH claims per connection are in flight at once (they
//                  share round trips when the URI has pipeline=auto, the default);
//         batch:   CONNECTIONS threads each calling ClaimBatch() of DEPTH keys.
//       Prints "claims/s N (...)" with the round trips per claim.
//   redis_bench memory URI RECORDS THREADS
//       RECORDS claims + completes (empty result, 1 day retention); prints the
//       server's used_memory growth per record.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "dedup/store.h"
#include "redis/client.h"
#include "redis/options.h"

using namespace std::chrono;
using namespace dedup;

namespace {

// "task_id:" and 12 zero-padded digits, like redis-benchmark's __rand_int__ key.
std::string TaskKey(uint64_t n) {
  std::string k = "task_id:000000000000";
  for (size_t i = k.size(); i-- > 8 && n > 0; n /= 10) k[i] = static_cast<char>('0' + n % 10);
  return k;
}

// INFO memory's used_memory, or -1 (with a message) when the server cannot say.
long long UsedMemory(const std::string& uri) {
  auto parsed = redis::ParseRedisUri(uri, {"prefix"});
  if (!parsed.ok()) {
    std::fprintf(stderr, "%s\n", parsed.status().ToString().c_str());
    return -1;
  }
  auto conn = redis::Connection::Open(parsed->connection.endpoints.front(), parsed->connection);
  if (!conn.ok()) {
    std::fprintf(stderr, "%s\n", conn.status().ToString().c_str());
    return -1;
  }
  const redis::Command info{{"INFO", "memory"}};
  const redis::Command* one[] = {&info};
  std::vector<redis::Reply> replies;
  if (!(*conn)->Pipeline(one, &replies, "INFO").ok()) return -1;
  const std::string text(redis::ReplyText(replies[0].get()));
  const size_t at = text.find("used_memory:");
  return at == std::string::npos ? -1 : std::stoll(text.substr(at + 12));
}

// The servers of redis_bench.sh run without persistence on purpose: the store's
// warnings about that are not printed.
OpenOptions Quiet() {
  OpenOptions o;
  o.on_warning = [](const std::string&) {};
  return o;
}

int Claim(const std::string& uri, int conns, int depth, int seconds, bool batch) {
  auto store = OpenStore(uri + (uri.find('?') == std::string::npos ? "?" : "&") +
                             "pool=" + std::to_string(conns),
                         Quiet());
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", store.status().ToString().c_str());
    return 1;
  }
  std::atomic<uint64_t> next{static_cast<uint64_t>(
      duration_cast<microseconds>(system_clock::now().time_since_epoch()).count() % 1'000'000'000)};
  std::atomic<uint64_t> done{0}, errors{0};
  const int threads = batch ? conns : conns * depth;
  const int per_call = batch ? depth : 1;
  std::atomic<bool> go{false};
  std::atomic<int> ready{0};
  std::vector<std::thread> ts;
  steady_clock::time_point until;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&] {
      std::vector<std::string> keys(per_call);
      std::vector<ClaimRequest> reqs(per_call);
      uint64_t mine = 0;
      ready++;
      while (!go.load()) std::this_thread::yield();
      while (steady_clock::now() < until) {
        for (int i = 0; i < per_call; ++i) {
          keys[i] = TaskKey(next.fetch_add(1, std::memory_order_relaxed));
          reqs[i].key = keys[i];
          reqs[i].lease = 60s;
          reqs[i].retention = 60s;
        }
        if (per_call == 1) {
          auto r = (*store)->Claim(reqs[0]);
          if (!r.ok() && errors++ == 0) std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
        } else {
          auto r = (*store)->ClaimBatch(reqs);
          if (!r.ok() && errors++ == 0) std::fprintf(stderr, "%s\n", r.status().ToString().c_str());
        }
        mine += per_call;
      }
      done += mine;
    });
  }
  while (ready.load() < threads) std::this_thread::sleep_for(1ms);
  const auto t0 = steady_clock::now();
  until = t0 + std::chrono::seconds(seconds);
  go.store(true);
  for (auto& t : ts) t.join();
  const double secs = duration<double>(steady_clock::now() - t0).count();
  std::printf("claims/s %.0f (%s, %d connections, depth %d, %d threads, %llu claims, %llu errors)\n",
              done / secs, batch ? "ClaimBatch" : "Claim", conns, depth, threads,
              static_cast<unsigned long long>(done.load()),
              static_cast<unsigned long long>(errors.load()));
  return errors == 0 ? 0 : 1;
}

int Memory(const std::string& uri, uint64_t records, int threads) {
  auto store = OpenStore(uri + (uri.find('?') == std::string::npos ? "?" : "&") +
                             "pool=" + std::to_string(threads),
                         Quiet());
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
  if (mode == "claim" && (argc == 6 || argc == 7)) {
    const std::string shape = argc == 7 ? argv[6] : "single";
    if (shape != "single" && shape != "batch") {
      std::fprintf(stderr, "redis_bench claim: shape must be single or batch, got '%s'\n",
                   shape.c_str());
      return 2;
    }
    return Claim(argv[2], std::atoi(argv[3]), std::atoi(argv[4]), std::atoi(argv[5]),
                 shape == "batch");
  }
  if (mode == "memory" && argc == 5) {
    return Memory(argv[2], std::strtoull(argv[3], nullptr, 10), std::atoi(argv[4]));
  }
  std::fprintf(stderr,
               "usage: redis_bench claim URI CONNECTIONS DEPTH SECONDS [single|batch]\n"
               "       redis_bench memory URI RECORDS THREADS\n");
  return 2;
}
