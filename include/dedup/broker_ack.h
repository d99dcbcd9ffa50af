// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// BrokerAck: a broker's acknowledgement described as data, so that a store on the
// broker's own server can carry it out in the same atomic step as a completion
// (Store::CanCompleteWithAck / CompleteWithAck in store.h). Made by a
// MessageSource's Delivery (consumer.h), read by stores; neither side knows the
// other's type.

#ifndef DEDUP_BROKER_ACK_H_
#define DEDUP_BROKER_ACK_H_

#include <string_view>

namespace dedup {

// Both sides compare `kind` and `server` (a canonical "host:port/db" or similar);
// the views stay valid as long as the Delivery that made them.
struct BrokerAck {
  std::string_view kind;      // e.g. "redis-stream"
  std::string_view server;    // canonical server identity, e.g. "127.0.0.1:6379/0"
  std::string_view target;    // e.g. the stream key
  std::string_view group;     // e.g. the consumer group
  std::string_view id;        // e.g. the entry id
};

}  // namespace dedup

#endif  // DEDUP_BROKER_ACK_H_
