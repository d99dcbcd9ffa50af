// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "cli/common.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

extern char** environ;

namespace dedup::cli {

StatusOr<ChildResult> RunChild(const ChildOptions& o, const std::function<void(int)>& on_start) {
  if (o.argv.empty()) return Status::InvalidArgument("no command to run");
  int in_pipe[2] = {-1, -1}, out_pipe[2] = {-1, -1};
  if (o.stdin_data && pipe2(in_pipe, O_CLOEXEC) != 0) {
    return Status::Unavailable(std::string("pipe: ") + std::strerror(errno));
  }
  if ((o.capture_stdout || o.tee_fd >= 0) && pipe2(out_pipe, O_CLOEXEC) != 0) {
    if (in_pipe[0] >= 0) close(in_pipe[0]), close(in_pipe[1]);
    return Status::Unavailable(std::string("pipe: ") + std::strerror(errno));
  }
  // Everything the child needs is built before fork: after it only
  // async-signal-safe calls are allowed (other threads may hold locks).
  std::vector<std::string> env_store;
  for (char** e = environ; *e != nullptr; ++e) {
    std::string_view kv(*e);
    bool overridden = false;
    for (const auto& x : o.env) {
      const size_t eq = x.find('=');
      if (kv.substr(0, kv.find('=')) == std::string_view(x).substr(0, eq)) overridden = true;
    }
    if (!overridden) env_store.emplace_back(kv);
  }
  for (const auto& x : o.env) env_store.push_back(x);
  std::vector<char*> envp, argv;
  for (auto& s : env_store) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_store = o.argv;
  for (auto& s : argv_store) argv.push_back(s.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();

  const pid_t pid = fork();
  if (pid < 0) {
    return Status::Unavailable(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    if (in_pipe[0] >= 0) dup2(in_pipe[0], STDIN_FILENO);
    if (out_pipe[1] >= 0) dup2(out_pipe[1], STDOUT_FILENO);
    execvpe(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (on_start) on_start(pid);
  if (in_pipe[0] >= 0) close(in_pipe[0]);
  if (out_pipe[1] >= 0) close(out_pipe[1]);

  ChildResult res;
  size_t written = 0;
  int in_fd = in_pipe[1], out_fd = out_pipe[0];
  if (in_fd >= 0) fcntl(in_fd, F_SETFL, O_NONBLOCK);
  if (in_fd >= 0 && o.stdin_data->empty()) close(in_fd), in_fd = -1;
  char buf[65536];
  while (in_fd >= 0 || out_fd >= 0) {
    pollfd fds[2];
    int n = 0;
    if (in_fd >= 0) fds[n++] = {in_fd, POLLOUT, 0};
    if (out_fd >= 0) fds[n++] = {out_fd, POLLIN, 0};
    if (poll(fds, n, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < n; ++i) {
      if (fds[i].revents == 0) continue;
      if (fds[i].fd == in_fd) {
        const ssize_t w = write(in_fd, o.stdin_data->data() + written,
                                o.stdin_data->size() - written);
        if (w > 0) written += static_cast<size_t>(w);
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || written == o.stdin_data->size()) {
          close(in_fd);  // done, or the child closed its stdin (EPIPE)
          in_fd = -1;
        }
      } else {
        const ssize_t r = read(out_fd, buf, sizeof(buf));
        if (r > 0) {
          if (o.tee_fd >= 0) (void)!write(o.tee_fd, buf, static_cast<size_t>(r));
          if (o.capture_stdout) {
            const size_t room = o.max_output - std::min(o.max_output, res.output.size());
            res.output.append(buf, std::min(room, static_cast<size_t>(r)));
            if (static_cast<size_t>(r) > room) res.truncated = true;
          }
        } else if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
          close(out_fd);
          out_fd = -1;
        }
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFSIGNALED(status)) {
    res.signal = WTERMSIG(status);
  } else {
    res.exit_code = WEXITSTATUS(status);
  }
  return res;
}

void OnStopSignals(void (*on_stop)(int)) {
  struct sigaction sa{};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

std::string FormatMillisUtc(int64_t millis) {
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

}  // namespace dedup::cli
