// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// What the RocksDB store promises beyond the conformance suite: records survive a
// reopen, one process at a time, unknown formats and corrupt records are refused
// and left alone, expired records are physically dropped by compaction, and
// CompleteWithBatch commits the application's writes with the completion.

#include "dedup/rocksdb_store.h"

#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <random>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rocksdb/db.h"
#include "rocksdb/write_batch.h"
#include "store_envs.h"
#include "stores/rocksdb/claim_log.h"
#include "stores/rocksdb/record_codec.h"

extern char** environ;

namespace dedup {
namespace {

using namespace std::chrono_literals;

class RocksDBStoreTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("rocksdb-store"); }
  void TearDown() override { testing::RemoveDir(dir_); }

  std::unique_ptr<RocksDBStore> Open(SyncMode sync = SyncMode::kNone) {
    RocksDBStoreOptions o;
    o.path = dir_;
    o.clock = &clock_;
    o.sync = sync;
    o.sync_interval = 10ms;
    auto s = RocksDBStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  static ClaimRequest Req(std::string_view key, Millis lease = 10min, Millis retention = 24h) {
    ClaimRequest r;
    r.key = key;
    r.lease = lease;
    r.retention = retention;
    return r;
  }

  // The raw value of `key`'s record, or nullopt when RocksDB has none at all
  // (expired-but-not-compacted records are still "there").
  static std::optional<std::string> Raw(RocksDBStore* s, std::string_view key) {
    std::string rkey, v;
    internal::EncodeRecordKey(key, &rkey);
    rocksdb::Status st = s->db()->Get(rocksdb::ReadOptions(), s->records_family(), rkey, &v);
    if (st.IsNotFound()) return std::nullopt;
    EXPECT_TRUE(st.ok()) << st.ToString();
    return v;
  }

  // Writes straight into the records family, bypassing the store (to plant damage).
  static void PutRaw(RocksDBStore* s, std::string_view rkey, std::string_view value) {
    rocksdb::WriteOptions wo;
    ASSERT_TRUE(s->db()->Put(wo, s->records_family(), rkey, value).ok());
  }

  std::string dir_;
  SimulatedClock clock_;
};

TEST_F(RocksDBStoreTest, ReopenKeepsRecords) {
  Token in_progress;
  uint64_t given_up_fence = 0;
  {
    auto s = Open();
    auto a = s->Claim(Req("done"));
    ASSERT_TRUE(a.ok() && a->acquired());
    ASSERT_EQ(*s->Complete("done", a->token, 24h, CompletionStatus::kOk, "result-bytes"),
              WriteResult::kOk);
    auto b = s->Claim(Req("working"));
    ASSERT_TRUE(b.ok() && b->acquired());
    in_progress = b->token;
    auto c = s->Claim(Req("given-up"));
    given_up_fence = c->fence;
    ASSERT_EQ(*s->Release("given-up", c->token, 24h), WriteResult::kOk);
  }
  auto s = Open();
  auto d = s->Claim(Req("done"));
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d->result, "result-bytes");
  auto w = s->Claim(Req("working"));
  EXPECT_EQ(w->outcome, ClaimOutcome::kBusy);
  EXPECT_EQ(*s->Extend("working", in_progress, 1min), WriteResult::kOk);
  auto g = s->Claim(Req("given-up"));
  EXPECT_EQ(g->outcome, ClaimOutcome::kAcquired);
  // Fences of a later process start above every fence of an earlier one.
  EXPECT_GT(g->fence, given_up_fence);
  EXPECT_EQ(g->attempt, 2u);
}

// A fence past what the next open starts above (2^32 fences handed out in one
// stripe of one process; here a takeover of a record planted that high) first
// makes a higher epoch durable: a later process's fences start above it, also
// on keys it never saw. The next open took epoch + 1 and started below it.
TEST_F(RocksDBStoreTest, FencesPastTheEpochStayBelowTheNextOpensFences) {
  const uint64_t high = (uint64_t{7} << 32) + 5;
  uint64_t taken = 0;
  {
    // Planted, then read at the next open as any record is.
    auto s = Open();
    Record r;
    r.state = RecordState::kInProgress;
    r.token = Token{0x1234};
    r.fence = high;
    r.attempt = 1;
    r.lease_deadline = clock_.NowMillis() - 1;  // lease over: claimable
    r.retention_deadline = clock_.NowMillis() + 86'400'000;
    std::string rkey, v;
    internal::EncodeRecordKey("hot", &rkey);
    internal::EncodeRecord(r, &v);
    PutRaw(s.get(), rkey, v);
  }
  {
    auto s = Open();
    auto c = s->Claim(Req("hot"));
    ASSERT_TRUE(c.ok() && c->acquired()) << c.status();
    taken = c->fence;
    EXPECT_EQ(taken, high + 1);
    // The stripe goes on above it.
    auto again = s->Claim(Req("hot"));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->outcome, ClaimOutcome::kBusy);
  }
  auto s = Open();
  auto fresh = s->Claim(Req("never-seen"));
  ASSERT_TRUE(fresh.ok() && fresh->acquired()) << fresh.status();
  EXPECT_GT(fresh->fence, taken);
  auto batch = s->ClaimBatch(std::vector<ClaimRequest>{Req("b1"), Req("b2")});
  ASSERT_TRUE(batch.ok()) << batch.status();
  for (const ClaimResult& r : *batch) EXPECT_GT(r.fence, taken);
}

// A record whose fence or attempt is the largest its type holds (only a corrupt
// or hand-written one): a takeover wrapped it to 0, and the fence floor then
// handed out a fence below the key's last. Refused, DataLoss naming it, and
// nothing changed, single or in a batch.
TEST_F(RocksDBStoreTest, AFenceOrAttemptAtItsLargestIsRefusedNothingChanged) {
  struct Case {
    const char* key;
    uint64_t fence;
    uint32_t attempt;
    const char* says;
  };
  const Case cases[] = {{"top-fence", ~uint64_t{0}, 2, "fence 18446744073709551615"},
                        {"top-attempt", 9, ~uint32_t{0}, "attempt 4294967295"}};
  {
    auto s = Open();
    for (const Case& c : cases) {
      Record r;
      r.state = RecordState::kReleased;
      r.token = Token{0x99};
      r.fence = c.fence;
      r.attempt = c.attempt;
      r.lease_deadline = clock_.NowMillis() - 1;
      r.retention_deadline = clock_.NowMillis() + 86'400'000;
      std::string rkey, v;
      internal::EncodeRecordKey(c.key, &rkey);
      internal::EncodeRecord(r, &v);
      PutRaw(s.get(), rkey, v);
    }
  }
  auto s = Open();
  for (const Case& c : cases) {
    const std::optional<std::string> before = Raw(s.get(), c.key);
    auto one = s->Claim(Req(c.key));
    EXPECT_EQ(one.status().code(), StatusCode::kDataLoss) << c.key;
    EXPECT_NE(one.status().message().find(c.says), std::string::npos) << one.status();
    auto batch = s->ClaimBatch(std::vector<ClaimRequest>{Req("beside"), Req(c.key)});
    EXPECT_EQ(batch.status().code(), StatusCode::kDataLoss) << c.key;
    EXPECT_EQ(Raw(s.get(), c.key), before) << c.key << ": the refused claim changed the record";
    auto rec = s->Inspect(c.key);
    ASSERT_TRUE(rec.ok() && rec->has_value());
    EXPECT_EQ((*rec)->fence, c.fence);
    EXPECT_EQ((*rec)->attempt, c.attempt);
  }
  // The batch that failed holds nothing.
  auto beside = s->Claim(Req("beside"));
  ASSERT_TRUE(beside.ok());
  EXPECT_TRUE(beside->acquired());
}

