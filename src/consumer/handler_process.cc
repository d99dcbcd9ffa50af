// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "consumer/handler_process.h"

#include "consumer/handler_cgroup.h"
#include "consumer/output_copy.h"
#include "core/printable.h"
#include "core/redact.h"
#include "core/secret.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <pthread.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>

extern char** environ;

namespace dedup {
namespace {

using Steady = std::chrono::steady_clock;

// One record of the watchdog's log, a pipe it reads only when asked to and once
// the owner is gone: writing a record wakes nobody. 16 bytes, below PIPE_BUF, so
// every write() is one whole record, never interleaved with another.
struct WatchMsg {
  int32_t op;
  int32_t pgid;     // kAdd, kRemove, kDeadline
  uint64_t cgroup;  // kAddCgroup, kRemoveCgroup: the child's number (HandlerCgroups::Name);
                    // kDeadline: CLOCK_MONOTONIC nanoseconds
};
static_assert(sizeof(WatchMsg) == 16 && sizeof(WatchMsg) <= PIPE_BUF);
constexpr int32_t kAdd = 1;
constexpr int32_t kRemove = 2;
constexpr int32_t kAddCgroup = 3;
constexpr int32_t kRemoveCgroup = 4;
// On the socket (the only thing sent there): "read your log now". Every
// kDrainEvery records one is sent, so that the log (a pipe holds at least 4096
// records) never fills; if it did, writers would wait for the watchdog, which
// reads it whole on every request it finds.
constexpr int32_t kDrain = 5;
constexpr uint64_t kDrainEvery = 64;
// The end of the lease of group `pgid`'s claim, as its owner last knew it: the
// watchdog SIGKILLs the group then, whatever state the owner is in (SIGSTOP, a
// frozen container, a debugger), so that a handler never outlives its lease.
// Followed by a kDrain on the socket, so that the watchdog reads it at once.
constexpr int32_t kDeadline = 6;

int64_t MonotonicNanos() {  // async-signal-safe; the clock of std::chrono::steady_clock
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Appends one record to the watchdog's log and, every kDrainEvery records, asks
// it on its socket to read the log. Async-signal-safe (a handler's vfork child
// calls it before exec). False when the record could not be written whole: the
// watchdog is gone (EPIPE; SIGPIPE is blocked by every caller).
bool AppendWatchLog(int log_fd, int watch_fd, std::atomic<uint64_t>& logged, const WatchMsg& m) {
  if (write(log_fd, &m, sizeof(m)) != static_cast<ssize_t>(sizeof(m))) return false;
  if (logged.fetch_add(1, std::memory_order_relaxed) % kDrainEvery == kDrainEvery - 1) {
    const WatchMsg drain{kDrain, 0, 0};
    (void)send(watch_fd, &drain, sizeof(drain), MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  return true;
}

// The watchdog's cgroup table: max_handlers times this (a cgroup that stays
// populated stays registered until it can be removed).
constexpr size_t kCgroupSlotsPerHandler = 2;

// How long the supervisor and the watchdog wait for a killed cgroup to empty.
constexpr Millis kCgroupEmptyLimit{5'000};

// What the watchdog knows of the handler cgroups (copied at its fork).
struct WatchCgroups {
  int dir_fd = -1;  // -1: none
  bool has_kill_file = false;
  const HandlerCgroups* names = nullptr;  // the fork's copy: Name() only
  uint64_t* slots = nullptr;
  size_t cap = 0;
  size_t n = 0;  // slots[0..n) filled before the fork
};

constexpr size_t kSpawnStack = 64 * 1024;
constexpr Millis kLeasePollInterval{50};
// After a handler exited and its group was killed, how long its stdout may stay
// open (held by a descendant that left the group) before we stop reading.
constexpr Millis kDrainLimit{1'000};

std::string Err(int e) { return std::strerror(e); }

// True while a process other than `leader` (exited, not reaped: it holds the
// group's id) and not a zombie is in process group `pgid`: /proc/N/stat's state
// and pgrp. kill(-pgid, 0) cannot tell, as the unreaped leader counts. Not
// async-signal-safe (the owner's thread only); without /proc, false.
bool OthersInGroup(pid_t pgid, pid_t leader) {
  DIR* dir = opendir("/proc");
  if (dir == nullptr) return false;
  bool found = false;
  char path[64], buf[512];
  while (!found) {
    const dirent* e = readdir(dir);
    if (e == nullptr) break;
    char* end = nullptr;
    const long n = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || n <= 0 || n == leader) continue;
    std::snprintf(path, sizeof(path), "/proc/%ld/stat", n);
    const int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    const ssize_t len = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (len <= 0) continue;
    buf[len] = '\0';
    // "pid (comm) state ppid pgrp ...": comm may hold ')' and spaces.
    const char* rp = std::strrchr(buf, ')');
    char state = 0;
    long ppid = 0, pgrp = 0;
    if (rp == nullptr || std::sscanf(rp + 1, " %c %ld %ld", &state, &ppid, &pgrp) != 3) continue;
    found = pgrp == pgid && state != 'Z' && state != 'X';
  }
  closedir(dir);
  return found;
}

// pidfd_open(2) (Linux 5.3): a descriptor that polls readable when `pid` exits.
// Called directly: glibc 2.36's <sys/pidfd.h> lacks C++ linkage. -1 when absent.
int PidfdOpen(pid_t pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

// Calls act(fd) for every open descriptor of this process: the one walker of the
// descriptor table. Used where close_range(2) is refused (before Linux 5.9;
// CLOSE_RANGE_CLOEXEC before 5.11; seccomp profiles that predate it, as older
// container runtimes'), and at Start to find the numbers handlers inherit.
// System calls only (a vfork child and the watchdog use it): the numbers come
// from getdents64 on /proc/self/fd (this process's own table; in a spawned
// child, a copy taken at clone that no other thread adds to); without /proc,
// every number below the descriptor limit (RLIMIT_NOFILE, at most 2^20) is
// tried. act returns true when it closed the descriptor: the listing is then
// read again from the start.
template <typename Act>
void ForEachOpenFd(Act act) {
  const int dir = open("/proc/self/fd", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) {
    rlimit lim{};
    const unsigned top = getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < (1u << 20)
                             ? static_cast<unsigned>(lim.rlim_cur)
                             : 1u << 20;
    for (unsigned fd = 0; fd < top; ++fd) {
      if (fcntl(static_cast<int>(fd), F_GETFD) >= 0) (void)act(fd);
    }
    return;
  }
  alignas(8) char buf[4096];
  for (;;) {
    const long n = syscall(SYS_getdents64, dir, buf, sizeof(buf));
    if (n <= 0) break;
    bool closed = false;
    for (long off = 0; off < n;) {
      // struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name.
      unsigned short reclen;
      std::memcpy(&reclen, buf + off + 16, sizeof(reclen));
      const char* name = buf + off + 19;
      off += reclen;
      unsigned fd = 0;
      bool number = *name != '\0';
      for (const char* c = name; number && *c != '\0'; ++c) {
        if (*c < '0' || *c > '9' || fd > (UINT_MAX - 9) / 10) number = false;
        else fd = fd * 10 + static_cast<unsigned>(*c - '0');
      }
      if (number && static_cast<int>(fd) != dir && act(fd)) closed = true;
    }
    if (closed) (void)lseek(dir, 0, SEEK_SET);
  }
  close(dir);
}

// Closes every open descriptor in the ranges [first, last] of ranges[0..n), or
// (cloexec) marks it close-on-exec: close_range(2), and where that is refused,
// one by one as ForEachOpenFd finds them. System calls only (the watchdog closes
// all but its own; a spawned child keeps the worker's descriptors from its exec).
void CloseFdRanges(const std::pair<unsigned, unsigned>* ranges, size_t n, bool cloexec) {
  for (size_t i = 0; i < n; ++i) {
    if (close_range(ranges[i].first, ranges[i].second, cloexec ? CLOSE_RANGE_CLOEXEC : 0) == 0) {
      continue;
    }
    ForEachOpenFd([&](unsigned fd) {
      for (size_t k = i; k < n; ++k) {  // the ranges before i are done
        if (fd < ranges[k].first || fd > ranges[k].second) continue;
        if (!cloexec) return close(static_cast<int>(fd)) == 0;
        (void)fcntl(static_cast<int>(fd), F_SETFD, FD_CLOEXEC);
        return false;
      }
      return false;
    });
    return;
  }
}

// The watchdog: a fork of the owner. Only async-signal-safe calls from here on.
// `slots[0..n)` and `cg.slots[0..cg.n)` are the live groups and cgroups, filled
// before the fork: the watchdog knows them from its first instruction.
[[noreturn]] void WatchdogMain(int fd, int log_fd, pid_t* slots, int64_t* deadlines, size_t cap,
                               size_t n, WatchCgroups cg) {
  setpgid(0, 0);  // out of the owner's group: `kill -9 -<owner group>` spares it
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  for (int s : {SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2, SIGPIPE, SIGALRM, SIGTSTP,
                SIGTTIN, SIGTTOU, SIGVTALRM, SIGPROF, SIGXCPU, SIGXFSZ, SIGWINCH, SIGURG, SIGIO,
                SIGPWR}) {
    sigaction(s, &ign, nullptr);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  prctl(PR_SET_NAME, "dedup-watchdog", 0, 0, 0);
  // Keep nothing of the owner's but our socket and log: an inherited pipe end (a
  // handler's stdout, the caller's $(...)) must not stay open because of us.
  const int sock = fcntl(fd, F_DUPFD, 64);
  const int log = fcntl(log_fd, F_DUPFD, 64);
  const int cg_dir = cg.dir_fd >= 0 ? fcntl(cg.dir_fd, F_DUPFD, 64) : -1;
  const int devnull = open("/dev/null", O_RDWR);
  if (sock < 0 || log < 0 || devnull < 0 || (cg.dir_fd >= 0 && cg_dir < 0)) _exit(1);
  dup2(devnull, 0);
  dup2(devnull, 1);
  dup2(devnull, 2);
  dup2(sock, 3);
  dup2(log, 4);
  if (cg_dir >= 0) dup2(cg_dir, 5);
  const unsigned keep = cg_dir >= 0 ? 6 : 5;
  const std::pair<unsigned, unsigned> not_ours{keep, ~0U};
  CloseFdRanges(&not_ours, 1, /*cloexec=*/false);
  fcntl(4, F_SETFL, O_NONBLOCK);
  size_t n_cg = cg.n;
  auto apply = [&](const WatchMsg& m) {
    if (m.op == kAddCgroup || m.op == kRemoveCgroup) {
      size_t i = 0;
      while (i < n_cg && cg.slots[i] != m.cgroup) ++i;
      if (m.op == kAddCgroup && i == n_cg && n_cg < cg.cap) {
        cg.slots[n_cg++] = m.cgroup;
      } else if (m.op == kRemoveCgroup && i < n_cg) {
        cg.slots[i] = cg.slots[--n_cg];
      }
      return;
    }
    if (m.pgid <= 1) return;
    size_t i = 0;
    while (i < n && slots[i] != m.pgid) ++i;
    if (m.op == kAdd && i == n && n < cap) {
      deadlines[n] = 0;
      slots[n++] = m.pgid;
    } else if (m.op == kRemove && i < n) {
      --n;
      slots[i] = slots[n];
      deadlines[i] = deadlines[n];
    } else if (m.op == kDeadline && i < n) {
      deadlines[i] = static_cast<int64_t>(m.cgroup);
    }
  };
  // Applies every record in the log, in the order written (one pipe: a group's
  // removal never overtakes its registration).
  auto drain = [&] {
    WatchMsg batch[256];
    for (;;) {
      const ssize_t r = read(4, batch, sizeof(batch));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) return;  // empty (EAGAIN), or every writer is gone
      for (size_t k = 0; k < static_cast<size_t>(r) / sizeof(WatchMsg); ++k) apply(batch[k]);
    }
  };
  for (;;) {
    // Asleep until the owner writes, or the earliest lease ends.
    int64_t earliest = INT64_MAX;
    for (size_t i = 0; i < n; ++i) {
      if (deadlines[i] > 0 && deadlines[i] < earliest) earliest = deadlines[i];
    }
    int timeout_ms = -1;
    if (earliest != INT64_MAX) {
      const int64_t left = earliest - MonotonicNanos();
      timeout_ms = left <= 0 ? 0 : static_cast<int>(std::min<int64_t>((left + 999'999) / 1'000'000, 1'000));
    }
    pollfd p{3, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) > 0) {
      WatchMsg m{};
      const ssize_t r = recv(3, &m, sizeof(m), 0);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) break;  // end of file: the owner is gone, however it went
    }
    drain();  // kDrain (the log is filling up, or a deadline moved), or a deadline is due
    // The owner says when a lease is renewed, and kills its handlers at the end
    // of one that is not; if it cannot (stopped, frozen), this does. The leader
    // is not reaped before its group is removed here, so the id is still its.
    const int64_t now = MonotonicNanos();
    for (size_t i = 0; i < n; ++i) {
      if (deadlines[i] > 0 && deadlines[i] <= now) {
        kill(-slots[i], SIGKILL);
        deadlines[i] = 0;
      }
    }
  }
  // Every record is in the log by now: a handler writes its own before exec,
  // while it still holds a copy of the owner's end of the socket.
  drain();
  for (size_t i = 0; i < n; ++i) kill(-slots[i], SIGKILL);
  if (n_cg > 0 && cg_dir >= 0) {
    char name[HandlerCgroups::kNameSize];
    for (size_t i = 0; i < n_cg; ++i) {
      cg.names->Name(cg.slots[i], name);
      (void)KillCgroup(5, name, cg.has_kill_file, Millis(1'000));
    }
    for (size_t i = 0; i < n_cg; ++i) {
      cg.names->Name(cg.slots[i], name);
      if (WaitCgroupEmpty(5, name, kCgroupEmptyLimit)) (void)RemoveCgroup(5, name);
    }
  }
  _exit(0);
}

// What the spawned child needs; built before clone, since the child may only
// make system calls (it shares our memory and runs while this thread waits).
struct SpawnArgs {
  const char* path = nullptr;
  char* const* argv = nullptr;
  char* const* sh_argv = nullptr;  // "/bin/sh path args...", for ENOEXEC, as execvp
  char* const* envp = nullptr;
  int stdin_fd = -1;
  int stdout_fd = -1;
  int watch_fd = -1;
  int log_fd = -1;                           // the watchdog's log (a pipe)
  std::atomic<uint64_t>* logged = nullptr;   // records written to it, for kDrain
  int cgroup_procs_fd = -1;  // the handler's cgroup's cgroup.procs, or -1
  const std::pair<unsigned, unsigned>* private_fds = nullptr;  // made close-on-exec
  size_t private_fd_ranges = 0;
  int cgroup_errno = 0;
  pid_t parent = 0;
  bool registered = false;
  int register_errno = 0;
  int exec_errno = 0;
};

int SpawnChild(void* p) {
  auto* a = static_cast<SpawnArgs*>(p);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int s = 1; s < NSIG; ++s) {
    if (s != SIGKILL && s != SIGSTOP) sigaction(s, &dfl, nullptr);
  }
  // Into the handler's cgroup first: whatever runs from here on is in it.
  if (a->cgroup_procs_fd >= 0) {
    if (const int e = JoinCgroup(a->cgroup_procs_fd); e != 0) {
      a->cgroup_errno = e;
      _exit(127);
    }
  }
  if (setpgid(0, 0) != 0) {
    a->exec_errno = errno;
    _exit(127);
  }
  prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  if (getppid() != a->parent) _exit(127);  // the owner died before prctl
  // Register our group in the watchdog's log while we still hold a copy of the
  // owner's end of its socket (closed at exec): the watchdog cannot see that end
  // close before our record is in the log, which it reads whole at that moment.
  // Nobody is woken (but every kDrainEvery-th record asks the watchdog to read).
  // A log without reader (the watchdog died) answers EPIPE; SIGPIPE stays
  // blocked and dies with us.
  if (!AppendWatchLog(a->log_fd, a->watch_fd, *a->logged,
                      WatchMsg{kAdd, static_cast<int32_t>(getpid()), 0})) {
    a->register_errno = errno != 0 ? errno : EPIPE;
    _exit(127);
  }
  a->registered = true;
  // None of the worker's own descriptors reach the handler (close_range, kernel
  // 5.11+; one by one where it is refused). Before stdin and stdout are set: a
  // standard number that was not open at Start is in a private range.
  CloseFdRanges(a->private_fds, a->private_fd_ranges, /*cloexec=*/true);
  if (a->stdin_fd >= 0) {
    if (a->stdin_fd == 0) fcntl(0, F_SETFD, 0);
    else dup2(a->stdin_fd, 0);
  }
  if (a->stdout_fd >= 0) {
    if (a->stdout_fd == 1) fcntl(1, F_SETFD, 0);
    else dup2(a->stdout_fd, 1);
  }
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(a->path, a->argv, a->envp);
  if (errno == ENOEXEC) execve("/bin/sh", a->sh_argv, a->envp);
  a->exec_errno = errno;
  _exit(127);
}

char* SpawnStack() {
  thread_local std::unique_ptr<char[]> stack;
  if (!stack) stack = std::make_unique<char[]>(kSpawnStack);
  auto top = reinterpret_cast<uintptr_t>(stack.get() + kSpawnStack);
  return reinterpret_cast<char*>(top & ~uintptr_t{15});
}

void CloseFd(int& fd) {
  if (fd >= 0) close(fd);
  fd = -1;
}

// A command's name in a message: a URL with a password as the command (a
// mistake, but a password) is shown redacted, as every URI is.
std::string Shown(const std::string& name) { return internal::RedactWords(name); }

Status StartError(const std::string& name, int e) {
  if (e == ENOENT || e == ENOTDIR) {
    return Status::NotFound("command '" + Shown(name) + "' not found");
  }
  if (e == EACCES || e == EPERM || e == EISDIR) {
    return Status::PermissionDenied("command '" + Shown(name) +
                                    "' is not executable: " + Err(e));
  }
  if (e == ENOEXEC) {
    return Status::FailedPrecondition("command '" + Shown(name) +
                                      "' is not an executable file");
  }
  return Status::Unavailable("cannot start '" + Shown(name) + "': " + Err(e));
}

// StartError for an execve of `path` that failed: where that errno alone would
// mislead, one stat (on the failure path only) names what it means.
Status ExecError(const std::string& name, const std::string& path, int e) {
  struct stat st {};
  if (e == ENOENT && stat(path.c_str(), &st) == 0) {  // the file is there
    return Status::NotFound("command '" + Shown(name) +
                            "' cannot start: the interpreter its #! line names (or its ELF "
                            "loader) was not found");
  }
  if (e == EACCES && stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) e = EISDIR;
  return StartError(name, e);
}

const char* SignalName(int sig) {
  const char* d = strsignal(sig);
  return d != nullptr ? d : "unknown";
}

}  // namespace

// ---- policy ------------------------------------------------------------------

std::string HandlerExit::Describe() const {
  std::string how_it_ended =
      signal != 0 ? "killed by signal " + std::to_string(signal) + " (" + SignalName(signal) + ")"
                  : "exit " + std::to_string(code);
  if (via_shell) how_it_ended += " (the shell's exit " + std::to_string(code) + ")";
  switch (how) {
    case How::kExited:
    case How::kSignaled:
      return how_it_ended;
    case How::kStopped:
      return std::string("stopped: ") +
             (reason == StopReason::kLeaseLost ? "lease lost" : "stop requested") + " (" +
             how_it_ended + ")";
  }
  return how_it_ended;
}

HandlerVerdict Judge(const HandlerExit& e) {
  if (e.how != HandlerExit::How::kExited) return HandlerVerdict::kRetry;
  if (e.code == 0) return HandlerVerdict::kDone;
  if (e.code == kHandlerExitRetry) return HandlerVerdict::kRetry;
  if (e.code == kHandlerExitCannotExec || e.code == kHandlerExitNotFound) {
    return HandlerVerdict::kNotStarted;
  }
  return HandlerVerdict::kFail;
}

HandlerResult ToHandlerResult(const StatusOr<HandlerExit>& run, bool keep_output) {
  if (!run.ok()) return HandlerResult::Retry("cannot start handler: " + run.status().ToString());
  switch (Judge(*run)) {
    case HandlerVerdict::kDone:
      return HandlerResult::Done(keep_output ? run->output : std::string());
    case HandlerVerdict::kFail:
      return HandlerResult::Fail("handler " + run->Describe());
    case HandlerVerdict::kNotStarted:
      return HandlerResult::Retry("handler could not be started (" + run->Describe() +
                                  ": the shell's code for not executable / not found)");
    case HandlerVerdict::kRetry:
      break;
  }
  return HandlerResult::Retry("handler " + run->Describe() +
                              (run->how == HandlerExit::How::kExited ? " (retry later)" : ""));
}

namespace {

// A script's #! line as the kernel reads it (binfmt_script): after "#!" and
// blanks, the interpreter runs to the next blank or the line's end; a '\r' (a
// file saved with CRLF ends) is part of its name. One that is not there makes
// execve fail ENOENT at every run (the shell: 127): said once, at start.
Status CheckInterpreter(const std::string& path, const std::string& name) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return Status::Ok();  // executable but not readable: execve's to judge
  char buf[256];
  const ssize_t r = read(fd, buf, sizeof buf);
  close(fd);
  if (r < 2 || buf[0] != '#' || buf[1] != '!') return Status::Ok();
  std::string_view line(buf + 2, static_cast<size_t>(r) - 2);
  const size_t nl = line.find('\n');
  if (nl == std::string_view::npos && static_cast<size_t>(r) == sizeof buf) return Status::Ok();
  line = line.substr(0, nl);
  const size_t b = line.find_first_not_of(" \t");
  if (b == std::string_view::npos) return Status::Ok();  // "#!" alone: sh runs it itself
  const std::string interp(line.substr(b, line.find_first_of(" \t", b) - b));
  struct stat st {};
  if (stat(interp.c_str(), &st) == 0 || (errno != ENOENT && errno != ENOTDIR)) {
    return Status::Ok();
  }
  return Status::NotFound("command '" + Shown(name) + "' cannot start: the interpreter its #! " +
                          "line names ('" + internal::Printable(interp) + "') was not found");
}

// ResolveCommand; `interpreter` false on the spawn path, which must not pay an
// open and a read per message (the check was made at start).
StatusOr<std::string> Resolve(std::string_view name, bool interpreter) {
  if (name.empty()) return Status::InvalidArgument("empty command");
  auto check = [](const std::string& p) -> int {
    struct stat st {};
    if (stat(p.c_str(), &st) != 0) return errno;
    if (S_ISDIR(st.st_mode)) return EISDIR;
    return access(p.c_str(), X_OK) == 0 ? 0 : errno;
  };
  const std::string n(name);
  if (n.find('/') != std::string::npos) {
    const int e = check(n);
    if (e != 0) return StartError(n, e);
    if (interpreter) DEDUP_RETURN_IF_ERROR(CheckInterpreter(n, n));
    return n;
  }
  const char* env_path = std::getenv("PATH");
  const std::string path = env_path != nullptr ? env_path : "/usr/local/bin:/bin:/usr/bin";
  int seen = ENOENT;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find(':', start);
    if (end == std::string::npos) end = path.size();
    std::string dir = path.substr(start, end - start);
    if (dir.empty()) dir = ".";
    const std::string candidate = dir + "/" + n;
    const int e = check(candidate);
    if (e == 0) {
      if (interpreter) DEDUP_RETURN_IF_ERROR(CheckInterpreter(candidate, n));
      return candidate;
    }
    if (e != ENOENT && e != ENOTDIR) seen = e;
    start = end + 1;
  }
  if (seen == ENOENT) return Status::NotFound("command '" + Shown(n) + "' not found in PATH");
  return StartError(n, seen);
}

}  // namespace

StatusOr<std::string> ResolveCommand(std::string_view name) { return Resolve(name, true); }

// ---- the supervisor ------------------------------------------------------------

namespace {

// Open and not close-on-exec: a descriptor a child inherits.
bool Inheritable(int fd) {
  const int flags = fcntl(fd, F_GETFD);
  return flags >= 0 && (flags & FD_CLOEXEC) == 0;
}

// The descriptor numbers that no child would inherit now (not open, or open
// close-on-exec: a library's, whose number is reused once it closes), as
// [first, last] ranges, the last one open-ended. 0 to 2 too: a process started
// with them closed gives its handlers none, whatever lands there later.
std::vector<std::pair<unsigned, unsigned>> FdNumbersNotOpen() {
  std::vector<unsigned> open;
  ForEachOpenFd([&open](unsigned fd) {
    if (Inheritable(static_cast<int>(fd))) open.push_back(fd);
    return false;
  });
  std::sort(open.begin(), open.end());
  std::vector<std::pair<unsigned, unsigned>> ranges;
  unsigned next = 0;
  for (unsigned fd : open) {
    if (fd > next) ranges.emplace_back(next, fd - 1);
    next = fd + 1;
  }
  ranges.emplace_back(next, ~0U);
  return ranges;
}

}  // namespace

HandlerSupervisor::HandlerSupervisor(SupervisorOptions options) : options_(options) {}

StatusOr<std::unique_ptr<HandlerSupervisor>> HandlerSupervisor::Start(SupervisorOptions options) {
  if (options.grace.count() <= 0) {
    return Status::InvalidArgument("handler stop grace must be positive, got " +
                                   std::to_string(options.grace.count()) + " ms");
  }
  if (options.max_handlers == 0) return Status::InvalidArgument("max_handlers must be positive");
  std::unique_ptr<HandlerSupervisor> s(new HandlerSupervisor(options));
  s->private_fds_ = FdNumbersNotOpen();
  if (!options.cgroup.empty()) {
    auto opened = HandlerCgroups::Open(options.cgroup);
    if (!opened.ok()) return opened.status();
    s->cgroups_ = std::move(opened).value();
  }
  s->stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->stop_fd_ < 0) return Status::Unavailable("eventfd: " + Err(errno));
  std::lock_guard lock(s->mu_);
  DEDUP_RETURN_IF_ERROR(s->StartWatchdog());
  return s;
}

Status HandlerSupervisor::StartWatchdog() {
  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    return Status::Unavailable("watchdog socket: " + Err(errno));
  }
  int lp[2];
  if (pipe2(lp, O_CLOEXEC) != 0) {
    const int e = errno;
    close(sv[0]);
    close(sv[1]);
    return Status::Unavailable("watchdog log: " + Err(e));
  }
  // The child's copy is its table, filled here (mu_ is held) with every live
  // group and cgroup: a watchdog restarted just before the owner dies already
  // knows them all, there is no window in which it has yet to be told.
  std::vector<pid_t> slots(std::max(options_.max_handlers, live_.size()));
  std::copy(live_.begin(), live_.end(), slots.begin());
  // No deadlines yet: each running handler's loop sends its own to a new
  // watchdog (its generation changed) within one look at its lease.
  std::vector<int64_t> deadlines(slots.size(), 0);
  // Cgroups that could not be removed stay registered: room for as many again
  // (RegisterCgroup refuses more, so the watchdog never drops one).
  std::vector<uint64_t> cg_slots(cgroups_ ? kCgroupSlotsPerHandler * options_.max_handlers : 0);
  WatchCgroups cg;
  if (cgroups_) {
    std::copy(live_cgroups_.begin(), live_cgroups_.end(), cg_slots.begin());
    cg.dir_fd = cgroups_->dir_fd();
    cg.has_kill_file = cgroups_->has_kill_file();
    cg.names = cgroups_.get();
    cg.slots = cg_slots.data();
    cg.cap = cg_slots.size();
    cg.n = live_cgroups_.size();
  }
  const pid_t pid = fork();
  if (pid < 0) {
    const int e = errno;
    for (int fd : {sv[0], sv[1], lp[0], lp[1]}) close(fd);
    return Status::Unavailable("watchdog fork: " + Err(e));
  }
  if (pid == 0) {
    close(sv[0]);
    close(lp[1]);
    WatchdogMain(sv[1], lp[0], slots.data(), deadlines.data(), slots.size(), live_.size(), cg);
  }
  close(sv[1]);
  close(lp[0]);  // the watchdog holds the only reader: a write after its death is EPIPE
  int pidfd = PidfdOpen(pid);  // -1 on kernels before 5.3: no early restart then
  // Keep the fd numbers across restarts (dup3 replaces atomically), so that a
  // spawn racing with a restart never writes to an unrelated, reused number.
  if (watch_fd_ < 0) {
    watch_fd_ = sv[0];
    log_fd_ = lp[1];
  } else {
    dup3(sv[0], watch_fd_, O_CLOEXEC);
    close(sv[0]);
    dup3(lp[1], log_fd_, O_CLOEXEC);
    close(lp[1]);
  }
  if (pidfd >= 0) {
    if (watch_pidfd_ < 0) {
      watch_pidfd_ = pidfd;
    } else {
      dup3(pidfd, watch_pidfd_, O_CLOEXEC);
      close(pidfd);
    }
  }
  watchdog_pid_.store(pid);
  generation_.fetch_add(1);
  return Status::Ok();
}

Status HandlerSupervisor::RestartWatchdog(uint64_t seen_generation, bool socket_refused) {
  std::lock_guard lock(mu_);
  if (generation_.load() != seen_generation) return Status::Ok();  // done by another thread
  const pid_t old = watchdog_pid_.load();
  siginfo_t info{};
  // Its log refused us (no reader): it is exiting (descriptors close just
  // before it turns into a zombie), so wait for it; else only reap it if it is
  // already dead.
  const int flags = socket_refused ? WEXITED : WEXITED | WNOHANG;
  int w;
  while ((w = waitid(P_PID, static_cast<id_t>(old), &info, flags)) < 0 && errno == EINTR) {
  }
  if (old > 0 && w == 0 && info.si_pid == 0) return Status::Ok();  // alive: nothing to do
  return StartWatchdog();
}

// Appends a record to the watchdog's log (mu_ held, SIGPIPE blocked on this
// thread: Run() blocks it). A failure means the watchdog is gone; the next one
// starts with live_ and live_cgroups_ in its table.
void HandlerSupervisor::Log(int32_t op, pid_t pgid, uint64_t cgroup) {
  (void)AppendWatchLog(log_fd_, watch_fd_, logged_,
                       WatchMsg{op, static_cast<int32_t>(pgid), cgroup});
}

void HandlerSupervisor::Register(pid_t pgid, uint64_t generation_before) {
  std::lock_guard lock(mu_);
  live_.push_back(pgid);
  // A new watchdog started since the child registered with the old one.
  if (generation_.load() != generation_before) Log(kAdd, pgid, 0);
}

void HandlerSupervisor::SetDeadline(pid_t pgid, Steady::time_point deadline) {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         deadline.time_since_epoch()).count();
  if (ns <= 0) return;  // nothing held: the loop itself stops the handler
  std::lock_guard lock(mu_);
  Log(kDeadline, pgid, static_cast<uint64_t>(ns));
  const WatchMsg wake{kDrain, 0, 0};
  (void)send(watch_fd_, &wake, sizeof(wake), MSG_NOSIGNAL | MSG_DONTWAIT);
}

void HandlerSupervisor::Unregister(pid_t pgid) {
  std::lock_guard lock(mu_);
  auto it = std::find(live_.begin(), live_.end(), pgid);
  if (it != live_.end()) live_.erase(it);
  Log(kRemove, pgid, 0);
}

// Before the cgroup exists: a watchdog that sees its owner go always knows it.
// If the send fails (the watchdog is dying), the restarted one has live_cgroups_ in its table.
bool HandlerSupervisor::RegisterCgroup(uint64_t id) {
  std::lock_guard lock(mu_);
  if (live_cgroups_.size() >= kCgroupSlotsPerHandler * options_.max_handlers) ReapLeftoverCgroups();
  if (live_cgroups_.size() >= kCgroupSlotsPerHandler * options_.max_handlers) return false;
  live_cgroups_.push_back(id);
  Log(kAddCgroup, 0, id);
  return true;
}

void HandlerSupervisor::KeepLeftoverCgroup(uint64_t id) {
  std::lock_guard lock(mu_);
  leftover_cgroups_.push_back(id);
}

// Kills each leftover again, gives it a moment to empty, and removes it with the
// child cgroups a handler may have made inside it; what goes is unregistered. A
// process stuck in the kernel keeps its cgroup, and its slot, until it ends.
void HandlerSupervisor::ReapLeftoverCgroups() {
  for (auto it = leftover_cgroups_.begin(); it != leftover_cgroups_.end();) {
    char name[HandlerCgroups::kNameSize];
    cgroups_->Name(*it, name);
    (void)KillCgroup(cgroups_->dir_fd(), name, cgroups_->has_kill_file(), Millis(100));
    if (!WaitCgroupEmpty(cgroups_->dir_fd(), name, Millis(100)) ||
        !RemoveCgroupTree(cgroups_->dir_fd(), name)) {
      ++it;
      continue;
    }
    if (auto live = std::find(live_cgroups_.begin(), live_cgroups_.end(), *it); live != live_cgroups_.end()) {
      live_cgroups_.erase(live);
    }
    Log(kRemoveCgroup, 0, *it);
    it = leftover_cgroups_.erase(it);
  }
}

void HandlerSupervisor::UnregisterCgroup(uint64_t id) {
  std::lock_guard lock(mu_);
  auto it = std::find(live_cgroups_.begin(), live_cgroups_.end(), id);
  if (it != live_cgroups_.end()) live_cgroups_.erase(it);
  Log(kRemoveCgroup, 0, id);
}

HandlerSupervisor::~HandlerSupervisor() {
  {
    std::lock_guard lock(mu_);
    for (pid_t g : live_) kill(-g, SIGKILL);
    if (cgroups_) {
      char name[HandlerCgroups::kNameSize];
      for (uint64_t id : live_cgroups_) {
        cgroups_->Name(id, name);
        (void)KillCgroup(cgroups_->dir_fd(), name, cgroups_->has_kill_file(), Millis(1'000));
      }
      for (uint64_t id : live_cgroups_) {
        cgroups_->Name(id, name);
        if (WaitCgroupEmpty(cgroups_->dir_fd(), name, kCgroupEmptyLimit)) {
          (void)RemoveCgroupTree(cgroups_->dir_fd(), name);
        }
      }
    }
  }
  if (log_fd_ >= 0) close(log_fd_);
  if (watch_fd_ >= 0) close(watch_fd_);  // the watchdog sees end of file and exits
  const pid_t w = watchdog_pid_.load();
  if (w > 0) {
    while (waitpid(w, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  if (watch_pidfd_ >= 0) close(watch_pidfd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

void HandlerSupervisor::RequestStop(int sig) {
  int expected = 0;
  stop_signal_.compare_exchange_strong(expected, sig > 0 ? sig : SIGTERM);
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
}

size_t HandlerSupervisor::running() const { return running_.load(); }

StatusOr<HandlerExit> HandlerSupervisor::Run(const HandlerCommand& cmd, const ClaimGuard* claim) {
  if (cmd.argv.empty()) return Status::InvalidArgument("no command to run");
  if (stop_requested()) return Status(StatusCode::kAborted, "stopping: no new handler is started");
  // A name without '/' is looked up in PATH here. A path is handed to execve
  // as it is: a missing or unexecutable file fails there with the errno that
  // ResolveCommand would have found (StartError maps both the same way), so the
  // stat and access of every spawn are not made twice.
  std::string path;
  if (cmd.argv[0].find('/') != std::string::npos) {
    path = cmd.argv[0];
  } else {
    StatusOr<std::string> resolved = Resolve(cmd.argv[0], /*interpreter=*/false);
    if (!resolved.ok()) return resolved.status();
    path = *std::move(resolved);
  }
  if (claim != nullptr && !claim->active()) claim = nullptr;  // nothing held to watch
  if (running_.fetch_add(1) >= options_.max_handlers) {
    running_.fetch_sub(1);
    return Status::ResourceExhausted("more than " + std::to_string(options_.max_handlers) +
                                     " handlers at once");
  }
  struct Running {
    std::atomic<size_t>& n;
    ~Running() { n.fetch_sub(1); }
  } running_guard{running_};

  // Everything the child needs, built before it exists: pointer arrays only.
  // execve copies the strings and writes none of them, so they point into
  // environ, cmd and path (no copy of the environment per spawn). The worker's
  // secrets (DEDUP_REDIS_PASSWORD: core/secret.h) are left out; cmd.env may
  // still give one.
  std::vector<char*> envp, argv, sh_argv;
  envp.reserve(64);
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view kv(*e);
    const std::string_view name = kv.substr(0, kv.find('='));
    bool skip = false;
    for (const char* secret : internal::kSecretEnvVars) skip = skip || name == secret;
    for (const auto& x : cmd.env) {
      if (std::string_view(x).substr(0, x.find('=')) == name) skip = true;
    }
    if (!skip) envp.push_back(*e);
  }
  for (const auto& x : cmd.env) envp.push_back(const_cast<char*>(x.c_str()));
  envp.push_back(nullptr);
  static char kShell[] = "/bin/sh";
  sh_argv.push_back(kShell);
  sh_argv.push_back(path.data());
  for (size_t i = 0; i < cmd.argv.size(); ++i) {
    argv.push_back(const_cast<char*>(cmd.argv[i].c_str()));
    if (i > 0) sh_argv.push_back(const_cast<char*>(cmd.argv[i].c_str()));
  }
  argv.push_back(nullptr);
  sh_argv.push_back(nullptr);

  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1}, devnull = -1;
  auto close_all = [&] {
    CloseFd(in_pipe[0]), CloseFd(in_pipe[1]), CloseFd(out_pipe[0]), CloseFd(out_pipe[1]);
    CloseFd(devnull);
  };
  if (cmd.stdin_data && pipe2(in_pipe, O_CLOEXEC) != 0) {
    return Status::Unavailable("pipe: " + Err(errno));
  }
  if (!cmd.stdin_data && isatty(STDIN_FILENO)) {
    // A handler runs in a background process group: reading a terminal would
    // stop it (SIGTTIN) for good.
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if ((cmd.capture_stdout || cmd.tee != nullptr) && pipe2(out_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    close_all();
    return Status::Unavailable("pipe: " + Err(e));
  }

  // SIGPIPE from writing the stdin of a handler that exited early must not kill
  // us: blocked on this thread while it runs, and a pending one dropped at the end.
  sigset_t pipe_set, saved_mask;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &saved_mask);
  struct RestoreMask {
    const sigset_t& pipe_set;
    const sigset_t& saved;
    ~RestoreMask() {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) && !sigismember(&saved, SIGPIPE)) {
        const timespec zero{0, 0};
        sigtimedwait(&pipe_set, nullptr, &zero);
      }
      pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    }
  } restore_mask{pipe_set, saved_mask};

  // With a handler cgroup: a child cgroup of its own, registered with the
  // watchdog before it exists. Killed, waited for and removed on every way out.
  struct HandlerCgroup {
    HandlerSupervisor& sup;
    const HandlerCgroups* dir = nullptr;
    uint64_t id = 0;
    char name[HandlerCgroups::kNameSize] = "";
    int procs_fd = -1;
    void Kill() const {
      if (dir != nullptr) (void)KillCgroup(dir->dir_fd(), name, dir->has_kill_file(), Millis(1'000));
    }
    // Kills it, waits until it is empty and removes it. One that stays
    // populated (a process stuck in the kernel) stays registered: the watchdog
    // and ~HandlerSupervisor kill and remove it later.
    void Finish() {
      if (dir == nullptr) return;
      CloseFd(procs_fd);
      Kill();
      if (WaitCgroupEmpty(dir->dir_fd(), name, kCgroupEmptyLimit) &&
          RemoveCgroupTree(dir->dir_fd(), name)) {
        sup.UnregisterCgroup(id);
      } else {
        sup.KeepLeftoverCgroup(id);
      }
      dir = nullptr;
    }
    ~HandlerCgroup() { Finish(); }
  } cgroup{*this};
  if (cgroups_) {
    for (int tries = 0;; ++tries) {
      const uint64_t id = next_cgroup_.fetch_add(1);
      cgroups_->Name(id, cgroup.name);
      if (!RegisterCgroup(id)) {
        close_all();
        return Status::Unavailable(
            "cannot start handler: handler cgroup '" + cgroups_->dir() + "': " +
            std::to_string(kCgroupSlotsPerHandler * options_.max_handlers) +
            " child cgroups registered, some still populated after their handler ended "
            "(a process stuck in the kernel?); none more until they are removed");
      }
      const int fd = cgroups_->Create(cgroup.name);
      if (fd >= 0) {
        cgroup.dir = cgroups_.get();
        cgroup.id = id;
        cgroup.procs_fd = fd;
        break;
      }
      UnregisterCgroup(id);
      if (fd != -EEXIST || tries >= 8) {  // EEXIST: taken (not ours): a new name
        close_all();
        return Status::Unavailable("cannot start handler: handler cgroup '" + cgroups_->dir() +
                                   "/" + cgroup.name + "': " + Err(-fd));
      }
    }
  }

  SpawnArgs a;
  pid_t pid = -1;
  for (int tries = 0;; ++tries) {
    a = SpawnArgs{};
    a.path = path.c_str();
    a.argv = argv.data();
    a.sh_argv = sh_argv.data();
    a.envp = envp.data();
    a.stdin_fd = in_pipe[0] >= 0 ? in_pipe[0] : devnull;
    a.stdout_fd = out_pipe[1];
    a.watch_fd = watch_fd_;
    a.log_fd = log_fd_;
    a.logged = &logged_;
    a.cgroup_procs_fd = cgroup.procs_fd;
    a.private_fds = private_fds_.data();
    a.private_fd_ranges = private_fds_.size();
    a.parent = getpid();
    const uint64_t generation = generation_.load();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid = clone(SpawnChild, SpawnStack(), CLONE_VM | CLONE_VFORK | SIGCHLD, &a);
    const int clone_errno = errno;
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    if (pid < 0) {
      close_all();
      return Status::Unavailable("cannot start handler: clone: " + Err(clone_errno));
    }
    if (a.registered) {
      Register(pid, generation);
      break;
    }
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    if (a.register_errno == 0 || tries >= 2) {
      close_all();
      if (a.cgroup_errno != 0) {
        return Status::Unavailable("cannot start handler: cannot move it into handler cgroup '" +
                                   cgroups_->dir() + "/" + cgroup.name + "': " +
                                   Err(a.cgroup_errno));
      }
      if (a.exec_errno != 0) return ExecError(cmd.argv[0], path, a.exec_errno);
      if (a.register_errno == 0) return Status::Unavailable("cannot start handler: setup failed");
      return Status::Unavailable("cannot start handler: the handler watchdog is gone (" +
                                 Err(a.register_errno) + ")");
    }
    // The watchdog died: start a new one and try again.
    DEDUP_RETURN_IF_ERROR(RestartWatchdog(
        generation, a.register_errno == EPIPE || a.register_errno == ECONNRESET));
  }
  CloseFd(in_pipe[0]);
  CloseFd(out_pipe[1]);
  CloseFd(devnull);
  CloseFd(cgroup.procs_fd);
  if (a.exec_errno != 0) {
    kill(-pid, SIGKILL);
    Unregister(pid);
    while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
    }
    close_all();
    return ExecError(cmd.argv[0], path, a.exec_errno);
  }
  const int pidfd = PidfdOpen(pid);

  HandlerExit res;
  size_t written = 0;
  int in_fd = in_pipe[1], out_fd = out_pipe[0];
  in_pipe[1] = out_pipe[0] = -1;
  if (in_fd >= 0) fcntl(in_fd, F_SETFL, O_NONBLOCK);
  if (in_fd >= 0 && !cmd.stdin_data->empty()) {
    // A message fits in the pipe: written now, not after a first poll() says so.
    const ssize_t w = write(in_fd, cmd.stdin_data->data(), cmd.stdin_data->size());
    if (w > 0) written = static_cast<size_t>(w);
    if (w < 0 && errno != EAGAIN && errno != EINTR) CloseFd(in_fd);  // stdin closed already
  }
  if (in_fd >= 0 && written == cmd.stdin_data->size()) CloseFd(in_fd);
  char buf[65536];
  // With a copy (cmd.tee), the pipe is read only while the copy has room, and
  // no more than that: a reader of the copy that stalls holds the handler's
  // writes up, never this loop. Once the handler has ended (`ended`), what is
  // left in the pipe is taken past the copy's capacity (OutputCopy::Push).
  auto read_size = [&]() -> size_t {
    return cmd.tee != nullptr ? std::min(sizeof(buf), cmd.tee->room()) : sizeof(buf);
  };
  auto consume = [&](ssize_t r, bool ended) {
    if (cmd.tee != nullptr) {
      (void)cmd.tee->Push(std::string_view(buf, static_cast<size_t>(r)), ended);
    }
    if (cmd.capture_stdout) {
      const size_t room = cmd.max_output - std::min(cmd.max_output, res.output.size());
      res.output.append(buf, std::min(room, static_cast<size_t>(r)));
      if (static_cast<size_t>(r) > room) res.truncated = true;
    }
  };

  // Stopping: the signal sent, when SIGKILL follows.
  bool stopping = false, killed = false;
  Steady::time_point kill_at = Steady::time_point::max();
  const Millis lease = claim != nullptr ? claim->lease() : Millis(0);
  const Millis lease_margin = std::min<Millis>(options_.grace, lease / 4);
  auto begin_stop = [&](HandlerExit::StopReason why, int sig, Millis grace) {
    stopping = true;
    res.reason = why;
    kill(-pid, sig);
    kill_at = Steady::now() + grace;
  };
  bool exited = false, watch_restart_failed = false, reaped_elsewhere = false;
  // The lease's end as last told to the watchdog (and to which one).
  Steady::time_point told_deadline{};
  // The first deadline told: the watchdog may still act on any one told since
  // (it reads them asynchronously), the first being the earliest.
  Steady::time_point first_told_deadline{};
  uint64_t told_generation = 0;
  siginfo_t info{};
  while (!exited) {
    if (claim != nullptr && !killed) {
      const auto deadline = claim->lease_deadline();
      if (deadline != told_deadline || generation_.load() != told_generation) {
        told_generation = generation_.load();
        told_deadline = deadline;
        if (first_told_deadline == Steady::time_point{}) first_told_deadline = deadline;
        SetDeadline(pid, deadline);
      }
    }
    const auto now = Steady::now();
    if (!stopping) {
      if (const int sig = stop_signal_.load(); sig != 0) {
        begin_stop(HandlerExit::StopReason::kStopRequested, sig, options_.grace);
      } else if (claim != nullptr &&
                 (claim->lost() || now + lease_margin >= claim->lease_deadline())) {
        begin_stop(HandlerExit::StopReason::kLeaseLost, SIGTERM, lease_margin);
      }
    }
    if (stopping && !killed &&
        (Steady::now() >= kill_at || (claim != nullptr && Steady::now() >= claim->lease_deadline()))) {
      kill(-pid, SIGKILL);  // the leader is not reaped yet: the group id is still ours
      cgroup.Kill();        // and whatever left the group
      killed = true;
    }
    // How long to sleep: until SIGKILL is due, or the next look at the lease.
    int timeout_ms = -1;
    auto wake = Steady::time_point::max();
    if (stopping && !killed) wake = kill_at;
    if (claim != nullptr && !killed) {
      wake = std::min(wake, Steady::now() + kLeasePollInterval);
      // Also at the moments themselves, not at the next look: SIGTERM when the
      // margin is reached, SIGKILL at the lease's end (a look every 50 ms let
      // the handler run up to ~20 ms past it, when a takeover may begin).
      const auto deadline = claim->lease_deadline();
      if (deadline != Steady::time_point::min()) {
        wake = std::min(wake, stopping ? deadline : deadline - lease_margin);
      }
    }
    if (pidfd < 0) wake = std::min(wake, Steady::now() + Millis(10));
    if (wake != Steady::time_point::max()) {
      const auto left = std::chrono::duration_cast<Millis>(wake - Steady::now()).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(left + 1, 0, 1'000));
    }
    pollfd fds[6];
    int n = 0, i_in = -1, i_out = -1, i_room = -1, i_exit = -1, i_watch = -1;
    if (in_fd >= 0) i_in = n, fds[n++] = {in_fd, POLLOUT, 0};
    if (out_fd >= 0 && read_size() > 0) i_out = n, fds[n++] = {out_fd, POLLIN, 0};
    else if (out_fd >= 0) i_room = n, fds[n++] = {cmd.tee->room_fd(), POLLIN, 0};
    if (pidfd >= 0) i_exit = n, fds[n++] = {pidfd, POLLIN, 0};
    if (!stopping) fds[n++] = {stop_fd_, POLLIN, 0};  // RequestStop() wakes us
    if (watch_pidfd_ >= 0 && !watch_restart_failed) i_watch = n, fds[n++] = {watch_pidfd_, POLLIN, 0};
    const uint64_t generation = generation_.load();
    const int pr = poll(fds, static_cast<nfds_t>(n), timeout_ms);
    if (pr < 0) continue;  // EINTR, or a transient ENOMEM: look again
    if (pr > 0 && i_in >= 0 && fds[i_in].revents != 0) {
      const ssize_t w = write(in_fd, cmd.stdin_data->data() + written,
                              cmd.stdin_data->size() - written);
      if (w > 0) written += static_cast<size_t>(w);
      if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == cmd.stdin_data->size()) {
        CloseFd(in_fd);  // all written, or the handler closed its stdin
      }
    }
    if (pr > 0 && i_out >= 0 && fds[i_out].revents != 0) {
      const ssize_t r = read(out_fd, buf, read_size());
      if (r > 0) consume(r, /*ended=*/false);
      else if (r == 0 || (errno != EAGAIN && errno != EINTR)) CloseFd(out_fd);
    }
    if (pr > 0 && i_room >= 0 && fds[i_room].revents != 0) cmd.tee->ClearRoomFd();
    if (i_watch >= 0 && fds[i_watch].revents != 0) {
      // The watchdog died; running handlers need one. If none can be started,
      // stop looking (the next Run() tries again).
      if (!RestartWatchdog(generation, /*socket_refused=*/false).ok()) watch_restart_failed = true;
    }
    if (pidfd < 0 || (pr > 0 && i_exit >= 0 && fds[i_exit].revents != 0)) {
      info = {};
      const int w = waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT);
      if (w == 0 && info.si_pid == pid) {
        exited = true;
      } else if (w != 0 && errno == ECHILD) {
        // Reaped by someone else (a waitpid(-1) elsewhere in this process): its
        // status is gone, and its pid may name another group by now; count it as
        // killed, which retries.
        info.si_code = CLD_KILLED;
        info.si_status = SIGKILL;
        exited = reaped_elsewhere = true;
      }
    }
  }
  // A stop's grace is the handler's, not only its leader's: under `/bin/sh -c`
  // (dash forks the command) the shell dies of the SIGTERM at once, and the
  // command it started was SIGKILLed with it before its own SIGTERM handler
  // could run (exec17). So the rest of the group keeps the grace (and never
  // outlives the lease); stdout is still read meanwhile.
  if (stopping && !killed && !reaped_elsewhere) {
    while (Steady::now() < kill_at &&
           (claim == nullptr || Steady::now() < claim->lease_deadline()) &&
           OthersInGroup(pid, pid)) {
      auto until = std::min(kill_at, Steady::now() + Millis(10));
      if (claim != nullptr) until = std::min(until, claim->lease_deadline());
      const auto left = std::chrono::duration_cast<Millis>(until - Steady::now()).count();
      const bool room = read_size() > 0;  // else wait for the copy's writer
      pollfd p{room ? out_fd : cmd.tee->room_fd(), POLLIN, 0};
      if (poll(&p, out_fd >= 0 ? 1 : 0, static_cast<int>(std::clamp<int64_t>(left + 1, 0, 10))) > 0) {
        if (!room) {
          cmd.tee->ClearRoomFd();
          continue;
        }
        const ssize_t r = read(out_fd, buf, read_size());
        if (r > 0) consume(r, /*ended=*/false);
        else if (r == 0 || (errno != EAGAIN && errno != EINTR)) CloseFd(out_fd);
      }
    }
  }
  // The leader has exited but is not reaped, so its pid still names its group:
  // kill whatever it left running, then let the watchdog forget the group.
  if (!reaped_elsewhere) kill(-pid, SIGKILL);
  cgroup.Kill();  // what left the group: its stdout closes now, not at the drain limit
  CloseFd(in_fd);
  if (out_fd >= 0) {
    const auto until = Steady::now() + kDrainLimit;
    while (Steady::now() < until) {
      pollfd p{out_fd, POLLIN, 0};
      const auto left = std::chrono::duration_cast<Millis>(until - Steady::now()).count();
      if (poll(&p, 1, static_cast<int>(std::max<int64_t>(left, 1))) <= 0) continue;
      const ssize_t r = read(out_fd, buf, sizeof(buf));
      if (r > 0) consume(r, /*ended=*/true);
      else if (r == 0 || (errno != EAGAIN && errno != EINTR)) break;
    }
    CloseFd(out_fd);
  }
  Unregister(pid);
  while (waitpid(pid, nullptr, 0) < 0 && errno == EINTR) {
  }
  if (pidfd >= 0) close(pidfd);
  cgroup.Finish();  // every process of the handler is gone before its outcome is told

  if (info.si_code == CLD_EXITED) {
    res.code = info.si_status;
  } else {
    res.signal = info.si_status;
  }
  if (!stopping && res.signal != 0 && claim != nullptr &&
      (claim->lost() || Steady::now() >= claim->lease_deadline() ||
       (res.signal == SIGKILL && first_told_deadline != Steady::time_point{} &&
        Steady::now() >= first_told_deadline))) {
    // Killed at or past the lease's end before this loop began the stop itself:
    // the watchdog's SIGKILL at a deadline it was told, which a lease shorter
    // than this loop's look (renewed every lease/3) can reach before the
    // watchdog has read the renewed one. The lease ended as far as the handler's
    // supervision knew, which is what a stop for a lost lease says (exit 75 from
    // dedup exec, not 137 as if something else had killed the command).
    stopping = true;
    res.reason = HandlerExit::StopReason::kLeaseLost;
  }
  if (stopping) {
    res.how = HandlerExit::How::kStopped;
  } else {
    res.how = res.signal != 0 ? HandlerExit::How::kSignaled : HandlerExit::How::kExited;
  }
  return res;
}

}  // namespace dedup
