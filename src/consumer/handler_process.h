// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Runs handler commands (`dedup worker --exec`, `dedup exec`) as supervised
// processes. A HandlerSupervisor belongs to one owner process and guarantees:
//
//   * Every handler runs in a process group of its own (its pid is the group id).
//     When the handler exits, whatever it left running in that group is killed
//     (SIGKILL) before Run() returns: no effect of a handler outlives its outcome.
//   * Handlers, and everything in their groups, die with the owner however the
//     owner dies, SIGKILL included. A small watchdog process (a fork of the owner,
//     in a process group of its own, deaf to every catchable signal) holds one
//     end of a socket whose other end only the owner holds, and the reading end
//     of a pipe, its log. The handler writes its group into the log itself,
//     between fork and exec, while it still holds a copy of the owner's end of
//     the socket; so the watchdog cannot see the owner's end close before the
//     record is in the log. The owner logs a group's removal before reaping its
//     leader. The watchdog reads the log only when asked to (every 64 records)
//     and at end-of-file (the owner is gone, however it went): then it SIGKILLs
//     every group still registered and exits. A record wakes nobody. The
//     handler also gets PR_SET_PDEATHSIG = SIGKILL. If the watchdog itself dies,
//     the next Run() (or any running one, woken by its pidfd) starts a new one and
//     registers every live group with it.
//   * A handler whose claim is lost is stopped: SIGTERM to its group once the
//     ClaimGuard says lost() (an extend answered LOST), or once the lease has gone
//     unrenewed so long that less than the stop margin (the grace, at most a
//     quarter of the lease) is left; SIGKILL after the grace period, and never
//     later than the unrenewed lease's end, so that the handler is dead before
//     another owner can take the key over.
//   * RequestStop() (SIGTERM of `dedup exec`) stops every handler the same way.
//
//   * With SupervisorOptions::cgroup (`--handler-cgroup DIR`), every handler
//     also runs in a cgroup v2 child of DIR of its own, joined before exec
//     (src/consumer/handler_cgroup.h). A cgroup holds every descendant, also one
//     that left the group (setsid(), setpgid(); daemons do): when the handler
//     exits, is stopped (at the SIGKILL), or the owner dies (the watchdog, which
//     knows each cgroup before it exists), the whole cgroup is killed, and Run()
//     returns only once it is empty (then it is removed). The stop signal
//     (SIGTERM) goes to the group only.
//
// Limits: without a handler cgroup, a descendant that leaves the handler's
// process group (setsid(), setpgid(); daemons do) is not followed: it survives
// the handler, the lease and the owner (run the worker as a systemd service:
// KillMode=control-group kills the whole unit when it stops, or give it
// --handler-cgroup). A process that moves itself into another cgroup (it needs
// write access to that cgroup's cgroup.procs; root has it) escapes either way:
// run handlers as an unprivileged user, DIR a delegated subtree it cannot
// write above (docs/WORKER.md). A handler
// runs in the background as far as a terminal is concerned (it must not read
// from one). Spawning uses clone(CLONE_VM | CLONE_VFORK) like glibc's
// posix_spawn, which cannot set a parent-death signal, register the group or
// join a cgroup; the child does those itself, making system calls only.
//
// A HandlerSupervisor is safe for concurrent Run() calls from many threads.

#ifndef DEDUP_CONSUMER_HANDLER_PROCESS_H_
#define DEDUP_CONSUMER_HANDLER_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dedup/buffer.h"
#include "dedup/clock.h"
#include "dedup/status.h"

