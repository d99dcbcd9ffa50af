// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The process that rocksdb_crash_test and rocksdb_store_test kill or race:
//
//   rocksdb_crash_child work DIR SYNC ROUND
//       Claims and completes keys "ROUND/..." on the store in DIR (sync = none,
//       always or interval) from four threads until killed (or 60 s have passed).
//       After each operation returned, and only then, writes one line to stdout:
//         A KEY FENCE   Claim/ClaimBatch returned ACQUIRED with FENCE
//         C KEY         Complete or CompleteBatch returned OK (result = KEY)
//         R KEY         Release returned OK
//         P KEY FENCE ATTEMPT   a claim with max_attempts (a poison message's)
//                               returned ACQUIRED: written before it returned
//         U KEY FENCE   a claim without max_attempts took over a key whose lease
//                       ran out: committed in the background
//         L KEY FENCE ATTEMPT   a claim without max_attempts (lease 20 ms),
//                       neither extended nor completed, once the claim log
//                       holds it (read back from the log; sync=always: at once,
//                       it was written before it returned)
//       The P, U and L keys ("poison/N", "unlimited/N", "logged/N") are shared
//       by every round; each claim of them takes over from the last.
//       Each line is one write(2) of less than PIPE_BUF bytes, so lines from the
//       threads never interleave. Exits 2 on any unexpected answer.
//
//   rocksdb_crash_child open DIR
//       Tries to open the store in DIR and prints "OK" or "CODE message".
//
//   rocksdb_crash_child logonly DIR N
//       Claims keys "logonly/0".."logonly/N-1" (lease 50 ms, no max_attempts),
//       printing "L KEY FENCE ATTEMPT" for each, waits until the claim log holds
//       every one of them, prints "LOGGED" and sleeps until killed.
//
//   rocksdb_crash_child bulk DIR ROUND
//       Claims keys "bulk/ROUND/N" from one thread without end (never completed:
//       past 65,536 logged claims the materializer writes them into the
//       database), and completes every third of them from another, some
//       thousands of claims later (often while a materialization is writing
//       it), printing "C KEY" after each completion returned OK. Prints
//       "LOGS N" whenever the highest claim log number grows (a new log starts
//       after each materialization).
//
//   rocksdb_crash_child materialize DIR
//       With sync=interval (20 ms), claims "kept/0".."kept/49" (never completed),
//       waits until the claim log holds them and a few syncs have passed (the
//       log is durable), prints "LOGGED", then CompactNow (the claims go into
//       the database, the log is deleted), prints "DONE" and sleeps until
//       killed. Run by rocksdb_crash_test with sync_order_preload.
//
//   rocksdb_crash_child closedlog DIR
//       With sync=interval (200 ms), claims "kept/0".."kept/49" (never
//       completed), waits until the claim log holds them, makes RocksDB's
//       write-ahead log fail (a file system of the test's, through
//       RocksDBStoreOptions::env) and calls CompactNow at once: the log is
//       closed, the claims' write into the database fails, the log stays, its
//       frames not yet synced. Prints "FAILED" (or "COMPACTED": nothing was
//       tested), waits three intervals, unlinks DIR/SYNC-PROBE (sync_order_preload
//       then notes the claim logs with unsynced writes), prints "DONE" and
//       sleeps until killed.
//
//   rocksdb_crash_child bulkmixed DIR ROUND
//       As bulk, but of the keys bulk completes, every third is completed and
//       then forgotten ("F KEY" once Forget returned true) and another third
//       released instead ("R KEY"): forget entries and released records
//       during the materializations.
//
//   rocksdb_crash_child logforget DIR
//       Claims "forgotten" and "expired", waits until both are in the claim log,
//       completes "forgotten" and forgets it, completes "expired" with a
//       retention of 1 ms and, once that has passed, flushes and compacts the
//       records family (the expiry filter runs); prints "DONE" and sleeps until
//       killed.
//
//   The three below need claim_log_fault_preload (LD_PRELOAD), which makes
//   claim log appends fail at a chosen moment, and print "DONE" at the end,
//   then sleep until killed:
//
//   rocksdb_crash_child attemptsback DIR
//       Claims "k" and "p" (lease 20 ms) and waits until the claim log holds
//       them; then, every append failing, takes each over twice, the second
//       takeover of "p" with max_attempts 3 (written before it returns), and
//       lets rounds fail for 300 ms. "H KEY FENCE ATTEMPT" for each claim.
//
//   rocksdb_crash_child moveback DIR
//       Claims "k" (lease 20 ms; "B k FENCE"); the append of the frame holding
//       it is held, and meanwhile "k" is taken over ("C k FENCE"); then the
//       append fails. Prints what the next round logs ("LOGGED k FENCE"),
//       what Inspect shows ("INSPECT k FENCE") and whether the takeover's
//       completion is OK or LOST ("COMPLETE k OK|LOST").
//
//   rocksdb_crash_child tornread DIR
//       Claims "first" (logged: "A first FENCE"), then "tornA", whose frame is
//       written half and whose append then fails; a read-only open reads the
//       log with that torn frame at its end and is held after its first read
//       while the writer goes on: completes "tornA", logs "tornB" (a frame as
//       long as the torn one) and "after". Then the reader goes on reading
//       and prints "RO OPEN OK" or "RO OPEN CODE message", and "RO KEY
//       FENCE|none" for "first", "tornB", "after".

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "dedup/rocksdb_store.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "stores/rocksdb/claim_log.h"
#include "stores/rocksdb/record_codec.h"

