// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The RocksDB store's open path under damage and faults (issue 13, item 1): a
// directory whose CURRENT is gone or whose MANIFEST does not match its files is
// refused on every open and never re-initialised; a corrupt record in the middle
// of the write-ahead log is an error naming the log (salvage only on request),
// while a torn tail is tolerated; a full disk is ResourceExhausted, never an
// abort; admin opens never create a store and work read-only.

#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dedup/rocksdb_store.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/file_system.h"
#include "store_envs.h"
#include "stores/rocksdb/claim_log.h"
#include "stores/rocksdb/record_codec.h"

namespace dedup {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

// An encoded IN_PROGRESS record of `fence`, held for 10 minutes.
std::string LoggedClaim(Clock& clock, uint64_t fence) {
  Record r;
  r.state = RecordState::kInProgress;
  r.token = Token::Random();
  r.fence = fence;
  r.attempt = 1;
  r.lease_deadline = clock.NowMillis() + 600'000;
  r.retention_deadline = r.lease_deadline + 86'400'000;
  std::string v;
  internal::EncodeRecord(r, &v);
  return v;
}

// What a process leaves in a claim log at fence epoch 1: a claim of
// "forgotten"; a claim of "middle" (the frame at `*second`); "forgotten"'s
// forget (it was completed, then forgotten) and a claim of "after".
std::string ThreeFrames(Clock& clock, size_t* second) {
  const uint64_t epoch1 = uint64_t{1} << 32;
  std::string bytes;
  internal::ClaimLogFrame f;
  f.AddClaim("forgotten", LoggedClaim(clock, epoch1 + 1));
  bytes += f.Finish();
  *second = bytes.size();
  f.Clear();
  f.AddClaim("middle", LoggedClaim(clock, epoch1 + 2));
  bytes += f.Finish();
  f.Clear();
  f.AddForget("forgotten", epoch1 + 1);
  f.AddClaim("after", LoggedClaim(clock, epoch1 + 3));
  bytes += f.Finish();
  return bytes;
}

// Each key's last claim in the claim logs of `db`: its fence. False when a log
// cannot be listed or read.
bool LoggedFences(const std::string& db, std::map<std::string, uint64_t>* fences) {
  fences->clear();
  std::vector<uint64_t> logs;
  if (!internal::ListClaimLogs(db, &logs).ok()) return false;
  for (uint64_t n : logs) {
    const auto note = [&](uint8_t type, std::string_view k, std::string_view v) {
      Record rec;
      std::string why;
      if (type == internal::kClaimEntry && internal::DecodeRecord(v, &rec, &why)) {
        (*fences)[std::string(k)] = rec.fence;
      }
    };
    Status r = internal::ReadClaimLog(db + "/" + internal::ClaimLogName(n), note);
    if (!r.ok()) return false;
  }
  return true;
}

// Waits (10 s at the most) until the claim logs of `db` hold a claim of each
// of `keys`: the writer has logged them.
::testing::AssertionResult WaitLogged(const std::string& db, const std::vector<std::string>& keys) {
  std::map<std::string, uint64_t> fences;
  for (int i = 0; i < 5000; ++i) {
    if (!LoggedFences(db, &fences)) return ::testing::AssertionFailure() << "cannot read the claim logs";
    const auto logged = [&](const std::string& k) { return fences.count(k) != 0; };
    if (std::all_of(keys.begin(), keys.end(), logged)) return ::testing::AssertionSuccess();
    std::this_thread::sleep_for(2ms);
  }
  return ::testing::AssertionFailure() << "the claims never reached the claim log";
}

class RocksDBHardeningTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("rocksdb-hardening"); }
  void TearDown() override { testing::RemoveDir(dir_); }

  StatusOr<std::unique_ptr<RocksDBStore>> TryOpen(
      const std::string& path, WalRecovery rec = WalRecovery::kStrict, bool read_only = false,
      bool create = true, rocksdb::Env* env = nullptr) {
    RocksDBStoreOptions o;
    o.path = path;
    o.clock = &clock_;
    o.wal_recovery = rec;
    o.read_only = read_only;
    o.create_if_missing = create;
    o.env = env;
    return RocksDBStore::Open(o);
  }

  // A store at `path`, closed at fence epoch 1, beside a claim log that its
  // next open folds in, holding a claim of "held" of `fence`; the log's path.
  std::string StoreAndAClaimLog(const std::string& path, uint64_t fence) {
    EXPECT_TRUE(TryOpen(path).ok());
    internal::ClaimLogFrame f;
    f.AddClaim("held", LoggedClaim(clock_, fence));
    const std::string log = path + "/" + internal::ClaimLogName(1);
    std::ofstream(log, std::ios::binary) << f.Finish();
    return log;
  }

  static ClaimRequest Req(std::string_view key) {
    ClaimRequest r;
    r.key = key;
    r.lease = 10min;
    r.retention = 24h;
    return r;
  }

  static std::string Key(int i) { return "key-" + std::to_string(i); }

  // A store at `path` with `n` claimed keys, closed (the records are in the WAL).
  // The claims carry max_attempts, so each is written before it returns, one WAL
  // record per claim (claims without it are group-committed, many per record).
  void Fill(const std::string& path, int n) {
    auto s = TryOpen(path);
    ASSERT_TRUE(s.ok()) << s.status();
    for (int i = 0; i < n; ++i) {
      const std::string key = Key(i);  // Req keeps a view of it
      ClaimRequest r = Req(key);
      r.max_attempts = 1000;
      ASSERT_TRUE((*s)->Claim(r).ok());
    }
  }

  int CountRecords(Store* s, int n) {
    int found = 0;
    for (int i = 0; i < n; ++i) {
      auto r = s->Inspect(Key(i));
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok() && r->has_value()) ++found;
    }
    return found;
  }

  static std::vector<std::string> Files(const std::string& path, std::string_view suffix) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(path)) {
      const std::string n = e.path().filename().string();
      if (n.ends_with(suffix)) out.push_back(n);
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  static std::string OnlyLog(const std::string& path) {
    std::string found;
    for (const auto& e : fs::directory_iterator(path)) {
      if (e.path().extension() == ".log" && fs::file_size(e.path()) > 0) {
        EXPECT_TRUE(found.empty()) << "more than one live WAL";
        found = e.path().string();
      }
    }
    EXPECT_FALSE(found.empty());
    return found;
  }

  std::string dir_;
  SimulatedClock clock_;
};

TEST_F(RocksDBHardeningTest, MissingCurrentIsRefusedOnEveryOpenAndNothingIsDeleted) {
  const std::string db = dir_ + "/db";
  Fill(db, 200);
  {  // push some records into a table file too
    auto s = TryOpen(db);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->CompactNow().ok());
    for (int i = 200; i < 300; ++i) ASSERT_TRUE((*s)->Claim(Req(Key(i))).ok());
  }
  const std::string current = db + "/CURRENT";
  std::string saved;
  {
    std::ifstream in(current);
    std::getline(in, saved);
  }
  fs::remove(current);
  const auto ssts = Files(db, ".sst");
  const auto logs = Files(db, ".log");
  ASSERT_FALSE(ssts.empty());
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto s = TryOpen(db);
    ASSERT_FALSE(s.ok()) << "open " << attempt << " re-initialised a damaged directory";
    EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status();
    EXPECT_NE(s.status().message().find("no CURRENT"), std::string::npos) << s.status();
    auto ro = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, /*create=*/false);
    ASSERT_FALSE(ro.ok());
    EXPECT_EQ(ro.status().code(), StatusCode::kDataLoss) << ro.status();
    EXPECT_FALSE(fs::exists(current)) << "an open wrote a new CURRENT";
  }
  EXPECT_EQ(Files(db, ".sst"), ssts);
  EXPECT_EQ(Files(db, ".log"), logs);
  // Restoring CURRENT gives every record back.
  std::ofstream(current) << saved << "\n";
  auto s = TryOpen(db);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(CountRecords(s->get(), 300), 300);
}

