// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The one Redis client layer of dedup, on hiredis: connections, a bounded set of
// connections per server (pooled or auto-pipelined), a router that sends each key
// to the primary that owns its slot (Redis Cluster) or to the one server, and a
// Client that follows MOVED / ASK / TRYAGAIN and reloads scripts on NOSCRIPT.
// Used by the Redis store, `dedup bench` and the tests.
//
// Errors always name the server and the operation:
//   "redis 127.0.0.1:6390: claim: connection refused".
// Transport failures map to canonical codes: refused / closed / reset →
// Unavailable, a timeout on a sent command → DeadlineExceeded (effect unknown), a
// peer that does not speak RESP → FailedPrecondition, bad credentials →
// Unauthenticated. A failed connection is thrown away; the node reconnects with
// backoff, and while a server stays down calls fail at once with Unavailable.
//
// Commands that may have reached the server are never sent again by this layer:
// once any byte of a call was written, a failure (send cut short, connection
// closed or reset before the replies, no reply in time) is the call's answer, its
// message says "effect unknown", and `*sent` (where asked) is true; the caller
// decides (the Redis store retries a claim with the same token and recognises its
// own record). A call is sent once more on a fresh connection only when nothing of
// it was written: a connection that the server closed while it was idle (restart,
// idle timeout) is found before anything is written to it, and a write that fails
// at its first byte wrote nothing.
//
// Auto-pipelining (ConnectionOptions::auto_pipeline, the default): the callers of
// one node share its connections. A caller queues its commands on the connection
// it used last if nobody is on it, else on the least loaded one; if nobody is
// talking on it, it becomes the connection's leader: it takes everything queued
// so far (its own and other threads'), writes it in one write, reads the replies
// in order and hands each caller its own, then wakes them. Callers that arrived
// meanwhile form the next batch. So N threads on one connection cost about one
// round trip per batch instead of N, and one thread alone costs what a dedicated
// connection costs. A caller's commands are contiguous on the wire
// (ASKING + command, MULTI ... EXEC stay together). Blocking commands (BLPOP,
// XREADGROUP BLOCK) must not be sent on a shared connection: use Connection.

#ifndef DEDUP_SRC_REDIS_CLIENT_H_
#define DEDUP_SRC_REDIS_CLIENT_H_

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/wait_stop.h"
#include "dedup/clock.h"
#include "dedup/status.h"
#include "redis/options.h"
#include "redis/scripts.h"

struct redisContext;
struct redisReply;

namespace dedup::redis {

// The steady clock in ms: the client's reconnect backoff and the store's timing.
using internal::SteadyMillis;

struct ReplyDeleter {
  void operator()(redisReply* r) const;
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

// One command: its arguments, binary-safe.
struct Command {
  std::vector<std::string> args;
};

// Commands in their wire format (RESP arrays of bulk strings), written in place
// into one buffer that its owner keeps and reuses: no std::string per argument,
// no formatting when they are sent (the bytes go to the socket buffer as they
// are). A command may mark one argument as its key, which routes it (Redis
// Cluster). The hot paths (the Redis store's claims) build these directly;
// Command is formatted into one on its way out.
class CommandBuffer {
 public:
  CommandBuffer() = default;
  CommandBuffer(const CommandBuffer&) = delete;
  CommandBuffer& operator=(const CommandBuffer&) = delete;

  // Forgets the commands; keeps the memory (unless it grew past 1 MiB).
  void Clear();
  // Starts a command of `nargs` arguments: exactly that many Arg / Number / Key
  // calls must follow.
  void Begin(size_t nargs);
  // One argument made of `a` and then `b` (e.g. prefix and key), never joined in
  // a string first.
  void Arg(std::string_view a, std::string_view b = {});
  void Number(uint64_t n);  // decimal
  // An argument (a then b) that is the command's key: it routes the command.
  void Key(std::string_view a, std::string_view b = {});
  // A Command, formatted; `key` routes it (empty: none).
  void Append(const Command& cmd, std::string_view key = {});
  // Command i of `from`, with its key.
  void AppendFrom(const CommandBuffer& from, size_t i);

