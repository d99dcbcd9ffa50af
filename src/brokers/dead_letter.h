// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// What a dead letter carries in a header (NATS: Dedup-Reason; AMQP:
// x-dedup-reason). A reason may be as long as a record's result (a handler's
// failure text, up to kMaxResultBytes), but a header is bounded: NATS counts the
// header block against max_payload (1 MiB by default) with the payload, AMQP
// needs the whole content header in one frame (128 KiB as dedup logs in). A
// longer reason made every copy fail, and the message came back for ever (or
// its reason was lost). Redis Streams carries it whole (a stream field). On
// NATS a message near max_payload has no room for the copy's headers whatever
// the reason's length: its copy then goes without the data (nats_source.cc,
// NatsDelivery::DeadLetter).

#ifndef DEDUP_SRC_BROKERS_DEAD_LETTER_H_
#define DEDUP_SRC_BROKERS_DEAD_LETTER_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "core/printable.h"

namespace dedup::brokers {

// At most this many bytes of the reason go into the header, cut at a character
// (internal::CutAtCharacter), then marked with the full size.
inline constexpr size_t kMaxHeaderReasonBytes = 8 * 1024;

inline std::string HeaderReason(std::string_view reason) {
  return internal::CutAtCharacter(reason, kMaxHeaderReasonBytes);
}

}  // namespace dedup::brokers

#endif  // DEDUP_SRC_BROKERS_DEAD_LETTER_H_
