// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The handler of tests/worker_chaos_test.sh: its "effect" is one line appended
// (O_APPEND, one write) to the ledger file $LEDGER:
//   key fence attempt start_us end_us worker_pid
// It reads the payload from stdin, works $WORK_MS ms (default 2), or $SLOW_MS ms
// for keys whose number is a multiple of $SLOW_EVERY (default: none), then writes.

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace {

long long NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

long long EnvInt(const char* name, long long def) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? std::atoll(v) : def;
}

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

}  // namespace

int main() {
  const long long start = NowMicros();
  char buf[4096];
  while (read(STDIN_FILENO, buf, sizeof(buf)) > 0) {
  }
  const std::string key = Env("DEDUP_KEY");
  const std::string ledger = Env("LEDGER");
  if (key.empty() || ledger.empty()) {
    std::fprintf(stderr, "worker_ledger_handler: DEDUP_KEY and LEDGER must be set\n");
    return 2;
  }
  long long work_ms = EnvInt("WORK_MS", 2);
  const long long slow_every = EnvInt("SLOW_EVERY", 0);
  if (slow_every > 0) {
    size_t i = key.size();
    while (i > 0 && key[i - 1] >= '0' && key[i - 1] <= '9') --i;
    if (i < key.size() && std::atoll(key.c_str() + i) % slow_every == 0) {
      work_ms = EnvInt("SLOW_MS", 3000);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(work_ms));
  const int fd = open(ledger.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::perror("worker_ledger_handler: open ledger");
    return 75;
  }
  const std::string line = key + " " + Env("DEDUP_FENCE") + " " + Env("DEDUP_ATTEMPT") + " " +
                           std::to_string(start) + " " + std::to_string(NowMicros()) + " " +
                           Env("DEDUP_WORKER_PID") + "\n";
  const bool ok = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  return ok ? 0 : 75;
}
