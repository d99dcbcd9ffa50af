// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The RocksDB store. Every operation is read-decide-write under one of kStripes
// mutexes picked by key hash: find the record, ask core/state_machine what to do,
// Put the new record (or nothing). Writes go through the WAL, except deferred
// claims: the claim log holds those (below).
//
// Finding the record usually costs no RocksDB read. Each stripe keeps, under its
// mutex, (a) 32-bit fingerprints of every key with a record on disk, loaded at
// open and added to on every write: a claim of a key whose fingerprint is absent
// (a message seen for the first time, the common case) knows the key is ABSENT;
// and (b) write-through copies of the records this process wrote last, so that
// the complete / extend / release that follow a claim, and the claims of
// redeliveries, find the record in memory. Everything else is a Get.
//
// Claims are written by group commit, off the caller's path (SyncMode kNone and
// kInterval): a claim puts its record in its stripe's `pending` map and returns;
// a background writer collects, about once a millisecond, the pending records
// at least one such interval old (a claim completed sooner is never written)
// and appends them as one frame to the claim log (claim_log.h), not to RocksDB:
// a claim completed while logged never costs a memtable insert. Logged claims
// stay in memory (`logged`) until a write of their key supersedes them; past
// kMaxLogged of them or kMaxLogBytes of log a materializer thread writes them
// into the database and deletes the logs (the writer goes on logging
// meanwhile; MaterializeLogged), as do close, CompactNow and Scan. An open folds the
// logs an earlier process left into the database (a record there with a fence
// as high is newer: fences only grow) before it serves. An IN_PROGRESS record
// has to outlive this process for two things only, and both hold without a
// write per claim:
//   * fences keep increasing across a restart: every open makes a new fence
//     epoch durable before it serves, and every fence handed out in this
//     process is at least (epoch << 32) + 1, above any fence of an earlier
//     process, written or not;
//   * attempts are counted across crashes where they decide something: a claim
//     with max_attempts (what stops a poison message that kills its worker) is
//     written before it returns, as is every claim with SyncMode::kAlways.
// A claim without max_attempts that a crash catches before the writer logged it
// (made in the last millisecond or so; while appends fail, on a full disk, every
// one made since they began) is forgotten: the key is claimable again with a
// higher fence, the same attempt number. Complete, extend, release and forget
// are written before they return; an older record of the same key that a writer
// batch or a materialization is carrying is waited for first, so the newer
// record always lands last.

#include "dedup/rocksdb_store.h"

#include <fcntl.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <charconv>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "core/key_hash.h"
#include "core/state_machine.h"
#include "core/uri.h"
#include "rocksdb/cache.h"
#include "rocksdb/compaction_filter.h"
#include "rocksdb/convenience.h"
#include "rocksdb/db.h"
#include "rocksdb/env.h"
#include "rocksdb/filter_policy.h"
#include "rocksdb/listener.h"
#include "rocksdb/options.h"
#include "rocksdb/sst_file_writer.h"
#include "rocksdb/table.h"
#include "rocksdb/write_batch.h"
#include "stores/open_backends.h"
#include "stores/rocksdb/claim_log.h"
#include "stores/rocksdb/record_codec.h"

namespace dedup {
namespace {

using internal::DecideClaim;
using internal::DecideComplete;
using internal::DecideExtend;
using internal::DecideForget;
using internal::DecideRelease;
using internal::ForgetAction;
using internal::IsFenceFloor;
using internal::LeasedForgetError;
using internal::DecodeRecord;
using internal::EncodeRecord;
using internal::AppendRecordKey;
using internal::EncodeRecordKey;
using internal::QuoteBytes;

// Enough stripes that unrelated keys rarely share a lock; a power of two.
constexpr size_t kStripes = 1024;
// Records remembered per stripe (65,536 in all, direct-mapped by key hash);
// results larger than kMaxCachedResult are never remembered.
constexpr size_t kRecentPerStripe = 64;
constexpr size_t kMaxCachedResult = 1024;
// How often the background writer commits pending claims.
constexpr std::chrono::milliseconds kGroupCommitInterval{1};
// The longest wait between the group commit's tries while its writes fail.
constexpr std::chrono::milliseconds kMaxCommitBackoff{100};
// Claims pending above this many, a claiming thread commits them itself: the
// writer's backlog (and memory) stays bounded when claims outrun it.
constexpr int64_t kMaxPending = 65'536;
// A reused WriteBatch whose buffer grew past this is dropped after its write:
// a rare huge batch does not keep its memory for the life of the store.
constexpr size_t kMaxKeptBatchBytes = 1 << 20;
// Claims logged and not yet completed, above this many, or a claim log past
// kMaxLogBytes: the writer writes them into the database and deletes the logs
// that held them (memory and the logs' size stay bounded). It does so without
// holding up the log's rounds (MaterializeLogged), so claims go on being logged
// meanwhile; past kMaxLoggedHard (the writer's writing has fallen behind the
// claims), a claiming thread waits for it and writes them itself.
constexpr int64_t kMaxLogged = 65'536;
constexpr int64_t kMaxLoggedHard = 3 * kMaxLogged;
constexpr uint64_t kMaxLogBytes = 32u << 20;
// A commit of that many claims or more (a full log, a backlog, a close) writes
// them as a table file of their own (IngestSorted), of fewer through the memtable.
constexpr size_t kMinIngest = 4096;
// log_floor_ while no claim log exists: the expiry filter drops what expired.
constexpr int64_t kNoLogFloor = std::numeric_limits<int64_t>::max();
// The expiry filter drops nothing that expired after the oldest claim log was
// made (log_floor_), and under ordinary traffic (claims completed soon after)
// a log reaches neither kMaxLogged nor kMaxLogBytes for weeks: expired records
// stayed on disk all that time. A log older than this (the store's clock) is
// written into the database and deleted as the bounds do (MaterializeLogged),
// checked after each log round and, while no claims come, every
// kLogAgeCheckEvery of wall time by the materializer.
constexpr int64_t kMaxLogAgeMs = 3'600'000;  // 1 h
constexpr std::chrono::minutes kLogAgeCheckEvery{10};
// The fence epoch, made durable at every open (decimal text).
constexpr std::string_view kMetaFenceEpochKey = "mfence_epoch";

using internal::KeyEq;
using internal::KeyHash;

// Where a key lives in the index: its stripe, and its fingerprint within it;
// `hash` is the key's hash, computed once per operation and handed to the
// stripe's tables (HashedKey) instead of hashing the key again in each.
struct KeySlot {
  size_t stripe;
  uint32_t fingerprint;
  uint64_t hash;
};

KeySlot SlotOf(std::string_view key) {
  const uint64_t h = KeyHash{}(key);
  return {static_cast<size_t>(((h * 0x9E3779B97F4A7C15ull) >> 32) & (kStripes - 1)),
          static_cast<uint32_t>(h), h};
}

// A key with its hash already computed (KeyHash's), for lookups in the
// stripes' tables.
struct HashedKey {
  std::string_view key;
  uint64_t hash;
};

struct StripeHash {
  using is_transparent = void;
  size_t operator()(std::string_view k) const { return KeyHash{}(k); }
  size_t operator()(const HashedKey& k) const { return k.hash; }
};

struct StripeEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
  bool operator()(const HashedKey& a, std::string_view b) const { return a.key == b; }
  bool operator()(std::string_view a, const HashedKey& b) const { return a == b.key; }
};

// A batch's distinct keys in first-seen order, each hashed once: where each
// lives, its record key ('r' + key), and which requests name it. (Batches hashed
// every key three times, once per table they used, and allocated a string per
// record key and a node per key for finding repeats.)
struct BatchKeys {
  // Up to this many requests, repeated keys are found by comparing hashes.
  static constexpr size_t kLinear = 32;

  std::vector<size_t> of_request;      // request i names key of_request[i]
  std::vector<std::string_view> keys;  // the requests' own bytes
  std::vector<KeySlot> slots;
  std::vector<size_t> stripes;  // the keys' stripes, ascending, each once
  std::string rkeys;            // every record key, back to back
  std::vector<size_t> rkey_at;  // where key k's record key starts in rkeys

  template <typename Req>
  explicit BatchKeys(std::span<const Req> reqs) {
    const size_t r = reqs.size();
    of_request.resize(r);
    keys.reserve(r);
    slots.reserve(r);
    rkey_at.reserve(r);
    stripes.reserve(r);
    absl::flat_hash_map<std::string_view, size_t, StripeHash, StripeEq> index;
    for (size_t i = 0; i < r; ++i) {
      const std::string_view key = reqs[i].key;
      const KeySlot s = SlotOf(key);
      size_t k = keys.size();
      if (r <= kLinear) {
        for (size_t j = 0; j < keys.size(); ++j) {
          if (slots[j].hash == s.hash && keys[j] == key) {
            k = j;
            break;
          }
        }
      } else {
        k = index.lazy_emplace(HashedKey{key, s.hash},
                               [&](const auto& make) { make(key, keys.size()); })
                ->second;
      }
      of_request[i] = k;
      if (k < keys.size()) continue;
      keys.push_back(key);
      slots.push_back(s);
      rkey_at.push_back(rkeys.size());
      AppendRecordKey(key, &rkeys);
      stripes.push_back(s.stripe);
    }
    std::sort(stripes.begin(), stripes.end());
    stripes.erase(std::unique(stripes.begin(), stripes.end()), stripes.end());
  }

  size_t size() const { return keys.size(); }
  std::string_view RecordKey(size_t k) const {
    return std::string_view(rkeys).substr(rkey_at[k], 1 + keys[k].size());
  }
  HashedKey Hashed(size_t k) const { return HashedKey{keys[k], slots[k].hash}; }
};

// A stripe's write-through copies: kRecentPerStripe entries, each key in the
// one entry its hash picks, a newer key replacing an older one there. A lookup
// compares one key; a replacement reuses the entry's buffers. (It was an
// absl map evicting begin(): its lookups and erases were a tenth of a
// claim+complete's time in perf.) Allocated at the stripe's first write; a
// one-byte tag per entry, kept in the stripe, answers most misses (the claim of
// a new key) without reading the entries, which are rarely in the cache.
class RecentCopies {
 public:
  struct Entry {
    std::string first;  // the key; empty when the entry is unused
    Record second;
  };

  Entry* find(std::string_view key) { return find(HashedKey{key, KeyHash{}(key)}); }
  Entry* find(const HashedKey& k) {
    const size_t i = Index(k.hash);
    if (tags_[i] != Tag(k.hash)) return nullptr;
    Entry& e = entries_[i];
    return e.first == k.key ? &e : nullptr;
  }
  Entry* end() const { return nullptr; }
  void erase(Entry* e) {
    tags_[static_cast<size_t>(e - entries_.get())] = 0;
    e->first.clear();
    e->second.result.clear();
    e->second.fingerprint.clear();
  }
  // The entry `k` goes in; its key is set by the caller.
  Entry& Place(const HashedKey& k) {
    if (entries_ == nullptr) entries_ = std::make_unique<Entry[]>(kRecentPerStripe);
    const size_t i = Index(k.hash);
    tags_[i] = Tag(k.hash);
    return entries_[i];
  }

 private:
  static size_t Index(uint64_t h) { return (h >> 40) & (kRecentPerStripe - 1); }
  static uint8_t Tag(uint64_t h) { return static_cast<uint8_t>((h >> 56) | 1); }  // never 0
  uint8_t tags_[kRecentPerStripe] = {};  // 0: the entry is unused
  std::unique_ptr<Entry[]> entries_;
};
static_assert((kRecentPerStripe & (kRecentPerStripe - 1)) == 0, "a power of two");
static_assert(kStripes % 64 == 0, "whole words of the writer's dirty_mask_");

std::string_view SyncModeName(SyncMode m) {
  switch (m) {
    case SyncMode::kNone: return "none";
    case SyncMode::kInterval: return "interval";
    case SyncMode::kAlways: return "always";
  }
  return "unknown";
}

// How a full-disk message ends: the write that hit it did not happen. A forget
// whose entry already reached the claim log drops it (ForgetLoggedNotApplied).
constexpr std::string_view kDidNotHappen = "; this operation did not happen)";

// A RocksDB status as ours, prefixed with `context` ("rocksdb PATH: op").
Status FromRocks(const rocksdb::Status& s, const std::string& context) {
  std::string m = context + ": " + s.ToString();
  if (s.IsNoSpace()) {
    // Fails closed: the write that hit it did not happen, and RocksDB refuses
    // every later write until the store is reopened with space to spare.
    return Status::ResourceExhausted(std::move(m) +
                                     " (the disk is full: free space and reopen the store" +
                                     std::string(kDidNotHappen));
  }
  if (s.IsCorruption()) return Status::DataLoss(std::move(m));
  if (s.IsInvalidArgument()) return Status::InvalidArgument(std::move(m));
  if (s.IsNotSupported()) return Status::FailedPrecondition(std::move(m));
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain() || s.IsIOError() || s.IsAborted() ||
      s.IsIncomplete() || s.IsShutdownInProgress()) {
    return Status::Unavailable(std::move(m));
  }
  return Status::Internal(std::move(m));
}

// Drops records whose retention has ended.
//
// Why kRemove and nothing cleverer: RocksDB turns a kRemove into a deletion marker
// at the record's sequence number, so any older version of the key lower in the
// tree stays shadowed. That matters here, because an older version can outlive a
// newer one (an IN_PROGRESS record kept lease + 1 day, then completed with a
// retention of 1 minute): dropping only the newer value would resurface the old
// IN_PROGRESS record. kRemoveAndSkipUntil is documented to expose older versions in
// exactly this way, and kPurge (SingleDelete) is undefined for keys Put more than
// once, so neither is used. Values that do not look like a record are kept: the
// store reports them as DataLoss instead of deleting evidence.
class ExpiryFilter final : public rocksdb::CompactionFilter {
 public:
  // `now` is read once per compaction: a record expiring during it is kept for the
  // next one, never dropped early.
  explicit ExpiryFilter(int64_t now) : now_(now) {}

  Decision FilterV2(int /*level*/, const rocksdb::Slice& key, ValueType type,
                    const rocksdb::Slice& value, std::string* /*new_value*/,
                    std::string* /*skip_until*/) const override {
    if (type != ValueType::kValue || key.empty() || key[0] != internal::kRecordKeyPrefix) {
      return Decision::kKeep;
    }
    const auto deadline = internal::PeekRetentionDeadline(value.ToStringView());
    return deadline.has_value() && *deadline <= now_ ? Decision::kRemove : Decision::kKeep;
  }
  const char* Name() const override { return "dedup.ExpiryFilter"; }

 private:
  const int64_t now_;
};

// Makes an ExpiryFilter per flush and compaction. While a claim log exists, records that expired after the oldest one was
// started are kept (`floor`, the store's clock then; lowest when logs of an
// earlier process wait to be folded in): such a record may be the completion
// that supersedes a claim in that log, and the fold at open tells the two apart
// only while the record is there (docs/DESIGN.md). They go at a compaction
// after the logs are deleted.
class ExpiryFilterFactory final : public rocksdb::CompactionFilterFactory {
 public:
  ExpiryFilterFactory(Clock* clock, const std::atomic<int64_t>* floor)
      : clock_(clock), floor_(floor) {}
  std::unique_ptr<rocksdb::CompactionFilter> CreateCompactionFilter(
      const rocksdb::CompactionFilter::Context& /*context*/) override {
    return std::make_unique<ExpiryFilter>(std::min(clock_->NowMillis(), floor_->load()));
  }
  // Flushes too: a record that expired while in the memtable never reaches disk.
  bool ShouldFilterTableFileCreation(rocksdb::TableFileCreationReason reason) const override {
    return reason == rocksdb::TableFileCreationReason::kCompaction ||
           reason == rocksdb::TableFileCreationReason::kFlush;
  }
  const char* Name() const override { return "dedup.ExpiryFilterFactory"; }

 private:
  Clock* const clock_;
  const std::atomic<int64_t>* const floor_;
};

// RocksDB's info log, written by us instead of by RocksDB's own logger, which
// aborts the process when a write to PATH/LOG fails (a full disk made every
// command die with SIGABRT inside DB::Open). This one stops writing at the
// first error and never fails: the log is for operators, nothing depends on it.
// Without a file (read-only opens) it drops everything.
class InfoLog final : public rocksdb::Logger {
 public:
  // Appends to `file` (PATH/LOG), first moving a LOG past 4 MiB to LOG.old.
  static std::shared_ptr<InfoLog> ForDirectory(const std::string& dir) {
    const std::string file = dir + "/LOG";
    std::error_code ec;
    const auto size = std::filesystem::file_size(file, ec);
    if (!ec && size > (4u << 20)) std::filesystem::rename(file, dir + "/LOG.old", ec);
    return std::make_shared<InfoLog>(std::fopen(file.c_str(), "ae"));
  }
  static std::shared_ptr<InfoLog> Discard() { return std::make_shared<InfoLog>(nullptr); }

