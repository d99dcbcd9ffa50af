// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Opt-in cgroup v2 containment of handler processes (SupervisorOptions::cgroup,
// `--handler-cgroup DIR`). A process group only holds the descendants that stay
// in it; a cgroup holds every descendant, also one that calls setsid() or
// setpgid(), unless it is moved out by someone allowed to write another cgroup's
// cgroup.procs. With it, HandlerSupervisor gives every handler a child cgroup of
// DIR of its own, named "dedup-<owner pid>-<owner start time>-<64 random bits>-<n>"
// (time and bits in hex; unique across pid namespaces sharing DIR), which the
// handler joins before exec; when the handler ends, is stopped, or its owner dies, that cgroup is
// killed (cgroup.kill, Linux 5.14+; else SIGKILL to every pid in cgroup.procs,
// the cgroup frozen first where cgroup.freeze exists, until it is empty) and
// removed once empty. Open() also removes empty "dedup-*" children whose owner
// is gone (rmdir only; what still runs in a cgroup we did not make is never
// killed).
//
// DIR is checked when the supervisor starts: it exists, is a directory of a
// cgroup2 file system, a child cgroup can be made in it and a process moved into
// that child, and the owner itself is not in DIR (cgroup v2 lets a cgroup that
// hands controllers to its children hold no processes: "no internal
// processes"). With systemd: Delegate=yes and DelegateSubgroup=worker (systemd
// 254+) put the worker in DIR/worker, and DIR is the service's cgroup.
//
// The functions below take a descriptor of DIR and a child's name. Those marked
// async-signal-safe make system calls only (the watchdog, a fork of a threaded
// process, calls them).

#ifndef DEDUP_CONSUMER_HANDLER_CGROUP_H_
#define DEDUP_CONSUMER_HANDLER_CGROUP_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "dedup/clock.h"
#include "dedup/status.h"

namespace dedup {

class HandlerCgroups {
 public:
  // Validates `dir` (see above) and opens it. InvalidArgument naming the problem
  // ("handler cgroup '<dir>': ...").
  [[nodiscard]] static StatusOr<std::unique_ptr<HandlerCgroups>> Open(const std::string& dir);
  ~HandlerCgroups();
  HandlerCgroups(const HandlerCgroups&) = delete;
  HandlerCgroups& operator=(const HandlerCgroups&) = delete;

  const std::string& dir() const { return dir_; }
  int dir_fd() const { return dir_fd_; }
  // Whether the kernel has cgroup.kill (Linux 5.14+).
  bool has_kill_file() const { return has_kill_file_; }

  // The name of child `n` of this owner: "<prefix>-<n>", prefix
  // "dedup-<pid>-<start time, hex>-<16 hex digits>" drawn once by Open(). Fits
  // kNameSize with the NUL. Async-signal-safe.
  static constexpr size_t kNameSize = 72;
  void Name(uint64_t n, char (&out)[kNameSize]) const;

  // Makes child `name` and opens its cgroup.procs for writing (the descriptor a
  // handler writes its pid to before exec, close-on-exec). The descriptor, or
  // -errno; mkdir semantics: -EEXIST when the name is taken, never reused.
  [[nodiscard]] int Create(const char* name) const;

 private:
  HandlerCgroups(std::string dir, int fd, bool has_kill_file)
      : dir_(std::move(dir)), dir_fd_(fd), has_kill_file_(has_kill_file) {}
  // rmdir of every empty "dedup-*" child of DIR whose owner is gone.
  void RemoveStale() const;
  std::string dir_;
  char prefix_[48] = "";  // 6 + 7 + 1 + 16 + 1 + 16 + NUL
  int dir_fd_;
  bool has_kill_file_;
};

// Writes this process's pid (as decimal) to `procs_fd` (a child's cgroup.procs):
// the process moves into that cgroup. 0 or errno. Async-signal-safe, and fit for
// a CLONE_VM | CLONE_VFORK child (no memory written but its stack).
int JoinCgroup(int procs_fd);

// Kills every process in child `name`: writes "1" to its cgroup.kill when
// `use_kill_file`, else freezes it (when cgroup.freeze exists) and sends SIGKILL
// to every pid listed in cgroup.procs until the list is empty or `limit` has
// passed (then thaws it). True when the kill was delivered (kill file) or the
// cgroup was seen empty; false when it is gone or the kill failed.
// Async-signal-safe.
bool KillCgroup(int dir_fd, const char* name, bool use_kill_file, Millis limit);

// Waits until child `name` holds no live process ("populated 0" in
// cgroup.events), at most `limit`. True when empty (or gone). Async-signal-safe.
bool WaitCgroupEmpty(int dir_fd, const char* name, Millis limit);

// Removes child `name` (rmdir). True when removed or already gone.
// Async-signal-safe.
bool RemoveCgroup(int dir_fd, const char* name);

// RemoveCgroup, after removing the (empty) child cgroups a handler may have made
// inside `name`, deepest first. Allocates: for the owner, never for the watchdog.
bool RemoveCgroupTree(int dir_fd, const char* name);

}  // namespace dedup

#endif  // DEDUP_CONSUMER_HANDLER_CGROUP_H_
