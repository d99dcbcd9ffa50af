// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// LD_PRELOAD library for rocksdb_crash_test: what a power loss would keep of the
// RocksDB store is what was synced, and this notes, when a claim log is deleted,
// which write-ahead logs (*.log) and claim logs still hold writes that were never
// synced (write(2) since the file's last fsync/fdatasync). A claim log may only be
// deleted once the claims it held are durable elsewhere: with sync=interval, a
// claim older than the interval must survive a power loss (README).
//
// Each deletion of a CLAIMLOG-NNNNNN with an unsynced write-ahead log appends a
// line to the file named by DEDUP_SYNC_ORDER_REPORT:
//   deleted CLAIMLOG-000001 with unsynced /tmp/.../000004.log
// An unlink of a file named SYNC-PROBE appends a line for each claim log that
// holds unsynced writes at that moment:
//   probe: unsynced /tmp/.../CLAIMLOG-000001
// Nothing else changes: every call goes on to the C library's own.

#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

namespace {

std::mutex& Mu() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}
std::set<std::string>& Unsynced() {  // paths written since their last sync
  static auto* s = new std::set<std::string>;
  return *s;
}

template <typename F>
F Real(const char* name) {
  return reinterpret_cast<F>(dlsym(RTLD_NEXT, name));
}

std::string PathOf(int fd) {
  char link[64];
  std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  char buf[PATH_MAX];
  const ssize_t n = readlink(link, buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

bool Tracked(const std::string& path) {
  return path.ends_with(".log") || path.find("/CLAIMLOG-0") != std::string::npos;
}

void Written(int fd) {
  if (fd <= STDERR_FILENO) return;
  const std::string p = PathOf(fd);
  if (!Tracked(p)) return;
  std::lock_guard l(Mu());
  Unsynced().insert(p);
}

void Synced(int fd) {
  const std::string p = PathOf(fd);
  std::lock_guard l(Mu());
  Unsynced().erase(p);
}

// The unsynced paths that `pick` takes, each as the line it makes of it.
template <typename Pick>
std::string UnsyncedLines(Pick pick) {
  std::string lines;
  std::lock_guard l(Mu());
  for (const std::string& p : Unsynced()) lines += pick(p);
  return lines;
}

// Appends `lines` to the file named by DEDUP_SYNC_ORDER_REPORT.
void Report(const std::string& lines) {
  const char* report = std::getenv("DEDUP_SYNC_ORDER_REPORT");
  if (lines.empty() || report == nullptr) return;
  static auto real_write = Real<ssize_t (*)(int, const void*, size_t)>("write");
  const int fd = open(report, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)real_write(fd, lines.data(), lines.size());
  close(fd);
}

}  // namespace

extern "C" {

ssize_t write(int fd, const void* buf, size_t n) {
  static auto real = Real<ssize_t (*)(int, const void*, size_t)>("write");
  const ssize_t r = real(fd, buf, n);
  if (r > 0) Written(fd);
  return r;
}

ssize_t pwrite(int fd, const void* buf, size_t n, off_t at) {
  static auto real = Real<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite");
  const ssize_t r = real(fd, buf, n, at);
  if (r > 0) Written(fd);
  return r;
}

ssize_t pwrite64(int fd, const void* buf, size_t n, off_t at) {
  static auto real = Real<ssize_t (*)(int, const void*, size_t, off_t)>("pwrite64");
  const ssize_t r = real(fd, buf, n, at);
  if (r > 0) Written(fd);
  return r;
}

int fsync(int fd) {
  static auto real = Real<int (*)(int)>("fsync");
  const int r = real(fd);
  if (r == 0) Synced(fd);
  return r;
}

int fdatasync(int fd) {
  static auto real = Real<int (*)(int)>("fdatasync");
  const int r = real(fd);
  if (r == 0) Synced(fd);
  return r;
}

int unlink(const char* path) {
  static auto real = Real<int (*)(const char*)>("unlink");
  const char* base = std::strrchr(path, '/');
  base = base != nullptr ? base + 1 : path;
  if (std::strcmp(base, "SYNC-PROBE") == 0) {
    // The child asks: which claim logs hold writes never synced now?
    Report(UnsyncedLines([](const std::string& p) {
      return p.find("/CLAIMLOG-0") != std::string::npos ? "probe: unsynced " + p + "\n" : "";
    }));
  } else if (std::strncmp(base, "CLAIMLOG-0", 10) != 0) {
    // A write-ahead log RocksDB deletes (its records are in a table file): what
    // it held unsynced no longer matters.
    char full[PATH_MAX];
    if (realpath(path, full) != nullptr) {
      std::lock_guard l(Mu());
      Unsynced().erase(full);
    }
  } else {
    // A claim log deleted: which write-ahead logs hold writes never synced?
    Report(UnsyncedLines([base](const std::string& p) {
      return p.ends_with(".log") ? std::string("deleted ") + base + " with unsynced " + p + "\n" : "";
    }));
  }
  return real(path);
}

}  // extern "C"
