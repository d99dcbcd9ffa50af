// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup`: the command-line tool. Each subcommand lives in its own
// `<name>_command.cc`; see command.h for how to add one.

#include <CLI/CLI.hpp>

#include <cstdio>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"  // worker, publish, exec, inspect, forget
#include "core/redact.h"

namespace {

// One line per subcommand.
constexpr dedup::cli::RegisterCommand kCommands[] = {
    &dedup::cli::RegisterSimulate,
#ifdef DEDUP_WITH_REDIS_STREAMS
    &dedup::cli::RegisterWorker,
    &dedup::cli::RegisterPublish,
#endif
    &dedup::cli::RegisterExec,
    &dedup::cli::RegisterInspect,
    &dedup::cli::RegisterForget,
    &dedup::cli::RegisterBench,
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dedup: exactly-once processing over at-least-once brokers"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DEDUP_VERSION);
  dedup::cli::CommandContext ctx;
  for (dedup::cli::RegisterCommand add : kCommands) add(app, ctx);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version are "errors" with exit code 0.
    // CLI11 echoes unexpected arguments (a URI split by a blank): redacted.
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    std::fputs(out.str().c_str(), stdout);
    std::fputs(dedup::internal::RedactWords(err.str()).c_str(), stderr);
    return code == 0 ? dedup::cli::kExitOk : dedup::cli::kExitUsage;
  }
  return ctx.exit_code;
}
