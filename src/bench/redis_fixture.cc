// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "bench/redis_fixture.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>
#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
#include <hiredis/hiredis.h>
#endif

namespace dedup::bench {

using namespace std::chrono_literals;

std::optional<RedisTarget> ParseRedisUri(const std::string& uri, std::string* error) {
  RedisTarget t;
  std::string rest = uri;
  if (rest.rfind("redis://", 0) != 0) {
    *error = "--redis must be redis://[user:password@]host:port, got '" + uri + "'";
    return std::nullopt;
  }
  rest = rest.substr(8);
  if (auto q = rest.find_first_of("?/"); q != std::string::npos) rest = rest.substr(0, q);
  if (auto at = rest.rfind('@'); at != std::string::npos) {
    const std::string auth = rest.substr(0, at);
    rest = rest.substr(at + 1);
    if (auto c = auth.find(':'); c != std::string::npos) {
      t.user = auth.substr(0, c);
      t.password = auth.substr(c + 1);
    } else {
      t.password = auth;
    }
  }
  const auto colon = rest.rfind(':');
  t.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  t.port = colon == std::string::npos ? 6379 : std::atoi(rest.c_str() + colon + 1);
  if (t.host.empty() || t.port <= 0 || t.port > 65535 ||
      t.host.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:") !=
          std::string::npos) {
    *error = "--redis: cannot read host:port of '" + uri + "'";
    return std::nullopt;
  }
  t.base_uri = uri.substr(0, uri.find('?'));
  return t;
}

#if defined(DEDUP_WITH_REDIS) || defined(DEDUP_WITH_REDIS_STREAMS)
RedisConn::RedisConn(const RedisTarget& t) {
  timeval tv{5, 0};
  c = redisConnectWithTimeout(t.host.c_str(), t.port, tv);
  if (c != nullptr && c->err == 0) {
    redisSetTimeout(c, tv);
    if (!t.password.empty()) {
      redisReply* r =
          t.user.empty()
              ? static_cast<redisReply*>(redisCommand(c, "AUTH %s", t.password.c_str()))
              : static_cast<redisReply*>(redisCommand(c, "AUTH %s %s", t.user.c_str(), t.password.c_str()));
      if (r) freeReplyObject(r);
    }
  }
}
RedisConn::~RedisConn() {
  if (c) redisFree(c);
}
bool RedisConn::ok() const { return c != nullptr && c->err == 0; }
std::string RedisConn::Command(const std::vector<std::string>& args) {
  if (!ok()) return "";
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  auto* r =
      static_cast<redisReply*>(redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data()));
  if (!r) return "";
  std::string out;
  if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS) {
    out.assign(r->str, r->len);
  } else if (r->type == REDIS_REPLY_INTEGER) {
    out = std::to_string(r->integer);
  }
  freeReplyObject(r);
  return out;
}
long long RedisConn::InfoField(const std::string& section, const std::string& field) {
  const std::string text = Command({"INFO", section});
  const auto at = text.find(field + ":");
  if (at == std::string::npos) return -1;
  return std::atoll(text.c_str() + at + field.size() + 1);
}
size_t RedisConn::Pipeline(const std::vector<std::vector<std::string>>& cmds) {
  if (!ok()) return cmds.size();
  for (auto& args : cmds) {
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (auto& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    redisAppendCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data());
  }
  size_t bad = 0;
  for (size_t i = 0; i < cmds.size(); ++i) {
    void* r = nullptr;
    if (redisGetReply(c, &r) != REDIS_OK || r == nullptr) {
      bad += cmds.size() - i;
      break;
    }
    if (static_cast<redisReply*>(r)->type == REDIS_REPLY_ERROR) ++bad;
    freeReplyObject(r);
  }
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

// Runs `redis-benchmark ... --csv SET task_id:__rand_int__ processing NX EX 60`.
RoundResult RunRedisBenchmark(const RedisTarget& t, int connections, int pipeline, uint64_t requests) {
  std::string cmd = "redis-benchmark -h " + t.host + " -p " + std::to_string(t.port);
  if (!t.password.empty()) {
    // Quoted for the shell; the password is never printed.
    std::string q = "'";
    for (char ch : t.password) q += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
    q += "'";
    cmd += (t.user.empty() ? "" : " --user " + t.user) + " -a " + q + " --no-auth-warning";
  }
  cmd += " -c " + std::to_string(connections) + " -P " + std::to_string(pipeline) + " -n " +
         std::to_string(requests) +
         " -r 1000000000 --csv SET task_id:__rand_int__ processing NX EX 60 2>/dev/null";
  RoundResult r;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) {
    r.errors = 1;
    return r;
  }
  std::string out;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) out.append(buf, n);
  const int st = pclose(p);
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
