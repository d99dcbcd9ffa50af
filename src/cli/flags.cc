// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "cli/flags.h"

#include "core/duration.h"

namespace dedup::cli {

CLI::Option* AddDurationOption(CLI::App& app, const std::string& name, Millis* target,
                               const std::string& description, DurationBound bound,
                               Millis max) {
  CLI::Option* opt = app.add_option_function<std::string>(
      name,
      [target, name, bound, max](const std::string& text) {
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
