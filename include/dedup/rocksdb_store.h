// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The RocksDB store: the embedded, durable default. Records live in their own
// column family ("dedup") of a RocksDB database in a local directory; the default
// column family is left to the application, so that state the application keeps
// in the same database can commit in the same WriteBatch as Complete()
// (CompleteWithBatch): exactly-once effects for embedded state.
//
// What survives what:
//   * Complete, extend, release and forget, a claim with max_attempts and every
//     claim with SyncMode::kAlways are written to RocksDB's write-ahead log before
//     they return: a process crash (SIGKILL) loses none of them, whatever the
//     sync mode.
//   * Other claims are appended to a claim log (PATH/CLAIMLOG-*) by a background
//     writer about once a millisecond: a process crash forgets those made in the
//     last millisecond or so (while appends fail, on a full disk, every one made
//     since they began). A forgotten claim's key is claimable again with a higher
//     fence and an attempt number already handed out; fences never repeat.
//   * A power loss or kernel crash can lose operations that were not yet synced:
//     none with SyncMode::kAlways, those of the last `sync_interval` with
//     kInterval (the claim log is synced with the WAL), an unbounded recent
//     window with kNone.
//   * Records past their retention are dropped by a compaction filter as RocksDB
//     flushes and compacts (every file is compacted at least once a day; a record
//     that expired while a claim log existed, at the first compaction after it is
//     deleted: within about an hour); until then they answer as absent. A dropped record leaves a deletion marker, so an
//     older version of the key never resurfaces.
//
// A full disk is ResourceExhausted (never an abort): the write that hit it
// changed nothing, and RocksDB keeps refusing writes until it is reopened. (One
// exception, said in its message: a Forget whose forget entry reached the claim
// log before the deletion failed may take effect at the next open.)
// RocksDB's info log goes to PATH/LOG through a writer that ignores its own I/O
// errors.
//
// One process at a time: a second process opening the same directory gets
// Unavailable "rocksdb store at PATH is already open in another process" (retry once
// it closes). A second Open in the same process gets FailedPrecondition "... is
// already open in this process", however the path is spelled ('dir/', 'dir/.', a
// symlink to dir, the absolute path after a relative one): the directory is told
// by its device and inode while a store has it open. A read-only Open is never
// refused this way. A relative path is made absolute once, at Open: changing the
// working directory later changes nothing for the store. A directory
// written by an unknown format version is refused with FailedPrecondition, never
// misread, as is a claim log holding an entry of a type this build does not
// know; one holding an entry that breaks the format (in a frame whose checksum
// matches) is refused with DataLoss, as damage. A record that cannot be decoded
// makes every operation on its key return DataLoss and change nothing; Forget()
// removes it.
//
// Memory: the store keeps a 32-bit fingerprint of every key on disk (about 8 to
// 16 bytes per record), so that a claim of a key never seen needs no read, and
// copies of the 65,536 records it wrote last. The fingerprints are loaded when
// the store opens, by reading every key once (seconds for tens of millions of
// records). Writes made to the "dedup" column family other than through the
// store are not seen by this index: never make them while the store is open.

#ifndef DEDUP_ROCKSDB_STORE_H_
#define DEDUP_ROCKSDB_STORE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "dedup/clock.h"
#include "dedup/store.h"

namespace rocksdb {
class ColumnFamilyHandle;
class DB;
class Env;
class WriteBatch;
}  // namespace rocksdb

