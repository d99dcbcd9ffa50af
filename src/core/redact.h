// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Passwords never reach a message, a log line, a page or a metric. Every place
// that shows a URI given by a user shows RedactUri(text) (or Uri::Redacted(),
// which ends in it), whether or not the text parses: typos are where passwords
// leak.

#ifndef DEDUP_SRC_CORE_REDACT_H_
#define DEDUP_SRC_CORE_REDACT_H_

#include <string>
#include <string_view>

namespace dedup::internal {

// `text` with whatever could be a secret replaced by "***", best effort on text
// that may not be a URI at all:
//   * the user-info before the last '@': "user:pass@" -> "user:***@", and
//     "pass@" or "pass:@" -> "***@" (Redis reads a lone user-info as the
//     password);
//   * ":pass" right after the scheme's slashes with no '@' ("redis://:pass",
//     "redis:/:pass"), or opening a text without scheme (":pass", but not a
//     port such as ":6379") -> ":***";
//   * the value of a query parameter named password, pass or auth.
// Text without any of these comes back unchanged.
std::string RedactUri(std::string_view text);

// One host ("host", "host:port", "[v6]:port") for a message: what follows the
// ':' is shown only when it is a number. In "user:pass" (a URI whose "@host"
// was forgotten) it is a password.
std::string ShownHost(std::string_view text);

// RedactUri applied to each word of a free-text message (words split at blanks
// and quotes) that looks like a URI: it has an '@' or starts with "scheme:".
// For messages of code that echoes what it was given (CLI11, host parsers).
std::string RedactWords(std::string_view message);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_REDACT_H_
