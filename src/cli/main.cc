// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup`: the command-line tool. Each subcommand lives in its own
// `<name>_command.cc`; see command.h for how to add one.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

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

// Edit distance, for "did you mean".
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

// After a failed parse: CLI11 answers a mistyped option with whatever it checks
// first ("--broker is required" for --brokr; "The following arguments were not
// expected: 2 --concurency"). Names the first --option the subcommand does not
// know, and the closest one it does. False when there is none.
bool NameUnknownOption(CLI::App& app, int argc, char** argv) {
  if (argc < 3) return false;
  CLI::App* sub = nullptr;
  for (CLI::App* s : app.get_subcommands({})) {
    if (s->check_name(argv[1])) sub = s;
  }
  if (sub == nullptr) return false;
  const CLI::Option* takes_value = nullptr;  // the option before, when it wants a value
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;  // what follows is a command (dedup exec)
    if (takes_value != nullptr || arg.rfind("--", 0) != 0 || arg.size() < 3) {
      takes_value = nullptr;
      continue;
    }
    const std::string name = arg.substr(0, arg.find('='));
    const CLI::Option* opt = sub->get_option_no_throw(name);
    if (opt != nullptr) {
      takes_value = arg.find('=') == std::string::npos && opt->get_items_expected_max() > 0
                        ? opt : nullptr;
      continue;
    }
    std::string best;
    size_t best_distance = 4;  // suggest only what is close
    for (const CLI::Option* o : sub->get_options()) {
      for (const std::string& l : o->get_lnames()) {
        const size_t d = Distance(name.substr(2), l);
        if (d < best_distance) best = "--" + l, best_distance = d;
      }
    }
    std::fprintf(stderr, "dedup %s: unknown option '%s'%s%s%s (dedup %s --help lists them)\n",
                 sub->get_name().c_str(),
                 dedup::internal::RedactWords(dedup::internal::Printable(name)).c_str(),
                 best.empty() ? "" : " (did you mean ", best.c_str(), best.empty() ? "" : "?)",
                 sub->get_name().c_str());
    return true;
  }
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
    if (e.get_exit_code() != 0 && NameUnknownOption(app, argc, argv)) {
      return dedup::cli::kExitUsage;
    }
    // --help and --version are "errors" with exit code 0.
    // CLI11 echoes unexpected arguments (a URI split by a blank): redacted. It
    // echoes a flag's bad value too: escaped, line by line, as a key is (an ESC
    // byte in "--lease 5<ESC>[2J" would reach the terminal).
    std::ostringstream out, err;
    const int code = app.exit(e, out, err);
    std::fputs(out.str().c_str(), stdout);
    std::string shown;
    std::istringstream lines(err.str());
    for (std::string line; std::getline(lines, line);) {
      shown += dedup::internal::RedactWords(dedup::internal::Printable(line)) + "\n";
    }
    std::fputs(shown.c_str(), stderr);
    return code == 0 ? dedup::cli::kExitOk : dedup::cli::kExitUsage;
  }
  return ctx.exit_code;
}
