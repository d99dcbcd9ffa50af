// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup`: the command-line tool. Each subcommand lives in its own
// `<name>_command.cc`; see command.h for how to add one.

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "cli/command.h"
#include "cli/common.h"  // worker, publish, exec, inspect, forget
#include "core/printable.h"
#include "core/redact.h"
#include "core/secret.h"

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

// Every numeric option of every subcommand reads its value one way, before any
// check of its own (a transform runs ahead of the option's Range), naming the
// flag ("--max-connections: must be a whole number, got an empty value ..."):
//   * an empty value (an unset "$VAR") is refused: CLI11 reads "" as 0, and
//     `serve --max-connections ''` was the default, `--threads ''` 0 threads;
//   * a whole number is decimal digits, after a '-' only where the type is
//     signed: CLI11 read "-1" into an unsigned option as 2^64 - 1 (publish
//     --count -1 never ended), "010" as octal 8 and "0x10" as 16;
//   * a FLOAT (FRACTION: AddFractionOption) is a finite decimal number ("nan"
//     passed CLI::Range(0.0, 1.0)).
// Numbers are told by CLI11's type name: UINT, INT, FLOAT; an option given
// another type name (a URI, a DURATION) checks its own value. A Range still
// applies after (to the number as written in decimal).
std::string CheckWhole(std::string& v, bool is_signed) {
  if (v.empty()) {
    return "must be a whole number, got an empty value (an unset variable?)";
  }
  const char* end = v.data() + v.size();
  if (v[0] == '-' && !is_signed) {
    return "must not be negative, got " + v;
  }
  int64_t n = 0;
  uint64_t u = 0;
  auto [p, ec] = is_signed ? std::from_chars(v.data(), end, n) : std::from_chars(v.data(), end, u);
  if (ec == std::errc::result_out_of_range) {
    return "must be a whole number from " +
           (is_signed ? std::to_string(INT64_MIN) + " to " + std::to_string(INT64_MAX)
                      : "0 to " + std::to_string(UINT64_MAX)) +
           ", got " + v;
  }
  if (ec != std::errc() || p != end) return "must be a whole number, got '" + v + "'";
  v = is_signed ? std::to_string(n) : std::to_string(u);  // "010" is 10, not CLI11's octal 8
  return std::string();
}

std::string CheckFloat(std::string& v) {
  if (v.empty()) return "must be a number, got an empty value (an unset variable?)";
  double d = 0;
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, d);
  if (ec != std::errc() || p != end || !std::isfinite(d)) {
    return "must be a number, got '" + v + "'";
  }
  return std::string();
}

void CheckNumbers(CLI::App* app) {
  static const CLI::Validator kUnsigned(
      [](std::string& v) { return CheckWhole(v, /*is_signed=*/false); }, "", "WHOLE");
  static const CLI::Validator kSigned(
      [](std::string& v) { return CheckWhole(v, /*is_signed=*/true); }, "", "WHOLE");
  static const CLI::Validator kFloat(CheckFloat, "", "NUMBER");
  for (CLI::Option* o : app->get_options()) {
    std::string type = o->get_type_name();  // "INT:INT in [1 - 1024]" with a Range
    type.resize(std::min(type.size(), type.find(':')));
    if (type == "UINT") {
      o->transform(kUnsigned);
    } else if (type == "INT") {
      o->transform(kSigned);
    } else if (type == "FLOAT" || type == "FRACTION") {
      o->transform(kFloat);
    }
  }
  for (CLI::App* sub : app->get_subcommands({})) CheckNumbers(sub);
}