namespace {

using namespace std::chrono_literals;
using dedup::ClaimOutcome;
using dedup::ClaimRequest;
using dedup::CompletionStatus;
using dedup::WriteResult;

void Line(const std::string& s) {
  const std::string l = s + "\n";
  if (write(STDOUT_FILENO, l.data(), l.size()) != static_cast<ssize_t>(l.size())) std::_Exit(3);
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "rocksdb_crash_child: %s\n", what.c_str());
  std::_Exit(2);
}

std::unique_ptr<dedup::RocksDBStore> OpenOrFail(const dedup::RocksDBStoreOptions& o) {
  auto opened = dedup::RocksDBStore::Open(o);
  if (!opened.ok()) Fail("open: " + opened.status().ToString());
  return std::move(*opened);
}

std::unique_ptr<dedup::RocksDBStore> OpenOrFail(const std::string& dir) {
  dedup::RocksDBStoreOptions o;
  o.path = dir;
  return OpenOrFail(o);
}

// Prints DONE and sleeps until killed (the parent kills it long before 60 s).
int Done() {
  Line("DONE");
  std::this_thread::sleep_for(60s);
  return 0;
}

ClaimRequest Req(const std::string& key) {
  ClaimRequest r;
  r.key = key;
  r.lease = std::chrono::minutes(10);  // never runs out during the test
  r.retention = std::chrono::hours(24);
  return r;
}

// Claim, sometimes extend, then complete (or, every 7th key, release).
void SingleKeys(dedup::Store* store, const std::string& round,
                std::chrono::steady_clock::time_point end) {
  for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
    const std::string key = round + "/s" + std::to_string(i);
    auto c = store->Claim(Req(key));
    if (!c.ok()) Fail("claim: " + c.status().ToString());
    if (c->outcome != ClaimOutcome::kAcquired) Fail("claim of a new key not ACQUIRED: " + key);
    Line("A " + key + " " + std::to_string(c->fence));
    if (i % 3 == 0) {
      auto e = store->Extend(key, c->token, std::chrono::minutes(10));
      if (!e.ok() || *e != WriteResult::kOk) Fail("extend " + key);
    }
    if (i % 7 == 6) {
      auto r = store->Release(key, c->token, std::chrono::hours(24));
      if (!r.ok() || *r != WriteResult::kOk) Fail("release " + key);
      Line("R " + key);
      continue;
    }
    auto d = store->Complete(key, c->token, std::chrono::hours(24), CompletionStatus::kOk, key);
    if (!d.ok() || *d != WriteResult::kOk) Fail("complete " + key);
    Line("C " + key);
  }
}