  explicit InfoLog(FILE* f) : rocksdb::Logger(rocksdb::InfoLogLevel::INFO_LEVEL), f_(f) {}
  ~InfoLog() override {
    if (f_ != nullptr) std::fclose(f_);
  }

  using rocksdb::Logger::Logv;
  void Logv(const char* format, va_list ap) override {
    std::lock_guard l(mu_);
    if (f_ == nullptr) return;
    if (std::vfprintf(f_, format, ap) < 0 || std::fputc('\n', f_) == EOF ||
        std::fflush(f_) != 0) {
      std::fclose(f_);  // full disk or I/O error: stop logging, keep running
      f_ = nullptr;
    }
  }

 private:
  rocksdb::Status CloseImpl() override { return rocksdb::Status::OK(); }

  std::mutex mu_;
  FILE* f_;  // guarded by mu_
};

// Notes that RocksDB stopped writing after an I/O error (a full disk), and keeps
// it stopped: no automatic resume, so writes fail closed until a reopen. Once
// stopped, the WAL must not be synced again (librocksdb then aborts on an
// assertion in its log writer).
class WriteErrorListener final : public rocksdb::EventListener {
 public:
  void OnBackgroundError(rocksdb::BackgroundErrorReason /*reason*/,
                         rocksdb::Status* bg_error) override {
    if (bg_error != nullptr && !bg_error->ok()) failed_.store(true);
  }
  void OnErrorRecoveryBegin(rocksdb::BackgroundErrorReason /*reason*/,
                            rocksdb::Status /*bg_error*/, bool* auto_recovery) override {
    failed_.store(true);
    if (auto_recovery != nullptr) *auto_recovery = false;
  }
  bool failed() const { return failed_.load(); }

 private:
  std::atomic<bool> failed_{false};
};

// Walks a caller's WriteBatch (CompleteWithBatch) for the first entry in the
// column family `id`, the store's own: one such write goes past the store's
// per-key locks and its index, and can delete another key's completed record
// (claimed again: its message runs twice) or rewrite metadata (the fence epoch,
// lowered: fences repeat after the next open).
class FamilyWriteFinder final : public rocksdb::WriteBatch::Handler {
 public:
  explicit FamilyWriteFinder(uint32_t id) : id_(id) {}

  // Which entry (from 1) and what it does; null when none writes there.
  const char* found() const { return found_; }
  size_t entry() const { return entry_; }

  rocksdb::Status PutCF(uint32_t cf, const rocksdb::Slice&, const rocksdb::Slice&) override {
    return Note(cf, "a Put");
  }
  rocksdb::Status PutEntityCF(uint32_t cf, const rocksdb::Slice&, const rocksdb::Slice&) override {
    return Note(cf, "a PutEntity");
  }
  rocksdb::Status DeleteCF(uint32_t cf, const rocksdb::Slice&) override {
    return Note(cf, "a Delete");
  }
  rocksdb::Status SingleDeleteCF(uint32_t cf, const rocksdb::Slice&) override {
    return Note(cf, "a SingleDelete");
  }
  rocksdb::Status DeleteRangeCF(uint32_t cf, const rocksdb::Slice&, const rocksdb::Slice&) override {
    return Note(cf, "a DeleteRange");
  }
  rocksdb::Status MergeCF(uint32_t cf, const rocksdb::Slice&, const rocksdb::Slice&) override {
    return Note(cf, "a Merge");
  }
  rocksdb::Status PutBlobIndexCF(uint32_t cf, const rocksdb::Slice&, const rocksdb::Slice&) override {
    return Note(cf, "a blob index");
  }
  // Markers (two-phase commit, no-ops) write nothing themselves.
  rocksdb::Status MarkBeginPrepare(bool) override { return rocksdb::Status::OK(); }
  rocksdb::Status MarkEndPrepare(const rocksdb::Slice&) override { return rocksdb::Status::OK(); }
  rocksdb::Status MarkNoop(bool) override { return rocksdb::Status::OK(); }
  rocksdb::Status MarkRollback(const rocksdb::Slice&) override { return rocksdb::Status::OK(); }
  rocksdb::Status MarkCommit(const rocksdb::Slice&) override { return rocksdb::Status::OK(); }
  rocksdb::Status MarkCommitWithTimestamp(const rocksdb::Slice&, const rocksdb::Slice&) override {
    return rocksdb::Status::OK();
  }

 private:
  rocksdb::Status Note(uint32_t cf, const char* what) {
    ++entry_;
    if (cf != id_) return rocksdb::Status::OK();
    found_ = what;
    return rocksdb::Status::Aborted();  // ends the walk
  }

  const uint32_t id_;
  size_t entry_ = 0;
  const char* found_ = nullptr;
};

// The directories the writable stores of this process have open, by identity
// (device and inode), each with the path it was opened by. RocksDB refuses a
// second opener of a directory by its LOCK file, but within one process it
// tells them apart by the file's name only (the fcntl lock underneath belongs
// to the process, so it is granted again): 'db/', 'db/.', 'db//', a symlink to
// db, or the absolute path after a relative one opened a second store on the
// same directory, and both handed out the same key. Never destroyed: a store
// may be closed after static destructors ran.
struct OpenDirectories {
  std::mutex mu;
  std::map<std::pair<dev_t, ino_t>, std::string> held;  // guarded by mu
};
OpenDirectories& OpenDirs() {
  static auto* dirs = new OpenDirectories;
  return *dirs;
}

// What a directory holds, looked at before RocksDB touches it.
struct DirectoryFacts {
  bool exists = false;
  bool has_current = false;
  std::vector<std::string> data_files;  // tables, logs, manifests, blobs
  std::vector<std::string> live_logs;   // non-empty write-ahead logs
  // Why the directory could not be looked at (EACCES: a directory this user may
  // not enter or list), when it is not simply missing; the facts above then say
  // nothing, and must not be read as "no such directory" or "no database".
  std::error_code error;
};

DirectoryFacts LookAt(const std::string& path) {
  DirectoryFacts f;
  std::error_code ec;
  f.exists = std::filesystem::is_directory(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory && ec != std::errc::not_a_directory) {
    f.error = ec;
    return f;
  }
  if (!f.exists) return f;
  std::filesystem::directory_iterator entries(path, ec);
  if (ec) {
    f.error = ec;
    return f;
  }
  for (const auto& e : entries) {
    const std::string name = e.path().filename().string();
    if (name == "CURRENT") f.has_current = true;
    const bool log = name.ends_with(".log");
    if (log || name.ends_with(".sst") || name.ends_with(".blob") ||
        name.starts_with("MANIFEST-")) {
      f.data_files.push_back(name);
    }
    std::error_code size_ec;
    if (log && std::filesystem::file_size(e.path(), size_ec) > 0 && !size_ec) {
      f.live_logs.push_back(path + "/" + name);
    }
  }
  std::sort(f.data_files.begin(), f.data_files.end());
  std::sort(f.live_logs.begin(), f.live_logs.end());
  return f;
}

// True when the directory is what a creation cut short leaves: no CURRENT, and
// no data file but the new database's first MANIFEST (RocksDB's NewDB writes
// MANIFEST-000001, then CURRENT, and only then a log; records live only in
// tables, blobs and logs, so there is nothing to lose).
bool UnfinishedCreation(const DirectoryFacts& f) {
  return !f.has_current && f.data_files.size() == 1 && f.data_files[0] == "MANIFEST-000001";
}

std::string FewNames(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 4; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 4) out += ", ... (" + std::to_string(names.size()) + " files)";
  return out;
}

rocksdb::ColumnFamilyOptions RecordFamilyOptions(const RocksDBStoreOptions& o, Clock* clock,
                                                 const std::atomic<int64_t>* log_floor) {
  rocksdb::ColumnFamilyOptions cf;
  rocksdb::BlockBasedTableOptions t;
  if (o.block_cache_bytes > 0) {
    t.block_cache = rocksdb::NewLRUCache(o.block_cache_bytes);
  } else {
    t.no_block_cache = true;
  }
  // Most claims are of keys never seen: a whole-key bloom filter answers those
  // without reading a data block.
  t.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  t.whole_key_filtering = true;
  t.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinaryAndHash;
  t.format_version = 5;
  cf.table_factory.reset(rocksdb::NewBlockBasedTableFactory(t));
  // The same for keys still in the memtable.
  cf.memtable_prefix_bloom_size_ratio = 0.05;
  cf.memtable_whole_key_filtering = true;
  cf.write_buffer_size = o.write_buffer_bytes;
  cf.max_write_buffer_number = 4;
  cf.level_compaction_dynamic_level_bytes = true;
  cf.compaction_filter_factory = std::make_shared<ExpiryFilterFactory>(clock, log_floor);
  // Every file goes through the filter at least daily, even without new writes.
  cf.periodic_compaction_seconds = 24 * 3600;
  for (rocksdb::CompressionType c : rocksdb::GetSupportedCompressions()) {
    if (c == rocksdb::kLZ4Compression) cf.compression = c;
  }
  return cf;
}

class RocksDBStoreImpl final : public RocksDBStore {
 public:
  // `dir`: o.path made absolute, for every file the store touches (o.path, as
  // given, is what messages and Describe() show).
  RocksDBStoreImpl(const RocksDBStoreOptions& o, std::string dir, Clock* clock)
      : options_(o), dir_(std::move(dir)), clock_(clock), stripes_(new Stripe[kStripes]) {
    write_options_.sync = o.sync == SyncMode::kAlways;
    write_options_.disableWAL = false;  // never: the WAL is what survives a crash
    // Batches are written in key order: the memtable's skip list (inserted into
    // by one thread, see allow_concurrent_memtable_write in OpenDb) keeps its
    // place from one key to the next.
  }

  ~RocksDBStoreImpl() override {
    StopGroupCommit();
    if (syncer_.joinable()) {
      {
        std::lock_guard l(sync_mu_);
        stop_ = true;
      }
      sync_cv_.notify_all();
      syncer_.join();
    }
    if (db_ != nullptr) {
      // A clean close leaves the log on disk whatever the sync mode (unless a
      // write error stopped the database: then nothing more can be written).
      if (!write_errors_->failed() && !options_.read_only) (void)db_->SyncWAL();
      for (rocksdb::ColumnFamilyHandle* h : handles_) (void)db_->DestroyColumnFamilyHandle(h);
      (void)db_->Close();
      delete db_;
    }
    if (log_fd_ >= 0) close(log_fd_);
    // Closed logs a failed materialization left: synced, as the WAL is above.
    for (int fd : closed_unsynced_) {
      (void)fdatasync(fd);
      close(fd);
    }
    // Last: the directory may be opened again once nothing of this store uses it.
    if (dir_id_) {
      std::lock_guard l(OpenDirs().mu);
      OpenDirs().held.erase(*dir_id_);
    }
  }

