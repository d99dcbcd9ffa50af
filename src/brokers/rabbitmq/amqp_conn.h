// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// One AMQP connection with channel 1 open, on rabbitmq-c. Not thread-safe: the
// owner serializes calls. Errors name the server and the operation, never the
// password.

#ifndef DEDUP_SRC_BROKERS_RABBITMQ_AMQP_CONN_H_
#define DEDUP_SRC_BROKERS_RABBITMQ_AMQP_CONN_H_

#include <amqp.h>

#include <chrono>
#include <memory>
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

// A deep copy of a delivered message's basic properties, headers of every field
// type included, which outlives the envelope they were read from (freed when the
// fetch that read it returns): its retry and dead-letter copies are sent with
// them. Throws std::bad_alloc as `new` does.
class OwnedProperties {
 public:
  explicit OwnedProperties(const amqp_basic_properties_t& p);
  ~OwnedProperties() { empty_amqp_pool(&pool_); }
  OwnedProperties(const OwnedProperties&) = delete;
  OwnedProperties& operator=(const OwnedProperties&) = delete;
  const amqp_basic_properties_t& get() const { return p_; }

 private:
  amqp_pool_t pool_;
  amqp_basic_properties_t p_;
};

// The basic properties `m` is sent with (AmqpMessage says which), pointing into
// `m` and its original: valid while both live and this is not moved. `sender`
// is the user the connection logged in as: the broker refuses a user_id that is
// not its own (406 PRECONDITION_FAILED), so the original's is kept only when it
// is the sender's.
class CopyProperties {
 public:
  CopyProperties(const AmqpMessage& m, std::string_view sender);
  CopyProperties(const CopyProperties&) = delete;
  CopyProperties& operator=(const CopyProperties&) = delete;
  const amqp_basic_properties_t& get() const { return p_; }
  // The bytes these properties take in a content-header frame (flags and
  // fields, not the frame's or the header's own 14 + 8); SIZE_MAX when the
  // headers alone exceed 128 KiB.
  size_t EncodedSize() const;

 private:
  amqp_basic_properties_t p_{};
  std::vector<amqp_table_entry_t> entries_;
};

class AmqpConn {
 public:
  explicit AmqpConn(const RabbitMqOptions& o) : o_(o) {}
  ~AmqpConn() { Close(); }
  AmqpConn(const AmqpConn&) = delete;
  AmqpConn& operator=(const AmqpConn&) = delete;

  // Makes channel 1 usable: when the connection lives and only the channel was
  // closed by the server (a channel exception), opens the channel again on it;
  // else connects, logs in and opens channel 1. Either way what the owner set up
  // on the channel (qos, consume, confirm.select) must be done again, and
  // delivery tags of the old channel mean nothing on the new one. Unavailable
  // when the server cannot be reached, Unauthenticated on a refused login.
  [[nodiscard]] Status Open();
  // Ends the connection. While it works, with connection.close and its close-ok
  // (awaited at most a second): the broker sees a client that said goodbye, not
  // "client unexpectedly closed TCP connection". A broken one (socket error, a
  // timeout of unknown outcome) loses only its socket.
  void Close();
  // Closes the socket alone: the connection failed and nothing more can be said on it.
  void Drop();
  // Sends a heartbeat frame when half the negotiated heartbeat interval has
  // passed since the last one this sent (none when heartbeats are off or the
  // connection is not open). rabbitmq-c sends heartbeats only from inside its
  // own calls (a read, a publish): a connection nothing is done on past the
  // heartbeat timeout (a consumer whose window is full of long handlers, a
  // publisher between copies) was closed by the broker. Called
  // every few hundred milliseconds by the owner, serialized as every call. A
  // failed send drops the connection (the next Open() connects again).
  void KeepAlive();
  // Channel 1 is open on a live connection.
  bool open() const { return state_ != nullptr && channel_open_; }
  amqp_connection_state_t get() const { return state_; }

  // The status of the last synchronous RPC (declare, qos, consume ...). On a
  // channel exception (404 of a passive declare, 406, 403) the server closed
  // channel 1 only: it is answered with channel.close-ok and the connection kept
  // (open() is false until Open() opens the channel again). On a connection
  // exception or a library error the connection is gone.
  [[nodiscard]] Status RpcStatus(std::string_view what);
  // channel.close or connection.close received from the server (an RPC's reply or
  // a frame read while consuming or awaiting confirms): answers it with its
  // close-ok, as AMQP 0-9-1 asks, and says what the server said (404 NotFound,
  // 403 PermissionDenied, 406 FailedPrecondition, else Unavailable).
  [[nodiscard]] Status ServerClosed(const amqp_method_t& method, std::string_view what);
  // A status for a library error code; drops the connection on socket errors.
  [[nodiscard]] Status LibraryError(int code, std::string_view what);
  std::string Name() const;

 private:
  RabbitMqOptions o_;
  amqp_connection_state_t state_ = nullptr;
  bool channel_open_ = false;
  bool broken_ = false;  // nothing more can be sent on it (Close drops it)
  std::chrono::steady_clock::time_point last_beat_{};  // KeepAlive's last heartbeat
};

}  // namespace dedup::rabbitmq

#endif  // DEDUP_SRC_BROKERS_RABBITMQ_AMQP_CONN_H_
