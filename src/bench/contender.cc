// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "bench/contender.h"

#include <algorithm>
#include <thread>

namespace dedup::bench {

using namespace std::chrono_literals;

RoundResult RunInProcess(Contender& c, int workers, double seconds) {
  const int threads = workers * c.callers;
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int> ready{0};
  std::vector<Hist> hists(static_cast<size_t>(threads));
  std::vector<uint64_t> done(static_cast<size_t>(threads)), errs(static_cast<size_t>(threads));
  std::vector<std::thread> ts;
  const int batch = c.batch;
  // One key block per worker, shared out among its callers.
  std::vector<uint64_t> blocks(static_cast<size_t>(workers));
  for (uint64_t& b : blocks) b = NextKeyBlock();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      Step step = c.make_step(t);
      uint64_t key = blocks[static_cast<size_t>(t / c.callers)] +
                     static_cast<uint64_t>(t % c.callers) * (100'000'000ULL / static_cast<uint64_t>(c.callers));
      Hist& h = hists[static_cast<size_t>(t)];
      uint64_t n = 0, e = 0;
      ready.fetch_add(1);
      while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      while (!stop.load(std::memory_order_relaxed)) {
        const auto t0 = Clk::now();
        const bool ok = step(key);
        const auto t1 = Clk::now();
        h.Add(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count()));
        key += static_cast<uint64_t>(batch);
        n += static_cast<uint64_t>(batch);
        if (!ok) ++e;
      }
      done[static_cast<size_t>(t)] = n;
      errs[static_cast<size_t>(t)] = e;
    });
  }
  while (ready.load() < threads) std::this_thread::yield();
  const auto start = Clk::now();
  go.store(true, std::memory_order_release);
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop.store(true);
  for (auto& t : ts) t.join();
  const double secs = Seconds(Clk::now() - start);
  RoundResult r;
  for (int t = 0; t < threads; ++t) {
    r.messages += done[static_cast<size_t>(t)];
    r.errors += errs[static_cast<size_t>(t)];
    c.hist.Merge(hists[static_cast<size_t>(t)]);
  }
  r.rate = static_cast<double>(r.messages) / secs;
  return r;
}

RoundResult RunRound(Contender& c, int threads, double seconds) {
  const auto start = Clk::now();
  RoundResult r = RunInProcess(c, threads, seconds);
  // At most 10 rounds' length (a store whose background never stops costs the
  // bench time, not a hang).
  r.tail_s = AwaitQuiet(std::max(1.0, 10 * seconds));
  r.rate = static_cast<double>(r.messages) / Seconds(Clk::now() - start);
  return r;
}

ClaimRequest BenchClaim(std::string_view key) {
  ClaimRequest r;
  r.key = key;
  r.lease = 60s;
  r.retention = 600s;
  return r;
}

std::function<Step(int)> StoreStep(Store* store, Buffer* buffer, const std::string& op, int batch) {
  return [=](int) -> Step {
    if (op == "process_once") {
      return [=](uint64_t k) {
        const std::string key = TaskKey(k);
        Processed p = buffer->ProcessOnce(key, "", [](ClaimGuard&) { return HandlerResult::Done(); });
        return p.status.ok() && p.action == BrokerAction::kAck && p.ran;
      };
    }
    if (op == kClaimCompleteLater) {
      // Each thread completes a claim only after kCompleteLaterDepth more of its
      // own: what a handler that runs for a while leaves in flight.
      auto ring = std::make_shared<std::vector<std::pair<std::string, Token>>>();
      auto next = std::make_shared<size_t>(0);
      return [=](uint64_t k) {
        std::string key = TaskKey(k);
        auto r = store->Claim(BenchClaim(key));
        if (!r.ok() || !r->acquired()) return false;
        if (ring->size() < kCompleteLaterDepth) {
          ring->emplace_back(std::move(key), r->token);
          return true;
        }
        auto& [old_key, old_token] = (*ring)[*next];
        auto c = store->Complete(old_key, old_token, 600s, CompletionStatus::kOk, "");
        old_key = std::move(key);
        old_token = r->token;
        *next = (*next + 1) % kCompleteLaterDepth;
        return c.ok() && *c == WriteResult::kOk;
      };
    }
    const bool complete = op == "claim+complete";
    if (batch == 1) {
      return [=](uint64_t k) {
        const std::string key = TaskKey(k);
        auto r = store->Claim(BenchClaim(key));
        if (!r.ok() || !r->acquired()) return false;
        if (complete) {
          auto c = store->Complete(key, r->token, 600s, CompletionStatus::kOk, "");
          return c.ok() && *c == WriteResult::kOk;
        }
        return true;
      };
    }
    // A batch of claims is completed as the Consumer completes what it claimed
    // together: one CompleteBatch (one round trip on Redis, one write on RocksDB).
    auto keys = std::make_shared<std::vector<std::string>>(static_cast<size_t>(batch));
    auto reqs = std::make_shared<std::vector<ClaimRequest>>(static_cast<size_t>(batch));
    auto completions = std::make_shared<std::vector<CompleteRequest>>();
    return [=](uint64_t k) {
      for (int i = 0; i < batch; ++i) {
        (*keys)[static_cast<size_t>(i)] = TaskKey(k + static_cast<uint64_t>(i));
        (*reqs)[static_cast<size_t>(i)] = BenchClaim((*keys)[static_cast<size_t>(i)]);
      }
      auto r = store->ClaimBatch(*reqs);
      if (!r.ok()) return false;
      bool ok = true;
      completions->clear();
      for (int i = 0; i < batch; ++i) {
        const ClaimResult& cr = (*r)[static_cast<size_t>(i)];
        if (!cr.acquired()) {
          ok = false;
          continue;
        }
        if (complete) {
          CompleteRequest c;
          c.key = (*keys)[static_cast<size_t>(i)];
          c.token = cr.token;
          c.retention = 600s;
          completions->push_back(c);
        }
      }
      if (!completions->empty()) {
        auto c = store->CompleteBatch(*completions);
        if (!c.ok()) return false;
        for (const AckedWrite& w : *c) ok = ok && w.write == WriteResult::kOk;
      }
      return ok;
    };
  };
}

StatusOr<ClaimResult> CountingStore::Claim(const ClaimRequest& req) {
  calls.fetch_add(1, std::memory_order_relaxed);
  return target()->Claim(req);
}
StatusOr<std::vector<ClaimResult>> CountingStore::ClaimBatch(std::span<const ClaimRequest> reqs) {
  calls.fetch_add(1, std::memory_order_relaxed);
  return target()->ClaimBatch(reqs);
}
StatusOr<WriteResult> CountingStore::Extend(std::string_view key, Token token, Millis lease) {
  calls.fetch_add(1, std::memory_order_relaxed);
  return target()->Extend(key, token, lease);
}
StatusOr<WriteResult> CountingStore::Complete(std::string_view key, Token token, Millis retention,
                                              CompletionStatus status, std::string_view result) {
  calls.fetch_add(1, std::memory_order_relaxed);
  return target()->Complete(key, token, retention, status, result);
}
StatusOr<WriteResult> CountingStore::Release(std::string_view key, Token token, Millis retention) {
  calls.fetch_add(1, std::memory_order_relaxed);
  return target()->Release(key, token, retention);
}

}  // namespace dedup::bench
