// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Where a source finds a message's dedup key: the one grammar of the `key=`
// option of every broker URI (amqp://, nats://, redis://...?stream=). Each source
// states what its messages carry (a KeyGrammar) and reads the key where the
// parsed KeySpec points:
//
//   key=sha256        the hex SHA-256 of the message's content (the AMQP body,
//                     the NATS data, a stream entry's framed field names and values)
//   key=header:NAME   the value of header NAME (AMQP headers table, NATS headers)
//   key=field:NAME    the value of field NAME (a Redis stream entry)
//   key=WORD          a property the broker itself defines: `message_id` (AMQP),
//                     `msgid` (NATS: the Nats-Msg-Id header). On Redis Streams,
//                     whose entries have fields only, a bare WORD is a field name
//                     (key=id, the default, is field:id).
//
// NAME is 1-255 bytes without control characters. `key=field:sha256` reads a
// field that happens to be called "sha256". Errors name the broker, the value
// given and the forms this broker accepts.

#ifndef DEDUP_SRC_BROKERS_KEY_SPEC_H_
#define DEDUP_SRC_BROKERS_KEY_SPEC_H_

#include <string>
#include <string_view>
#include <vector>

#include "dedup/status.h"

namespace dedup::brokers {

enum class KeyKind { kProperty, kHeader, kField, kContentSha256 };

struct KeySpec {
  KeyKind kind = KeyKind::kContentSha256;
  std::string name;  // the property, header or field; empty for kContentSha256

  // The key= text that parses back to this spec ("header:Idem", "sha256", ...).
  std::string ToString() const;
  bool operator==(const KeySpec&) const = default;
};

// What one broker's messages carry.
struct KeyGrammar {
  std::string broker;                   // "amqp", "nats", "redis streams": for errors
  std::vector<std::string> properties;  // bare words naming a broker property
  bool headers = false;                 // header:NAME
  bool fields = false;                  // field:NAME
  bool bare_word_is_field = false;      // any other bare WORD is field:WORD
};

// The spec `text` (the value of key=) names under `grammar`; InvalidArgument
// naming the broker, the value and the accepted forms otherwise.
StatusOr<KeySpec> ParseKeySpec(std::string_view text, const KeyGrammar& grammar);

// prefix= (put before every key) leaves room for a key: a key is 1 to
// kMaxKeyBytes bytes, so a prefix of kMaxKeyBytes or more (or more than
// kMaxKeyBytes - 64 before a hex SHA-256, key=sha256) would make every message's
// key too long and dead-letter the whole queue. InvalidArgument naming `broker`
// and the sizes otherwise; the prefix is not echoed (it may be long).
Status CheckKeyPrefix(std::string_view prefix, bool sha256_key, std::string_view broker);

}  // namespace dedup::brokers

#endif  // DEDUP_SRC_BROKERS_KEY_SPEC_H_
