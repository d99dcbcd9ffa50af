// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Helpers shared by the worker, publish, exec, inspect and forget subcommands:
// stop signals and times for people. Handler processes: src/consumer/handler_process.h.
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
#include "dedup/store.h"

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

// The exit code for a resource that could not be had at start-up (a store that
// could not be opened, a port that could not be bound) or a failed call on an
// open store (inspect, forget): 75 (try again later) when waiting can help: the
// store is unreachable, it or the port is held by another process (a rocksdb:
// directory serves one process at a time), both Unavailable; or the disk is
// full (ResourceExhausted: nothing happened, free space). Else 2: the URI, the
// address, their options or the store's state are for a person to fix.
int ExitCodeFor(const Status& s);

// SIGTERM / SIGINT call `on_stop` from a signal handler: it must be
// async-signal-safe (e.g. store an atomic). Later signals call it again.
void OnStopSignals(void (*on_stop)(int sig));

// "2024-05-01T12:00:00.123Z" for store-clock milliseconds; "never" past year
// 9999 (a record kept for ever), and a plain count of ms before 1970.
std::string FormatMillisUtc(int64_t millis);

// Open options whose on_warning prints each store warning to stderr, once, as
// "<who>: warning: ..." (e.g. Redis with an evicting maxmemory-policy or no AOF).
OpenOptions WarnOnStderr(std::string who);

// A --lease under 1 s given to a command that runs real work (`dedup exec`,
// `dedup worker`) is legal but rarely meant ("30ms" typed for "30s"): the work is
// stopped when it outlives it. Says so on stderr, as "<who>: warning: ...".
void WarnIfShortLease(const char* who, Millis lease);

// Parses "name=value".
std::optional<std::pair<std::string, std::string>> SplitField(const std::string& kv);

}  // namespace dedup::cli

#endif  // DEDUP_CLI_COMMON_H_
