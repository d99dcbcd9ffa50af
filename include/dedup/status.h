// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Status reports a real failure: the store is unreachable, an argument is bad, a
// record is corrupt. Expected outcomes of the protocol (ACQUIRED, BUSY, DUPLICATE,
// MISMATCH, EXHAUSTED, LOST) are never statuses; they are values (see record.h).
//
// The codes follow abseil's canonical codes, with the same advice:
//   kUnavailable       the call may be retried as it is (store down, connection lost,
//                      a rocksdb: directory open in another process).
//   kDeadlineExceeded  the call timed out; its effect is unknown, retrying is safe
//                      because every operation is idempotent or token-checked.
//   kInvalidArgument   the caller must change the request; retrying will not help.
//   kFailedPrecondition the store cannot serve (unknown format version); a person must act.
//   kDataLoss          a record could not be decoded; nothing was changed.

#ifndef DEDUP_STATUS_H_
#define DEDUP_STATUS_H_

#include <cassert>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace dedup {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 3,
  kDeadlineExceeded = 4,
  kNotFound = 5,
  kAlreadyExists = 6,
  kPermissionDenied = 7,
  kResourceExhausted = 8,
  kFailedPrecondition = 9,
  kAborted = 10,
  kUnimplemented = 12,
  kInternal = 13,
  kUnavailable = 14,
  kDataLoss = 15,
  kUnauthenticated = 16,
};

// "OK", "INVALID_ARGUMENT", ...
std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status Unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status DeadlineExceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
  static Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status PermissionDenied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
  static Status Unauthenticated(std::string m) { return {StatusCode::kUnauthenticated, std::move(m)}; }
  static Status ResourceExhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
  static Status FailedPrecondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
  static Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
  static Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // True when the same call may simply be tried again later.
  bool retryable() const {
    return code_ == StatusCode::kUnavailable || code_ == StatusCode::kDeadlineExceeded;
  }

  // "UNAVAILABLE: redis 127.0.0.1:6379: connection refused"
  std::string ToString() const;

  // Returns a copy whose message is "context: message".
  Status WithContext(std::string_view context) const;

  friend bool operator==(const Status& a, const Status& b) {
    return a.code_ == b.code_ && a.message_ == b.message_;
  }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

std::ostream& operator<<(std::ostream& os, const Status& s);

namespace internal {
// Prints `s` and aborts: the value of a StatusOr that holds an error was asked for.
[[noreturn]] void DieOnValueOfError(const Status& s);
}  // namespace internal

// A value or the Status that explains why there is none. Asking for the value
// (value(), *, ->) of one that holds an error aborts the process with the
// error's message, in every build: a forgotten ok() check is a bug to be shown,
// not undefined behaviour in a release build.
template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  StatusOr(Status status) : status_(std::move(status)) {  // NOLINT
    assert(!status_.ok() && "StatusOr built from an OK status has no value");
    if (status_.ok()) status_ = Status::Internal("StatusOr built from OK status");
  }

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }

  T& value() & {
    if (!ok()) internal::DieOnValueOfError(status_);
    return *value_;
  }
  const T& value() const& {
    if (!ok()) internal::DieOnValueOfError(status_);
    return *value_;
  }
  T&& value() && {
    if (!ok()) internal::DieOnValueOfError(status_);
    return std::move(*value_);
  }

  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace dedup

// Returns the status of `expr` from the enclosing function when it is not OK.
#define DEDUP_RETURN_IF_ERROR(expr)              \
  do {                                           \
    ::dedup::Status dedup_status_ = (expr);      \
    if (!dedup_status_.ok()) return dedup_status_; \
  } while (0)

#endif  // DEDUP_STATUS_H_