// The expiry filter drops nothing that expired after the oldest claim log was
// made, and a log lived until 65,536 outstanding claims or 32 MiB: weeks in a
// quiet process, with every expired record kept on disk meanwhile (100 of 100
// after a week, RocksDB's own flush and compaction run). A log older than an
// hour is now written into the database and deleted.
TEST_F(RocksDBStoreTest, AnHourOldClaimLogIsFoldedAndExpiredRecordsAreDropped) {
  auto s = Open();
  for (int i = 0; i < 100; ++i) {
    const std::string key = "old-" + std::to_string(i);
    auto c = s->Claim(Req(key));
    ASSERT_TRUE(c.ok() && c->acquired()) << c.status();
    std::this_thread::sleep_for(3ms);  // outlives a round: logged
    ASSERT_EQ(*s->Complete(key, c->token, 1s, CompletionStatus::kOk, "x"), WriteResult::kOk);
  }
  std::vector<uint64_t> logs;
  ASSERT_TRUE(internal::ListClaimLogs(dir_, &logs).ok());
  ASSERT_FALSE(logs.empty()) << "no claim was logged: the test tests nothing";
  const uint64_t oldest = logs.front();
  clock_.Advance(2h);
  // The next log round sees the age (in a store with no claims at all, the
  // materializer looks every 10 minutes of wall time).
  auto tick = s->Claim(Req("tick"));
  ASSERT_TRUE(tick.ok() && tick->acquired()) << tick.status();
  bool gone = false;
  for (auto until = std::chrono::steady_clock::now() + 20s;
       !gone && std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(10ms)) {
    logs.clear();
    ASSERT_TRUE(internal::ListClaimLogs(dir_, &logs).ok());
    gone = logs.empty() || logs.front() > oldest;
  }
  ASSERT_TRUE(gone) << "CLAIMLOG " << oldest << " still there two hours on";
  // What RocksDB's own flushes and compactions do (CompactNow would fold the
  // logs itself and hide it).
  ASSERT_TRUE(s->db()->Flush(rocksdb::FlushOptions(), s->records_family()).ok());
  rocksdb::CompactRangeOptions co;
  co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
  ASSERT_TRUE(s->db()->CompactRange(co, s->records_family(), nullptr, nullptr).ok());
  int left = 0;
  for (int i = 0; i < 100; ++i) left += Raw(s.get(), "old-" + std::to_string(i)).has_value();
  EXPECT_EQ(left, 0) << "expired records kept on disk";
  auto again = s->Claim(Req("tick"));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->outcome, ClaimOutcome::kBusy) << "the claim made after the fold is kept";
}

TEST_F(RocksDBStoreTest, SecondOpenInSameProcessIsRefused) {
  auto s = Open();
  RocksDBStoreOptions o;
  o.path = dir_;
  auto again = RocksDBStore::Open(o);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition) << again.status();
  EXPECT_NE(again.status().message().find("rocksdb store at " + dir_ + " is already open"),
            std::string::npos)
      << again.status();
  // The first store is unharmed.
  EXPECT_TRUE(s->Claim(Req("k")).ok());
}

// RocksDB refuses a second opener by its LOCK file, but within one process it
// compares the file's name only: 'dir/', 'dir/.', 'dir//', a symlink to dir and
// the absolute path after a relative one each opened a second store on the
// directory, and a key claimed through the first was ACQUIRED through the
// second too. Each spelling is refused while the store is open, and opens once
// it is closed.
TEST_F(RocksDBStoreTest, SecondOpenInSameProcessIsRefusedHoweverThePathIsSpelled) {
  namespace fs = std::filesystem;
  const std::string link = dir_ + "-link";
  fs::remove(link);
  fs::create_directory_symlink(dir_, link);
  const std::string relative = fs::relative(dir_, fs::current_path()).string();
  const std::vector<std::string> spellings = {dir_ + "/", dir_ + "/.", dir_ + "//", link,
                                              relative, "./" + relative};
  auto s = Open();
  ASSERT_NE(s, nullptr);
  auto first = s->Claim(Req("shared"));
  ASSERT_TRUE(first.ok() && first->acquired());
  for (const std::string& p : spellings) {
    RocksDBStoreOptions o;
    o.path = p;
    o.clock = &clock_;
    auto again = RocksDBStore::Open(o);
    if (again.ok()) {
      auto c = (*again)->Claim(Req("shared"));
      ADD_FAILURE() << "a second store opened on the directory as '" << p << "'; its claim of "
                    << "the key held by the first: "
                    << (c.ok() ? std::string(ClaimOutcomeName(c->outcome)) : c.status().ToString());
      continue;
    }
    EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition) << p << ": " << again.status();
    EXPECT_NE(again.status().message().find("rocksdb store at " + p +
                                            " is already open in this process (opened as " +
                                            dir_ + ")"),
              std::string::npos)
        << again.status();
  }
  // The first store is unharmed.
  EXPECT_EQ(s->Claim(Req("shared"))->outcome, ClaimOutcome::kBusy);
  s.reset();
  // Closed: any spelling opens it (one at a time), and a relative one first
  // refuses the absolute path in its turn.
  for (const std::string& p : spellings) {
    RocksDBStoreOptions o;
    o.path = p;
    o.clock = &clock_;
    auto again = RocksDBStore::Open(o);
    ASSERT_TRUE(again.ok()) << p << ": " << again.status();
    EXPECT_EQ((*again)->Claim(Req("shared"))->outcome, ClaimOutcome::kBusy) << p;
    if (p == relative) {
      RocksDBStoreOptions abs;
      abs.path = dir_;
      EXPECT_EQ(RocksDBStore::Open(abs).status().code(), StatusCode::kFailedPrecondition);
    }
  }
  fs::remove(link);
}

// Runs `rocksdb_crash_child open DIR` and returns the line it printed.
std::string OpenInAnotherProcess(const std::string& dir) {
  int fds[2];
  if (pipe(fds) != 0) return "pipe failed";
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], STDOUT_FILENO);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  posix_spawn_file_actions_addclose(&fa, fds[1]);
  std::string prog = DEDUP_CRASH_CHILD, mode = "open", d = dir;
  char* argv[] = {prog.data(), mode.data(), d.data(), nullptr};
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  std::string out;
  if (rc == 0) {
    char buf[4096];
    for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) out.append(buf, n);
    int status = 0;
    waitpid(pid, &status, 0);
  }
  close(fds[0]);
  return rc == 0 ? out : "spawn failed";
}

TEST_F(RocksDBStoreTest, SecondProcessIsRefused) {
  {
    auto s = Open();
    const std::string line = OpenInAnotherProcess(dir_);
    // Unavailable, not FailedPrecondition: the other process may close it (a
    // second `dedup exec` or a restarted worker exits 75, try again later).
    EXPECT_EQ(line.rfind("UNAVAILABLE rocksdb store at " + dir_ +
                             " is already open in another process",
                         0),
              0u)
        << line;
  }
  // Closed: the other process may open it now.
  EXPECT_EQ(OpenInAnotherProcess(dir_), "OK\n");
}

TEST_F(RocksDBStoreTest, UnknownFormatVersionIsRefused) {
  {
    auto s = Open();
    ASSERT_TRUE(s->Claim(Req("kept")).ok());
    PutRaw(s.get(), internal::kMetaFormatKey, "2");
  }
  RocksDBStoreOptions o;
  o.path = dir_;
  auto refused = RocksDBStore::Open(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.status().message().find("format version 2, this build reads only version 1"),
            std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find(dir_), std::string::npos);

  // Garbage is refused too, and the refusal is still there on the next try.
  {
    std::vector<rocksdb::ColumnFamilyHandle*> handles;
    rocksdb::DB* db = nullptr;
    std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
        {rocksdb::kDefaultColumnFamilyName, {}}, {"dedup", {}}};
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::DBOptions(), dir_, cfs, &handles, &db).ok());
    ASSERT_TRUE(db->Put({}, handles[1], internal::kMetaFormatKey, "v1?").ok());
    for (auto* h : handles) ASSERT_TRUE(db->DestroyColumnFamilyHandle(h).ok());
    delete db;
  }
  auto garbage = RocksDBStore::Open(o);
  ASSERT_FALSE(garbage.ok());
  EXPECT_EQ(garbage.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(garbage.status().message().find("unreadable format version 'v1?'"),
            std::string::npos)
      << garbage.status();
}

TEST_F(RocksDBStoreTest, RecordsWithoutFormatVersionAreRefused) {
  {
    auto s = Open();
    ASSERT_TRUE(s->Claim(Req("kept")).ok());
    ASSERT_TRUE(s->db()->Delete({}, s->records_family(), internal::kMetaFormatKey).ok());
  }
  RocksDBStoreOptions o;
  o.path = dir_;
  auto refused = RocksDBStore::Open(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kFailedPrecondition) << refused.status();
}

