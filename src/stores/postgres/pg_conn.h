// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The thin layer over libpq the PostgreSQL store uses: a connection that turns
// libpq's errors into Status (naming the server and the operation, never the
// password), binary parameters, binary result readers, and a pool.

#ifndef DEDUP_SRC_STORES_POSTGRES_PG_CONN_H_
#define DEDUP_SRC_STORES_POSTGRES_PG_CONN_H_

#include <libpq-fe.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/wait_stop.h"
#include "dedup/postgres_store.h"
#include "dedup/status.h"

namespace dedup::pg {

// PostgreSQL type OIDs of the parameters the store sends.
inline constexpr unsigned kInt8Oid = 20;
inline constexpr unsigned kByteaOid = 17;
inline constexpr unsigned kTextOid = 25;

// Binary parameters for PQexecPrepared / PQexecParams.
class Params {
 public:
  Params& Bytes(std::string_view b);
  Params& Int8(int64_t v);
  int size() const { return static_cast<int>(values_.size()); }
  const char* const* values();
  const int* lengths() const { return lengths_.data(); }
  const int* formats() const { return formats_.data(); }

 private:
  std::vector<std::string> storage_;
  std::vector<const char*> values_;
  std::vector<int> lengths_, formats_;
};

// What a store's connections are told when its caller stops (Store::StopWaiting):
// internal::WaitStop, for one server (no server name).
using internal::WaitStop;

// Owns a PGresult.
struct ResultDeleter {
  void operator()(PGresult* r) const { PQclear(r); }
};
using Result = std::unique_ptr<PGresult, ResultDeleter>;

// Binary result readers (the store asks for binary results of bigint and bytea).
int64_t GetInt8(const PGresult* r, int row, int col);
std::string GetBytes(const PGresult* r, int row, int col);

// One connection. Not thread-safe; the pool hands it to one thread at a time.
class Conn {
 public:
  // `where` names the server in messages, e.g. "postgres 127.0.0.1:5432".
  // `server_version` (PQserverVersion, 0 = not known yet: the first connection,
  // which checks it) decides which timeouts the connection may turn off.
  //
  // Every wait for the server is bounded here, on the client, not only by the
  // server's statement_timeout (which a frozen server, or a network that drops
  // packets, never enforces): connecting by max(2 s, timeout rounded up to whole
  // seconds), as libpq's connect_timeout did, and each exchange by timeout +
  // kAnswerSlack. A wait that ends so fails (DeadlineExceeded; with `stop`
  // stopped, Aborted), and the connection is abandoned: closed when handed back,
  // never written to again, the effect of what it sent unknown. Not owned;
  // null: no stop.
  static StatusOr<std::unique_ptr<Conn>> Open(const PostgresStoreOptions& o,
                                              const std::string& where, int server_version = 0,
                                              WaitStop* stop = nullptr);
  // How much longer than statement_timeout a statement's answer is waited for:
  // a server that runs answers by then (its own cancellation included).
  static constexpr Millis kAnswerSlack{1'000};
  ~Conn();
  PGconn* raw() { return conn_; }
  bool broken() const;
  // True when the server ended the session while the connection sat idle in the
  // pool (a restart's fast shutdown, pg_terminate_backend): its goodbye (FATAL
  // 57P01, then the end of the stream) waits unread on the socket, and a call sent
  // on it would fail though nothing had been in flight. One poll(2) that does not
  // wait; what an idle connection may also hear (a notice, a NOTIFY, a parameter
  // status) is consumed and keeps it.
  bool ClosedWhileIdle();
  // Closed when handed back: it holds session state that could not be cleared.
  void Poison() { poisoned_ = true; }
  // The SQLSTATE of the last error of a statement ("" for none or a transport
  // failure).
  const std::string& last_sqlstate() const { return last_sqlstate_; }
  // Its primary message as the server worded it, for the caller to recognise
  // an error of its own making; never shown (ErrorOf decides what is).
  const std::string& last_primary() const { return last_primary_; }

  // Runs a statement; an error status unless it returned tuples or a command OK.
  StatusOr<Result> Exec(std::string_view sql, std::string_view op);
  StatusOr<Result> ExecParams(std::string_view sql, Params& p, int result_format,
                              std::string_view op);
  StatusOr<Result> ExecPrepared(const char* name, Params& p, std::string_view op);
  Status Prepare(const char* name, const std::string& sql, const std::vector<unsigned>& types);
  // Sends with `send` (a PQsend* call on raw()) and waits, bounded as Open()
  // says, for every result: the last one, or the first error (as PQexec
  // answers). A status only when no result came: the connection failed, or the
  // wait ended (the connection is then abandoned); or the statement started a
  // COPY (FailedPrecondition naming it; abandoned too: nobody feeds it).
  StatusOr<Result> Run(const std::function<int(PGconn*)>& send, std::string_view op);
  // Sends `n` statements in one pipeline (send(raw(), i) queues statement i with
  // PQsendQueryParams or PQsendQueryPrepared), then a sync, and waits, bounded
  // as Run is (the whole pipeline within one wait), for every answer: one round
  // trip. One Result per statement, in order: its result, its error (the first
  // that failed: ErrorOf() makes its status), or PGRES_PIPELINE_ABORTED for each
  // after it (the server skipped them). A status only when not every answer
  // came: the connection is then abandoned.
  StatusOr<std::vector<Result>> RunPipeline(size_t n,
                                            const std::function<int(PGconn*, size_t)>& send,
                                            std::string_view op);

  // The status for a failed result (or a null one) of the store's own operation
  // `op`. Never the row's values (key, token, result): only the SQLSTATE
  // classes whose messages name objects and states (connection, transaction,
  // syntax and access, resources, ...) are shown as the server words them; any
  // other (a data exception, an integrity violation, a trigger's RAISE) is named
  // by its class, constraint, column, type and table.
  Status ErrorOf(const PGresult* r, std::string_view op);
  // The same for a statement a handler wrote: the server's whole message
  // (detail, hint, context): its data, its debugging.
  Status UserErrorOf(const PGresult* r, std::string_view op);
  // The same, for SQL text run inside the server (PL/pgSQL EXECUTE): the server's
  // message, detail and hint, and the line and column in that text, without the
  // context lines, which quote the whole text back.
  Status ScriptErrorOf(const PGresult* r, std::string_view op);
  // Classifies the error of `r` by its SQLSTATE, with `msg` as its words.
  Status ErrorWith(const PGresult* r, std::string_view op, std::string msg);

 private:
  Conn(PGconn* c, std::string where, Millis wait, WaitStop* stop)
      : conn_(c), where_(std::move(where)), wait_(wait), stop_(stop) {}
  // Waits until the socket is ready for `events` (POLLIN / POLLOUT), or the
  // exchange that began at `start_ms` must end: OK, or the failure to return.
  Status AwaitSocket(short events, int64_t start_ms, std::string_view op);
  // The steps Run and RunPipeline share. BeginExchange: OK and the connection
  // non-blocking, or why nothing may be sent (abandoned earlier, the caller
  // stopping); EndExchange (always, after): back to blocking. Lost: the
  // connection abandoned, and its status. FlushSent: what the sends queued is
  // written. NextResult: the next result (null at the end of a statement's).
  Status BeginExchange(int64_t start, std::string_view op);
  void EndExchange();
  Status Lost(std::string_view op);
  Status FlushSent(int64_t start, std::string_view op);
  Status NextResult(int64_t start, std::string_view op, Result* out);
  PGconn* conn_;
  std::string where_;
  Millis wait_;      // the longest wait for an answer (timeout + kAnswerSlack)
  WaitStop* stop_;   // may be null
  bool poisoned_ = false;  // lost its prepared statements: closed when handed back
  bool abandoned_ = false;  // an exchange was given up: the protocol state is unknown
  std::string last_sqlstate_;
  std::string last_primary_;
};

// A fixed-size pool. Get() waits for a free connection, opening one when fewer
// than `size` exist; that wait lasts at most `wait` (the store's timeout:
// DeadlineExceeded naming the pool), and ends as any wait of the store's
// connections once `stop` is stopped (Aborted; WakeWaiters after the stop).
// A connection that broke is closed when handed back; one the
// server closed while it sat idle (Conn::ClosedWhileIdle) is closed when taken,
// and another taken (or opened) in its place.
// GetForTransaction() is Get() for a connection held while a handler runs
// (RunInTransaction): such holds take at most size - 1 connections, so that the
// heartbeat's extend and the claims of other messages always find one.
class Pool {
 public:
  using Opener = std::function<StatusOr<std::unique_ptr<Conn>>()>;
  // `where` names the server in errors; `stop` may be null.
  Pool(size_t size, Opener open, Millis wait, WaitStop* stop, std::string where)
      : size_(size), open_(std::move(open)), wait_(wait), stop_(stop), where_(std::move(where)) {}

