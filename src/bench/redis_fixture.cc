// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "bench/redis_fixture.h"

#include <fcntl.h>
#include <spawn.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>
#include <vector>
#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
#include <hiredis/hiredis.h>

#include "core/secret.h"

extern char** environ;
#endif

namespace dedup::bench {

using namespace std::chrono_literals;

std::optional<RedisTarget> ParseRedisUri(const std::string& uri, std::string* error) {
#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
  // redis-benchmark and the bench's own connections: timeout= and password_file=.
  auto parsed = redis::ParseRedisUri(uri, {}, redis::Connections::kSingle);
  if (!parsed.ok()) {
    *error = "--redis: " + parsed.status().message();
    return std::nullopt;
  }
  const redis::ConnectionOptions& c = parsed->connection;
  if (c.cluster || c.db != 0) {
    *error = "--redis must be one server, database 0: redis://[user:password@]host:port";
    return std::nullopt;
  }
  RedisTarget t;
  t.host = c.endpoints.front().host;
  t.port = c.endpoints.front().port;
  t.user = c.user;
  if (c.has_password) t.password = c.password;
  const size_t q = uri.find('?');
  t.base_uri = uri.substr(0, q);
  // The parser took this query: '&'-separated name=value, names as written.
  for (std::string_view rest = q == std::string::npos ? "" : std::string_view(uri).substr(q + 1);
       !rest.empty();) {
    const size_t amp = rest.find('&');
    const std::string_view kv = rest.substr(0, amp);
    rest = amp == std::string_view::npos ? std::string_view() : rest.substr(amp + 1);
    const std::string_view name = kv.substr(0, kv.find('='));
    if (name == "timeout" || name == internal::kPasswordFileParam) {
      t.keep_params += (t.keep_params.empty() ? "" : "&") + std::string(kv);
    }
  }
  const internal::Uri& u = parsed->uri;
  const bool in_uri =
      u.has_password || (!u.user.empty() && !u.Param(internal::kPasswordFileParam));
  t.password_off_command_line = c.has_password && !in_uri;
  return t;
#else
  *error = "--redis '" + uri.substr(0, uri.find('@')) + "...': Redis is not compiled in";
  return std::nullopt;
#endif
}

std::string RedisTarget::Uri(const std::string& params) const {
  std::string q = keep_params;
  if (!params.empty()) q += (q.empty() ? "" : "&") + params;
  return q.empty() ? base_uri : base_uri + "?" + q;
}

#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
RedisConn::RedisConn(const RedisTarget& t) {
  redis::ConnectionOptions o;
  o.endpoints = {{t.host, t.port}};
  o.user = t.user;
  o.password = t.password;
  o.has_password = !t.password.empty();
  o.timeout = 5s;
  auto c = redis::Connection::Open(o.endpoints.front(), o);
  if (c.ok()) {
    conn = std::move(c).value();
  } else {
    open_error = c.status().ToString();
  }
}

std::string RedisConn::Command(const std::vector<std::string>& args) {
  const redis::Command cmd{args};
  const redis::Command* one[] = {&cmd};
  std::vector<redis::Reply> replies;
  if (!ok() || !conn->Pipeline(one, &replies, "bench").ok()) {
    conn.reset();
    return "";
  }
  const redisReply* r = replies[0].get();
  if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
  if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
    return std::string(redis::ReplyText(r));
  }
  return "";
}

long long RedisConn::InfoField(const std::string& section, const std::string& field) {
  const std::string text = Command({"INFO", section});
  const auto at = text.find(field + ":");
  if (at == std::string::npos) return -1;
  return std::atoll(text.c_str() + at + field.size() + 1);
}

size_t RedisConn::Pipeline(const std::vector<std::vector<std::string>>& cmds) {
  if (!ok()) return cmds.size();
  std::vector<redis::Command> cs;
  cs.reserve(cmds.size());
  for (const auto& args : cmds) cs.push_back({args});
  std::vector<const redis::Command*> ptrs;
  for (const auto& c : cs) ptrs.push_back(&c);
  std::vector<redis::Reply> replies;
  if (!conn->Pipeline(ptrs, &replies, "bench").ok()) {
    conn.reset();
    return cmds.size();
  }
  size_t bad = 0;
  for (const auto& r : replies) bad += redis::IsError(r.get()) ? 1 : 0;
  return bad;
}