  Status OpenDb();

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    DEDUP_RETURN_IF_ERROR(ValidateClaim(req));
    DEDUP_RETURN_IF_ERROR(CheckWritable("claim"));
    // Past the backlog bound, the pending claims are committed before this one
    // is decided, not after: a failed commit (a full disk) then leaves nothing
    // held, as its error says. (After, the claim stayed pending, BUSY for a
    // lease nobody got.)
    if (Deferred(req)) DEDUP_RETURN_IF_ERROR(CommitIfBacklogged());
    thread_local std::string rkey, value;
    thread_local Record scratch;
    EncodeRecordKey(req.key, &rkey);
    const Token fresh = Token::Random();
    const KeySlot slot = SlotOf(req.key);
    Stripe& st = stripes_[slot.stripe];
    std::unique_lock lock(st.mu);
    if (!Deferred(req)) AwaitMaterialized(st, HashedKey{req.key, slot.hash}, lock);
    Record* cur = nullptr;
    DEDUP_RETURN_IF_ERROR(Find(st, slot, rkey, req.key, "claim", &cur, &scratch));
    const int64_t now = clock_->NowMillis();
    Record next;
    bool write = false;
    thread_local std::string at_limit;
    ClaimResult res = DecideClaim(cur, req, now, fresh, &next, &write, &at_limit);
    if (!at_limit.empty()) [[unlikely]] return AtLimit("claim", req.key, at_limit);
    if (write) {
      DEDUP_RETURN_IF_ERROR(ApplyFenceFloor(st, &next, &res));
      if (Deferred(req)) {
        Defer(st, slot, req.key, std::move(next));
        return res;
      }
      WaitInFlight(st, HashedKey{req.key, slot.hash});
      EncodeRecord(next, &value);
      rocksdb::Status s = PutOne(rkey, value);
      if (!s.ok()) return FromRocks(s, Context("claim"));
      Settle(st, slot, req.key, next);
    }
    return res;
  }

  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override;
  // One WriteBatch, one write (synced as every write of this store is) for all.
  StatusOr<std::vector<AckedWrite>> CompleteBatch(std::span<const CompleteRequest> reqs) override;
  // Writes the records of a batch's keys marked `written`, in one WriteBatch
  // (synced as every write of this store is), then settles them. Stripes locked.
  Status WriteBatchOf(const BatchKeys& b, const std::vector<std::optional<Record>>& cur,
                      const std::vector<bool>& written, std::string_view op);

  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    DEDUP_RETURN_IF_ERROR(ValidateExtend(key, token, lease));
    DEDUP_RETURN_IF_ERROR(CheckWritable("extend"));
    return Update(key, "extend", nullptr,
                  [&](Record* r, int64_t now) { return DecideExtend(r, token, lease, now); });
  }

  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    return CompleteWithBatch(key, token, retention, status, result, nullptr);
  }

  StatusOr<WriteResult> CompleteWithBatch(std::string_view key, Token token, Millis retention,
                                          CompletionStatus status, std::string_view result,
                                          rocksdb::WriteBatch* batch) override {
    DEDUP_RETURN_IF_ERROR(ValidateComplete(key, token, retention, status, result));
    DEDUP_RETURN_IF_ERROR(CheckWritable("complete"));
    if (batch != nullptr) DEDUP_RETURN_IF_ERROR(CheckCallersBatch(*batch));
    return Update(key, "complete", batch, [&](Record* r, int64_t now) {
      return DecideComplete(r, token, retention, status, result, now);
    });
  }

  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    DEDUP_RETURN_IF_ERROR(ValidateRelease(key, token, retention));
    DEDUP_RETURN_IF_ERROR(CheckWritable("release"));
    return Update(key, "release", nullptr, [&](Record* r, int64_t now) {
      return DecideRelease(r, token, retention, now);
    });
  }

  StatusOr<std::optional<Record>> Inspect(std::string_view key) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    // A claim not yet committed is only in memory.
    {
      Stripe& st = stripes_[StripeIndex(key)];
      std::lock_guard lock(st.mu);
      const Record* mem = nullptr;
      if (auto it = st.pending.find(key); it != st.pending.end()) {
        mem = &it->second.rec;
      } else if (auto lt = st.logged.find(key); lt != st.logged.end()) {
        mem = &lt->second.rec;
      }
      if (mem != nullptr) {
        if (mem->ExpiredAt(clock_->NowMillis()) || IsFenceFloor(*mem)) {
          return std::optional<Record>();
        }
        Record r = *mem;
        r.key.assign(key);
        return std::optional<Record>(std::move(r));
      }
    }
    // No lock: a single Get sees one whole record, before or after any write.
    std::string rkey;
    EncodeRecordKey(key, &rkey);
    Record r;
    bool found = false;
    DEDUP_RETURN_IF_ERROR(Read(rkey, key, "inspect", &r, &found));
    if (!found || r.ExpiredAt(clock_->NowMillis()) || IsFenceFloor(r)) {
      return std::optional<Record>();
    }
    r.key.assign(key);
    return std::optional<Record>(std::move(r));
  }

  // Removes a record even when it cannot be decoded: that is how an operator gets
  // rid of a corrupt one. A forced forget of a running lease writes a fence floor
  // instead (core/state_machine.h).
  StatusOr<bool> Forget(std::string_view key, const ForgetOptions& options) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    DEDUP_RETURN_IF_ERROR(CheckWritable("forget"));
    std::string rkey;
    EncodeRecordKey(key, &rkey);
    const KeySlot slot = SlotOf(key);
    Stripe& st = stripes_[slot.stripe];
    std::unique_lock lock(st.mu);
    AwaitMaterialized(st, HashedKey{key, slot.hash}, lock);
    // The fingerprint stays: other keys may share it, and it only costs a Get.
    if (auto it = st.recent.find(key); it != st.recent.end()) st.recent.erase(it);
    WaitInFlight(st, HashedKey{key, slot.hash});
    const int64_t now = clock_->NowMillis();
    Record cur;
    bool found = false, decoded = false, logged = false;
    if (auto it = st.pending.find(key); it != st.pending.end()) {
      found = decoded = true;
      cur = it->second.rec;
    } else if (auto lt = st.logged.find(key); lt != st.logged.end()) {
      found = decoded = true;
      cur = lt->second.rec;
    }
    rocksdb::PinnableSlice value;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf_, rkey, &value);
    if (s.IsNotFound() && !found) return false;
    if (!s.ok() && !s.IsNotFound()) return FromRocks(s, Context("forget"));
    if (s.ok() && !found) {
      std::string why;
      decoded = DecodeRecord(value.ToStringView(), &cur, &why);
    }
    Record floor;
    const ForgetAction action =
        decoded ? DecideForget(&cur, options.force, now, &floor) : ForgetAction::kRemove;
    if (action == ForgetAction::kRefuse) {
      return LeasedForgetError(key, Millis(cur.lease_deadline - now));
    }
    // A fence floor stays until it ends; a record past its retention goes, as before.
    if (action == ForgetAction::kNone && !cur.ExpiredAt(now)) return false;
    if (action == ForgetAction::kFloor) {
      std::string v;
      EncodeRecord(floor, &v);
      s = db_->Put(write_options_, cf_, rkey, v);
    } else {
      // The claim logs may hold a claim of the key that this deletion leaves
      // nothing in the database to supersede: a forget entry first, so that
      // the fold at open does not bring it back.
      Status lf = LogForget(key, decoded ? cur.fence : ~uint64_t{0}, &logged);
      if (!lf.ok()) return logged ? ForgetLoggedNotApplied(lf) : lf;
      s = db_->Delete(write_options_, cf_, rkey);
    }
    if (s.ok() && st.pending.erase(key) > 0) pending_count_.fetch_sub(1, std::memory_order_relaxed);
    if (s.ok() && st.logged.erase(key) > 0) logged_count_.fetch_sub(1, std::memory_order_relaxed);
    if (!s.ok()) {
      const Status e = FromRocks(s, Context("forget"));
      return logged ? ForgetLoggedNotApplied(e) : e;
    }
    if (action == ForgetAction::kFloor) Remember(st, slot, key, floor);
    return action != ForgetAction::kNone;
  }

  StatusOr<ScanResult> Scan(std::string_view prefix, size_t limit,
                            const ScanOptions& options) override {
    ScanResult result;
    if (limit == 0) return result;
    // Claims not yet committed, too. A read-only store writes nothing: the
    // claims of the claim logs that the database does not hold yet (kept in
    // memory at open, newer than the database's record of their key) are
    // merged into what it lists.
    std::map<std::string, Record> logged;
    if (!options_.read_only) {
      DEDUP_RETURN_IF_ERROR(CommitAll());
    } else {
      for (size_t i = 0; i < kStripes; ++i) {
        Stripe& st = stripes_[i];
        std::lock_guard lock(st.mu);
        for (const auto& [key, p] : st.logged) {
          if (key.starts_with(prefix)) logged.emplace(key, p.rec);
        }
      }
    }
    auto next = logged.begin();
    std::string start;
    EncodeRecordKey(prefix, &start);
    const int64_t now = clock_->NowMillis();
    const auto add = [&](std::string_view key, Record&& r) {
      if (r.ExpiredAt(now) || IsFenceFloor(r)) return;
      r.key.assign(key);
      result.result_bytes.push_back(r.result.size());
      if (!options.with_results) std::string().swap(r.result);
      result.records.push_back(std::move(r));
    };
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_));
    for (it->Seek(start); it->Valid() && result.size() < limit; it->Next()) {
      const std::string_view k = it->key().ToStringView();
      if (!k.starts_with(start)) break;
      const std::string_view key = k.substr(1);
      // A key no call can name (empty, over the limit; written by other means)
      // is not the store's: no claim meets it, no Forget could remove it.
      if (key.empty() || key.size() > kMaxKeyBytes) continue;
      for (; next != logged.end() && next->first < key && result.size() < limit; ++next) {
        add(next->first, std::move(next->second));
      }
      if (result.size() >= limit) break;
      if (next != logged.end() && next->first == key) {
        add(next->first, std::move(next->second));
        ++next;
        continue;
      }
      Record r;
      std::string why;
      if (!DecodeRecord(it->value().ToStringView(), &r, &why)) {
        result.undecodable.push_back({std::string(key), std::move(why)});
        continue;
      }
      add(key, std::move(r));
    }
    if (!it->status().ok()) return FromRocks(it->status(), Context("scan"));
    for (; next != logged.end() && result.size() < limit; ++next) {
      add(next->first, std::move(next->second));
    }
    return result;
  }

  // A store opened read-only (dedup inspect) refuses every write before it starts:
  // no group-commit writer runs there to persist a claim.
  Status CheckWritable(std::string_view op) const {
    if (!options_.read_only) return Status::Ok();
    return Status::FailedPrecondition("rocksdb " + options_.path + ": " + std::string(op) +
                                      ": the store was opened read-only");
  }

  std::string Describe() const override {
    std::string d = "rocksdb:" + options_.path;
    if (options_.sync != SyncMode::kNone) d += "?sync=" + std::string(SyncModeName(options_.sync));
    if (options_.sync == SyncMode::kInterval) {
      d += ":" + std::to_string(options_.sync_interval.count()) + "ms";
    }
    return d;
  }

  rocksdb::DB* db() override { return db_; }
  rocksdb::ColumnFamilyHandle* records_family() override { return cf_; }

  Status CompactNow() override {
    // Every claim into the database and the logs gone: the filter drops all
    // that expired.
    DEDUP_RETURN_IF_ERROR(MaterializeClaims());
    rocksdb::Status s = db_->Flush(rocksdb::FlushOptions(), cf_);
    if (!s.ok()) return FromRocks(s, Context("compact: flush"));
    rocksdb::CompactRangeOptions co;
    // Rewrite the last level too, so that its expired records meet the filter.
    co.bottommost_level_compaction = rocksdb::BottommostLevelCompaction::kForce;
    s = db_->CompactRange(co, cf_, nullptr, nullptr);
    if (!s.ok()) return FromRocks(s, Context("compact"));
    return Status::Ok();
  }

 private:
  // Everything in a stripe is guarded by its mutex.
  // A claim's record waiting for the group commit. gen 0: not yet taken by a
  // writer batch; otherwise the batch carrying it.
  struct Pending {
    // Built in place in the pending map: the claim's record is moved once.
    Pending(Record&& r, uint64_t claim_round, uint64_t key_hash)
        : rec(std::move(r)), round(claim_round), hash(key_hash) {}
    Record rec;
    uint64_t gen = 0;
    // A writer batch carrying an older record of the key, which this claim
    // replaced while that batch was being written (0: none). A write of the
    // key waits for it too, or the older record would land after it.
    uint64_t prior = 0;
    uint64_t round = 0;  // the writer's round when the claim was made
    uint64_t hash = 0;   // the key's (KeyHash), for the writer's RememberMoved
    // A writer batch whose write failed while carrying this very record, and
    // that is kept encoded to be written again as it is (0: none). See kept_gen_.
    uint64_t kept = 0;
    // In the logged maps: the materialization (MaterializeLogged) writing this
    // very record into the database (0: none), and one writing an older
    // logged record of the key that this one replaced (0: none). A write of
    // the key waits for both (MatInFlight): the database must get the newer
    // record last.
    uint64_t mgen = 0;
    uint64_t mprior = 0;
  };

  // A record of CommitPending's batch: key and value back to back in commit_buf_.
  struct CommitEntry {
    size_t at, key_len, value_len;
    uint64_t order;  // SortByKey's: 8 key bytes after the batch's common prefix
  };

  struct alignas(64) Stripe {
    std::mutex mu;
    absl::flat_hash_set<uint32_t> present;  // fingerprints of keys with a record on disk
    RecentCopies recent;  // write-through copies
    absl::flat_hash_map<std::string, Pending, StripeHash, StripeEq> pending;  // claims to commit
    // Claims in the claim log and nowhere else on disk (rec, hash, mgen and
    // mprior are used). A key is never in both maps with the same record:
    // pending is the newer (a takeover of a logged claim) and is looked at first.
    absl::flat_hash_map<std::string, Pending, StripeHash, StripeEq> logged;
    std::atomic<bool> dirty{false};  // pending holds records with gen 0 (see MarkDirty)
    uint64_t fence_next = 0;  // above every fence handed out in this stripe
  };

  // ---- group commit of claims ---------------------------------------------------

  bool Deferred(const ClaimRequest& req) const {
    return options_.sync != SyncMode::kAlways && req.max_attempts == 0;
  }

  // Puts an extracted pending/logged entry into `to` with the hash it carries
  // (inserting the node rehashed its key: std::_Hash_bytes was 8 % of the
  // writer's samples, perf, claims alone). True when the key was not in `to`;
  // otherwise its entry there takes the node's value if `replace`.
  template <typename Map, typename Node>
  static bool MoveNode(Map& to, Node&& node, bool replace = true) {
    bool inserted = false;
    const HashedKey hk{node.key(), node.mapped().hash};
    auto it = to.lazy_emplace(hk, [&](const auto& make) {
      inserted = true;
      make(std::move(node.key()), std::move(node.mapped()));
    });
    if (!inserted && replace) {
      // The replaced record may be being written by a materialization: the
      // newer one keeps its writes waiting for it (mprior).
      const uint64_t older = std::max(it->second.mgen, it->second.mprior);
      it->second = std::move(node.mapped());
      it->second.mprior = std::max(it->second.mprior, older);
    }
    return inserted;
  }

  // Every fence this process hands out is above every fence of earlier
  // processes (the epoch), and above every fence it handed out before in the
  // key's stripe: a key whose record is gone (expired and compacted away, and
  // not in the write-through copies) starts again above its last fence, not at
  // the epoch's first. A fence past the durable ceiling (a stripe that handed
  // out 2^32 fences in this process, or a takeover of a record that high) first
  // makes a higher epoch durable, so that the next open starts above it too,
  // written or not; if that write fails, so does the claim, and nothing is
  // written. With the stripe locked.
  Status ApplyFenceFloor(Stripe& st, Record* next, ClaimResult* res) {
    if (res->outcome != ClaimOutcome::kAcquired) return Status::Ok();
    const uint64_t floor = std::max(fence_floor_, st.fence_next);
    const uint64_t fence = std::max(next->fence, floor);
    if (fence > fence_ceiling_.load(std::memory_order_acquire)) {
      DEDUP_RETURN_IF_ERROR(RaiseFenceCeiling(fence));
    }
    next->fence = fence;
    res->fence = fence;
    st.fence_next = fence + 1;
    return Status::Ok();
  }

  // Makes epoch fence >> 32 durable: the next open takes the one after, whose
  // fences start above `fence`.
  Status RaiseFenceCeiling(uint64_t fence) {
    std::lock_guard lock(fence_epoch_mu_);
    if (fence <= fence_ceiling_.load(std::memory_order_relaxed)) return Status::Ok();
    const uint64_t epoch = fence >> 32;
    if (epoch + 1 >= (uint64_t{1} << 31)) {
      return Status::FailedPrecondition(Context("claim") + ": fence epoch exhausted");
    }
    rocksdb::WriteOptions wo;
    wo.sync = true;
    rocksdb::Status s = db_->Put(wo, cf_, kMetaFenceEpochKey, std::to_string(epoch));
    if (!s.ok()) return FromRocks(s, Context("claim: writing the fence epoch"));
    fence_ceiling_.store((epoch + 1) << 32, std::memory_order_release);
    return Status::Ok();
  }

  // A claim's record, to be committed by the background writer. Stripe locked.
  void Defer(Stripe& st, KeySlot slot, std::string_view key, Record&& r) {
    st.present.insert(slot.fingerprint);
    // One lookup, with the hash already computed, that inserts when absent.
    const uint64_t round = commit_round_.load(std::memory_order_relaxed);
    bool inserted = false;
    auto it = st.pending.lazy_emplace(HashedKey{key, slot.hash}, [&](const auto& make) {
      inserted = true;
      make(std::piecewise_construct, std::forward_as_tuple(key),
           std::forward_as_tuple(std::move(r), round, slot.hash));
    });
    if (inserted) {
      if (pending_count_.fetch_add(1) == 0 && writer_idle_.load()) WakeWriter();
    } else {
      Pending& p = it->second;
      p.rec = std::move(r);
      if (p.gen != 0) p.prior = p.gen;  // its batch may still be writing the old record
      p.gen = 0;
      p.kept = 0;  // a kept failed batch holds the old record, not this one
      p.round = round;
      p.hash = slot.hash;
    }
    MarkDirty(st, slot.stripe);
  }

  // Notes that stripe `i` (locked) has records for the writer: its flag, and its
  // bit in dirty_mask_, which the writer reads instead of every stripe's flag
  // (1,024 cache lines a round, most of them clean: perf put a fifth of
  // CommitPending's own samples on those loads, and they ran every millisecond
  // while any claim was pending, as under claim+complete). The bit is set when the flag
  // goes up, and the writer clears it (exchange) before it locks the stripe, so
  // a stripe whose flag is up always has its bit set or is about to be visited.
  void MarkDirty(Stripe& st, size_t i) {
    if (st.dirty.load(std::memory_order_relaxed)) return;
    st.dirty.store(true, std::memory_order_relaxed);
    dirty_mask_[i >> 6].fetch_or(uint64_t{1} << (i & 63), std::memory_order_relaxed);
  }

  // Before a synchronous write of `key`, with its stripe locked: if a writer batch
  // is carrying an older record of the key, waits until that batch is done, so
  // the newer record is written after it.
  // The same for a materialization writing an older logged record of the key
  // (none after AwaitMaterialized, which the single-key writes call first).
  void WaitInFlight(Stripe& st, const HashedKey& key) {
    const InFlight f = InFlightOf(st, key);
    if (f.gen != 0) WaitGen(f.gen);
    if (f.mat != 0) WaitMat(f.mat);
  }

  // What a write of a key waits for first: a writer batch (gen) and a
  // materialization (mat) carrying an older record of it; 0: nothing.
  struct InFlight {
    uint64_t gen = 0;
    uint64_t mat = 0;
  };

  // InFlightGen of `key`'s pending entry in `st` (stripe locked), and
  // MatInFlight of its logged one, and InFlightGen of that too: LogPending
  // moves a claim into the logged map before its frame is written.
  InFlight InFlightOf(const Stripe& st, const HashedKey& key) const {
    InFlight f;
    if (!st.pending.empty()) {
      if (auto it = st.pending.find(key); it != st.pending.end()) f.gen = InFlightGen(it->second);
    }
    if (!st.logged.empty()) {
      if (auto it = st.logged.find(key); it != st.logged.end()) {
        f.mat = MatInFlight(it->second);
        f.gen = std::max(f.gen, InFlightGen(it->second));
      }
    }
    return f;
  }

  // Before a synchronous write of `key`, with its stripe locked by `lock`: while
  // a materialization is writing an older logged record of the key, waits for
  // it with the stripe unlocked, then locks it again (the caller then looks the
  // record up). A materialization marks its records with their stripes locked,
  // so none marks this key until the caller unlocks. (Waiting with the stripe
  // locked, as for a writer batch, held every key of the stripe for the whole
  // ingestion: a claim of another key waited behind a completion.)
  void AwaitMaterialized(Stripe& st, const HashedKey& key, std::unique_lock<std::mutex>& lock) {
    while (!st.logged.empty()) {
      auto it = st.logged.find(key);
      if (it == st.logged.end()) return;
      const uint64_t m = MatInFlight(it->second);
      if (m == 0) return;
      lock.unlock();
      WaitMat(m);
      lock.lock();
    }
  }

  // The materialization to wait for before writing a logged entry's key, or 0.
  uint64_t MatInFlight(const Pending& p) const {
    const uint64_t m = std::max(p.mgen, p.mprior);
    return m > mat_done_.load(std::memory_order_acquire) ? m : 0;
  }

  // Waits until materialization `m` is done (written or failed); as WaitGen:
  // only the caller's stripe may be locked (a materialization locks stripes
  // one at a time, and marks its records done before it locks them again).
  void WaitMat(uint64_t m) {
    if (mat_done_.load(std::memory_order_acquire) >= m) return;
    std::unique_lock l(gen_mu_);
    gen_cv_.wait(l, [&] { return mat_done_.load(std::memory_order_relaxed) >= m; });
  }

  // Waits until writer batch `g` is done (written or failed). No stripe may be
  // locked but the caller's one: the writer locks stripes one at a time.
  void WaitGen(uint64_t g) {
    if (done_gen_.load(std::memory_order_acquire) >= g) return;
    std::unique_lock l(gen_mu_);
    gen_cv_.wait(l, [&] { return done_gen_.load(std::memory_order_relaxed) >= g; });
  }

  // The writer batch to wait for before writing `p`'s key, or 0: the one
  // carrying `p`, or the one carrying the older record that `p` replaced (a
  // takeover while that batch was being gathered or written: without it, the
  // new owner's completion could land first and the old claim come back from
  // disk, to be completed a second time by its old owner), if not finished yet.
  // A batch that has finished drops its records from `pending` a moment later,
  // stripe by stripe: until then they count as written, not in flight (a batch
  // writer that waited for them before started over and found them again,
  // relocking and rehashing its whole batch until the writer got to their
  // stripes).
  uint64_t InFlightGen(const Pending& p) const {
    const uint64_t g = std::max(p.gen, p.prior);
    return g > done_gen_.load(std::memory_order_acquire) ? g : 0;
  }

  // Locks the stripes of a batch's keys, ascending, each once: two batches never
  // wait on each other in a cycle, and Claim only ever holds one. With
  // `before_write`, a claim of one of the keys that a writer batch is still
  // carrying must land before the batch's own write: waits for that writer
  // batch with no stripe locked (the writer locks stripes too, so waiting with
  // several held could wait on ourselves), then locks again.
  void LockBatch(const BatchKeys& b, bool before_write,
                 std::vector<std::unique_lock<std::mutex>>* locks) {
    locks->reserve(b.stripes.size());
    while (true) {
      for (size_t s : b.stripes) locks->emplace_back(stripes_[s].mu);
      if (!before_write) return;
      InFlight in_flight;
      for (size_t k = 0; k < b.keys.size(); ++k) {
        const InFlight f = InFlightOf(stripes_[b.slots[k].stripe], b.Hashed(k));
        in_flight.gen = std::max(in_flight.gen, f.gen);
        in_flight.mat = std::max(in_flight.mat, f.mat);
      }
      if (in_flight.gen == 0 && in_flight.mat == 0) return;
      locks->clear();
      if (in_flight.gen != 0) WaitGen(in_flight.gen);
      if (in_flight.mat != 0) WaitMat(in_flight.mat);
    }
  }

  // After a synchronous write of `r` for `key`: it supersedes any pending claim.
  // A completed record is not copied: nothing follows a completion but the
  // claims of duplicates, which its fingerprint sends to a Get; copying it cost
  // an eighth of a claim+complete (perf: three cache lines written per
  // completion into an entry rarely read again).
  void Settle(Stripe& st, KeySlot slot, std::string_view key, const Record& r) {
    const HashedKey hk{key, slot.hash};
    if (st.pending.empty()) {
    } else if (auto it = st.pending.find(hk); it != st.pending.end()) {
      st.pending.erase(it);
      pending_count_.fetch_sub(1, std::memory_order_relaxed);
    }
    // A logged claim is superseded by any record written to the database: the
    // fold at open keeps the database's record when its fence is as high.
    if (st.logged.empty()) {
    } else if (auto it = st.logged.find(hk); it != st.logged.end()) {
      st.logged.erase(it);
      logged_count_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (r.state != RecordState::kCompleted) {
      Remember(st, slot, key, r);
      return;
    }
    st.present.insert(slot.fingerprint);
    if (auto* e = st.recent.find(hk); e != nullptr) st.recent.erase(e);
  }

  // With no stripe locked: when the writer has fallen behind, does its work
  // here. Past kMaxPending pending claims, appends them to the claim log (one
  // frame: it does not wait for a materialization the writer may be running,
  // which is what the claiming thread did when this wrote them all into the
  // database: it waited for the writer's ingestion of 131,072 claims, then
  // ingested its backlog itself); past kMaxLoggedHard logged claims, waits for
  // the writer's materialization and writes the rest itself.
  Status CommitIfBacklogged() {
    if (pending_count_.load(std::memory_order_relaxed) > kMaxPending) {
      DEDUP_RETURN_IF_ERROR(LogPending(/*all=*/true));
    }
    if (logged_count_.load(std::memory_order_relaxed) > kMaxLoggedHard) {
      return MaterializeLogged(/*hard=*/true);
    }
    return Status::Ok();
  }

  // CommitPending of every claim, with no materialization running.
  Status CommitAll() {
    std::lock_guard mat(mat_mu_);
    return CommitPending();
  }

  // Writes pending claims in one batch: every one (Scan, CompactNow, close),
  // or (`all` false) those made before the writer's previous round began, at
  // least one interval ago. A claim completed sooner than that is never
  // written: its completion supersedes it. (Taken the moment it was made, it
  // made its completion wait for the writer's batch: perf and the bench's
  // claim+complete tail showed those waits.) One at a time; with mat_mu_ held
  // (no materialization runs: the logged claims are all moved here).
  Status CommitPending(bool all = true) {
    std::lock_guard run(commit_mu_);
    // Logged claims go into the database with the rest: back into the pending
    // maps, where this batch takes them (a claim pending for the same key is
    // newer and replaces the logged one).
    if (all && logged_count_.load() > 0) {
      for (size_t i = 0; i < kStripes; ++i) {
        Stripe& st = stripes_[i];
        std::lock_guard lock(st.mu);
        if (st.logged.empty()) continue;
        int64_t moved = 0, added = 0;
        for (auto it = st.logged.begin(); it != st.logged.end();) {
          ++moved;
          auto node = st.logged.extract(it++);
          node.mapped().gen = 0;  // a logged frame's, finished (commit_mu_): not taken
          if (MoveNode(st.pending, std::move(node), /*replace=*/false)) ++added;
        }
        logged_count_.fetch_sub(moved, std::memory_order_relaxed);
        pending_count_.fetch_add(added, std::memory_order_relaxed);
        MarkDirty(st, i);
      }
    }
    const uint64_t g = ++last_gen_;
    const uint64_t round = commit_round_.load(std::memory_order_relaxed);
    std::vector<size_t> touched;
    // Encoded into one buffer, then put in key order: the memtable's skip list
    // inserts a sorted run next to the previous key instead of searching from
    // the top for every key (perf: most of the writer's time was that search).
    commit_buf_.clear();
    commit_entries_.clear();
    std::string value;
    const auto encode = [&](const std::string& key, const Pending& p) {
      const size_t at = commit_buf_.size();
      AppendRecordKey(key, &commit_buf_);
      EncodeRecord(p.rec, &value);
      commit_entries_.push_back({at, commit_buf_.size() - at, value.size(), 0});
      commit_buf_ += value;
    };
    // The records of the kept failed batch are not encoded again at first: when
    // this round finds every one of them unchanged and nothing else, that batch
    // is written again as it is.
    size_t kept_found = 0;
    for (size_t w = 0; w < kStripes / 64; ++w) {
      uint64_t bits = dirty_mask_[w].load(std::memory_order_relaxed);
      if (bits != 0) bits = dirty_mask_[w].exchange(0, std::memory_order_relaxed);
      for (; bits != 0; bits &= bits - 1) {
        const size_t i = w * 64 + static_cast<size_t>(std::countr_zero(bits));
        Stripe& st = stripes_[i];
        std::lock_guard lock(st.mu);
        bool young = false, taken = false;
        for (auto& [key, p] : st.pending) {
          if (p.gen != 0) continue;
          if (!all && p.round + 1 >= round) {
            young = true;
            continue;
          }
          p.gen = g;
          taken = true;
          if (kept_gen_ != 0 && p.kept == kept_gen_) {
            ++kept_found;
          } else {
            encode(key, p);
          }
        }
        st.dirty.store(false, std::memory_order_relaxed);
        if (young) MarkDirty(st, i);
        if (taken) touched.push_back(i);
      }
    }
    rocksdb::WriteBatch& batch = commit_batch_;  // its buffer kept from round to round
    bool ingest = false;
    const bool rewrite = kept_found != 0 && kept_found == kept_count_ && commit_entries_.empty();
    if (!rewrite) {
      if (kept_found != 0) {
        // Some of the kept batch's records changed or were written since: its
        // unchanged ones (carried by this batch already) are encoded now.
        for (size_t i : touched) {
          Stripe& st = stripes_[i];
          std::lock_guard lock(st.mu);
          for (auto& [key, p] : st.pending) {
            if (p.gen == g && p.kept == kept_gen_) encode(key, p);
          }
        }
      }
      const char* buf = commit_buf_.data();
      SortByKey(buf, &commit_entries_);
      batch.Clear();
      // Many records (a full log, a backlog, a close): a table file of their own.
      ingest = commit_entries_.size() >= kMinIngest;
      if (!ingest) {
        for (const CommitEntry& e : commit_entries_) {
          (void)batch.Put(cf_, rocksdb::Slice(buf + e.at, e.key_len),
                          rocksdb::Slice(buf + e.at + e.key_len, e.value_len));
        }
      }
    }
    rocksdb::Status s;
    if (ingest) {
      s = IngestSorted(commit_buf_.data(), commit_entries_);
    } else if (batch.Count() > 0) {
      s = WriteKept(write_options_, &batch, /*keep_failed=*/true);
    }
    // A failed batch stays encoded for the next round (its records keep kept = g).
    kept_gen_ = !s.ok() && batch.Count() > 0 ? g : 0;
    kept_count_ = kept_gen_ != 0 ? static_cast<size_t>(batch.Count()) : 0;
    {
      std::lock_guard l(gen_mu_);
      done_gen_.store(g, std::memory_order_release);
    }
    gen_cv_.notify_all();
    // Subtracted from pending_count_ once, at the end: the claimers add to it
    // for every claim, and a subtraction per record moved its cache line back
    // and forth between them and the writer.
    int64_t committed = 0;
    for (size_t i : touched) {
      Stripe& st = stripes_[i];
      std::lock_guard lock(st.mu);
      for (auto it = st.pending.begin(); it != st.pending.end();) {
        if (it->second.gen != g) {
          ++it;
        } else if (s.ok()) {
          // Committed: from now on an ordinary remembered record (moved, not
          // copied: the pending entry is dropped). Not an ingested batch's: a
          // full log, a backlog or a close, whose copies would only push out
          // newer ones (an older copy of the key goes: the database's is newer).
          const HashedKey hk{it->first, it->second.hash};
          if (!ingest) {
            RememberMoved(st, hk, std::move(it->second.rec));
          } else if (auto* e = st.recent.find(hk); e != nullptr) {
            st.recent.erase(e);
          }
          st.pending.erase(it++);
          ++committed;
        } else {
          it->second.gen = 0;  // retried by the next batch
          it->second.kept = kept_gen_;
          MarkDirty(st, i);
          ++it;
        }
      }
    }
    if (committed != 0) pending_count_.fetch_sub(committed, std::memory_order_relaxed);
    if (!s.ok()) return FromRocks(s, Context("commit of claims"));
    return Status::Ok();
  }

  // The writer's round: appends the pending claims made before its previous
  // round began (at least one interval ago; a claim completed sooner is never
  // written) to the claim log as one frame, and keeps them as logged. A claim
  // completed while logged is never written to the database at all; the log is
  // folded into the database at the next open. While a frame is being written
  // its claims count as in flight, as a database batch's (WaitInFlight): a
  // forget entry is always appended after the claims it forgets.
  // With `all` (a claiming thread past the backlog bound), every pending claim.
  Status LogPending(bool all = false) {
    std::lock_guard run(commit_mu_);
    const uint64_t g = ++last_gen_;
    const uint64_t round = commit_round_.load(std::memory_order_relaxed);
    std::vector<size_t>& touched = log_touched_;
    touched.clear();
    std::vector<size_t>& left = log_left_;
    left.clear();
    log_frame_.Clear();
    std::string& value = log_value_;
    int64_t early = 0;
    for (size_t w = 0; w < kStripes / 64; ++w) {
      uint64_t bits = dirty_mask_[w].load(std::memory_order_relaxed);
      if (bits != 0) bits = dirty_mask_[w].exchange(0, std::memory_order_relaxed);
      for (; bits != 0; bits &= bits - 1) {
        const size_t i = w * 64 + static_cast<size_t>(std::countr_zero(bits));
        Stripe& st = stripes_[i];
        std::lock_guard lock(st.mu);
        bool young = false, taken = false, stays = false;
        for (auto it = st.pending.begin(); it != st.pending.end();) {
          Pending& p = it->second;
          if (p.gen != 0) {
            ++it;
            continue;
          }
          if (!all && p.round + 1 >= round) {
            young = true;
            ++it;
            continue;
          }
          taken = true;
          EncodeRecord(p.rec, &value);
          log_frame_.AddClaim(it->first, value);
          // Into the logged map now, while its entry is in the cache, marked
          // as in flight until the frame is written (gen; InFlightOf): a pass
          // after the append that found each claim again and moved it was a
          // third of the writer's samples (perf, claims alone: the loads of
          // entries the caller wrote on the other core, and the new slot). A
          // claim over an older logged one of its key stays pending until the
          // append succeeds (below): the older one must stay if it fails.
          if (!st.logged.empty() && st.logged.contains(HashedKey{it->first, p.hash})) {
            p.gen = g;
            stays = true;
            ++it;
            continue;
          }
          auto node = st.pending.extract(it++);
          Pending& q = node.mapped();
          q.gen = g;
          q.prior = q.kept = 0;
          q.mgen = q.mprior = 0;
          (void)MoveNode(st.logged, std::move(node));
          ++early;
        }
        st.dirty.store(false, std::memory_order_relaxed);
        if (young) MarkDirty(st, i);
        if (taken) touched.push_back(i);
        if (stays) left.push_back(i);
      }
    }
    if (early != 0) {
      pending_count_.fetch_sub(early, std::memory_order_relaxed);
      logged_count_.fetch_add(early, std::memory_order_relaxed);
    }
    Status s = log_frame_.entries() == 0 ? Status::Ok() : AppendToLog(log_frame_.Finish(), false);
    if (log_frame_.capacity() > kMaxKeptBatchBytes) log_frame_.Shrink();
    {
      std::lock_guard l(gen_mu_);
      done_gen_.store(g, std::memory_order_release);
    }
    gen_cv_.notify_all();
    int64_t moved = 0, logged = 0, back = 0, dropped = 0;
    for (size_t i : s.ok() ? left : touched) {
      Stripe& st = stripes_[i];
      std::lock_guard lock(st.mu);
      for (auto it = st.pending.begin(); it != st.pending.end();) {
        if (it->second.gen != g) {
          ++it;
        } else if (s.ok()) {
          auto node = st.pending.extract(it++);
          node.mapped().gen = node.mapped().prior = node.mapped().kept = 0;
          node.mapped().mgen = node.mapped().mprior = 0;
          ++moved;
          if (MoveNode(st.logged, std::move(node))) ++logged;  // else: over an older logged claim
        } else {
          it->second.gen = 0;  // retried by the next round
          MarkDirty(st, i);
          ++it;
        }
      }
      if (s.ok()) continue;
      // Not written: the claims moved early go back to pending, to be retried,
      // unless a newer claim of the key is pending there (it supersedes them).
      for (auto it = st.logged.begin(); it != st.logged.end();) {
        if (it->second.gen != g) {
          ++it;
          continue;
        }
        auto node = st.logged.extract(it++);
        node.mapped().gen = 0;
        ++dropped;
        if (MoveNode(st.pending, std::move(node), /*replace=*/false)) ++back;
        MarkDirty(st, i);
      }
    }
    if (moved - back != 0) pending_count_.fetch_sub(moved - back, std::memory_order_relaxed);
    if (logged - dropped != 0) logged_count_.fetch_add(logged - dropped, std::memory_order_relaxed);
    return s;
  }

  // Writes every claim into the database (CommitPending), then deletes the claim
  // logs that were complete before it began: everything in them is now in the
  // database or superseded there. The next claim starts a new log.
  Status MaterializeClaims() {
    if (options_.read_only) return Status::Ok();  // nothing to write, nothing written
    std::lock_guard mat(mat_mu_);
    uint64_t cut = 0;
    {
      std::lock_guard l(log_mu_);
      CloseLogFile();
      if (!log_files_.empty()) cut = log_files_.back().number;
    }
    DEDUP_RETURN_IF_ERROR(CommitPending());
    if (cut != 0) DropLogsUpTo(cut);
    return Status::Ok();
  }

  // The materializer's bound on the logged claims (and, `hard`, a claiming thread's):
  // writes every logged claim into the database, then deletes the logs that
  // were complete before it began. Unlike MaterializeClaims it holds up the
  // log's rounds only while it gathers the claims (commit_mu_), not while it
  // writes them: when the writer ingested 131,072 claims under commit_mu_,
  // every claim stayed pending meanwhile, and a claiming thread past
  // kMaxPending waited for the ingestion, then ingested its backlog itself (the
  // claim rate of one thread fell: docs/PERFORMANCE.md).
  // While the records are written they stay in the logged maps, marked with
  // this materialization (mgen): a write of their key waits for it
  // (WaitInFlight), so the database gets the newer record last, as for a
  // writer batch.
  // `aged`: also when the oldest log is older than kMaxLogAgeMs (LogTooOld).
  Status MaterializeLogged(bool hard, bool aged = false) {
    std::lock_guard mat(mat_mu_);
    // Re-checked under mat_mu_: one that just ran may have done it.
    const bool bound = hard ? logged_count_.load() > kMaxLoggedHard : PastLogBounds();
    if (!bound && !(aged && LogTooOld())) return Status::Ok();
    const uint64_t m = ++last_mat_;
    uint64_t cut = 0;
    std::vector<size_t>& touched = mat_touched_;
    touched.clear();
    mat_buf_.clear();
    mat_entries_.clear();
    {
      // No log round runs meanwhile: every claim of the logs up to `cut` that
      // nothing superseded is in a logged map now, and the next round starts
      // a new log.
      std::lock_guard run(commit_mu_);
      {
        std::lock_guard l(log_mu_);
        CloseLogFile();
        if (!log_files_.empty()) cut = log_files_.back().number;
      }
      std::string& value = log_value_;
      for (size_t i = 0; i < kStripes; ++i) {
        Stripe& st = stripes_[i];
        std::lock_guard lock(st.mu);
        if (st.logged.empty()) continue;
        for (auto& [key, p] : st.logged) {
          p.mgen = m;
          const size_t at = mat_buf_.size();
          AppendRecordKey(key, &mat_buf_);
          EncodeRecord(p.rec, &value);
          mat_entries_.push_back({at, mat_buf_.size() - at, value.size(), 0});
          mat_buf_ += value;
        }
        touched.push_back(i);
      }
    }
    rocksdb::Status s;
    if (mat_entries_.size() >= kMinIngest) {
      SortByKey(mat_buf_.data(), &mat_entries_);
      s = IngestSorted(mat_buf_.data(), mat_entries_);
    } else if (!mat_entries_.empty()) {
      rocksdb::WriteBatch batch;
      const char* buf = mat_buf_.data();
      for (const CommitEntry& e : mat_entries_) {
        (void)batch.Put(cf_, rocksdb::Slice(buf + e.at, e.key_len),
                        rocksdb::Slice(buf + e.at + e.key_len, e.value_len));
      }
      s = db_->Write(write_options_, &batch);
    }
    if (mat_buf_.capacity() > kMaxKeptBatchBytes) std::string().swap(mat_buf_);
    if (mat_entries_.capacity() > kMaxKeptBatchBytes / sizeof(CommitEntry)) {
      std::vector<CommitEntry>().swap(mat_entries_);
    }
    {
      std::lock_guard l(gen_mu_);
      mat_done_.store(m, std::memory_order_release);
    }
    gen_cv_.notify_all();
    // Failed: the records stay logged (their mgen is done, so nothing waits),
    // and the logs stay; the next materialization tries again.
    if (!s.ok()) return FromRocks(s, Context("writing the claim log's claims"));
    // Written: the database holds them (a copy of the key remembered from
    // before is older: dropped). A record that replaced one (mgen 0) stays.
    int64_t written = 0;
    for (size_t i : touched) {
      Stripe& st = stripes_[i];
      std::lock_guard lock(st.mu);
      for (auto it = st.logged.begin(); it != st.logged.end();) {
        if (it->second.mgen != m) {
          ++it;
          continue;
        }
        if (auto* e = st.recent.find(HashedKey{it->first, it->second.hash}); e != nullptr) {
          st.recent.erase(e);
        }
        st.logged.erase(it++);
        ++written;
      }
    }
    if (written != 0) logged_count_.fetch_sub(written, std::memory_order_relaxed);
    if (cut != 0) DropLogsUpTo(cut);
    return Status::Ok();
  }

  // Writes a batch's records (sorted, each key once) as one table file and
  // ingests it: no memtable insert and no WAL record per claim. The ingested
  // records are newer than everything in the database (RocksDB gives the file
  // a sequence number above all, flushing the memtable first when their keys
  // overlap), which is right: every key of the batch is in flight (a write of
  // it waits for this batch), so the database holds no newer record of it.
  // Durable once ingested (the file and the MANIFEST are synced).
  rocksdb::Status IngestSorted(const char* buf, const std::vector<CommitEntry>& entries) {
    const std::string path = dir_ + "/" + std::string(internal::kClaimLogPrefix) + "ingest";
    (void)unlink(path.c_str());
    // The file is built cheaper than a flush builds one (callgrind, claims alone:
    // 8,489 -> 6,241 instructions a claim): its data blocks are not compressed
    // and carry no hash index (binary search only; a reader tells block by
    // block), and its pages stay in the page cache (SstFileWriter drops them by
    // default, every MiB, and the ingestion then reads the file back). Most of
    // its records are superseded soon (a completion, a release); a compaction
    // that rewrites the file compresses what is left. Its bloom filter stays.
    rocksdb::Options opts(db_->GetDBOptions(), db_->GetOptions(cf_));
    if (const auto* t = opts.table_factory->GetOptions<rocksdb::BlockBasedTableOptions>()) {
      rocksdb::BlockBasedTableOptions bt = *t;
      bt.data_block_index_type = rocksdb::BlockBasedTableOptions::kDataBlockBinarySearch;
      opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(bt));
    }
    opts.compression = rocksdb::kNoCompression;
    rocksdb::SstFileWriter w(rocksdb::EnvOptions(), opts, cf_, /*invalidate_page_cache=*/false);
    rocksdb::Status s = w.Open(path);
    for (size_t i = 0; s.ok() && i < entries.size(); ++i) {
      const CommitEntry& e = entries[i];
      s = w.Put(rocksdb::Slice(buf + e.at, e.key_len),
                rocksdb::Slice(buf + e.at + e.key_len, e.value_len));
    }
    if (s.ok()) s = w.Finish();
    if (s.ok()) {
      rocksdb::IngestExternalFileOptions io;
      io.move_files = true;
      io.write_global_seqno = false;
      s = db_->IngestExternalFile(cf_, {path}, io);
    }
    (void)unlink(path.c_str());  // moved (linked) into the database, or failed
    return s;
  }

  // ---- the claim log's files (log_mu_) --------------------------------------

  std::string LogPath(uint64_t number) const {
    return dir_ + "/" + internal::ClaimLogName(number);
  }

  Status LogError(std::string_view what, int err) const {
    std::string m = Context("claim log") + ": " + std::string(what) + ": " + std::strerror(err);
    if (err == ENOSPC || err == EDQUOT) {
      return Status::ResourceExhausted(std::move(m) + " (the disk is full: free space" +
                                       std::string(kDidNotHappen));
    }
    return Status::Unavailable(std::move(m));
  }

  // Makes the directory's entries durable (a new or deleted log); best effort.
  void SyncDirectory() const {
    const int d = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d < 0) return;
    (void)fsync(d);
    close(d);
  }

  // With log_mu_ held.
  Status OpenLogFile() {
    const uint64_t number = log_number_ + 1;
    const std::string path = LogPath(number);
    const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) return LogError("cannot create " + internal::ClaimLogName(number), errno);
    log_number_ = number;
    log_fd_ = fd;
    log_size_ = 0;
    log_files_.push_back({number, clock_->NowMillis()});
    log_floor_.store(log_files_.front().created);
    if (options_.sync != SyncMode::kNone) SyncDirectory();
    return Status::Ok();
  }

  // With log_mu_ held. With sync=interval the descriptor goes to SyncLoop,
  // which syncs and closes it: the log may stay (a materialization that closed
  // it and then failed keeps it until one succeeds), and what it holds is
  // owed a sync within the interval like the current log's.
  void CloseLogFile() {
    if (log_fd_ < 0) return;
    if (options_.sync == SyncMode::kInterval) {
      closed_unsynced_.push_back(log_fd_);
    } else {
      close(log_fd_);
    }
    log_fd_ = -1;
  }

  // With log_mu_ held, after an append wrote part of its frame: the current log
  // is given up. One that holds no whole frame (the part is all it holds) is
  // deleted too, giving its room back: on a disk full but for a page freed now
  // and then, each such part stayed in a log of its own, every page freed went
  // to the next one and the claims were never logged (tests/rocksdb_hardening_test.cc
  // `RoomThatComesBackWhileAppendsFailIsNotKeptByTheirParts`). A reader beside
  // reads nothing of it (a cut), or finds it gone (a read-only open skips such a
  // log), and a crash before the unlink leaves a log the next open folds as empty.
  void GiveUpLog() {
    if (log_size_ != 0 || log_files_.empty() || log_files_.back().number != log_number_) {
      CloseLogFile();
      return;
    }
    close(log_fd_);  // nothing in it to sync
    log_fd_ = -1;
    if (unlink(LogPath(log_number_).c_str()) != 0 && errno != ENOENT) return;  // a later drop
    log_files_.pop_back();
    log_floor_.store(log_files_.empty() ? kNoLogFloor : log_files_.front().created);
  }

  // Appends one frame (one write) to the current log, starting one when there is
  // none; synced when `sync`. A write that fails once part of the frame is in the
  // file gives the file up (GiveUpLog): the part stays at its end, where every
  // reader stops (a cut), and the next frame starts a new log. Bytes once written
  // are never changed, since a read-only open beside the writer may have read them
  // (it takes no lock): cutting the part off and writing the next frames in its
  // place gave such a reader half a frame, then the rest of another, a damaged
  // frame followed by a whole one, and its open failed with DataLoss.
  Status AppendToLog(std::string_view frame, bool sync, bool* appended = nullptr) {
    std::lock_guard l(log_mu_);
    if (log_fd_ < 0) DEDUP_RETURN_IF_ERROR(OpenLogFile());
    size_t done = 0;
    while (done < frame.size()) {
      const ssize_t n = write(log_fd_, frame.data() + done, frame.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : ENOSPC;
        if (done != 0) GiveUpLog();
        return LogError("cannot append", err);
      }
      done += static_cast<size_t>(n);
    }
    log_size_ += frame.size();
    log_bytes_.store(log_size_, std::memory_order_relaxed);
    if (appended != nullptr) *appended = true;
    if (sync && fdatasync(log_fd_) != 0) return LogError("cannot sync", errno);
    return Status::Ok();
  }

  // Before a record is deleted from the database: while any claim log exists,
  // appends (and, unless sync=none, syncs) a forget entry for `key` up to `fence`.
  // *logged: the entry is in the log (its sync may still have failed).
  Status LogForget(std::string_view key, uint64_t fence, bool* logged) {
    {
      std::lock_guard l(log_mu_);
      if (log_files_.empty()) return Status::Ok();
    }
    internal::ClaimLogFrame f;
    f.AddForget(key, fence);
    return AppendToLog(f.Finish(), options_.sync != SyncMode::kNone, logged);
  }

  // Forget's error once its forget entry is in a claim log (the sync or the
  // deletion that follow failed): the record is still there, but the next
  // open folds the entry in, and the key's logged claim is gone then. Allowed
  // (store.h: after an error nothing about the record may be assumed; a retry
  // is safe), but the error must not promise that nothing happened.
  static Status ForgetLoggedNotApplied(const Status& e) {
    std::string m = e.message();
    if (const size_t at = m.find(kDidNotHappen); at != std::string::npos) {
      m.replace(at, kDidNotHappen.size(), ")");
    }
    return Status(e.code(), m + ". The claim log already holds this forget: the key's claim may "
                                "be gone at the store's next open even so; retry the forget");
  }

  // Deletes the logs numbered up to `cut` (stops at one that cannot be), once
  // their claims are durable in the database. Written there through the WAL
  // (fewer than kMinIngest: CompactNow, a close, a log past kMaxLogBytes), they
  // are not yet synced with sync=interval, whose promise is that a power loss
  // loses the last interval only: a claim the log held synced for longer
  // would be lost with the log. So the WAL is synced first (sync=none promises
  // nothing on a power loss; sync=always wrote them synced; an ingested file
  // is synced by the ingestion). If that fails the logs stay, to be folded in
  // at the next open.
  void DropLogsUpTo(uint64_t cut) {
    if (options_.sync == SyncMode::kInterval &&
        (write_errors_->failed() || !db_->SyncWAL().ok())) {
      return;
    }
    std::lock_guard l(log_mu_);
    bool dropped = false;
    while (!log_files_.empty() && log_files_.front().number <= cut) {
      if (log_files_.front().number == log_number_) CloseLogFile();
      if (unlink(LogPath(log_files_.front().number).c_str()) != 0 && errno != ENOENT) break;
      log_files_.pop_front();
      dropped = true;
    }
    log_floor_.store(log_files_.empty() ? kNoLogFloor : log_files_.front().created);
    log_bytes_.store(log_fd_ >= 0 ? log_size_ : 0, std::memory_order_relaxed);
    if (dropped) SyncDirectory();
  }

  // At open, before the index is loaded: every claim of the logs an earlier
  // process left goes into the database, unless the database holds a record of
  // its key with a fence as high (a later completion, extend, release, floor or
  // claim: fences only grow) or a forget entry after it removed it; in one
  // synced write. Then the logs are deleted. Run again after a crash in between,
  // it writes nothing new.
  // Each key's last claim in the logs `numbers` (none when a forget entry
  // after it removed it). With `gone_ok`, a log deleted meanwhile is skipped.
  Status LastClaims(const std::vector<uint64_t>& numbers, bool gone_ok,
                    std::map<std::string, std::optional<Record>>* out) {
    std::map<std::string, std::optional<Record>>& last = *out;
    for (uint64_t n : numbers) {
      internal::ClaimLogDamage damage;
      std::string undecodable;  // the first claim whose record does not decode
      Status read = internal::ReadClaimLog(
          LogPath(n), [&](uint8_t type, std::string_view key, std::string_view value) {
            if (type == internal::kClaimEntry) {
              Record r;
              std::string why;
              // In a frame whose checksum matches: no crash leaves it (skipped
              // silently before, the claim lost). Salvage skips it.
              if (!DecodeRecord(value, &r, &why)) {
                if (undecodable.empty()) {
                  undecodable = "a claim of key " + QuoteBytes(key) +
                                " whose record cannot be decoded (" + why +
                                ") in a frame whose checksum matches";
                }
                return;
              }
              std::optional<Record>& slot = last[std::string(key)];
              if (!slot || r.fence >= slot->fence) slot = std::move(r);
            } else {  // kForgetEntry, of 8 bytes (ReadClaimLog checked both)
              std::optional<Record>& slot = last[std::string(key)];
              uint64_t fence = 0;
              for (int i = 0; i < 8; ++i) {
                fence |= static_cast<uint64_t>(static_cast<unsigned char>(value[i])) << (8 * i);
              }
              if (slot && slot->fence <= fence) slot.reset();
            }
          },
          &damage);
      if (!read.ok() && gone_ok && access(LogPath(n).c_str(), F_OK) != 0 && errno == ENOENT) {
        continue;  // deleted before it could be opened
      }
      DEDUP_RETURN_IF_ERROR(read);
      // Damage before the end is not what a crash leaves (the WAL's rule, too):
      // the frames after it would be dropped silently, among them forgets
      // whose claims would come back. Salvage skips only the damaged bytes.
      if ((damage.at >= 0 || !undecodable.empty()) &&
          options_.wal_recovery != WalRecovery::kSalvage) {
        return Status::DataLoss(
            Context("open") + ": claim log " + internal::ClaimLogName(n) + " has " +
            (damage.at >= 0 ? damage.what : undecodable) + ". Nothing was "
            "changed. To open the store anyway and lose that frame's claims and forgets (their "
            "messages may run again, a forgotten key may come back), open rocksdb:" +
            options_.path + "?recovery=salvage once, after copying the directory aside");
      }
    }
    return Status::Ok();
  }

  // A read-only open (dedup inspect beside a running writer): the logs' claims
  // (`last`, read before the database was opened: OpenDb) that the database
  // does not hold yet are kept in memory, as logged claims, so that Inspect
  // sees them; nothing is written or deleted.
  Status OverlayClaimLogs(std::map<std::string, std::optional<Record>>& last) {
    std::string rkey;
    for (auto& [key, rec] : last) {
      if (!rec) continue;
      EncodeRecordKey(key, &rkey);
      Record on_disk;
      bool found = false;
      Status read = Read(rkey, key, "open: reading the claim log", &on_disk, &found);
      if (read.code() == StatusCode::kDataLoss) continue;
      DEDUP_RETURN_IF_ERROR(read);
      if (found && on_disk.fence >= rec->fence) continue;
      const KeySlot slot = SlotOf(key);
      Stripe& st = stripes_[slot.stripe];
      st.present.insert(slot.fingerprint);
      st.logged.insert_or_assign(key, Pending(std::move(*rec), 0, slot.hash));
    }
    return Status::Ok();
  }

  Status FoldClaimLogs(const std::vector<uint64_t>& numbers) {
    std::map<std::string, std::optional<Record>> last;
    DEDUP_RETURN_IF_ERROR(LastClaims(numbers, /*gone_ok=*/false, &last));
    rocksdb::WriteBatch batch;
    std::string rkey, value;
    for (const auto& [key, rec] : last) {
      if (!rec) continue;
      EncodeRecordKey(key, &rkey);
      Record on_disk;
      bool found = false;
      Status read = Read(rkey, key, "open: folding the claim log", &on_disk, &found);
      if (read.code() == StatusCode::kDataLoss) continue;  // left as it is, for an operator
      DEDUP_RETURN_IF_ERROR(read);
      if (found && on_disk.fence >= rec->fence) continue;
      EncodeRecord(*rec, &value);
      rocksdb::Status s = batch.Put(cf_, rkey, value);
      if (!s.ok()) return FromRocks(s, Context("open: folding the claim log"));
    }
    if (batch.Count() > 0) {
      rocksdb::WriteOptions wo;
      wo.sync = true;
      rocksdb::Status s = db_->Write(wo, &batch);
      if (!s.ok()) return FromRocks(s, Context("open: folding the claim log"));
    }
    for (uint64_t n : numbers) {
      if (unlink(LogPath(n).c_str()) != 0 && errno != ENOENT) {
        return LogError("open: cannot delete " + internal::ClaimLogName(n), errno);
      }
    }
    SyncDirectory();
    log_number_ = numbers.empty() ? 0 : numbers.back();
    log_floor_.store(kNoLogFloor);
    return Status::Ok();
  }

  // The writer sleeps without a timeout while nothing is pending, so an idle store
  // costs no wake-ups; the claim that makes the pending set non-empty wakes it
  // (Defer). writer_idle_ is set before pending_count_ is read and the claim reads
  // it after its increment (both sequentially consistent), so one of the two sees
  // the other: no claim is left waiting for a writer that sleeps.
  void WakeWriter() {
    { std::lock_guard l(commit_loop_mu_); }
    commit_cv_.notify_all();
  }

  void GroupCommitLoop() {
    std::unique_lock l(commit_loop_mu_);
    std::chrono::milliseconds interval = kGroupCommitInterval;
    while (!stop_commit_) {
      writer_idle_.store(true);
      commit_cv_.wait(l, [this] { return stop_commit_ || pending_count_.load() > 0; });
      writer_idle_.store(false);
      if (stop_commit_) break;
      commit_cv_.wait_for(l, interval, [this] { return stop_commit_; });
      if (stop_commit_) break;
      l.unlock();
      // A failed commit is retried with the next batch; RocksDB also records the
      // error and fails later writes, and so the operations that return it.
      // While commits fail (a full disk) the rounds back off, doubling up to
      // kMaxCommitBackoff, and write the kept batch again (CommitPending).
      commit_round_.fetch_add(1, std::memory_order_relaxed);
      bool ok = LogPending().ok();
      // Past the bounds, the materializer writes the logged claims into the
      // database while this thread goes on logging.
      if (ok && (PastLogBounds() || LogTooOld())) {
        WantMaterialize();
      }
      interval = ok ? kGroupCommitInterval : std::min(interval * 2, kMaxCommitBackoff);
      l.lock();
    }
  }

  // Whether the logged claims, or their logs' bytes, passed the bounds at which
  // the materializer writes them into the database.
  bool PastLogBounds() const {
    return logged_count_.load(std::memory_order_relaxed) > kMaxLogged ||
           log_bytes_.load(std::memory_order_relaxed) > kMaxLogBytes;
  }

  // Whether the oldest claim log is older than kMaxLogAgeMs by the store's
  // clock (none: false; min() is the floor of an open still folding).
  bool LogTooOld() const {
    const int64_t floor = log_floor_.load();
    if (floor == kNoLogFloor || floor == std::numeric_limits<int64_t>::min()) return false;
    return clock_->NowMillis() - floor >= kMaxLogAgeMs;
  }

  // Wakes the materializer (a thread of its own, so that the writer's log
  // rounds go on while it writes: run by the writer, a materialization of
  // 65,536 claims left every claim pending meanwhile, and a claiming thread
  // then passed kMaxPending and logged them itself).
  void WantMaterialize() {
    {
      std::lock_guard l(mat_loop_mu_);
      if (mat_wanted_) return;
      mat_wanted_ = true;
    }
    mat_cv_.notify_all();
  }

  void MaterializeLoop() {
    std::unique_lock l(mat_loop_mu_);
    std::chrono::milliseconds backoff{0};
    while (true) {
      // Woken for the bounds or an old log (WantMaterialize), or every
      // kLogAgeCheckEvery to look at the oldest log's age while no claim comes.
      mat_cv_.wait_for(l, kLogAgeCheckEvery, [this] { return stop_mat_ || mat_wanted_; });
      if (stop_mat_) break;
      mat_wanted_ = false;
      l.unlock();
      const bool ok = MaterializeLogged(/*hard=*/false, /*aged=*/true).ok();
      l.lock();
      if (ok) {
        backoff = std::chrono::milliseconds(0);
        continue;
      }
      // A failed write (a full disk) is tried again, backing off as the writer does.
      backoff = std::min(std::max(backoff * 2, kGroupCommitInterval), kMaxCommitBackoff);
      mat_cv_.wait_for(l, backoff, [this] { return stop_mat_; });
      mat_wanted_ = true;
    }
  }

  void StopGroupCommit() {
    if (committer_.joinable()) {
      {
        std::lock_guard l(commit_loop_mu_);
        stop_commit_ = true;
      }
      commit_cv_.notify_all();
      committer_.join();
    }
    if (materializer_.joinable()) {
      {
        std::lock_guard l(mat_loop_mu_);
        stop_mat_ = true;
      }
      mat_cv_.notify_all();
      materializer_.join();
    }
    // Claims into the database and the logs deleted: a clean close leaves no log
    // (unless the write failed: then the next open folds them in).
    if (db_ != nullptr) (void)MaterializeClaims();
  }

  // Makes epoch + 1 durable and takes it for this process's fences.
  Status AdvanceFenceEpoch() {
    rocksdb::PinnableSlice v;
    rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), cf_, kMetaFenceEpochKey, &v);
    uint64_t epoch = 0;
    if (s.ok()) {
      const std::string_view text = v.ToStringView();
      auto [p, err] = std::from_chars(text.data(), text.data() + text.size(), epoch);
      if (err != std::errc() || p != text.data() + text.size()) {
        return Status::DataLoss(Context("open") + ": unreadable fence epoch " + QuoteBytes(text));
      }
    } else if (!s.IsNotFound()) {
      return FromRocks(s, Context("open: reading the fence epoch"));
    }
    ++epoch;
    if (epoch >= (uint64_t{1} << 31)) {
      return Status::FailedPrecondition(Context("open") + ": fence epoch exhausted");
    }
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = db_->Put(wo, cf_, kMetaFenceEpochKey, std::to_string(epoch));
    if (!s.ok()) return FromRocks(s, Context("open: writing the fence epoch"));
    fence_floor_ = (epoch << 32) + 1;
    fence_ceiling_.store((epoch + 1) << 32, std::memory_order_release);
    committer_ = std::thread([this] { GroupCommitLoop(); });
    materializer_ = std::thread([this] { MaterializeLoop(); });
    // Named, so that top -H, perf and /proc tell them apart (15 characters at most).
    (void)pthread_setname_np(committer_.native_handle(), "dedup-claimlog");
    (void)pthread_setname_np(materializer_.native_handle(), "dedup-materlz");
    return Status::Ok();
  }

  size_t StripeIndex(std::string_view key) const { return SlotOf(key).stripe; }
  std::mutex& StripeFor(std::string_view key) { return stripes_[StripeIndex(key)].mu; }

  // The current record of `key`, with its stripe locked: a remembered copy, known
  // absence, or a Get. *cur is null when there is no record; `scratch` holds a
  // record read from disk.
  Status Find(Stripe& st, KeySlot slot, std::string_view rkey, std::string_view key,
              std::string_view op, Record** cur, Record* scratch) {
    const HashedKey hk{key, slot.hash};
    // (empty() reads the stripe, find() the table's own memory: a cache miss.)
    if (auto it = st.pending.empty() ? st.pending.end() : st.pending.find(hk);
        it != st.pending.end()) {
      *cur = &it->second.rec;
      return Status::Ok();
    }
    *cur = nullptr;
    // Every key with a record anywhere (logged, remembered, on disk) has its
    // fingerprint here: a new key stops at this one lookup.
    if (!st.present.contains(slot.fingerprint)) return Status::Ok();
    // A logged claim before the copies: a copy of the key there is older.
    if (auto it = st.logged.empty() ? st.logged.end() : st.logged.find(hk);
        it != st.logged.end()) {
      *cur = &it->second.rec;
      return Status::Ok();
    }
    if (auto it = st.recent.find(hk); it != st.recent.end()) {
      *cur = &it->second;
      return Status::Ok();
    }
    bool found = false;
    DEDUP_RETURN_IF_ERROR(Read(rkey, key, op, scratch, &found));
    if (found) *cur = scratch;
    return Status::Ok();
  }

  // Notes that `r` is now the record of `key` on disk. With its stripe locked.
  // Whatever key held its entry before is forgotten: a forgotten copy only
  // costs a Get later.
  static void Remember(Stripe& st, KeySlot slot, std::string_view key, const Record& r) {
    st.present.insert(slot.fingerprint);
    const HashedKey hk{key, slot.hash};
    if (r.result.size() > kMaxCachedResult) {
      if (auto* e = st.recent.find(hk); e != nullptr) st.recent.erase(e);
      return;
    }
    RecentCopies::Entry& e = st.recent.Place(hk);
    if (e.first != key) e.first.assign(key);
    e.second = r;
  }

  // Remember for a record whose own copy is no longer needed (a committed
  // claim), with its fingerprint already present; `hk` carries the key's hash
  // computed by its claim, not a second hash of every claimed key.
  static void RememberMoved(Stripe& st, const HashedKey& hk, Record&& r) {
    const std::string_view key = hk.key;
    if (r.result.size() > kMaxCachedResult) {
      if (auto* e = st.recent.find(hk); e != nullptr) st.recent.erase(e);
      return;
    }
    RecentCopies::Entry& e = st.recent.Place(hk);
    if (e.first != key) e.first.assign(key);
    e.second = std::move(r);
  }

  // One record written as DB::Put writes it (one WriteBatch, write_options_),
  // from the thread's reused WriteBatch: DB::Put built and freed one per call.
  rocksdb::Status PutOne(std::string_view rkey, std::string_view value) {
    thread_local rocksdb::WriteBatch one;
    one.Clear();
    rocksdb::Status s = one.Put(cf_, rocksdb::Slice(rkey.data(), rkey.size()),
                                rocksdb::Slice(value.data(), value.size()));
    if (s.ok()) s = WriteKept(write_options_, &one);
    return s;
  }

  // Writes a WriteBatch that is kept from call to call (its buffer reused); one
  // past kMaxKeptBatchBytes is dropped after its write, so that a rare huge
  // batch does not keep its memory (`keep_failed`: not when the write failed,
  // the group commit writes it again).
  rocksdb::Status WriteKept(const rocksdb::WriteOptions& options, rocksdb::WriteBatch* batch,
                            bool keep_failed = false) {
    rocksdb::Status s = db_->Write(options, batch);
    if (batch->GetDataSize() > kMaxKeptBatchBytes && (s.ok() || !keep_failed)) {
      *batch = rocksdb::WriteBatch();
    }
    return s;
  }

  // Fills every stripe's fingerprints from the keys on disk.
  Status LoadIndex() {
    rocksdb::ReadOptions ro;
    ro.fill_cache = false;
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(ro, cf_));
    const std::string first(1, internal::kRecordKeyPrefix);
    for (it->Seek(first); it->Valid(); it->Next()) {
      const std::string_view k = it->key().ToStringView();
      if (k.empty() || k[0] != internal::kRecordKeyPrefix) break;
      const KeySlot slot = SlotOf(k.substr(1));
      stripes_[slot.stripe].present.insert(slot.fingerprint);
    }
    if (!it->status().ok()) return FromRocks(it->status(), Context("open: loading the key index"));
    return Status::Ok();
  }

  // A batch given to CompleteWithBatch may not write to the "dedup" column
  // family (FamilyWriteFinder says why); checked before anything is locked or
  // written. Its entries are named by position and kind, never by key or value.
  Status CheckCallersBatch(const rocksdb::WriteBatch& batch) const {
    FamilyWriteFinder finder(cf_->GetID());
    const rocksdb::Status s = batch.Iterate(&finder);
    if (finder.found() != nullptr) {
      return Status::InvalidArgument(
          Context("complete") + ": entry " + std::to_string(finder.entry()) + " of the batch (" +
          finder.found() + ") writes to the \"dedup\" column family, which only the store may "
          "write; nothing was written, and the claim is unchanged");
    }
    if (!s.ok()) {
      return Status::InvalidArgument(Context("complete") + ": the batch cannot be read (" +
                                     s.ToString() + "); nothing was written, and the claim is "
                                     "unchanged");
    }
    return Status::Ok();
  }

  std::string Context(std::string_view op) const {
    return "rocksdb " + options_.path + ": " + std::string(op);
  }

  Status Corrupt(std::string_view op, std::string_view key, const std::string& why) const {
    return Status::DataLoss(Context(op) + ": the record of key " + QuoteBytes(key) +
                            " cannot be decoded (" + why + "); nothing was changed");
  }

  // A claim DecideClaim refused: the record's fence or attempt at its largest.
  Status AtLimit(std::string_view op, std::string_view key, const std::string& what) const {
    return Status::DataLoss(Context(op) + ": the record of key " + QuoteBytes(key) + ": its " +
                            what + "; nothing was changed");
  }

  // Reads and decodes the record at `rkey` ('r' + key). *found false when none.
  Status Read(std::string_view rkey, std::string_view key, std::string_view op, Record* r,
              bool* found) {
    rocksdb::PinnableSlice value;
    rocksdb::Status s =
        db_->Get(read_options_, cf_, rocksdb::Slice(rkey.data(), rkey.size()), &value);
    if (s.IsNotFound()) {
      *found = false;
      return Status::Ok();
    }
    if (!s.ok()) return FromRocks(s, Context(op));
    std::string why;
    if (!DecodeRecord(value.ToStringView(), r, &why)) return Corrupt(op, key, why);
    *found = true;
    return Status::Ok();
  }

  // An owner-checked write: `decide` changes the record and says kOk, or says
  // kLost and nothing is written. With `batch`, the record is committed together
  // with the batch's writes; on kLost or an error, `batch` is left as it was given.
  template <typename Fn>
  StatusOr<WriteResult> Update(std::string_view key, std::string_view op,
                               rocksdb::WriteBatch* batch, Fn&& decide) {
    thread_local std::string rkey, value;
    thread_local Record scratch, rec;
    EncodeRecordKey(key, &rkey);
    const KeySlot slot = SlotOf(key);
    Stripe& st = stripes_[slot.stripe];
    std::unique_lock lock(st.mu);
    AwaitMaterialized(st, HashedKey{key, slot.hash}, lock);
    Record* cur = nullptr;
    DEDUP_RETURN_IF_ERROR(Find(st, slot, rkey, key, op, &cur, &scratch));
    if (cur == nullptr) return WriteResult::kLost;
    // Decide on a copy: the remembered record changes only once the write landed.
    rec = *cur;
    const int64_t now = clock_->NowMillis();
    if (decide(&rec, now) == WriteResult::kLost) return WriteResult::kLost;
    WaitInFlight(st, HashedKey{key, slot.hash});
    EncodeRecord(rec, &value);
    rocksdb::Status s;
    if (batch == nullptr) {
      s = PutOne(rkey, value);
    } else {
      batch->SetSavePoint();
      s = batch->Put(cf_, rkey, value);
      if (s.ok()) s = db_->Write(write_options_, batch);
      if (s.ok()) {
        (void)batch->PopSavePoint();
      } else {
        (void)batch->RollbackToSavePoint();
      }
    }
    if (!s.ok()) return FromRocks(s, Context(op));
    Settle(st, slot, key, rec);
    return WriteResult::kOk;
  }

  void SyncLoop() {
    std::unique_lock l(sync_mu_);
    while (!stop_) {
      sync_cv_.wait_for(l, options_.sync_interval, [this] { return stop_; });
      if (stop_) break;
      l.unlock();
      // A failed sync is retried on the next tick; RocksDB also records the
      // error and fails later writes if the log can no longer be written.
      if (!write_errors_->failed()) (void)db_->SyncWAL();
      // The claim log too, on a descriptor of its own: appends do not wait for
      // the sync (holding log_mu_ through it held up the writer's rounds).
      // And the logs closed since the last tick (CloseLogFile), then closed.
      int fd = -1;
      std::vector<int> closed;
      {
        std::lock_guard ll(log_mu_);
        if (log_fd_ >= 0) fd = dup(log_fd_);
        closed.swap(closed_unsynced_);
      }
      if (fd >= 0) closed.push_back(fd);
      for (int c : closed) {
        (void)fdatasync(c);
        close(c);
      }
      l.lock();
    }
  }

  const RocksDBStoreOptions options_;
  // options_.path made absolute at Open: resolved again against the working
  // directory on every append, a relative path sent the claim log elsewhere once
  // the process changed directory (every append failed; the claims were never
  // logged and nothing said so).
  const std::string dir_;
  // The directory's entry in OpenDirs(), held until the store is destroyed.
  std::optional<std::pair<dev_t, ino_t>> dir_id_;
  Clock* const clock_;
  rocksdb::DB* db_ = nullptr;
  rocksdb::ColumnFamilyHandle* cf_ = nullptr;  // "dedup", owned through handles_
  std::vector<rocksdb::ColumnFamilyHandle*> handles_;
  rocksdb::WriteOptions write_options_;
  rocksdb::ReadOptions read_options_;
  std::unique_ptr<Stripe[]> stripes_;
  std::shared_ptr<WriteErrorListener> write_errors_ = std::make_shared<WriteErrorListener>();

  // Group commit of claims (see the top of this file).
  uint64_t fence_floor_ = 1;  // (epoch << 32) + 1, set at open
  // The highest fence the next open starts above: (durable epoch + 1) << 32.
  // Raised (RaiseFenceCeiling) under fence_epoch_mu_, read by claims without it.
  std::atomic<uint64_t> fence_ceiling_{uint64_t{1} << 32};
  std::mutex fence_epoch_mu_;
  std::thread committer_;
  std::mutex commit_loop_mu_;
  std::condition_variable commit_cv_;
  bool stop_commit_ = false;  // guarded by commit_loop_mu_
  std::mutex commit_mu_;      // one CommitPending or LogPending at a time
  // One materialization at a time (MaterializeLogged, MaterializeClaims,
  // CommitAll); taken before commit_mu_.
  std::mutex mat_mu_;
  uint64_t last_mat_ = 0;  // guarded by mat_mu_
  std::thread materializer_;  // MaterializeLoop
  std::mutex mat_loop_mu_;
  std::condition_variable mat_cv_;
  bool mat_wanted_ = false;  // guarded by mat_loop_mu_
  bool stop_mat_ = false;    // guarded by mat_loop_mu_
  // Materializations up to this one are done; stored under gen_mu_ (for
  // gen_cv_), read without it.
  std::atomic<uint64_t> mat_done_{0};
  // MaterializeLogged's scratch (mat_mu_).
  std::string mat_buf_;
  std::vector<CommitEntry> mat_entries_;
  std::vector<size_t> mat_touched_;
  uint64_t last_gen_ = 0;     // guarded by commit_mu_
  std::mutex gen_mu_;
  std::condition_variable gen_cv_;
  // Writer batches up to this one are done; stored under gen_mu_ (for gen_cv_),
  // read without it.
  std::atomic<uint64_t> done_gen_{0};
  std::atomic<int64_t> pending_count_{0};  // records in all pending maps
  std::atomic<uint64_t> commit_round_{0};  // the background writer's rounds
  std::atomic<bool> writer_idle_{false};   // the writer sleeps until a claim wakes it
  std::atomic<uint64_t> dirty_mask_[kStripes / 64] = {};  // a bit per stripe (MarkDirty)
  // Sorts a batch's entries into key order. Keys compared as strings made the
  // sort a fifth of the writer's instructions (callgrind, claims alone): they
  // share long prefixes ("r" + "task_id:0000..."), so every comparison was a
  // memcmp call over them. The entries are ordered by the 8 bytes that follow
  // the prefix all keys of the batch share, as one big-endian integer (bytes
  // past a key's end count as 0), and only equal integers compare the keys:
  // a smaller integer means a smaller key (the first differing byte is smaller,
  // or the key ended there, a prefix of the other), so the order is the keys'.
  static void SortByKey(const char* buf, std::vector<CommitEntry>* entries) {
    if (entries->size() < 2) return;
    const CommitEntry& first = entries->front();
    size_t common = first.key_len;
    for (const CommitEntry& e : *entries) {
      size_t i = 0;
      const size_t n = std::min(common, e.key_len);
      while (i < n && buf[e.at + i] == buf[first.at + i]) ++i;
      common = i;
    }
    for (CommitEntry& e : *entries) {
      uint64_t v = 0;
      for (size_t i = 0; i < 8; ++i) {
        const size_t at = common + i;
        v = (v << 8) | (at < e.key_len ? static_cast<uint8_t>(buf[e.at + at]) : 0u);
      }
      e.order = v;
    }
    std::sort(entries->begin(), entries->end(), [buf](const CommitEntry& a, const CommitEntry& b) {
      if (a.order != b.order) return a.order < b.order;
      return std::string_view(buf + a.at, a.key_len) < std::string_view(buf + b.at, b.key_len);
    });
  }
  // CommitPending's scratch (guarded by commit_mu_): the batch's keys and values
  // back to back, and where each one starts.
  std::string commit_buf_;
  std::vector<CommitEntry> commit_entries_;
  rocksdb::WriteBatch commit_batch_;
  // The batch whose write failed, still in commit_batch_ (0: none), and how many
  // records it holds: a round that finds exactly those, unchanged (Pending::kept),
  // writes it again without encoding them. Guarded by commit_mu_.
  uint64_t kept_gen_ = 0;
  size_t kept_count_ = 0;

  // The claim log (LogPending). log_mu_ is taken last, after any other lock.
  struct LogFile {
    uint64_t number;
    int64_t created;  // the store's clock when it was started
  };
  std::mutex log_mu_;
  int log_fd_ = -1;                  // the current log, appended to (-1: none open)
  uint64_t log_number_ = 0;          // the highest log number used
  uint64_t log_size_ = 0;            // bytes in the current log
  std::deque<LogFile> log_files_;    // logs on disk, oldest first (this process's)
  std::vector<int> closed_unsynced_;  // sync=interval: closed logs for SyncLoop to sync
  std::atomic<uint64_t> log_bytes_{0};     // log_size_, for the writer's bound
  std::atomic<int64_t> logged_count_{0};   // claims in the stripes' logged maps
  // For the expiry filter: when the oldest log on disk was started (kNoLogFloor:
  // none; lowest while an earlier process's logs wait for the fold).
  std::atomic<int64_t> log_floor_{kNoLogFloor};
  // LogPending's scratch (commit_mu_).
  internal::ClaimLogFrame log_frame_;
  std::string log_value_;
  std::vector<size_t> log_touched_;
  std::vector<size_t> log_left_;

  std::thread syncer_;
  std::mutex sync_mu_;
  std::condition_variable sync_cv_;
  bool stop_ = false;  // guarded by sync_mu_
};

