// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Flag helpers shared by the subcommands, so that every flag of the tool reads
// durations and fractions the same way.

#ifndef DEDUP_CLI_FLAGS_H_
#define DEDUP_CLI_FLAGS_H_

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "dedup/clock.h"

namespace dedup::cli {

// "250ms", "2s", "1.5s", "5m", "1h", or a bare number of milliseconds.
std::optional<Millis> ParseDuration(std::string_view text);
std::string FormatDuration(Millis d);  // "250ms", "2s", "5m", "1h"

// --name DURATION into *target; the help shows the current value as the default.
CLI::Option* AddDurationOption(CLI::App& app, const std::string& name, Millis* target,
                               const std::string& description);

// --name FRACTION (0 to 1) into *target.
CLI::Option* AddFractionOption(CLI::App& app, const std::string& name, double* target,
                               const std::string& description);

}  // namespace dedup::cli

#endif  // DEDUP_CLI_FLAGS_H_
