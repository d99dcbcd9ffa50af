// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "serve/connection_pool.h"

#include <utility>

namespace dedup::serve {
namespace {

thread_local std::chrono::steady_clock::time_point t_queued_at =
    std::chrono::steady_clock::time_point::min();

}  // namespace

std::chrono::steady_clock::time_point ConnectionPool::QueuedAt() { return t_queued_at; }

ConnectionPool::ConnectionPool(size_t threads, size_t max_threads) : max_threads_(max_threads) {
  std::lock_guard lock(mu_);
  for (size_t i = 0; i < threads; ++i) {
    Worker& w = workers_.emplace_back();
    ++running_;
    w.thread = std::thread([this, &w] { Work(&w, /*extra=*/false); });
  }
}

ConnectionPool::~ConnectionPool() { shutdown(); }

void ConnectionPool::enqueue(std::function<void()> fn) {
  std::unique_lock lock(mu_);
  JoinDoneLocked(lock);
  jobs_.push_back({std::move(fn), std::chrono::steady_clock::now()});
  // Every thread is busy with a connection: one more thread, within the bound.
  if (jobs_.size() > idle_ && running_ < max_threads_ && !shutdown_) {
    Worker& w = workers_.emplace_back();
    ++running_;
    w.thread = std::thread([this, &w] { Work(&w, /*extra=*/true); });
  }
  cv_.notify_one();
}

void ConnectionPool::shutdown() {
  std::list<Worker> all;
  {
    std::lock_guard lock(mu_);
    shutdown_ = true;
    all.splice(all.end(), workers_);
  }
  cv_.notify_all();
  for (Worker& w : all) {
    if (w.thread.joinable()) w.thread.join();
  }
}

void ConnectionPool::Work(Worker* self, bool extra) {
  std::unique_lock lock(mu_);
  for (;;) {
    // An extra thread takes what is queued and ends when nothing is; the others
    // wait for the next connection until shutdown (after the queue is drained:
    // each queued task closes its connection).
    if (extra && jobs_.empty()) break;
    ++idle_;
    cv_.wait(lock, [this] { return shutdown_ || !jobs_.empty(); });
    --idle_;
    if (jobs_.empty()) break;  // shutdown
    Job job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    t_queued_at = job.queued_at;
    job.fn();
    t_queued_at = std::chrono::steady_clock::time_point::min();
    lock.lock();
  }
  --running_;
  self->done = extra;
}

void ConnectionPool::JoinDoneLocked(std::unique_lock<std::mutex>& lock) {
  std::list<Worker> done;
  for (auto it = workers_.begin(); it != workers_.end();) {
    auto next = std::next(it);
    if (it->done) done.splice(done.end(), workers_, it);
    it = next;
  }
  if (done.empty()) return;
  // They have returned from Work: joining waits only for the threads to end.
  lock.unlock();
  for (Worker& w : done) w.thread.join();
  lock.lock();
}

}  // namespace dedup::serve
