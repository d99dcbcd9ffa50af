// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup exec`: runs a command at most once per key (cron jobs, webhooks).
//
//   dedup exec --store rocksdb:/var/lib/dedup --key nightly-2024-05-01 -- ./report.sh
//
// The command runs in a process group of its own, supervised
// (src/consumer/handler_process.h): it and its children die with `dedup exec`,
// SIGKILL included; it is stopped (SIGTERM, SIGKILL after --stop-grace, never
// later than the lease's end) when the lease is lost or cannot be renewed; a
// SIGTERM / SIGINT / SIGHUP of `dedup exec` is passed to its group and the claim
// released. With --handler-cgroup DIR it also runs in a cgroup v2 child of DIR of
// its own, killed as a whole in each of those cases (what left its group too).
// Its stdin is inherited (/dev/null in place of a terminal); its stdout
// passed through and kept (at most 1 MiB). The copy to our stdout is written by
// a thread of its own (src/consumer/output_copy.h): a reader that stalls holds
// up the command's writes (past 1 MiB), never the supervision or the outcome.
// The lease is extended every lease/3.
//
// Exit codes (docs/EXEC.md; sysexits.h where one fits):
//   N        the command ran now and exited N; recorded (0: ok, else failed),
//            except 75, 126, 127 (below)
//   75       EX_TEMPFAIL, nothing recorded, try again later: running elsewhere
//            (BUSY), store unreachable or open in another process (rocksdb:),
//            its disk full, the lease was lost (command stopped), or the
//            command itself exited 75 (claim released)
//   126/127  the command is not executable / not found (or exited so): nothing
//            recorded, claim released
//   128+n    the command was killed by signal n, or `dedup exec` was stopped by
//            signal n (TERM 143, INT 130, HUP 129): claim released
//   79       replayed: the command ran before and succeeded (recorded ok); its
//            recorded output is printed, nothing runs
//   80       replayed: the command ran before and failed (recorded failed)
//   69       EX_UNAVAILABLE, exhausted: --max-attempts used up (now, and on every
//            later run while the record is kept)
//   65       EX_DATAERR, fingerprint mismatch
//   2        bad usage (flags, store URI)
//
// The recorded result is "dedup-exec/1 exit=<code>\n" followed by the output.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/common.h"
#include "core/printable.h"
#include "cli/flags.h"
#include "consumer/handler_process.h"
#include "consumer/output_copy.h"
#include "dedup/buffer.h"
#include "dedup/store.h"

