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

// --name DURATION into *target, in the one duration grammar (core/duration.h:
// 250ms, 1.5s, 2m, 1h, 1d), except that a number other than 0 needs a unit (the
// grammar reads a bare number as milliseconds, a trap on a flag typed by hand);
// the help shows the current value as the default, and the grammar in a footer.
// kPositive refuses 0 at parse time, naming the flag; so is anything above
// `max` (the library's own limit, e.g. ConsumerOptions::kMaxPrefetchTime): left
// to the library, it was refused only after the broker and the store were
// opened, without the flag's name, and as a temporary failure (exit 75, which a
// service manager restarts forever) when the broker could not be reached.
enum class DurationBound { kNonNegative, kPositive };
CLI::Option* AddDurationOption(CLI::App& app, const std::string& name, Millis* target,
                               const std::string& description,
                               DurationBound bound = DurationBound::kNonNegative,
                               Millis max = Millis::max());

// --name FRACTION (0 to 1) into *target.
CLI::Option* AddFractionOption(CLI::App& app, const std::string& name, double* target,
                               const std::string& description);

// --handler-cgroup DIR into *target. An empty DIR (an unset $VAR) is refused at
// parse time, naming the flag: it would otherwise turn containment off silently.
CLI::Option* AddHandlerCgroupOption(CLI::App& app, std::string* target,
                                    const std::string& description);

}  // namespace dedup::cli

#endif  // DEDUP_CLI_FLAGS_H_