namespace dedup {

enum class SyncMode : uint8_t {
  kNone = 0,      // WAL and claim log written to the OS, synced when the OS likes
  kInterval = 1,  // WAL and claim log synced by a background thread every sync_interval
  kAlways = 2,    // WAL synced before every operation returns; no claim log
                  // (concurrent operations share one sync: RocksDB's group commit)
};

// How a write-ahead log that cannot be read to its end is handled at open.
enum class WalRecovery : uint8_t {
  // A torn last record (a crash in the middle of a write) is dropped; a corrupt
  // record anywhere before the end refuses the open with DataLoss naming the log
  // file. Nothing acknowledged is ever dropped silently.
  kStrict = 0,
  // Salvage: replay the log up to the first corrupt record and drop everything
  // after it (a consistent earlier state; records written after the damage are
  // gone, so their messages may run again). For an operator who has read the
  // kStrict error and chosen to lose the tail. URI: rocksdb:PATH?recovery=salvage
  // The claim logs (PATH/CLAIMLOG-*) follow the same rule; there salvage skips
  // only a damaged frame that whole ones follow.
  kSalvage = 1,
};

struct RocksDBStoreOptions {
  // Directory of the database. Created when missing (unless create_if_missing is
  // false); a symlink to a missing directory is InvalidArgument naming its target.
  // A relative path is resolved against the working directory at Open. Required.
  // A directory that holds RocksDB files but no CURRENT, or whose MANIFEST no
  // longer lists the "dedup" column family while table or log files remain, is
  // refused with DataLoss: it is never re-initialised (which would delete the old
  // files).
  std::string path;
  // False: a missing directory, or one without a store, is NotFound instead of
  // a new empty store (admin tools: a mistyped path must not create one).
  bool create_if_missing = true;
  // Open for reading only: nothing in the directory is written or created (works
  // on a read-only copy and beside a running writer, seeing the state at open);
  // every write answers FailedPrecondition. Implies create_if_missing = false.
  bool read_only = false;
  // See WalRecovery. Default: kStrict.
  WalRecovery wal_recovery = WalRecovery::kStrict;
  // When the write-ahead log reaches the disk. Default: kNone (survives a process
  // crash, not a power loss).
  SyncMode sync = SyncMode::kNone;
  // kInterval: time between two syncs. Default: 100 ms.
  Millis sync_interval{100};
  // RocksDB block cache for records; 0 = none. Default: 64 MiB.
  size_t block_cache_bytes = 64u << 20;
  // Size of one memtable of records before it is flushed (up to 4 are kept).
  // Smaller ones are faster to insert into. Default: 32 MiB.
  size_t write_buffer_bytes = 32u << 20;
  // Decides leases and retention (and what the compaction filter drops). Not
  // owned. Default: Clock::System().
  Clock* clock = nullptr;
  // The Env RocksDB opens the database with (tests: one whose file system does
  // something at a chosen moment of the open). Not owned. Default: RocksDB's.
  rocksdb::Env* env = nullptr;
};

class RocksDBStore : public Store {
 public:
  [[nodiscard]] static StatusOr<std::unique_ptr<RocksDBStore>> Open(
      const RocksDBStoreOptions& options);

  // The database, for the application's own state in the default column family.
  // Do not write to the "dedup" column family directly.
  virtual rocksdb::DB* db() = 0;

  // The "dedup" column family, for reading records raw (tests, admin tools). Keys
  // are 'r' + key; values are in src/stores/rocksdb/record_codec.h's format. Never
  // write to it: the store's per-key locks would not see the write.
  virtual rocksdb::ColumnFamilyHandle* records_family() = 0;

  // Complete() whose record write is appended to `batch` and committed with it in
  // one atomic RocksDB write. On kLost nothing in `batch` is written. On kOk the
  // batch is consumed (written); the caller may reuse it after Clear(). On kLost or
  // an error `batch` is left as it was given. A null `batch` is plain Complete().
  // A batch with any entry in the "dedup" column family (records_family()) is
  // refused with InvalidArgument naming the entry, before anything is written:
  // the claim stays held, and may be completed with a proper batch.
  [[nodiscard]] virtual StatusOr<WriteResult> CompleteWithBatch(
      std::string_view key, Token token, Millis retention, CompletionStatus status,
      std::string_view result, rocksdb::WriteBatch* batch) = 0;

  // Forces a flush of memtables and a full compaction (drops expired records now).
  // For tests and admin tools.
  [[nodiscard]] virtual Status CompactNow() = 0;
};

}  // namespace dedup

#endif  // DEDUP_ROCKSDB_STORE_H_
