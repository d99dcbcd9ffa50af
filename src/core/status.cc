// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "dedup/status.h"

#include <cstdio>
#include <cstdlib>

namespace dedup {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case StatusCode::kDeadlineExceeded: return "DEADLINE_EXCEEDED";
    case StatusCode::kNotFound: return "NOT_FOUND";
    case StatusCode::kAlreadyExists: return "ALREADY_EXISTS";
    case StatusCode::kPermissionDenied: return "PERMISSION_DENIED";
    case StatusCode::kResourceExhausted: return "RESOURCE_EXHAUSTED";
    case StatusCode::kFailedPrecondition: return "FAILED_PRECONDITION";
    case StatusCode::kAborted: return "ABORTED";
    case StatusCode::kUnimplemented: return "UNIMPLEMENTED";
    case StatusCode::kInternal: return "INTERNAL";
    case StatusCode::kUnavailable: return "UNAVAILABLE";
    case StatusCode::kDataLoss: return "DATA_LOSS";
    case StatusCode::kUnauthenticated: return "UNAUTHENTICATED";
  }
  return "UNKNOWN";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(code_));
  s += ": ";
  s += message_;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  std::string m(context);
  m += ": ";
  m += message_;
  return Status(code_, std::move(m));
}

std::ostream& operator<<(std::ostream& os, const Status& s) { return os << s.ToString(); }

namespace internal {
void DieOnValueOfError(const Status& s) {
  std::fprintf(stderr, "dedup: the value of a StatusOr that holds an error was used: %s\n",
               s.ToString().c_str());
  std::abort();
}
}  // namespace internal

}  // namespace dedup