// Damage is planted while the store is closed, as the disk would present it:
// the store's in-memory index is built at open and only sees writes made through
// the store.
TEST_F(RocksDBStoreTest, CorruptRecordIsDataLossAndUnchanged) {
  ASSERT_TRUE(Open()->Claim(Req("fine")).ok());
  std::string rkey;
  internal::EncodeRecordKey("bad\x01key", &rkey);
  const std::vector<std::string> damages = {
      std::string(),                                // empty
      std::string("\x07rest", 5),                   // unknown format byte
      std::string("\x01short", 6),                  // truncated
  };
  std::unique_ptr<RocksDBStore> s;
  for (const std::string& damage : damages) {
    SCOPED_TRACE(internal::QuoteBytes(damage));
    s.reset();
    PutRaw(Open().get(), rkey, damage);
    s = Open();
    const std::string key = "bad\x01key";
    auto expect_loss = [&](const Status& st) {
      EXPECT_EQ(st.code(), StatusCode::kDataLoss) << st;
      EXPECT_NE(st.message().find("rocksdb " + dir_), std::string::npos) << st;
      EXPECT_NE(st.message().find("'bad\\x01key'"), std::string::npos) << st;
    };
    expect_loss(s->Claim(Req(key)).status());
    expect_loss(s->Extend(key, Token{42}, 1min).status());
    expect_loss(s->Complete(key, Token{42}, 1min, CompletionStatus::kOk, "").status());
    expect_loss(s->Release(key, Token{42}, 1min).status());
    expect_loss(s->Inspect(key).status());
    // A scan lists it as undecodable, with why, beside the records it reads.
    auto scan = s->Scan("", 10);
    ASSERT_TRUE(scan.ok()) << scan.status();
    ASSERT_EQ(scan->undecodable.size(), 1u);
    EXPECT_EQ(scan->undecodable[0].key, key);
    EXPECT_FALSE(scan->undecodable[0].why.empty());
    ASSERT_EQ(scan->records.size(), 1u);
    EXPECT_EQ(scan->records[0].key, "fine");
    // A batch with the damaged key fails whole: "new" is not claimed either.
    std::vector<ClaimRequest> batch = {Req("new"), Req(key)};
    expect_loss(s->ClaimBatch(batch).status());
    EXPECT_FALSE(Raw(s.get(), "new").has_value());
    EXPECT_EQ(Raw(s.get(), key), damage);
  }
  // An operator can forget it; then it is a new key.
  EXPECT_TRUE(*s->Forget("bad\x01key"));
  EXPECT_TRUE(s->Claim(Req("bad\x01key"))->acquired());
  EXPECT_EQ(s->Claim(Req("fine"))->outcome, ClaimOutcome::kBusy);
}

TEST_F(RocksDBStoreTest, CompactionDropsExpiredRecordsOnly) {
  auto s = Open();
  auto a = s->Claim(Req("short"));
  ASSERT_EQ(*s->Complete("short", a->token, 1min, CompletionStatus::kOk, "x"), WriteResult::kOk);
  auto b = s->Claim(Req("long"));
  ASSERT_EQ(*s->Complete("long", b->token, 24h, CompletionStatus::kOk, "y"), WriteResult::kOk);
  ASSERT_TRUE(s->Claim(Req("working", 10min, 24h)).ok());

  ASSERT_TRUE(s->CompactNow().ok());
  EXPECT_TRUE(Raw(s.get(), "short").has_value()) << "dropped before its retention ended";

  clock_.Advance(2min);
  // Expired but not yet compacted: answers as absent, still on disk.
  EXPECT_FALSE(s->Inspect("short")->has_value());
  EXPECT_TRUE(Raw(s.get(), "short").has_value());

  ASSERT_TRUE(s->CompactNow().ok());
  EXPECT_FALSE(Raw(s.get(), "short").has_value()) << "expired record still on disk";
  EXPECT_TRUE(Raw(s.get(), "long").has_value());
  EXPECT_TRUE(Raw(s.get(), "working").has_value());
  EXPECT_EQ(s->Claim(Req("long"))->outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(s->Claim(Req("working"))->outcome, ClaimOutcome::kBusy);
  // The metadata is not a record: never filtered.
  std::string v;
  EXPECT_TRUE(s->db()->Get({}, s->records_family(), internal::kMetaFormatKey, &v).ok());
  EXPECT_EQ(v, "1");
  // A new life for the key: attempt 1. Its record is gone from disk, and
  // completed records are not kept in memory, yet its fence still goes up: the
  // key's stripe remembers the last fence it handed out (a reopen starts above
  // it with a new epoch).
  auto again = s->Claim(Req("short"));
  EXPECT_TRUE(again->acquired());
  EXPECT_EQ(again->attempt, 1u);
  EXPECT_GT(again->fence, a->fence);
}

// A newer version expiring before an older one must not bring the older one back:
// IN_PROGRESS kept ~24h sits in the last level, its COMPLETED successor (kept 1
// min) expires, and only the newer file is compacted. Had the filter dropped the
// newer value without a deletion marker, the old IN_PROGRESS record would answer.
TEST_F(RocksDBStoreTest, CompactionNeverResurfacesAnOlderVersion) {
  auto s = Open();
  rocksdb::DB* db = s->db();
  rocksdb::ColumnFamilyHandle* cf = s->records_family();
  auto a = s->Claim(Req("k", 10min, 24h));
  ASSERT_TRUE(s->CompactNow().ok());  // the IN_PROGRESS version goes to the last level
  ASSERT_EQ(*s->Complete("k", a->token, 1min, CompletionStatus::kOk, "r"), WriteResult::kOk);
  clock_.Advance(2min);
  ASSERT_TRUE(db->Flush(rocksdb::FlushOptions(), cf).ok());
  EXPECT_FALSE(s->Inspect("k")->has_value());

  rocksdb::ColumnFamilyMetaData meta;
  db->GetColumnFamilyMetaData(cf, &meta);
  const int last = static_cast<int>(meta.levels.size()) - 1;
  ASSERT_FALSE(meta.levels[last].files.empty()) << "old version not in the last level";
  std::vector<std::string> upper;
  for (int level = 0; level < last; ++level) {
    for (const auto& f : meta.levels[level].files) upper.push_back(f.db_path + "/" + f.name);
  }
  if (!upper.empty()) {  // empty when the flush itself filtered the newer version out
    ASSERT_TRUE(db->CompactFiles(rocksdb::CompactionOptions(), cf, upper, last - 1).ok());
  }
  db->GetColumnFamilyMetaData(cf, &meta);
  ASSERT_FALSE(meta.levels[last].files.empty()) << "old version must still be below";
  EXPECT_FALSE(Raw(s.get(), "k").has_value()) << "older version resurfaced";
  EXPECT_FALSE(s->Inspect("k")->has_value());
  EXPECT_EQ(s->Claim(Req("k"))->outcome, ClaimOutcome::kAcquired);
}

TEST_F(RocksDBStoreTest, CompleteWithBatchCommitsTogether) {
  auto s = Open();
  rocksdb::DB* db = s->db();
  auto a = s->Claim(Req("payment-1"));
  rocksdb::WriteBatch batch;
  ASSERT_TRUE(batch.Put("balance", "90").ok());
  ASSERT_TRUE(batch.Put("ledger/1", "-10").ok());
  ASSERT_EQ(*s->CompleteWithBatch("payment-1", a->token, 24h, CompletionStatus::kOk, "ok", &batch),
            WriteResult::kOk);
  std::string v;
  ASSERT_TRUE(db->Get({}, "balance", &v).ok());
  EXPECT_EQ(v, "90");
  EXPECT_EQ(s->Claim(Req("payment-1"))->outcome, ClaimOutcome::kDuplicate);

  // LOST: a stale token writes nothing, neither the record nor the user's writes.
  auto b = s->Claim(Req("payment-2", 1min));
  clock_.Advance(2min);
  auto takeover = s->Claim(Req("payment-2"));
  ASSERT_TRUE(takeover->acquired());
  rocksdb::WriteBatch stale;
  ASSERT_TRUE(stale.Put("balance", "80").ok());
  ASSERT_EQ(*s->CompleteWithBatch("payment-2", b->token, 24h, CompletionStatus::kOk, "", &stale),
            WriteResult::kLost);
  ASSERT_TRUE(db->Get({}, "balance", &v).ok());
  EXPECT_EQ(v, "90");
  EXPECT_EQ(stale.Count(), 1u) << "the batch must be left as given";
  EXPECT_EQ((*s->Inspect("payment-2"))->state, RecordState::kInProgress);

  // Survives a reopen together.
  s.reset();
  s = Open();
  ASSERT_TRUE(s->db()->Get({}, "ledger/1", &v).ok());
  EXPECT_EQ(v, "-10");
  EXPECT_EQ(s->Claim(Req("payment-1"))->outcome, ClaimOutcome::kDuplicate);
}

// A batch that writes to the store's own column family was written as given:
// deleting another key's completed record made that key ACQUIRED again (its
// message ran twice), and a Put could plant an undecodable record or lower the
// fence epoch. Such a batch is refused before anything is written; the claim
// stays held and completes with a proper batch.
TEST_F(RocksDBStoreTest, CompleteWithBatchRefusesWritesToTheStoresOwnFamily) {
  auto s = Open();
  rocksdb::DB* db = s->db();
  rocksdb::ColumnFamilyHandle* own = s->records_family();
  auto v = s->Claim(Req("victim"));
  ASSERT_EQ(*s->Complete("victim", v->token, 24h, CompletionStatus::kOk, "done"), WriteResult::kOk);
  const std::optional<std::string> victim_before = Raw(s.get(), "victim");
  ASSERT_TRUE(victim_before.has_value());
  std::string epoch_before;
  ASSERT_TRUE(db->Get({}, own, "mfence_epoch", &epoch_before).ok());
  auto k = s->Claim(Req("k"));
  ASSERT_TRUE(k.ok() && k->acquired());
  std::string victim_key;
  internal::EncodeRecordKey("victim", &victim_key);

  std::vector<std::pair<std::string, std::function<void(rocksdb::WriteBatch&)>>> bad = {
      {"a Delete", [&](rocksdb::WriteBatch& b) { ASSERT_TRUE(b.Delete(own, victim_key).ok()); }},
      {"a Put", [&](rocksdb::WriteBatch& b) { ASSERT_TRUE(b.Put(own, "rinjected", "garbage").ok()); }},
      {"a Put", [&](rocksdb::WriteBatch& b) { ASSERT_TRUE(b.Put(own, "mfence_epoch", "0").ok()); }},
      {"a SingleDelete",
       [&](rocksdb::WriteBatch& b) { ASSERT_TRUE(b.SingleDelete(own, victim_key).ok()); }},
      {"a DeleteRange", [&](rocksdb::WriteBatch& b) { ASSERT_TRUE(b.DeleteRange(own, "r", "s").ok()); }},
  };
  for (auto& [what, add] : bad) {
    SCOPED_TRACE(what);
    rocksdb::WriteBatch batch;
    ASSERT_TRUE(batch.Put("appkey", "app-value").ok());
    add(batch);
    auto r = s->CompleteWithBatch("k", k->token, 24h, CompletionStatus::kOk, "k-done", &batch);
    ASSERT_FALSE(r.ok()) << "a batch writing to the dedup column family was written";
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find("entry 2 of the batch (" + what +
                                        ") writes to the \"dedup\" column family"),
              std::string::npos)
        << r.status();
    EXPECT_EQ(batch.Count(), 2u) << "the batch must be left as given";
    std::string app;
    EXPECT_TRUE(db->Get({}, "appkey", &app).IsNotFound()) << "the application's write landed";
    EXPECT_EQ(Raw(s.get(), "victim"), victim_before);
    EXPECT_FALSE(Raw(s.get(), "injected").has_value());
    std::string epoch;
    ASSERT_TRUE(db->Get({}, own, "mfence_epoch", &epoch).ok());
    EXPECT_EQ(epoch, epoch_before);
    auto held = s->Inspect("k");
    ASSERT_TRUE(held.ok() && held->has_value());
    EXPECT_EQ((**held).state, RecordState::kInProgress);
    EXPECT_EQ((**held).token, k->token);
  }
  EXPECT_EQ(s->Claim(Req("victim"))->outcome, ClaimOutcome::kDuplicate);
  rocksdb::WriteBatch good;
  ASSERT_TRUE(good.Put("appkey", "app-value").ok());
  ASSERT_EQ(*s->CompleteWithBatch("k", k->token, 24h, CompletionStatus::kOk, "k-done", &good),
            WriteResult::kOk);
  std::string app;
  ASSERT_TRUE(db->Get({}, "appkey", &app).ok());
  EXPECT_EQ(app, "app-value");
  EXPECT_EQ(s->Claim(Req("k"))->outcome, ClaimOutcome::kDuplicate);
}

