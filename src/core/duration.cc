// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/duration.h"

#include <cstdint>

#include "dedup/store.h"

namespace dedup::internal {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

}  // namespace

StatusOr<Millis> ParseDuration(std::string_view text, std::string_view what) {
  const auto fail = [&](std::string_view why) {
    return Status::InvalidArgument(std::string(what) + " '" + std::string(text) + "' " +
                                   std::string(why));
  };
  const auto bad = [&] { return fail("is not a duration (e.g. 250ms, 1.5s, 2m, 1h, 1d)"); };
  if (!text.empty() && text[0] == '-') return fail("is negative (durations are >= 0)");
  size_t i = 0;
  while (i < text.size() && IsDigit(text[i])) ++i;
  const std::string_view whole = text.substr(0, i);
  std::string_view frac;
  if (i < text.size() && text[i] == '.') {
    const size_t start = ++i;
    while (i < text.size() && IsDigit(text[i])) ++i;
    frac = text.substr(start, i - start);
    if (frac.empty()) return bad();
  }
  if (whole.empty()) return bad();
  const std::string_view unit = text.substr(i);
  int64_t scale = 0;
  if (unit.empty() || unit == "ms") scale = 1;
  else if (unit == "s") scale = 1000;
  else if (unit == "m") scale = 60'000;
  else if (unit == "h") scale = 3'600'000;
  else if (unit == "d") scale = 86'400'000;
  else return bad();

  // Exact integer arithmetic: whole * scale + frac * scale / 10^len(frac).
  const int64_t limit = kMaxDuration.count();
  int64_t w = 0;
  for (char c : whole) {
    if (w > limit) break;  // already too long; stop before overflowing
    w = w * 10 + (c - '0');
  }
  if (w > limit / scale) return fail("is longer than 10 years");
  int64_t ms = w * scale;
  if (!frac.empty()) {
    if (frac.size() > 9) return fail("has more than 9 decimals");
    int64_t f = 0, denom = 1;
    for (char c : frac) {
      f = f * 10 + (c - '0');
      denom *= 10;
    }
    // scale <= 8.64e7 and f < 1e9: the product fits in 64 bits.
    if ((f * scale) % denom != 0) return fail("is finer than a millisecond");
    ms += f * scale / denom;
  }
  if (ms > limit) return fail("is longer than 10 years");
  return Millis(ms);
}

std::string FormatDuration(Millis d) {
  const int64_t ms = d.count();
  if (ms == 0) return "0ms";
  if (ms % 86'400'000 == 0) return std::to_string(ms / 86'400'000) + "d";
  if (ms % 3'600'000 == 0) return std::to_string(ms / 3'600'000) + "h";
  if (ms % 60'000 == 0) return std::to_string(ms / 60'000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace dedup::internal