bool OwnRedis::Start(std::string* error) {
  dir_ = MakeTempDir("redis");
  for (int port = 6420; port <= 6429; ++port) {
    RedisTarget probe;
    probe.port = port;
    {
      RedisConn c(probe);
      if (c.ok()) continue;  // something listens there
    }
    const pid_t pid = fork();
    if (pid < 0) break;
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      const int devnull = open("/dev/null", O_RDWR);
      dup2(devnull, 1);
      dup2(devnull, 2);
      const std::string p = std::to_string(port), log = dir_ + "/redis.log";
      execlp("redis-server", "redis-server", "--port", p.c_str(), "--bind", "127.0.0.1", "--dir",
             dir_.c_str(), "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", log.c_str(),
             "--protected-mode", "no", static_cast<char*>(nullptr));
      _exit(127);
    }
    pid_ = pid;
    target_.port = port;
    target_.own = true;
    target_.base_uri = "redis://127.0.0.1:" + std::to_string(port);
    for (int i = 0; i < 200; ++i) {
      RedisConn c(target_);
      if (c.ok() && c.Command({"PING"}) == "PONG") return true;
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {  // exited: port taken meanwhile?
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(25ms);
    }
    Stop();
  }
  *error = "could not start redis-server on a free port in 6420-6429 (is redis-server installed?)";
  return false;
}
void OwnRedis::Stop() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    int st = 0;
    for (int i = 0; i < 100 && waitpid(pid_, &st, WNOHANG) == 0; ++i) std::this_thread::sleep_for(50ms);
    if (waitpid(pid_, &st, WNOHANG) == 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &st, 0);
    }
    pid_ = -1;
  }
  if (!dir_.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
    dir_.clear();
  }
}

// Runs `redis-benchmark ... --csv SET task_id:__rand_int__ processing NX EX 60`,
// with an argument vector and no shell: the URI's user name and password reach it as
// written (an ACL user name may hold ';', '$', '>'), and nothing of them is run.
RoundResult RunRedisBenchmark(const RedisTarget& t, int connections, int pipeline, uint64_t requests) {
  std::vector<std::string> args = {"redis-benchmark", "-h", t.host, "-p", std::to_string(t.port)};
  if (!t.password.empty()) {
    if (!t.user.empty()) args.insert(args.end(), {"--user", t.user});
    args.insert(args.end(), {"-a", t.password});  // redis-benchmark 7.0 has no --no-auth-warning
  }
  args.insert(args.end(), {"-c", std::to_string(connections), "-P", std::to_string(pipeline), "-n",
                           std::to_string(requests), "-r", "1000000000", "--csv", "SET",
                           "task_id:__rand_int__", "processing", "NX", "EX", "60"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  RoundResult r;
  int out_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    r.errors = 1;
    return r;
  }
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out_pipe[1], STDOUT_FILENO);
  posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int spawned = posix_spawnp(&pid, "redis-benchmark", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(out_pipe[1]);
  if (spawned != 0) {
    close(out_pipe[0]);
    r.errors = 1;
    return r;
  }
  FILE* p = fdopen(out_pipe[0], "r");
  if (p == nullptr) {
    close(out_pipe[0]);
    int ignored;
    waitpid(pid, &ignored, 0);
    r.errors = 1;
    return r;
  }
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  fclose(p);
  int wstatus = 0;
  while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
  }
  const int st = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 1;
  // "SET task_id:__rand_int__ ...","rps","avg","min","p50","p95","p99","max"
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("\"SET", 0) != 0) continue;
    std::vector<std::string> cols;
    for (size_t i = 0; i < line.size();) {
      const size_t a = line.find('"', i);
      if (a == std::string::npos) break;
      const size_t b = line.find('"', a + 1);
      if (b == std::string::npos) break;
      cols.push_back(line.substr(a + 1, b - a - 1));
      i = b + 1;
    }
    if (cols.size() >= 7) {
      r.rate = std::atof(cols[1].c_str());
      r.p50_us = std::atof(cols[4].c_str()) * 1000;
      r.p99_us = std::atof(cols[6].c_str()) * 1000;
      r.messages = requests;
    }
  }
  if (st != 0 || !std::isfinite(r.rate) || r.rate <= 0) {
    r.errors = 1;
    r.rate = NAN;
  }
  return r;
}
#endif  // DEDUP_WITH_REDIS || DEDUP_WITH_REDIS_STREAMS

}  // namespace dedup::bench