// Takes over the same few keys again and again, as workers do with a message
// whose handler keeps crashing.
void Takeovers(dedup::Store* store, std::chrono::steady_clock::time_point end) {
  for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
    const bool poison = i % 2 == 0;
    const std::string key = std::string(poison ? "poison/" : "unlimited/") + std::to_string(i / 2 % 3);
    ClaimRequest r = Req(key);
    r.lease = 1ms;
    if (poison) r.max_attempts = 1'000'000;
    auto c = store->Claim(r);
    if (!c.ok()) Fail("takeover claim: " + c.status().ToString());
    if (c->outcome == ClaimOutcome::kAcquired) {
      Line((poison ? "P " : "U ") + key + " " + std::to_string(c->fence) +
           (poison ? " " + std::to_string(c->attempt) : ""));
    }
    std::this_thread::sleep_for(1ms);
  }
}

void WaitLogged(const std::string& dir, const std::map<std::string, uint64_t>& want);

// Takes over "logged/N" again and again without max_attempts, never extending
// or completing: each claim lives in the claim log only. Printed once the log
// holds it.
void LoggedTakeovers(dedup::Store* store, const std::string& dir, bool logged,
                     std::chrono::steady_clock::time_point end) {
  for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
    const std::string key = "logged/" + std::to_string(i % 3);
    ClaimRequest r = Req(key);
    r.lease = 20ms;
    auto c = store->Claim(r);
    if (!c.ok()) Fail("logged claim: " + c.status().ToString());
    if (logged && c->outcome == ClaimOutcome::kAcquired) WaitLogged(dir, {{key, c->fence}});
    std::this_thread::sleep_for(50ms);
    if (c->outcome == ClaimOutcome::kAcquired) {
      Line("L " + key + " " + std::to_string(c->fence) + " " + std::to_string(c->attempt));
    }
  }
}

// Each key's last claim in the claim logs in `dir`: its fence.
std::map<std::string, uint64_t> LoggedClaims(const std::string& dir) {
  std::vector<uint64_t> logs;
  if (!dedup::internal::ListClaimLogs(dir, &logs).ok()) Fail("listing the claim logs");
  std::map<std::string, uint64_t> seen;
  for (uint64_t n : logs) {
    (void)dedup::internal::ReadClaimLog(
        dir + "/" + dedup::internal::ClaimLogName(n),
        [&](uint8_t type, std::string_view key, std::string_view value) {
          dedup::Record r;
          std::string why;
          if (type == dedup::internal::kClaimEntry && dedup::internal::DecodeRecord(value, &r, &why)) {
            seen[std::string(key)] = r.fence;
          }
        });
  }
  return seen;
}

// Waits until the claim logs in `dir` hold a claim of each key with its fence.
void WaitLogged(const std::string& dir, const std::map<std::string, uint64_t>& want) {
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (std::chrono::steady_clock::now() < give_up) {
    const std::map<std::string, uint64_t> seen = LoggedClaims(dir);
    bool all = true;
    for (const auto& [key, fence] : want) {
      auto it = seen.find(key);
      all = all && it != seen.end() && it->second == fence;
    }
    if (all) return;
    std::this_thread::sleep_for(5ms);
  }
  Fail("the claims never reached the claim log");
}

int LogOnly(const std::string& dir, int n) {
  auto store = OpenOrFail(dir);
  std::map<std::string, uint64_t> want;
  for (int i = 0; i < n; ++i) {
    const std::string key = "logonly/" + std::to_string(i);
    ClaimRequest r = Req(key);
    r.lease = 50ms;
    auto c = store->Claim(r);
    if (!c.ok() || c->outcome != ClaimOutcome::kAcquired) Fail("logonly claim of " + key);
    Line("L " + key + " " + std::to_string(c->fence) + " " + std::to_string(c->attempt));
    want[key] = c->fence;
  }
  WaitLogged(dir, want);
  Line("LOGGED");
  std::this_thread::sleep_for(60s);
  return 0;
}