TEST_F(RocksDBStoreTest, ClaimBatchAnswersInOrder) {
  auto s = Open();
  ASSERT_TRUE(s->Claim(Req("taken")).ok());
  std::vector<ClaimRequest> reqs = {Req("a"), Req("taken"), Req("a"), Req("b")};
  auto r = s->ClaimBatch(reqs);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->size(), 4u);
  EXPECT_EQ((*r)[0].outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ((*r)[1].outcome, ClaimOutcome::kBusy);
  EXPECT_EQ((*r)[2].outcome, ClaimOutcome::kBusy) << "a repeated key is BUSY the second time";
  EXPECT_EQ((*r)[2].fence, (*r)[0].fence);
  EXPECT_EQ((*r)[3].outcome, ClaimOutcome::kAcquired);
  EXPECT_EQ(*s->Complete("a", (*r)[0].token, 1h, CompletionStatus::kOk, ""), WriteResult::kOk);

  // One bad request: nothing written.
  std::vector<ClaimRequest> bad = {Req("c"), Req("")};
  auto e = s->ClaimBatch(bad);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(Raw(s.get(), "c").has_value());
}

// Batches and single claims over overlapping keys from many threads: no deadlock,
// exactly one ACQUIRED per key.
TEST_F(RocksDBStoreTest, ConcurrentClaimsAcquireEachKeyOnce) {
  auto s = Open();
  constexpr int kKeys = 300, kThreads = 6;
  std::atomic<int> acquired{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kKeys; i += 3) {
        std::vector<std::string> keys;
        for (int j = 0; j < 3; ++j) keys.push_back("key" + std::to_string((i + j + t * 7) % kKeys));
        if (t % 2 == 0) {
          std::vector<ClaimRequest> reqs;
          for (int j = 2; j >= 0; --j) reqs.push_back(Req(keys[j]));
          auto r = s->ClaimBatch(reqs);
          ASSERT_TRUE(r.ok()) << r.status();
          for (const auto& c : *r) acquired += c.acquired();
        } else {
          for (const auto& k : keys) {
            auto r = s->Claim(Req(k));
            ASSERT_TRUE(r.ok()) << r.status();
            acquired += r->acquired();
          }
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(acquired.load(), kKeys);
}

TEST_F(RocksDBStoreTest, ScanSkipsExpiredAndStaysInPrefix) {
  auto s = Open();
  for (const char* k : {"job/1", "job/2", "job/3", "jobs", "other"}) {
    ASSERT_TRUE(s->Claim(Req(k)).ok());
  }
  auto x = s->Claim(Req("job/x", 1min, 1min));
  clock_.Advance(3min);
  auto r = s->Scan("job/", 100);
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> keys;
  for (const Record& rec : r->records) keys.push_back(rec.key);
  EXPECT_EQ(keys, (std::vector<std::string>{"job/1", "job/2", "job/3"}));
  EXPECT_EQ(s->Scan("job/", 2)->size(), 2u);
  EXPECT_EQ(s->Scan("", 100)->size(), 5u);
}

TEST_F(RocksDBStoreTest, SyncModesOpenAndKeepRecords) {
  for (SyncMode mode : {SyncMode::kNone, SyncMode::kInterval, SyncMode::kAlways}) {
    SCOPED_TRACE(static_cast<int>(mode));
    const std::string key = "k" + std::to_string(static_cast<int>(mode));
    {
      auto s = Open(mode);
      ASSERT_NE(s, nullptr);
      auto a = s->Claim(Req(key));
      ASSERT_TRUE(a.ok() && a->acquired());
      ASSERT_EQ(*s->Complete(key, a->token, 1h, CompletionStatus::kOk, "r"), WriteResult::kOk);
      if (mode == SyncMode::kInterval) std::this_thread::sleep_for(50ms);  // a few syncs
    }
    auto s = Open(mode);
    EXPECT_EQ(s->Claim(Req(key))->outcome, ClaimOutcome::kDuplicate);
  }
}

TEST_F(RocksDBStoreTest, UriParsing) {
  auto bad = [](std::string_view uri, std::string_view words) {
    auto s = OpenStore(uri);
    ASSERT_FALSE(s.ok()) << uri;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status();
    EXPECT_NE(s.status().message().find(words), std::string::npos) << s.status();
  };
  bad("rocksdb:", "empty path");
  bad("rocksdb:?sync=always", "empty path");
  bad("rocksdb:" + dir_ + "?cache=1", "unknown parameter 'cache'");
  bad("rocksdb:" + dir_ + "?sync=sometimes", "sync='sometimes'");
  bad("rocksdb:" + dir_ + "?sync=interval:soon", "not a duration");
  bad("rocksdb:" + dir_ + "?sync=interval:0", "must be positive");
  bad("rocksdb://somehost/data", "names a host");

  for (const char* q : {"", "?sync=none", "?sync=always", "?sync=interval", "?sync=interval:250ms"}) {
    auto s = OpenStore("rocksdb:" + dir_ + q);
    ASSERT_TRUE(s.ok()) << q << ": " << s.status();
    EXPECT_EQ((*s)->Describe().rfind("rocksdb:" + dir_, 0), 0u) << (*s)->Describe();
  }
  auto s = OpenStore("rocksdb:" + dir_ + "?sync=interval:250ms");
  EXPECT_EQ((*s)->Describe(), "rocksdb:" + dir_ + "?sync=interval:250ms");
  s = {Status::Internal("closed")};
  s = OpenStore("rocksdb://" + dir_);  // empty authority: still a local path
  ASSERT_TRUE(s.ok()) << s.status();
  s = {Status::Internal("closed")};

  // A relative path is relative to the working directory.
  const std::string rel =
      std::filesystem::relative(dir_ + "/sub", std::filesystem::current_path()).string();
  auto r = OpenStore("rocksdb:" + rel);
  ASSERT_TRUE(r.ok()) << rel << ": " << r.status();
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/sub/CURRENT"));
}

TEST_F(RocksDBStoreTest, BadPathsAreClearErrors) {
  const std::string file = dir_ + "/plain-file";
  std::ofstream(file) << "x";
  RocksDBStoreOptions o;
  o.path = file;
  auto s = RocksDBStore::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("is not a directory"), std::string::npos) << s.status();

  o.path = file + "/below";
  s = RocksDBStore::Open(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find(file), std::string::npos) << s.status();

  o.path = "";
  EXPECT_EQ(RocksDBStore::Open(o).status().code(), StatusCode::kInvalidArgument);
}

// Options from outside their enums or ranges are refused by Open, naming them:
// sync mode 7 opened a store with the WAL unsynced and the claim log synced
// (Describe() said sync=unknown), recovery 9 was read as strict, and a
// sync_interval above 10 years overflowed the syncer's wait (a spinning thread).
TEST_F(RocksDBStoreTest, OptionsOutOfRangeAreRefusedByOpen) {
  RocksDBStoreOptions o;
  o.path = dir_;
  o.sync = static_cast<SyncMode>(7);
  auto s = RocksDBStore::Open(o);
  EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << s.status();
  EXPECT_NE(s.status().message().find("sync mode 7 is not one of"), std::string::npos) << s.status();
  o.sync = SyncMode::kNone;
  o.wal_recovery = static_cast<WalRecovery>(9);
  s = RocksDBStore::Open(o);
  EXPECT_NE(s.status().message().find("WAL recovery 9 is not one of"), std::string::npos) << s.status();
  o.wal_recovery = WalRecovery::kStrict;
  o.sync = SyncMode::kInterval;
  for (Millis bad : {Millis(0), Millis(-1), kMaxDuration + Millis(1), Millis::max()}) {
    o.sync_interval = bad;
    s = RocksDBStore::Open(o);
    EXPECT_NE(s.status().message().find("sync_interval must be positive and at most 10 years"),
              std::string::npos)
        << bad.count() << ": " << s.status();
  }
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/CURRENT")) << "a refused open created the store";
  o.sync_interval = kMaxDuration;
  s = RocksDBStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
}

// The application's own column families are opened and kept.
TEST_F(RocksDBStoreTest, KeepsTheApplicationsColumnFamilies) {
  {
    auto s = Open();
    rocksdb::ColumnFamilyHandle* h = nullptr;
    ASSERT_TRUE(s->db()->CreateColumnFamily({}, "app", &h).ok());
    ASSERT_TRUE(s->db()->Put({}, h, "x", "1").ok());
    ASSERT_TRUE(s->db()->DestroyColumnFamilyHandle(h).ok());
  }
  auto s = Open();
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->Claim(Req("k")).ok());
}