StatusOr<std::vector<ClaimResult>> RocksDBStoreImpl::ClaimBatch(
    std::span<const ClaimRequest> reqs) {
  DEDUP_RETURN_IF_ERROR(ValidateClaimBatch(reqs));
  DEDUP_RETURN_IF_ERROR(CheckWritable("claim batch"));
  std::vector<ClaimResult> out;
  if (reqs.empty()) return out;
  out.reserve(reqs.size());

  const BatchKeys b(reqs);
  const size_t n = b.size();
  std::vector<Token> fresh(reqs.size());
  for (Token& t : fresh) t = Token::Random();

  // Committed in the background unless a request needs its attempt durable;
  // then written before it returns, after any writer batch carrying its keys.
  bool deferred = true;
  for (const ClaimRequest& r : reqs) deferred = deferred && Deferred(r);
  // The backlog is committed before the batch decides (as Claim): a failure
  // leaves none of its claims held.
  if (deferred) DEDUP_RETURN_IF_ERROR(CommitIfBacklogged());
  std::vector<std::unique_lock<std::mutex>> locks;
  LockBatch(b, /*before_write=*/!deferred, &locks);

  // Records from memory where the index has them; one MultiGet for the rest.
  std::vector<std::optional<Record>> cur(n);
  std::vector<size_t> to_read;
  for (size_t k = 0; k < n; ++k) {
    Stripe& st = stripes_[b.slots[k].stripe];
    const HashedKey hk = b.Hashed(k);
    if (auto it = st.pending.empty() ? st.pending.end() : st.pending.find(hk);
        it != st.pending.end()) {
      cur[k] = it->second.rec;
    } else if (!st.present.contains(b.slots[k].fingerprint)) {
      // a new key
    } else if (auto lt = st.logged.empty() ? st.logged.end() : st.logged.find(hk);
               lt != st.logged.end()) {
      cur[k] = lt->second.rec;
    } else if (auto e = st.recent.find(hk); e != st.recent.end()) {
      cur[k] = e->second;
    } else {
      to_read.push_back(k);
    }
  }
  if (!to_read.empty()) {
    const size_t m = to_read.size();
    std::vector<rocksdb::Slice> keys;
    keys.reserve(m);
    for (size_t k : to_read) {
      const std::string_view rk = b.RecordKey(k);
      keys.emplace_back(rk.data(), rk.size());
    }
    std::vector<rocksdb::PinnableSlice> values(m);
    std::vector<rocksdb::Status> statuses(m);
    db_->MultiGet(read_options_, cf_, m, keys.data(), values.data(), statuses.data());
    for (size_t j = 0; j < m; ++j) {
      const size_t k = to_read[j];
      if (statuses[j].IsNotFound()) continue;
      if (!statuses[j].ok()) return FromRocks(statuses[j], Context("claim batch"));
      std::string why;
      cur[k].emplace();
      if (!DecodeRecord(values[j].ToStringView(), &*cur[k], &why)) {
        return Corrupt("claim batch", b.keys[k], why);
      }
    }
  }

  // Decide in order against what the batch has written so far, so that a key
  // repeated in the batch answers as if claimed one after the other.
  const int64_t now = clock_->NowMillis();
  std::vector<bool> written(n, false);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const size_t k = b.of_request[i];
    std::optional<Record>& c = cur[k];
    Record next;
    bool write = false;
    std::string at_limit;
    out.push_back(DecideClaim(c ? &*c : nullptr, reqs[i], now, fresh[i], &next, &write, &at_limit));
    // Before anything of the batch is written: it fails unchanged.
    if (!at_limit.empty()) [[unlikely]] return AtLimit("claim batch", reqs[i].key, at_limit);
    if (write) {
      DEDUP_RETURN_IF_ERROR(ApplyFenceFloor(stripes_[b.slots[k].stripe], &next, &out.back()));
      c = std::move(next);
      written[k] = true;
    }
  }
  if (deferred) {
    for (size_t k = 0; k < n; ++k) {
      if (written[k]) Defer(stripes_[b.slots[k].stripe], b.slots[k], b.keys[k], std::move(*cur[k]));
    }
    return out;
  }
  DEDUP_RETURN_IF_ERROR(WriteBatchOf(b, cur, written, "claim batch"));
  return out;
}

