// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The one duration grammar of dedup, used by every CLI flag and every URI option:
//
//   DURATION = NUMBER [UNIT]       NUMBER = DIGITS [ "." DIGITS ]
//   UNIT     = "ms" | "s" | "m" | "h" | "d"        (none: milliseconds)
//
// e.g. 250ms, 1.5s, 2m, 1h, 1d. The value must be a whole number of milliseconds
// ("1.5ms" is refused), not negative, and at most kMaxDuration (10 years).

#ifndef DEDUP_SRC_CORE_DURATION_H_
#define DEDUP_SRC_CORE_DURATION_H_

#include <string>
#include <string_view>

#include "dedup/clock.h"
#include "dedup/status.h"

namespace dedup::internal {

// InvalidArgument "<what> '<text>' is not a duration (e.g. 250ms, 1.5s, 2m, 1h, 1d)"
// (or says it is negative, finer than a millisecond, or longer than 10 years).
StatusOr<Millis> ParseDuration(std::string_view text, std::string_view what);

// The shortest exact spelling in the grammar: "250ms", "1500ms", "2m", "1h", "1d".
// ParseDuration(FormatDuration(d)) == d for every d >= 0.
std::string FormatDuration(Millis d);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_DURATION_H_