// What a crash in the middle of creating a database leaves (RocksDB wrote
// MANIFEST-000001 and had not yet named it in CURRENT) holds no record: the next
// open creates the store, where refusing would lock the worker out of a store it
// never got to use (seen in worker_chaos_rocksdb: a SIGKILL during the first open,
// then every restart refused with DATA_LOSS). Admin opens still find no store.
TEST_F(RocksDBHardeningTest, CreationCutShortIsCreatedAgain) {
  const std::string db = dir_ + "/db";
  fs::create_directories(db);
  std::ofstream(db + "/MANIFEST-000001", std::ios::binary) << std::string("\x01\x02torn", 6);
  std::ofstream(db + "/IDENTITY") << "d6f1\n";
  {
    auto ro = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, /*create=*/false);
    ASSERT_FALSE(ro.ok());
    EXPECT_EQ(ro.status().code(), StatusCode::kNotFound) << ro.status();
    EXPECT_NE(ro.status().message().find("cut short"), std::string::npos) << ro.status();
    EXPECT_FALSE(fs::exists(db + "/CURRENT"));
  }
  {
    auto s = TryOpen(db);
    ASSERT_TRUE(s.ok()) << s.status();
    ASSERT_TRUE((*s)->Claim(Req("k")).ok());
  }
  auto s = TryOpen(db);
  ASSERT_TRUE(s.ok()) << s.status();
  auto again = (*s)->Claim(Req("k"));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->outcome, ClaimOutcome::kBusy);

  // A first MANIFEST beside a log is not a creation cut short.
  const std::string other = dir_ + "/other";
  Fill(other, 10);
  for (const auto& e : fs::directory_iterator(other)) {
    const std::string n = e.path().filename().string();
    if (n == "CURRENT" || n.starts_with("MANIFEST-")) fs::remove(e.path());
  }
  std::ofstream(other + "/MANIFEST-000001", std::ios::binary) << "torn";
  ASSERT_FALSE(Files(other, ".log").empty());
  auto refused = TryOpen(other);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kDataLoss) << refused.status();
}

// The same by crashing: a child creates a store and is SIGKILLed at a random
// moment of it; every directory it leaves opens, and opens again.
TEST_F(RocksDBHardeningTest, KilledWhileCreatingTheStoreOpensAfterwards) {
  auto create = [&](const std::string& path) {
    pid_t pid = fork();
    if (pid == 0) {
      auto s = TryOpen(path);
      _exit(s.ok() ? 0 : 1);
    }
    return pid;
  };
  // How long a creation takes here, to spread the kills over it.
  auto t0 = std::chrono::steady_clock::now();
  pid_t pid = create(dir_ + "/timed");
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const auto span = std::chrono::duration_cast<std::chrono::microseconds>(
                        std::chrono::steady_clock::now() - t0).count();
  unsigned seed = static_cast<unsigned>(getpid());
  int killed = 0;
  for (int i = 0; i < 60; ++i) {
    const std::string path = dir_ + "/db" + std::to_string(i);
    pid = create(path);
    ASSERT_GT(pid, 0);
    usleep(static_cast<useconds_t>(rand_r(&seed) % (span + 1)));
    if (kill(pid, SIGKILL) == 0) ++killed;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    for (int open = 0; open < 2; ++open) {
      auto s = TryOpen(path);
      ASSERT_TRUE(s.ok()) << "after a kill at iteration " << i << ", open " << open << ": "
                          << s.status();
      ASSERT_TRUE((*s)->Claim(Req(Key(open))).ok());
    }
  }
  RecordProperty("killed", killed);
}

TEST_F(RocksDBHardeningTest, ManifestThatDoesNotMatchTheFilesIsRefused) {
  const std::string db = dir_ + "/db";
  Fill(db, 100);
  {
    auto s = TryOpen(db);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->CompactNow().ok());
  }
  // Another, empty database's MANIFEST and CURRENT put in place of ours.
  const std::string other = dir_ + "/other";
  {
    rocksdb::Options o;
    o.create_if_missing = true;
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(o, other, &raw).ok());
    delete raw;
  }
  for (const auto& e : fs::directory_iterator(db)) {
    if (e.path().filename().string().starts_with("MANIFEST-")) fs::remove(e.path());
  }
  for (const auto& e : fs::directory_iterator(other)) {
    const std::string n = e.path().filename().string();
    if (n == "CURRENT" || n.starts_with("MANIFEST-")) {
      fs::copy_file(e.path(), db + "/" + n, fs::copy_options::overwrite_existing);
    }
  }
  const auto ssts = Files(db, ".sst");
  ASSERT_FALSE(ssts.empty());
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto s = TryOpen(db);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status();
  }
  EXPECT_EQ(Files(db, ".sst"), ssts) << "an open deleted table files";

  // CURRENT naming a MANIFEST that is gone: refused, nothing created.
  std::ofstream(db + "/CURRENT") << "MANIFEST-999999\n";
  auto s = TryOpen(db);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status();
  EXPECT_EQ(Files(db, ".sst"), ssts);
}

TEST_F(RocksDBHardeningTest, CorruptRecordInTheMiddleOfTheWalIsAnErrorNamingTheLog) {
  const std::string db = dir_ + "/db";
  constexpr int kN = 3000;
  Fill(db, kN);
  const std::string log = OnlyLog(db);
  const auto size = fs::file_size(log);
  {  // flip 8 bytes in the middle
    std::fstream f(log, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(size / 2));
    char b[8];
    f.read(b, 8);
    for (char& c : b) c = static_cast<char>(~c);
    f.seekp(static_cast<std::streamoff>(size / 2));
    f.write(b, 8);
  }
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto s = TryOpen(db);
    ASSERT_FALSE(s.ok()) << "a corrupt WAL record was skipped silently";
    EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status();
    EXPECT_NE(s.status().message().find(fs::path(log).filename().string()), std::string::npos)
        << s.status();
    EXPECT_NE(s.status().message().find("recovery=salvage"), std::string::npos) << s.status();
    auto ro = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, /*create=*/false);
    ASSERT_FALSE(ro.ok());
  }
  EXPECT_EQ(fs::file_size(log), size);
  // Salvage, asked for explicitly: the records before the damage are there.
  auto s = TryOpen(db, WalRecovery::kSalvage);
  ASSERT_TRUE(s.ok()) << s.status();
  const int found = CountRecords(s->get(), kN);
  EXPECT_GT(found, kN / 4);
  EXPECT_LT(found, kN);
  for (int i = 0; i < 100; ++i) {
    auto r = (*s)->Inspect(Key(i));
    ASSERT_TRUE(r.ok());
    EXPECT_TRUE(r->has_value()) << Key(i);
  }
}

TEST_F(RocksDBHardeningTest, TornTailOfTheWalIsTolerated) {
  const std::string db = dir_ + "/db";
  constexpr int kN = 500;
  Fill(db, kN);
  const std::string log = OnlyLog(db);
  fs::resize_file(log, fs::file_size(log) - 7);  // the last record cut in half
  auto s = TryOpen(db);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(CountRecords(s->get(), kN), kN - 1);
}