namespace dedup::cli {
namespace {

constexpr std::string_view kHeader = "dedup-exec/1 exit=";

// Exit codes of `dedup exec` that are its own (see the table above).
constexpr int kExitDataErr = 65;         // EX_DATAERR
constexpr int kExitExhausted = 69;       // EX_UNAVAILABLE
constexpr int kExitReplayedOk = 79;
constexpr int kExitReplayedFailed = 80;
constexpr int kExitSignalBase = 128;

std::atomic<HandlerSupervisor*> g_supervisor{nullptr};
std::atomic<int> g_stop_signal{0};

void OnStop(int sig) {
  int expected = 0;
  g_stop_signal.compare_exchange_strong(expected, sig);
  if (HandlerSupervisor* s = g_supervisor.load()) s->RequestStop(sig);
}

struct ExecFlags {
  std::string store;
  std::string key;
  Millis lease{kDefaultLease};
  Millis retention{kDefaultRetention};
  Millis stop_grace{5'000};
  std::string handler_cgroup;  // --handler-cgroup DIR
  uint32_t max_attempts = 0;
  std::vector<std::string> command;
};

// Splits a recorded result into exit code and output.
std::pair<int, std::string_view> ParseRecorded(std::string_view r) {
  if (!r.starts_with(kHeader)) return {0, r};
  const size_t nl = r.find('\n');
  if (nl == std::string_view::npos) return {0, r};
  int code = 0;
  for (char c : r.substr(kHeader.size(), nl - kHeader.size())) {
    if (c < '0' || c > '9') return {0, r};
    code = code * 10 + (c - '0');
  }
  return {code, r.substr(nl + 1)};
}

int StartFailureExit(const Status& s) {
  // A command that can never run (`exec -- ''`) is the caller's mistake, as
  // `worker --exec ''` says: 2, not 75 (try again later).
  if (s.code() == StatusCode::kInvalidArgument) return kExitUsage;
  if (s.code() == StatusCode::kNotFound) return kHandlerExitNotFound;
  if (s.code() == StatusCode::kPermissionDenied || s.code() == StatusCode::kFailedPrecondition) {
    return kHandlerExitCannotExec;
  }
  return kExitTempFail;
}

// Writes out what the command printed and the copy still holds, once the claim
// is settled (recorded or released): a reader of our stdout that stalls holds
// up only this, never the outcome. A stop signal ends the wait (what is left is
// dropped); a reader that went away gets nothing more (as a write to it would).
void FinishOutput(OutputCopy& copy, const char* settled) {
  if (copy.Finish([] { return g_stop_signal.load() != 0; }) || copy.failed()) return;
  std::fprintf(stderr, "dedup exec: stopped by signal %d while the command's output was "
                       "written to stdout (%s); the rest of it is not written\n",
               g_stop_signal.load(), settled);
}

// Gives the claim back and says so if the store did not take it.
void ReleaseClaim(ClaimGuard& g, const ExecFlags& f) {
  auto r = g.Release();
  if (!r.ok()) {
    std::fprintf(stderr, "dedup exec: '%s': the claim could not be released (%s); the key "
                         "is claimable again when its lease ends\n",
                 internal::Printable(f.key).c_str(), r.status().ToString().c_str());
  } else if (*r == WriteResult::kLost) {
    // Forgotten with --force, or taken over: the lines below say "claim released",
    // but this owner no longer held it.
    std::fprintf(stderr, "dedup exec: '%s': the claim was no longer ours to release (lease "
                         "lost, forgotten or taken over)\n",
                 internal::Printable(f.key).c_str());
  }
}

int RunExec(const ExecFlags& f) {
  struct sigaction sa {};
  sa.sa_handler = OnStop;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGTERM, SIGINT, SIGHUP}) sigaction(sig, &sa, nullptr);
  WarnIfShortLease("dedup exec", f.lease);
  // Before anything else: the watchdog is a fork of this process.
  SupervisorOptions so;
  so.grace = f.stop_grace;
  so.cgroup = f.handler_cgroup;
  auto started = HandlerSupervisor::Start(so);
  if (!started.ok() && !f.handler_cgroup.empty() &&
      started.status().code() == StatusCode::kInvalidArgument &&
      started.status().message().rfind("handler cgroup", 0) == 0) {
    std::fprintf(stderr, "dedup exec: --handler-cgroup: %s\n", started.status().message().c_str());
    return kExitUsage;
  }
  if (!started.ok()) {
    std::fprintf(stderr, "dedup exec: %s\n", started.status().ToString().c_str());
    return started.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitTempFail;
  }
  std::unique_ptr<HandlerSupervisor> sup = std::move(started).value();
  g_supervisor.store(sup.get());
  struct Unpublish {
    ~Unpublish() { g_supervisor.store(nullptr); }
  } unpublish;
  if (g_stop_signal.load() != 0) sup->RequestStop(g_stop_signal.load());
  // The command's stdout reaches ours through a copy on a thread of its own
  // (1 MiB): supervision never waits on our stdout's reader.
  auto copied = OutputCopy::Start(STDOUT_FILENO, kMaxResultBytes);
  if (!copied.ok()) {
    std::fprintf(stderr, "dedup exec: %s; nothing claimed\n", copied.status().ToString().c_str());
    return kExitTempFail;
  }
  OutputCopy& copy = **copied;

  // A command that cannot start is refused before anything is claimed.
  auto resolved = ResolveCommand(f.command.front());
  if (!resolved.ok()) {
    std::fprintf(stderr, "dedup exec: %s; nothing claimed or recorded\n",
                 resolved.status().ToString().c_str());
    return StartFailureExit(resolved.status());
  }