namespace dedup {

class HandlerCgroups;
class OutputCopy;

struct HandlerCommand {
  // argv; argv[0] is looked up in PATH when it holds no '/'.
  std::vector<std::string> argv;
  // Written to the handler's stdin, then closed. nullopt: the handler inherits
  // stdin, or gets /dev/null in place of a terminal.
  std::optional<std::string> stdin_data;
  // NAME=VALUE entries added to (or replacing those of) the environment. The
  // handler inherits the worker's environment except its secrets
  // (internal::kSecretEnvVars, core/secret.h: DEDUP_REDIS_PASSWORD), which only
  // an entry here gives it.
  std::vector<std::string> env;
  // Keep the handler's stdout, at most max_output bytes (the rest is read and
  // dropped). Default: not kept.
  bool capture_stdout = false;
  size_t max_output = 1 << 20;
  // Also copy the handler's stdout into this (`dedup exec`'s own stdout) as it
  // arrives. Run() never waits on its reader: the handler's pipe is read only
  // while the copy has room (src/consumer/output_copy.h), so a reader that
  // stalls holds up the handler's writes, never the supervision (lease
  // deadlines to the watchdog, stop signals, the handler's end). What is still
  // in the copy when Run() returns is the caller's to wait for (Finish) or
  // drop. Default: none.
  OutputCopy* tee = nullptr;
};

struct HandlerExit {
  enum class How : uint8_t {
    kExited,    // exited by itself with `code`
    kSignaled,  // killed by `signal`, not sent by the supervisor
    kStopped,   // stopped by the supervisor (`reason`); `code`/`signal` as it ended
  };
  enum class StopReason : uint8_t { kNone, kLeaseLost, kStopRequested };
  How how = How::kExited;
  StopReason reason = StopReason::kNone;
  int code = 0;    // exit code when it exited
  int signal = 0;  // signal that ended it, or 0
  // The signal was read from the shell's exit 128+n (`code`), not seen directly
  // (ExecHandler through /bin/sh -c).
  bool via_shell = false;
  std::string output;  // captured stdout (bounded)
  bool truncated = false;

  // "exit 3", "killed by signal 9 (Killed)", "stopped: lease lost (signal 15)".
  std::string Describe() const;
};

// What a handler's end means for its claim: one policy for `dedup worker --exec`
// and `dedup exec`.
//
//   handler                                   verdict      claim
//   exit 0                                    kDone        completed ok
//   exit 75 (EX_TEMPFAIL)                     kRetry       released
//   exit 126 / 127 (cannot execute / not      kNotStarted  released (the shell's
//     found), or the command could not start               codes for "did not run")
//   killed by a signal                        kRetry       released
//   stopped (lease lost, stop requested)      kRetry       released (nothing recorded)
//   any other exit                            kFail        completed failed
enum class HandlerVerdict : uint8_t { kDone, kRetry, kNotStarted, kFail };
HandlerVerdict Judge(const HandlerExit& e);
inline constexpr int kHandlerExitRetry = 75;        // sysexits.h EX_TEMPFAIL
inline constexpr int kHandlerExitCannotExec = 126;  // the shell's "not executable"
inline constexpr int kHandlerExitNotFound = 127;    // the shell's "not found"
inline constexpr int kMaxSignal = 64;               // SIGRTMAX on Linux

// The answer to give Buffer::ProcessOnce for a Run(): kDone → Done (with the
// output when `keep_output`), kFail → Fail, anything else (including a command
// that could not be started) → Retry, with the reason in words.
HandlerResult ToHandlerResult(const StatusOr<HandlerExit>& run, bool keep_output);

// Finds `name` as execvp would (PATH, or as given when it holds a '/') and checks
// it is an executable file, and that the interpreter its #! line names (a
// script's) is there. NotFound or PermissionDenied, naming it. For start-up
// checks: it opens and reads the file.
[[nodiscard]] StatusOr<std::string> ResolveCommand(std::string_view name);

struct SupervisorOptions {
  // Time between the stop signal (SIGTERM, or the one given to RequestStop) and
  // SIGKILL. For a lost lease it is cut to a quarter of the lease. Default: 5 s.
  Millis grace{5'000};
  // Handlers running at once, at most. Default: 4096.
  size_t max_handlers = 4096;
  // A cgroup v2 directory this process may write (and is not in itself): every
  // handler runs in a child cgroup of it, killed as a whole (see above and
  // src/consumer/handler_cgroup.h). Checked by Start() (InvalidArgument).
  // Default: empty, none (handlers are followed by process group only).
  std::string cgroup;
};

class HandlerSupervisor {
 public:
  // Starts the watchdog. Call it early: the watchdog is a fork of this process
  // and keeps (copy-on-write) the memory mapped at that moment.
  [[nodiscard]] static StatusOr<std::unique_ptr<HandlerSupervisor>> Start(
      SupervisorOptions options = {});
  // SIGKILLs the group of every handler still running, then ends the watchdog.
  ~HandlerSupervisor();
  HandlerSupervisor(const HandlerSupervisor&) = delete;
  HandlerSupervisor& operator=(const HandlerSupervisor&) = delete;