int LogForget(const std::string& dir) {
  auto store = OpenOrFail(dir);
  auto f = store->Claim(Req("forgotten"));
  auto e = store->Claim(Req("expired"));
  if (!f.ok() || !e.ok() || !f->acquired() || !e->acquired()) Fail("logforget claims");
  WaitLogged(dir, {{"forgotten", f->fence}, {"expired", e->fence}});
  auto done = store->Complete("forgotten", f->token, std::chrono::hours(24), CompletionStatus::kOk, "");
  if (!done.ok() || *done != WriteResult::kOk) Fail("complete forgotten");
  auto gone = store->Forget("forgotten", dedup::ForgetOptions{});
  if (!gone.ok() || !*gone) Fail("forget: " + (gone.ok() ? std::string("nothing removed") : gone.status().ToString()));
  done = store->Complete("expired", e->token, std::chrono::milliseconds(1), CompletionStatus::kOk, "");
  if (!done.ok() || *done != WriteResult::kOk) Fail("complete expired");
  std::this_thread::sleep_for(20ms);
  if (!store->db()->Flush(rocksdb::FlushOptions(), store->records_family()).ok()) Fail("flush");
  rocksdb::CompactRangeOptions co;
  co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  if (!store->db()->CompactRange(co, store->records_family(), nullptr, nullptr).ok()) Fail("compact");
  return Done();
}

// Claims "kept/0".."kept/49" (never completed) and waits until the claim log
// holds them.
void ClaimKeptAndWaitLogged(dedup::Store* store, const std::string& dir) {
  std::map<std::string, uint64_t> want;
  for (int i = 0; i < 50; ++i) {
    const std::string key = "kept/" + std::to_string(i);
    auto c = store->Claim(Req(key));
    if (!c.ok() || !c->acquired()) Fail("claim of " + key);
    want[key] = c->fence;
  }
  WaitLogged(dir, want);
}

int Materialize(const std::string& dir) {
  dedup::RocksDBStoreOptions o;
  o.path = dir;
  o.sync = dedup::SyncMode::kInterval;
  o.sync_interval = 20ms;
  auto store = OpenOrFail(o);
  ClaimKeptAndWaitLogged(store.get(), dir);
  std::this_thread::sleep_for(200ms);
  Line("LOGGED");
  auto s = store->CompactNow();
  if (!s.ok()) Fail("compact: " + s.ToString());
  return Done();
}

// A file system whose write-ahead log appends fail once `failing` is set.
std::atomic<bool> failing{false};

class FailingWal : public rocksdb::FSWritableFileOwnerWrapper {
 public:
  explicit FailingWal(std::unique_ptr<rocksdb::FSWritableFile> f)
      : rocksdb::FSWritableFileOwnerWrapper(std::move(f)) {}
  rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                           rocksdb::IODebugContext* dbg) override {
    if (failing.load()) return rocksdb::IOStatus::IOError("failing on purpose (closedlog)");
    return target()->Append(d, o, dbg);
  }
  rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                           const rocksdb::DataVerificationInfo& v,
                           rocksdb::IODebugContext* dbg) override {
    if (failing.load()) return rocksdb::IOStatus::IOError("failing on purpose (closedlog)");
    return target()->Append(d, o, v, dbg);
  }
};

class FailingWalFs : public rocksdb::FileSystemWrapper {
 public:
  FailingWalFs() : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()) {}
  const char* Name() const override { return "FailingWalFs"; }
  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, r, dbg);
    if (s.ok() && f.ends_with(".log")) *r = std::make_unique<FailingWal>(std::move(*r));
    return s;
  }
  rocksdb::IOStatus ReuseWritableFile(const std::string& f, const std::string& old,
                                      const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSWritableFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->ReuseWritableFile(f, old, o, r, dbg);
    if (s.ok() && f.ends_with(".log")) *r = std::make_unique<FailingWal>(std::move(*r));
    return s;
  }
};

