// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "source_envs.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <thread>

#include "brokers/memory/memory_broker.h"
#include "dedup/record.h"
#include "test_process.h"
#ifdef DEDUP_WITH_REDIS_STREAMS
#include <hiredis/hiredis.h>

#include "brokers/redis_streams/streams_source.h"
#include "dedup/worker.h"
#include "redis_admin.h"
#endif

namespace dedup::testing {
namespace {

// ---- memory ---------------------------------------------------------------------

class MemoryEnv final : public SourceEnv {
 public:
  std::string Name() const override { return "memory"; }
  Status Reset(const SourceEnvOptions& o) override {
    MemoryBrokerOptions mo;
    mo.visibility_timeout = o.redelivery_after;
    broker_ = std::make_unique<MemoryBroker>(mo);
    return Status::Ok();
  }
  StatusOr<std::unique_ptr<MessageSource>> OpenSource() override {
    return std::unique_ptr<MessageSource>(broker_->Connect("conformance"));
  }
  Status Publish(std::string_view key, std::string_view payload) override {
    broker_->Publish(std::string(key), std::string(payload));
    return Status::Ok();
  }
  StatusOr<size_t> Outstanding() override { return broker_->counts().open; }
  StatusOr<std::vector<std::string>> DeadLetterReasons() override {
    std::vector<std::string> out;
    for (auto& [msg, reason] : broker_->DeadLetters()) out.push_back(reason);
    return out;
  }
  void Crash(std::unique_ptr<MessageSource> source) override {
    // Dropping a MemorySource abandons what it handed out (memory_broker.h).
    source.reset();
  }

 private:
  std::unique_ptr<MemoryBroker> broker_;
};

#ifdef DEDUP_WITH_REDIS_STREAMS

// ---- Redis Streams ----------------------------------------------------------------

// One redis-server for the whole test process, on the first free port in
// 6450-6459, in a temporary directory; SIGKILLed if this process dies
// (PR_SET_PDEATHSIG), stopped by PID at exit.
class StreamsServer {
 public:
  static StreamsServer* Get() {
    static StreamsServer* s = [] {
      auto* server = new StreamsServer();
      std::atexit([] { Get()->Stop(); });
      return server;
    }();
    return s;
  }
  bool ok() const { return port_ != 0; }
  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  StreamsServer() {
    if (const char* given = std::getenv("DEDUP_TEST_STREAMS_REDIS")) {
      std::string hp = given;
      const size_t c = hp.rfind(':');
      if (c != std::string::npos) {
        host_ = hp.substr(0, c);
        port_ = std::atoi(hp.c_str() + c + 1);
      }
      return;
    }
    char tmpl[] = "/tmp/dedup-consumer-conformance.XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return;
    dir_ = tmpl;
    for (int p = 6450; p <= 6459 && port_ == 0; ++p) {
      if (!PortFree(p)) continue;
      pid_ = fork();
      if (pid_ == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) _exit(1);
        std::freopen("/dev/null", "w", stdout);
        std::freopen("/dev/null", "w", stderr);
        const std::string port = std::to_string(p);
        execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1",
               "--dir", dir_.c_str(), "--save", "", "--appendonly", "no", "--daemonize", "no",
               static_cast<char*>(nullptr));
        _exit(127);
      }
      if (pid_ < 0) break;
      for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
           std::chrono::steady_clock::now() < until;
           std::this_thread::sleep_for(std::chrono::milliseconds(20))) {
        auto r = RedisCommand(host_, p, {"PING"});
        if (r.ok()) {
          port_ = p;
          break;
        }
        int st;
        if (waitpid(pid_, &st, WNOHANG) == pid_) {  // lost the port race, or no binary
          pid_ = -1;
          break;
        }
      }
      if (port_ == 0 && pid_ > 0) Stop();
    }
  }

  void Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int st;
      waitpid(pid_, &st, 0);
      pid_ = -1;
    }
    if (!dir_.empty()) {
      std::error_code ec;
      std::filesystem::remove_all(dir_, ec);
      dir_.clear();
    }
  }

  std::string host_ = "127.0.0.1";
  int port_ = 0;
  pid_t pid_ = -1;
  std::string dir_;
};

class RedisStreamsEnv final : public SourceEnv {
 public:
  std::string Name() const override { return "redis_streams"; }

  Status Reset(const SourceEnvOptions& o) override {
    StreamsServer* s = StreamsServer::Get();
    if (!s->ok()) return Status::Unavailable("no redis-server for the Redis Streams env");
    options_.host = s->host();
    options_.port = s->port();
    options_.stream = "conformance-" + Token::Random().ToHex();
    options_.group = "g";
    options_.block = Millis(50);
    options_.reclaim_min_idle = o.redelivery_after;
    options_.reclaim_interval = Millis(100);
    return Status::Ok();
  }

