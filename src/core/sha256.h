// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// SHA-256 as lower-case hex: the content-hash key of every broker source
// (key=sha256 of a stream entry's fields, an AMQP body, a NATS message).

#ifndef DEDUP_SRC_CORE_SHA256_H_
#define DEDUP_SRC_CORE_SHA256_H_

#include <string>
#include <string_view>

namespace dedup::internal {

// 64 lower-case hex digits.
std::string HexSha256(std::string_view data);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_SHA256_H_
