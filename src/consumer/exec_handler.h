// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The handler of `dedup worker --exec`: runs one command per delivery under a
// HandlerSupervisor (src/consumer/handler_process.h) and turns how it ended into
// the HandlerResult the Buffer records (Judge / ToHandlerResult).
//
//   stdin        the delivery's attributes as a JSON object (a Redis stream
//                entry's fields), or its payload as it is (amqp://, nats://)
//   environment  DEDUP_KEY, DEDUP_FENCE, DEDUP_ATTEMPT, DEDUP_ENTRY_ID (the
//                broker's delivery id), DEDUP_WORKER_PID
//   argv         `/bin/sh -c COMMAND`, or COMMAND split on spaces (no shell),
//                made once by Make(), not per delivery
//
// A key holding a NUL byte cannot be carried by DEDUP_KEY: Fail (dead-lettered),
// never run. A kept output longer than max_output is a Fail, never recorded cut
// off. Safe for concurrent Run() calls (the supervisor is).

#ifndef DEDUP_CONSUMER_EXEC_HANDLER_H_
#define DEDUP_CONSUMER_EXEC_HANDLER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "consumer/handler_process.h"
#include "dedup/buffer.h"
#include "dedup/consumer.h"
#include "dedup/status.h"
#include "dedup/store.h"

namespace dedup {

struct ExecHandlerOptions {
  // The command (`--exec`). Required.
  std::string command;
  // Run `command` through `/bin/sh -c` (true), or split it on whitespace and run
  // it directly (false: no shell per delivery; its program must exist).
  // Default: true.
  bool shell = true;
  // What the handler reads on stdin. Default: the attributes as JSON.
  enum class Stdin : uint8_t { kAttributesJson, kPayload };
  Stdin stdin_format = Stdin::kAttributesJson;
  // Keep the handler's stdout as the result (at most max_output bytes; more is a
  // Fail). Default: false.
  bool keep_output = false;
  size_t max_output = kMaxResultBytes;
  // Called after each run with how long the handler took and its result (the
  // worker's handler-duration histogram). Default: none.
  std::function<void(std::chrono::steady_clock::duration, const HandlerResult&)> observe;
};

class ExecHandler {
 public:
  // The argv of `options.command`: InvalidArgument for an empty or blank
  // command (in a shell it would run nothing and exit 0); NotFound /
  // PermissionDenied when its program cannot be run (ResolveCommand): without the
  // shell always, with it when the first word is a plain path ("./charge.sh").
  [[nodiscard]] static StatusOr<std::vector<std::string>> Argv(const ExecHandlerOptions& options);

  // `supervisor` is not owned and must outlive the handler. `argv` is what
  // Argv(options) returned: a caller checks the command once, before it starts
  // the supervisor, and the handler runs that argv (no second PATH lookup).
  [[nodiscard]] static StatusOr<std::unique_ptr<ExecHandler>> Make(
      HandlerSupervisor* supervisor, ExecHandlerOptions options, std::vector<std::string> argv);

  // Runs the command for `d` to its end. With `claim`, the handler is stopped
  // when the claim's lease is lost. `keep_output` overrides the option's (the
  // SQL output of `--sql-output` is always kept).
  HandlerResult Run(const Delivery& d, uint64_t fence, uint32_t attempt,
                    const ClaimGuard* claim = nullptr) const {
    return Run(d, fence, attempt, claim, options_.keep_output);
  }
  HandlerResult Run(const Delivery& d, uint64_t fence, uint32_t attempt, const ClaimGuard* claim,
                    bool keep_output) const;

  HandlerSupervisor& supervisor() const { return *supervisor_; }

 private:
  ExecHandler(HandlerSupervisor* supervisor, ExecHandlerOptions options,
              std::vector<std::string> argv);
  HandlerResult RunCommand(const Delivery& d, uint64_t fence, uint32_t attempt,
                           const ClaimGuard* claim, bool keep_output) const;

  HandlerSupervisor* const supervisor_;
  const ExecHandlerOptions options_;
  const std::vector<std::string> argv_;
  const std::string worker_pid_env_;  // DEDUP_WORKER_PID=..., made once
};

}  // namespace dedup

#endif  // DEDUP_CONSUMER_EXEC_HANDLER_H_