StatusOr<std::vector<AckedWrite>> RocksDBStoreImpl::CompleteBatch(
    std::span<const CompleteRequest> reqs) {
  DEDUP_RETURN_IF_ERROR(ValidateCompleteBatch(reqs));
  DEDUP_RETURN_IF_ERROR(CheckWritable("complete batch"));
  std::vector<AckedWrite> out;
  if (reqs.empty()) return out;

  const BatchKeys b(reqs);
  const size_t n = b.size();
  std::vector<std::unique_lock<std::mutex>> locks;
  LockBatch(b, /*before_write=*/true, &locks);

  // Decide on copies: the remembered records change only once the write landed.
  std::vector<std::optional<Record>> cur(n);
  Record scratch;
  for (size_t k = 0; k < n; ++k) {
    Record* c = nullptr;
    DEDUP_RETURN_IF_ERROR(Find(stripes_[b.slots[k].stripe], b.slots[k], b.RecordKey(k),
                               b.keys[k], "complete batch", &c, &scratch));
    if (c != nullptr) cur[k] = *c;
  }
  // In order against what the batch has completed so far, so that a key
  // repeated in the batch answers as if completed one after the other. A lost
  // completion leaves the record as it was (DecideComplete changes nothing then).
  const int64_t now = clock_->NowMillis();
  std::vector<bool> written(n, false);
  out.reserve(reqs.size());
  for (size_t i = 0; i < reqs.size(); ++i) {
    const size_t k = b.of_request[i];
    WriteResult w = WriteResult::kLost;
    if (cur[k]) {
      const CompleteRequest& q = reqs[i];
      w = DecideComplete(&*cur[k], q.token, q.retention, q.status, q.result, now);
      if (w == WriteResult::kOk) written[k] = true;
    }
    out.push_back(AckedWrite{w, false});
  }
  DEDUP_RETURN_IF_ERROR(WriteBatchOf(b, cur, written, "complete batch"));
  return out;
}

