// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The RocksDB store's claim log: where the group-commit writer puts claims that
// were not completed within a round, instead of RocksDB's memtable and WAL
// (rocksdb_store.cc, docs/DESIGN.md "RocksDB store: claims by group commit").
//
// Files PATH/CLAIMLOG-NNNNNN, numbered upwards, each a sequence of frames:
//   [0..3]   payload length P (uint32, little-endian)
//   [4..7]   CRC-32C of the payload (uint32, little-endian)
//   [8..]    P bytes of entries, back to back:
//              type (1 byte: kClaimEntry or kForgetEntry)
//              key length K (uint32), K bytes of the user key
//              value length V (uint32), V bytes:
//                kClaimEntry: the claim's record as record_codec encodes it
//                kForgetEntry: the forgotten record's fence (uint64; all ones
//                              when it could not be decoded)
// One frame is one write(2). A frame cut short (a crash in the write, or a
// write that failed part-way, after which the writer starts a new file) or
// damaged with no frame that checks after it ends the file for the reader: a
// torn tail. A frame that checks further on, wherever it starts, says the
// damage is a changed byte instead (ClaimLogDamage). Frames are only appended;
// bytes once written never change (a reader beside the writer may have read
// them).

#ifndef DEDUP_SRC_STORES_ROCKSDB_CLAIM_LOG_H_
#define DEDUP_SRC_STORES_ROCKSDB_CLAIM_LOG_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "dedup/status.h"

namespace dedup::internal {

inline constexpr uint8_t kClaimEntry = 1;
inline constexpr uint8_t kForgetEntry = 2;
inline constexpr std::string_view kClaimLogPrefix = "CLAIMLOG-";

// CRC-32C (Castagnoli) of `data`; SSE 4.2 when the CPU has it.
uint32_t Crc32c(std::string_view data);

// "CLAIMLOG-000042" for 42.
std::string ClaimLogName(uint64_t number);

// The numbers of the claim logs in directory `dir`, ascending (none when the
// directory does not exist).
Status ListClaimLogs(const std::string& dir, std::vector<uint64_t>* numbers);

// One frame being built: entries are added, Finish() gives the bytes to write.
class ClaimLogFrame {
 public:
  ClaimLogFrame() { Clear(); }
  void Clear();
  void AddClaim(std::string_view key, std::string_view record);
  void AddForget(std::string_view key, uint64_t fence);
  size_t entries() const { return entries_; }
  // The whole frame, header filled in. Adding after Finish() starts no new frame.
  std::string_view Finish();
  // The buffer's capacity, to drop one that a rare huge frame grew.
  size_t capacity() const { return buf_.capacity(); }
  void Shrink() { std::string().swap(buf_); Clear(); }

 private:
  void Add(uint8_t type, std::string_view key, std::string_view value);
  std::string buf_;
  size_t entries_ = 0;
};

// Damage before a claim log's end: a frame that does not check (a changed byte
// in its payload or its CRC) or that seems to run past the end (a changed
// length), with a frame that checks somewhere after it; or, anywhere, a frame
// that checks but breaks the format (an entry running past its frame, a forget
// entry whose fence is not 8 bytes). A crash (or a full disk) leaves damage
// only at the end: the last write cut short.
struct ClaimLogDamage {
  int64_t at = -1;    // the first such frame's offset; -1: none
  int64_t next = -1;  // where the first frame that checks after it starts
  std::string what;   // the first damage, for a message ("a damaged frame at byte ...")
};

// Calls `fn(type, key, value)` for every entry of every whole, undamaged frame
// of the file at `path`, up to the first frame that is not. With `damage`, the
// bytes from a damaged frame to the next frame that checks (found at any
// offset: the damaged frame's length may be what changed), and a frame that
// checks but breaks the format, are skipped instead, and the first damage
// noted there (the caller refuses the log, or salvages it). An error when the
// file cannot be read, and FailedPrecondition for a frame that checks and holds
// an entry of a type this build does not know (a newer format): never skipped.
Status ReadClaimLog(const std::string& path,
                    const std::function<void(uint8_t, std::string_view, std::string_view)>& fn,
                    ClaimLogDamage* damage = nullptr);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_STORES_ROCKSDB_CLAIM_LOG_H_