  auto opened = OpenStore(f.store, WarnOnStderr("dedup exec"));
  if (!opened.ok()) {
    const int rc = ExitCodeFor(opened.status());
    std::fprintf(stderr, "dedup exec: --store: %s; nothing claimed; exit %d\n",
                 opened.status().ToString().c_str(), rc);
    return rc;
  }
  std::unique_ptr<Store> store = std::move(opened).value();
  if (f.store.rfind("memory:", 0) == 0) {
    std::fprintf(stderr, "dedup exec: warning: --store memory: ends with this process, so the "
                         "command runs every time (use rocksdb:PATH or a shared store)\n");
  }
  BufferOptions bo;
  bo.lease = f.lease;
  bo.retention = f.retention;
  bo.max_attempts = f.max_attempts;
  auto made = Buffer::Create(store.get(), bo);
  if (!made.ok()) {
    std::fprintf(stderr, "dedup exec: --%s\n", made.status().message().c_str());
    return kExitUsage;
  }
  Buffer& buffer = **made;
  auto claimed = buffer.Claim(f.key);
  if (!claimed.ok()) {
    std::fprintf(stderr, "dedup exec: %s\n", claimed.status().ToString().c_str());
    // A bad key, or a store role without the rights it needs: no retry helps.
    const StatusCode c = claimed.status().code();
    return c == StatusCode::kInvalidArgument || c == StatusCode::kPermissionDenied ? kExitUsage
                                                                                   : kExitTempFail;
  }
  ClaimGuard& g = *claimed;
  switch (g.outcome()) {
    case ClaimOutcome::kDuplicate: {
      const CompletionStatus st = g.result().status;
      if (st == CompletionStatus::kExhausted) {
        std::fprintf(stderr, "dedup exec: '%s': attempts exhausted (recorded, fence %llu); "
                             "exit %d\n",
                     internal::Printable(f.key).c_str(), static_cast<unsigned long long>(g.fence()), kExitExhausted);
        return kExitExhausted;
      }
      auto [code, out] = ParseRecorded(g.result().result);
      std::fwrite(out.data(), 1, out.size(), stdout);
      const int rc = st == CompletionStatus::kOk ? kExitReplayedOk : kExitReplayedFailed;
      std::fprintf(stderr, "dedup exec: '%s' already ran (fence %llu, %s, exit %d); not run "
                           "again; exit %d (replayed)\n",
                   internal::Printable(f.key).c_str(), static_cast<unsigned long long>(g.fence()),
                   std::string(CompletionStatusName(st)).c_str(), code, rc);
      return rc;
    }
    case ClaimOutcome::kBusy:
      std::fprintf(stderr, "dedup exec: '%s' is running elsewhere (lease left %lld ms); exit 75\n",
                   internal::Printable(f.key).c_str(), static_cast<long long>(g.result().lease_left.count()));
      return kExitTempFail;
    case ClaimOutcome::kExhausted:
      std::fprintf(stderr, "dedup exec: '%s': attempts exhausted after %u; exit %d\n",
                   internal::Printable(f.key).c_str(), g.attempt(), kExitExhausted);
      return kExitExhausted;
    case ClaimOutcome::kMismatch:
      std::fprintf(stderr, "dedup exec: '%s': fingerprint mismatch; exit %d\n", internal::Printable(f.key).c_str(),
                   kExitDataErr);
      return kExitDataErr;
    case ClaimOutcome::kAcquired:
      break;
  }
  HandlerCommand c;
  c.argv = f.command;
  c.env = {"DEDUP_KEY=" + f.key, "DEDUP_FENCE=" + std::to_string(g.fence()),
           "DEDUP_ATTEMPT=" + std::to_string(g.attempt())};
  c.capture_stdout = true;
  c.max_output = kMaxResultBytes - 64;
  c.tee = &copy;
  auto r = sup->Run(c, &g);
  if (!r.ok()) {
    ReleaseClaim(g, f);
    if (r.status().code() == StatusCode::kAborted) {
      const int sig = g_stop_signal.load();
      std::fprintf(stderr, "dedup exec: stopped by signal %d before the command started; "
                           "claim released\n", sig);
      return kExitSignalBase + sig;
    }
    std::fprintf(stderr, "dedup exec: %s; claim released, nothing recorded\n",
                 r.status().ToString().c_str());
    return StartFailureExit(r.status());
  }
  const HandlerExit& e = *r;
  switch (Judge(e)) {
    case HandlerVerdict::kDone:
    case HandlerVerdict::kFail:
      break;
    case HandlerVerdict::kNotStarted:
      ReleaseClaim(g, f);
      FinishOutput(copy, "claim released");
      std::fprintf(stderr, "dedup exec: command %s (not executable / not found); claim "
                           "released, nothing recorded\n", e.Describe().c_str());
      return e.code;
    case HandlerVerdict::kRetry:
      ReleaseClaim(g, f);
      FinishOutput(copy, "claim released");
      if (e.how == HandlerExit::How::kStopped && e.reason == HandlerExit::StopReason::kLeaseLost) {
        std::fprintf(stderr, "dedup exec: '%s': the lease was lost or could not be renewed; "
                             "command %s; nothing recorded; exit 75\n",
                     internal::Printable(f.key).c_str(), e.Describe().c_str());
        return kExitTempFail;
      }
      if (e.how == HandlerExit::How::kStopped) {
        const int sig = g_stop_signal.load();
        std::fprintf(stderr, "dedup exec: stopped by signal %d: command %s; claim released, "
                             "nothing recorded\n", sig, e.Describe().c_str());
        return kExitSignalBase + sig;
      }
      if (e.how == HandlerExit::How::kSignaled) {
        std::fprintf(stderr, "dedup exec: command %s; claim released, nothing recorded\n",
                     e.Describe().c_str());
        return kExitSignalBase + e.signal;
      }
      std::fprintf(stderr, "dedup exec: command exit 75 (retry later); claim released\n");
      return kExitTempFail;
  }
  std::string result = std::string(kHeader) + std::to_string(e.code) + "\n" + e.output;
  auto w = g.Complete(result, e.code == 0 ? CompletionStatus::kOk : CompletionStatus::kFailed);
  FinishOutput(copy, w.ok() && *w == WriteResult::kOk ? "the outcome is recorded"
                                                      : "the outcome is not recorded");
  if (e.truncated) {
    std::fprintf(stderr, "dedup exec: output longer than 1 MiB; the recorded copy is cut\n");
  }
  // Exit N promises "recorded" (docs/EXEC.md): an outcome the store did not
  // take is 75, as every other "not recorded" is (a wrapper that reads 0 as
  // done would otherwise take a run whose record another owner holds).
  if (!w.ok()) {
    std::fprintf(stderr, "dedup exec: the command ran (%s), but the outcome was not recorded: "
                         "%s; exit 75\n",
                 e.Describe().c_str(), w.status().ToString().c_str());
    return kExitTempFail;
  }
  if (*w == WriteResult::kLost) {
    std::fprintf(stderr, "dedup exec: the command ran (%s), but the lease was lost to another "
                         "owner; the outcome was not recorded; exit 75\n",
                 e.Describe().c_str());
    return kExitTempFail;
  }
  return e.code;
}

}  // namespace