Status RocksDBStoreImpl::WriteBatchOf(const BatchKeys& b,
                                      const std::vector<std::optional<Record>>& cur,
                                      const std::vector<bool>& written, std::string_view op) {
  // In key order, as the writer's batches: the memtable's skip list can start
  // its search for a key from the one before. The WriteBatch (which copies each
  // key and value) is the thread's, reused.
  thread_local std::vector<size_t> order;
  thread_local std::string value;
  thread_local rocksdb::WriteBatch batch;
  order.clear();
  batch.Clear();
  for (size_t k = 0; k < b.size(); ++k) {
    if (written[k]) order.push_back(k);
  }
  if (order.empty()) return Status::Ok();
  std::sort(order.begin(), order.end(),
            [&b](size_t x, size_t y) { return b.keys[x] < b.keys[y]; });
  for (size_t k : order) {
    const std::string_view rk = b.RecordKey(k);
    EncodeRecord(*cur[k], &value);
    rocksdb::Status s = batch.Put(cf_, rocksdb::Slice(rk.data(), rk.size()), value);
    if (!s.ok()) return FromRocks(s, Context(op));
  }
  rocksdb::Status s = WriteKept(write_options_, &batch);
  if (!s.ok()) return FromRocks(s, Context(op));
  for (size_t k : order) Settle(stripes_[b.slots[k].stripe], b.slots[k], b.keys[k], *cur[k]);
  return Status::Ok();
}