  size_t size() const { return cmds_.size(); }
  bool empty() const { return cmds_.empty(); }
  std::string_view bytes() const { return {buf_.get(), len_}; }
  std::string_view command(size_t i) const;
  std::string_view key(size_t i) const;

 private:
  struct Span {
    size_t begin;    // first byte of the command in buf_
    size_t key_at;   // first byte of its key, in buf_ or (side) in side_keys_
    size_t key_len;  // 0: no key
    bool side;       // the key is not one of its arguments (Append with a key)
  };
  // Room for n more bytes at buf_ + len_.
  char* Room(size_t n) {
    if (len_ + n > cap_) Grow(n);
    return buf_.get() + len_;
  }
  void Grow(size_t n);
  char* Bulk(std::string_view a, std::string_view b);  // writes $len a b; returns a's start

  std::unique_ptr<char[]> buf_;
  size_t len_ = 0, cap_ = 0;
  std::vector<Span> cmds_;
  std::string side_keys_;
};

// What a Client's connections are told when its caller stops (Client::
// StopWaiting): internal::WaitStop, its servers named by Endpoint::Name().
using internal::WaitStop;

// A connected, authenticated hiredis context. Not thread-safe: one caller at a time.
class Connection {
 public:
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Connects, authenticates, selects the db and checks the peer answers PING.
  static StatusOr<std::unique_ptr<Connection>> Open(const Endpoint& ep,
                                                    const ConnectionOptions& o);

  // Sends every command and reads every reply, in one round trip. Error replies
  // are replies (the caller reads them); a non-OK status means the connection is
  // broken and must be thrown away. `*read` (if given) counts the replies read
  // before a failure. `extra_timeout` lengthens the reply wait (BLOCK reads).
  Status Pipeline(std::span<const Command* const> cmds, std::vector<Reply>* replies,
                  std::string_view op, size_t* read = nullptr, Millis extra_timeout = Millis(0));
  Status Pipeline(const CommandBuffer& cmds, std::vector<Reply>* replies, std::string_view op,
                  size_t* read = nullptr, Millis extra_timeout = Millis(0));
  // Lower level: queue commands already formatted (RESP), send what is queued,
  // read `n` replies into `out` (reading sends what is still queued first).
  Status Queue(std::string_view resp, std::string_view op);
  Status Flush(std::string_view op);
  // Queue + Flush, writing straight from `resp` when nothing is queued. Every
  // write is ours (WriteAll), never hiredis's: no SIGPIPE on a reset connection.
  Status Send(std::string_view resp, std::string_view op);
  Status ReadReplies(size_t n, Reply* out, std::string_view op, size_t* read);

  const Endpoint& endpoint() const { return ep_; }

  // Whether some byte of the last Pipeline / Send / Flush was written to the
  // socket: after a failure, the server may have run some of its commands.
  bool reached() const { return reached_; }
  // False when the server has closed (or reset) the connection, or sent bytes
  // nobody asked for, while it was idle: it must not be written to. Checked with
  // one non-blocking peek, only after about kIdleCheck without a reply (a
  // connection in steady use costs a coarse clock read).
  bool LooksAlive();
  static constexpr Millis kIdleCheck{5};

 private:
  Connection(Endpoint ep, redisContext* c, Millis timeout, std::chrono::microseconds spin,
             const WaitStop* stop)
      : ep_(std::move(ep)), c_(c), timeout_(timeout), current_timeout_(timeout), spin_(spin),
        stop_(stop) {}
  // redisGetReply for a connection with a WaitStop: the wait for bytes is a
  // poll(2) of the socket and the stop's eventfd, bounded by the timeout as the
  // socket's receive timeout bounds a recv, and once stopped by GiveUpAt(start).
  Status AwaitReply(void** reply, int64_t start_ms, std::string_view op);
  // Before blocking for a reply, polls the socket (non-blocking, yielding the CPU
  // between polls) for up to spin_: false (c_->err set) when the socket failed.
  bool SpinForReply();
  // `sent`: some byte of the commands was written; `reading`: waiting for replies.
  Status TransportError(std::string_view op, bool sent, bool reading) const;
  Status WriteAll(std::string_view bytes, std::string_view op);