TEST_F(RocksDBHardeningTest, AdminOpensNeverCreateAStore) {
  const std::string missing = dir_ + "/typo";
  auto s = TryOpen(missing, WalRecovery::kStrict, false, /*create=*/false);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound) << s.status();
  EXPECT_FALSE(fs::exists(missing));
  s = TryOpen(missing, WalRecovery::kStrict, /*read_only=*/true, false);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound) << s.status();
  EXPECT_FALSE(fs::exists(missing));
  // Through the URI, as inspect and forget open it.
  OpenOptions oo;
  oo.must_exist = true;
  auto u = OpenStore("rocksdb:" + missing, oo);
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), StatusCode::kNotFound) << u.status();
  EXPECT_FALSE(fs::exists(missing));
  fs::create_directories(missing);
  u = OpenStore("rocksdb:" + missing, oo);
  ASSERT_FALSE(u.ok());
  EXPECT_TRUE(fs::is_empty(missing));
}

// A NUL in the path (a "%00" in the URI) is refused before anything touches the
// disk: the file system would stop at it and create the directory before it.
TEST_F(RocksDBHardeningTest, PathWithANulByteIsRefusedAndCreatesNothing) {
  auto u = OpenStore("rocksdb:" + dir_ + "/x%00y");
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().code(), StatusCode::kInvalidArgument) << u.status();
  EXPECT_NE(u.status().message().find("NUL"), std::string::npos) << u.status();
  EXPECT_FALSE(fs::exists(dir_ + "/x"));
  RocksDBStoreOptions o;
  o.path = dir_ + std::string("/x\0y", 4);
  EXPECT_EQ(RocksDBStore::Open(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir_ + "/x"));
}

TEST_F(RocksDBHardeningTest, ReadOnlyOpenReadsBesideAWriterAndRefusesWrites) {
  const std::string db = dir_ + "/db";
  auto w = TryOpen(db);
  ASSERT_TRUE(w.ok());
  // Completed, so that it is in the WAL when the reader opens: a claim alone is
  // written by the group commit a millisecond or two later (the test was racy).
  auto a = (*w)->Claim(Req("a"));
  ASSERT_TRUE(a.ok());
  ASSERT_EQ(*(*w)->Complete("a", a->token, std::chrono::minutes(10), CompletionStatus::kOk, ""),
            WriteResult::kOk);
  // A claim still held (a handler at work): the writer puts it in the claim log,
  // not the database; a read-only open (dedup inspect) reads it from there.
  auto held = (*w)->Claim(Req("held"));
  ASSERT_TRUE(held.ok() && held->acquired());
  ASSERT_TRUE(WaitLogged(db, {"held"}));
  auto ro = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, false);
  ASSERT_TRUE(ro.ok()) << ro.status();
  auto r = (*ro)->Inspect("a");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->has_value());
  auto h = (*ro)->Inspect("held");
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_TRUE(h->has_value()) << "a held claim is invisible to a read-only open";
  EXPECT_EQ((*h)->state, RecordState::kInProgress);
  EXPECT_EQ((*h)->fence, held->fence);
  auto listed = (*ro)->Scan("", 10);
  EXPECT_TRUE(listed.ok()) << listed.status();
  auto c = (*ro)->Claim(Req("b"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition) << c.status();
}

// A claim log whose damage is not at its end (a changed byte in a frame that is
// followed by whole ones) is not what a crash leaves. Stopping there silently
// dropped every later frame: here the forget of a completed claim, so the open
// brought the forgotten claim back (a key the operator removed came back
// IN_PROGRESS, its attempt counted). Such a log refuses the open, naming it;
// salvage, asked for, loses only the damaged frame.
TEST_F(RocksDBHardeningTest, DamagedFrameInTheMiddleOfAClaimLogIsAnErrorNamingTheLog) {
  const std::string db = dir_ + "/db";
  {
    auto s = TryOpen(db);  // fence epoch 1
    ASSERT_TRUE(s.ok()) << s.status();
  }
  const uint64_t epoch1 = uint64_t{1} << 32;
  size_t second = 0;
  std::string bytes = ThreeFrames(clock_, &second);
  bytes[second + 12] ^= 0x20;  // in the second frame's payload
  const std::string log = db + "/" + internal::ClaimLogName(1);
  std::ofstream(log, std::ios::binary) << bytes;
  for (int attempt = 0; attempt < 2; ++attempt) {
    auto s = TryOpen(db);
    if (s.ok()) {
      auto r = (*s)->Inspect("forgotten");
      ADD_FAILURE() << "a claim log damaged before its end was read up to the damage silently; "
                    << "the forgotten key is "
                    << (r.ok() && r->has_value() ? "back: " + std::string(RecordStateName((**r).state))
                                                 : std::string("gone"));
      return;
    }
    EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status();
    EXPECT_NE(s.status().message().find(internal::ClaimLogName(1)), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("recovery=salvage"), std::string::npos) << s.status();
    auto ro = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, /*create=*/false);
    ASSERT_FALSE(ro.ok());
    EXPECT_EQ(ro.status().code(), StatusCode::kDataLoss) << ro.status();
  }
  ASSERT_TRUE(fs::exists(log));
  EXPECT_EQ(fs::file_size(log), bytes.size());
  // Salvage, asked for: the damaged frame's claim is lost, the frames after it
  // are not; the fences of the logged claims are never handed out again.
  auto s = TryOpen(db, WalRecovery::kSalvage);
  ASSERT_TRUE(s.ok()) << s.status();
  auto gone = (*s)->Inspect("forgotten");
  ASSERT_TRUE(gone.ok());
  EXPECT_FALSE(gone->has_value()) << "the forget after the damaged frame was dropped";
  auto after = (*s)->Inspect("after");
  ASSERT_TRUE(after.ok());
  ASSERT_TRUE(after->has_value()) << "the claim after the damaged frame was dropped";
  EXPECT_EQ((**after).fence, epoch1 + 3);
  auto middle = (*s)->Claim(Req("middle"));
  ASSERT_TRUE(middle.ok() && middle->acquired());
  EXPECT_GT(middle->fence, epoch1 + 3);
  EXPECT_FALSE(fs::exists(log)) << "folded in, the log is deleted";
}

