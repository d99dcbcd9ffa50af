// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Kills a process working on a RocksDB store with SIGKILL at random moments and
// checks, after reopening, that every operation the process saw succeed is still
// there. The child (rocksdb_crash_child) prints a line only after an operation
// returned, so each line is an acknowledged operation that must have survived.
//
// A process crash must lose no completion or release in any sync mode: the WAL
// is written to the OS before they return. A claim without max_attempts is
// committed in the background (rocksdb_store.cc): a crash may forget one made in
// the last millisecond or so, and then the key must be claimable again with a
// higher fence. Across every restart fences only grow, and the attempts of
// claims with max_attempts (a poison message that kills its worker) are never
// forgotten; nor are those of claims without it that the claim log holds, the
// ones no completion, extend or database write ever touched (the "L" keys, and
// the RocksDBClaimLog tests below, which wait until the log holds them).
// (A power loss is not simulated here.)

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dedup/rocksdb_store.h"
#include "rocksdb/db.h"
#include "store_envs.h"
#include "stores/rocksdb/claim_log.h"
#include "stores/rocksdb/record_codec.h"

extern char** environ;

namespace dedup {
namespace {

using namespace std::chrono_literals;

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of the child's stdout
};

Child Spawn(const std::vector<std::string>& args) {
  int fds[2];
  if (pipe(fds) != 0) return {};
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  Child c;
  if (posix_spawn(&c.pid, argv[0], &fa, nullptr, argv.data(), environ) != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  c.out = fds[0];
  return c;
}

// Reads what is available within `wait`; appends to *buf. False at EOF.
bool ReadSome(int fd, std::string* buf, std::chrono::milliseconds wait) {
  fd_set set;
  FD_ZERO(&set);
  FD_SET(fd, &set);
  timeval tv{0, static_cast<suseconds_t>(wait.count() * 1000)};
  if (select(fd + 1, &set, nullptr, nullptr, &tv) <= 0) return true;
  char tmp[65536];
  const ssize_t n = read(fd, tmp, sizeof tmp);
  if (n <= 0) return false;
  buf->append(tmp, static_cast<size_t>(n));
  return true;
}

// SIGKILLs the child and appends what it printed until then to *out; its wait
// status.
int KillNow(const Child& c, std::string* out) {
  kill(c.pid, SIGKILL);
  int wstatus = 0;
  waitpid(c.pid, &wstatus, 0);
  for (int i = 0; i < 1000 && ReadSome(c.out, out, 100ms); ++i) {
  }
  close(c.out);
  return wstatus;
}

// Starts the child with `args`, lets it work until its output so far makes
// `ready` true (or `give_up` has passed), then for a random while shorter than
// `most`, somewhere in the middle of a write, and SIGKILLs it. *out: what it
// printed. Fails if the child ended on its own before the kill.
void KillAtARandomMoment(const std::vector<std::string>& args,
                         const std::function<bool(const std::string&)>& ready,
                         std::chrono::milliseconds most, std::chrono::seconds give_up,
                         std::mt19937* rng, std::string* out) {
  const auto started = std::chrono::steady_clock::now();
  Child c = Spawn(args);
  ASSERT_GT(c.pid, 0) << "could not start " << args[0];
  bool alive = true;
  while (alive && !ready(*out) && std::chrono::steady_clock::now() < started + give_up) {
    alive = ReadSome(c.out, out, 20ms);
  }
  const auto kill_at =
      std::chrono::steady_clock::now() + std::chrono::milliseconds((*rng)() % most.count());
  while (alive && std::chrono::steady_clock::now() < kill_at) alive = ReadSome(c.out, out, 5ms);
  const int wstatus = KillNow(c, out);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "the child ended on its own (status " << wstatus << ") after "
      << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
      << " s; output tail:\n" << out->substr(out->size() > 2000 ? out->size() - 2000 : 0);
}

// How many times `what` stands in `out`.
size_t Count(const std::string& out, const std::string& what) {
  size_t n = 0;
  for (size_t at = out.find(what); at != std::string::npos; at = out.find(what, at + 1)) ++n;
  return n;
}

// The store in `dir`, opened again after the child's crash.
StatusOr<std::unique_ptr<RocksDBStore>> Reopen(const std::string& dir) {
  RocksDBStoreOptions o;
  o.path = dir;
  return RocksDBStore::Open(o);
}

struct Takeover {
  std::string kind;  // "P": with max_attempts, "U": without, "L": without, in the claim log
  std::string key;
  uint64_t fence = 0;
  uint32_t attempt = 0;
};

struct Acked {
  std::map<std::string, uint64_t> acquired;  // key -> fence
  std::set<std::string> completed, released;
  std::vector<Takeover> takeovers;  // in the order they were acknowledged
  size_t lines = 0;
};

// What the takeovers of the shared keys acknowledged so far, over all rounds.
struct History {
  std::map<std::string, uint64_t> fence;
  std::map<std::string, uint32_t> attempt;
};

// Only whole lines count: a line cut by the kill was never fully reported.
Acked Parse(const std::string& out) {
  Acked a;
  size_t pos = 0;
  for (size_t nl; (nl = out.find('\n', pos)) != std::string::npos; pos = nl + 1) {
    std::istringstream line(out.substr(pos, nl - pos));
    std::string kind, key;
    line >> kind >> key;
    ++a.lines;
    if (kind == "A") {
      uint64_t fence = 0;
      line >> fence;
      a.acquired[key] = fence;
    } else if (kind == "C") {
      a.completed.insert(key);
    } else if (kind == "R") {
      a.released.insert(key);
    } else if (kind == "P" || kind == "U" || kind == "L") {
      Takeover t;
      t.kind = kind;
      t.key = key;
      line >> t.fence;
      if (kind == "P" || kind == "L") line >> t.attempt;
      a.takeovers.push_back(t);
    }
  }
  return a;
}

// One round: start the child on `dir`, let it work until it has completed at least
// one key and then for a random while, SIGKILL it, and check the store.
void CrashRound(const std::string& dir, const std::string& sync, int round, std::mt19937* rng,
                History* history) {
  SCOPED_TRACE("sync=" + sync + " round " + std::to_string(round));
  // Killed a random while after the first completion.
  std::string out;
  ASSERT_NO_FATAL_FAILURE(KillAtARandomMoment(
      {DEDUP_CRASH_CHILD, "work", dir, sync, "r" + std::to_string(round)},
      [](const std::string& o) { return o.find("\nC ") != std::string::npos; }, 300ms, 10s, rng,
      &out));
  const Acked acked = Parse(out);
  ASSERT_FALSE(acked.completed.empty()) << "the child completed nothing before the kill";

  auto store = Reopen(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  // Count the losses and name the first few, rather than thousands of failures.
  std::vector<std::string> lost;
  auto note = [&](const std::string& what) {
    lost.push_back(what);
  };
  size_t forgotten_claims = 0;
  for (const auto& [key, fence] : acked.acquired) {
    auto r = (*store)->Inspect(key);
    ASSERT_TRUE(r.ok()) << r.status();
    if (!r->has_value()) {
      if (acked.completed.count(key) != 0 || acked.released.count(key) != 0) {
        note("record of " + key + " lost after its completion or release");
        continue;
      }
      // A claim the crash caught before its group commit: claimable again, with
      // a higher fence.
      ++forgotten_claims;
      ClaimRequest req;
      req.key = key;
      auto again = (*store)->Claim(req);
      ASSERT_TRUE(again.ok()) << again.status();
      if (!again->acquired() || again->fence <= fence) note(key + ": forgotten claim, fence not higher after restart");
      continue;
    }
    if ((*r)->fence != fence) note(key + ": fence changed");
    if (acked.completed.count(key) != 0 &&
        ((*r)->state != RecordState::kCompleted || (*r)->result != key)) {
      note("completion of " + key + " lost");
    }
    if (acked.released.count(key) != 0 && (*r)->state != RecordState::kReleased) {
      note("release of " + key + " lost");
    }
  }
  for (const std::string& key : acked.completed) {
    ClaimRequest req;
    req.key = key;
    auto claim = (*store)->Claim(req);
    ASSERT_TRUE(claim.ok()) << claim.status();
    if (claim->outcome != ClaimOutcome::kDuplicate) note(key + ": claim after completion not DUPLICATE");
  }
  // Takeovers: fences only grow, over every round; attempts of claims with
  // max_attempts only grow too, so a crash never gives a poison message a free
  // try, and so do those of the claims the claim log held.
  size_t takeovers = 0;
  for (const Takeover& t : acked.takeovers) {
    ++takeovers;
    if (history->fence.count(t.key) != 0 && t.fence <= history->fence[t.key]) {
      note(t.key + ": fence " + std::to_string(t.fence) + " not above " + std::to_string(history->fence[t.key]));
    }
    history->fence[t.key] = t.fence;
    if (t.kind == "P" || t.kind == "L") {
      if (history->attempt.count(t.key) != 0 && t.attempt <= history->attempt[t.key]) {
        note(t.key + ": attempt " + std::to_string(t.attempt) + " not above " +
             std::to_string(history->attempt[t.key]));
      }
      history->attempt[t.key] = t.attempt;
    }
  }
  for (const auto& [key, attempt] : history->attempt) {
    auto r = (*store)->Inspect(key);
    ASSERT_TRUE(r.ok()) << r.status();
    if (!r->has_value() || (*r)->attempt < attempt || (*r)->fence < history->fence[key]) {
      note(key + ": attempt or fence went back after the restart");
    }
  }
  std::string first;
  for (size_t i = 0; i < lost.size() && i < 5; ++i) first += "\n  " + lost[i];
  EXPECT_TRUE(lost.empty()) << lost.size() << " acknowledged operations lost of " << acked.lines
                            << ", e.g.:" << first;
  std::printf("[ crash    ] sync=%s round %d: %zu lines, %zu completions acknowledged, %zu lost; "
              "%zu takeovers; %zu claims forgotten (allowed)\n",
              sync.c_str(), round, acked.lines, acked.completed.size(), lost.size(), takeovers,
              forgotten_claims);
}

class RocksDBCrash : public ::testing::TestWithParam<std::string> {};

// Several crashes into the same directory: each recovery starts from the last.
TEST_P(RocksDBCrash, AcknowledgedOperationsSurviveSigkill) {
  const std::string dir = testing::MakeTempDir("rocksdb-crash");
  std::mt19937 rng(std::random_device{}());
  const int rounds = GetParam() == "always" ? 3 : 5;
  History history;
  for (int round = 0; round < rounds && !HasFatalFailure(); ++round) {
    CrashRound(dir, GetParam(), round, &rng, &history);
  }
  EXPECT_FALSE(history.attempt.empty()) << "no takeover with max_attempts was acknowledged";
  testing::RemoveDir(dir);
}

INSTANTIATE_TEST_SUITE_P(SyncModes, RocksDBCrash, ::testing::Values("none", "interval", "always"),
                         [](const auto& info) { return info.param; });

// The bulk children: killed once the child has started a second log (a
// materialization ran; the numbers go on from the last process's), a random
// while later. Fails if no materialization ran before the kill.
void KillAfterAMaterialization(const std::vector<std::string>& args, std::mt19937* rng,
                               std::string* out) {
  ASSERT_NO_FATAL_FAILURE(KillAtARandomMoment(
      args, [](const std::string& o) { return Count(o, "LOGS ") >= 2; }, 1500ms, 60s, rng, out));
  EXPECT_GE(Count(*out, "LOGS "), 2u) << "no materialization before the kill: not tested";
}

// A SIGKILL at a random moment of a stream of claims that are never completed
// (the materializer writes them into the database past 65,536 logged, several
// times a round) while every third is completed some thousands of claims later:
// after each restart every completion the child reported is there, none
// shadowed by a claim the materializer or the fold at open wrote.
TEST(RocksDBClaimLog, CompletionsSurviveAKillDuringMaterializations) {
  const std::string dir = testing::MakeTempDir("rocksdb-bulk");
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 3 && !HasFailure(); ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::string out;
    ASSERT_NO_FATAL_FAILURE(
        KillAfterAMaterialization({DEDUP_CRASH_CHILD, "bulk", dir, std::to_string(round)}, &rng, &out));
    const Acked acked = Parse(out);
    ASSERT_FALSE(acked.completed.empty()) << "the child completed nothing before the kill";
    auto store = Reopen(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    int wrong = 0;
    for (const std::string& key : acked.completed) {
      auto r = (*store)->Inspect(key);
      ASSERT_TRUE(r.ok()) << r.status();
      if (!r->has_value() || (*r)->state != RecordState::kCompleted || (*r)->result != key) {
        if (++wrong <= 5) {
          ADD_FAILURE() << key << ": a reported completion is "
                        << (r->has_value() ? "state " + std::to_string(int((*r)->state))
                                           : std::string("gone"));
        }
      }
    }
    EXPECT_EQ(wrong, 0) << "of " << acked.completed.size() << " completions";
  }
  testing::RemoveDir(dir);
}

// Runs the child with `args` until it prints `until` (a whole line), then
// SIGKILLs it; its output.
std::string RunUntilThenKill(const std::vector<std::string>& args, const std::string& until) {
  Child c = Spawn(args);
  EXPECT_GT(c.pid, 0) << "could not start " << DEDUP_CRASH_CHILD;
  if (c.pid <= 0) return "";
  std::string out;
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  bool alive = true;
  while (alive && out.find(until + "\n") == std::string::npos &&
         std::chrono::steady_clock::now() < give_up) {
    alive = ReadSome(c.out, &out, 20ms);
  }
  const int wstatus = KillNow(c, &out);
  EXPECT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "the child ended on its own (status " << wstatus << "); output:\n" << out.substr(0, 2000);
  EXPECT_NE(out.find(until + "\n"), std::string::npos) << "no " << until << " line; output:\n"
                                                        << out.substr(0, 2000);
  return out;
}

// The fence of `key`'s record in the database itself (RocksDB opened read-only,
// past the store), or 0 when it has none.
uint64_t FenceInTheDatabase(const std::string& dir, const std::string& key) {
  std::vector<std::string> names;
  rocksdb::DBOptions dbo;
  EXPECT_TRUE(rocksdb::DB::ListColumnFamilies(dbo, dir, &names).ok());
  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  size_t records = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == internal::kColumnFamily) records = i;
    descs.emplace_back(names[i], rocksdb::ColumnFamilyOptions());
  }
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(dbo, dir, descs, &handles, &db);
  EXPECT_TRUE(s.ok()) << s.ToString();
  if (!s.ok()) return 0;
  std::string rkey, value;
  internal::EncodeRecordKey(key, &rkey);
  uint64_t fence = 0;
  if (db->Get(rocksdb::ReadOptions(), handles[records], rkey, &value).ok()) {
    Record r;
    std::string why;
    EXPECT_TRUE(internal::DecodeRecord(value, &r, &why)) << why;
    fence = r.fence;
  }
  for (auto* h : handles) (void)db->DestroyColumnFamilyHandle(h);
  delete db;
  return fence;
}

// Claims that only ever lived in the claim log — never extended, completed or
// written to the database — survive a SIGKILL: after each restart the key holds
// the claim, its fence and its attempt, and the next claim of it (its lease of
// 50 ms over) takes over with attempt + 1 and a higher fence, round after round.
TEST(RocksDBClaimLog, ClaimsOnlyInTheLogKeepAttemptsAndFencesAcrossRestarts) {
  const std::string dir = testing::MakeTempDir("rocksdb-claimlog");
  constexpr size_t kKeys = 20;
  std::map<std::string, Takeover> before;
  for (int round = 0; round < 3 && !HasFailure(); ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    const Acked acked =
        Parse(RunUntilThenKill({DEDUP_CRASH_CHILD, "logonly", dir, std::to_string(kKeys)}, "LOGGED"));
    ASSERT_EQ(acked.takeovers.size(), kKeys);
    std::map<std::string, Takeover> now;
    for (const Takeover& t : acked.takeovers) {
      now[t.key] = t;
      if (auto b = before.find(t.key); b != before.end()) {
        EXPECT_EQ(t.attempt, b->second.attempt + 1) << t.key << ": attempt after the restart";
        EXPECT_GT(t.fence, b->second.fence) << t.key << ": fence after the restart";
      } else {
        EXPECT_EQ(t.attempt, 1u) << t.key;
      }
      // Only in the log: the database has no record of this claim (at most the
      // previous round's, written when the store was last closed).
      EXPECT_LT(FenceInTheDatabase(dir, t.key), t.fence) << t.key << " is in the database";
    }
    {
      auto store = Reopen(dir);
      ASSERT_TRUE(store.ok()) << store.status();
      for (const auto& [key, t] : now) {
        auto r = (*store)->Inspect(key);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_TRUE(r->has_value()) << key << ": the logged claim was lost";
        EXPECT_EQ((*r)->state, RecordState::kInProgress) << key;
        EXPECT_EQ((*r)->fence, t.fence) << key;
        EXPECT_EQ((*r)->attempt, t.attempt) << key;
      }
    }
    before = now;
  }
  testing::RemoveDir(dir);
}

// A claim in the log whose completion the database no longer holds is not
// brought back by the fold: not after a forget removed the completion (a forget
// entry follows the claim in the log), and not after the expiry filter met the
// completion (records that expired while a log exists are kept until it is
// deleted). Either would come back as IN_PROGRESS: the key BUSY for its lease.
TEST(RocksDBClaimLog, ForgottenOrExpiredCompletionsStayGoneAfterACrash) {
  const std::string dir = testing::MakeTempDir("rocksdb-claimlog");
  RunUntilThenKill({DEDUP_CRASH_CHILD, "logforget", dir}, "DONE");
  auto store = Reopen(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto r = (*store)->Inspect("forgotten");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_value()) << "the forgotten key came back: " << **r;
  for (const char* key : {"forgotten", "expired"}) {
    ClaimRequest req;
    req.key = key;
    auto c = (*store)->Claim(req);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_TRUE(c->acquired()) << key << ": " << static_cast<int>(c->outcome);
    EXPECT_EQ(c->attempt, 1u) << key;
  }
  store->reset();
  testing::RemoveDir(dir);
}

// The two LD_PRELOAD libraries cannot run beside a sanitizer's runtime, which
// must come first.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SKIP_UNDER_A_SANITIZER() \
  GTEST_SKIP() << "a sanitizer's runtime must come first: no LD_PRELOAD library beside it"
#else
#define SKIP_UNDER_A_SANITIZER() (void)0
#endif

// Runs the child with `args` and LD_PRELOAD=`library` (and the environment
// variables `env`) until it prints DONE, then SIGKILLs it; its output.
std::string RunWithPreload(const char* library, const std::vector<std::string>& args,
                           const std::map<std::string, std::string>& env = {}) {
  setenv("LD_PRELOAD", library, 1);
  for (const auto& [name, value] : env) setenv(name.c_str(), value.c_str(), 1);
  std::string out = RunUntilThenKill(args, "DONE");
  unsetenv("LD_PRELOAD");
  for (const auto& [name, value] : env) unsetenv(name.c_str());
  return out;
}

// Runs the child on `dir` with `args` and sync_order_preload until it prints
// DONE, then SIGKILLs it (its output in *out). What the preload noted: empty
// when a power loss at each deletion of a claim log (or at the child's
// SYNC-PROBE) would have lost nothing.
std::string RunNotingSyncOrder(const std::vector<std::string>& args, const std::string& dir,
                               std::string* out = nullptr) {
  const std::string report = dir + "-sync-order";
  std::remove(report.c_str());
  const std::string printed =
      RunWithPreload(DEDUP_SYNC_ORDER_PRELOAD, args, {{"DEDUP_SYNC_ORDER_REPORT", report}});
  if (out != nullptr) *out = printed;
  std::ifstream in(report);
  const std::string found((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(report.c_str());
  return found;
}

// With sync=interval a power loss may lose the last interval's operations, no
// more (README): a claim that the claim log held, synced, for longer must
// survive one. So a claim log may be deleted only once its claims are durable
// in the database: written there through the WAL (fewer than 4,096 of them, as
// CompactNow, a close or the materializer of a log grown past 32 MiB write
// them), the WAL must be synced before the log goes. A power loss is not
// simulated: sync_order_preload notes, at each deletion of a claim log, the
// write-ahead logs with writes not yet synced, what a power loss then drops.
TEST(RocksDBClaimLog, ALogIsDeletedOnlyOnceItsClaimsAreSyncedElsewhere) {
  SKIP_UNDER_A_SANITIZER();
  const std::string dir = testing::MakeTempDir("rocksdb-claimlog");
  const std::string found = RunNotingSyncOrder({DEDUP_CRASH_CHILD, "materialize", dir}, dir);
  std::vector<uint64_t> logs;
  ASSERT_TRUE(internal::ListClaimLogs(dir, &logs).ok());
  EXPECT_TRUE(logs.empty()) << "CompactNow left a claim log: the test tested no deletion";
  EXPECT_EQ(found, "") << "a power loss here loses claims the deleted log had made durable";
  testing::RemoveDir(dir);
}

// sync=interval: a claim log closed for a materialization that then failed
// (the write-ahead log refuses writes) stays until one succeeds; the claims it
// alone holds must still be synced within the interval, as the current log's
// are, or a power loss drops claims older than the interval.
TEST(RocksDBClaimLog, AClosedLogThatStaysIsSyncedWithinTheInterval) {
  SKIP_UNDER_A_SANITIZER();
  const std::string dir = testing::MakeTempDir("rocksdb-closedlog");
  std::string out;
  const std::string found = RunNotingSyncOrder({DEDUP_CRASH_CHILD, "closedlog", dir}, dir, &out);
  EXPECT_NE(out.find("FAILED"), std::string::npos)
      << "the materialization did not fail: nothing was tested. Output:\n" << out;
  std::vector<uint64_t> logs;
  ASSERT_TRUE(internal::ListClaimLogs(dir, &logs).ok());
  EXPECT_FALSE(logs.empty()) << "the failed materialization deleted its log";
  EXPECT_EQ(found, "") << "three intervals after the failed materialization, a power loss "
                          "loses these logs' claims";
  testing::RemoveDir(dir);
}

// Runs the child with claim_log_fault_preload (claim log appends that fail at
// moments the child picks) until it prints DONE, then SIGKILLs it; its output.
std::string RunWithFailingAppends(const std::vector<std::string>& args) {
  return RunWithPreload(DEDUP_CLAIM_LOG_FAULT_PRELOAD, args);
}

// The words after `tag` of each line of `out` that starts with it.
std::vector<std::vector<std::string>> Lines(const std::string& out, const std::string& tag) {
  std::vector<std::vector<std::string>> found;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (!line.starts_with(tag + " ")) continue;
    std::istringstream words(line.substr(tag.size() + 1));
    found.emplace_back(std::istream_iterator<std::string>(words), std::istream_iterator<std::string>());
  }
  return found;
}

// While claim log appends fail (a full disk), claims stay pending for as long
// as the failures last, not one round: a crash then forgets every claim made
// since they began. Key "k", claimed and logged (attempt 1), is taken over
// twice meanwhile (attempts 2 and 3); after a SIGKILL the log's claim is back
// and the next claim gets attempt 2 again. DESIGN.md allows it (attempts are
// counted across crashes for claims with max_attempts only); fences never
// repeat. A claim with max_attempts made meanwhile is written before it
// returns, so a poison message gets no attempt past its max_attempts ("p").
TEST(RocksDBClaimLog, ClaimsMadeWhileAppendsFailAreForgottenByACrashButNotPastMaxAttempts) {
  SKIP_UNDER_A_SANITIZER();
  const std::string dir = testing::MakeTempDir("rocksdb-attempts");
  const std::string out = RunWithFailingAppends({DEDUP_CRASH_CHILD, "attemptsback", dir});
  std::map<std::string, std::vector<std::pair<uint64_t, uint32_t>>> handed;  // fence, attempt
  for (const auto& w : Lines(out, "H")) {
    ASSERT_EQ(w.size(), 3u);
    handed[w[0]].emplace_back(std::stoull(w[1]), static_cast<uint32_t>(std::stoul(w[2])));
  }
  ASSERT_EQ(handed["k"].size(), 3u) << out;
  ASSERT_EQ(handed["p"].size(), 3u) << out;
  EXPECT_EQ(handed["k"].back().second, 3u);
  auto store = Reopen(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  // "k": the claim the log held is back (not forgotten); the two takeovers
  // made while appends failed are (the documented limit).
  auto k = (*store)->Inspect("k");
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE(k->has_value()) << "k: the logged claim was lost";
  EXPECT_EQ((**k).fence, handed["k"][0].first);
  ClaimRequest req;
  req.key = "k";
  auto next = (*store)->Claim(req);
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_TRUE(next->acquired());
  EXPECT_GT(next->fence, handed["k"].back().first) << "a fence handed out before the crash again";
  EXPECT_EQ(next->attempt, 2u) << "attempts 1, 2, 3 were handed out before the crash";
  std::printf("[ attempts ] k: attempts 1, 2, 3 handed out (2 and 3 while appends failed); "
              "after the crash the next claim is attempt %u\n", next->attempt);
  // "p": the claim with max_attempts survived, and the next one is EXHAUSTED.
  auto p = (*store)->Inspect("p");
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->has_value());
  EXPECT_EQ((**p).fence, handed["p"].back().first);
  EXPECT_EQ((**p).attempt, 3u);
  req.key = "p";
  req.max_attempts = 3;
  auto exhausted = (*store)->Claim(req);
  ASSERT_TRUE(exhausted.ok()) << exhausted.status();
  EXPECT_EQ(exhausted->outcome, ClaimOutcome::kExhausted) << "a fourth attempt of a poison message";
  store->reset();
  testing::RemoveDir(dir);
}

// The writer moves a claim into the logged map before its frame is written; if
// the append fails, the claim goes back to pending, unless a newer claim of
// its key is there: a takeover made while the append was under way (here held
// until the takeover is made) supersedes it. Put back over the takeover, it
// would undo it: Inspect shows the old claim, the takeover's completion is
// LOST, and the old claim is what gets logged.
TEST(RocksDBClaimLog, AFailedAppendDoesNotPutItsClaimBackOverATakeoverMadeMeanwhile) {
  SKIP_UNDER_A_SANITIZER();
  const std::string dir = testing::MakeTempDir("rocksdb-moveback");
  const std::string out = RunWithFailingAppends({DEDUP_CRASH_CHILD, "moveback", dir});
  const auto one = [&](const std::string& tag) {
    const auto l = Lines(out, tag);
    EXPECT_EQ(l.size(), 1u) << tag << " lines; output:\n" << out;
    return l.size() == 1 && l[0].size() == 2 ? l[0][1] : std::string("?");
  };
  const std::string b = one("B"), c = one("C");
  ASSERT_NE(b, c);
  EXPECT_EQ(one("INSPECT"), c) << "Inspect shows the claim of the failed append, not the takeover";
  EXPECT_EQ(one("COMPLETE"), "OK") << "the takeover's completion";
  EXPECT_EQ(one("LOGGED"), c) << "the claim log got the claim of the failed append";
  auto store = Reopen(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto k = (*store)->Inspect("k");
  ASSERT_TRUE(k.ok()) << k.status();
  ASSERT_TRUE(k->has_value());
  EXPECT_EQ((**k).state, RecordState::kCompleted);
  EXPECT_EQ(std::to_string((**k).fence), c);
  store->reset();
  testing::RemoveDir(dir);
}

// dedup inspect beside a worker whose claim log append fails half-way: the
// read-only open reads the log while the torn frame is at its end, and goes
// on reading after the writer has dealt with it and written two more frames.
// If the writer cuts the torn frame off and writes the next frames where it
// was, the reader's bytes are half the torn frame, then the rest of a frame as
// long: a damaged frame followed by a whole one, and the open fails with
// DataLoss for a log that was never damaged. (A frame cut off is never read as
// whole: it fails its CRC, so no claim that never was is shown.)
TEST(RocksDBClaimLog, AReadOnlyOpenBesideAFailedAppendSeesNoDamage) {
  SKIP_UNDER_A_SANITIZER();
  const std::string dir = testing::MakeTempDir("rocksdb-tornread");
  const std::string out = RunWithFailingAppends({DEDUP_CRASH_CHILD, "tornread", dir});
  const auto first = Lines(out, "A");
  ASSERT_EQ(first.size(), 1u) << out;
  const auto open = Lines(out, "RO OPEN");
  ASSERT_EQ(open.size(), 1u) << out;
  EXPECT_EQ(open[0], std::vector<std::string>{"OK"}) << "the read-only open failed:\n" << out;
  const auto seen = Lines(out, "RO first");
  if (!seen.empty()) EXPECT_EQ(seen[0], std::vector<std::string>{first[0][1]}) << out;
  // The writer's next open folds the logs in: a frame cut short at a log's
  // end is what a crash leaves, no damage.
  auto store = Reopen(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  for (const char* key : {"first", "tornA", "tornB", "after"}) {
    auto r = (*store)->Inspect(key);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value()) << key;
    EXPECT_EQ((**r).state, key == std::string("tornA") ? RecordState::kCompleted
                                                      : RecordState::kInProgress) << key;
  }
  store->reset();
  testing::RemoveDir(dir);
}

// As CompletionsSurviveAKillDuringMaterializations, with forgets and releases
// among the completions: after each SIGKILL a forgotten key stays gone (its
// claim is in a claim log, followed by a forget entry, or was written into the
// database by a materialization before the forget deleted it), a released one
// stays released, a completed one completed.
TEST(RocksDBClaimLog, ForgetsAndReleasesSurviveAKillDuringMaterializations) {
  const std::string dir = testing::MakeTempDir("rocksdb-bulk");
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 3 && !HasFailure(); ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    std::string out;
    ASSERT_NO_FATAL_FAILURE(KillAfterAMaterialization(
        {DEDUP_CRASH_CHILD, "bulkmixed", dir, std::to_string(round)}, &rng, &out));
    std::set<std::string> forgotten;
    size_t pos = 0;
    for (size_t nl; (nl = out.find('\n', pos)) != std::string::npos; pos = nl + 1) {
      if (out.compare(pos, 2, "F ") == 0) forgotten.insert(out.substr(pos + 2, nl - pos - 2));
    }
    const Acked acked = Parse(out);
    ASSERT_FALSE(forgotten.empty() || acked.released.empty() || acked.completed.empty())
        << "the child forgot, released or completed nothing before the kill";
    auto store = Reopen(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    int wrong = 0;
    const auto expect = [&](const std::string& key, const char* what, auto&& ok) {
      auto r = (*store)->Inspect(key);
      ASSERT_TRUE(r.ok()) << r.status();
      if (!ok(*r) && ++wrong <= 5) {
        ADD_FAILURE() << key << ": " << what << ", now "
                      << (r->has_value() ? "state " + std::to_string(int((**r).state)) +
                                               " fence " + std::to_string((**r).fence)
                                         : std::string("gone"));
      }
    };
    for (const std::string& key : forgotten) {
      expect(key, "forgotten", [](const std::optional<Record>& r) { return !r.has_value(); });
    }
    for (const std::string& key : acked.released) {
      expect(key, "released", [](const std::optional<Record>& r) {
        return r.has_value() && r->state == RecordState::kReleased;
      });
    }
    for (const std::string& key : acked.completed) {
      expect(key, "completed", [&](const std::optional<Record>& r) {
        return r.has_value() && r->state == RecordState::kCompleted && r->result == key;
      });
    }
    EXPECT_EQ(wrong, 0) << "of " << forgotten.size() << " forgotten, " << acked.released.size()
                        << " released, " << acked.completed.size() << " completed";
  }
  testing::RemoveDir(dir);
}

}  // namespace
}  // namespace dedup