// A ClaimBatch that must be durable before it returns (max_attempts) takes over
// keys whose earlier, deferred claims the background writer may be carrying. It
// locks every stripe of the batch; the writer gathers its batch stripe by stripe.
// Waiting for the writer's batch with the stripes held hung both: the writer had
// marked a key of one stripe and then waited for another stripe the batch held.
// Two threads race takeovers against the writer's rounds; any hang fails the
// test (the process exits: a deadlocked thread cannot be joined).
// Enough claims that the claim log's claims are written into the database
// (past 65,536 logged) at least once while they are completed, taken over and
// completed again: a write of a key whose logged claim is being written there
// (an ingested table file lands above everything) must land after it, in memory
// and after a reopen. The claims of a takeover replace a logged claim that a
// materialization may be writing, and are completed too.
TEST_F(RocksDBStoreTest, WritesDuringAMaterializationOfTheClaimLogLandLast) {
  auto s = Open();
  constexpr int kKeys = 300'000;  // 120,000 of them held: past 65,536 logged
  std::vector<Token> tokens(kKeys);
  std::vector<uint8_t> done(kKeys, 0);  // 1: completed, 2: taken over, then completed
  std::atomic<int> claimed{0};
  std::atomic<int> failures{0};
  uint64_t highest_log = 0;  // the claimer's
  const auto key = [](int i) { return "mat" + std::to_string(i); };
  std::thread claimer([&] {
    for (int i = 0; i < kKeys; ++i) {
      auto r = s->Claim(Req(key(i), i % 5 == 4 ? 1ms : 10min));
      if (!r.ok() || !r->acquired()) {
        ++failures;
        break;
      }
      tokens[static_cast<size_t>(i)] = r->token;
      claimed.store(i + 1, std::memory_order_release);
      if (i % 4096 == 0) {
        std::vector<uint64_t> logs;
        if (internal::ListClaimLogs(dir_, &logs).ok() && !logs.empty()) {
          highest_log = std::max(highest_log, logs.back());
        }
      }
    }
  });
  // Waits until key i was claimed `lag` claims ago (or all are).
  const auto await = [&](int i, int lag) {
    while (claimed.load(std::memory_order_acquire) < std::min(kKeys, i + lag) &&
           failures.load() == 0) {
      std::this_thread::yield();
    }
  };
  const auto complete = [&](int i, Token t) {
    auto c = s->Complete(key(i), t, 24h, CompletionStatus::kOk, "r" + std::to_string(i));
    if (!c.ok() || *c != WriteResult::kOk) ++failures;
  };
  std::thread completer([&] {
    std::mt19937 rng(7);
    for (int i = 0; i < kKeys && failures.load() == 0; ++i) {
      if (i % 5 != 1 && i % 5 != 2) continue;  // held, or taken over below
      // Some time after the claim: in the log, often in a materialization.
      await(i, 1'000 + static_cast<int>(rng() % 60'000));
      done[static_cast<size_t>(i)] = 1;
      complete(i, tokens[static_cast<size_t>(i)]);
    }
  });
  // Takeovers on a thread of their own, completed a few milliseconds later on
  // another (a completion waits while a materialization writes the key's older
  // record): the takeovers go on during a materialization, the writer logs them
  // over the claims it is writing, and their completions must wait for it too.
  struct Taken {
    int i;
    Token token;
    std::chrono::steady_clock::time_point at;
  };
  std::mutex taken_mu;
  std::deque<Taken> taken;
  std::atomic<bool> taking{true};
  std::thread taker([&] {
    std::mt19937 rng(11);
    for (int i = 4; i < kKeys && failures.load() == 0; i += 5) {
      await(i, 1'000 + static_cast<int>(rng() % 60'000));
      clock_.Advance(2ms);  // its 1 ms lease is over: taken over
      auto r = s->Claim(Req(key(i), 10min));
      if (!r.ok() || !r->acquired() || r->attempt != 2) {
        ++failures;
        break;
      }
      done[static_cast<size_t>(i)] = 2;
      std::lock_guard l(taken_mu);
      taken.push_back({i, r->token, std::chrono::steady_clock::now()});
    }
    taking.store(false);
  });
  std::thread late([&] {
    while (true) {
      std::optional<Taken> t;
      {
        std::lock_guard l(taken_mu);
        if (!taken.empty() &&
            (!taking.load() || std::chrono::steady_clock::now() - taken.front().at > 3ms)) {
          t = taken.front();
          taken.pop_front();
        } else if (taken.empty() && !taking.load()) {
          return;
        }
      }
      if (t) {
        complete(t->i, t->token);
      } else {
        std::this_thread::sleep_for(100us);
      }
    }
  });
  claimer.join();
  completer.join();
  taker.join();
  late.join();
  ASSERT_EQ(failures.load(), 0);
  // A new log is started after each materialization (the first log is 1).
  EXPECT_GE(highest_log, 2u) << "no materialization: the test did not test one";
  const auto check = [&](RocksDBStore* st, const std::string& when) {
    int wrong = 0;
    for (int i = 0; i < kKeys && wrong < 5; ++i) {
      auto r = st->Inspect(key(i));
      ASSERT_TRUE(r.ok()) << r.status();
      const uint8_t d = done[static_cast<size_t>(i)];
      // Keys taken over and never completed: none (every fifth key from 4 on is).
      const bool ok = r->has_value() &&
                      (d != 0 ? (*r)->state == RecordState::kCompleted &&
                                    (*r)->result == "r" + std::to_string(i) &&
                                    (*r)->attempt == (d == 2 ? 2u : 1u)
                              : (*r)->state == RecordState::kInProgress &&
                                    (*r)->token == tokens[static_cast<size_t>(i)]);
      if (!ok) {
        ++wrong;
        ADD_FAILURE() << when << ": key " << i << " (done " << int(d) << "): "
                      << (r->has_value() ? "state " + std::to_string(int((*r)->state)) +
                                               ", attempt " + std::to_string((*r)->attempt)
                                         : std::string("no record"));
      }
    }
  };
  check(s.get(), "before the close");
  s.reset();
  s = Open();
  ASSERT_NE(s, nullptr);
  check(s.get(), "after a reopen");
}