// The same with the changed byte in a frame's length: read larger, the frame
// seemed to run past the end of the file; read smaller, the next frame was
// looked for at the wrong offset. Both were taken for a crash's torn tail: the
// open succeeded and dropped every later frame (the forget of "forgotten",
// which came back IN_PROGRESS, and the claims after it). A torn tail, the last
// frame cut short anywhere, still opens with the frames before it.
TEST_F(RocksDBHardeningTest, AChangedLengthInTheMiddleOfAClaimLogIsAnErrorATornTailIsNot) {
  const uint64_t epoch1 = uint64_t{1} << 32;
  size_t second = 0;
  std::string bytes = ThreeFrames(clock_, &second);
  const size_t last = bytes.size();
  internal::ClaimLogFrame f;
  f.AddClaim("last", LoggedClaim(clock_, epoch1 + 4));
  bytes += f.Finish();
  // A store at fence epoch 1 beside a claim log holding `content`; the log's path.
  int stores = 0;
  const auto store_with_log = [&](const std::string& content, std::string* db) {
    *db = dir_ + "/db" + std::to_string(stores++);
    EXPECT_TRUE(TryOpen(*db).ok());
    const std::string log = *db + "/" + internal::ClaimLogName(1);
    std::ofstream(log, std::ios::binary) << content;
    return log;
  };
  const auto fence_of = [](Store* s, std::string_view key) -> int64_t {
    auto r = s->Inspect(key);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() && r->has_value() ? static_cast<int64_t>((**r).fence) : -1;
  };

  for (const auto& [what, at, bit] : {std::tuple<const char*, size_t, char>{"larger", second + 3, 0x40},
                                      {"smaller", second, 0x01}}) {
    SCOPED_TRACE(what);
    std::string bad = bytes;
    bad[at] ^= bit;
    std::string db;
    const std::string log = store_with_log(bad, &db);
    auto s = TryOpen(db);
    if (s.ok()) {
      ADD_FAILURE() << "a claim log whose second frame's length changed was read as a torn "
                    << "tail; the forgotten key's fence is now " << fence_of(s->get(), "forgotten")
                    << ", the claim after it " << fence_of(s->get(), "after");
      continue;
    }
    EXPECT_EQ(s.status().code(), StatusCode::kDataLoss) << s.status();
    EXPECT_NE(s.status().message().find(internal::ClaimLogName(1) + " has a damaged frame at byte " +
                                        std::to_string(second)),
              std::string::npos)
        << s.status();
    EXPECT_NE(s.status().message().find("recovery=salvage"), std::string::npos) << s.status();
    auto ro = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, /*create=*/false);
    ASSERT_FALSE(ro.ok());
    EXPECT_EQ(ro.status().code(), StatusCode::kDataLoss) << ro.status();
    ASSERT_TRUE(fs::exists(log));
    EXPECT_EQ(fs::file_size(log), bad.size());
    // Salvage: the damaged frame's claim is lost, the frames after it are not.
    auto salvaged = TryOpen(db, WalRecovery::kSalvage);
    ASSERT_TRUE(salvaged.ok()) << salvaged.status();
    EXPECT_EQ(fence_of(salvaged->get(), "forgotten"), -1);
    EXPECT_EQ(fence_of(salvaged->get(), "middle"), -1);
    EXPECT_EQ(fence_of(salvaged->get(), "after"), static_cast<int64_t>(epoch1 + 3));
    EXPECT_EQ(fence_of(salvaged->get(), "last"), static_cast<int64_t>(epoch1 + 4));
  }

  for (size_t cut : {last + 3, last + 8, last + 20, bytes.size() - 1}) {
    SCOPED_TRACE("cut at " + std::to_string(cut));
    std::string db;
    store_with_log(bytes.substr(0, cut), &db);
    auto s = TryOpen(db);
    ASSERT_TRUE(s.ok()) << "a torn tail refused the open: " << s.status();
    EXPECT_EQ(fence_of(s->get(), "forgotten"), -1);
    EXPECT_EQ(fence_of(s->get(), "middle"), static_cast<int64_t>(epoch1 + 2));
    EXPECT_EQ(fence_of(s->get(), "after"), static_cast<int64_t>(epoch1 + 3));
    EXPECT_EQ(fence_of(s->get(), "last"), -1);
  }
}

void AppendU32(std::string* out, uint32_t n) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>(n >> (8 * i)));
}

// A claim-log entry as the writer lays it out (claim_log.h), of any type.
std::string LogEntry(uint8_t type, std::string_view key, std::string_view value) {
  std::string e(1, static_cast<char>(type));
  AppendU32(&e, static_cast<uint32_t>(key.size()));
  e += key;
  AppendU32(&e, static_cast<uint32_t>(value.size()));
  e += value;
  return e;
}

// A frame holding `entries`, its length and CRC right: it checks.
std::string CheckingFrame(std::string_view entries) {
  std::string f;
  AppendU32(&f, static_cast<uint32_t>(entries.size()));
  AppendU32(&f, internal::Crc32c(entries));
  f += entries;
  return f;
}

// Entries that no build of dedup writes, in a frame whose CRC matches (so not
// damage the CRC would catch), were skipped silently, even as the log's last
// frame: an entry of an unknown type (a newer format: its forgets and claims
// ignored), a forget entry whose fence is not 8 bytes, a claim whose record
// does not decode. An unknown type refuses the open with FailedPrecondition, as
// an unknown format version does, salvage or not; the others are damage:
// DataLoss naming the log, and salvage skips them.
TEST_F(RocksDBHardeningTest, AClaimLogEntryOfAnUnknownTypeOrBrokenFormatIsRefusedNotSkipped) {
  const uint64_t epoch1 = uint64_t{1} << 32;
  internal::ClaimLogFrame f;
  f.AddClaim("a", LoggedClaim(clock_, epoch1 + 1));
  const std::string first(f.Finish());
  int stores = 0;
  const auto store_with_log = [&](const std::string& second) {
    const std::string db = dir_ + "/db" + std::to_string(stores++);
    EXPECT_TRUE(TryOpen(db).ok());
    std::ofstream(db + "/" + internal::ClaimLogName(1), std::ios::binary) << first + second;
    return db;
  };
  const auto expect_refused = [&](const std::string& db, StatusCode code, const std::string& says,
                                  WalRecovery rec) {
    auto s = TryOpen(db, rec);
    if (s.ok()) {
      auto a = (*s)->Inspect("a");
      ADD_FAILURE() << "opened, the entry skipped; key a is "
                    << (a.ok() && a->has_value() ? "present" : "absent");
      return;
    }
    EXPECT_EQ(s.status().code(), code) << s.status();
    EXPECT_NE(s.status().message().find(internal::ClaimLogName(1)), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find(says), std::string::npos) << s.status();
  };

  {
    SCOPED_TRACE("unknown type");
    const std::string db = store_with_log(
        CheckingFrame(LogEntry(7, "a", "x") + LogEntry(internal::kForgetEntry, "a", "12345678")));
    expect_refused(db, StatusCode::kFailedPrecondition,
                   "holds an entry of unknown type 7 at byte " + std::to_string(first.size() + 8) +
                       " (written by a newer dedup?)",
                   WalRecovery::kStrict);
    expect_refused(db, StatusCode::kFailedPrecondition, "unknown type 7", WalRecovery::kSalvage);
    auto ro = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, /*create=*/false);
    EXPECT_EQ(ro.status().code(), StatusCode::kFailedPrecondition) << ro.status();
  }
  {
    SCOPED_TRACE("forget of 4 bytes");
    const std::string db =
        store_with_log(CheckingFrame(LogEntry(internal::kForgetEntry, "a", "1234")));
    expect_refused(db, StatusCode::kDataLoss,
                   "has a frame at byte " + std::to_string(first.size()) +
                       " whose checksum matches but which holds a forget entry of 4 bytes",
                   WalRecovery::kStrict);
    auto s = TryOpen(db, WalRecovery::kSalvage);
    ASSERT_TRUE(s.ok()) << s.status();
    auto a = (*s)->Inspect("a");
    ASSERT_TRUE(a.ok() && a->has_value()) << "salvage dropped the frame before the broken one";
    EXPECT_EQ((**a).fence, epoch1 + 1);
  }
  {
    SCOPED_TRACE("claim that does not decode");
    const std::string db = store_with_log(
        CheckingFrame(LogEntry(internal::kClaimEntry, "b", "not a record")));
    expect_refused(db, StatusCode::kDataLoss,
                   "has a claim of key 'b' whose record cannot be decoded", WalRecovery::kStrict);
    auto s = TryOpen(db, WalRecovery::kSalvage);
    ASSERT_TRUE(s.ok()) << s.status();
    EXPECT_TRUE((*s)->Inspect("a")->has_value());
    EXPECT_FALSE((*s)->Inspect("b")->has_value());
  }
}

