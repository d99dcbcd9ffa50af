// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// WaitStop: what a store's connections are told when its caller stops waiting
// (Store::StopWaiting). One for every client that waits on a server in poll(2):
// the Redis client and the PostgreSQL store.

#ifndef DEDUP_CORE_WAIT_STOP_H_
#define DEDUP_CORE_WAIT_STOP_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

#include "dedup/clock.h"

namespace dedup::internal {

// The steady clock in ms: the clocks of waits bounded by a WaitStop.
int64_t SteadyMillis();

// From the stop on, no wait for a server lasts more than the grace, counted from
// the stop for a wait already begun, from its start for a later one, and none at
// all on a server that already let one wait run out so (GaveUp: it did not
// answer within the grace). `server` names the server for a client that talks
// to several (a Redis Cluster's nodes); a client of one server leaves it empty.
// The eventfd turns readable at the stop (and stays so), waking a wait in
// poll(2) at once so that it bounds itself anew.
class WaitStop {
 public:
  WaitStop();
  ~WaitStop();
  WaitStop(const WaitStop&) = delete;
  WaitStop& operator=(const WaitStop&) = delete;

  // Any thread; never blocks. The first call's moment counts; the shortest
  // grace applies.
  void Stop(Millis grace);
  bool stopped() const { return at_ms_.load(std::memory_order_acquire) != 0; }
  // Steady ms (SteadyMillis) past which a wait on `server` that began at
  // `start_ms` ends; INT64_MAX while not stopped, 0 once a wait on `server` was
  // given up.
  int64_t GiveUpAt(int64_t start_ms, std::string_view server = {}) const;
  void GaveUp(std::string_view server = {}) const;
  int fd() const { return fd_; }  // -1 if the eventfd could not be made

 private:
  std::atomic<int64_t> at_ms_{0};  // 0: not stopped
  std::atomic<int64_t> grace_ms_{INT64_MAX};
  int fd_ = -1;
  mutable std::mutex mu_;
  mutable std::set<std::string, std::less<>> given_up_;  // servers a wait was given up on
};

}  // namespace dedup::internal

#endif  // DEDUP_CORE_WAIT_STOP_H_