  class Handle {
   public:
    Handle(Pool* p, std::unique_ptr<Conn> c, bool long_hold = false)
        : pool_(p), conn_(std::move(c)), long_hold_(long_hold) {}
    Handle(Handle&& o) noexcept
        : pool_(o.pool_), conn_(std::move(o.conn_)), long_hold_(o.long_hold_) {
      o.pool_ = nullptr;
    }
    Handle& operator=(Handle&&) = delete;
    ~Handle() {
      if (pool_ != nullptr) pool_->Put(std::move(conn_), long_hold_);
    }
    Conn* operator->() { return conn_.get(); }
    Conn& operator*() { return *conn_; }

   private:
    Pool* pool_;
    std::unique_ptr<Conn> conn_;
    bool long_hold_;
  };

  StatusOr<Handle> Get() { return Get(false); }
  // Needs a pool of 2 or more (FailedPrecondition otherwise).
  StatusOr<Handle> GetForTransaction() { return Get(true); }
  // OK when GetForTransaction can ever succeed (a pool of 2 or more).
  Status CheckTransactions(int concurrent = 1) const;
  size_t size() const { return size_; }
  uint64_t opened() const;
  // Wakes the callers waiting for a free connection so that they bound their
  // wait anew: called after `stop` was stopped.
  void WakeWaiters();

 private:
  StatusOr<Handle> Get(bool long_hold);
  void Put(std::unique_ptr<Conn> c, bool long_hold);

  const size_t size_;
  Opener open_;
  const Millis wait_;
  WaitStop* const stop_;
  const std::string where_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Conn>> idle_;
  size_t live_ = 0;  // idle + handed out + being opened
  size_t long_held_ = 0;  // handed out by GetForTransaction (or being opened for it)
  uint64_t opened_ = 0;
};

// "\"name\"" for a plain identifier already checked by ValidIdentifier.
std::string Quote(std::string_view ident);
// [a-z_][a-z0-9_]*, 1 to 63 bytes: what an unquoted name folds to.
bool ValidIdentifier(std::string_view ident);
// Why `ident`, a schema or table name, is refused (ValidIdentifier), naming it
// escaped: "postgres: schema 'Billing' is not ...".
std::string IdentifierError(std::string_view what, std::string_view ident, size_t max);

}  // namespace dedup::pg

#endif  // DEDUP_SRC_STORES_POSTGRES_PG_CONN_H_