TEST_F(RocksDBStoreTest, DurableBatchTakeoverOfKeysTheWriterCarriesDoesNotHang) {
  auto s = Open();
  std::atomic<uint64_t> progress{0};
  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, exited{0};
  auto run = [&](int t) {
    std::mt19937 rng(static_cast<unsigned>(t));
    for (int round = 0; !stop.load(); ++round) {
      std::vector<std::string> keys;
      for (int j = 0; j < 48; ++j) {
        keys.push_back("t" + std::to_string(t) + "-" + std::to_string(round) + "-" + std::to_string(j));
      }
      for (const std::string& k : keys) {
        if (!s->Claim(Req(k, 1min)).ok()) ++failures;  // deferred: the writer commits it
      }
      // Let the writer take them (it takes claims at least a round old), at a
      // random point of its round.
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2500));
      clock_.Advance(2min);  // their leases are over: the batch takes every one over
      std::vector<ClaimRequest> reqs;
      for (const std::string& k : keys) {
        reqs.push_back(Req(k, 1min));
        reqs.back().max_attempts = 100;  // written before ClaimBatch returns
      }
      auto r = s->ClaimBatch(reqs);
      if (!r.ok()) {
        ++failures;
      } else {
        for (const ClaimResult& c : *r) {
          if (c.outcome != ClaimOutcome::kAcquired || c.attempt != 2) ++failures;
        }
      }
      progress.fetch_add(1);
    }
    exited.fetch_add(1);
  };
  std::thread a(run, 1), b(run, 2);
  const auto end = std::chrono::steady_clock::now() + 3s;
  while (std::chrono::steady_clock::now() < end) std::this_thread::sleep_for(50ms);
  stop.store(true);
  // Rounds finish within milliseconds; 30 s without both threads done is a hang.
  const auto hang = std::chrono::steady_clock::now() + 30s;
  while (exited.load() < 2 && std::chrono::steady_clock::now() < hang) {
    std::this_thread::sleep_for(10ms);
  }
  if (exited.load() < 2) {
    std::fprintf(stderr, "a ClaimBatch did not return within 30 s (after %llu rounds): deadlock\n",
                 static_cast<unsigned long long>(progress.load()));
    std::_Exit(1);
  }
  a.join();
  b.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GT(progress.load(), 100u);
}

// Many threads on few keys, every batch path mixed with the single ones:
// Claim, ClaimBatch (keys repeated, deferred and durable), Extend, Inspect,
// Release, Complete, CompleteBatch (a request repeated, stale tokens), with
// sleeps that straddle the writer's rounds, so that completions race the
// writer's batches and the moment a batch is done but not yet dropped from
// the pending maps. The clock stands still (no lease ends), so the test knows
// the owner of every key at every moment and checks, while it runs and after a
// reopen, what the store promises: one owner at a time, every owner's write
// answers OK and every stale token's LOST, a repeated request answers BUSY /
// LOST the second time, a key completed answers DUPLICATE with its result to
// every later claim, its fences strictly increase and its attempts count
// 1, 2, 3 ... with none lost or given twice, and the records read back
// (before and after the reopen) are exactly what the answers said.
// With takeovers, the clock moves a minute every 4 ms and leases last two:
// claims are taken over while their owners work, an owner's write may then
// answer LOST, and what is checked is what still holds (fences, attempts, one
// completion, DUPLICATE after it, the records).
// DEDUP_ROCKSDB_STRESS_SECONDS runs it longer by hand (default 2).
class RocksDBStressTest : public RocksDBStoreTest, public ::testing::WithParamInterface<bool> {};