  StatusOr<std::unique_ptr<MessageSource>> OpenSource() override {
    WorkerOptions o = options_;
    o.consumer = "c" + std::to_string(++consumers_);
    return OpenRedisStreamsSource(o, Millis(30'000));
  }

  Status Publish(std::string_view key, std::string_view payload) override {
    std::vector<std::string> args = {"XADD", options_.stream, "*"};
    if (!key.empty()) args.insert(args.end(), {"id", std::string(key)});
    args.insert(args.end(), {"body", std::string(payload)});
    auto r = RedisCommand(options_.host, options_.port, args);
    return r.ok() ? Status::Ok() : r.status();
  }

  // Entries the group has not delivered yet, plus those pending.
  StatusOr<size_t> Outstanding() override {
    auto groups = RedisCommand(options_.host, options_.port, {"XINFO", "GROUPS", options_.stream});
    if (!groups.ok()) {
      // No stream or no group yet: every entry is outstanding.
      auto len = RedisCommand(options_.host, options_.port, {"XLEN", options_.stream});
      if (!len.ok()) return len.status();
      return static_cast<size_t>((*len)->integer);
    }
    std::string last_delivered = "0-0";
    long long pending = 0;
    const redisReply* gs = groups->get();
    for (size_t i = 0; i < gs->elements; ++i) {
      const redisReply* g = gs->element[i];
      bool ours = false;
      std::string ld;
      long long pend = 0;
      for (size_t j = 0; j + 1 < g->elements; j += 2) {
        std::string k(g->element[j]->str, g->element[j]->len);
        const redisReply* v = g->element[j + 1];
        if (k == "name") ours = std::string(v->str, v->len) == options_.group;
        if (k == "last-delivered-id") ld.assign(v->str, v->len);
        if (k == "pending") pend = v->integer;
      }
      if (ours) {
        last_delivered = ld;
        pending = pend;
      }
    }
    auto undelivered =
        RedisCommand(options_.host, options_.port, {"XRANGE", options_.stream, "(" + last_delivered, "+"});
    if (!undelivered.ok()) return undelivered.status();
    return static_cast<size_t>(pending) + (*undelivered)->elements;
  }

  StatusOr<std::vector<std::string>> DeadLetterReasons() override {
    auto r = RedisCommand(options_.host, options_.port, {"XRANGE", options_.stream + ":dead", "-", "+"});
    if (!r.ok()) return r.status();
    std::vector<std::string> out;
    for (size_t i = 0; i < (*r)->elements; ++i) {
      const redisReply* kv = (*r)->element[i]->element[1];
      for (size_t j = 0; j + 1 < kv->elements; j += 2) {
        if (std::string(kv->element[j]->str, kv->element[j]->len) == "reason") {
          out.emplace_back(kv->element[j + 1]->str, kv->element[j + 1]->len);
        }
      }
    }
    return out;
  }

  void Crash(std::unique_ptr<MessageSource> source) override {
    // Its entries stay pending under its consumer name; another consumer's
    // XAUTOCLAIM takes them once idle for redelivery_after.
    source.reset();
  }

 private:
  WorkerOptions options_;
  int consumers_ = 0;
};

#endif  // DEDUP_WITH_REDIS_STREAMS

}  // namespace

#ifdef DEDUP_WITH_RABBITMQ
bool RabbitMqEnvAvailable();  // tests/source_envs_rabbitmq.cc
std::unique_ptr<SourceEnv> MakeRabbitMqEnv();
#endif
#ifdef DEDUP_WITH_NATS
bool NatsEnvAvailable();  // tests/source_envs_nats.cc
std::unique_ptr<SourceEnv> MakeNatsEnv();
#endif

std::vector<std::string> AvailableSourceNames() {
  std::vector<std::string> names = {"memory"};
#ifdef DEDUP_WITH_REDIS_STREAMS
  if (StreamsServer::Get()->ok()) names.push_back("redis_streams");
#endif
#ifdef DEDUP_WITH_RABBITMQ
  if (RabbitMqEnvAvailable()) names.push_back("rabbitmq");
#endif
#ifdef DEDUP_WITH_NATS
  if (NatsEnvAvailable()) names.push_back("nats");
#endif
  return names;
}

std::unique_ptr<SourceEnv> MakeSourceEnv(const std::string& name) {
  if (name == "memory") return std::make_unique<MemoryEnv>();
#ifdef DEDUP_WITH_REDIS_STREAMS
  if (name == "redis_streams") return std::make_unique<RedisStreamsEnv>();
#endif
#ifdef DEDUP_WITH_RABBITMQ
  if (name == "rabbitmq") return MakeRabbitMqEnv();
#endif
#ifdef DEDUP_WITH_NATS
  if (name == "nats") return MakeNatsEnv();
#endif
  return nullptr;
}

}  // namespace dedup::testing