int ClosedLog(const std::string& dir) {
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(std::make_shared<FailingWalFs>());
  dedup::RocksDBStoreOptions o;
  o.path = dir;
  o.sync = dedup::SyncMode::kInterval;
  o.sync_interval = 200ms;
  o.env = env.get();
  auto store = OpenOrFail(o);
  ClaimKeptAndWaitLogged(store.get(), dir);
  failing.store(true);
  Line(store->CompactNow().ok() ? "COMPACTED" : "FAILED");
  std::this_thread::sleep_for(600ms);
  const std::string probe = dir + "/SYNC-PROBE";
  std::ofstream(probe) << "";
  unlink(probe.c_str());
  return Done();
}

// claim_log_fault_preload's functions (the test LD_PRELOADs it): claim log
// appends that fail, held at a chosen moment.
struct Faults {
  void (*fail_appends)(int);
  void (*hold_next_append)();
  void (*tear_next_append)();
  int (*wait_held)();
  void (*release)();
  void (*pause_reader)();
  int (*wait_reader_paused)();
  void (*resume_reader)();
};

Faults LoadFaults() {
  const auto get = [](const char* name) {
    void* p = dlsym(RTLD_DEFAULT, name);
    if (p == nullptr) Fail(std::string(name) + " not found: run with LD_PRELOAD=claim_log_fault_preload");
    return p;
  };
  Faults f;
  f.fail_appends = reinterpret_cast<void (*)(int)>(get("dedup_fault_fail_appends"));
  f.hold_next_append = reinterpret_cast<void (*)()>(get("dedup_fault_hold_next_append"));
  f.tear_next_append = reinterpret_cast<void (*)()>(get("dedup_fault_tear_next_append"));
  f.wait_held = reinterpret_cast<int (*)()>(get("dedup_fault_wait_held"));
  f.release = reinterpret_cast<void (*)()>(get("dedup_fault_release"));
  f.pause_reader = reinterpret_cast<void (*)()>(get("dedup_fault_pause_reader"));
  f.wait_reader_paused = reinterpret_cast<int (*)()>(get("dedup_fault_wait_reader_paused"));
  f.resume_reader = reinterpret_cast<void (*)()>(get("dedup_fault_resume_reader"));
  return f;
}

int AttemptsBack(const std::string& dir) {
  const Faults faults = LoadFaults();
  auto store = OpenOrFail(dir);
  const auto claim = [&](const std::string& key, uint32_t max_attempts) {
    ClaimRequest r = Req(key);
    r.lease = 20ms;
    r.max_attempts = max_attempts;
    auto c = store->Claim(r);
    if (!c.ok() || c->outcome != ClaimOutcome::kAcquired) Fail("claim of " + key + " not ACQUIRED");
    Line("H " + key + " " + std::to_string(c->fence) + " " + std::to_string(c->attempt));
    return *c;
  };
  const dedup::ClaimResult a = claim("k", 0);
  const dedup::ClaimResult ap = claim("p", 0);
  WaitLogged(dir, {{"k", a.fence}, {"p", ap.fence}});
  faults.fail_appends(1);
  std::this_thread::sleep_for(30ms);  // the leases end: each claim below takes over
  (void)claim("k", 0);
  (void)claim("p", 0);
  std::this_thread::sleep_for(30ms);
  const dedup::ClaimResult c = claim("k", 0);
  (void)claim("p", 3);  // written before it returns
  std::this_thread::sleep_for(300ms);  // rounds that fail, backing off to 100 ms
  const std::map<std::string, uint64_t> logged = LoggedClaims(dir);
  if (logged.at("k") != a.fence || logged.at("p") != ap.fence) Fail("the appends did not fail");
  auto r = store->Inspect("k");
  if (!r.ok() || !r->has_value() || (**r).fence != c.fence) Fail("k: not its last claim");
  return Done();
}

