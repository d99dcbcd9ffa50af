// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// LD_PRELOAD library for rocksdb_crash_test: makes the RocksDB store's claim log
// appends (write(2) to a PATH/CLAIMLOG-NNNNNN) fail at the moment a test picks,
// without a full disk, and holds the writer or a reader at that moment, so that
// what a failed append races with is exercised deterministically. The child
// (rocksdb_crash_child) finds these functions with dlsym; nothing changes until
// it calls one:
//
//   dedup_fault_fail_appends(on)   every append fails (ENOSPC, nothing written)
//                                  while on; the database's files are untouched
//   dedup_fault_hold_next_append() the next append blocks until released, then
//                                  fails (ENOSPC, nothing written)
//   dedup_fault_tear_next_append() the next append writes half its frame (the
//                                  write returns short); the write of the rest
//                                  blocks until released, then fails (ENOSPC);
//                                  every later append fails until
//                                  dedup_fault_fail_appends(0)
//   dedup_fault_wait_held()        waits (10 s at most) until an append is held
//   dedup_fault_release()          lets the held append go on, and fail
//   dedup_fault_pause_reader()     the calling thread's next read(2) of a claim
//                                  log that returns bytes releases the held
//                                  append, then blocks until resumed
//   dedup_fault_wait_reader_paused(), dedup_fault_resume_reader()

#include <dlfcn.h>
#include <limits.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace {

using namespace std::chrono_literals;

struct State {
  std::mutex mu;
  std::condition_variable cv;
  bool fail = false;        // every append fails
  bool hold_next = false;   // the next append is held, then fails
  bool tear_next = false;   // the next append is written half
  bool torn = false;        // the write after the half one is held, then fails
  bool fail_after = false;  // once the held append failed: fail = true
  bool held = false;        // an append is held now
  bool released = false;
  bool reader_paused = false;
  bool reader_resumed = false;
};

State& S() {
  static State* s = new State;  // never destroyed: threads may still write at exit
  return *s;
}

// Anything armed: otherwise every call goes straight to the C library's own.
std::atomic<bool> armed{false};
thread_local bool pause_this_reader = false;

template <typename F>
F Real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

bool IsClaimLog(int fd) {
  if (fd <= STDERR_FILENO) return false;
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char buf[PATH_MAX];
  const ssize_t n = readlink(link, buf, sizeof buf - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  return std::strstr(buf, "/CLAIMLOG-0") != nullptr;
}

// Holds the calling append until released (10 s at most); then it fails.
ssize_t HoldThenFail(std::unique_lock<std::mutex>& l) {
  State& s = S();
  s.held = true;
  s.cv.notify_all();
  s.cv.wait_for(l, 10s, [&] { return s.released; });
  s.held = false;
  s.released = false;
  if (s.fail_after) s.fail = true;
  s.fail_after = false;
  errno = ENOSPC;
  return -1;
}

}  // namespace

extern "C" {

void dedup_fault_fail_appends(int on) {
  std::lock_guard l(S().mu);
  S().fail = on != 0;
  armed.store(true);
}

void dedup_fault_hold_next_append() {
  std::lock_guard l(S().mu);
  S().hold_next = true;
  armed.store(true);
}

void dedup_fault_tear_next_append() {
  std::lock_guard l(S().mu);
  S().tear_next = true;
  armed.store(true);
}

int dedup_fault_wait_held() {
  std::unique_lock l(S().mu);
  return S().cv.wait_for(l, 10s, [] { return S().held; }) ? 1 : 0;
}

void dedup_fault_release() {
  std::lock_guard l(S().mu);
  S().released = true;
  S().cv.notify_all();
}

void dedup_fault_pause_reader() {
  pause_this_reader = true;
  armed.store(true);
}

int dedup_fault_wait_reader_paused() {
  std::unique_lock l(S().mu);
  return S().cv.wait_for(l, 10s, [] { return S().reader_paused; }) ? 1 : 0;
}

void dedup_fault_resume_reader() {
  std::lock_guard l(S().mu);
  S().reader_resumed = true;
  S().cv.notify_all();
}

ssize_t write(int fd, const void* buf, size_t n) {
  static auto real = Real<ssize_t (*)(int, const void*, size_t)>("write");
  if (!armed.load(std::memory_order_relaxed) || !IsClaimLog(fd)) return real(fd, buf, n);
  State& s = S();
  std::unique_lock l(s.mu);
  if (s.tear_next && n >= 2) {
    s.tear_next = false;
    s.torn = true;
    s.fail_after = true;
    l.unlock();
    return real(fd, buf, n / 2);
  }
  if (s.torn || s.hold_next) {
    s.torn = s.hold_next = false;
    return HoldThenFail(l);
  }
  if (s.fail) {
    errno = ENOSPC;
    return -1;
  }
  l.unlock();
  return real(fd, buf, n);
}

ssize_t read(int fd, void* buf, size_t n) {
  static auto real = Real<ssize_t (*)(int, void*, size_t)>("read");
  const ssize_t r = real(fd, buf, n);
  if (!pause_this_reader || r <= 0 || !IsClaimLog(fd)) return r;
  pause_this_reader = false;
  State& s = S();
  std::unique_lock l(s.mu);
  s.reader_paused = true;
  s.released = true;  // the held append goes on (and fails) while this read's bytes are kept
  s.cv.notify_all();
  s.cv.wait_for(l, 10s, [&] { return s.reader_resumed; });
  return r;
}

}  // extern "C"
