// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// One AMQP connection with channel 1 open, on rabbitmq-c. Not thread-safe: the
// owner serializes calls. Errors name the server and the operation, never the
// password.

#ifndef DEDUP_SRC_BROKERS_RABBITMQ_AMQP_CONN_H_
#define DEDUP_SRC_BROKERS_RABBITMQ_AMQP_CONN_H_

#include <amqp.h>

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "brokers/rabbitmq/rabbitmq_source.h"
#include "dedup/status.h"

namespace dedup::rabbitmq {

inline constexpr amqp_channel_t kChannel = 1;

inline amqp_bytes_t Bytes(std::string_view s) {
  return amqp_bytes_t{s.size(), const_cast<char*>(s.data())};
}
inline std::string Str(amqp_bytes_t b) {
  return b.len == 0 ? std::string() : std::string(static_cast<const char*>(b.bytes), b.len);
}

// Owns the table entries and strings an amqp_table_t points into.
class TableBuilder {
 public:
  void AddString(std::string key, std::string value);
  void AddInt(std::string key, int64_t value);
  amqp_table_t Table();

 private:
  struct Entry {
    std::string key, str;
    int64_t num = 0;
    bool is_num = false;
  };
  std::vector<Entry> entries_;
  std::vector<amqp_table_entry_t> built_;
};

class AmqpConn {
 public:
  explicit AmqpConn(const RabbitMqOptions& o) : o_(o) {}
  ~AmqpConn() { Close(); }
  AmqpConn(const AmqpConn&) = delete;
  AmqpConn& operator=(const AmqpConn&) = delete;

  // Connects, logs in and opens channel 1. Unavailable when the server cannot be
  // reached, Unauthenticated on a refused login.
  [[nodiscard]] Status Open();
  void Close();
  bool open() const { return state_ != nullptr; }
  amqp_connection_state_t get() const { return state_; }

  // The status of the last synchronous RPC (declare, qos, consume ...); marks the
  // connection broken when the channel or connection was closed by the server.
  [[nodiscard]] Status RpcStatus(std::string_view what);
  // A status for a library error code; closes the connection on socket errors.
  [[nodiscard]] Status LibraryError(int code, std::string_view what);
  std::string Name() const;

 private:
  RabbitMqOptions o_;
  amqp_connection_state_t state_ = nullptr;
};

}  // namespace dedup::rabbitmq

#endif  // DEDUP_SRC_BROKERS_RABBITMQ_AMQP_CONN_H_