  // Runs `cmd` to its end and says how it ended. With `claim`, the handler is
  // stopped when the claim is lost (see above). NotFound / PermissionDenied /
  // FailedPrecondition when the command cannot be started (nothing ran);
  // ResourceExhausted beyond max_handlers; Unavailable when the system refuses
  // (fork, pipes). Once RequestStop() was called, nothing new starts
  // (Aborted).
  [[nodiscard]] StatusOr<HandlerExit> Run(const HandlerCommand& cmd,
                                          const ClaimGuard* claim = nullptr);

  // Stops every running handler: `sig` to its group, SIGKILL after the grace;
  // later Run() calls start nothing. Async-signal-safe.
  void RequestStop(int sig);
  bool stop_requested() const { return stop_signal_.load() != 0; }

  pid_t watchdog_pid() const { return watchdog_pid_.load(); }
  // Handlers running now.
  size_t running() const;

 private:
  explicit HandlerSupervisor(SupervisorOptions options);
  Status StartWatchdog();            // mu_ held
  Status RestartWatchdog(uint64_t seen_generation, bool socket_refused);
  void Log(int32_t op, pid_t pgid, uint64_t cgroup);  // mu_ held
  void Register(pid_t pgid, uint64_t generation_before);
  void Unregister(pid_t pgid);
  // Tells the watchdog when group `pgid`'s lease ends: it SIGKILLs the group
  // then if this process has not (stopped by SIGSTOP, frozen).
  void SetDeadline(pid_t pgid, std::chrono::steady_clock::time_point deadline);
  // False when the watchdog's table is full (cgroups that stay populated) even
  // after the leftovers were tried again.
  [[nodiscard]] bool RegisterCgroup(uint64_t id);
  void UnregisterCgroup(uint64_t id);
  // A cgroup whose handler ended but that could not be emptied or removed: it
  // stays registered, and RegisterCgroup tries it again when the table is full.
  void KeepLeftoverCgroup(uint64_t id);
  void ReapLeftoverCgroups();  // mu_ held

  const SupervisorOptions options_;
  mutable std::mutex mu_;
  std::vector<pid_t> live_;          // groups registered with the watchdog
  int watch_fd_ = -1;                // owner's end of the watchdog socket
  int log_fd_ = -1;                  // write end of the watchdog's log (a pipe)
  std::atomic<uint64_t> logged_{0};  // records written to the log
  int watch_pidfd_ = -1;             // the watchdog, for poll()
  std::atomic<pid_t> watchdog_pid_{0};
  std::atomic<uint64_t> generation_{0};  // +1 per watchdog start
  int stop_fd_ = -1;                 // eventfd, readable once RequestStop ran
  std::atomic<int> stop_signal_{0};
  std::atomic<size_t> running_{0};
  // With options_.cgroup: the directory, and the children registered with the
  // watchdog (created, or about to be).
  std::unique_ptr<HandlerCgroups> cgroups_;
  std::vector<uint64_t> live_cgroups_;
  std::vector<uint64_t> leftover_cgroups_;  // in live_cgroups_, no handler running
  std::atomic<uint64_t> next_cgroup_{1};
  // The descriptor numbers (0 to 2 too) that were not open when Start ran, or open
  // close-on-exec (a library's: the number is reused once it closes), as
  // [first, last] ranges: every handler gets them close-on-exec, so it inherits
  // what the user gave dedup (`3<file`) but none of dedup's own descriptors,
  // whatever library opened them without O_CLOEXEC (nats.c's socket).
  std::vector<std::pair<unsigned, unsigned>> private_fds_;
};

}  // namespace dedup

#endif  // DEDUP_CONSUMER_HANDLER_PROCESS_H_
