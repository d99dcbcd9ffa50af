// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The Redis and Redis Cluster store. Opened from a URI through OpenStore():
//
//   redis://[user:password@]host:port[/db][?prefix=P&timeout=T&pool=N&pipeline=auto|off]
//   redis+cluster://[user:password@]host:port[,host:port...][?prefix=P&...]
//
//   prefix   put before every key to make the Redis key.        Default: "dedup:"
//
// and the connection options of every Redis URI (src/redis/options.h: timeout,
// pool, pipeline; IPv6 hosts in brackets; TLS refused as not supported yet).
// Threads share the store's connections: concurrent claims go out together.
//
// One Redis key per dedup key (prefix + key), a packed string (record format 1,
// docs/REDIS_PROTOCOL.md) whose Redis expiry is the record's retention deadline.
// Every operation is one Lua script run with EVALSHA on the server that owns the
// key, so it is atomic, takes its time from the server's clock (TIME), and touches
// exactly one key (cluster-safe). Needs Redis 7.0 or later (PEXPIRETIME).
//
// What survives what: a record is as durable as Redis makes it (RDB / AOF
// settings, replication). An acknowledged Complete() can be lost by a Redis crash
// without `appendfsync always`, or by a failover to a replica that had not received
// it yet. Redis must not evict keys (maxmemory-policy noeviction), or completed
// records may be forgotten before their retention ends.
//
// A record is kept while now <= retention deadline (Redis expires a key strictly
// after its PEXPIREAT time), i.e. at least as long as the contract asks.
//
// Batches (ClaimBatch, CompleteBatch) on a cluster go out as one pipeline per
// node. The part of a node that failed before anything of it was written (down,
// refusing) is sent, after a reload of the slot map, to the node that serves
// those slots now (the replica that took over), in the same call. While no node
// does, the batch fails as a whole: the batch contract (store.h) has no answer
// per item, and ClaimBatch releases the claims it made on the other nodes.
//
// A server that answers READONLY (a replica now: a Sentinel failover or REPLICAOF
// turned it from the primary) fails the call with Unavailable naming READONLY,
// and its connection is dropped: the next call connects to the address again.

#ifndef DEDUP_SRC_STORES_REDIS_REDIS_STORE_H_
#define DEDUP_SRC_STORES_REDIS_REDIS_STORE_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dedup/clock.h"
#include "dedup/store.h"

namespace dedup {

struct RedisStoreOptions {
  // "host:port" of the server, or of any cluster nodes (seeds). Required.
  std::vector<std::string> hosts;
  // Route by cluster slot (CLUSTER SLOTS, MOVED, ASK). Default: false.
  bool cluster = false;
  // ACL user; empty = the default user. Default: "".
  std::string user;
  // AUTH password, when has_password. Default: none.
  std::string password;
  bool has_password = false;
  // Logical database (plain Redis only). Default: 0.
  int db = 0;
  // Put before every key. Default: "dedup:".
  std::string prefix = "dedup:";
  // Bounds each connect and each command round trip. Default: 2 s.
  Millis timeout{2'000};
  // Connections per server, at most. Default: 8.
  size_t pool_size = 8;
  // Threads share connections; concurrent calls share round trips. Default: true.
  bool auto_pipeline = true;
  // What Describe() returns. Default: built from the fields above.
  std::string description;
  // Receives the start-up warnings (OpenOptions::on_warning). Default (null):
  // each is written to stderr after "dedup: ". To drop them, give a function
  // that does nothing.
  std::function<void(const std::string&)> on_warning;
};

// Connects (to every cluster primary, for a cluster) and checks the server
// version. Unavailable when no server answers, Unauthenticated on a bad password,
// FailedPrecondition for a peer that is not Redis 7+ (or not a cluster node).
// On every primary it also checks, once:
//  - that the ACL user may run what dedup sends (EVALSHA, EVAL, and SET, GET,
//    PEXPIRE, PEXPIRETIME, TIME on keys under the prefix): PermissionDenied naming
//    the missing commands, before any message is handled;
//  - maxmemory-policy and appendonly (from INFO): an evicting policy (allkeys-* or
//    volatile-*: every record has a TTL) or appendonly no is a warning, with the
//    fix, through on_warning; settings INFO does not report give a note instead.
[[nodiscard]] StatusOr<std::unique_ptr<Store>> OpenRedisStore(const RedisStoreOptions& options);

}  // namespace dedup

#endif  // DEDUP_SRC_STORES_REDIS_REDIS_STORE_H_
