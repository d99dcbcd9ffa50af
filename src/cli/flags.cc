// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "cli/flags.h"

#include <string_view>

#include "core/duration.h"

namespace dedup::cli {

CLI::Option* AddDurationOption(CLI::App& app, const std::string& name, Millis* target,
                               const std::string& description, DurationBound bound,
                               Millis max) {
  CLI::Option* opt = app.add_option_function<std::string>(
      name,
      [target, name, bound, max](const std::string& text) {
        // A bare number is milliseconds in the grammar (URIs keep that), but on a
        // flag it is a trap: "--retention 86400" meant a day and kept the outcome
        // 86 s, "--lease 30" made a 30 ms lease. A flag needs a unit; 0 needs none.
        // Only a number the grammar reads ("30", "1.5"): ".5" and "5." are not
        // durations with a unit either, and were offered ".5s" and "5.s".
        const size_t dot = text.find('.');
        const auto digits = [](std::string_view t) {
          return !t.empty() && t.find_first_not_of("0123456789") == std::string_view::npos;
        };
        const bool number = dot == std::string::npos
                                ? digits(text)
                                : digits(std::string_view(text).substr(0, dot)) &&
                                      digits(std::string_view(text).substr(dot + 1));
        if (number && text.find_first_not_of("0.") != std::string::npos) {
          const bool whole = dot == std::string::npos;
          throw CLI::ValidationError(name + " '" + text + "' has no unit: write e.g. " + text +
                                     "s" + (whole ? " or " + text + "ms" : std::string()) +
                                     " (units: ms, s, m, h, d)");
        }
        StatusOr<Millis> d = internal::ParseDuration(text, name);
        if (!d.ok()) throw CLI::ValidationError(d.status().message());
        if (bound == DurationBound::kPositive && d->count() == 0) {
          throw CLI::ValidationError(name + " must be longer than 0, got '" + text + "'");
        }
        if (*d > max) {
          throw CLI::ValidationError(name + " must be at most " + internal::FormatDuration(max) +
                                     ", got '" + text + "'");
        }
        *target = *d;
      },
      description);
  opt->type_name("DURATION");
  opt->default_str(internal::FormatDuration(*target));
  app.footer("DURATION: a number and a unit, e.g. 250ms, 1.5s, 2m, 1h, 1d (0 needs no unit).\n");
  return opt;
}

CLI::Option* AddFractionOption(CLI::App& app, const std::string& name, double* target,
                               const std::string& description) {
  CLI::Option* opt = app.add_option(name, *target, description);
  opt->type_name("FRACTION")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  return opt;
}

CLI::Option* AddHandlerCgroupOption(CLI::App& app, std::string* target,
                                    const std::string& description) {
  CLI::Option* opt = app.add_option("--handler-cgroup", *target, description);
  opt->type_name("DIR")->check(CLI::Validator(
      [](std::string& v) -> std::string {
        if (!v.empty()) return std::string();
        return "must name a cgroup v2 directory, got an empty value (an unset variable?); "
               "leave the flag out to run handlers without a cgroup";
      },
      "", "DIR"));
  return opt;
}

}  // namespace dedup::cli
