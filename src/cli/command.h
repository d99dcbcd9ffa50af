// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// How a subcommand joins the `dedup` tool: one file `<name>_command.cc` (picked up
// by src/cli/CMakeLists.txt) that defines a Register function, and one line in
// the table of main.cc. The Register function adds its CLI::App under the root
// and sets `ctx.exit_code` from its callback; main returns that code.
//
// Exit codes, shared by every subcommand:
//   0  done, and every check passed
//   1  done, but a check failed (e.g. simulate: a must-be-zero count is not zero)
//   2  bad usage: a flag, an argument or a store URI that does not work

#ifndef DEDUP_CLI_COMMAND_H_
#define DEDUP_CLI_COMMAND_H_

namespace CLI {
class App;
}  // namespace CLI

namespace dedup::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;
inline constexpr int kExitUsage = 2;

struct CommandContext {
  int exit_code = kExitOk;
};

using RegisterCommand = void (*)(CLI::App& root, CommandContext& ctx);

void RegisterSimulate(CLI::App& root, CommandContext& ctx);
void RegisterBench(CLI::App& root, CommandContext& ctx);
void RegisterServe(CLI::App& root, CommandContext& ctx);  // serve_command.cc

}  // namespace dedup::cli

#endif  // DEDUP_CLI_COMMAND_H_