void RegisterExec(CLI::App& root, CommandContext& ctx) {
  auto f = std::make_shared<ExecFlags>();
  CLI::App* app = root.add_subcommand(
      "exec",
      "Run a command at most once per key; a repeat prints the recorded output.\n"
      "Exit codes: N the command ran now and exited N (recorded, except 75/126/127);\n"
      "  75 not run or not recorded, try later (running elsewhere, store unreachable\n"
      "     or open in another process, lease lost, or the command exited 75);\n"
      "  126/127 command not executable / not found (nothing recorded); 128+n killed\n"
      "  by signal n, or dedup exec stopped by signal n (claim released); 79 replayed,\n"
      "  recorded ok; 80 replayed, recorded failed; 69 attempts exhausted; 2 bad\n"
      "  usage; 65 (fingerprint mismatch) reserved, not produced: dedup exec sends no\n"
      "  fingerprint.");
  app->add_option("--store", f->store, "Store URI: memory:, rocksdb:PATH, redis://HOST:PORT, redis+cluster://HOST:PORT,..., postgres://USER@HOST:PORT/DB")->required();
  app->add_option("--key", f->key, "The key (1 to 1024 bytes)")->required();
  AddDurationOption(*app, "--lease", &f->lease, "Claim lease (heartbeat every lease/3)",
                    DurationBound::kPositive);
  AddDurationOption(*app, "--retention", &f->retention, "How long the outcome is kept",
                    DurationBound::kPositive);
  AddDurationOption(*app, "--stop-grace", &f->stop_grace,
                    "SIGTERM to SIGKILL when the command is stopped (at most lease/4 on a "
                    "lost lease)",
                    DurationBound::kPositive);
  app->add_option("--max-attempts", f->max_attempts,
                  "Runs of the key at most, crashed ones included; then exit 69 on every "
                  "later run (0 = unlimited)")
      ->capture_default_str();
  AddHandlerCgroupOption(*app, &f->handler_cgroup,
                  "A cgroup v2 directory this process may write and is not in: the command "
                  "runs in a child cgroup of it, killed as a whole when it ends, is stopped "
                  "or dedup exec dies (also what left its process group)");
  // dedup's flags stop at the command's first word (getopt's "+"): what follows
  // is the command's, flags included. CLI11 would otherwise take `--retention
  // 1ms` written after `echo deploying` as dedup's own and drop it from the
  // command (a retention of 1 ms, and the command runs again next time).
  app->positionals_at_end();
  app->add_option("command", f->command,
                  "[--] CMD ARGS...: everything from CMD on is the command's, flags "
                  "included (dedup's own flags come before it)")
      ->required();
  app->callback([f, &ctx] { ctx.exit_code = RunExec(*f); });
}

}  // namespace dedup::cli
