// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "consumer/output_copy.h"

#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

namespace dedup {

struct OutputCopy::State {
  int fd = -1;
  size_t capacity = 0;
  int room_fd = -1;  // eventfd, written after every write
  mutable std::mutex mu;
  std::condition_variable cv;   // the writer waits for data, or the end
  std::condition_variable done;  // Finish waits for an empty queue
  // Chunks as pushed; the writer writes the front one from `front_off` (outside
  // the lock: push_back on a deque keeps references to elements valid).
  std::deque<std::string> queue;
  size_t front_off = 0;
  size_t queued = 0;  // bytes in queue not yet written
  size_t dropped = 0;
  bool failed = false;
  bool closing = false;  // the OutputCopy is gone: the writer ends when idle

  ~State() {
    if (room_fd >= 0) close(room_fd);
  }

  void Writer() {
    std::unique_lock lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return closing || !queue.empty(); });
      if (queue.empty()) return;  // closing, and all written
      const std::string& chunk = queue.front();
      const char* p = chunk.data() + front_off;
      const size_t n = chunk.size() - front_off;
      lock.unlock();
      ssize_t w = write(fd, p, n);
      const int e = errno;
      if (w < 0 && e == EAGAIN) {  // a descriptor someone made non-blocking
        pollfd pfd{fd, POLLOUT, 0};
        (void)poll(&pfd, 1, 100);
      }
      lock.lock();
      if (w > 0) {
        front_off += static_cast<size_t>(w);
        queued -= static_cast<size_t>(w);
        if (front_off == queue.front().size()) {
          queue.pop_front();
          front_off = 0;
        }
      } else if (w == 0 || (e != EAGAIN && e != EINTR)) {
        failed = true;  // EPIPE (the reader went away), EBADF, EIO, ENOSPC ...
        dropped += queued;
        queue.clear();
        front_off = 0;
        queued = 0;
      }
      if (queue.empty()) done.notify_all();
      const uint64_t one = 1;
      (void)!::write(room_fd, &one, sizeof one);
    }
  }
};

StatusOr<std::unique_ptr<OutputCopy>> OutputCopy::Start(int fd, size_t capacity) {
  auto state = std::make_shared<State>();
  state->fd = fd;
  state->capacity = std::max<size_t>(capacity, 1);
  state->room_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (state->room_fd < 0) {
    return Status::Unavailable(std::string("output copy: eventfd: ") + std::strerror(errno));
  }
  // The writer takes no signal: SIGPIPE is an EPIPE to it, and a stop signal
  // goes to a thread that can act on it.
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  Status started;
  try {
    std::thread([state] { state->Writer(); }).detach();
  } catch (const std::system_error& e) {
    started = Status::Unavailable(std::string("output copy: cannot start a thread: ") + e.what());
  }
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (!started.ok()) return started;
  return std::unique_ptr<OutputCopy>(new OutputCopy(std::move(state)));
}

OutputCopy::~OutputCopy() {
  std::lock_guard lock(state_->mu);
  state_->closing = true;
  state_->cv.notify_all();
}

size_t OutputCopy::room() const {
  std::lock_guard lock(state_->mu);
  if (state_->failed) return state_->capacity;
  return state_->capacity - std::min(state_->capacity, state_->queued);
}

size_t OutputCopy::Push(std::string_view data, bool past_capacity) {
  if (data.empty()) return 0;
  std::lock_guard lock(state_->mu);
  State& s = *state_;
  if (s.failed) {
    s.dropped += data.size();
    return data.size();
  }
  const size_t limit = past_capacity ? 2 * s.capacity : s.capacity;
  const size_t take = std::min(data.size(), limit - std::min(limit, s.queued));
  if (past_capacity) s.dropped += data.size() - take;
  if (take == 0) return past_capacity ? data.size() : 0;
  s.queue.emplace_back(data.substr(0, take));
  s.queued += take;
  s.cv.notify_one();
  return past_capacity ? data.size() : take;
}

int OutputCopy::room_fd() const { return state_->room_fd; }

void OutputCopy::ClearRoomFd() {
  uint64_t n;
  (void)!::read(state_->room_fd, &n, sizeof n);
}

bool OutputCopy::Finish(const std::function<bool()>& stop) {
  std::unique_lock lock(state_->mu);
  for (;;) {
    if (state_->queue.empty()) return !state_->failed;
    if (stop && stop()) return false;
    state_->done.wait_for(lock, std::chrono::milliseconds(50));
  }
}

bool OutputCopy::failed() const {
  std::lock_guard lock(state_->mu);
  return state_->failed;
}

size_t OutputCopy::dropped() const {
  std::lock_guard lock(state_->mu);
  return state_->dropped;
}

}  // namespace dedup
