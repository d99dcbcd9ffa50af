// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Helpers shared by the worker, publish, exec, inspect and forget subcommands:
// running a child command with a payload, stop signals, and times for people.
// (The worker's /metrics is served by src/serve/metrics_http.h.)

#ifndef DEDUP_CLI_COMMON_H_
#define DEDUP_CLI_COMMON_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "dedup/status.h"

namespace CLI {
class App;
}  // namespace CLI

namespace dedup::cli {

struct CommandContext;

// Subcommands of this group (one Register function each, see command.h).
void RegisterWorker(CLI::App& root, CommandContext& ctx);
void RegisterPublish(CLI::App& root, CommandContext& ctx);
void RegisterExec(CLI::App& root, CommandContext& ctx);
void RegisterInspect(CLI::App& root, CommandContext& ctx);
void RegisterForget(CLI::App& root, CommandContext& ctx);

// Exit code for "not now, try again later" (sysexits.h EX_TEMPFAIL): a handler
// asking for a retry, or `dedup exec` finding the key in progress elsewhere.
inline constexpr int kExitTempFail = 75;

struct ChildOptions {
  // argv to execute; argv[0] is looked up in PATH.
  std::vector<std::string> argv;
  // Written to the child's stdin, then closed. nullopt: the child inherits stdin.
  std::optional<std::string> stdin_data;
  // Extra NAME=VALUE entries added to the environment.
  std::vector<std::string> env;
  // Capture stdout (at most max_output bytes kept; the rest is read and dropped).
  bool capture_stdout = false;
  size_t max_output = 1 << 20;
  // Also copy the child's stdout to this fd as it arrives (-1: no).
  int tee_fd = -1;
};

struct ChildResult {
  int exit_code = 0;     // valid when signal == 0
  int signal = 0;        // the signal that ended the child, or 0
  std::string output;    // captured stdout (bounded)
  bool truncated = false;
};

// Runs a child to its end. The child gets SIGKILL if this process dies
// (PR_SET_PDEATHSIG), so a killed worker never leaves work running without an
// owner. `on_start` gets the child's pid (to forward signals). Unavailable when
// it cannot be started.
StatusOr<ChildResult> RunChild(const ChildOptions& o,
                               const std::function<void(int pid)>& on_start = nullptr);

// SIGTERM / SIGINT call `on_stop` from a signal handler: it must be
// async-signal-safe (e.g. store an atomic). Later signals call it again.
void OnStopSignals(void (*on_stop)(int sig));

// "2024-05-01T12:00:00.123Z" for store-clock milliseconds.
std::string FormatMillisUtc(int64_t millis);

// Parses "name=value".
std::optional<std::pair<std::string, std::string>> SplitField(const std::string& kv);

}  // namespace dedup::cli

#endif  // DEDUP_CLI_COMMON_H_
