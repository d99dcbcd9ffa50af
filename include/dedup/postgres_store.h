// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The PostgreSQL store, on libpq. Opened through OpenStore() or OpenPostgresStore():
//
//   postgres://user[:password]@host[:port]/database[?table=T&schema=S&pool=N
//              &prefix=P&timeout=D&expire_interval=D&expire_batch=N&sslmode=M]
//
//   table            the records' table.                            Default: dedup_records
//   schema           its schema (created when missing).             Default: public
//   pool             connections, at most (shared by all threads).  Default: 8
//   prefix           put before every key (a namespace).            Default: ""
//   timeout          connect timeout, statement_timeout, and the    Default: 5s
//                    wait for each answer (timeout + 1 s).
//   expire_interval  time between two expiry rounds; 0 = none.      Default: 1s
//   expire_batch     rows one expiry DELETE removes, at most.       Default: 500
//   sslmode          libpq's sslmode.                               Default: prefer
//
// One row per key (bytea primary key), created with its index on the retention
// deadline by a versioned migration the first time a store opens the table (under
// an advisory lock, so concurrent first opens are safe). A table written by another
// record format, a table of that name that dedup did not create, or one whose
// columns were changed by hand (missing, or of other types), is refused with
// FailedPrecondition, never misread. Errors name the problem and never the
// password: Unauthenticated for a wrong password, NotFound for a missing database,
// Unavailable for a server that cannot be reached (or restarts), FailedPrecondition
// for a peer that is not PostgreSQL 12 or later.
//
// Every store operation is one SQL statement (claim: INSERT ... ON CONFLICT DO UPDATE
// ... WHERE ... RETURNING), so it is atomic and linearizable per key; deadlines come
// from the server's clock_timestamp(), never the caller's clock. Records past their
// retention answer as absent at once and are deleted by the store itself in batches
// of at most `expire_batch` rows (rows locked by others are skipped), never by an
// unbounded DELETE or a table lock.
//
// What survives what: an operation that returned is committed (durable as the
// server's synchronous_commit and fsync settings make it). A server restart or a
// dropped connection makes calls in flight return Unavailable (their effect is
// unknown; every operation is safe to retry); the pool reconnects on the next call.
// A server that does not answer at all (frozen, or a network that drops packets,
// where its statement_timeout never comes back) fails a call with
// DeadlineExceeded after timeout + 1 s, its connection closed, its effect unknown;
// Store::StopWaiting bounds every wait by its grace from then on (Aborted).
// A server where the session is read-only (a hot standby,
// default_transaction_read_only) is refused at open with FailedPrecondition, unless
// opened read_only.
// A takeover that would raise a fence past 2^63 - 1 or an attempt past 2^31 - 1
// is refused with DataLoss naming the key; nothing changes.
//
// Exactly-once effects: RunInTransaction() runs a handler's writes to the same
// database in one transaction with the claim's completion (see below, and
// docs/POSTGRES.md). A worker that dies before COMMIT leaves nothing behind; one
// that dies after COMMIT left both the effect and the completion.

#ifndef DEDUP_POSTGRES_STORE_H_
#define DEDUP_POSTGRES_STORE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dedup/buffer.h"
#include "dedup/clock.h"
#include "dedup/store.h"

typedef struct pg_conn PGconn;  // libpq's connection