  Endpoint ep_;
  redisContext* c_;
  Millis timeout_;
  Millis current_timeout_;
  const std::chrono::microseconds spin_;
  const WaitStop* const stop_;  // null: replies are waited for in recv(2)
  int skip_spins_ = 0;  // reads left that block at once: the last spin saw no reply
  // Open's AUTH / SELECT / PING: a failure then sent none of a caller's commands.
  bool handshake_ = false;
  bool reached_ = false;
  int64_t last_reply_ms_ = 0;  // coarse steady ms of the last complete read of replies
};

class SharedConnection;

// One server: up to pool_size connections, reconnect backoff, and (auto_pipeline)
// the batching of concurrent callers described above.
class Node {
 public:
  Node(Endpoint ep, const ConnectionOptions* options);
  ~Node();

  // Runs `cmds` as one pipeline. When a connection that was already open turns out
  // dead before anything was written to it (the server restarted), it is dropped
  // and the pipeline sent on a fresh connection; once something was written it is
  // never sent again (see "Commands that may have reached the server" above).
  // On failure, `*sent` (if given) says whether any of it may have reached the
  // server.
  Status Pipeline(std::span<const Command* const> cmds, std::vector<Reply>* replies,
                  std::string_view op, bool* sent = nullptr);
  Status Pipeline(const CommandBuffer& cmds, std::vector<Reply>* replies, std::string_view op,
                  bool* sent = nullptr);

  // A fresh connection to this server for the caller alone (e.g. blocking reads).
  StatusOr<std::unique_ptr<Connection>> Dedicated(std::string_view op);

  const Endpoint& endpoint() const { return ep_; }
  const std::string& name() const { return name_; }

  // Round trips (writes) and commands sent since the node was made.
  uint64_t round_trips() const { return round_trips_.load(std::memory_order_relaxed); }
  uint64_t commands() const { return commands_.load(std::memory_order_relaxed); }

 private:
  friend class SharedConnection;
  // Opens a connection, honouring the backoff. Errors are not prefixed.
  StatusOr<std::unique_ptr<Connection>> Connect();
  Status PooledPipeline(const CommandBuffer& cmds, std::vector<Reply>* replies,
                        std::string_view op, bool* sent);
  StatusOr<std::unique_ptr<Connection>> Acquire(std::string_view op, bool* reused);
  void Return(std::unique_ptr<Connection> c);
  void Discard(bool drop_idle);

  const Endpoint ep_;
  const std::string name_;
  const ConnectionOptions* const options_;

  // Backoff: no connect is tried before down_until_ (steady ms).
  std::mutex connect_mu_;
  int64_t down_until_ = 0;
  int64_t backoff_ms_ = 0;
  Status last_error_;

  // pipeline=off: a bounded pool of connections lent to one caller at a time.
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Connection>> idle_;
  size_t open_ = 0;  // idle + lent out + being connected

  // pipeline=auto: pool_size shared connections, made on first use.
  std::vector<std::unique_ptr<SharedConnection>> shared_;
  std::atomic<uint32_t> next_{0};

  std::atomic<uint64_t> round_trips_{0}, commands_{0};
};

// Cluster slot of a key: CRC16 (XMODEM) of the key, or of its {hash tag}, mod 16384.
uint16_t KeySlot(std::string_view key);

// Which node serves which key. Plain Redis: always the one node. Cluster: the slot
// map from CLUSTER SLOTS, patched by MOVED and refreshed after it.
class Router {
 public:
  explicit Router(ConnectionOptions options);
  // Gives up at once what a reload still waits for (Refresh), and joins it.
  ~Router();

