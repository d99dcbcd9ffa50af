// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// How to reach Redis, read once from a URI by the one parser that the Redis store,
// the Redis Streams source, `dedup bench` and the tests share:
//
//   redis://[[user]:password@]host[:port][/db][?option=value&...]
//   redis+cluster://[[user]:password@]host[:port][,host[:port]...][?option=value&...]
//
//   host       a name, an IPv4 address, or an IPv6 address in brackets: [::1]:6379
//   port       Default: 6379
//   user       ACL user; "redis://:pw@h" and "redis://pw@h" (as redis-cli reads
//              it) give the password alone (the default user)
//   db         logical database, plain Redis only.              Default: 0
//   timeout    bounds each connect and each command round trip. Default: 2s
//   pool       connections per Redis server, at most.           Default: 8
//   pipeline   auto: threads share the pool's connections and their concurrent
//              commands go out together (one write, one read for many callers);
//              off: each call has a connection to itself.       Default: auto
//   spin       microseconds a caller waiting for its replies polls the socket
//              (yielding the CPU between polls) before it sleeps in the kernel;
//              0 to 1000, 0: sleep at once.                      Default: 0
//
// TLS is named but not supported yet: rediss://, rediss+cluster:// and the options
// tls, tls_ca, tls_cert, tls_key, tls_sni are refused with Unimplemented ("TLS is
// not supported yet") rather than ignored (tls=false is accepted).
//
// Errors name the bad part and never carry the password.

#ifndef DEDUP_SRC_REDIS_OPTIONS_H_
#define DEDUP_SRC_REDIS_OPTIONS_H_

#include <chrono>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "core/uri.h"
#include "dedup/clock.h"
#include "dedup/status.h"

namespace dedup::internal {
class WaitStop;  // core/wait_stop.h
}  // namespace dedup::internal

namespace dedup::redis {

using internal::WaitStop;

struct Endpoint {
  std::string host;  // without brackets: "::1"
  int port = 6379;
  std::string Name() const;  // "127.0.0.1:6390", "[::1]:6390"
};

// Parses "host:port", "host" (port 6379), "[v6]:port" or "[v6]".
StatusOr<Endpoint> ParseEndpoint(std::string_view text);

struct ConnectionOptions {
  // The server, or any nodes of the cluster (seeds). At least one.
  std::vector<Endpoint> endpoints;
  // Route by cluster slot (CLUSTER SLOTS, MOVED, ASK). Default: false.
  bool cluster = false;
  // AUTH: `user` empty means the password alone (requirepass / default user).
  std::string user, password;
  bool has_password = false;
  // SELECT after connecting; plain Redis only. Default: 0.
  int db = 0;
  // Bounds connecting and every command (send + reply). Default: 2 s.
  Millis timeout{2'000};
  // Connections per server, at most. Default: 8.
  size_t pool_size = 8;
  // Threads share connections; concurrent commands share round trips. Default: true.
  bool auto_pipeline = true;
  // How long a reader polls its socket for replies before it blocks in recv. A
  // thread that sleeps lets its (virtual) CPU go idle, and waking an idle CPU for
  // the reply can cost more than the round trip itself (docs/PERFORMANCE.md,
  // "Depth 1: polling for the reply"). Off by default: on a busy 2-core machine
  // it cost client CPU and throughput at 8 connections; measured side by side in
  // `dedup bench` (the "spin=50" row). Default: 0.
  std::chrono::microseconds reply_spin{0};
  // Not owned. Set by a Client for its own connections (Client::StopWaiting):
  // their waits for replies can then be cut short. Null: a Connection waits
  // for its replies as the timeout says, in recv(2). Default: null.
  const WaitStop* wait_stop = nullptr;

  // OK, or InvalidArgument naming the bad field.
  Status Validate() const;
  // The URI without the password: "redis://user:***@[::1]:6390/2".
  std::string Describe() const;
};

// A parsed redis:// or redis+cluster:// URI: the connection, and the URI itself
// for the caller's own options (uri.Param("prefix")).
struct RedisUri {
  ConnectionOptions connection;
  internal::Uri uri;
};

// Which connection options a caller's connections take: a store's pooled,
// auto-pipelined ones every one; a connection of the caller's own (a broker's
// source, the textbook guard, the bench's redis-benchmark) only timeout= and
// password_file=, so that pool=, pipeline= and spin= are refused, not ignored.
enum class Connections { kPooled, kSingle };

// `caller_params` are the options the caller reads itself (e.g. "prefix", or
// "stream", "group"); any other option is refused, naming it and listing the known.
StatusOr<RedisUri> ParseRedisUri(std::string_view text,
                                 std::initializer_list<std::string_view> caller_params = {},
                                 Connections connections = Connections::kPooled);
// The same, from a URI already split by internal::ParseUri.
StatusOr<RedisUri> ParseRedisUri(const internal::Uri& uri,
                                 std::initializer_list<std::string_view> caller_params = {},
                                 Connections connections = Connections::kPooled);

}  // namespace dedup::redis

#endif  // DEDUP_SRC_REDIS_OPTIONS_H_
