// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// How bytes travel over HTTP in `dedup serve` (docs/SERVE.md, "Keys are bytes"):
//   * in a URL path or query: percent-encoded (RFC 3986), any byte allowed;
//   * in JSON: a text field when the bytes are valid UTF-8 ("key", "result"), and
//     always a "<name>_b64" field with standard base64 (RFC 4648 §4, padded);
//   * page cursors: base64url without padding (RFC 4648 §5).

#ifndef DEDUP_SRC_SERVE_BYTES_H_
#define DEDUP_SRC_SERVE_BYTES_H_

#include <optional>
#include <string>
#include <string_view>

namespace dedup::serve {

std::string Base64Encode(std::string_view bytes, bool url = false);
// Accepts both alphabets, with or without padding; nullopt on anything else.
std::optional<std::string> Base64Decode(std::string_view text);
bool IsValidUtf8(std::string_view bytes);
// Percent-encodes every byte outside RFC 3986's unreserved set.
std::string PercentEncode(std::string_view bytes);
// SHA-256 of `bytes`, raw 32 bytes.
std::string Sha256(std::string_view bytes);
// Equal without an early exit on the first difference (token checks).
bool ConstantTimeEquals(std::string_view a, std::string_view b);

}  // namespace dedup::serve

#endif  // DEDUP_SRC_SERVE_BYTES_H_
