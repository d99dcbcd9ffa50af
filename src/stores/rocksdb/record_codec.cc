// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "stores/rocksdb/record_codec.h"

#include <cstring>

#include "dedup/store.h"

namespace dedup::internal {
namespace {

constexpr size_t kFixedBytes = 1 + 8 + 8 + 8 + 8 + 4 + 1 + 1 + 1;  // up to the fp length

template <typename T>
void PutFixed(std::string* out, T v) {
  char buf[sizeof(T)];
  for (size_t i = 0; i < sizeof(T); ++i) {
    buf[i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * i));
  }
  out->append(buf, sizeof(T));
}

template <typename T>
T GetFixed(const char* p) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  }
  return static_cast<T>(v);
}

}  // namespace

void EncodeRecordKey(std::string_view key, std::string* out) {
  out->clear();
  AppendRecordKey(key, out);
}

void AppendRecordKey(std::string_view key, std::string* out) {
  out->push_back(kRecordKeyPrefix);
  out->append(key);
}

void EncodeRecord(const Record& r, std::string* out) {
  out->clear();
  out->reserve(kFixedBytes + r.fingerprint.size() + 4 + r.result.size());
  out->push_back(static_cast<char>(kRecordFormat));
  PutFixed<int64_t>(out, r.retention_deadline);
  PutFixed<int64_t>(out, r.lease_deadline);
  PutFixed<uint64_t>(out, r.token.value);
  PutFixed<uint64_t>(out, r.fence);
  PutFixed<uint32_t>(out, r.attempt);
  out->push_back(static_cast<char>(r.state));
  out->push_back(static_cast<char>(r.status));
  out->push_back(static_cast<char>(static_cast<uint8_t>(r.fingerprint.size())));
  out->append(r.fingerprint);
  PutFixed<uint32_t>(out, static_cast<uint32_t>(r.result.size()));
  out->append(r.result);
}

bool DecodeRecord(std::string_view v, Record* r, std::string* why) {
  if (v.empty()) {
    *why = "empty value";
    return false;
  }
  if (static_cast<uint8_t>(v[0]) != kRecordFormat) {
    *why = "unknown record format byte " + std::to_string(static_cast<uint8_t>(v[0]));
    return false;
  }
  if (v.size() < kFixedBytes) {
    *why = "value is " + std::to_string(v.size()) + " bytes, shorter than a record";
    return false;
  }
  const char* p = v.data();
  const uint8_t state = static_cast<uint8_t>(p[37]);
  const uint8_t status = static_cast<uint8_t>(p[38]);
  const size_t fp_len = static_cast<uint8_t>(p[39]);
  if (state < static_cast<uint8_t>(RecordState::kInProgress) ||
      state > static_cast<uint8_t>(RecordState::kReleased)) {
    *why = "bad state " + std::to_string(state);
    return false;
  }
  if (status > static_cast<uint8_t>(CompletionStatus::kExhausted)) {
    *why = "bad completion status " + std::to_string(status);
    return false;
  }
  if (fp_len > kMaxFingerprintBytes || v.size() < kFixedBytes + fp_len + 4) {
    *why = "bad fingerprint length " + std::to_string(fp_len);
    return false;
  }
  const uint32_t result_len = GetFixed<uint32_t>(p + kFixedBytes + fp_len);
  if (result_len > kMaxResultBytes || v.size() != kFixedBytes + fp_len + 4 + result_len) {
    *why = "bad result length " + std::to_string(result_len) + " in a value of " +
           std::to_string(v.size()) + " bytes";
    return false;
  }
  r->retention_deadline = GetFixed<int64_t>(p + 1);
  r->lease_deadline = GetFixed<int64_t>(p + 9);
  r->token.value = GetFixed<uint64_t>(p + 17);
  r->fence = GetFixed<uint64_t>(p + 25);
  r->attempt = GetFixed<uint32_t>(p + 33);
  r->state = static_cast<RecordState>(state);
  r->status = static_cast<CompletionStatus>(status);
  r->fingerprint.assign(p + kFixedBytes, fp_len);
  r->result.assign(p + kFixedBytes + fp_len + 4, result_len);
  return true;
}

std::optional<int64_t> PeekRetentionDeadline(std::string_view v) {
  if (v.size() < kFixedBytes || static_cast<uint8_t>(v[0]) != kRecordFormat) return std::nullopt;
  return GetFixed<int64_t>(v.data() + 1);
}

std::string QuoteBytes(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out = "'";
  const size_t n = bytes.size() < 64 ? bytes.size() : 64;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(bytes[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  if (bytes.size() > n) out += "...";
  out += "'";
  return out;
}

}  // namespace dedup::internal