  // Connects to the seeds and (cluster) loads the slot map.
  Status Start();

  bool cluster() const { return options_.cluster; }
  Node* NodeFor(std::string_view key);
  Node* NodeAt(const std::string& address);  // made on first use, kept for life
  std::vector<Node*> Primaries();            // every node that serves slots

  // A MOVED reply: patches the slot and asks for a full refresh.
  void OnMoved(uint16_t slot, const std::string& address);
  // A node that could not be reached (down, refusing, reset): asks for a full
  // refresh, as a MOVED does. A primary that died sends no MOVED: without this the
  // map kept naming it after its replica took over, and every call on its slots
  // failed until the store was opened again.
  // The failed node is asked last by the refresh.
  void OnNodeFailure(Node* n) {
    if (!options_.cluster) return;
    failed_ = n;
    stale_ = true;
  }
  // Reloads the slot map if a MOVED asked for it (at most every 100 ms).
  void MaybeRefresh();
  // Reloads the slot map: CLUSTER SLOTS of one node, then (no map within
  // kRefreshHedge, or a failure) of the next as well, and so on: the first map that
  // comes is taken. So a node that does not answer (frozen, a SIGSTOP; a lost
  // network) costs a reload kRefreshHedge, not its whole timeout, when another
  // answers. Each node is asked on a thread of its own; one that is still asked
  // when the reload returns goes on until its answer or timeout (and is not asked
  // again meanwhile), its answer dropped.
  Status Refresh();
  static constexpr Millis kRefreshHedge{100};

  const ConnectionOptions& options() const { return options_; }
  WaitStop& wait_stop() { return wait_stop_; }

 private:
  WaitStop wait_stop_;  // before options_, which points to it
  const ConnectionOptions options_;
  std::shared_mutex mu_;
  std::map<std::string, std::unique_ptr<Node>> nodes_;  // never shrinks
  std::array<Node*, 16384> slots_{};
  std::atomic<Node*> single_{nullptr};  // plain Redis: the one node
  std::atomic<bool> stale_{false};
  std::atomic<Node*> failed_{nullptr};  // the node OnNodeFailure named last
  std::atomic<int64_t> last_refresh_{0};
  std::mutex refresh_mu_;

  // Refresh's asks, each on a thread of its own (it may outlive the Refresh).
  struct SlotsAsk;
  void AskSlots(const std::shared_ptr<SlotsAsk>& ask, Node* n, size_t i);
  // The map of `n`'s CLUSTER SLOTS answer taken, or why not.
  Status UseSlots(Node* n, const redisReply* r);
  struct Asker {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::mutex askers_mu_;
  std::vector<Asker> askers_;   // joined once done (next Refresh) or at the end
  std::set<Node*> asking_;      // nodes asked and not answered yet
};

// Commands by key over a Router: follows MOVED / ASK / TRYAGAIN, and answers
// NOSCRIPT by sending the script's body (EVAL) from `scripts`.
class Client {
 public:
  // `scripts` may be null (no EVALSHA is sent); it must outlive the Client.
  Client(ConnectionOptions options, const ScriptSet* scripts = nullptr);

  // Connects (every cluster primary) before the client is used.
  Status Start();