int MoveBack(const std::string& dir) {
  const Faults faults = LoadFaults();
  auto store = OpenOrFail(dir);
  faults.hold_next_append();
  ClaimRequest r = Req("k");
  r.lease = 20ms;
  auto b = store->Claim(r);
  if (!b.ok() || !b->acquired()) Fail("claim of k");
  Line("B k " + std::to_string(b->fence));
  if (faults.wait_held() == 0) Fail("no append was held");
  std::this_thread::sleep_for(30ms);  // b's lease ends
  auto c = store->Claim(Req("k"));
  if (!c.ok() || !c->acquired()) Fail("the takeover of k was not ACQUIRED");
  Line("C k " + std::to_string(c->fence));
  faults.release();
  // The round after the failed one logs k's claim: the failed one is done then.
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  std::map<std::string, uint64_t> logged;
  while (logged.count("k") == 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(2ms);
    logged = LoggedClaims(dir);
  }
  if (logged.count("k") == 0) Fail("k never reached the claim log");
  Line("LOGGED k " + std::to_string(logged["k"]));
  auto in = store->Inspect("k");
  if (!in.ok() || !in->has_value()) Fail("inspect k");
  Line("INSPECT k " + std::to_string((**in).fence));
  auto done = store->Complete("k", c->token, std::chrono::hours(24), CompletionStatus::kOk, "k");
  if (!done.ok()) Fail("complete k: " + done.status().ToString());
  Line(std::string("COMPLETE k ") + (*done == WriteResult::kOk ? "OK" : "LOST"));
  return Done();
}

int TornRead(const std::string& dir) {
  const Faults faults = LoadFaults();
  auto store = OpenOrFail(dir);
  auto first = store->Claim(Req("first"));
  if (!first.ok() || !first->acquired()) Fail("claim of first");
  WaitLogged(dir, {{"first", first->fence}});
  Line("A first " + std::to_string(first->fence));
  faults.tear_next_append();
  auto torn = store->Claim(Req("tornA"));
  if (!torn.ok() || !torn->acquired()) Fail("claim of tornA");
  if (faults.wait_held() == 0) Fail("no append was torn");
  std::thread reader([&] {
    faults.pause_reader();
    dedup::RocksDBStoreOptions o;
    o.path = dir;
    o.read_only = true;
    auto ro = dedup::RocksDBStore::Open(o);
    if (!ro.ok()) {
      Line("RO OPEN " + std::string(dedup::StatusCodeName(ro.status().code())) + " " +
           ro.status().message());
      return;
    }
    Line("RO OPEN OK");
    for (const char* key : {"first", "tornB", "after"}) {
      auto r = (*ro)->Inspect(key);
      if (!r.ok()) Fail("read-only inspect: " + r.status().ToString());
      Line(std::string("RO ") + key + " " + (r->has_value() ? std::to_string((**r).fence) : "none"));
    }
  });
  // The reader has read the log with the torn frame at its end; the append
  // then failed, and the writer has cut the frame off or given the file up.
  if (faults.wait_reader_paused() == 0) Fail("the reader never read the claim log");
  auto done = store->Complete("tornA", torn->token, std::chrono::hours(24), CompletionStatus::kOk, "");
  if (!done.ok() || *done != WriteResult::kOk) Fail("complete tornA");
  // A frame as long as the torn one, then another: what a reader that goes on
  // from the torn frame's end reads if they are written over it.
  auto b = store->Claim(Req("tornB"));
  if (!b.ok() || !b->acquired()) Fail("claim of tornB");
  faults.fail_appends(0);
  WaitLogged(dir, {{"tornB", b->fence}});
  auto after = store->Claim(Req("after"));
  if (!after.ok() || !after->acquired()) Fail("claim of after");
  WaitLogged(dir, {{"after", after->fence}});
  faults.resume_reader();
  reader.join();
  return Done();
}

