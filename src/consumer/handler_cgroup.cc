// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "consumer/handler_cgroup.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <signal.h>
#include <dirent.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>
#include <vector>

namespace dedup {
namespace {

// ---- async-signal-safe pieces: system calls and stack buffers only ----------------

// Decimal digits of `v` into `out` (no NUL); the number of digits.
size_t FormatDecimal(uint64_t v, char* out) {
  char tmp[24];
  size_t n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0);
  for (size_t i = 0; i < n; ++i) out[i] = tmp[n - 1 - i];
  return n;
}

// "<name>/<file>" into `out`; false when it does not fit.
bool ChildPath(const char* name, const char* file, char (&out)[96]) {
  size_t n = 0;
  for (const char* p = name; *p != '\0'; ++p) {
    if (n + 1 >= sizeof(out)) return false;
    out[n++] = *p;
  }
  if (n + 1 >= sizeof(out)) return false;
  out[n++] = '/';
  for (const char* p = file; *p != '\0'; ++p) {
    if (n + 1 >= sizeof(out)) return false;
    out[n++] = *p;
  }
  out[n] = '\0';
  return true;
}

// Writes `text` to child `name`'s `file`. 0 or errno.
int WriteChildFile(int dir_fd, const char* name, const char* file, const char* text) {
  char path[96];
  if (!ChildPath(name, file, path)) return ENAMETOOLONG;
  const int fd = openat(dir_fd, path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const size_t len = strlen(text);
  ssize_t w;
  while ((w = write(fd, text, len)) < 0 && errno == EINTR) {
  }
  const int e = w == static_cast<ssize_t>(len) ? 0 : (w < 0 ? errno : EIO);
  close(fd);
  return e;
}

int64_t NowMs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

void SleepMs(int ms) {
  timespec ts{0, static_cast<long>(ms) * 1'000'000L};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

// SIGKILL to every pid in child `name`'s cgroup.procs. The number of pids seen,
// or -1 when the file cannot be read (the cgroup is gone).
int KillListed(int dir_fd, const char* name) {
  char path[96];
  if (!ChildPath(name, "cgroup.procs", path)) return -1;
  const int fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buf[4096];
  int seen = 0;
  int64_t pid = -1;  // the number being read, -1 between numbers
  for (;;) {
    const ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    for (ssize_t i = 0; i < r; ++i) {
      const char c = buf[i];
      if (c >= '0' && c <= '9') {
        pid = (pid < 0 ? 0 : pid * 10) + (c - '0');
      } else if (pid >= 0) {
        if (pid > 1) kill(static_cast<pid_t>(pid), SIGKILL), ++seen;
        pid = -1;
      }
    }
  }
  if (pid > 1) kill(static_cast<pid_t>(pid), SIGKILL), ++seen;
  close(fd);
  return seen;
}

// ---- validation (ordinary code) -----------------------------------------------------

// Field 22 of /proc/<pid>/stat (start time in clock ticks since boot), or 0
// when there is no such process.
uint64_t StartTime(const std::string& pid) {
  std::ifstream in("/proc/" + pid + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  const size_t paren = stat.rfind(')');  // the command name may hold blanks
  if (paren == std::string::npos) return 0;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 22 && rest >> field; ++i) {
    if (i == 22) return std::strtoull(field.c_str(), nullptr, 10);
  }
  return 0;
}

bool AllOf(std::string_view s, const char* set) {
  return !s.empty() && s.find_first_not_of(set) == std::string_view::npos;
}

std::string Err(int e) { return std::strerror(e); }

// Where cgroup2 is mounted, for the error that says DIR is not on it.
std::string Cgroup2Mounts() {
  std::ifstream in("/proc/self/mountinfo");
  std::string line, out;
  while (std::getline(in, line)) {
    const size_t dash = line.find(" - ");
    if (dash == std::string::npos) continue;
    std::istringstream tail(line.substr(dash + 3));
    std::string fstype;
    tail >> fstype;
    if (fstype != "cgroup2") continue;
    std::istringstream head(line.substr(0, dash));
    std::string id, parent, devno, root, mount_point;
    head >> id >> parent >> devno >> root >> mount_point;
    out += (out.empty() ? "" : ", ") + mount_point;
  }
  return out.empty() ? "no cgroup2 file system is mounted"
                     : "cgroup2 is mounted at " + out;
}

// Whether `pid` is listed in `dir_fd`'s own cgroup.procs.
bool ListedIn(int dir_fd, pid_t pid) {
  const int fd = openat(dir_fd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string all;
  char buf[4096];
  ssize_t r;
  while ((r = read(fd, buf, sizeof(buf))) > 0 || (r < 0 && errno == EINTR)) {
    if (r > 0) all.append(buf, static_cast<size_t>(r));
  }
  close(fd);
  std::istringstream in(all);
  for (long p; in >> p;) {
    if (p == pid) return true;
  }
  return false;
}

}  // namespace

int JoinCgroup(int procs_fd) {
  char digits[24];
  const size_t n = FormatDecimal(static_cast<uint64_t>(getpid()), digits);
  ssize_t w;
  while ((w = write(procs_fd, digits, n)) < 0 && errno == EINTR) {
  }
  if (w == static_cast<ssize_t>(n)) return 0;
  return w < 0 ? errno : EIO;
}

bool KillCgroup(int dir_fd, const char* name, bool use_kill_file, Millis limit) {
  if (use_kill_file) return WriteChildFile(dir_fd, name, "cgroup.kill", "1") == 0;
  // Without cgroup.kill: frozen, nothing in it can fork between our reading the
  // list and the kill; a frozen process still dies of SIGKILL.
  const bool frozen = WriteChildFile(dir_fd, name, "cgroup.freeze", "1") == 0;
  const int64_t until = NowMs() + limit.count();
  bool empty = false;
  for (;;) {
    const int seen = KillListed(dir_fd, name);
    if (seen <= 0) {
      empty = seen == 0;
      break;
    }
    if (NowMs() >= until) break;
    SleepMs(1);
  }
  if (frozen) (void)WriteChildFile(dir_fd, name, "cgroup.freeze", "0");
  return empty;
}

bool WaitCgroupEmpty(int dir_fd, const char* name, Millis limit) {
  char path[96];
  if (!ChildPath(name, "cgroup.events", path)) return false;
  const int fd = openat(dir_fd, path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  const int64_t until = NowMs() + limit.count();
  bool empty = false;
  for (;;) {
    // "populated 0|1\nfrozen 0|1\n"; reading it re-arms the poll below.
    char buf[128];
    ssize_t r;
    while ((r = pread(fd, buf, sizeof(buf) - 1, 0)) < 0 && errno == EINTR) {
    }
    if (r <= 0) break;
    buf[r] = '\0';
    const char* p = strstr(buf, "populated ");
    if (p != nullptr && p[10] == '0') {
      empty = true;
      break;
    }
    const int64_t left = until - NowMs();
    if (left <= 0) break;
    // The file notifies a change (POLLPRI); 10 ms at most per look, whatever
    // poll says.
    pollfd pfd{fd, POLLPRI, 0};
    (void)poll(&pfd, 1, static_cast<int>(left < 10 ? left : 10));
  }
  close(fd);
  return empty;
}

bool RemoveCgroup(int dir_fd, const char* name) {
  return unlinkat(dir_fd, name, AT_REMOVEDIR) == 0 || errno == ENOENT;
}

namespace {
bool RemoveChildren(int parent_fd, const char* name, int depth) {
  const int fd = openat(parent_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT;
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return false;
  }
  bool ok = true;
  while (const dirent* e = readdir(d)) {
    if (e->d_type != DT_DIR || std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) {
      continue;
    }
    if (depth < 32 && RemoveChildren(dirfd(d), e->d_name, depth + 1)) {
      if (unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT) ok = false;
    } else {
      ok = false;
    }
  }
  closedir(d);
  return ok;
}
}  // namespace

bool RemoveCgroupTree(int dir_fd, const char* name) {
  return RemoveChildren(dir_fd, name, 0) && RemoveCgroup(dir_fd, name);
}

// ---- HandlerCgroups ---------------------------------------------------------------

void HandlerCgroups::Name(uint64_t n, char (&out)[kNameSize]) const {
  size_t len = 0;
  for (const char* p = prefix_; *p != '\0'; ++p) out[len++] = *p;
  out[len++] = '-';
  len += FormatDecimal(n, out + len);
  out[len] = '\0';
}

int HandlerCgroups::Create(const char* name) const {
  if (mkdirat(dir_fd_, name, 0755) != 0) return -errno;
  char path[96];
  if (!ChildPath(name, "cgroup.procs", path)) {
    RemoveCgroup(dir_fd_, name);
    return -ENAMETOOLONG;
  }
  const int fd = openat(dir_fd_, path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    RemoveCgroup(dir_fd_, name);
    return -e;
  }
  return fd;
}

void HandlerCgroups::RemoveStale() const {
  const int fd = openat(dir_fd_, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  DIR* d = fdopendir(fd);
  if (d == nullptr) {
    close(fd);
    return;
  }
  const std::string own_pid = std::to_string(getpid());
  while (const dirent* e = readdir(d)) {
    // "dedup-<pid>-<n>" (before owners had a start time in the name) or
    // "dedup-<pid>-<start time, hex>-<16 hex>-<n>".
    const std::string_view name(e->d_name);
    if (e->d_type != DT_DIR || name.rfind("dedup-", 0) != 0) continue;
    std::vector<std::string_view> parts;
    for (size_t at = 6; at <= name.size();) {
      size_t dash = name.find('-', at);
      if (dash == std::string_view::npos) dash = name.size();
      parts.push_back(name.substr(at, dash - at));
      at = dash + 1;
    }
    if (parts.size() < 2 || !AllOf(parts[0], "0123456789")) continue;
    const std::string pid(parts[0]);
    // A /proc entry we may not read (hidepid=) is an owner we cannot judge.
    if (access(("/proc/" + pid).c_str(), F_OK) != 0 && errno != ENOENT) continue;
    const uint64_t now = StartTime(pid);  // 0: no such process here
    if (parts.size() == 4 && AllOf(parts[1], "0123456789abcdef") && parts[2].size() == 16 &&
        AllOf(parts[2], "0123456789abcdef")) {
      // Its owner is alive when a process with that pid started at that time.
      if (now != 0 && now == std::strtoull(std::string(parts[1]).c_str(), nullptr, 16)) continue;
    } else if (parts.size() == 2 && AllOf(parts[1], "0123456789")) {
      if (now != 0 || pid == own_pid) continue;  // cannot tell: only a pid that is gone
    } else {
      continue;  // not a name of ours
    }
    // rmdir only: it fails on a cgroup that holds a process or a child.
    (void)unlinkat(dir_fd_, e->d_name, AT_REMOVEDIR);
  }
  closedir(d);
}

HandlerCgroups::~HandlerCgroups() {
  if (dir_fd_ >= 0) close(dir_fd_);
}

StatusOr<std::unique_ptr<HandlerCgroups>> HandlerCgroups::Open(const std::string& dir_in) {
  if (dir_in.empty()) return Status::InvalidArgument("handler cgroup: empty directory name");
  std::string dir = dir_in;  // without trailing slashes: errors name DIR/child
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  const std::string what = "handler cgroup '" + dir + "': ";
  const int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    const int e = errno;
    if (e == ENOENT) return Status::InvalidArgument(what + "does not exist");
    if (e == ENOTDIR) return Status::InvalidArgument(what + "is not a directory");
    return Status::InvalidArgument(what + "cannot be opened: " + Err(e));
  }
  std::unique_ptr<HandlerCgroups> cg(new HandlerCgroups(dir, fd, false));
  struct statfs fs {};
  if (fstatfs(fd, &fs) != 0) return Status::InvalidArgument(what + "statfs: " + Err(errno));
  if (fs.f_type != CGROUP2_SUPER_MAGIC) {
    return Status::InvalidArgument(what + "is not a cgroup v2 directory (" + Cgroup2Mounts() +
                                   ")");
  }
  if (ListedIn(fd, getpid())) {
    return Status::InvalidArgument(
        what + "this process (pid " + std::to_string(getpid()) +
        ") is in that cgroup itself; cgroup v2 keeps processes out of a cgroup whose "
        "children share its controllers (no internal processes): run the worker in a "
        "child of it (systemd: DelegateSubgroup=) or elsewhere, and give the handlers "
        "the directory");
  }
  // Our names: the pid alone repeats across pid namespaces sharing DIR (two
  // workers that are both pid 1) and after a reboot; with our start time and 64
  // random bits, a name taken by another owner is a 2^-64 accident, and Create
  // refuses it (EEXIST) rather than reusing it.
  uint64_t random = 0;
  if (getrandom(&random, sizeof(random), 0) != static_cast<ssize_t>(sizeof(random))) {
    return Status::Unavailable(what + "getrandom: " + Err(errno));
  }
  const int plen = snprintf(cg->prefix_, sizeof(cg->prefix_), "dedup-%d-%llx-%016llx",
                            static_cast<int>(getpid()),
                            static_cast<unsigned long long>(StartTime("self")),
                            static_cast<unsigned long long>(random));
  if (plen < 0 || static_cast<size_t>(plen) >= sizeof(cg->prefix_)) {
    return Status::Internal(what + "child name too long");
  }
  cg->RemoveStale();
  // Make a child, move a process into it, remove it: what every handler needs.
  char name[kNameSize];
  snprintf(name, sizeof(name), "%s-probe", cg->prefix_);
  const int procs = cg->Create(name);
  if (procs < 0) {
    return Status::InvalidArgument(what + "cannot create a child cgroup in it: " + Err(-procs) +
                                   " (the worker needs write access to it: systemd "
                                   "Delegate=yes, or a directory made for its user)");
  }
  const pid_t child = fork();
  if (child == 0) _exit(JoinCgroup(procs) & 0xff);  // errno values fit in an exit code
  int wstatus = 0;
  int join_errno = 0;
  if (child < 0) {
    join_errno = errno;
  } else {
    while (waitpid(child, &wstatus, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(wstatus)) join_errno = EIO;
    else join_errno = WEXITSTATUS(wstatus);
  }
  close(procs);
  char kill_path[96];
  cg->has_kill_file_ = ChildPath(name, "cgroup.kill", kill_path) &&
                       faccessat(fd, kill_path, F_OK, 0) == 0;
  (void)WaitCgroupEmpty(fd, name, Millis(1'000));
  const bool removed = RemoveCgroup(fd, name);
  const int remove_errno = removed ? 0 : errno;
  if (join_errno != 0) {
    return Status::InvalidArgument(what + "cannot move a process into a child cgroup of it (" +
                                   Err(join_errno) +
                                   "): the worker needs write access to cgroup.procs of the "
                                   "common ancestor of its own cgroup and this one");
  }
  if (!removed) {
    return Status::InvalidArgument(what + "cannot remove a child cgroup of it: " + Err(remove_errno));
  }
  return cg;
}

}  // namespace dedup
