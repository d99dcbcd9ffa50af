// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "cli/flags.h"

#include <charconv>
#include <cmath>

namespace dedup::cli {

std::optional<Millis> ParseDuration(std::string_view text) {
  size_t unit_at = 0;
  while (unit_at < text.size() &&
         ((text[unit_at] >= '0' && text[unit_at] <= '9') || text[unit_at] == '.')) {
    ++unit_at;
  }
  if (unit_at == 0) return std::nullopt;
  const std::string number(text.substr(0, unit_at));
  const std::string_view unit = text.substr(unit_at);
  double value = 0;
  try {
    size_t used = 0;
    value = std::stod(number, &used);
    if (used != number.size()) return std::nullopt;
  } catch (const std::exception&) {
    return std::nullopt;
  }
  double scale = 0;
  if (unit.empty() || unit == "ms") {
    scale = 1;
  } else if (unit == "s") {
    scale = 1000;
  } else if (unit == "m") {
    scale = 60'000;
  } else if (unit == "h") {
    scale = 3'600'000;
  } else {
    return std::nullopt;
  }
  const double ms = value * scale;
  if (!std::isfinite(ms) || ms > 1e15) return std::nullopt;
  return Millis(static_cast<int64_t>(std::llround(ms)));
}

std::string FormatDuration(Millis d) {
  const int64_t ms = d.count();
  if (ms != 0 && ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms != 0 && ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms != 0 && ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

CLI::Option* AddDurationOption(CLI::App& app, const std::string& name, Millis* target,
                               const std::string& description) {
  CLI::Option* opt = app.add_option_function<std::string>(
      name,
      [target, name](const std::string& text) {
        std::optional<Millis> d = ParseDuration(text);
        if (!d) {
          throw CLI::ValidationError(name, "'" + text +
                                               "' is not a duration (e.g. 250ms, 2s, 5m, 1h)");
        }
        *target = *d;
      },
      description);
  opt->type_name("DURATION");
  opt->default_str(FormatDuration(*target));
  return opt;
}

CLI::Option* AddFractionOption(CLI::App& app, const std::string& name, double* target,
                               const std::string& description) {
  CLI::Option* opt = app.add_option(name, *target, description);
  opt->type_name("FRACTION")->check(CLI::Range(0.0, 1.0))->capture_default_str();
  return opt;
}

}  // namespace dedup::cli
