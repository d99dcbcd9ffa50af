// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// How the RocksDB store lays out its column family "dedup" on disk.
//
// Keys:
//   'r' + user key      one record (user keys are 1..1024 arbitrary bytes)
//   'm' + name          store metadata; today only kMetaFormatKey
// so no user key can ever collide with metadata.
//
// Record values, format 1 (integers little-endian, fixed width):
//   [0]       format byte = kRecordFormat
//   [1..8]    retention_deadline (int64)   first, at a fixed offset, so that the
//                                          compaction filter reads it undecoded
//   [9..16]   lease_deadline (int64)
//   [17..24]  token (uint64)
//   [25..32]  fence (uint64)
//   [33..36]  attempt (uint32)
//   [37]      state (RecordState)
//   [38]      completion status (CompletionStatus)
//   [39]      fingerprint length F (<= kMaxFingerprintBytes), then F bytes
//   then      result length R (uint32), then R bytes (<= kMaxResultBytes)
// Nothing may follow. Any value that breaks a rule does not decode.

#ifndef DEDUP_SRC_STORES_ROCKSDB_RECORD_CODEC_H_
#define DEDUP_SRC_STORES_ROCKSDB_RECORD_CODEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dedup/record.h"

namespace dedup::internal {

inline constexpr char kRecordKeyPrefix = 'r';
inline constexpr char kMetaKeyPrefix = 'm';
// The directory's format version, as decimal ASCII ("1").
inline constexpr std::string_view kMetaFormatKey = "mformat_version";
// The format version this build writes and the only one it reads.
inline constexpr uint32_t kFormatVersion = 1;
// The first byte of every record value.
inline constexpr uint8_t kRecordFormat = 1;
// Name of the column family holding records and metadata.
inline constexpr std::string_view kColumnFamily = "dedup";

// Appends 'r' + key to *out (after clearing it).
void EncodeRecordKey(std::string_view key, std::string* out);
// Appends 'r' + key to *out, keeping what it holds (a batch's keys, back to back).
void AppendRecordKey(std::string_view key, std::string* out);

// Replaces *out with the encoding of `r` (r.key is not stored: it is the row key).
void EncodeRecord(const Record& r, std::string* out);

// Decodes a value written by EncodeRecord into *r (leaving r->key alone). Returns
// false, with *why saying what is wrong, when `value` is not a valid record.
bool DecodeRecord(std::string_view value, Record* r, std::string* why);

// The retention deadline of an encoded record without decoding the rest, or
// nullopt when `value` does not start like a format-1 record.
std::optional<int64_t> PeekRetentionDeadline(std::string_view value);

// `bytes` quoted for a message: printable ASCII as is, anything else as \xNN, cut
// after 64 bytes with "...".
std::string QuoteBytes(std::string_view bytes);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_STORES_ROCKSDB_RECORD_CODEC_H_
