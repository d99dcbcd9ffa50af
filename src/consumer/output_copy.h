// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// OutputCopy: copies a handler's stdout to a descriptor (`dedup exec`'s own
// stdout) on a thread of its own, through a bounded buffer, so that the one who
// copies into it (HandlerSupervisor::Run's supervision loop) never waits on that
// descriptor's reader. A reader that stalls (`dedup exec ... | ssh`, a paused
// pager, a full pipe) used to block the supervision loop in write(): lease
// deadlines were not passed to the watchdog (which then SIGKILLed a healthy
// command), stop signals were not forwarded, and a command that had ended kept
// its claim renewed for as long as the reader stalled.
//
// Run() reads the handler's pipe only while room() > 0 and at most room()
// bytes: once `capacity` bytes wait for the reader, the handler's own writes
// wait (the handler, not the supervision). After the handler ended, what is
// left in its pipe is taken past the capacity (up to twice it; the rest is
// dropped and counted), so that the end of a command's output is not lost to
// a slow reader. A descriptor that refuses a write (EPIPE: the reader went
// away) ends the copy: everything is dropped from then on, and Push() takes
// whatever it is given, so the handler is never held up by a reader that is
// gone.
//
// The writer thread blocks every signal (SIGPIPE included: EPIPE is an answer)
// and is detached: the destructor does not wait for a write that may never
// end; the thread ends once its write returns (or with the process).

#ifndef DEDUP_CONSUMER_OUTPUT_COPY_H_
#define DEDUP_CONSUMER_OUTPUT_COPY_H_

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>

#include "dedup/status.h"

namespace dedup {

class OutputCopy {
 public:
  // Starts the writer thread for `fd` (not owned, never closed). Unavailable
  // when no thread or eventfd can be made.
  [[nodiscard]] static StatusOr<std::unique_ptr<OutputCopy>> Start(int fd, size_t capacity);
  ~OutputCopy();
  OutputCopy(const OutputCopy&) = delete;
  OutputCopy& operator=(const OutputCopy&) = delete;

  // Bytes Push() takes now without going past the capacity (the capacity
  // itself once the copy failed: nothing waits any more).
  size_t room() const;
  // Takes `data`: up to room() bytes, or with `past_capacity` up to twice the
  // capacity in all (the rest is dropped and counted). Returns the bytes it is
  // done with: those taken, and those dropped (with `past_capacity`, or once
  // the copy failed: all of them). Never blocks on the descriptor.
  size_t Push(std::string_view data, bool past_capacity = false);
  // Readable (POLLIN) once the writer has written something since the last
  // ClearRoomFd(): poll it in place of the handler's pipe while room() is 0.
  int room_fd() const;
  void ClearRoomFd();

  // Waits until everything taken is written, or the descriptor refused a write,
  // or `stop()` returns true (asked every 50 ms). True when everything taken
  // was written; false when stopped, or when the descriptor refused a write.
  bool Finish(const std::function<bool()>& stop);

  // The descriptor refused a write: what was left, and everything since, was
  // dropped.
  bool failed() const;
  // Bytes that did not reach the descriptor (refused, or past twice the
  // capacity), so far.
  size_t dropped() const;

  struct State;

 private:
  explicit OutputCopy(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

}  // namespace dedup

#endif  // DEDUP_CONSUMER_OUTPUT_COPY_H_