// dedup inspect --prefix beside a running worker: the claims still held (in
// the claim log, not yet in the database) are listed, as Inspect shows them.
// (Before the claim log, the writer's group commit put them in the WAL, which
// a read-only open replays; a held claim is what an operator looks for.)
TEST_F(RocksDBHardeningTest, ReadOnlyScanListsTheClaimsOnlyTheClaimLogHolds) {
  const std::string db = dir_ + "/db";
  auto w = TryOpen(db);
  ASSERT_TRUE(w.ok());
  auto done = (*w)->Claim(Req("job/1"));
  ASSERT_TRUE(done.ok() && done->acquired());
  ASSERT_EQ(*(*w)->Complete("job/1", done->token, 10min, CompletionStatus::kOk, ""),
            WriteResult::kOk);
  std::vector<uint64_t> fences;
  for (const char* key : {"job/0", "job/2", "other"}) {
    auto held = (*w)->Claim(Req(key));
    ASSERT_TRUE(held.ok() && held->acquired());
    fences.push_back(held->fence);
  }
  ASSERT_TRUE(WaitLogged(db, {"job/0", "job/2", "other"}));
  auto ro = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, false);
  ASSERT_TRUE(ro.ok()) << ro.status();
  const auto keys = [](const StatusOr<ScanResult>& r) {
    std::vector<std::string> k;
    if (r.ok()) {
      for (const Record& x : r->records) k.push_back(x.key + (x.state == RecordState::kInProgress ? "*" : ""));
    }
    return k;
  };
  auto all = (*ro)->Scan("job/", 10);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(keys(all), (std::vector<std::string>{"job/0*", "job/1", "job/2*"}));
  if (all.ok() && all->size() == 3) EXPECT_EQ(all->records[2].fence, fences[1]);
  EXPECT_EQ(keys((*ro)->Scan("job/", 2)), (std::vector<std::string>{"job/0*", "job/1"}));
  EXPECT_EQ(keys((*ro)->Scan("", 10)), (std::vector<std::string>{"job/0*", "job/1", "job/2*", "other*"}));
}

// A file system that runs `hook` once, when the open first reads a MANIFEST:
// inside DB::Open after it holds the directory's lock (and inside
// DB::OpenForReadOnly), the moment another process's close could just have
// finished beside the open.
class HookAtManifestFs : public rocksdb::FileSystemWrapper {
 public:
  explicit HookAtManifestFs(std::function<void()> hook)
      : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()), hook_(std::move(hook)) {}
  const char* Name() const override { return "HookAtManifestFs"; }
  rocksdb::IOStatus NewSequentialFile(const std::string& f, const rocksdb::FileOptions& o,
                                      std::unique_ptr<rocksdb::FSSequentialFile>* r,
                                      rocksdb::IODebugContext* dbg) override {
    if (hook_ && f.find("MANIFEST") != std::string::npos) std::exchange(hook_, nullptr)();
    return target()->NewSequentialFile(f, o, r, dbg);
  }

 private:
  std::function<void()> hook_;
};

// A store opened by a relative path keeps its directory when the process
// changes its working directory: the claim log's path was resolved again on
// every append, so after a chdir every append failed (no such directory), the
// claims were never logged, and a crash lost them all; nothing said so.
TEST_F(RocksDBHardeningTest, ARelativePathNamesTheSameDirectoryAfterAChdir) {
  fs::create_directories(dir_ + "/a");
  fs::create_directories(dir_ + "/b");
  const fs::path before = fs::current_path();
  struct Back {
    fs::path to;
    ~Back() { fs::current_path(to); }
  } back{before};
  fs::current_path(dir_ + "/a");
  auto s = TryOpen("store");
  ASSERT_TRUE(s.ok()) << s.status();
  fs::current_path(dir_ + "/b");
  auto held = (*s)->Claim(Req("held"));
  ASSERT_TRUE(held.ok() && held->acquired());
  EXPECT_TRUE(WaitLogged(dir_ + "/a/store", {"held"}));
  EXPECT_FALSE(fs::exists(dir_ + "/b/store"));
  EXPECT_EQ((*s)->Describe(), "rocksdb:store") << "messages name the path as given";
  s->reset();
  auto again = TryOpen(dir_ + "/a/store");
  ASSERT_TRUE(again.ok()) << again.status();
  auto h = (*again)->Inspect("held");
  ASSERT_TRUE(h.ok() && h->has_value());
  EXPECT_EQ((**h).fence, held->fence);
}

// A symlink whose target is missing: "cannot create the directory: File exists"
// before; now the message says what the path is, and nothing is created.
TEST_F(RocksDBHardeningTest, ASymlinkToAMissingDirectoryIsNamed) {
  const std::string link = dir_ + "/dangling";
  fs::create_symlink(dir_ + "/nowhere/deeper", link);
  auto s = TryOpen(link);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("is a symbolic link to " + dir_ + "/nowhere/deeper, which "
                                      "does not exist"),
            std::string::npos)
      << s.status();
  EXPECT_FALSE(fs::exists(dir_ + "/nowhere"));
}

// A writer's clean close deletes its claim logs once their claims are in the
// database. A new writer that listed the logs before it held the directory's
// lock may find one gone when it folds them: that is no error (the claims are
// in the database), and the open succeeds.
TEST_F(RocksDBHardeningTest, AClaimLogDeletedBeforeTheOpenHoldsTheLockIsNoError) {
  const std::string db = dir_ + "/db";
  const std::string log = StoreAndAClaimLog(db, (uint64_t{1} << 32) + 1);
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(
      std::make_shared<HookAtManifestFs>([&] { fs::remove(log); }));
  auto s = TryOpen(db, WalRecovery::kStrict, /*read_only=*/false, /*create=*/true, env.get());
  ASSERT_TRUE(s.ok()) << "the log deleted beside the open failed it: " << s.status();
  auto c = (*s)->Claim(Req("other"));
  ASSERT_TRUE(c.ok() && c->acquired());
  EXPECT_GT(c->fence, uint64_t{2} << 32);
}

// dedup inspect beside a writer: a claim log that the writer deletes while the
// read-only open reads the database (its claims written there after the state
// the open sees) must not take its claims out of what the reader shows.
TEST_F(RocksDBHardeningTest, AReadOnlyOpenShowsTheClaimsOfALogDeletedDuringItsOpen) {
  const std::string db = dir_ + "/db";
  const uint64_t fence = (uint64_t{1} << 32) + 1;
  const std::string log = StoreAndAClaimLog(db, fence);
  std::unique_ptr<rocksdb::Env> env = rocksdb::NewCompositeEnv(
      std::make_shared<HookAtManifestFs>([&] { fs::remove(log); }));
  auto s = TryOpen(db, WalRecovery::kStrict, /*read_only=*/true, /*create=*/false, env.get());
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(fs::exists(log)) << "the hook did not run";
  auto r = (*s)->Inspect("held");
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_value()) << "the claim of a log deleted during the read-only open is not shown";
  EXPECT_EQ((**r).fence, fence);
  EXPECT_EQ((**r).state, RecordState::kInProgress);
}

// A file system whose write-ahead log appends answer "no space" while `full`.
class FullWalFs : public rocksdb::FileSystemWrapper {
 public:
  explicit FullWalFs(std::atomic<bool>* full)
      : rocksdb::FileSystemWrapper(rocksdb::FileSystem::Default()), full_(full) {}
  const char* Name() const override { return "FullWalFs"; }
  rocksdb::IOStatus NewWritableFile(const std::string& f, const rocksdb::FileOptions& o,
                                    std::unique_ptr<rocksdb::FSWritableFile>* r,
                                    rocksdb::IODebugContext* dbg) override {
    rocksdb::IOStatus s = target()->NewWritableFile(f, o, r, dbg);
    if (s.ok() && f.ends_with(".log")) *r = std::make_unique<Wal>(std::move(*r), full_);
    return s;
  }