Status RocksDBStoreImpl::OpenDb() {
  const std::string& path = dir_;
  const std::string& shown = options_.path;  // as given, for messages
  const std::string ctx = Context("open");
  const bool read_only = options_.read_only;
  const bool may_create = options_.create_if_missing && !read_only;

  // RocksDB's own messages for these are cryptic; say it plainly first.
  std::error_code ec;
  if (std::filesystem::exists(path, ec) && !std::filesystem::is_directory(path, ec)) {
    return Status::InvalidArgument(ctx + ": path exists and is not a directory");
  }
  DirectoryFacts facts = LookAt(path);
  if (facts.error) {
    const std::string why = ": cannot look into the directory: " + facts.error.message();
    if (facts.error == std::errc::permission_denied ||
        facts.error == std::errc::operation_not_permitted) {
      return Status::PermissionDenied(ctx + why);
    }
    // A path no retry can open (as "cannot create the directory" below): not
    // UNAVAILABLE, which the CLI answers 75 and a supervisor retries for ever.
    if (facts.error == std::errc::too_many_symbolic_link_levels ||
        facts.error == std::errc::filename_too_long) {
      return Status::InvalidArgument(ctx + why);
    }
    return Status::Unavailable(ctx + why);
  }
  const bool unfinished = UnfinishedCreation(facts);
  if (!facts.has_current && !may_create && (facts.data_files.empty() || unfinished)) {
    return Status::NotFound(ctx + ": no store here (" +
                            (!facts.exists ? "no such directory"
                             : unfinished  ? "the creation of a database was cut short"
                                           : "the directory has no RocksDB database") +
                            "); nothing was created");
  }
  // RocksDB starts a new, empty database wherever CURRENT is missing, and later
  // deletes the files it does not know: refuse instead, every time. One state
  // without CURRENT holds nothing to lose: a creation cut short (a crash between
  // RocksDB writing the new database's MANIFEST-000001 and naming it in CURRENT),
  // with no table, blob or log. That one is created again, as it would
  // have been.
  if (!facts.has_current && !facts.data_files.empty() && !unfinished) {
    return Status::DataLoss(ctx + ": the directory holds RocksDB files (" +
                            FewNames(facts.data_files) +
                            ") but no CURRENT file; refusing to open it, which would start an "
                            "empty store and delete them. Restore CURRENT (it names the newest "
                            "MANIFEST-NNNNNN file, followed by a newline) or the whole directory "
                            "from a backup");
  }
  if (!facts.exists) {
    // create_directories fails with EEXIST on a symlink whose target is missing.
    if (std::filesystem::is_symlink(path, ec)) {
      const std::filesystem::path target = std::filesystem::read_symlink(path, ec);
      return Status::InvalidArgument(ctx + ": the path is a symbolic link to " + target.string() +
                                     ", which does not exist; create that directory or point "
                                     "the link at one");
    }
    std::filesystem::create_directories(path, ec);
    if (ec) {
      std::string m = ctx + ": cannot create the directory: " + ec.message();
      if (ec == std::errc::permission_denied || ec == std::errc::read_only_file_system) {
        return Status::PermissionDenied(std::move(m));
      }
      if (ec == std::errc::no_space_on_device) return Status::ResourceExhausted(std::move(m));
      return Status::InvalidArgument(std::move(m));
    }
  }

  // One writable store per directory in this process, whatever the path's
  // spelling (OpenDirs). Taken before RocksDB opens the directory: a second
  // DB::Open beside a live one replays and deletes files under it.
  if (!read_only) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) {
      return Status::Unavailable(ctx + ": cannot look at the directory: " + std::strerror(errno));
    }
    const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
    std::lock_guard l(OpenDirs().mu);
    auto [it, inserted] = OpenDirs().held.try_emplace(id, shown);
    if (!inserted) {
      return Status::FailedPrecondition(
          "rocksdb store at " + shown + " is already open in this process" +
          (it->second != shown ? " (opened as " + it->second + ")" : std::string()));
    }
    dir_id_ = id;
  }

  // Claim logs of an earlier process: until they are folded in (below), the
  // expiry filter drops nothing (RocksDB may flush what it recovers during the
  // open), since a dropped record could be what supersedes a logged claim.
  std::vector<uint64_t> claim_logs;
  DEDUP_RETURN_IF_ERROR(internal::ListClaimLogs(path, &claim_logs));
  if (!read_only && !claim_logs.empty()) log_floor_.store(std::numeric_limits<int64_t>::min());
  // A read-only open takes no lock: a writer beside it goes on logging claims
  // and deleting logs. It reads the logs before it opens the database, so that
  // it misses none of their claims: a writer deletes a log only once its claims
  // are in the database, so a log gone before it was read (skipped) was deleted
  // before the database was opened, whose state then holds them; one read is
  // kept whatever becomes of it. A log started after the listing holds claims
  // made after it, which a reader that came a moment earlier would not see
  // either (as a claim the writer has not logged yet is not seen).
  std::map<std::string, std::optional<Record>> read_only_claims;
  if (read_only) DEDUP_RETURN_IF_ERROR(LastClaims(claim_logs, /*gone_ok=*/true, &read_only_claims));

  rocksdb::DBOptions dbo;
  dbo.create_if_missing = !facts.has_current;
  dbo.create_missing_column_families = !read_only;
  dbo.max_background_jobs = 2;
  dbo.keep_log_file_num = 4;
  dbo.max_total_wal_size = 256u << 20;
  // Concurrent writers share WAL writes and syncs.
  dbo.enable_pipelined_write = true;
  // The leader of a write group inserts every member's records into the memtable
  // itself; the members sleep until it is done. With parallel inserts (RocksDB's
  // default) each member inserts its own and then spins and sched_yield()s until
  // all have: with more writers than cores a member that is not running holds up
  // the whole group, and at 32 threads on 2 cores claim+complete fell into runs
  // of 0.4-0.8 context switches and 7.6-11.4 us of CPU per operation (against
  // 0.04-0.18 and 4.6-4.9 us otherwise), 72 % of its switches in those yields
  // (docs/PERFORMANCE.md, "Write groups with more threads than cores").
  // Durability is unchanged: the WAL is written as before.
  dbo.allow_concurrent_memtable_write = false;
  dbo.listeners.push_back(write_errors_);
  if (options_.env != nullptr) dbo.env = options_.env;
  dbo.info_log = read_only ? InfoLog::Discard() : InfoLog::ForDirectory(path);
  // A torn tail is what a crash leaves; damage before the end is refused (below
  // it is named), unless the operator asked to salvage.
  dbo.wal_recovery_mode = options_.wal_recovery == WalRecovery::kSalvage
                              ? rocksdb::WALRecoveryMode::kPointInTimeRecovery
                              : rocksdb::WALRecoveryMode::kTolerateCorruptedTailRecords;

  // Every column family of the directory must be opened: the application may have
  // its own beside "dedup".
  std::vector<std::string> names;
  if (facts.has_current) {
    rocksdb::Status ls = rocksdb::DB::ListColumnFamilies(dbo, path, &names);
    if (!ls.ok()) {
      if (ls.IsNoSpace()) return FromRocks(ls, ctx);
      return Status::DataLoss(ctx + ": CURRENT names a MANIFEST that cannot be read (" +
                              ls.ToString() + "); refusing to open the directory. Restore it "
                              "from a backup");
    }
  }
  if (names.empty()) names = {rocksdb::kDefaultColumnFamilyName};  // a new database
  if (std::find(names.begin(), names.end(), internal::kColumnFamily) == names.end()) {
    if (read_only || !options_.create_if_missing) {
      return Status::NotFound(ctx + ": the RocksDB database has no \"dedup\" column family "
                              "(no store here); nothing was created");
    }
    // A MANIFEST without "dedup" while tables or logs remain is one that does not
    // match the files (rewritten, or from another database): opening it would
    // delete them as obsolete.
    if (facts.has_current) {
      std::vector<std::string> tables;
      for (const std::string& n : facts.data_files) {
        if (n.ends_with(".sst") || n.ends_with(".blob")) tables.push_back(n);
      }
      if (!tables.empty() || !facts.live_logs.empty()) {
        return Status::DataLoss(
            ctx + ": the MANIFEST has no \"dedup\" column family but the directory holds " +
            FewNames(!tables.empty() ? tables : facts.live_logs) +
            "; refusing to open it (the MANIFEST does not match the files, and opening would "
            "delete them). Restore the directory from a backup");
      }
    }
    names.emplace_back(internal::kColumnFamily);
  }
  std::vector<rocksdb::ColumnFamilyDescriptor> descs;
  size_t dedup_index = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == internal::kColumnFamily) {
      dedup_index = i;
      descs.emplace_back(names[i], RecordFamilyOptions(options_, clock_, &log_floor_));
    } else {
      descs.emplace_back(names[i], rocksdb::ColumnFamilyOptions());
    }
  }

  rocksdb::Status s = read_only ? rocksdb::DB::OpenForReadOnly(dbo, path, descs, &handles_, &db_)
                                : rocksdb::DB::Open(dbo, path, descs, &handles_, &db_);
  if (!s.ok()) {
    db_ = nullptr;
    handles_.clear();
    const std::string m = s.ToString();
    if (s.IsIOError() && m.find("ead-only file system") != std::string::npos) {
      return Status::PermissionDenied(ctx + ": " + m + " (only inspect opens a read-only copy)");
    }
    if (s.IsIOError() && m.find("lock") != std::string::npos) {
      if (m.find("current process") != std::string::npos) {
        return Status::FailedPrecondition("rocksdb store at " + shown +
                                          " is already open in this process (" + m + ")");
      }
      return Status::Unavailable("rocksdb store at " + shown +
                                 " is already open in another process (" + m + ")");
    }
    if (s.IsIOError() && m.find("ermission denied") != std::string::npos) {
      return Status::PermissionDenied(ctx + ": " + m);
    }
    if (s.IsNoSpace()) return FromRocks(s, ctx);
    if (s.IsCorruption()) {
      std::string where = facts.live_logs.empty()
                              ? std::string()
                              : "; write-ahead log(s): " + FewNames(facts.live_logs);
      return Status::DataLoss(
          ctx + ": " + m + where +
          ". Nothing was changed. If a write-ahead log has a corrupt record before its end, "
          "the records after it cannot be replayed: to open the store anyway and lose them "
          "(their messages may then run again), open rocksdb:" + shown +
          "?recovery=salvage once, after copying the directory aside");
    }
    return Status::FailedPrecondition(ctx + ": " + m);
  }
  cf_ = handles_[dedup_index];

  // Listed again now that the directory's lock is held: the list above was made
  // before it, and an earlier process's clean close, which deletes its logs once
  // their claims are in the database, may have finished in between (folding a
  // log that is gone failed the open). No other writer changes them now.
  if (!read_only) {
    claim_logs.clear();
    DEDUP_RETURN_IF_ERROR(internal::ListClaimLogs(path, &claim_logs));
    if (!claim_logs.empty()) log_floor_.store(std::numeric_limits<int64_t>::min());
  }

  // The format version: written once into a new directory, checked ever after.
  rocksdb::PinnableSlice v;
  s = db_->Get(rocksdb::ReadOptions(), cf_, internal::kMetaFormatKey, &v);
  if (s.IsNotFound()) {
    // New, or created but never given a version (a crash right after creating the
    // column family). Only an empty column family may be adopted.
    std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions(), cf_));
    it->SeekToFirst();
    if (!it->status().ok()) return FromRocks(it->status(), ctx);
    if (it->Valid()) {
      return Status::FailedPrecondition(ctx + ": the \"dedup\" column family has data but no "
                                        "format version; refusing to guess how to read it");
    }
    if (read_only) return Status::NotFound(ctx + ": the store is empty and was never used");
    rocksdb::WriteOptions wo;
    wo.sync = true;
    s = db_->Put(wo, cf_, internal::kMetaFormatKey, std::to_string(internal::kFormatVersion));
    if (!s.ok()) return FromRocks(s, ctx + ": writing the format version");
  } else if (!s.ok()) {
    return FromRocks(s, ctx + ": reading the format version");
  } else {
    const std::string_view text = v.ToStringView();
    uint32_t version = 0;
    auto [p, err] = std::from_chars(text.data(), text.data() + text.size(), version);
    if (err != std::errc() || p != text.data() + text.size()) {
      return Status::FailedPrecondition(ctx + ": unreadable format version " + QuoteBytes(text) +
                                        "; this build reads version " +
                                        std::to_string(internal::kFormatVersion));
    }
    if (version != internal::kFormatVersion) {
      return Status::FailedPrecondition(
          ctx + ": the directory has format version " + std::to_string(version) +
          ", this build reads only version " + std::to_string(internal::kFormatVersion) +
          " (refusing to misread it)");
    }
  }

  if (!read_only && !claim_logs.empty()) DEDUP_RETURN_IF_ERROR(FoldClaimLogs(claim_logs));
  DEDUP_RETURN_IF_ERROR(LoadIndex());
  if (read_only) return OverlayClaimLogs(read_only_claims);  // nothing is written: no epoch, no writer threads
  DEDUP_RETURN_IF_ERROR(AdvanceFenceEpoch());  // and starts the group commit of claims
  if (options_.sync == SyncMode::kInterval) syncer_ = std::thread([this] { SyncLoop(); });
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<RocksDBStore>> RocksDBStore::Open(const RocksDBStoreOptions& options) {
  if (options.path.empty()) {
    return Status::InvalidArgument("rocksdb: path is empty (expected a directory)");
  }
  if (options.path.find('\0') != std::string::npos) {
    // The file system would stop at the NUL and create or open the directory
    // named by the part before it, not the one asked for.
    return Status::InvalidArgument("rocksdb: path '" +
                                   options.path.substr(0, options.path.find('\0')) +
                                   "\\0...' holds a NUL byte (from %00 in a URI?)");
  }
  // The enums are checked too: a value cast from outside them opened a store
  // whose Describe() said sync=unknown (which OpenStore refuses), with the WAL
  // not synced while the claim log was, and an unknown recovery read as kStrict.
  if (options.sync != SyncMode::kNone && options.sync != SyncMode::kInterval &&
      options.sync != SyncMode::kAlways) {
    return Status::InvalidArgument("rocksdb " + options.path + ": sync mode " +
                                   std::to_string(static_cast<int>(options.sync)) +
                                   " is not one of none (0), interval (1), always (2)");
  }
  if (options.wal_recovery != WalRecovery::kStrict && options.wal_recovery != WalRecovery::kSalvage) {
    return Status::InvalidArgument("rocksdb " + options.path + ": WAL recovery " +
                                   std::to_string(static_cast<int>(options.wal_recovery)) +
                                   " is not one of strict (0), salvage (1)");
  }
  // Above 10 years (what the URI refuses), the syncer's wait_for overflowed the
  // clock's nanoseconds and returned at once: a thread spinning on a core.
  if (options.sync == SyncMode::kInterval &&
      (options.sync_interval.count() <= 0 || options.sync_interval > kMaxDuration)) {
    return Status::InvalidArgument("rocksdb " + options.path +
                                   ": sync_interval must be positive and at most 10 years, got " +
                                   std::to_string(options.sync_interval.count()) + " ms");
  }
  std::error_code ec;
  const std::filesystem::path dir = std::filesystem::absolute(options.path, ec);
  if (ec) {
    return Status::Unavailable("rocksdb " + options.path +
                               ": open: cannot make the path absolute: " + ec.message());
  }
  Clock* clock = options.clock != nullptr ? options.clock : Clock::System();
  auto store = std::make_unique<RocksDBStoreImpl>(options, dir.string(), clock);
  DEDUP_RETURN_IF_ERROR(store->OpenDb());
  return std::unique_ptr<RocksDBStore>(std::move(store));
}

