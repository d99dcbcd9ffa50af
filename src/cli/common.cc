// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "cli/common.h"

#include "cli/command.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace dedup::cli {

int ExitCodeFor(const Status& s) {
  if (s.retryable() || s.code() == StatusCode::kResourceExhausted) return kExitTempFail;
  return kExitUsage;
}

void OnStopSignals(void (*on_stop)(int)) {
  struct sigaction sa{};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

std::string FormatMillisUtc(int64_t millis) {
  // Beyond year 9999 (a record kept for ever: a Redis key whose expiry was
  // removed by hand reads INT64_MAX), or before 1970: no date to show.
  constexpr int64_t kYear10000Ms = 253402300800000;
  if (millis >= kYear10000Ms) return "never";
  if (millis < 0) return "before 1970 (" + std::to_string(millis) + " ms)";
  const time_t secs = static_cast<time_t>(millis / 1000);
  tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm_year + 1900,
                t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                static_cast<int>(millis % 1000));
  return buf;
}

std::optional<std::pair<std::string, std::string>> SplitField(const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) return std::nullopt;
  return std::make_pair(kv.substr(0, eq), kv.substr(eq + 1));
}

OpenOptions WarnOnStderr(std::string who) {
  OpenOptions o;
  o.on_warning = [who = std::move(who)](const std::string& message) {
    std::fprintf(stderr, "%s: %s\n", who.c_str(), message.c_str());
  };
  return o;
}

void WarnIfShortLease(const char* who, Millis lease) {
  if (lease >= Millis(1000)) return;
  std::fprintf(stderr,
               "%s: warning: --lease %lldms is under 1s: work still running when it ends is "
               "stopped and retried (was %llds meant?)\n",
               who, static_cast<long long>(lease.count()), static_cast<long long>(lease.count()));
}

}  // namespace dedup::cli