 private:
  class Wal : public rocksdb::FSWritableFileOwnerWrapper {
   public:
    Wal(std::unique_ptr<rocksdb::FSWritableFile> f, std::atomic<bool>* full)
        : rocksdb::FSWritableFileOwnerWrapper(std::move(f)), full_(full) {}
    rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                             rocksdb::IODebugContext* dbg) override {
      if (full_->load()) return rocksdb::IOStatus::NoSpace("full on purpose");
      return target()->Append(d, o, dbg);
    }
    rocksdb::IOStatus Append(const rocksdb::Slice& d, const rocksdb::IOOptions& o,
                             const rocksdb::DataVerificationInfo& v,
                             rocksdb::IODebugContext* dbg) override {
      if (full_->load()) return rocksdb::IOStatus::NoSpace("full on purpose");
      return target()->Append(d, o, v, dbg);
    }

   private:
    std::atomic<bool>* full_;
  };
  std::atomic<bool>* full_;
};

// A Forget whose forget entry reached the claim log but whose deletion from
// the database then failed (a full disk) has still happened for the next open:
// the fold drops the logged claim it follows. Its error must not say that
// nothing happened; it says that the forget may take effect at the next open.
TEST_F(RocksDBHardeningTest, AForgetLoggedButNotAppliedSaysSo) {
  const std::string db = dir_ + "/db";
  std::atomic<bool> full{false};
  std::unique_ptr<rocksdb::Env> env =
      rocksdb::NewCompositeEnv(std::make_shared<FullWalFs>(&full));
  uint64_t fence = 0;
  {
    auto s = TryOpen(db, WalRecovery::kStrict, /*read_only=*/false, /*create=*/true, env.get());
    ASSERT_TRUE(s.ok()) << s.status();
    ClaimRequest r = Req("gone");
    r.lease = 1s;
    auto c = (*s)->Claim(r);
    ASSERT_TRUE(c.ok() && c->acquired());
    fence = c->fence;
    ASSERT_TRUE(WaitLogged(db, {"gone"}));
    clock_.Advance(2s);  // the lease is over: Forget removes it without force
    full.store(true);
    auto f = (*s)->Forget("gone");
    ASSERT_FALSE(f.ok()) << "the deletion did not fail: nothing was tested";
    EXPECT_EQ(f.status().code(), StatusCode::kResourceExhausted) << f.status();
    EXPECT_EQ(f.status().message().find("did not happen"), std::string::npos)
        << "the error promises that nothing happened: " << f.status();
    EXPECT_NE(f.status().message().find("next open"), std::string::npos) << f.status();
  }
  full.store(false);
  auto s = TryOpen(db);
  ASSERT_TRUE(s.ok()) << s.status();
  auto r = (*s)->Inspect("gone");
  ASSERT_TRUE(r.ok()) << r.status();
  // What the error now says can happen, did (the forget entry was folded in).
  EXPECT_FALSE(r->has_value()) << "fence " << fence;
}

TEST_F(RocksDBHardeningTest, InfoLogStaysInTheDirectory) {
  const std::string db = dir_ + "/db";
  Fill(db, 1);
  EXPECT_TRUE(fs::exists(db + "/LOG"));
  EXPECT_GT(fs::file_size(db + "/LOG"), 0u);
}

// A forget of a key whose claim the writer is appending to the claim log waits
// for that frame (the claim sits in the logged map, marked in flight, before
// its frame is written): its forget entry comes after the claim in the log, or
// the fold at the next open would bring the forgotten claim back. Each key is
// claimed among a batch of other claims (so that frames are long), then
// forgotten after its lease ended, at a random moment of the writer's rounds.
TEST_F(RocksDBHardeningTest, AForgetEntryFollowsTheClaimItForgetsInTheClaimLog) {
  const std::string db = dir_ + "/db";
  auto s = TryOpen(db);
  ASSERT_TRUE(s.ok()) << s.status();
  std::mt19937 rng(20261201);
  std::set<std::string> forgotten;
  int fill = 0;
  for (int i = 0; i < 1500; ++i) {
    std::vector<std::string> keys;
    for (int j = 0; j < 30; ++j) keys.push_back("fill/" + std::to_string(fill++));
    const std::string key = "gone/" + std::to_string(i);
    keys.push_back(key);
    std::vector<ClaimRequest> reqs;
    for (const std::string& k : keys) {
      reqs.push_back(Req(k));
      reqs.back().lease = 1s;
    }
    auto c = (*s)->ClaimBatch(reqs);
    ASSERT_TRUE(c.ok()) << c.status();
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 3000));
    clock_.Advance(2s);  // every lease so far has ended
    auto f = (*s)->Forget(key);
    ASSERT_TRUE(f.ok()) << f.status();
    if (*f) forgotten.insert(key);
  }
  ASSERT_EQ(forgotten.size(), 1500u);
  // Read while the store is open (a close folds the logs into the database).
  std::vector<uint64_t> logs;
  ASSERT_TRUE(internal::ListClaimLogs(db, &logs).ok());
  std::map<std::string, std::pair<uint8_t, uint64_t>> last;  // key -> last entry: type, fence
  for (uint64_t n : logs) {
    const auto note = [&](uint8_t type, std::string_view k, std::string_view v) {
      if (!k.starts_with("gone/")) return;
      uint64_t fence = 0;
      Record r;
      std::string why;
      if (type == internal::kClaimEntry && internal::DecodeRecord(v, &r, &why)) fence = r.fence;
      last[std::string(k)] = {type, fence};
    };
    ASSERT_TRUE(internal::ReadClaimLog(db + "/" + internal::ClaimLogName(n), note).ok());
  }
  int claims_logged = 0, back = 0;
  for (const auto& [key, e] : last) {
    if (e.first == internal::kClaimEntry) {
      ++back;
      ADD_FAILURE() << key << ": a claim entry after its forget entry (or with none)";
    } else {
      ++claims_logged;
    }
  }
  std::fprintf(stderr, "%zu logs; %d forgotten keys had their claim logged first\n", logs.size(),
               claims_logged);
  EXPECT_EQ(back, 0);
}

// Runs `fn` in a child process; true when it returned true and did not die.
template <typename Fn>
bool InChild(Fn fn, std::string* how) {
  const pid_t pid = fork();
  if (pid == 0) _exit(fn() ? 0 : 1);
  int st = 0;
  waitpid(pid, &st, 0);
  if (WIFSIGNALED(st)) {
    *how = "killed by signal " + std::to_string(WTERMSIG(st));
    return false;
  }
  *how = "exit " + std::to_string(WEXITSTATUS(st));
  return WEXITSTATUS(st) == 0;
}

