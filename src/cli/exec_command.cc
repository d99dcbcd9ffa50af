// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup exec`: runs a command at most once per key (cron jobs, webhooks).
//
//   dedup exec --store rocksdb:/var/lib/dedup --key nightly-2024-05-01 -- ./report.sh
//
//   first run          the command runs (stdin inherited, stdout passed through and
//                      kept, at most 1 MiB); its exit code and output are recorded;
//                      dedup exits with the command's code
//   later runs         the command does not run; the recorded output is printed and
//                      dedup exits with the recorded code
//   running elsewhere  message on stderr, exit 75 (EX_TEMPFAIL: try again later)
//   store unreachable  message on stderr, exit 75
//   command exits 75   the claim is released (the next run may try again), exit 75
//   command killed     the claim is released, exit 128 + signal
// The lease is extended every lease/3 while the command runs. SIGTERM / SIGINT are
// passed on to the command.
//
// The recorded result is "dedup-exec/1 exit=<code>\n" followed by the output.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "cli/command.h"
#include "cli/common.h"
#include "core/printable.h"
#include "cli/flags.h"
#include "dedup/buffer.h"
#include "dedup/store.h"

namespace dedup::cli {
namespace {

constexpr std::string_view kHeader = "dedup-exec/1 exit=";
std::atomic<int> g_child{0};

void ForwardSignal(int sig) {
  const int pid = g_child.load();
  if (pid > 0) kill(pid, sig);
}

struct ExecFlags {
  std::string store;
  std::string key;
  Millis lease{kDefaultLease};
  Millis retention{kDefaultRetention};
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

int RunExec(const ExecFlags& f) {
  auto opened = OpenStore(f.store);
  if (!opened.ok()) {
    std::fprintf(stderr, "dedup exec: --store: %s\n", opened.status().ToString().c_str());
    return opened.status().retryable() ? kExitTempFail : kExitUsage;
  }
  std::unique_ptr<Store> store = std::move(opened).value();
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
    return claimed.status().code() == StatusCode::kInvalidArgument ? kExitUsage : kExitTempFail;
  }
  ClaimGuard& g = *claimed;
  switch (g.outcome()) {
    case ClaimOutcome::kDuplicate: {
      auto [code, out] = ParseRecorded(g.result().result);
      std::fwrite(out.data(), 1, out.size(), stdout);
      std::fprintf(stderr, "dedup exec: '%s' already ran (fence %llu, %s); exit %d as recorded\n",
                   internal::Printable(f.key).c_str(), static_cast<unsigned long long>(g.fence()),
                   std::string(CompletionStatusName(g.result().status)).c_str(), code);
      return code;
    }
    case ClaimOutcome::kBusy:
      std::fprintf(stderr, "dedup exec: '%s' is running elsewhere (lease left %lld ms); exit 75\n",
                   internal::Printable(f.key).c_str(), static_cast<long long>(g.result().lease_left.count()));
      return kExitTempFail;
    case ClaimOutcome::kExhausted:
      std::fprintf(stderr, "dedup exec: '%s': attempts exhausted after %u\n", internal::Printable(f.key).c_str(),
                   g.attempt());
      return kExitCheckFailed;
    case ClaimOutcome::kMismatch:
      std::fprintf(stderr, "dedup exec: '%s': fingerprint mismatch\n", internal::Printable(f.key).c_str());
      return kExitCheckFailed;
    case ClaimOutcome::kAcquired:
      break;
  }
  ChildOptions c;
  c.argv = f.command;
  c.env = {"DEDUP_KEY=" + f.key, "DEDUP_FENCE=" + std::to_string(g.fence()),
           "DEDUP_ATTEMPT=" + std::to_string(g.attempt())};
  c.capture_stdout = true;
  c.max_output = kMaxResultBytes - 64;
  c.tee_fd = STDOUT_FILENO;
  OnStopSignals(&ForwardSignal);
  auto r = RunChild(c, [](int pid) { g_child.store(pid); });
  g_child.store(0);
  if (!r.ok()) {
    (void)g.Release();
    std::fprintf(stderr, "dedup exec: %s\n", r.status().ToString().c_str());
    return kExitTempFail;
  }
  if (r->signal != 0 || r->exit_code == kExitTempFail) {
    auto rel = g.Release();
    (void)rel;
    return r->signal != 0 ? 128 + r->signal : kExitTempFail;
  }
  std::string result = std::string(kHeader) + std::to_string(r->exit_code) + "\n" + r->output;
  auto w = g.Complete(result, r->exit_code == 0 ? CompletionStatus::kOk : CompletionStatus::kFailed);
  if (!w.ok()) {
    std::fprintf(stderr, "dedup exec: ran, but the outcome was not recorded: %s\n",
                 w.status().ToString().c_str());
  } else if (*w == WriteResult::kLost) {
    std::fprintf(stderr, "dedup exec: ran, but the lease was lost to another owner; the "
                         "outcome was not recorded\n");
  }
  if (r->truncated) {
    std::fprintf(stderr, "dedup exec: output longer than 1 MiB; the recorded copy is cut\n");
  }
  return r->exit_code;
}

}  // namespace

void RegisterExec(CLI::App& root, CommandContext& ctx) {
  auto f = std::make_shared<ExecFlags>();
  CLI::App* app = root.add_subcommand(
      "exec", "Run a command at most once per key; a repeat prints the recorded output and "
              "exits with the recorded code (75: running elsewhere, try later)");
  app->add_option("--store", f->store, "Store URI")->required();
  app->add_option("--key", f->key, "The key (1 to 1024 bytes)")->required();
  AddDurationOption(*app, "--lease", &f->lease, "Claim lease (heartbeat every lease/3)",
                    DurationBound::kPositive);
  AddDurationOption(*app, "--retention", &f->retention, "How long the outcome is kept",
                    DurationBound::kPositive);
  app->add_option("--max-attempts", f->max_attempts, "0 = unlimited")->capture_default_str();
  app->add_option("command", f->command, "-- CMD ARGS...")->required();
  app->callback([f, &ctx] { ctx.exit_code = RunExec(*f); });
}

}  // namespace dedup::cli
