// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup`: the command-line tool. Each subcommand lives in its own
// `<name>_command.cc`; see command.h for how to add one.

#include <CLI/CLI.hpp>

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <sstream>

#include "cli/command.h"
#include "cli/common.h"  // worker, publish, exec, inspect, forget
#include "core/printable.h"
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
#ifdef DEDUP_WITH_SERVE
    &dedup::cli::RegisterServe,
#endif
};

// CLI11 reads "-1" into an unsigned option as 2^64 - 1 (publish --count -1 never
// ends, --seed -1 is a huge seed): every unsigned option, in every subcommand,
// refuses negative numbers. Options with a range already name it.
void RefuseNegativeUnsigned(CLI::App* app) {
  static const CLI::Validator kWhole(
      [](std::string& v) -> std::string {
        uint64_t n = 0;
        auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
        if (!v.empty() && v[0] == '-') return "must not be negative, got " + v;
        if (v.empty() || ec != std::errc() || p != v.data() + v.size()) {
          return "must be a whole number from 0 to 18446744073709551615, got " + v;
        }
        return std::string();
      },
      "", "WHOLE");
  for (CLI::Option* o : app->get_options()) {
    if (o->get_type_name().rfind("UINT", 0) == 0) o->check(kWhole);
  }
  for (CLI::App* sub : app->get_subcommands({})) RefuseNegativeUnsigned(sub);
}

// CLI11 answers an unknown subcommand with "A subcommand is required": name it.
bool KnownSubcommand(CLI::App& app, const char* arg) {
  if (arg[0] == '-') return true;  // an option: CLI11 says what is wrong
  for (CLI::App* sub : app.get_subcommands({})) {
    if (sub->check_name(arg)) return true;
  }
  std::string known;
  for (CLI::App* sub : app.get_subcommands({})) known += (known.empty() ? "" : ", ") + sub->get_name();
  std::fprintf(stderr, "dedup: unknown subcommand '%s' (known: %s)\n",
               dedup::internal::RedactUri(dedup::internal::Printable(arg)).c_str(), known.c_str());
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dedup: exactly-once processing over at-least-once brokers"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DEDUP_VERSION);
  dedup::cli::CommandContext ctx;
  for (dedup::cli::RegisterCommand add : kCommands) add(app, ctx);
  RefuseNegativeUnsigned(&app);
  if (argc > 1 && !KnownSubcommand(app, argv[1])) return dedup::cli::kExitUsage;
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
