// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// One blocking connection for the stream side of the worker (XREADGROUP, XACK,
// XADD, XAUTOCLAIM) and for the textbook guard, on the Redis client layer
// (src/redis): the same handshake (AUTH with user, SELECT db, PING), timeouts and
// error codes as the store's. Not thread-safe: one per thread. A connection that
// failed, or answered READONLY (a primary turned replica behind a moving address),
// is dropped and reopened on the next command. Errors name the server and
// the command: "redis 127.0.0.1:6390: XACK: ...".

#ifndef DEDUP_SRC_BROKERS_REDIS_STREAMS_STREAM_CONN_H_
#define DEDUP_SRC_BROKERS_REDIS_STREAMS_STREAM_CONN_H_

#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dedup/clock.h"
#include "dedup/status.h"
#include "redis/client.h"

namespace dedup::streams {

using ReplyPtr = redis::Reply;

struct ConnOptions {
  std::string host = "127.0.0.1";  // Default: 127.0.0.1
  int port = 6379;                 // Default: 6379
  std::string user;                // ACL user; empty = the default user
  std::string password;            // AUTH when has_password
  bool has_password = false;
  int db = 0;                      // SELECT after connecting. Default: 0
  Millis timeout{2'000};           // connect and each command. Default: 2 s
};

class StreamConn {
 public:
  explicit StreamConn(ConnOptions o);
  StreamConn(const StreamConn&) = delete;
  StreamConn& operator=(const StreamConn&) = delete;

  // Sends one command. An error reply is returned as a reply (type
  // REDIS_REPLY_ERROR; READONLY drops the connection); a transport failure is
  // Unavailable (or DeadlineExceeded on a timeout) and drops the connection. `extra_timeout` is added to the command's
  // time bound (for BLOCK reads).
  StatusOr<ReplyPtr> Run(const std::vector<std::string>& args, Millis extra_timeout = Millis(0));
  // Sends several commands in one round trip; one reply each, in order (error
  // replies included). A transport failure drops the connection, as Run's.
  StatusOr<std::vector<ReplyPtr>> RunAll(const std::vector<std::vector<std::string>>& commands);

  std::string Name() const { return options_.endpoints.front().Name(); }

 private:
  StatusOr<std::vector<ReplyPtr>> Pipeline(std::span<const redis::Command* const> cmds,
                                           Millis extra_timeout);
  redis::ConnectionOptions options_;
  std::unique_ptr<redis::Connection> conn_;
};

// Reply helpers.
inline bool IsError(const redisReply* r) { return redis::IsError(r); }
// string/status/error text, "" otherwise.
inline std::string ReplyText(const redisReply* r) { return std::string(redis::ReplyText(r)); }

}  // namespace dedup::streams

#endif  // DEDUP_SRC_BROKERS_REDIS_STREAMS_STREAM_CONN_H_
