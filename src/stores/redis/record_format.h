// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Record format 2 of the Redis store, as C++ reads it (docs/REDIS_PROTOCOL.md; the
// Lua side is lua/record.lua). The claim fast path decodes COMPLETED records (and
// the head of IN_PROGRESS ones) here;
// tests/decoder_fuzz_test.cc feeds the same function mutated bytes.

#ifndef DEDUP_SRC_STORES_REDIS_RECORD_FORMAT_H_
#define DEDUP_SRC_STORES_REDIS_RECORD_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "dedup/record.h"
#include "dedup/store.h"

namespace dedup::redis {

// First byte: 010 version tag, has-fingerprint bit, status (2 bits), state (2 bits).
inline constexpr uint8_t kFormat2 = 0x40;
inline constexpr uint8_t kHasFp2 = 0x10;
inline constexpr uint8_t kInProgress2 = 1;
inline constexpr uint8_t kCompleted2 = 2;

// A token as record format 2 and complete_ack_stream.lua carry it: 8 bytes,
// big-endian. Written at p; returns the end.
inline constexpr size_t kTokenBytes = 8;
inline char* WriteToken(char* p, uint64_t token) {
  for (size_t i = kTokenBytes; i-- > 0;) *p++ = static_cast<char>(token >> (8 * i));
  return p;
}
inline uint64_t ReadToken(const char* p) {
  uint64_t t = 0;
  for (size_t k = 0; k < kTokenBytes; ++k) t = (t << 8) | static_cast<uint8_t>(p[k]);
  return t;
}

// Unsigned LEB128: 7 bits per byte, least significant first, high bit = more.
// Written at p; returns the end (at most 10 bytes written).
inline char* WriteVarint(char* p, uint64_t n) {
  while (n >= 128) {
    *p++ = static_cast<char>((n & 127) | 128);
    n >>= 7;
  }
  *p++ = static_cast<char>(n);
  return p;
}

inline void AppendVarint(std::string* s, uint64_t n) {
  char b[10];
  s->append(b, WriteVarint(b, n));
}

// The largest varint of a record, as record.lua's MAX_VARINT: 2^53 - 1, the
// largest integer the scripts' Lua numbers (doubles) hold exactly.
inline constexpr uint64_t kMaxVarint = (uint64_t{1} << 53) - 1;
// The largest attempt, as record.lua's MAX_ATTEMPT: 2^32 - 1, what a claim
// reports (ClaimResult::attempt). A record holding more is left to the scripts,
// which refuse it.
inline constexpr uint64_t kMaxAttempt = 0xffffffff;

// At most 8 bytes and kMaxVarint; canonical only, as record.lua: a last byte of 0
// after others is padding and refused.
inline bool ReadVarint(std::string_view v, size_t* i, uint64_t* out) {
  uint64_t n = 0;
  for (int shift = 0; shift < 56; shift += 7) {
    if (*i >= v.size()) return false;
    const auto b = static_cast<uint8_t>(v[(*i)++]);
    n |= static_cast<uint64_t>(b & 127) << shift;
    if (b < 128) {
      if ((b == 0 && shift > 0) || n > kMaxVarint) return false;
      *out = n;
      return true;
    }
  }
  return false;
}

// A format-2 COMPLETED record; the views point into the decoded value.
struct CompletedRecord2 {
  CompletionStatus status = CompletionStatus::kOk;
  uint64_t token = 0;
  uint64_t fence = 0;
  uint64_t attempt = 0;
  std::string_view fingerprint;  // empty: none stored
  std::string_view result;
};

// True when `v` is a format-2 COMPLETED record, filling *out. False for anything
// else (other states, format 1, corrupt bytes): the caller leaves those to claim.lua.
inline bool DecodeCompletedRecord2(std::string_view v, CompletedRecord2* out) {
  if (v.size() < 11) return false;
  const auto flags = static_cast<uint8_t>(v[0]);
  const unsigned status = (flags >> 2) & 3;
  if ((flags & 0xe0) != kFormat2 || (flags & 3) != kCompleted2 || status > 2) return false;
  const uint64_t token = ReadToken(v.data() + 1);
  size_t i = 1 + kTokenBytes;
  uint64_t fence = 0, attempt = 0;
  if (!ReadVarint(v, &i, &fence) || !ReadVarint(v, &i, &attempt) || attempt > kMaxAttempt) {
    return false;
  }
  std::string_view fp;
  if (flags & kHasFp2) {
    if (i >= v.size()) return false;
    const size_t n = static_cast<uint8_t>(v[i]);
    if (n == 0 || n > kMaxFingerprintBytes || v.size() < i + 1 + n) return false;
    fp = v.substr(i + 1, n);
    i += 1 + n;
  }
  out->status = static_cast<CompletionStatus>(status);
  out->token = token;
  out->fence = fence;
  out->attempt = attempt;
  out->fingerprint = fp;
  out->result = v.substr(i);
  return true;
}

// The token, fence and attempt of a format-2 IN_PROGRESS record. False for
// anything else. (A claim that meets its own token learns its earlier try ran.)
inline bool DecodeInProgressHead2(std::string_view v, uint64_t* token, uint64_t* fence,
                                  uint64_t* attempt) {
  if (v.size() < 11) return false;
  const auto flags = static_cast<uint8_t>(v[0]);
  if ((flags & 0xe0) != kFormat2 || (flags & 0x0f) != kInProgress2) return false;
  size_t i = 1 + kTokenBytes;
  if (!ReadVarint(v, &i, fence) || !ReadVarint(v, &i, attempt) || *attempt > kMaxAttempt) {
    return false;
  }
  *token = ReadToken(v.data() + 1);
  return true;
}

}  // namespace dedup::redis

#endif  // DEDUP_SRC_STORES_REDIS_RECORD_FORMAT_H_
