// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/wait_stop.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace dedup::internal {

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

WaitStop::WaitStop() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

WaitStop::~WaitStop() {
  if (fd_ >= 0) close(fd_);
}

void WaitStop::Stop(Millis grace) {
  const int64_t g = std::max<int64_t>(0, grace.count());
  int64_t cur = grace_ms_.load();
  while (g < cur && !grace_ms_.compare_exchange_weak(cur, g)) {
  }
  int64_t none = 0;
  (void)at_ms_.compare_exchange_strong(none, std::max<int64_t>(1, SteadyMillis()),
                                       std::memory_order_acq_rel);
  // After at_ms_: a wait that saw "not stopped" before polling wakes up here.
  if (fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(fd_, &one, sizeof one);
  }
}

int64_t WaitStop::GiveUpAt(int64_t start_ms, std::string_view server) const {
  const int64_t at = at_ms_.load(std::memory_order_acquire);
  if (at == 0) return INT64_MAX;
  {
    std::lock_guard lock(mu_);
    if (given_up_.find(server) != given_up_.end()) return 0;
  }
  return std::max(at, start_ms) + grace_ms_.load();
}

void WaitStop::GaveUp(std::string_view server) const {
  std::lock_guard lock(mu_);
  given_up_.emplace(server);
}

}  // namespace dedup::internal