// ClaimBatch of 4 new keys, then complete each.
void Batches(dedup::Store* store, const std::string& round,
             std::chrono::steady_clock::time_point end) {
  for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
    std::vector<std::string> keys;
    for (int j = 0; j < 4; ++j) keys.push_back(round + "/b" + std::to_string(i) + "." + std::to_string(j));
    std::vector<ClaimRequest> reqs;
    for (const auto& k : keys) reqs.push_back(Req(k));
    auto res = store->ClaimBatch(reqs);
    if (!res.ok()) Fail("claim batch: " + res.status().ToString());
    for (size_t j = 0; j < keys.size(); ++j) {
      if ((*res)[j].outcome != ClaimOutcome::kAcquired) Fail("batch claim not ACQUIRED");
      Line("A " + keys[j] + " " + std::to_string((*res)[j].fence));
    }
    for (size_t j = 0; j < keys.size(); ++j) {
      auto d = store->Complete(keys[j], (*res)[j].token, std::chrono::hours(24),
                               CompletionStatus::kOk, keys[j]);
      if (!d.ok() || *d != WriteResult::kOk) Fail("complete " + keys[j]);
      Line("C " + keys[j]);
    }
  }
}

// ClaimBatch of 4 new keys (every third batch durably, with max_attempts),
// then, after a random moment within the writer's rounds (so that the writer
// may be carrying the claims), one CompleteBatch of them in reverse order with
// the first request repeated: each answer must be the one for its own request.
void BatchCompletions(dedup::Store* store, const std::string& round,
                      std::chrono::steady_clock::time_point end) {
  unsigned seed = 12345;
  for (int i = 0; std::chrono::steady_clock::now() < end; ++i) {
    std::vector<std::string> keys;
    for (int j = 0; j < 4; ++j) keys.push_back(round + "/c" + std::to_string(i) + "." + std::to_string(j));
    std::vector<ClaimRequest> reqs;
    for (const auto& k : keys) {
      reqs.push_back(Req(k));
      if (i % 3 == 0) reqs.back().max_attempts = 1'000'000;
    }
    auto res = store->ClaimBatch(reqs);
    if (!res.ok()) Fail("claim batch: " + res.status().ToString());
    for (size_t j = 0; j < keys.size(); ++j) {
      if ((*res)[j].outcome != ClaimOutcome::kAcquired) Fail("batch claim not ACQUIRED");
      Line("A " + keys[j] + " " + std::to_string((*res)[j].fence));
    }
    seed = seed * 1103515245u + 12345u;
    std::this_thread::sleep_for(std::chrono::microseconds((seed >> 8) % 3000));
    std::vector<dedup::CompleteRequest> done;
    for (size_t j = keys.size(); j-- > 0;) {
      dedup::CompleteRequest q;
      q.key = keys[j];
      q.token = (*res)[j].token;
      q.retention = std::chrono::hours(24);
      q.result = keys[j];
      done.push_back(q);
    }
    done.push_back(done.front());  // the same completion again: LOST
    auto d = store->CompleteBatch(done);
    if (!d.ok() || d->size() != done.size()) Fail("complete batch");
    if ((*d).back().write != WriteResult::kLost) Fail("a repeated completion was not LOST");
    for (size_t j = 0; j + 1 < done.size(); ++j) {
      if ((*d)[j].write != WriteResult::kOk) Fail("complete batch " + std::string(done[j].key));
      Line("C " + std::string(done[j].key));
    }
  }
}

}  // namespace

