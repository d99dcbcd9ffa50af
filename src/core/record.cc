// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "dedup/record.h"

#include <random>

namespace dedup {

std::string_view Token::WriteHex(char* out) const {
  static constexpr char kDigits[] = "0123456789abcdef";
  uint64_t v = value;
  for (size_t i = kHexDigits; i-- > 0; v >>= 4) out[i] = kDigits[v & 0xf];
  return {out, kHexDigits};
}

std::string Token::ToHex() const {
  char buf[kHexDigits];
  return std::string(WriteHex(buf));
}

std::optional<Token> Token::FromHex(std::string_view hex) {
  // Exactly the form ToHex writes (and the Lua scripts accept): one spelling per
  // token, so a token that is compared as text elsewhere cannot differ from ours.
  if (hex.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else return std::nullopt;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  if (v == 0) return std::nullopt;
  return Token{v};
}

Token Token::Random() {
  // One 64-bit Mersenne Twister per thread, seeded from the OS entropy source, so
  // that tokens are unpredictable across processes and threads without a lock.
  thread_local std::mt19937_64 gen([] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd(), rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }());
  uint64_t v;
  do {
    v = gen();
  } while (v == 0);
  return Token{v};
}

std::string_view RecordStateName(RecordState s) {
  switch (s) {
    case RecordState::kInProgress: return "in_progress";
    case RecordState::kCompleted: return "completed";
    case RecordState::kReleased: return "released";
  }
  return "unknown";
}

std::string_view CompletionStatusName(CompletionStatus s) {
  switch (s) {
    case CompletionStatus::kOk: return "ok";
    case CompletionStatus::kFailed: return "failed";
    case CompletionStatus::kExhausted: return "exhausted";
  }
  return "unknown";
}

std::optional<CompletionStatus> ParseCompletionStatus(std::string_view name) {
  if (name == "ok") return CompletionStatus::kOk;
  if (name == "failed") return CompletionStatus::kFailed;
  if (name == "exhausted") return CompletionStatus::kExhausted;
  return std::nullopt;
}

std::string_view ClaimOutcomeName(ClaimOutcome o) {
  switch (o) {
    case ClaimOutcome::kAcquired: return "ACQUIRED";
    case ClaimOutcome::kBusy: return "BUSY";
    case ClaimOutcome::kDuplicate: return "DUPLICATE";
    case ClaimOutcome::kMismatch: return "MISMATCH";
    case ClaimOutcome::kExhausted: return "EXHAUSTED";
  }
  return "UNKNOWN";
}

std::string_view WriteResultName(WriteResult r) {
  return r == WriteResult::kOk ? "OK" : "LOST";
}

std::ostream& operator<<(std::ostream& os, const Record& r) {
  os << "Record{key=" << r.key << " state=" << RecordStateName(r.state)
     << " token=" << r.token.ToHex() << " fence=" << r.fence << " attempt=" << r.attempt
     << " lease_deadline=" << r.lease_deadline
     << " retention_deadline=" << r.retention_deadline;
  if (r.state == RecordState::kCompleted) {
    os << " status=" << CompletionStatusName(r.status) << " result_bytes=" << r.result.size();
  }
  return os << "}";
}

std::ostream& operator<<(std::ostream& os, const ClaimResult& r) {
  os << ClaimOutcomeName(r.outcome) << "{fence=" << r.fence << " attempt=" << r.attempt;
  switch (r.outcome) {
    case ClaimOutcome::kAcquired: os << " token=" << r.token.ToHex(); break;
    case ClaimOutcome::kBusy: os << " lease_left=" << r.lease_left.count() << "ms"; break;
    case ClaimOutcome::kDuplicate:
      os << " status=" << CompletionStatusName(r.status) << " result_bytes=" << r.result.size();
      break;
    default: break;
  }
  return os << "}";
}

}  // namespace dedup