  // One command on the node owning `key`. Error replies other than redirects are
  // returned as a status (ErrorReplyStatus).
  StatusOr<Reply> Exec(std::string_view op, const std::string& key, Command cmd,
                       bool* sent = nullptr);
  // The same for the one command of `cmd`, routed by its key. It must not be
  // EVALSHA: a NOSCRIPT reply is returned as an error like any other. On a
  // transport failure `*sent` (if given) says whether it may have reached a server.
  StatusOr<Reply> Exec(std::string_view op, const CommandBuffer& cmd, bool* sent = nullptr);
  // Exec without turning error replies into a status: every reply other than a
  // redirect (errors too) is returned as it came, for a caller that reads an
  // error reply itself (e.g. names the key it sent, as ExecMany's callers do).
  // The Command form answers NOSCRIPT by sending the script's body (EVAL).
  StatusOr<Reply> Call(std::string_view op, const CommandBuffer& cmd, bool* sent = nullptr);
  StatusOr<Reply> Call(std::string_view op, const std::string& key, Command cmd,
                       bool* sent = nullptr);
  // Many commands, one pipeline per node, then each one answered with a redirect or
  // NOSCRIPT resent on its own. Replies are in the order of `cmds`; error replies
  // other than redirects are left for the caller. A node that fails before any of
  // its part was written (down, refusing: a primary that died) has the map
  // reloaded, and its commands whose slots another node serves now (the replica
  // that took over) are sent there, once, in this call. When a node fails, the
  // others are still asked: the status is the first failure, and `*replies` keeps
  // the replies that came (null for the commands whose node failed), so that a
  // caller can undo what was done on the nodes that answered.
  // `(*unknown)[i]` (if given) is true for a command that got no reply and may
  // have reached its server (its effect is unknown), false for every other.
  Status ExecMany(std::string_view op, const std::vector<std::string>& keys,
                  std::vector<Command>& cmds, std::vector<Reply>* replies,
                  bool* sent = nullptr, std::vector<bool>* unknown = nullptr);
  // The same for commands routed by their keys; redirects are followed, NOSCRIPT
  // replies are left for the caller. `*sent` as for Exec, for any failed node.
  Status ExecMany(std::string_view op, const CommandBuffer& cmds, std::vector<Reply>* replies,
                  bool* sent = nullptr, std::vector<bool>* unknown = nullptr);

  // The caller is stopping: no call of this Client waits more than `grace` for
  // a reply from now on (a call already waiting: from now; a later one, its
  // connect included: from its start). One that gets none in time fails with
  // Aborted ("given up ..."; effect unknown, as after any lost reply). Any
  // thread; never blocks; not undone. Connections of this Client's options
  // opened elsewhere (Node::Dedicated) are bounded alike.
  void StopWaiting(Millis grace) { router_.wait_stop().Stop(grace); }
  bool stopped_waiting() { return router_.wait_stop().stopped(); }

  Router& router() { return router_; }
  const ConnectionOptions& options() const { return router_.options(); }

 private:
  // Command i of `cmds` on the node of its key, following MOVED / ASK / TRYAGAIN.
  // Every other reply, errors included, is returned as it came.
  StatusOr<Reply> Run(std::string_view op, const CommandBuffer& cmds, size_t i,
                      bool* sent = nullptr);
  Router router_;
  const ScriptSet* const scripts_;
};

// Helpers on replies.
bool IsError(const redisReply* r);
std::string_view ReplyText(const redisReply* r);  // string/status/error text, "" otherwise
// An error reply that says the server does not have the script (EVALSHA).
bool IsNoScript(const redisReply* r);
// Whether some reply is READONLY: the server is a replica now (a failover made
// another server the primary, and this one was turned into its replica:
// Sentinel, REPLICAOF). Every user of a Connection drops the one that got it
// (the pool, the cluster router, the Streams source's StreamConn), so that the
// next call connects to the address again and reaches whatever server it leads
// to then (a virtual IP, a proxy or a DNS name that followed the failover).
bool AnyReadOnly(const Reply* replies, size_t n);
// The canonical code for an error reply that is not a redirect; `where` prefixes it.
// The reply is shown WithoutScriptLocation.
Status ErrorReplyStatus(const std::string& where, std::string_view error);
// `error` without the tail Redis 7 puts on an error raised inside a script
// ("... script: b721962f..., on @user_script:91."): its SHA and line mean
// nothing to a reader of dedup's message.
std::string_view WithoutScriptLocation(std::string_view error);
// The words of a dedup script's error reply after its code and the script's
// name: "DEDUPCORRUPT claim: record is not ..." → "record is not ...".
std::string_view ScriptErrorWords(std::string_view error);

}  // namespace dedup::redis

#endif  // DEDUP_SRC_REDIS_CLIENT_H_