TEST_P(RocksDBStressTest, MixedBatchesKeepEveryInvariant) {
  const bool takeovers = GetParam();
  const Millis lease = takeovers ? Millis(2min) : Millis(10min);
  const Millis retention = takeovers ? Millis(240h) : Millis(24h);
  constexpr int kThreads = 8, kKeysPerGen = 6, kMaxGens = 4096;
  double seconds = 2;
  if (const char* e = std::getenv("DEDUP_ROCKSDB_STRESS_SECONDS")) seconds = std::atof(e);
  struct Ledger {
    std::mutex mu;
    std::vector<std::pair<uint64_t, uint32_t>> acquired;  // fence, attempt
    int completes = 0;
    uint64_t completed_fence = 0;
    std::string result;
    std::atomic<uint64_t> holder{0};  // the owner's fence, 0: none
    std::atomic<bool> completed{false};
  };
  std::vector<Ledger> ledgers(static_cast<size_t>(kMaxGens) * kKeysPerGen);
  auto key_of = [](size_t i) { return "stress-" + std::to_string(i); };
  auto s = Open();
  ASSERT_NE(s, nullptr);
  std::atomic<int> gen{0};
  std::atomic<bool> stop{false};
  std::mutex fail_mu;
  std::vector<std::string> failures;
  auto fail = [&](std::string what) {
    std::lock_guard l(fail_mu);
    if (failures.size() < 20) failures.push_back(std::move(what));
  };
  struct Held {
    size_t k;
    Token token;
    uint64_t fence;
  };
  auto run = [&](int t) {
    std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 17u);
    std::vector<Held> held;
    std::vector<std::pair<size_t, Token>> stale;  // tokens released or completed
    auto pick = [&] {
      const int g = std::max(0, gen.load() - static_cast<int>(rng() % 2));
      return static_cast<size_t>(g) * kKeysPerGen + rng() % kKeysPerGen;
    };
    auto let_go = [&](const Held& h) {  // before the write that ends the claim
      if (takeovers) return;  // no one owner to follow
      uint64_t f = h.fence;
      if (!ledgers[h.k].holder.compare_exchange_strong(f, 0)) {
        fail(key_of(h.k) + ": owner record changed under its owner");
      }
    };
    auto completed = [&](const Held& h, const std::string& result) {
      Ledger& l = ledgers[h.k];
      std::lock_guard g(l.mu);
      ++l.completes;
      l.completed_fence = h.fence;
      l.result = result;
      l.completed.store(true);
    };
    while (!stop.load()) {
      const unsigned action = rng() % 100;
      if (held.size() < 4 && (held.empty() || action < 45)) {
        // Claim 1 to 4 keys, maybe one of them twice, maybe durably.
        std::vector<size_t> ks;
        const size_t n = 1 + rng() % 4;
        for (size_t i = 0; i < n; ++i) ks.push_back(pick());
        if (n > 1 && rng() % 3 == 0) ks.push_back(ks[rng() % ks.size()]);
        std::vector<std::string> names;
        for (size_t k : ks) names.push_back(key_of(k));
        std::vector<ClaimRequest> reqs;
        const bool durable = rng() % 4 == 0;
        for (const std::string& nm : names) {
          reqs.push_back(Req(nm, lease, retention));
          if (durable) reqs.back().max_attempts = 1'000'000;
        }
        std::vector<bool> was_completed;
        for (size_t k : ks) was_completed.push_back(ledgers[k].completed.load());
        std::vector<ClaimResult> res;
        if (reqs.size() == 1 && rng() % 2 == 0) {
          auto r = s->Claim(reqs[0]);
          if (!r.ok()) {
            fail("claim: " + r.status().ToString());
            continue;
          }
          res.push_back(*r);
        } else {
          auto r = s->ClaimBatch(reqs);
          if (!r.ok()) {
            fail("claim batch: " + r.status().ToString());
            continue;
          }
          res = std::move(*r);
        }
        if (res.size() != reqs.size()) {
          fail("claim batch: wrong number of answers");
          continue;
        }
        for (size_t i = 0; i < res.size(); ++i) {
          const size_t k = ks[i];
          const ClaimResult& c = res[i];
          bool repeat = false;
          for (size_t j = 0; j < i; ++j) {
            if (ks[j] != k) continue;
            repeat = true;
            const ClaimOutcome want = res[j].outcome == ClaimOutcome::kDuplicate
                                          ? ClaimOutcome::kDuplicate
                                          : ClaimOutcome::kBusy;
            if (c.outcome != want) {
              fail(names[i] + ": repeated in a claim batch, answered " +
                   std::string(ClaimOutcomeName(c.outcome)));
            }
          }
          if (was_completed[i] && c.outcome != ClaimOutcome::kDuplicate) {
            fail(names[i] + ": completed before the claim, answered " +
                 std::string(ClaimOutcomeName(c.outcome)));
          }
          if (c.outcome == ClaimOutcome::kDuplicate && c.result != "res-" + std::to_string(c.fence)) {
            fail(names[i] + ": duplicate with result " + c.result + " at fence " +
                 std::to_string(c.fence));
          }
          if (c.outcome != ClaimOutcome::kAcquired || repeat) continue;
          uint64_t none = 0;
          if (!takeovers && !ledgers[k].holder.compare_exchange_strong(none, c.fence)) {
            fail(names[i] + ": acquired at fence " + std::to_string(c.fence) +
                 " while fence " + std::to_string(none) + " owns it");
          }
          {
            std::lock_guard g(ledgers[k].mu);
            ledgers[k].acquired.emplace_back(c.fence, c.attempt);
          }
          held.push_back({k, c.token, c.fence});
        }
        continue;
      }
      if (rng() % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 2500));
      if (held.empty()) continue;
      const size_t pick_held = rng() % held.size();
      const Held h = held[pick_held];
      const std::string name = key_of(h.k);
      if (action < 55) {
        auto r = s->Extend(name, h.token, lease);
        if (!r.ok() || (*r != WriteResult::kOk && !takeovers)) fail(name + ": owner's extend not OK");
        if (r.ok() && *r != WriteResult::kOk) {  // taken over
          held.erase(held.begin() + static_cast<ptrdiff_t>(pick_held));
          stale.emplace_back(h.k, h.token);
        }
      } else if (action < 62) {
        auto r = s->Inspect(name);
        if (!r.ok() || (!takeovers && (!r->has_value() || (*r)->state != RecordState::kInProgress ||
                                       (*r)->fence != h.fence || (*r)->token != h.token))) {
          fail(name + ": inspect does not show its owner's claim");
        }
      } else if (action < 70) {
        let_go(h);
        auto r = s->Release(name, h.token, retention);
        if (!r.ok() || (*r != WriteResult::kOk && !takeovers)) fail(name + ": owner's release not OK");
        held.erase(held.begin() + static_cast<ptrdiff_t>(pick_held));
        stale.emplace_back(h.k, h.token);
      } else if (action < 78) {
        let_go(h);
        const std::string result = "res-" + std::to_string(h.fence);
        auto r = s->Complete(name, h.token, retention, CompletionStatus::kOk, result);
        if (!r.ok() || (*r != WriteResult::kOk && !takeovers)) fail(name + ": owner's complete not OK");
        if (r.ok() && *r == WriteResult::kOk) completed(h, result);
        held.erase(held.begin() + static_cast<ptrdiff_t>(pick_held));
        stale.emplace_back(h.k, h.token);
      } else {
        // Every held claim in one batch, one of them twice, and stale tokens.
        std::vector<std::string> names, results;
        std::vector<Token> tokens;
        std::vector<int> want_ok;  // index into held, or -1: must be LOST
        for (size_t i = 0; i < held.size(); ++i) {
          names.push_back(key_of(held[i].k));
          tokens.push_back(held[i].token);
          results.push_back("res-" + std::to_string(held[i].fence));
          want_ok.push_back(static_cast<int>(i));
        }
        if (rng() % 2 == 0) {
          const size_t i = rng() % held.size();
          names.push_back(key_of(held[i].k));
          tokens.push_back(held[i].token);
          results.push_back("res-" + std::to_string(held[i].fence));
          want_ok.push_back(-1);
        }
        for (int j = 0; j < 2 && !stale.empty(); ++j) {
          const auto& [k, tok] = stale[rng() % stale.size()];
          const size_t at = rng() % (names.size() + 1);
          names.insert(names.begin() + static_cast<ptrdiff_t>(at), key_of(k));
          tokens.insert(tokens.begin() + static_cast<ptrdiff_t>(at), tok);
          results.insert(results.begin() + static_cast<ptrdiff_t>(at), "stale");
          want_ok.insert(want_ok.begin() + static_cast<ptrdiff_t>(at), -1);
        }
        std::vector<CompleteRequest> reqs(names.size());
        for (size_t i = 0; i < reqs.size(); ++i) {
          reqs[i].key = names[i];
          reqs[i].token = tokens[i];
          reqs[i].retention = retention;
          reqs[i].result = results[i];
        }
        for (const Held& x : held) let_go(x);
        auto r = s->CompleteBatch(reqs);
        if (!r.ok() || r->size() != reqs.size()) {
          fail("complete batch: " + r.status().ToString());
        } else {
          for (size_t i = 0; i < reqs.size(); ++i) {
            const WriteResult want = want_ok[i] >= 0 ? WriteResult::kOk : WriteResult::kLost;
            if ((*r)[i].write != want && !(takeovers && want == WriteResult::kOk)) {
              fail(names[i] + ": complete batch item " + std::to_string(i) + " answered " +
                   std::string(WriteResultName((*r)[i].write)));
            }
            if (want_ok[i] >= 0 && (*r)[i].write == WriteResult::kOk) {
              completed(held[static_cast<size_t>(want_ok[i])], results[i]);
            }
          }
        }
        for (const Held& x : held) stale.emplace_back(x.k, x.token);
        held.clear();
      }
      if (stale.size() > 64) stale.erase(stale.begin(), stale.begin() + 32);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(run, t);
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    std::this_thread::sleep_for(4ms);
    if (takeovers) clock_.Advance(1min);
    if (gen.load() + 2 < kMaxGens) gen.fetch_add(1);
  }
  stop.store(true);
  for (std::thread& t : threads) t.join();
  for (const std::string& f : failures) ADD_FAILURE() << f;
  ASSERT_TRUE(failures.empty());

  // What each key's answers say its record is, read now and after a reopen.
  size_t keys = 0, completions = 0, reclaims = 0;
  auto check_records = [&](const char* when) {
    for (size_t k = 0; k < ledgers.size(); ++k) {
      Ledger& l = ledgers[k];
      if (l.acquired.empty()) continue;
      const std::string name = key_of(k);
      auto r = s->Inspect(name);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_TRUE(r->has_value()) << name << " " << when;
      const Record& rec = **r;
      const uint64_t last_fence = l.acquired.back().first;
      if (l.completes == 1) {
        EXPECT_EQ(rec.state, RecordState::kCompleted) << name << " " << when;
        EXPECT_EQ(rec.fence, l.completed_fence) << name << " " << when;
        EXPECT_EQ(rec.result, l.result) << name << " " << when;
      } else if (takeovers) {
        EXPECT_NE(rec.state, RecordState::kCompleted) << name << " " << when;
        EXPECT_EQ(rec.fence, last_fence) << name << " " << when;
      } else if (l.holder.load() != 0) {
        EXPECT_EQ(rec.state, RecordState::kInProgress) << name << " " << when;
        EXPECT_EQ(rec.fence, l.holder.load()) << name << " " << when;
      } else {
        EXPECT_EQ(rec.state, RecordState::kReleased) << name << " " << when;
        EXPECT_EQ(rec.fence, last_fence) << name << " " << when;
      }
      EXPECT_EQ(rec.attempt, l.acquired.size()) << name << " " << when;
    }
  };
  for (size_t k = 0; k < ledgers.size(); ++k) {
    Ledger& l = ledgers[k];
    if (l.acquired.empty()) continue;
    ++keys;
    reclaims += l.acquired.size() - 1;
    const std::string name = key_of(k);
    std::sort(l.acquired.begin(), l.acquired.end());
    for (size_t i = 0; i < l.acquired.size(); ++i) {
      EXPECT_EQ(l.acquired[i].second, i + 1) << name << ": attempts by fence";
      if (i > 0) EXPECT_LT(l.acquired[i - 1].first, l.acquired[i].first) << name;
    }
    EXPECT_LE(l.completes, 1) << name << ": completed more than once";
    if (l.completes == 1) {
      ++completions;
      EXPECT_EQ(l.completed_fence, l.acquired.back().first) << name << ": claimed after completion";
    }
  }
  check_records("before the reopen");
  s.reset();
  s = Open();
  ASSERT_NE(s, nullptr);
  check_records("after the reopen");
  EXPECT_GT(keys, 100u);
  EXPECT_GT(completions, 50u);
  EXPECT_GT(reclaims, 20u) << "keys claimed again (after a release or a takeover)";
  std::fprintf(stderr, "%zu keys, %zu completed, %zu claimed again, %d generations\n", keys,
               completions, reclaims, gen.load());
}