namespace internal {

StatusOr<std::unique_ptr<Store>> OpenRocksDBFromUri(const Uri& uri, const OpenOptions& options) {
  const std::string shown = uri.Redacted();
  if (uri.has_authority && !uri.hosts.empty()) {
    return Status::InvalidArgument("rocksdb URI '" + shown +
                                   "' names a host; the store is a local directory "
                                   "(rocksdb:/abs/path or rocksdb:./rel/path)");
  }
  DEDUP_RETURN_IF_ERROR(uri.CheckParams({"sync", "recovery"}));
  if (uri.path.empty()) {
    return Status::InvalidArgument("rocksdb URI '" + shown +
                                   "' has an empty path (expected rocksdb:PATH, e.g. "
                                   "rocksdb:/var/lib/dedup)");
  }
  RocksDBStoreOptions o;
  o.path = uri.path;
  o.clock = options.clock;
  o.create_if_missing = !options.must_exist;
  o.read_only = options.read_only;
  if (auto rec = uri.Param("recovery")) {
    if (*rec == "strict") {
      o.wal_recovery = WalRecovery::kStrict;
    } else if (*rec == "salvage") {
      o.wal_recovery = WalRecovery::kSalvage;
    } else {
      return Status::InvalidArgument("rocksdb URI parameter recovery='" + *rec +
                                     "' is not one of strict, salvage");
    }
  }
  if (auto sync = uri.Param("sync")) {
    const std::string_view v = *sync;
    if (v == "none") {
      o.sync = SyncMode::kNone;
    } else if (v == "always") {
      o.sync = SyncMode::kAlways;
    } else if (v == "interval") {
      o.sync = SyncMode::kInterval;
    } else if (v.starts_with("interval:")) {
      o.sync = SyncMode::kInterval;
      auto ms = ParseDurationMillis(v.substr(9), "rocksdb sync interval");
      if (!ms.ok()) return ms.status();
      if (*ms <= 0) {
        return Status::InvalidArgument("rocksdb sync interval must be positive, got '" +
                                       std::string(v.substr(9)) + "'");
      }
      o.sync_interval = Millis(*ms);
    } else {
      return Status::InvalidArgument("rocksdb URI parameter sync='" + *sync +
                                     "' is not one of none, always, interval, interval:MS");
    }
  }
  auto store = RocksDBStore::Open(o);
  if (!store.ok()) return store.status();
  return std::unique_ptr<Store>(std::move(store).value());
}

}  // namespace internal
}  // namespace dedup