int Bulk(const std::string& dir, const std::string& round, bool mixed) {
  auto store = OpenOrFail(dir);
  Line("READY");
  constexpr int kMax = 2'000'000;  // the parent kills us long before this
  std::vector<dedup::Token> tokens(kMax);
  std::atomic<int> claimed{0};
  std::atomic<int> handled{0};  // keys below this one the completer is done with
  const auto key = [&](int i) { return "bulk/" + round + "/" + std::to_string(i); };
  std::thread completer([&] {
    for (int i = 0; i < kMax; i += 3) {
      while (claimed.load(std::memory_order_acquire) < i + 5'000) std::this_thread::yield();
      if (mixed && i % 9 == 3) {
        auto r = store->Release(key(i), tokens[static_cast<size_t>(i)], std::chrono::hours(24));
        if (!r.ok() || *r != dedup::WriteResult::kOk) Fail("bulk release of " + key(i));
        Line("R " + key(i));
        handled.store(i, std::memory_order_release);
        continue;
      }
      auto c = store->Complete(key(i), tokens[static_cast<size_t>(i)], std::chrono::hours(24),
                               dedup::CompletionStatus::kOk, key(i));
      if (!c.ok() || *c != dedup::WriteResult::kOk) Fail("bulk complete of " + key(i));
      if (mixed && i % 9 == 0) {
        auto f = store->Forget(key(i), dedup::ForgetOptions{});
        if (!f.ok() || !*f) Fail("bulk forget of " + key(i));
        Line("F " + key(i));
        handled.store(i, std::memory_order_release);
        continue;
      }
      Line("C " + key(i));
      handled.store(i, std::memory_order_release);
    }
  });
  uint64_t highest = 0;
  for (int i = 0; i < kMax; ++i) {
    // Mixed: the completer's keys stay within the logs not yet deleted (it
    // forgets, slower than the claims come: unbounded, it lagged past them).
    while (mixed && handled.load(std::memory_order_acquire) + 20'000 < i) std::this_thread::yield();
    auto c = store->Claim(Req(key(i)));
    if (!c.ok() || c->outcome != ClaimOutcome::kAcquired) Fail("bulk claim of " + key(i));
    tokens[static_cast<size_t>(i)] = c->token;
    claimed.store(i + 1, std::memory_order_release);
    if (i % 4096 == 0) {
      std::vector<uint64_t> logs;
      if (dedup::internal::ListClaimLogs(dir, &logs).ok() && !logs.empty() && logs.back() > highest) {
        highest = logs.back();
        Line("LOGS " + std::to_string(highest));
      }
    }
  }
  completer.join();
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "open") {
    dedup::RocksDBStoreOptions o;
    o.path = argv[2];
    auto s = dedup::RocksDBStore::Open(o);
    if (s.ok()) {
      Line("OK");
    } else {
      Line(std::string(dedup::StatusCodeName(s.status().code())) + " " + s.status().message());
    }
    return 0;
  }
  if (argc == 4 && std::string(argv[1]) == "logonly") return LogOnly(argv[2], std::atoi(argv[3]));
  if (argc == 3 && std::string(argv[1]) == "logforget") return LogForget(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "materialize") return Materialize(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "closedlog") return ClosedLog(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "attemptsback") return AttemptsBack(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "moveback") return MoveBack(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "tornread") return TornRead(argv[2]);
  if (argc == 4 && std::string(argv[1]) == "bulk") return Bulk(argv[2], argv[3], false);
  if (argc == 4 && std::string(argv[1]) == "bulkmixed") return Bulk(argv[2], argv[3], true);
  if (argc != 5 || std::string(argv[1]) != "work") {
    std::fprintf(stderr, "usage: %s work DIR none|always|interval ROUND | open DIR | logonly DIR N | "
                 "logforget DIR | materialize DIR | closedlog DIR | bulk DIR ROUND | bulkmixed DIR ROUND | "
                 "attemptsback DIR | moveback DIR | tornread DIR\n", argv[0]);
    return 1;
  }
  dedup::RocksDBStoreOptions o;
  o.path = argv[2];
  const std::string sync = argv[3];
  o.sync = sync == "always"     ? dedup::SyncMode::kAlways
           : sync == "interval" ? dedup::SyncMode::kInterval
                                : dedup::SyncMode::kNone;
  o.sync_interval = 20ms;
  auto store = OpenOrFail(o);
  Line("READY");
  // Bounded: the parent kills us long before this.
  const auto end = std::chrono::steady_clock::now() + 60s;
  std::thread t1(SingleKeys, store.get(), std::string(argv[4]), end);
  std::thread t2(Batches, store.get(), std::string(argv[4]), end);
  std::thread t3(Takeovers, store.get(), end);
  std::thread t4(BatchCompletions, store.get(), std::string(argv[4]), end);
  std::thread t5(LoggedTakeovers, store.get(), std::string(argv[2]), sync != "always", end);
  t1.join();
  t2.join();
  t3.join();
  t4.join();
  t5.join();
  return 0;
}
