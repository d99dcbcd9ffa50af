// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The threads that answer serve's connections (cpp-httplib's TaskQueue).
//
// cpp-httplib gives each accepted connection one task that holds a thread until
// the connection closes: while the client is idle between requests (up to the
// keep-alive timeout), and while it sends a request head or body, as slowly as it
// likes (the read timeout bounds each read, not the whole). With a fixed pool, as
// many slow or idle clients as threads held every thread, and every other client
// waited behind them however quick its request.
//
// Here `threads` threads always wait for connections and, when every thread is
// busy, a new connection gets a thread of its own (which ends with it), up to
// `max_threads` threads in all. Past that bound, connections wait in the order
// they came, as before: memory and threads stay bounded, and what is left to a
// client that opens more slow connections than that is said in docs/SERVE.md.

#ifndef DEDUP_SRC_SERVE_CONNECTION_POOL_H_
#define DEDUP_SRC_SERVE_CONNECTION_POOL_H_

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <list>
#include <mutex>
#include <thread>

namespace dedup::serve {

class ConnectionPool : public httplib::TaskQueue {
 public:
  // 1 <= threads <= max_threads.
  ConnectionPool(size_t threads, size_t max_threads);
  ~ConnectionPool() override;

  void enqueue(std::function<void()> fn) override;
  // On a pool's thread, while it runs a connection: when that connection was
  // queued (accepted). Elsewhere: time_point::min().
  static std::chrono::steady_clock::time_point QueuedAt();
  // Runs the connections already queued, then joins every thread.
  void shutdown() override;

 private:
  struct Worker {
    std::thread thread;
    bool done = false;  // an extra thread that has returned from Work
  };
  void Work(Worker* self, bool extra);
  void JoinDoneLocked(std::unique_lock<std::mutex>& lock);

  const size_t max_threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  struct Job {
    std::function<void()> fn;
    std::chrono::steady_clock::time_point queued_at;
  };
  std::deque<Job> jobs_;
  std::list<Worker> workers_;  // node-based: a Worker stays put
  size_t idle_ = 0;            // threads waiting for a job
  size_t running_ = 0;         // threads not yet returned from Work
  bool shutdown_ = false;
};

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_CONNECTION_POOL_H_
