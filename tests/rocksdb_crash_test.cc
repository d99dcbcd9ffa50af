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
// forgotten. (A power loss is not simulated here.)

#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dedup/rocksdb_store.h"
#include "store_envs.h"

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

struct Takeover {
  std::string kind;  // "P": with max_attempts, "U": without
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
    } else if (kind == "P" || kind == "U") {
      Takeover t;
      t.kind = kind;
      t.key = key;
      line >> t.fence;
      if (kind == "P") line >> t.attempt;
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
  Child c = Spawn({DEDUP_CRASH_CHILD, "work", dir, sync, "r" + std::to_string(round)});
  ASSERT_GT(c.pid, 0) << "could not start " << DEDUP_CRASH_CHILD;

  std::string out;
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  bool alive = true;
  while (alive && out.find("\nC ") == std::string::npos &&
         std::chrono::steady_clock::now() < give_up) {
    alive = ReadSome(c.out, &out, 20ms);
  }
  // A random moment after the first completion, somewhere in the middle of a write.
  const auto kill_at =
      std::chrono::steady_clock::now() + std::chrono::milliseconds((*rng)() % 300);
  while (alive && std::chrono::steady_clock::now() < kill_at) alive = ReadSome(c.out, &out, 5ms);
  kill(c.pid, SIGKILL);
  int wstatus = 0;
  waitpid(c.pid, &wstatus, 0);
  for (int i = 0; i < 1000 && ReadSome(c.out, &out, 100ms); ++i) {
  }
  close(c.out);
  ASSERT_TRUE(WIFSIGNALED(wstatus) && WTERMSIG(wstatus) == SIGKILL)
      << "the child ended on its own before the kill (status " << wstatus << "); output:\n"
      << out.substr(0, 2000);

  const Acked acked = Parse(out);
  ASSERT_FALSE(acked.completed.empty()) << "the child completed nothing before the kill";

  RocksDBStoreOptions o;
  o.path = dir;
  auto store = RocksDBStore::Open(o);
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
  // max_attempts only grow too, so a crash never gives a poison message a free try.
  size_t takeovers = 0;
  for (const Takeover& t : acked.takeovers) {
    ++takeovers;
    if (history->fence.count(t.key) != 0 && t.fence <= history->fence[t.key]) {
      note(t.key + ": fence " + std::to_string(t.fence) + " not above " + std::to_string(history->fence[t.key]));
    }
    history->fence[t.key] = t.fence;
    if (t.kind == "P") {
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

}  // namespace
}  // namespace dedup
