// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "store_envs.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>

#include "dedup/memory_store.h"
#include "dedup/record.h"
#ifdef DEDUP_WITH_ROCKSDB
#include "dedup/rocksdb_store.h"
#endif

namespace dedup::testing {
namespace {

std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

class MemoryEnv final : public StoreEnv {
 public:
  std::string Name() const override { return "memory"; }
  std::unique_ptr<Store> Open() override {
    MemoryStoreOptions o;
    o.clock = &clock_;
    return NewMemoryStore(o);
  }
  void Sleep(Millis d) override { clock_.Advance(d); }
  Clock* clock() override { return &clock_; }

 private:
  SimulatedClock clock_;
};

#ifdef DEDUP_WITH_ROCKSDB
class RocksDBEnv final : public StoreEnv {
 public:
  ~RocksDBEnv() override {
    for (const auto& d : dirs_) RemoveDir(d);
  }
  std::string Name() const override { return "rocksdb"; }
  std::unique_ptr<Store> Open() override {
    dirs_.push_back(MakeTempDir("rocksdb"));
    RocksDBStoreOptions o;
    o.path = dirs_.back();
    o.clock = &clock_;
    auto s = RocksDBStore::Open(o);
    if (!s.ok()) return nullptr;
    return std::move(s).value();
  }
  void Sleep(Millis d) override { clock_.Advance(d); }
  Clock* clock() override { return &clock_; }

 private:
  SimulatedClock clock_;
  std::vector<std::string> dirs_;
};
#endif

// The test servers run without persistence on purpose, so every Open() would
// repeat the store's "appendonly is no" warning; each distinct warning is
// printed once per test process instead.
void WarnOnce(const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (seen.insert(message).second) std::fprintf(stderr, "dedup: %s\n", message.c_str());
}

// A server store: every Open() gets a fresh key prefix in the same server.
class ServerEnv final : public StoreEnv {
 public:
  ServerEnv(std::string name, std::string uri) : name_(std::move(name)), uri_(std::move(uri)) {}
  std::string Name() const override { return name_; }
  std::unique_ptr<Store> Open() override {
    std::string uri = uri_;
    uri += uri.find('?') == std::string::npos ? "?" : "&";
    uri += "prefix=t" + Token::Random().ToHex() + ":";
    OpenOptions o;
    o.on_warning = WarnOnce;
    auto s = OpenStore(uri, o);
    if (!s.ok()) return nullptr;
    return std::move(s).value();
  }
  void Sleep(Millis d) override { std::this_thread::sleep_for(d); }

 private:
  std::string name_, uri_;
};

}  // namespace

std::vector<std::string> AvailableStoreNames() {
  std::vector<std::string> names = {"memory"};
#ifdef DEDUP_WITH_ROCKSDB
  names.push_back("rocksdb");
#endif
#ifdef DEDUP_WITH_REDIS
  if (!Env("DEDUP_TEST_REDIS_URI").empty()) names.push_back("redis");
  if (!Env("DEDUP_TEST_REDIS_CLUSTER_URI").empty()) names.push_back("redis_cluster");
#endif
#ifdef DEDUP_WITH_POSTGRES
  if (!Env("DEDUP_TEST_POSTGRES_URI").empty()) names.push_back("postgres");
#endif
  return names;
}

std::unique_ptr<StoreEnv> MakeStoreEnv(const std::string& name) {
  if (name == "memory") return std::make_unique<MemoryEnv>();
#ifdef DEDUP_WITH_ROCKSDB
  if (name == "rocksdb") return std::make_unique<RocksDBEnv>();
#endif
  if (name == "redis") return std::make_unique<ServerEnv>(name, Env("DEDUP_TEST_REDIS_URI"));
  if (name == "redis_cluster") {
    return std::make_unique<ServerEnv>(name, Env("DEDUP_TEST_REDIS_CLUSTER_URI"));
  }
  if (name == "postgres") {
    return std::make_unique<ServerEnv>(name, Env("DEDUP_TEST_POSTGRES_URI"));
  }
  return nullptr;
}

std::string MakeTempDir(const std::string& tag) {
  const std::string base = Env("TMPDIR").empty() ? "/tmp" : Env("TMPDIR");
  std::string tmpl = base + "/dedup-test-" + tag + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) std::abort();
  return tmpl;
}

void RemoveDir(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove_all(path, ec);
}

}  // namespace dedup::testing
