// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The small Redis client under the Redis store: blocking hiredis connections, a
// bounded pool per server, and a router that sends each key to the primary that
// owns its slot (Redis Cluster) or to the one server (plain Redis).
//
// Errors always name the server and the operation:
//   "redis 127.0.0.1:6390: claim: connection refused".
// Transport failures map to canonical codes: refused / closed / reset →
// Unavailable, a timeout on a sent command → DeadlineExceeded (effect unknown), a
// peer that does not speak RESP → FailedPrecondition, bad credentials →
// Unauthenticated. A failed connection is thrown away; the pool reconnects with
// backoff, and while a server stays down calls fail at once with Unavailable.

#ifndef DEDUP_SRC_STORES_REDIS_REDIS_CLIENT_H_
#define DEDUP_SRC_STORES_REDIS_REDIS_CLIENT_H_

#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dedup/clock.h"
#include "dedup/status.h"

struct redisContext;
struct redisReply;

namespace dedup::redis {

struct ReplyDeleter {
  void operator()(redisReply* r) const;
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// One command: its arguments, binary-safe.
struct Command {
  std::vector<std::string> args;
};

struct Endpoint {
  std::string host;
  int port = 6379;
  std::string Name() const;  // "127.0.0.1:6390", "[::1]:6390"
};

// Parses "host:port", "host" (port 6379) or "[v6]:port".
StatusOr<Endpoint> ParseEndpoint(std::string_view text);

struct ClientOptions {
  // Bounds connecting and every command (send + reply). Default: 2 s.
  Millis timeout{2'000};
  // AUTH: `user` empty means the password alone (requirepass / default user).
  std::string user, password;
  bool has_password = false;
  // SELECT after connecting; plain Redis only. Default: 0.
  int db = 0;
  // Connections per server, at most. Default: 8.
  size_t pool_size = 8;
};

// A connected, authenticated hiredis context. Not thread-safe; owned by one
// caller at a time through Node.
class Connection {
 public:
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects, authenticates, selects the db and checks the peer answers PING.
  static StatusOr<std::unique_ptr<Connection>> Open(const Endpoint& ep, const ClientOptions& o);

  // Sends every command and reads every reply, in one round trip. Error replies
  // are replies (the caller reads them); a non-OK status means the connection is
  // broken and must be thrown away.
  Status Pipeline(std::span<const Command* const> cmds, std::vector<Reply>* replies,
                  std::string_view op);

  const Endpoint& endpoint() const { return ep_; }

 private:
  Connection(Endpoint ep, redisContext* c, Millis timeout)
      : ep_(std::move(ep)), c_(c), timeout_(timeout) {}
  Status TransportError(std::string_view op, bool sent) const;

  Endpoint ep_;
  redisContext* c_;
  Millis timeout_;
};

// One server: a bounded pool of connections plus reconnect backoff.
class Node {
 public:
  Node(Endpoint ep, const ClientOptions* options);
  ~Node();

  // Runs `cmds` as one pipeline on a pooled connection. When a connection taken
  // from the pool turns out dead (the server restarted), the pool is emptied and
  // the pipeline is sent once more on a fresh connection.
  Status Pipeline(std::span<const Command* const> cmds, std::vector<Reply>* replies,
                  std::string_view op);

  const Endpoint& endpoint() const { return ep_; }
  const std::string& name() const { return name_; }

 private:
  StatusOr<std::unique_ptr<Connection>> Acquire(std::string_view op, bool* reused);
  void Return(std::unique_ptr<Connection> c);
  void Discard(bool drop_idle);

  const Endpoint ep_;
  const std::string name_;
  const ClientOptions* const options_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> idle_;
  size_t open_ = 0;  // idle + lent out + being connected
  // Reconnect backoff: no connect is tried before down_until_ (steady ms).
  int64_t down_until_ = 0;
  int64_t backoff_ms_ = 0;
  Status last_error_;
};

// Cluster slot of a key: CRC16 (XMODEM) of the key, or of its {hash tag}, mod 16384.
uint16_t KeySlot(std::string_view key);

// Which node serves which key. Plain Redis: always the one node. Cluster: the slot
// map from CLUSTER SLOTS, patched by MOVED and refreshed after it.
class Router {
 public:
  Router(std::vector<Endpoint> seeds, bool cluster, ClientOptions options);

  // Connects to the seeds and (cluster) loads the slot map.
  Status Start();

  bool cluster() const { return cluster_; }
  Node* NodeFor(std::string_view key);
  Node* NodeAt(const std::string& address);  // made on first use, kept for life
  std::vector<Node*> Primaries();            // every node that serves slots

  // A MOVED reply: patches the slot and asks for a full refresh.
  void OnMoved(uint16_t slot, const std::string& address);
  // Reloads the slot map if a MOVED asked for it (at most every 100 ms).
  void MaybeRefresh();
  Status Refresh();

  const ClientOptions& options() const { return options_; }

 private:
  const std::vector<Endpoint> seeds_;
  const bool cluster_;
  const ClientOptions options_;
  std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<Node>> nodes_;  // never shrinks
  std::array<Node*, 16384> slots_{};
  std::atomic<bool> stale_{false};
  std::atomic<int64_t> last_refresh_{0};
  std::mutex refresh_mu_;
};

// Helpers on replies.
bool IsError(const redisReply* r);
std::string_view ReplyText(const redisReply* r);

}  // namespace dedup::redis

#endif  // DEDUP_SRC_STORES_REDIS_REDIS_CLIENT_H_