// dedup's secrets in its environment (DEDUP_REDIS_PASSWORD: core/secret.h) stay
// readable by getenv, and leave the block /proc/PID/environ shows: that is the
// environment as the process was started (setenv never rewrites it), and every
// process of the same user reads it: a handler (/proc/$DEDUP_WORKER_PID/environ,
// dedup exec's command its parent's), `ps e`. Handlers do not inherit them
// (consumer/handler_process.cc); this keeps them from reading them there. The
// value is copied to the heap (setenv), then its bytes in the block are zeroed.
// Run first, before any thread.
void HideSecretEnv() {
  for (const char* name : dedup::internal::kSecretEnvVars) {
    char* value = std::getenv(name);
    if (value == nullptr) continue;
    const std::string copy(value);
    if (setenv(name, copy.c_str(), 1) != 0) continue;  // kept where it was
    if (std::getenv(name) != value) std::memset(value, 0, copy.size());
  }
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

// The subcommand argv[1] names, when options follow it; else null.
CLI::App* SubcommandWithOptions(CLI::App& app, int argc, char** argv) {
  if (argc < 3) return nullptr;
  CLI::App* sub = nullptr;
  for (CLI::App* s : app.get_subcommands({})) {
    if (s->check_name(argv[1])) sub = s;
  }
  return sub;
}

// After a failed parse: CLI11 answers a mistyped option with whatever it checks
// first ("--broker is required" for --brokr; "The following arguments were not
// expected: 2 --concurency"). Names the first --option the subcommand does not
// know, and the closest one it does. False when there is none.
bool NameUnknownOption(CLI::App& app, int argc, char** argv) {
  CLI::App* sub = SubcommandWithOptions(app, argc, argv);
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

// CLI11 splits a comma-separated value (bench --workers 1,2,8) and drops its
// empty items: `--workers 1,,2` ran at 1 and 2, `--phase consumer,` as if the
// comma were not there. An empty item (a typo, an unset "$VAR" in a list) is
// refused, naming the flag, before the parse runs the command (an empty value
// as a whole is left to the option's own check: CheckNumbers for --workers). Walks argv as
// NameUnknownOption does: `--name=LIST`, and the values that follow `--name`.
bool RefuseEmptyListItem(CLI::App& app, int argc, char** argv) {
  CLI::App* sub = SubcommandWithOptions(app, argc, argv);
  if (sub == nullptr) return false;
  const CLI::Option* list = nullptr;  // the delimited option whose values follow
  for (int i = 2; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") break;  // what follows is a command (dedup exec)
    const CLI::Option* opt = list;
    std::string value = arg;
    if (arg.rfind("-", 0) == 0 && arg.size() > 1) {
      list = nullptr;
      const size_t eq = arg.find('=');
      opt = arg.rfind("--", 0) == 0 ? sub->get_option_no_throw(arg.substr(0, eq)) : nullptr;
      if (opt == nullptr || opt->get_delimiter() == '\0') continue;
      if (eq == std::string::npos) {
        list = opt;
        continue;
      }
      value = arg.substr(eq + 1);
    }
    if (opt == nullptr) continue;
    const char d = opt->get_delimiter();
    if (!value.empty() && (value.front() == d || value.back() == d ||
        value.find(std::string(2, d)) != std::string::npos)) {
      std::fprintf(stderr,
                   "dedup %s: %s: an empty item in '%s' (a list is values separated by '%c', "
                   "none empty)\n",
                   sub->get_name().c_str(), opt->get_name().c_str(),
                   dedup::internal::RedactWords(dedup::internal::Printable(value)).c_str(), d);
      return true;
    }
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  HideSecretEnv();
  CLI::App app{"dedup: exactly-once processing over at-least-once brokers"};
  app.require_subcommand(1);
  app.set_version_flag("--version", DEDUP_VERSION);
  dedup::cli::CommandContext ctx;
  for (dedup::cli::RegisterCommand add : kCommands) add(app, ctx);
  CheckNumbers(&app);
  if (argc > 1 && !KnownSubcommand(app, argv[1])) return dedup::cli::kExitUsage;
  if (RefuseEmptyListItem(app, argc, argv)) return dedup::cli::kExitUsage;
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
