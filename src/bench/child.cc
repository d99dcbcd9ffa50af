// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "bench/child.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

namespace dedup::bench {

pid_t SpawnSelf(const std::vector<std::string>& args, const std::string& stderr_path) {
  std::vector<std::string> all = {"dedup"};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    if (const int null = open("/dev/null", O_WRONLY); null >= 0) dup2(null, STDOUT_FILENO);
    if (!stderr_path.empty()) {
      const int err = open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
      if (err >= 0) dup2(err, STDERR_FILENO);
    }
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  return pid;
}

std::optional<json> RunPhaseInChild(const BenchContext& ctx, const std::string& phase, std::string* error) {
  std::vector<std::string> args = {"dedup", "bench", "--phase", phase, "--json", "--no-progress",
                                   "--no-redis", "--isolated-child"};
  if (ctx.options.quick) args.push_back("--quick");
  if (ctx.options.full) args.push_back("--full");
  if (ctx.options.no_rocksdb) args.push_back("--no-rocksdb");
  int out[2];
  if (pipe(out) != 0) {
    *error = "pipe failed";
    return std::nullopt;
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    *error = "fork failed";
    close(out[0]);
    close(out[1]);
    return std::nullopt;
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv("/proc/self/exe", argv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[65536];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0) {
      if (errno == EINTR) continue;
      break;
    }
    text.append(buf, static_cast<size_t>(n));
  }
  close(out[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(st) || (WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 1)) {
    *error = "phase " + phase + " in its own process: exit status " + std::to_string(st);
    return std::nullopt;
  }
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains(phase)) {
    *error = "phase " + phase + " in its own process: no JSON section '" + phase + "'";
    return std::nullopt;
  }
  return j[phase];
}

}  // namespace dedup::bench