namespace dedup {

struct PostgresStoreOptions {
  // Server address. Default: 127.0.0.1:5432.
  std::string host = "127.0.0.1";
  int port = 5432;
  // Role and password; empty user = libpq's default. Default: none.
  std::string user;
  std::string password;
  // Database. Required.
  std::string database;
  // Schema and table of the records; plain identifiers ([A-Za-z_][A-Za-z0-9_]*, at
  // most 63 bytes). Default: public.dedup_records.
  std::string schema = "public";
  std::string table = "dedup_records";
  // Put before every key. Default: "".
  std::string prefix;
  // Connections, at most; a caller waits for a free one. RunInTransaction holds
  // one while its handler runs, and such holds take at most pool_size - 1, so
  // that heartbeats always find one (RunInTransaction needs 2 or more: it answers
  // FailedPrecondition with 1, and so does CanRunTransactions()). Default: 8.
  size_t pool_size = 8;
  // Bounds connecting (whole seconds, at least 2, as libpq counts) and each
  // statement of the store's connections: on the server (statement_timeout),
  // and on the client, which waits for an answer no longer than timeout + 1 s
  // (a frozen server never sends its cancellation). Default: 5 s.
  Millis timeout{5'000};
  // Time between two expiry rounds; 0 = the store never deletes (run
  // ExpireNow() yourself). Default: 1 s.
  Millis expire_interval{1'000};
  // Rows one expiry statement deletes, at most; a round runs statements until one
  // deletes fewer, up to expire_max_batches. Default: 500 and 20.
  size_t expire_batch = 500;
  size_t expire_max_batches = 20;
  // libpq sslmode (disable, allow, prefer, require, verify-ca, verify-full).
  // Default: "" = libpq's default (prefer).
  std::string sslmode;
  // What Describe() returns. Default: built from the fields above, no password.
  std::string description;
  // A missing table is NotFound instead of being created, with its schema
  // (OpenOptions::must_exist: `dedup inspect` / `forget`, where a mistyped
  // ?table= must not make one). Default: false.
  bool must_exist = false;
  // Opened to read (Inspect, Scan: OpenOptions::read_only, as `dedup inspect`
  // opens): a read-only server (a hot standby) is accepted and the background
  // expiry does not run; implies must_exist. Otherwise a server where the
  // session is read-only is refused at open (FailedPrecondition naming it):
  // every claim writes. Default: false.
  bool read_only = false;
};

// An open transaction on one of the store's connections, handed to a
// TransactionalHandler together with its claim. Use connection() with any libpq
// call, or Exec(); do not COMMIT, ROLLBACK or end the transaction yourself (the
// store does, with the completion). One that does anyway (its writes may be
// committed without the completion; COMMIT AND CHAIN and a "COMMIT; BEGIN" on
// connection() included, which leave the connection inside a new transaction)
// has that statement answered
// FailedPrecondition, every later Exec refused, and its key completed as failed
// whatever it returns: never released, so never run again to apply the writes
// twice. Valid only during the handler's call.
class PostgresTransaction {
 public:
  virtual ~PostgresTransaction() = default;
  virtual PGconn* connection() = 0;
  // The claim this transaction completes.
  virtual std::string_view key() const = 0;  // without the store's prefix
  virtual Token token() const = 0;
  virtual uint64_t fence() const = 0;
  virtual uint32_t attempt() const = 0;

  using Row = std::vector<std::optional<std::string>>;  // text values, nullopt = NULL
  // Runs one statement with text parameters ($1, $2 ...; nullopt = NULL) and
  // returns its rows as text. A parameter (or the SQL) with a NUL byte is
  // InvalidArgument: text cannot carry it (encode such bytes, e.g. as hex). A
  // COPY (FROM STDIN, TO STDOUT) is FailedPrecondition naming it: nothing feeds
  // it here (use INSERT). A failing statement is an error, and the
  // transaction is then rolled back whatever the handler returns.
  [[nodiscard]] virtual StatusOr<std::vector<Row>> Exec(
      std::string_view sql, const std::vector<std::optional<std::string>>& params = {}) = 0;
  // Runs SQL text with no parameters: one or many statements separated by ';'
  // (as PL/pgSQL's EXECUTE of a string, inside the server). Transaction commands
  // (BEGIN, COMMIT, ROLLBACK, SAVEPOINT) are refused with an error, so the text
  // can never commit an effect without the completion. Same error rule as Exec().
  [[nodiscard]] virtual Status ExecScript(std::string_view sql) = 0;
};

// A handler whose writes go through the transaction. Done: the writes and the
// completion (ok, result) commit together. Retry, or an exception: everything
// rolls back and the claim is released. Fail: the writes roll back and the key is
// completed as failed.
using TransactionalHandler = std::function<HandlerResult(PostgresTransaction&)>;

class PostgresStore : public Store {
 public:
  // The transactional inbox for one ACQUIRED claim (key, token): BEGIN; the
  // handler; UPDATE the record to COMPLETED where `token` still owns it; COMMIT.
  //
  //   handler             completion owner check   what is left                 returns
  //   Done(result)        owns                     writes + COMPLETED/ok        kOk
  //   Done(result)        taken over (or ended)    nothing (rolled back)        kLost
  //   Fail(reason)        any                      COMPLETED/failed, no writes  kOk / kLost
  //   Retry / throws /    any                      nothing; claim released      kOk / kLost
  //     a statement fails                                                       (of the release)
  //
  // A Done result over kMaxResultBytes is a Fail saying so (it would never fit,
  // so it is never retried); a Fail reason that long is recorded cut to fit.
  // *handler_result (if not null) receives what the handler returned (a throw is
  // reported as Retry with the exception's text), after those two rules. A non-OK status means the
  // transaction's fate could not be decided (connection lost around COMMIT): a
  // later claim answers DUPLICATE if it committed, and takes over otherwise.
  // OK when `concurrent` RunInTransaction calls can run here at once;
  // FailedPrecondition naming pool when the pool is too small for them (each
  // holds a connection, and one is kept for heartbeats: pool >= concurrent + 1).
  // Check it at start-up, as `dedup worker --sql-output` does with its
  // --concurrency, rather than have handlers wait for a connection until their
  // timeout and count it as an attempt.
  [[nodiscard]] virtual Status CanRunTransactions(int concurrent) const = 0;

  [[nodiscard]] virtual StatusOr<WriteResult> RunInTransaction(
      std::string_view key, Token token, uint64_t fence, uint32_t attempt, Millis retention,
      const TransactionalHandler& handler, HandlerResult* handler_result = nullptr) = 0;

  // Deletes records past their retention, in batches of at most `batch` rows, at
  // most `max_batches` statements. Returns the rows deleted. The background
  // expiry (expire_interval) calls the same.
  [[nodiscard]] virtual StatusOr<uint64_t> ExpireNow(size_t batch, size_t max_batches) = 0;

  struct Stats {
    uint64_t expired_rows = 0;        // deleted by expiry so far
    uint64_t expire_statements = 0;   // expiry DELETEs run
    uint64_t expire_micros = 0;       // their total wall time
    uint64_t reconnects = 0;          // connections opened after the first pool fill
  };
  virtual Stats stats() const = 0;

  // The schema-qualified, quoted table name, e.g. "public"."dedup_records".
  virtual std::string QualifiedTable() const = 0;
  // The fence helper's schema-qualified function name (see docs/POSTGRES.md):
  // "public"."dedup_apply_fence"(scope text, key text, fence bigint) raises
  // SQLSTATE DF001 when `fence` is lower than one already applied for (scope, key).
  virtual std::string FenceFunction() const = 0;
};

[[nodiscard]] StatusOr<std::unique_ptr<PostgresStore>> OpenPostgresStore(
    const PostgresStoreOptions& options);
// From a postgres:// (or postgresql://) URI, as OpenStore() reads it.
[[nodiscard]] StatusOr<std::unique_ptr<PostgresStore>> OpenPostgresStore(std::string_view uri);

// Buffer::ProcessOnce, with the handler's writes committed in the completion's
// transaction (PostgresStore::RunInTransaction). `buffer` claims (and heartbeats
// while the handler runs) in `store`; its store must be `store` or a wrapper of it.
// The broker action follows the same table as ProcessOnce.
Processed ProcessOnceInTransaction(Buffer& buffer, PostgresStore& store, std::string_view key,
                                   std::string_view payload,
                                   const TransactionalHandler& handler);
// The same, with the claim's guard given to the handler, which should stop once
// guard.lost() (as `dedup worker --sql-output` stops its handler process
// then): its writes would be rolled back anyway.
using GuardedTransactionalHandler =
    std::function<HandlerResult(PostgresTransaction&, const ClaimGuard&)>;
Processed ProcessOnceInTransaction(Buffer& buffer, PostgresStore& store, std::string_view key,
                                   std::string_view payload,
                                   const GuardedTransactionalHandler& handler);

// The SQL of the fence helper (a table and a function), for a downstream database
// that is not the store's: run it there once. `schema` as in the options (a
// plain lower-case identifier; InvalidArgument naming it otherwise).
StatusOr<std::string> FenceHelperSql(std::string_view schema);

}  // namespace dedup

#endif  // DEDUP_POSTGRES_STORE_H_