INSTANTIATE_TEST_SUITE_P(Clock, RocksDBStressTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Takeovers" : "Still"; });

TEST(RecordCodecTest, RoundTripsAndRejectsDamage) {
  Record r;
  r.state = RecordState::kCompleted;
  r.token = Token{0x0123456789abcdefull};
  r.fence = 1ull << 40;
  r.attempt = 7;
  r.lease_deadline = -5;
  r.retention_deadline = 1'700'000'000'123;
  r.fingerprint = std::string(64, '\xff');
  r.status = CompletionStatus::kFailed;
  r.result = std::string("a\0b", 3);
  std::string v;
  internal::EncodeRecord(r, &v);
  Record back;
  std::string why;
  ASSERT_TRUE(internal::DecodeRecord(v, &back, &why)) << why;
  EXPECT_EQ(back, r);
  EXPECT_EQ(internal::PeekRetentionDeadline(v), r.retention_deadline);
  for (size_t n = 0; n < v.size(); ++n) {
    EXPECT_FALSE(internal::DecodeRecord(v.substr(0, n), &back, &why)) << n;
  }
  EXPECT_FALSE(internal::DecodeRecord(v + "x", &back, &why));
  std::string bad_state = v;
  bad_state[37] = 9;
  EXPECT_FALSE(internal::DecodeRecord(bad_state, &back, &why));
  EXPECT_EQ(why, "bad state 9");
}

// The claim log's reader hands on whole, undamaged frames only, and stops at the
// first one that is not: cut short (a crash in the write) or changed.
TEST(ClaimLogTest, ReadsWholeFramesAndStopsAtACutOrDamage) {
  EXPECT_EQ(internal::Crc32c("123456789"), 0xE3069283u);  // the check value of CRC-32C
  EXPECT_EQ(internal::Crc32c(std::string(1000, 'x')), internal::Crc32c(std::string(1000, 'x')));
  const std::string dir = testing::MakeTempDir("claimlog");
  const std::string path = dir + "/" + internal::ClaimLogName(7);
  EXPECT_EQ(internal::ClaimLogName(7), "CLAIMLOG-000007");
  std::string bytes;
  internal::ClaimLogFrame f;
  for (int frame = 0; frame < 3; ++frame) {
    f.Clear();
    for (int e = 0; e < 3; ++e) {
      const std::string k = "k" + std::to_string(frame) + "." + std::to_string(e);
      f.AddClaim(k, "value of " + k);
    }
    if (frame == 2) f.AddForget("k0.0", 42);
    bytes += f.Finish();
  }
  const auto read = [&](const std::string& content) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    std::vector<std::string> got;
    EXPECT_TRUE(internal::ReadClaimLog(path, [&](uint8_t type, std::string_view k, std::string_view v) {
                  got.push_back(std::to_string(type) + " " + std::string(k) + " " +
                                (type == internal::kClaimEntry ? std::string(v) : std::to_string(v.size())));
                }).ok());
    return got;
  };
  std::vector<std::string> all = read(bytes);
  ASSERT_EQ(all.size(), 10u);
  EXPECT_EQ(all[0], "1 k0.0 value of k0.0");
  EXPECT_EQ(all[9], "2 k0.0 8");
  std::vector<uint64_t> numbers;
  ASSERT_TRUE(internal::ListClaimLogs(dir, &numbers).ok());
  EXPECT_EQ(numbers, std::vector<uint64_t>{7});
  // Every cut inside the last frame: the first two frames, whole.
  const size_t two = bytes.size() - f.Finish().size();
  for (size_t n = two; n < bytes.size(); ++n) EXPECT_EQ(read(bytes.substr(0, n)).size(), 6u) << n;
  // A changed byte in the second frame: the first frame only.
  const size_t one = two / 2;
  for (size_t at = one; at < two; at += 5) {
    std::string bad = bytes;
    bad[at] ^= 0x20;
    EXPECT_EQ(read(bad).size(), 3u) << at;
  }
  testing::RemoveDir(dir);
}

// What the reader tells apart for the open (ClaimLogDamage): a frame whose
// payload or length was changed, with a whole frame after it, is reported and
// skipped (a changed length was read as a torn tail: the frames after it were
// dropped, reported as nothing); a frame cut short at the end, wherever, or
// damage in the last frame ends the log, reported as nothing.
TEST(ClaimLogTest, ReportsAndSkipsDamageBeforeTheEnd) {
  const std::string dir = testing::MakeTempDir("claimlog");
  const std::string path = dir + "/" + internal::ClaimLogName(1);
  std::string bytes;
  std::vector<size_t> starts;
  internal::ClaimLogFrame f;
  for (int frame = 0; frame < 3; ++frame) {
    f.Clear();
    f.AddClaim("k" + std::to_string(frame), "v" + std::to_string(frame));
    starts.push_back(bytes.size());
    bytes += f.Finish();
  }
  const auto read = [&](const std::string& content, int64_t* at) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
    std::string keys;
    internal::ClaimLogDamage damage;
    EXPECT_TRUE(internal::ReadClaimLog(path, [&](uint8_t, std::string_view k, std::string_view) {
                  keys += std::string(k) + " ";
                }, &damage).ok());
    *at = damage.at;
    return keys;
  };
  int64_t at = 0;
  EXPECT_EQ(read(bytes, &at), "k0 k1 k2 ");
  EXPECT_EQ(at, -1);
  std::string bad = bytes;
  bad[starts[1] + 10] ^= 0x01;  // the second frame's payload
  EXPECT_EQ(read(bad, &at), "k0 k2 ");
  EXPECT_EQ(at, static_cast<int64_t>(starts[1]));
  bad = bytes;
  bad[starts[1]] ^= 0x01;  // its length, smaller: the next frame is not where it says
  EXPECT_EQ(read(bad, &at), "k0 k2 ");
  EXPECT_EQ(at, static_cast<int64_t>(starts[1]));
  bad = bytes;
  bad[starts[1] + 3] ^= 0x40;  // its length, larger: it seems to run past the end
  EXPECT_EQ(read(bad, &at), "k0 k2 ");
  EXPECT_EQ(at, static_cast<int64_t>(starts[1]));
  bad = bytes;
  bad[starts[1] + 4] ^= 0x01;  // its CRC
  EXPECT_EQ(read(bad, &at), "k0 k2 ");
  EXPECT_EQ(at, static_cast<int64_t>(starts[1]));
  bad = bytes;
  bad[bytes.size() - 1] ^= 0x01;  // the last frame
  EXPECT_EQ(read(bad, &at), "k0 k1 ");
  EXPECT_EQ(at, -1);
  bad = bytes;
  bad[starts[2] + 3] ^= 0x40;  // the last frame's length
  EXPECT_EQ(read(bad, &at), "k0 k1 ");
  EXPECT_EQ(at, -1);
  for (size_t n = starts[2]; n < bytes.size(); ++n) {  // cut short, anywhere in the last frame
    EXPECT_EQ(read(bytes.substr(0, n), &at), "k0 k1 ") << n;
    EXPECT_EQ(at, -1) << n;
  }
  // Zeros after the frames (a file extended but never written): no frame, no damage.
  EXPECT_EQ(read(bytes + std::string(64, '\0'), &at), "k0 k1 k2 ");
  EXPECT_EQ(at, -1);
  // Without a ClaimLogDamage the reader stops at the first damaged frame.
  bad = bytes;
  bad[starts[1] + 10] ^= 0x01;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
  int entries = 0;
  EXPECT_TRUE(internal::ReadClaimLog(path, [&](uint8_t, std::string_view, std::string_view) {
                ++entries;
              }).ok());
  EXPECT_EQ(entries, 1);
  testing::RemoveDir(dir);
}

}  // namespace
}  // namespace dedup