// A 2 MiB tmpfs (needs root or CAP_SYS_ADMIN; skipped otherwise).
class FullDiskTest : public RocksDBHardeningTest {
 protected:
  void SetUp() override {
    RocksDBHardeningTest::SetUp();
    mnt_ = dir_ + "/small";
    fs::create_directories(mnt_);
    if (mount("tmpfs", mnt_.c_str(), "tmpfs", 0, "size=2m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs (" << std::strerror(errno) << "): needs root";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) umount2(mnt_.c_str(), MNT_DETACH);
    RocksDBHardeningTest::TearDown();
  }
  void FillDisk(size_t leave) {
    std::ofstream f(mnt_ + "/ballast", std::ios::binary);
    std::string chunk(4096, 'x');
    for (size_t i = 0; i < (2u << 20) / chunk.size(); ++i) f.write(chunk.data(), chunk.size());
    f.close();
    // Give back `leave` bytes.
    fs::resize_file(mnt_ + "/ballast", fs::file_size(mnt_ + "/ballast") - leave);
  }
  std::string mnt_;
  bool mounted_ = false;
};

TEST_F(FullDiskTest, OpenOnAFullDiskIsAnErrorNotAnAbort) {
  FillDisk(0);
  std::string how;
  const bool ok = InChild(
      [&] {
        auto s = TryOpen(mnt_ + "/db");
        if (s.ok()) return false;
        std::fprintf(stderr, "open: %s\n", s.status().ToString().c_str());
        return s.status().code() == StatusCode::kResourceExhausted ||
               s.status().code() == StatusCode::kUnavailable;
      },
      &how);
  EXPECT_TRUE(ok) << how;
}

TEST_F(FullDiskTest, WritesOnAFullDiskFailClosed) {
  std::string how;
  const bool ok = InChild(
      [&] {
        auto s = TryOpen(mnt_ + "/db");
        if (!s.ok()) return false;
        const std::string big(900, 'k');
        for (int i = 0; i < 100000; ++i) {
          auto r = (*s)->Claim(Req(big.substr(0, 800) + std::to_string(i)));
          if (!r.ok()) {
            std::fprintf(stderr, "claim %d: %s\n", i, r.status().ToString().c_str());
            if (r.status().code() != StatusCode::kResourceExhausted) return false;
            // And it stays closed.
            auto again = (*s)->Claim(Req("another"));
            std::fprintf(stderr, "again: %s\n", again.status().ToString().c_str());
            if (again.ok()) return false;
            // A claim that failed did not happen ("this operation did not
            // happen", says the error): it holds nothing, so the key is not
            // BUSY for a lease that nobody got. A failed batch holds none of
            // its claims either (store.h). (The claims were kept in memory
            // and the error came from committing the backlog after them.)
            auto batch = (*s)->ClaimBatch(std::vector<ClaimRequest>{Req("b1"), Req("b2")});
            std::fprintf(stderr, "batch: %s\n", batch.status().ToString().c_str());
            if (batch.ok()) return false;
            for (const std::string& k :
                 {big.substr(0, 800) + std::to_string(i), std::string("another"),
                  std::string("b1"), std::string("b2")}) {
              auto held = (*s)->Inspect(k);
              if (held.ok() && held->has_value()) {
                std::fprintf(stderr, "a claim that failed holds key %s...\n", k.substr(0, 12).c_str());
                return false;
              }
            }
            return true;
          }
        }
        return false;  // 2 MiB never filled?
      },
      &how);
  EXPECT_TRUE(ok) << how;
}

// Voluntary context switches of every thread of this process so far.
long VoluntarySwitches() {
  long total = 0;
  for (const auto& t : fs::directory_iterator("/proc/self/task")) {
    std::ifstream f(t.path() / "status");
    for (std::string line; std::getline(f, line);) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0) total += std::stol(line.substr(24));
    }
  }
  return total;
}

// While the group commit's writes fail (the disk is full, RocksDB refuses every
// write), its rounds back off, doubling up to 100 ms, and write the failed batch
// again as it was encoded: over a second the writer wakes about a dozen times,
// not once a millisecond (each time encoding its whole backlog again).
TEST_F(FullDiskTest, AFailingGroupCommitBacksOff) {
  std::string how;
  const bool ok = InChild(
      [&] {
        auto s = TryOpen(mnt_ + "/db");
        if (!s.ok()) return false;
        ClaimRequest first = Req("first");
        first.max_attempts = 10;  // written before it returns
        auto claimed = (*s)->Claim(first);
        if (!claimed.ok()) return false;
        FillDisk(0);
        auto failed = (*s)->Complete("first", claimed->token, 24h, CompletionStatus::kOk,
                                     std::string(200 * 1024, 'm'));
        std::fprintf(stderr, "complete on a full disk: %s\n", failed.status().ToString().c_str());
        if (failed.ok()) return false;
        for (int i = 0; i < 100; ++i) {  // left to the group commit, which fails
          if (!(*s)->Claim(Req(Key(i))).ok()) return false;
        }
        std::this_thread::sleep_for(500ms);  // the backoff reaches its bound
        const long before = VoluntarySwitches();
        std::this_thread::sleep_for(1s);
        const long woke = VoluntarySwitches() - before;
        std::fprintf(stderr, "voluntary context switches in 1 s: %ld\n", woke);
        return woke < 200;
      },
      &how);
  EXPECT_TRUE(ok) << how;
}

// The store writes from WriteBatches it keeps per thread (a batch completion's,
// a single completion's). A write that fails (here: the disk is full) must leave
// nothing in them that a later write of the same thread, to another store, then
// writes too; nor must a batch past 1 MiB, which is dropped after its write.
// (The failing writes stay under 1 MiB: a bigger batch is dropped anyway.)
TEST_F(FullDiskTest, AFailedWriteLeavesNothingForTheThreadsNextOne) {
  std::string how;
  const bool ok = InChild(
      [&] {
        auto a = TryOpen(mnt_ + "/db");
        if (!a.ok()) return false;
        const std::string big(kMaxResultBytes, 'x');
        std::vector<ClaimRequest> reqs;
        for (const char* k : {"a0", "a1", "a2"}) {
          reqs.push_back(Req(k));
          reqs.back().max_attempts = 10;  // written before it returns
        }
        auto claimed = (*a)->ClaimBatch(reqs);
        if (!claimed.ok()) return false;
        FillDisk(0);
        const std::string mid(200 * 1024, 'm');
        std::vector<CompleteRequest> done(3);
        for (size_t i = 0; i < 3; ++i) {
          done[i].key = reqs[i].key;
          done[i].token = (*claimed)[i].token;
          done[i].result = mid;
        }
        auto failed = (*a)->CompleteBatch(done);
        std::fprintf(stderr, "batch on a full disk: %s\n", failed.status().ToString().c_str());
        if (failed.ok()) return false;
        auto failed_one = (*a)->Complete("a0", (*claimed)[0].token, 24h, CompletionStatus::kOk, mid);
        if (failed_one.ok()) return false;

        // Another store, the same thread: only its own records are written.
        auto b = TryOpen(dir_ + "/b");
        if (!b.ok()) return false;
        auto complete_all = [&](const std::vector<std::string>& keys, const std::string& result,
                                bool batch) {
          std::vector<ClaimRequest> rs;
          for (const std::string& k : keys) rs.push_back(Req(k));
          auto c = (*b)->ClaimBatch(rs);
          if (!c.ok()) return false;
          if (!batch) {
            for (size_t i = 0; i < keys.size(); ++i) {
              auto w = (*b)->Complete(keys[i], (*c)[i].token, 24h, CompletionStatus::kOk, result);
              if (!w.ok() || *w != WriteResult::kOk) return false;
            }
            return true;
          }
          std::vector<CompleteRequest> ds(keys.size());
          for (size_t i = 0; i < keys.size(); ++i) {
            ds[i].key = keys[i];
            ds[i].token = (*c)[i].token;
            ds[i].result = result;
          }
          auto w = (*b)->CompleteBatch(ds);
          if (!w.ok()) return false;
          for (const AckedWrite& x : *w) {
            if (x.write != WriteResult::kOk) return false;
          }
          return true;
        };
        if (!complete_all({"b0", "b1"}, "small", true)) return false;
        if (!complete_all({"b2"}, "small", false)) return false;
        if (!complete_all({"b3", "b4"}, big, true)) return false;  // past 1 MiB
        if (!complete_all({"b5"}, "small", true)) return false;
        if (!complete_all({"b6"}, big, false)) return false;
        if (!complete_all({"b7"}, "small", false)) return false;
        auto scan = (*b)->Scan("", 100);
        if (!scan.ok()) return false;
        std::vector<std::string> keys;
        for (const Record& r : scan->records) {
          keys.push_back(r.key);
          const bool large = r.key == "b3" || r.key == "b4" || r.key == "b6";
          if (r.state != RecordState::kCompleted || r.result != (large ? big : "small")) {
            std::fprintf(stderr, "record %s is not the completion written\n", r.key.c_str());
            return false;
          }
        }
        std::sort(keys.begin(), keys.end());
        const std::vector<std::string> want = {"b0", "b1", "b2", "b3", "b4", "b5", "b6", "b7"};
        if (keys != want) {
          std::string got;
          for (const std::string& k : keys) got += k + " ";
          std::fprintf(stderr, "the second store holds: %s\n", got.c_str());
          return false;
        }
        return true;
      },
      &how);
  EXPECT_TRUE(ok) << how;
}

// The writer moves each claim into its logged map as it encodes the claim log's
// frame, before the frame is written; an append that fails (the disk is full)
// moves them back to pending, where a claim made meanwhile over one of them (a
// takeover) is the newer and stays. Once the disk has room again, every claim's
// last record reaches the claim log and survives a crash: none is lost, and no
// older record comes back over a takeover made while the appends failed.
TEST_F(FullDiskTest, ClaimsOfFailedLogAppendsAreLoggedOnceTheDiskHasRoom) {
  const std::string db = mnt_ + "/db";
  const std::string ledger = dir_ + "/ledger";
  std::string how;
  const bool ok = InChild(
      [&] {
        auto s = TryOpen(db);
        if (!s.ok()) return false;
        FillDisk(0);
        std::map<std::string, uint64_t> last;  // key -> fence of its last claim
        const auto claim = [&](const std::string& key, Millis lease) {
          ClaimRequest r = Req(key);
          r.lease = lease;
          auto c = (*s)->Claim(r);
          if (!c.ok() || c->outcome != ClaimOutcome::kAcquired) {
            std::fprintf(stderr, "claim %s: %s\n", key.c_str(),
                         c.ok() ? "not acquired" : c.status().ToString().c_str());
            return false;
          }
          last[key] = c->fence;
          return true;
        };
        // Many, so that each failing round's frame takes a while to encode.
        for (int i = 0; i < 6000; ++i) {
          if (!claim("held/" + std::to_string(i), 1h)) return false;
        }
        // Taken over again and again (each lease ends) at random moments of
        // the failing rounds (every 100 ms once they back off).
        std::mt19937 rng(20261201);
        const auto deadline = std::chrono::steady_clock::now() + 3s;
        while (std::chrono::steady_clock::now() < deadline) {
          clock_.Advance(2s);
          for (int i = 0; i < 50; ++i) {
            if (!claim("taken/" + std::to_string(i), 1s)) return false;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 250'000));
        }
        std::map<std::string, uint64_t> fences;
        if (!LoggedFences(db, &fences) || !fences.empty()) {
          std::fprintf(stderr, "the appends did not fail: %zu keys logged\n", fences.size());
          return false;
        }
        for (const auto& [key, fence] : last) {
          auto r = (*s)->Inspect(key);
          if (!r.ok() || !r->has_value() || (*r)->fence != fence) {
            std::fprintf(stderr, "%s: not its last claim while the appends fail\n", key.c_str());
            return false;
          }
        }
        fs::remove(mnt_ + "/ballast");
        bool all = false;
        for (int i = 0; i < 2000 && !all; ++i) {
          std::this_thread::sleep_for(5ms);
          if (!LoggedFences(db, &fences)) return false;
          all = fences.size() == last.size();
          for (auto f = fences.begin(); all && f != fences.end(); ++f) {
            all = last[f->first] == f->second;
          }
        }
        if (!all) {
          for (const auto& [key, fence] : last) {
            if (fences[key] != fence) {
              std::fprintf(stderr, "%s: claim log has fence %llu, its last claim %llu\n",
                           key.c_str(), static_cast<unsigned long long>(fences[key]),
                           static_cast<unsigned long long>(fence));
            }
          }
          return false;
        }
        std::ofstream out(ledger);
        for (const auto& [key, fence] : last) out << key << ' ' << fence << '\n';
        out.close();
        std::fflush(stderr);
        _exit(0);  // a crash: no close, the claims are in the claim log only
      },
      &how);
  ASSERT_TRUE(ok) << how;
  auto s = TryOpen(db);
  ASSERT_TRUE(s.ok()) << s.status();
  std::ifstream in(ledger);
  int checked = 0;
  for (std::string key; in >> key;) {
    uint64_t fence = 0;
    in >> fence;
    auto r = (*s)->Inspect(key);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->has_value()) << key << ": its claim is gone after the crash";
    EXPECT_EQ((*r)->fence, fence) << key;
    EXPECT_EQ((*r)->state, RecordState::kInProgress) << key;
    ++checked;
  }
  EXPECT_EQ(checked, 6050);
}

// A disk that stays all but full, where room comes back a page at a time (a
// file deleted, a compaction): an append that fails part-way gives its file up
// (the next frame starts a new one), and a file that holds nothing but that part
// is deleted with it, so the page comes back. When each part stayed in a file of
// its own, every page freed went to one more such file and the claims were never
// logged: after 30 pages (the frame needs about 12), 30 logs of a part each.
TEST_F(FullDiskTest, RoomThatComesBackWhileAppendsFailIsNotKeptByTheirParts) {
  const std::string db = mnt_ + "/db";
  std::string how;
  const bool ok = InChild(
      [&] {
        auto s = TryOpen(db);
        if (!s.ok()) return false;
        FillDisk(0);
        std::set<std::string> keys;
        for (int i = 0; i < 600; ++i) {
          const std::string key = "held/" + std::to_string(i);
          if (!(*s)->Claim(Req(key)).ok()) return false;
          keys.insert(key);
        }
        const auto logged = [&](size_t* logs) {
          std::set<std::string> seen;
          std::vector<uint64_t> numbers;
          if (!internal::ListClaimLogs(db, &numbers).ok()) return false;
          *logs = numbers.size();
          for (uint64_t n : numbers) {
            (void)internal::ReadClaimLog(db + "/" + internal::ClaimLogName(n),
                                         [&](uint8_t type, std::string_view k, std::string_view) {
                                           if (type == internal::kClaimEntry) seen.emplace(k);
                                         });
          }
          return seen == keys;
        };
        size_t logs = 0;
        std::this_thread::sleep_for(300ms);
        if (logged(&logs)) {
          std::fprintf(stderr, "the disk was not full\n");
          return false;
        }
        bool all = false;
        int pages = 0;
        for (; pages < 30 && !all; ++pages) {
          fs::resize_file(mnt_ + "/ballast", fs::file_size(mnt_ + "/ballast") - 4096);
          std::this_thread::sleep_for(250ms);  // the writer's rounds back off to 100 ms
          all = logged(&logs);
        }
        std::fprintf(stderr, "%d pages freed: claims %s, %zu claim logs\n", pages,
                     all ? "logged" : "not logged", logs);
        return all && logs <= 2;
      },
      &how);
  EXPECT_TRUE(ok) << how;
}

}  // namespace
}  // namespace dedup
