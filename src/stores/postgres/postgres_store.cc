// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The PostgreSQL store. Each SPEC operation is one prepared statement; the claim
// statement writes only when the state machine says a claim writes (ACQUIRED or
// EXHAUSTED) and otherwise reads the row, and the answer is decided from the row
// with core/state_machine's DecideClaim, so the server and the embedded stores
// speak the same table.

#include "dedup/postgres_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include "core/printable.h"
#include "core/state_machine.h"
#include "core/uri.h"
#include "stores/open_backends.h"
#include "stores/postgres/pg_conn.h"

namespace dedup {
namespace {

using pg::kByteaOid;
using pg::kInt8Oid;
using pg::Params;

// The record format this build writes, in the table's comment.
constexpr int kFormat = 1;
constexpr std::string_view kFormatComment = "dedup store records, format ";
// One advisory lock for every dedup migration, so that first opens never race.
constexpr int64_t kMigrationLock = 0x6465647570000001;  // "dedup" ...

// The server clock in milliseconds since the epoch.
constexpr std::string_view kNowMs = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";
// The columns of a record, in the order ReadRecord expects.
constexpr std::string_view kCols =
    "r.key, r.state::bigint, r.token, r.fence, r.attempt::bigint, r.lease_deadline, "
    "r.retention_deadline, r.fingerprint, r.status::bigint, r.result";

// Reads the record of one result row into *rec; false when the row cannot be a
// record this build wrote (kDecodable below is the same test in SQL), and then
// `*why` (if given) names what is wrong.
bool ReadRecord(const PGresult* r, int row, size_t prefix_len, Record* rec,
                std::string* why = nullptr) {
  const int64_t state = pg::GetInt8(r, row, 1), token = pg::GetInt8(r, row, 2);
  const int64_t fence = pg::GetInt8(r, row, 3), attempt = pg::GetInt8(r, row, 4);
  const int64_t status = pg::GetInt8(r, row, 8);
  rec->key = pg::GetBytes(r, row, 0).substr(prefix_len);
  rec->state = static_cast<RecordState>(state);
  rec->token = Token{static_cast<uint64_t>(token)};
  rec->fence = static_cast<uint64_t>(fence);
  rec->attempt = static_cast<uint32_t>(attempt);
  rec->lease_deadline = pg::GetInt8(r, row, 5);
  rec->retention_deadline = pg::GetInt8(r, row, 6);
  rec->fingerprint = pg::GetBytes(r, row, 7);
  rec->status = static_cast<CompletionStatus>(status);
  rec->result = pg::GetBytes(r, row, 9);
  std::string bad;
  if (state < 1 || state > 3) {
    bad = "state " + std::to_string(state) + " is not 1 to 3";
  } else if (status < 0 || status > 2) {
    bad = "status " + std::to_string(status) + " is not 0 to 2";
  } else if (token == 0) {
    bad = "token 0";
  } else if (fence <= 0) {
    bad = "fence " + std::to_string(fence) + " is not positive";
  } else if (attempt < 0 || attempt > UINT32_MAX) {
    bad = "attempt " + std::to_string(attempt) + " is out of range";
  }
  if (bad.empty()) return true;
  if (why != nullptr) *why = std::move(bad);
  return false;
}

// The same test in SQL, on the row `r`: a claim writes only over a row that passes
// it (any other is answered DataLoss and left as it is).
constexpr std::string_view kDecodable =
    "(r.state BETWEEN 1 AND 3 AND r.status BETWEEN 0 AND 2 AND r.token <> 0 AND r.fence > 0 "
    "AND r.attempt >= 0)";

class PgTransaction;

// The columns of the records' table and their types (format_type), as the
// migration makes them.
constexpr std::pair<const char*, const char*> kColumnTypes[] = {
    {"key", "bytea"},
    {"state", "smallint"},
    {"token", "bigint"},
    {"fence", "bigint"},
    {"attempt", "integer"},
    {"lease_deadline", "bigint"},
    {"retention_deadline", "bigint"},
    {"fingerprint", "bytea"},
    {"status", "smallint"},
    {"result", "bytea"},
};

// What a handler's SQL may leave on the pooled connection that neither COMMIT nor
// ROLLBACK ends, for the next message's handler (perhaps another tenant's) to see.
// Every statement that clears it may run inside a transaction block (only DISCARD
// ALL may not), so that they ride in the COMMIT's own round trip:
// - statements the handler PREPAREd (pg_prepared_statements.from_sql: the
//   store's own are prepared through the protocol, so never from_sql; DEALLOCATE
//   ALL would drop them too). PREPARE is not transactional: a rollback keeps them.
// - sequences' currval/lastval (DISCARD SEQUENCES; also kept by a rollback).
// - temporary tables (DISCARD TEMP; a rollback drops those it created).
//
// The statements are deallocated by a PL/pgSQL function in the store's schema,
// made once (MakeSessionReset), not by a DO block: a DO block is compiled on every
// run, a function once per session, with its query's plan kept (measured in
// docs/PERFORMANCE.md: the DO block was most of the server's CPU of a commit).
// A plain SQL test for "nothing to deallocate" is no cheaper: the view's query is
// planned on every run.
//
// The handler's SQL runs as the store's role, which owns the function: a DROP or
// CREATE OR REPLACE of it inside the handler's transaction rolls back with it,
// and the call must answer kForgetFunctionAnswer: a function missing (dropped by
// another connection), replaced by another body or of another version fails the
// statement, so the commit fails (the connection is closed, nothing leaks); a
// new store (a restarted worker) makes it again. Only a replacement written to
// answer the same while doing nothing goes unnoticed, as would any other harm
// SQL with the store's role can do (it can also rewrite the records).
// pg_catalog is named: the handler may have shadowed names in its own schemas.
constexpr std::string_view kForgetFunction = "dedup_forget_handler_statements";
constexpr int kForgetFunctionAnswer = 1;  // this body's version

std::string ForgetFunctionSql(std::string_view schema) {
  return "CREATE OR REPLACE FUNCTION " + pg::Quote(schema) + "." + std::string(kForgetFunction) +
         "()\n"
         "RETURNS integer LANGUAGE plpgsql AS $dedup$\n"
         "DECLARE s record;\n"
         "BEGIN\n"
         "  FOR s IN SELECT name FROM pg_catalog.pg_prepared_statements WHERE from_sql LOOP\n"
         "    EXECUTE pg_catalog.format('DEALLOCATE %I', s.name);\n"
         "  END LOOP;\n"
         "  RETURN " + std::to_string(kForgetFunctionAnswer) + ";\n"
         "END $dedup$";
}

// The call of it, and what is said when it answers anything else.
std::string ForgetFunctionCall(std::string_view schema) {
  return pg::Quote(schema) + "." + std::string(kForgetFunction) + "()";
}
std::string ForgetFunctionReplaced(std::string_view schema) {
  return ForgetFunctionCall(schema) + " was replaced (it did not answer " +
         std::to_string(kForgetFunctionAnswer) +
         "): the statements a handler prepared may remain";
}

// The statement that calls it, failing (22P02, with ForgetFunctionReplaced's
// words) when it answers anything else. The CASE holds the volatile call, so the
// failing branch is not folded at planning.
std::string ForgetHandlerStatements(std::string_view schema) {
  return "SELECT pg_catalog.int4(CASE " + ForgetFunctionCall(schema) + " WHEN " +
         std::to_string(kForgetFunctionAnswer) + " THEN '0' ELSE 'dedup: " +
         ForgetFunctionReplaced(schema) + "' END)";
}

// The fence helper without its CREATE SCHEMA (FenceHelperSql is both).
std::string FenceHelperBody(std::string_view schema);

class PgStore final : public PostgresStore {
 public:
  explicit PgStore(PostgresStoreOptions o)
      : o_(std::move(o)),
        where_("postgres " + o_.host + ":" + std::to_string(o_.port)),
        table_(pg::Quote(o_.schema) + "." + pg::Quote(o_.table)),
        pool_(o_.pool_size, [this] { return OpenConn(); }, o_.timeout, &stop_, where_) {}

  ~PgStore() override {
    {
      std::lock_guard lock(expire_mu_);
      stopping_ = true;
    }
    expire_cv_.notify_all();
    // An expiry round waiting on the server (frozen, or slow) is given up at once
    // (Aborted, its connection closed): nothing waits for its answer any more.
    stop_.Stop(Millis(0));
    if (expirer_.joinable()) expirer_.join();
  }

  Status Start() {
    auto first = pg::Conn::Open(o_, where_, 0, &stop_);
    if (!first.ok()) return first.status();
    DEDUP_RETURN_IF_ERROR(CheckServer(**first));
    DEDUP_RETURN_IF_ERROR(Migrate(**first));
    // Opened to read: nothing to make (and a standby could not).
    if (!o_.read_only) DEDUP_RETURN_IF_ERROR(MakeSessionReset(**first));
    // Statements are prepared per connection, so the first one goes through the
    // pool's opener too; this one only checked and migrated.
    auto h = pool_.Get();
    if (!h.ok()) return h.status();
    if (o_.expire_interval.count() > 0 && !o_.read_only) {
      expirer_ = std::thread([this] { ExpireLoop(); });
    }
    return Status::Ok();
  }

  // ---- SPEC operations -------------------------------------------------------

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    DEDUP_RETURN_IF_ERROR(ValidateClaim(req));
    auto h = pool_.Get();
    if (!h.ok()) return h.status();
    return ClaimOn(**h, req);
  }

  // One transaction on one connection: a batch that fails leaves nothing of
  // itself behind (no claim held, no attempt counted). BEGIN and the claims go
  // in one pipeline (one round trip), then COMMIT: two round trips for the batch
  // instead of one per claim. Keys are claimed in their byte order (a repeated
  // key in the order given), so that two batches never wait for each other's
  // rows in a cycle; the answers come back in the order asked. A claim that must
  // run again (ClaimOn) sends the batch again the slow way: rolled back, then
  // claim by claim in a new transaction, so that a repeated key still answers in
  // order. The transaction ends itself if this client stops between its round
  // trips (a frozen worker, a cut network: the server would hold the batch's
  // rows, and every call on those keys would time out, until the client came
  // back or its connection was found dead, hours later): SET LOCAL
  // idle_in_transaction_session_timeout, which the store's connections otherwise
  // turn off (pg_conn.cc), to timeout + 1 s.
  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    DEDUP_RETURN_IF_ERROR(ValidateClaimBatch(reqs));
    std::vector<ClaimResult> out(reqs.size());
    if (reqs.empty()) return out;
    std::vector<size_t> order(reqs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return reqs[a].key < reqs[b].key; });
    Status commit_failed;
    {
      auto h = pool_.Get();
      if (!h.ok()) return h.status();
      pg::Conn& c = **h;
      // Ends the batch's transaction, if one is open: true when it is rolled
      // back. A connection that cannot roll back is closed when handed back: the
      // server then rolls the transaction back itself.
      auto rollback = [&] {
        if (PQtransactionStatus(c.raw()) == PQTRANS_IDLE || c.Exec("ROLLBACK", "claim batch").ok()) {
          return true;
        }
        c.Poison();
        return false;
      };
      // A failed claim: rolled back, its status (AtLimit's words at a limit).
      auto fail = [&](size_t i, const Status& s, bool at_limit) -> Status {
        if (!rollback()) return s;
        return at_limit ? AtLimit(c, reqs[i].key, s) : s;
      };
      std::vector<Token> fresh(reqs.size());
      std::vector<Params> params;
      params.reserve(reqs.size());
      for (size_t i : order) {
        fresh[i] = Token::Random();
        params.push_back(ClaimParams(reqs[i], fresh[i]));
      }
      const std::string begin[] = {"BEGIN ISOLATION LEVEL READ COMMITTED",
                                   "SET LOCAL idle_in_transaction_session_timeout = " +
                                       std::to_string(o_.timeout.count() + 1000)};
      constexpr size_t kBegin = 2;
      auto answers = c.RunPipeline(reqs.size() + kBegin, [&](PGconn* pg, size_t k) {
        if (k < kBegin) {
          return PQsendQueryParams(pg, begin[k].c_str(), 0, nullptr, nullptr, nullptr, nullptr, 1);
        }
        Params& p = params[k - kBegin];
        return PQsendQueryPrepared(pg, "claim", p.size(), p.values(), p.lengths(), p.formats(), 1);
      }, "claim batch");
      if (!answers.ok()) return answers.status();  // abandoned: closed, rolled back
      for (size_t k = 0; k < kBegin; ++k) {
        if (PQresultStatus((*answers)[k].get()) != PGRES_COMMAND_OK) {
          Status s = c.ErrorOf((*answers)[k].get(), "claim batch: begin");
          (void)rollback();
          return s;
        }
      }
      bool again = false;
      for (size_t k = 0; k < order.size() && !again; ++k) {
        const size_t i = order[k];
        const PGresult* r = (*answers)[k + kBegin].get();
        const ExecStatusType st = PQresultStatus(r);
        if (st != PGRES_TUPLES_OK) {
          // The first failure (those after it were skipped: PIPELINE_ABORTED).
          Status s = c.ErrorOf(r, "claim");
          // numeric_value_out_of_range: the fence or attempt + 1 of a takeover.
          return fail(i, s, c.last_sqlstate() == "22003");
        }
        auto answer = ClaimAnswer(r, reqs[i], fresh[i]);
        if (!answer.ok()) return fail(i, answer.status(), false);
        if (answer->has_value()) {
          out[i] = std::move(**answer);
        } else {
          again = true;
        }
      }
      if (again) {
        if (!rollback()) {
          return Status::Unavailable(where_ + ": claim batch: cannot roll back to claim again");
        }
        for (const std::string& sql : begin) {
          if (auto b = c.Exec(sql, "claim batch"); !b.ok()) {
            (void)rollback();
            return b.status();
          }
        }
        for (size_t i : order) {
          auto res = ClaimOn(c, reqs[i], /*in_transaction=*/true);
          if (!res.ok()) return fail(i, res.status(), c.last_sqlstate() == "22003");
          out[i] = std::move(res).value();
        }
      }
      auto commit = c.Exec("COMMIT", "claim batch");
      if (commit.ok()) return out;
      c.Poison();
      commit_failed = commit.status();
    }  // handed back first: the releases may need a connection (pool=1)
    // The COMMIT's answer did not come: the claims may be held. Released, best
    // effort (store.h); a release of a claim that was not committed is LOST.
    ReleaseAcquired(*this, reqs, out);
    return commit_failed;
  }

  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    DEDUP_RETURN_IF_ERROR(ValidateExtend(key, token, lease));
    Params p;
    p.Bytes(Key(key)).Int8(static_cast<int64_t>(token.value)).Int8(lease.count());
    return OwnerWrite("extend", p);
  }

  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    DEDUP_RETURN_IF_ERROR(ValidateComplete(key, token, retention, status, result));
    Params p;
    p.Bytes(Key(key)).Int8(static_cast<int64_t>(token.value)).Int8(retention.count());
    p.Int8(static_cast<int64_t>(status)).Bytes(result);
    return OwnerWrite("complete", p);
  }

  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    DEDUP_RETURN_IF_ERROR(ValidateRelease(key, token, retention));
    Params p;
    p.Bytes(Key(key)).Int8(static_cast<int64_t>(token.value)).Int8(retention.count());
    return OwnerWrite("release", p);
  }

  StatusOr<std::optional<Record>> Inspect(std::string_view key) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    auto h = pool_.Get();
    if (!h.ok()) return h.status();
    Params p;
    p.Bytes(Key(key));
    auto r = (*h)->ExecPrepared("inspect", p, "inspect");
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) == 0) return std::optional<Record>();
    Record rec;
    std::string why;
    if (!ReadRecord(r->get(), 0, o_.prefix.size(), &rec, &why)) return Corrupt(key, why);
    return std::optional<Record>(std::move(rec));
  }

  StatusOr<bool> Forget(std::string_view key, const ForgetOptions& options) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    auto h = pool_.Get();
    if (!h.ok()) return h.status();
    Params p;
    p.Bytes(Key(key)).Int8(options.force ? 1 : 0);
    auto r = (*h)->ExecPrepared("forget", p, "forget");
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) == 0) return false;
    const int64_t action = pg::GetInt8(r->get(), 0, 0);
    if (action == 2) {
      return internal::LeasedForgetError(key, Millis(pg::GetInt8(r->get(), 0, 1)));
    }
    return action == 1 || action == 3;
  }

  StatusOr<ScanResult> Scan(std::string_view prefix, size_t limit,
                            const ScanOptions& options) override {
    auto h = pool_.Get();
    if (!h.ok()) return h.status();
    Params p;
    p.Bytes(Key(prefix)).Int8(static_cast<int64_t>(std::min<size_t>(limit, INT64_MAX)));
    auto r = (*h)->ExecPrepared(options.with_results ? "scan" : "scan_keys", p, "scan");
    if (!r.ok()) return r.status();
    ScanResult out;
    // Keys no call can name are not among the rows (`nameable` in the statement).
    for (int i = 0; i < PQntuples(r->get()); ++i) {
      Record rec;
      std::string why;
      if (ReadRecord(r->get(), i, o_.prefix.size(), &rec, &why)) {
        out.records.push_back(std::move(rec));
        out.result_bytes.push_back(static_cast<uint64_t>(pg::GetInt8(r->get(), i, 10)));
      } else {
        out.undecodable.push_back({std::move(rec.key), std::move(why)});
      }
    }
    return out;
  }

  // Every wait for the server is bounded by the connections (pg::Conn::Open);
  // once stopped, by the grace too.
  void StopWaiting(Millis grace) override {
    stop_.Stop(grace);
    pool_.WakeWaiters();  // a wait for a free connection bounds itself anew
  }

  std::string Describe() const override {
    if (!o_.description.empty()) return o_.description;
    std::string s = "postgres://";
    if (!o_.user.empty()) s += o_.user + "@";
    s += o_.host + ":" + std::to_string(o_.port) + "/" + o_.database + "?schema=" + o_.schema +
         "&table=" + o_.table;
    if (!o_.prefix.empty()) s += "&prefix=" + o_.prefix;
    return s;
  }

  // ---- transactions -----------------------------------------------------------

  Status CanRunTransactions(int concurrent) const override {
    return pool_.CheckTransactions(concurrent);
  }

  StatusOr<WriteResult> RunInTransaction(std::string_view key, Token token, uint64_t fence,
                                         uint32_t attempt, Millis retention,
                                         const TransactionalHandler& handler,
                                         HandlerResult* handler_result) override;

  // ---- expiry --------------------------------------------------------------------

  StatusOr<uint64_t> ExpireNow(size_t batch, size_t max_batches) override {
    if (batch == 0) return Status::InvalidArgument("postgres: expire batch must be positive");
    auto h = pool_.Get();
    if (!h.ok()) return h.status();
    uint64_t total = 0;
    for (size_t i = 0; i < max_batches; ++i) {
      Params p;
      p.Int8(static_cast<int64_t>(batch));
      const auto t0 = std::chrono::steady_clock::now();
      auto r = (*h)->ExecPrepared("expire", p, "expire");
      const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::steady_clock::now() - t0).count();
      if (!r.ok()) return r.status();
      const uint64_t n = std::strtoull(PQcmdTuples(r->get()), nullptr, 10);
      total += n;
      expired_rows_ += n;
      expire_statements_ += 1;
      expire_micros_ += static_cast<uint64_t>(us);
      if (n < batch) break;
    }
    return total;
  }

  Stats stats() const override {
    Stats s;
    s.expired_rows = expired_rows_.load();
    s.expire_statements = expire_statements_.load();
    s.expire_micros = expire_micros_.load();
    const uint64_t opened = pool_.opened();
    s.reconnects = opened > o_.pool_size ? opened - o_.pool_size : 0;
    return s;
  }

  std::string QualifiedTable() const override { return table_; }
  std::string FenceFunction() const override {
    return pg::Quote(o_.schema) + ".\"dedup_apply_fence\"";
  }

  const PostgresStoreOptions& options() const { return o_; }
  pg::Pool& pool() { return pool_; }
  std::string Key(std::string_view key) const { return o_.prefix + std::string(key); }
  StatusOr<WriteResult> OwnerWriteOn(pg::Conn& c, const char* name, Params& p) {
    auto r = c.ExecPrepared(name, p, name);
    if (!r.ok()) return r.status();
    return PQntuples(r->get()) > 0 ? WriteResult::kOk : WriteResult::kLost;
  }

 private:
  Status Corrupt(std::string_view key, std::string_view why = {}) const {
    return Status::DataLoss(where_ + ": the record of key \"" + internal::Printable(key) +
                            "\" in " + table_ + " cannot be decoded" +
                            (why.empty() ? "" : " (" + std::string(why) + ")") +
                            "; nothing was changed");
  }

  // A claim that failed because its takeover would raise the record's fence or
  // attempt past the largest its column holds (bigint, integer): DataLoss (the
  // record can be taken no further, as the Redis store answers past its own
  // limits), naming the key and the number; the statement changed nothing.
  // `failed` when the row does not show which.
  Status AtLimit(pg::Conn& c, std::string_view key, const Status& failed) {
    Params p;
    p.Bytes(Key(key));
    auto r = c.ExecParams("SELECT fence, attempt::bigint FROM " + table_ + " WHERE key = $1", p, 1,
                          "claim");
    if (!r.ok() || PQntuples(r->get()) != 1) return failed;
    const int64_t fence = pg::GetInt8(r->get(), 0, 0), attempt = pg::GetInt8(r->get(), 0, 1);
    std::string what;
    if (fence == INT64_MAX) {
      what = "fence " + std::to_string(fence) + " cannot be raised (the largest fence is 2^63 - 1)";
    } else if (attempt >= INT32_MAX) {
      what = "attempt " + std::to_string(attempt) +
             " cannot be raised (the largest attempt the table holds is 2^31 - 1)";
    } else {
      return failed;
    }
    return Status::DataLoss(where_ + ": claim: the record of key \"" + internal::Printable(key) +
                            "\" in " + table_ + ": its " + what + "; nothing was changed");
  }

  StatusOr<WriteResult> OwnerWrite(const char* name, Params& p) {
    auto h = pool_.Get();
    if (!h.ok()) return h.status();
    return OwnerWriteOn(**h, name, p);
  }

  // The claim statement's parameters for `req`, with the new claim's token.
  Params ClaimParams(const ClaimRequest& req, Token fresh) const {
    Params p;
    p.Bytes(Key(req.key)).Int8(static_cast<int64_t>(fresh.value)).Int8(req.lease.count());
    p.Int8(req.retention.count()).Bytes(req.fingerprint).Int8(req.max_attempts);
    return p;
  }

  // What the claim statement's rows `r` (sent with token `fresh`) answer: the
  // claim's result, or nullopt when the statement must run again (ClaimOn says
  // why), or the status of a record that cannot be decoded.
  StatusOr<std::optional<ClaimResult>> ClaimAnswer(const PGresult* r, const ClaimRequest& req,
                                                   Token fresh) {
    if (PQntuples(r) == 0) return std::optional<ClaimResult>();  // inserted by another after our snapshot
    Record cur;
    std::string why;
    const bool decoded = ReadRecord(r, 0, 0, &cur, &why);
    const bool wrote = pg::GetInt8(r, 0, 10) != 0;
    const int64_t now = pg::GetInt8(r, 0, 11);
    if (!decoded) return Corrupt(req.key, why);
    ClaimResult res;
    res.fence = cur.fence;
    res.attempt = cur.attempt;
    if (wrote) {
      if (cur.state == RecordState::kInProgress && cur.token == fresh) {
        res.outcome = ClaimOutcome::kAcquired;
        res.token = fresh;
      } else {
        res.outcome = ClaimOutcome::kExhausted;
      }
      return std::optional<ClaimResult>(std::move(res));
    }
    Record next;
    bool write = false;
    std::string at_limit;  // the statement refuses its limits first (22003, AtLimit)
    res = internal::DecideClaim(&cur, req, now, fresh, &next, &write, &at_limit);
    if (!at_limit.empty()) {
      return Status::DataLoss(where_ + ": claim: the record of key \"" +
                              internal::Printable(req.key) + "\" in " + table_ + ": its " +
                              at_limit + "; nothing was changed");
    }
    if (!write) return std::optional<ClaimResult>(std::move(res));
    return std::optional<ClaimResult>();
  }

  // In a transaction (`in_transaction`), a claim at the fence's or attempt's
  // limit returns the statement's error as it is: the transaction is aborted,
  // and the caller reads the record for the message (AtLimit) after its rollback.
  StatusOr<ClaimResult> ClaimOn(pg::Conn& c, const ClaimRequest& req,
                                bool in_transaction = false) {
    // The statement's read of the row, when it did not write, comes from the
    // statement's snapshot, which may predate a claim that committed while this
    // one waited for the row: the state machine then says "would write", and the
    // statement runs again with a fresh snapshot.
    for (int tries = 0; tries < 100; ++tries) {
      const Token fresh = Token::Random();
      Params p = ClaimParams(req, fresh);
      auto r = c.ExecPrepared("claim", p, "claim");
      if (!r.ok()) {
        // numeric_value_out_of_range: the fence or attempt + 1 of a takeover.
        if (c.last_sqlstate() == "22003" && !in_transaction) return AtLimit(c, req.key, r.status());
        return r.status();
      }
      auto answer = ClaimAnswer(r->get(), req, fresh);
      if (!answer.ok()) return answer.status();
      if (answer->has_value()) return std::move(**answer);
    }
    return Status::Unavailable(where_ + ": claim: the row kept changing under the claim; retry");
  }

  StatusOr<std::unique_ptr<pg::Conn>> OpenConn() {
    auto c = pg::Conn::Open(o_, where_, server_version_, &stop_);
    if (!c.ok()) return c.status();
    DEDUP_RETURN_IF_ERROR(Prepare(**c));
    return c;
  }

  Status CheckServer(pg::Conn& c) {
    auto r = c.Exec("SELECT current_setting('server_version_num'), version()", "version check");
    if (!r.ok()) return r.status();
    const long num = std::strtol(PQgetvalue(r->get(), 0, 0), nullptr, 10);
    server_version_ = static_cast<int>(num);
    const std::string version = PQgetvalue(r->get(), 0, 1);
    if (version.rfind("PostgreSQL", 0) != 0) {
      return Status::FailedPrecondition(where_ + " is not PostgreSQL (it says '" + version + "')");
    }
    if (num < 120000) {
      return Status::FailedPrecondition(where_ + " runs " + version +
                                        "; the store needs PostgreSQL 12 or later");
    }
    // Every claim writes: a read-only session would fail each one.
    if (o_.read_only) return Status::Ok();
    r = c.Exec("SELECT current_setting('transaction_read_only'), pg_is_in_recovery()::text",
               "read-only check");
    if (!r.ok()) return r.status();
    if (std::string_view(PQgetvalue(r->get(), 0, 0)) == "on") {
      const bool standby = std::string_view(PQgetvalue(r->get(), 0, 1)) == "true";
      return Status::FailedPrecondition(
          where_ + ": database '" + o_.database + "' is read-only here (" +
          (standby ? "the server is a hot standby, in recovery"
                   : "default_transaction_read_only is on for the database or the role") +
          "): every claim writes; point the store at a writable primary");
    }
    return Status::Ok();
  }

  Status Migrate(pg::Conn& c) {
    const std::string regclass = "'" + table_ + "'";
    DEDUP_RETURN_IF_ERROR(c.Exec("BEGIN", "migration").status());
    auto fail = [&](Status s) {
      (void)c.Exec("ROLLBACK", "migration");
      return s;
    };
    auto lock = c.Exec("SELECT pg_advisory_xact_lock(" + std::to_string(kMigrationLock) + ")",
                       "migration lock");
    if (!lock.ok()) return fail(lock.status());
    auto found = c.Exec("SELECT to_regclass(" + regclass + ") IS NOT NULL, "
                        "coalesce(obj_description(to_regclass(" + regclass + "), 'pg_class'), '')",
                        "migration check");
    if (!found.ok()) return fail(found.status());
    const bool exists = std::string(PQgetvalue(found->get(), 0, 0)) == "t";
    const std::string comment = PQgetvalue(found->get(), 0, 1);
    const std::string name = o_.schema + "." + o_.table;
    if (exists) {
      (void)c.Exec("ROLLBACK", "migration");
      if (comment.rfind(kFormatComment, 0) != 0) {
        return Status::FailedPrecondition(
            where_ + ": table " + name + " exists and is not a dedup table (its comment is '" +
            comment + "'); choose another ?table= or ?schema=");
      }
      const std::string format = comment.substr(kFormatComment.size());
      if (format != std::to_string(kFormat)) {
        return Status::FailedPrecondition(where_ + ": table " + name + " holds record format " +
                                          format + "; this build reads format " +
                                          std::to_string(kFormat) + " only");
      }
      // Column names and types are checked when the statements are prepared; the
      // unique key that ON CONFLICT (key) needs is not (the planner looks for it at
      // the first claim), so here.
      auto unique = c.Exec("SELECT count(*) FROM pg_index i JOIN pg_attribute a ON "
                           "a.attrelid = i.indrelid AND a.attnum = i.indkey[0] WHERE i.indrelid = " +
                           regclass + "::regclass AND i.indisunique AND i.indnkeyatts = 1 AND "
                           "i.indpred IS NULL AND a.attname = 'key'",
                           "migration check");
      if (!unique.ok()) return unique.status();
      if (std::string(PQgetvalue(unique->get(), 0, 0)) == "0") {
        return Status::FailedPrecondition(where_ + ": table " + name +
                                          " has dedup's comment but no unique key on its key "
                                          "column; it was not made by dedup (or was changed by "
                                          "hand)");
      }
      // And each column of the type the migration below makes: the statements
      // accept many other types (an assignment cast to text, a narrower integer)
      // and would then hand back other bytes, or misread a row they wrote.
      auto cols = c.Exec("SELECT a.attname::text, format_type(a.atttypid, a.atttypmod), "
                         "a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND "
                         "a.attgenerated = '' FROM pg_attribute a WHERE a.attrelid = " +
                             regclass + "::regclass AND a.attnum > 0 AND NOT a.attisdropped",
                         "migration check");
      if (!cols.ok()) return cols.status();
      std::map<std::string, std::string> have;
      for (int i = 0; i < PQntuples(cols->get()); ++i) {
        const std::string column = PQgetvalue(cols->get(), i, 0);
        have[column] = PQgetvalue(cols->get(), i, 1);
        // A column added by hand that dedup's INSERT leaves NULL and may not be:
        // every claim failed with a not-null violation (whose detail echoed the
        // row: key and token), retried for ever. Refused at open instead.
        const bool ours = std::any_of(std::begin(kColumnTypes), std::end(kColumnTypes),
                                      [&](const auto& ct) { return column == ct.first; });
        if (!ours && std::string_view(PQgetvalue(cols->get(), i, 2)) == "t") {
          return Status::FailedPrecondition(
              where_ + ": table " + name + " has a column '" + internal::PrintableCut(column, 64) +
              "' that is NOT NULL without a default, which dedup does not write: every claim "
              "would fail; give it a default or drop it (it was added by hand)");
        }
      }
      for (const auto& [column, type] : kColumnTypes) {
        const auto it = have.find(column);
        if (it == have.end()) {
          return Status::FailedPrecondition(where_ + ": table " + name + " has no column " +
                                            column + " (" + type +
                                            "); it was changed by hand (or not made by dedup)");
        }
        if (it->second != type) {
          return Status::FailedPrecondition(where_ + ": table " + name + ": column " + column +
                                            " is " + it->second + ", where dedup makes it " +
                                            type + "; it was changed by hand (or not made by "
                                            "dedup)");
        }
      }
      return Status::Ok();
    }
    if (o_.must_exist || o_.read_only) {
      (void)c.Exec("ROLLBACK", "migration");
      return Status::NotFound(where_ + ": table " + name +
                              " does not exist; nothing was created (the store was opened to "
                              "read or administer it: check ?schema= and ?table=)");
    }
    // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database even when the schema
    // exists, which an application role with CREATE on its schema lacks; and the
    // fence helper may be another role's (made with another table of the schema):
    // each is made only when missing.
    const std::string s = pg::Quote(o_.schema);
    auto have = c.Exec("SELECT to_regnamespace('" + s + "') IS NOT NULL, "
                       "to_regprocedure('" + s + ".dedup_apply_fence(text,text,bigint)') IS NOT NULL "
                       "AND to_regprocedure('" + s + ".dedup_refuse_stale_fence()') IS NOT NULL",
                       "migration check");
    if (!have.ok()) return fail(have.status());
    const bool have_schema = std::string(PQgetvalue(have->get(), 0, 0)) == "t";
    const bool have_helper = std::string(PQgetvalue(have->get(), 0, 1)) == "t";
    const std::string ddl =
        (have_schema ? "" : "CREATE SCHEMA IF NOT EXISTS " + s + ";\n") +
        "CREATE TABLE " + table_ + " (\n"
        "  key bytea PRIMARY KEY,\n"
        "  state smallint NOT NULL,\n"            // 1 in_progress, 2 completed, 3 released
        "  token bigint NOT NULL,\n"              // the owner's token (64 bits, as signed)
        "  fence bigint NOT NULL,\n"
        "  attempt integer NOT NULL,\n"
        "  lease_deadline bigint NOT NULL,\n"     // server clock, ms since the epoch
        "  retention_deadline bigint NOT NULL,\n"
        "  fingerprint bytea NOT NULL,\n"
        "  status smallint NOT NULL,\n"           // 0 ok, 1 failed, 2 exhausted
        "  result bytea NOT NULL);\n"
        "CREATE INDEX " + pg::Quote(o_.table + "_retention") + " ON " + table_ +
        " (retention_deadline);\n"
        "COMMENT ON TABLE " + table_ + " IS '" + std::string(kFormatComment) +
        std::to_string(kFormat) + "';\n" + (have_helper ? "" : FenceHelperBody(o_.schema));
    auto made = c.Exec(ddl, "migration to format " + std::to_string(kFormat));
    if (!made.ok()) return fail(made.status());
    auto done = c.Exec("COMMIT", "migration commit");
    if (!done.ok()) return done.status();
    return Status::Ok();
  }

  // The function that forgets the statements a handler PREPAREd
  // (kForgetHandlerStatements), made when missing, under the migration lock (two
  // stores opening at once would race on CREATE OR REPLACE). Also for tables made
  // by a version of dedup without it. A role without CREATE on the schema leaves
  // it missing: only RunInTransaction needs it, and its commits then fail naming it
  // (docs/POSTGRES.md) while claims and completions work.
  Status MakeSessionReset(pg::Conn& c) {
    const std::string fn = pg::Quote(o_.schema) + "." + std::string(kForgetFunction) + "()";
    DEDUP_RETURN_IF_ERROR(c.Exec("BEGIN", "session reset function").status());
    auto made = c.Exec("SELECT pg_advisory_xact_lock(" + std::to_string(kMigrationLock) +
                           "); SELECT to_regprocedure('" + fn + "') IS NOT NULL OR NOT "
                           "has_schema_privilege('" + o_.schema + "', 'CREATE')",
                       "session reset function");
    if (made.ok() && std::string(PQgetvalue(made->get(), 0, 0)) != "t") {
      made = c.Exec(ForgetFunctionSql(o_.schema), "session reset function");
    }
    if (!made.ok()) {
      (void)c.Exec("ROLLBACK", "session reset function");
      return made.status();
    }
    return c.Exec("COMMIT", "session reset function").status();
  }

  Status Prepare(pg::Conn& c) {
    const std::string T = table_;
    const std::string now = std::string(kNowMs);
    const std::string cols = std::string(kCols);
    // Claim. $1 key, $2 fresh token, $3 lease, $4 retention, $5 fingerprint,
    // $6 max_attempts. N = the statement's now (from the inserted row), r = the row.
    const std::string N = "(EXCLUDED.lease_deadline - $3)";
    const std::string expired = "(" + N + " >= r.retention_deadline)";
    const std::string exhaust = "(NOT " + expired + " AND $6 <> 0 AND r.attempt >= $6)";
    const std::string writes =
        expired + " OR (NOT ($5 <> ''::bytea AND r.fingerprint <> ''::bytea AND "
        "r.fingerprint <> $5) AND r.state <> 2 AND NOT (r.state = 1 AND " + N +
        " < r.lease_deadline))";
    const std::string claim =
        "WITH n AS MATERIALIZED (SELECT " + now + " AS ms), w AS (\n"
        "INSERT INTO " + T + " AS r (key, state, token, fence, attempt, lease_deadline,"
        " retention_deadline, fingerprint, status, result)\n"
        "SELECT $1, 1, $2, 1, 1, n.ms + $3, n.ms + $3 + $4, $5, 0, ''::bytea FROM n\n"
        "ON CONFLICT (key) DO UPDATE SET\n"
        " state = CASE WHEN " + exhaust + " THEN 2 ELSE 1 END,\n"
        " token = CASE WHEN " + exhaust + " THEN r.token ELSE $2 END,\n"
        " fence = CASE WHEN " + exhaust + " THEN r.fence ELSE r.fence + 1 END,\n"
        " attempt = CASE WHEN " + expired + " THEN 1 WHEN " + exhaust +
        " THEN r.attempt ELSE r.attempt + 1 END,\n"
        " lease_deadline = CASE WHEN " + exhaust + " THEN " + N +
        " ELSE EXCLUDED.lease_deadline END,\n"
        " retention_deadline = CASE WHEN " + exhaust + " THEN " + N +
        " + $4 ELSE EXCLUDED.retention_deadline END,\n"
        " fingerprint = CASE WHEN " + exhaust + " THEN r.fingerprint WHEN " + expired +
        " OR r.fingerprint = ''::bytea THEN $5 ELSE r.fingerprint END,\n"
        " status = CASE WHEN " + exhaust + " THEN 2 ELSE 0 END,\n"
        " result = ''::bytea\n"
        "WHERE " + std::string(kDecodable) + " AND (" + writes + ")\n"
        "RETURNING " + cols + ", 1::bigint AS wrote)\n"
        "SELECT *, (SELECT ms FROM n) FROM w\n"
        "UNION ALL\n"
        "SELECT " + cols + ", 0::bigint, (SELECT ms FROM n) FROM " + T +
        " r WHERE r.key = $1 AND NOT EXISTS (SELECT 1 FROM w)";
    DEDUP_RETURN_IF_ERROR(c.Prepare("claim", claim, {kByteaOid, kInt8Oid, kInt8Oid, kInt8Oid,
                                                     kByteaOid, kInt8Oid}));
    const std::string owned = "r.key = $1 AND r.token = $2 AND r.state = 1 AND "
                              "r.retention_deadline > n.ms";
    DEDUP_RETURN_IF_ERROR(c.Prepare(
        "extend",
        "WITH n AS MATERIALIZED (SELECT " + now + " AS ms) UPDATE " + T +
            " r SET lease_deadline = n.ms + $3, retention_deadline = n.ms + $3 + "
            "(r.retention_deadline - r.lease_deadline) FROM n WHERE " + owned + " RETURNING 1",
        {kByteaOid, kInt8Oid, kInt8Oid}));
    DEDUP_RETURN_IF_ERROR(c.Prepare(
        "complete",
        "WITH n AS MATERIALIZED (SELECT " + now + " AS ms) UPDATE " + T +
            " r SET state = 2, status = $4, result = $5, lease_deadline = n.ms, "
            "retention_deadline = n.ms + $3 FROM n WHERE " + owned + " RETURNING 1",
        {kByteaOid, kInt8Oid, kInt8Oid, kInt8Oid, kByteaOid}));
    DEDUP_RETURN_IF_ERROR(c.Prepare(
        "release",
        "WITH n AS MATERIALIZED (SELECT " + now + " AS ms) UPDATE " + T +
            " r SET state = 3, lease_deadline = n.ms, retention_deadline = n.ms + $3 "
            "FROM n WHERE " + owned + " RETURNING 1",
        {kByteaOid, kInt8Oid, kInt8Oid}));
    // What Inspect and Scan show: a live record (a fence floor is none), and any
    // row that cannot be decoded, whatever its deadlines and state say: claims of
    // its key answer DataLoss, so the operator must be able to find it.
    const std::string listed = "(NOT " + std::string(kDecodable) + " OR (r.retention_deadline > " +
                               now + " AND NOT (r.state = 3 AND r.attempt = 0)))";
    DEDUP_RETURN_IF_ERROR(c.Prepare(
        "inspect",
        "SELECT " + cols + " FROM " + T + " r WHERE r.key = $1 AND " + listed,
        {kByteaOid}));
    // Forget: $1 key, $2 force (0 or 1). The row is locked, core/state_machine's
    // DecideForget is taken in SQL (action 0 none or a fence floor, 1 remove,
    // 2 refused: lease running, 3 forced: becomes a fence floor until the lease's
    // end), and one row {action, lease_left_ms} comes back (none: no record).
    DEDUP_RETURN_IF_ERROR(c.Prepare(
        "forget",
        "WITH n AS MATERIALIZED (SELECT " + now + " AS ms), c AS MATERIALIZED (\n"
        "SELECT r.key, r.lease_deadline, CASE"
        // A row that cannot be decoded is removed whatever its columns say (a
        // lease or a fence floor of token 0 is no lease anyone holds), as the
        // other stores remove one: forcing it made a floor that was still
        // undecodable, hidden from Scan and failing every claim.
        " WHEN NOT " + std::string(kDecodable) + " THEN 1"
        " WHEN r.retention_deadline <= n.ms OR (r.state = 3 AND r.attempt = 0) THEN 0"
        " WHEN r.state = 1 AND r.lease_deadline > n.ms THEN CASE WHEN $2 <> 0 THEN 3 ELSE 2 END"
        " ELSE 1 END AS action\n"
        "FROM " + T + " r, n WHERE r.key = $1 FOR UPDATE OF r),\n"
        "d AS (DELETE FROM " + T + " r USING c WHERE r.key = c.key AND c.action = 1"
        " RETURNING 1),\n"
        "u AS (UPDATE " + T + " r SET state = 3, attempt = 0, lease_deadline = n.ms,"
        " retention_deadline = c.lease_deadline, fingerprint = ''::bytea, status = 0,"
        " result = ''::bytea FROM c, n WHERE r.key = c.key AND c.action = 3 RETURNING 1)\n"
        "SELECT c.action::bigint, c.lease_deadline - n.ms FROM c, n",
        {kByteaOid, kInt8Oid}));
    // Keys a call can name (1 to kMaxKeyBytes after the prefix): others, written
    // by hand, are no record of the store's (Scan), and not counted by LIMIT.
    const std::string nameable =
        "length(r.key) BETWEEN " + std::to_string(o_.prefix.size() + 1) + " AND " +
        std::to_string(o_.prefix.size() + kMaxKeyBytes);
    // scan_keys: the same rows without their results (ScanOptions::with_results).
    for (const bool with_results : {true, false}) {
      std::string c_cols = cols;
      c_cols.replace(c_cols.rfind("r.result"), 8,
                     (with_results ? "r.result" : "''::bytea") +
                         std::string(", length(r.result)::bigint"));
      DEDUP_RETURN_IF_ERROR(c.Prepare(
          with_results ? "scan" : "scan_keys",
          "SELECT " + c_cols + " FROM " + T + " r WHERE r.key >= $1 AND "
          "substring(r.key FROM 1 FOR length($1)) = $1 AND " + listed + " AND " + nameable +
          " LIMIT $2",
          {kByteaOid, kInt8Oid}));
    }
    // Expiry: at most $1 rows, skipping rows other sessions hold (a claim taking
    // one over), found through the retention index; a TID scan deletes them.
    DEDUP_RETURN_IF_ERROR(c.Prepare(
        "expire",
        "DELETE FROM " + T + " WHERE ctid = ANY(ARRAY(SELECT ctid FROM " + T +
            " WHERE retention_deadline <= " + now + " LIMIT $1 FOR UPDATE SKIP LOCKED))",
        {kInt8Oid}));
    return Status::Ok();
  }

  void ExpireLoop() {
    std::unique_lock lock(expire_mu_);
    while (!stopping_) {
      expire_cv_.wait_for(lock, o_.expire_interval, [&] { return stopping_; });
      if (stopping_) break;
      lock.unlock();
      (void)ExpireNow(o_.expire_batch, o_.expire_max_batches);  // retried next round
      lock.lock();
    }
  }

  const PostgresStoreOptions o_;
  const std::string where_;
  const std::string table_;
  // RunInTransaction's session reset (kForgetFunction): after a rollback, and
  // with the COMMIT in its round trip.
  const std::string release_ =
      "SELECT pg_advisory_unlock_all(); DISCARD SEQUENCES; " + ForgetHandlerStatements(o_.schema);
  static constexpr const char* kResetRole = "RESET ROLE; RESET SESSION AUTHORIZATION";
  const std::string reset_and_commit_ =
      "RESET ALL; UNLISTEN *; CLOSE ALL; "
      "SELECT pg_advisory_unlock_all(); DISCARD TEMP; DISCARD SEQUENCES; " +
      ForgetHandlerStatements(o_.schema) + "; COMMIT";
  int server_version_ = 0;  // set by Start() before the pool opens a connection
  pg::WaitStop stop_;  // before pool_: its connections point to it
  pg::Pool pool_;
  std::atomic<uint64_t> expired_rows_{0}, expire_statements_{0}, expire_micros_{0};
  std::mutex expire_mu_;
  std::condition_variable expire_cv_;
  bool stopping_ = false;
  std::thread expirer_;
};

class PgTransaction final : public PostgresTransaction {
 public:
  PgTransaction(pg::Conn& c, std::string_view key, Token token, uint64_t fence, uint32_t attempt)
      : c_(c), key_(key), token_(token), fence_(fence), attempt_(attempt) {}
  // The raw connection: the handler's libpq calls on it are not seen here, so
  // the transaction's id is read first (one round trip, for such handlers
  // only), and compared after the handler (EndedUnseen): a "COMMIT; BEGIN" or
  // COMMIT AND CHAIN leaves the connection inside a new transaction, and
  // PQtransactionStatus alone does not tell.
  PGconn* connection() override {
    if (!xid_.has_value() && !ended_) {
      auto x = CurrentXid();
      if (x.ok()) {
        xid_ = *x;
      } else {
        (void)Fail(x.status());  // a Done becomes a Retry (RunInTransaction)
      }
    }
    return c_.raw();
  }
  std::string_view key() const override { return key_; }
  Token token() const override { return token_; }
  uint64_t fence() const override { return fence_; }
  uint32_t attempt() const override { return attempt_; }
  bool failed() const { return failed_; }
  bool ended() const { return ended_; }
  // Whether the transaction the handler was given is not the one the
  // connection is in now (the handler ended it through connection()), or that
  // cannot be told.
  bool EndedUnseen() {
    if (!xid_.has_value() || PQtransactionStatus(c_.raw()) != PQTRANS_INTRANS) return false;
    auto now = CurrentXid();
    return !now.ok() || *now != *xid_;
  }
  // The same question when the connection is in an aborted transaction (a
  // statement failed after the handler took connection()), where no id can be
  // read: asked after the rollback, of the transaction the handler was given.
  // True when it committed (a chain, then the failing statement) or that
  // cannot be told.
  bool CommittedBeforeAbort() {
    if (!xid_.has_value()) return false;
    auto r = c_.Exec("SELECT txid_status(" + *xid_ + ")", "transaction status");
    if (!r.ok() || PQntuples(r->get()) != 1) return true;
    return std::string_view(PQgetvalue(r->get(), 0, 0)) != "aborted";
  }
  bool read_xid() const { return xid_.has_value(); }
  const Status& failure() const { return failure_; }

  StatusOr<std::vector<Row>> Exec(std::string_view sql,
                                  const std::vector<std::optional<std::string>>& params) override {
    if (ended_) {  // each statement would now commit on its own
      return Fail(Status::FailedPrecondition(
          "handler statement: refused: the handler ended the store's transaction (" +
          ended_by_ + ")"));
    }
    // Text travels as C strings: a NUL would cut the value short, silently.
    if (sql.find('\0') != std::string_view::npos) {
      return Fail(Status::InvalidArgument("handler statement: the SQL text contains a NUL byte"));
    }
    std::vector<const char*> values;
    for (size_t i = 0; i < params.size(); ++i) {
      const auto& v = params[i];
      if (v && v->find('\0') != std::string::npos) {
        return Fail(Status::InvalidArgument(
            "handler statement: parameter $" + std::to_string(i + 1) +
            " contains a NUL byte, which a text parameter cannot carry (it would be cut there); "
            "pass such bytes encoded, e.g. hex with decode($" + std::to_string(i + 1) + ", 'hex')"));
      }
      values.push_back(v ? v->c_str() : nullptr);
    }
    const std::string text(sql);
    auto res = c_.Run(
        [&](PGconn* c) {
          return PQsendQueryParams(c, text.c_str(), static_cast<int>(values.size()), nullptr,
                                   values.data(), nullptr, nullptr, 0);
        },
        "handler statement");
    if (!res.ok()) return Fail(res.status());
    pg::Result r = std::move(res).value();
    const ExecStatusType st = PQresultStatus(r.get());
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return Fail(c_.UserErrorOf(r.get(), "handler statement"));
    // A COMMIT, END or ROLLBACK (the extended protocol runs them; EXECUTE, for
    // ExecScript, refuses them): the effect may be committed without the
    // completion. Too late to undo; RunInTransaction never lets it run again.
    // COMMIT AND CHAIN and ROLLBACK AND CHAIN (tagged COMMIT and ROLLBACK) end
    // it too, and leave the connection inside a new one.
    const std::string_view tag = PQcmdStatus(r.get());
    if (PQtransactionStatus(c_.raw()) == PQTRANS_IDLE || tag == "COMMIT" || tag == "ROLLBACK") {
      ended_ = true;
      ended_by_ = tag;
      return Fail(Status::FailedPrecondition(
          "handler statement: " + ended_by_ +
          " ended the store's transaction: the handler may not COMMIT, ROLLBACK or END it "
          "(its writes may be committed without the completion; the key is completed as "
          "failed so that they are never applied twice)"));
    }
    std::vector<Row> rows;
    for (int i = 0; i < PQntuples(r.get()); ++i) {
      Row row;
      for (int j = 0; j < PQnfields(r.get()); ++j) {
        if (PQgetisnull(r.get(), i, j)) {
          row.emplace_back(std::nullopt);
        } else {
          row.emplace_back(std::string(PQgetvalue(r.get(), i, j),
                                       static_cast<size_t>(PQgetlength(r.get(), i, j))));
        }
      }
      rows.push_back(std::move(row));
    }
    return rows;
  }

  // The text runs inside the server (PL/pgSQL EXECUTE of a string, which takes many
  // statements), not as a simple query: there a COMMIT, END or ROLLBACK would end
  // our transaction, committing the effect without the completion. EXECUTE
  // refuses transaction commands, and the transaction then rolls back. The text
  // reaches it through a transaction-local setting, set in the same round trip
  // (as a literal libpq escapes), so that the script costs one round trip.
  Status ExecScript(std::string_view sql) override {
    if (sql.find('\0') != std::string_view::npos) {
      return Fail(Status::InvalidArgument("handler SQL: the text contains a NUL byte"));
    }
    char* literal = PQescapeLiteral(c_.raw(), sql.data(), sql.size());
    if (literal == nullptr) {  // e.g. text that is not valid UTF-8
      std::string why = PQerrorMessage(c_.raw());
      while (!why.empty() && why.back() == '\n') why.pop_back();
      return Fail(Status::InvalidArgument("handler SQL: " + why));
    }
    std::string q = "SELECT set_config('dedup.handler_sql', ";
    q += literal;
    PQfreemem(literal);
    q += ", true); DO $dedup$ BEGIN EXECUTE current_setting('dedup.handler_sql'); END $dedup$";
    auto res = c_.Run([&](PGconn* c) { return PQsendQuery(c, q.c_str()); }, "handler SQL");
    if (!res.ok()) return Fail(res.status());
    pg::Result r = std::move(res).value();
    const ExecStatusType st = PQresultStatus(r.get());
    if (st == PGRES_COMMAND_OK) return Status::Ok();
    Status e = c_.ScriptErrorOf(r.get(), "handler SQL");
    if (e.message().find("transaction commands") != std::string::npos) {
      return Fail(Status(e.code(),
                         e.message() +
                             "; the handler's SQL runs inside the transaction that records the "
                             "completion: it may not BEGIN, COMMIT, ROLLBACK or use savepoints"));
    }
    return Fail(e);
  }

 private:
  Status Fail(Status s) {
    if (!failed_) failure_ = s;
    failed_ = true;
    return s;
  }
  pg::Conn& c_;
  std::string key_;
  Token token_;
  uint64_t fence_;
  uint32_t attempt_;
  bool failed_ = false;
  Status failure_;
  StatusOr<std::string> CurrentXid() {
    auto r = c_.Exec("SELECT txid_current()", "transaction id");
    if (!r.ok()) return r.status();
    if (PQntuples(r->get()) != 1) return Status::Internal("transaction id: no row");
    return std::string(PQgetvalue(r->get(), 0, 0));
  }

  bool ended_ = false;    // a statement of the handler ended the transaction
  std::string ended_by_;  // its command tag
  std::optional<std::string> xid_;  // read when the handler asked for connection()
};

StatusOr<WriteResult> PgStore::RunInTransaction(std::string_view key, Token token,
                                                uint64_t fence, uint32_t attempt,
                                                Millis retention,
                                                const TransactionalHandler& handler,
                                                HandlerResult* handler_result) {
  DEDUP_RETURN_IF_ERROR(ValidateComplete(key, token, retention, CompletionStatus::kOk, {}));
  HandlerResult hr;
  {
    auto h = pool_.GetForTransaction();  // leaves a connection for the heartbeat
    if (!h.ok()) return h.status();
    pg::Conn& c = **h;
    DEDUP_RETURN_IF_ERROR(c.Exec("BEGIN ISOLATION LEVEL READ COMMITTED", "begin").status());
    // A rollback keeps session-level advisory locks the handler took, the
    // statements it prepared and sequences' currval; the connection goes back to
    // the pool without them (kForgetFunction). If that fails (the function
    // dropped), the connection is closed when handed back, with them.
    auto rollback = [&] {
      (void)c.Exec("ROLLBACK", "rollback");
      if (!c.Exec(release_, "release session state").ok()) c.Poison();
    };
    PgTransaction tx(c, key, token, fence, attempt);
    try {
      hr = handler(tx);
    } catch (const std::exception& e) {
      hr = HandlerResult::Retry(std::string("handler threw: ") + e.what());
    } catch (...) {
      hr = HandlerResult::Retry("handler threw a non-standard exception");
    }
    if (tx.failed() && hr.kind == HandlerResult::Kind::kDone) {
      hr = HandlerResult::Retry("a statement of the handler failed: " + tx.failure().ToString());
    }
    // The handler ended the transaction itself (a COMMIT through Exec, or any
    // libpq call on connection(), COMMIT AND CHAIN included, which leaves the
    // connection in a new transaction): its writes may be committed, without the
    // completion. Released, the claim would run the handler again and apply
    // them twice: completed as failed instead (dead-lettered), saying why.
    bool rolled_back = false;
    if (tx.read_xid() && PQtransactionStatus(c.raw()) == PQTRANS_INERROR) {
      // Aborted: nothing of this transaction can commit; whether the one the
      // handler was given already did is read after the rollback.
      rollback();
      rolled_back = true;
      if (tx.CommittedBeforeAbort()) {
        hr = HandlerResult::Fail(
            "the handler ended the store's transaction itself (COMMIT, ROLLBACK or END) and a "
            "statement failed after: its writes may be committed without the completion, so "
            "the message is not run again");
      } else if (hr.kind == HandlerResult::Kind::kDone) {
        hr = HandlerResult::Retry("a statement of the handler failed: the transaction was aborted");
      }
    } else if (tx.ended() || PQtransactionStatus(c.raw()) == PQTRANS_IDLE || tx.EndedUnseen()) {
      hr = HandlerResult::Fail(
          "the handler ended the store's transaction itself (COMMIT, ROLLBACK or END): its "
          "writes may be committed without the completion, so the message is not run again");
    }
    // An outcome a record cannot hold would fail the same way on every retry:
    // a permanent failure with the reason (writes rolled back), and a Fail
    // reason that long is kept cut to fit, never retried for ever.
    if (hr.kind == HandlerResult::Kind::kDone && hr.result.size() > kMaxResultBytes) {
      hr = HandlerResult::Fail("the handler's result is " + std::to_string(hr.result.size()) +
                               " bytes, more than the " + std::to_string(kMaxResultBytes) +
                               " a record holds: its writes were rolled back");
    }
    if (hr.kind == HandlerResult::Kind::kFail) {
      hr.result = internal::CutReasonToFitARecord(hr.result, kMaxResultBytes);
    }
    if (handler_result != nullptr) *handler_result = hr;
    if (hr.kind == HandlerResult::Kind::kDone) {
      Params p;
      p.Bytes(Key(key)).Int8(static_cast<int64_t>(token.value)).Int8(retention.count());
      p.Int8(static_cast<int64_t>(CompletionStatus::kOk)).Bytes(hr.result);
      // As the connection's own role: under a role the handler SET (which
      // holds for its own statements), the completion was refused for want of
      // privileges on the store's table, and the message retried for ever.
      // RESET is transactional, and undone with the rest on a rollback.
      if (auto reset = c.Exec(kResetRole, "reset role"); !reset.ok()) {
        rollback();
        return reset.status();
      }
      auto w = OwnerWriteOn(c, "complete", p);
      if (!w.ok() || *w == WriteResult::kLost) {
        rollback();
        return w;
      }
      // The handler's SETs (search_path, statement_timeout, a role ...), LISTENs and
      // held cursors would commit with the transaction and stay on the pooled
      // connection for the next handler and the store's own statements: back to the
      // connection's own values (RESET is transactional too), in the COMMIT's own
      // round trip. A rollback undoes them by itself. Session-level advisory locks
      // survive both: released; and the temporary tables, prepared statements and
      // currval of kForgetFunction, after the RESETs (as the connection's own
      // role, the handler's cursors closed). If any of these fails, the
      // statements after it (COMMIT too) are skipped: the transaction is not
      // committed, and the connection, left inside it, is closed when handed back.
      auto commit = c.Exec(reset_and_commit_, "commit");
      if (!commit.ok()) {
        // ForgetHandlerStatements' own data exception: its words, which ErrorOf
        // does not show (a data exception may quote values), said again.
        const std::string replaced = ForgetFunctionReplaced(o_.schema);
        if (c.last_sqlstate() == "22P02" && c.last_primary().find(replaced) != std::string::npos) {
          return Status::InvalidArgument(where_ + ": commit: " + replaced + " (SQLSTATE 22P02)");
        }
        return commit.status();
      }
      // COMMIT of an aborted transaction answers ROLLBACK instead of failing.
      if (std::string_view(PQcmdStatus(commit->get())) != "COMMIT") {
        return Status::Unavailable(where_ + ": commit: the transaction was rolled back");
      }
      return WriteResult::kOk;
    }
    if (!rolled_back) rollback();
  }
  if (hr.kind == HandlerResult::Kind::kFail) {
    return Complete(key, token, retention, CompletionStatus::kFailed, hr.result);
  }
  return Release(key, token, retention);
}

}  // namespace

StatusOr<std::unique_ptr<PostgresStore>> OpenPostgresStore(const PostgresStoreOptions& options) {
  const PostgresStoreOptions& o = options;
  if (o.database.empty()) return Status::InvalidArgument("postgres: no database given");
  // libpq reads these as C strings: a NUL would cut one short (another role or
  // database than the one named). The password's value is never shown.
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"user", &o.user},
                                     {"password", &o.password},
                                     {"database", &o.database},
                                     {"host", &o.host},
                                     {"sslmode", &o.sslmode}}) {
    if (value->find('\0') != std::string::npos) {
      return Status::InvalidArgument(std::string("postgres: the ") + field +
                                     " contains a NUL byte (%00 in a URI)");
    }
  }
  if (o.host.empty()) return Status::InvalidArgument("postgres: no host given");
  if (o.port <= 0 || o.port > 65535) {
    return Status::InvalidArgument("postgres: port must be 1 to 65535, got " + std::to_string(o.port));
  }
  if (!pg::ValidIdentifier(o.schema)) {
    return Status::InvalidArgument(pg::IdentifierError("schema", o.schema, 63));
  }
  // "pg_" names are PostgreSQL's own (pg_catalog, pg_temp, pg_toast): CREATE
  // SCHEMA refuses them, and the store's migration failed as INTERNAL.
  if (o.schema.starts_with("pg_")) {
    return Status::InvalidArgument("postgres: schema '" + o.schema +
                                   "': names beginning with pg_ are PostgreSQL's own schemas; "
                                   "name one of yours");
  }
  if (!pg::ValidIdentifier(o.table) || o.table.size() > 53) {
    return Status::InvalidArgument(pg::IdentifierError("table", o.table, 53));
  }
  if (o.table == "dedup_fences") {  // FenceHelperBody's, beside it in the schema
    return Status::InvalidArgument(
        "postgres: table 'dedup_fences' is the fence helper's own, in the same schema: name "
        "the records' table otherwise");
  }
  if (o.pool_size < 1 || o.pool_size > 1024) {
    return Status::InvalidArgument("postgres: pool must be 1 to 1024, got " + std::to_string(o.pool_size));
  }
  if (o.timeout.count() <= 0) return Status::InvalidArgument("postgres: timeout must be positive");
  if (o.timeout.count() > INT32_MAX) {  // statement_timeout is an int of milliseconds
    return Status::InvalidArgument("postgres: timeout must be at most 2147483647ms (about 24 days), got " +
                                   std::to_string(o.timeout.count()) + "ms");
  }
  if (!o.sslmode.empty() && o.sslmode != "disable" && o.sslmode != "allow" &&
      o.sslmode != "prefer" && o.sslmode != "require" && o.sslmode != "verify-ca" &&
      o.sslmode != "verify-full") {
    return Status::InvalidArgument("postgres: sslmode '" + o.sslmode +
                                   "' is not one of disable, allow, prefer, require, verify-ca, "
                                   "verify-full");
  }
  if (o.expire_interval.count() < 0) {
    return Status::InvalidArgument("postgres: expire_interval must not be negative");
  }
  if (o.expire_batch < 1 || o.expire_batch > 1'000'000) {
    return Status::InvalidArgument("postgres: expire_batch must be 1 to 1000000, got " +
                                   std::to_string(o.expire_batch));
  }
  if (o.prefix.size() >= kMaxKeyBytes) {
    return Status::InvalidArgument("postgres: prefix is longer than a key may be");
  }
  auto s = std::make_unique<PgStore>(o);
  DEDUP_RETURN_IF_ERROR(s->Start());
  return std::unique_ptr<PostgresStore>(std::move(s));
}

namespace internal {

StatusOr<PostgresStoreOptions> PostgresOptionsFromUri(const Uri& uri) {
  DEDUP_RETURN_IF_ERROR(uri.CheckParams({"table", "schema", "pool", "prefix", "timeout",
                                         "expire_interval", "expire_batch", "sslmode"}));
  if (!uri.has_authority) {
    // Not echoed: "postgres:PASSWORD" is the default user's USER:PASSWORD given
    // where a URI belongs; what follows the ':' is no host.
    return Status::InvalidArgument("postgres: no '//' after '" + uri.scheme +
                                   ":' (expected postgres://USER:PASSWORD@HOST:PORT/DB)");
  }
  if (uri.hosts.empty()) {
    return Status::InvalidArgument("postgres URI '" + uri.Redacted() +
                                   "' has no host (expected postgres://USER:PASSWORD@HOST:PORT/DB)");
  }
  PostgresStoreOptions o;
  o.user = uri.user;
  o.password = uri.password;
  std::string_view host = uri.hosts;
  if (host.find(',') != std::string_view::npos) {
    // Not echoed: in "user:pass,h" (no "@") the hosts hold the password.
    return Status::InvalidArgument("postgres URI takes one host, got a ',' in the hosts");
  }
  // The one host grammar (core/uri.h): "[v6]:port" too, and "postgres://user:pass/db"
  // (no "@host") does not echo the password as a port.
  auto hp = ParseHostPort(host, "postgres");
  if (!hp.ok()) return hp.status();
  if (hp->port != 0) o.port = hp->port;
  o.host = std::move(hp->host);
  if (o.host.find('%') != std::string::npos) {
    // libpq's URI form: a Unix socket directory is the host percent-encoded
    // ("postgres://u@%2Fvar%2Frun%2Fpostgresql:5432/db"); passed on raw, libpq
    // looked "%2Fvar..." up as a host name. Decoded, a host that begins with '/'
    // is the socket's directory to libpq, and any other is a name or address.
    auto decoded = PercentDecode(o.host, "host");
    if (!decoded.ok()) {
      return Status::InvalidArgument("postgres: host: bad percent-escape (a Unix socket "
                                     "directory is written %2Fvar%2Frun%2Fpostgresql)");
    }
    DEDUP_RETURN_IF_ERROR(RefuseControlBytes(*decoded, "postgres: host"));
    o.host = std::move(*decoded);
  }
  if (uri.path.size() <= 1) {
    return Status::InvalidArgument("postgres URI '" + uri.Redacted() +
                                   "' names no database (expected postgres://HOST:PORT/DB)");
  }
  o.database = uri.path.substr(1);
  if (auto t = uri.Param("table")) o.table = *t;
  if (auto s = uri.Param("schema")) o.schema = *s;
  if (auto p = uri.Param("prefix")) o.prefix = *p;
  if (auto m = uri.Param("sslmode")) {
    // "sslmode=" meant libpq's default (prefer) without a word; refused as the
    // empty value it is, as a bogus one is.
    if (m->empty()) {
      return Status::InvalidArgument("postgres: sslmode= is empty (give disable, allow, prefer, "
                                     "require, verify-ca or verify-full, or leave it out)");
    }
    o.sslmode = *m;
  }
  if (auto p = uri.Param("pool")) {
    auto n = ParseCount(*p, "postgres: pool");
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > 1024) return Status::InvalidArgument("postgres: pool must be 1 to 1024, got " + *p);
    o.pool_size = static_cast<size_t>(*n);
  }
  if (auto t = uri.Param("timeout")) {
    // libpq's connect_timeout counts seconds, this grammar's bare number
    // milliseconds: "timeout=5" meant 5 s and was 5 ms, every statement
    // cancelled (exit 75, for ever). A unit is required here.
    if (!t->empty() && t->find_first_not_of("0123456789") == std::string::npos) {
      return Status::InvalidArgument("postgres: timeout=" + *t +
                                     " has no unit: write timeout=" + *t + "s for seconds (or " +
                                     *t + "ms); libpq's connect_timeout counts seconds, a bare "
                                     "number in a dedup URI milliseconds");
    }
    auto ms = ParseDurationMillis(*t, "postgres: timeout");
    if (!ms.ok()) return ms.status();
    if (*ms <= 0) return Status::InvalidArgument("postgres: timeout must be positive, got '" + *t + "'");
    o.timeout = Millis(*ms);
  }
  if (auto t = uri.Param("expire_interval")) {
    auto ms = ParseDurationMillis(*t, "postgres: expire_interval");
    if (!ms.ok()) return ms.status();
    o.expire_interval = Millis(*ms);
  }
  if (auto b = uri.Param("expire_batch")) {
    auto n = ParseCount(*b, "postgres: expire_batch");
    if (!n.ok()) return n.status();
    o.expire_batch = static_cast<size_t>(*n);
  }
  o.description = uri.Redacted();
  // Redacted() masks the password; say nothing of whether one was given either.
  if (uri.has_password) {
    const std::string masked = ":***@";
    const size_t at = o.description.find(masked);
    if (at != std::string::npos) o.description.erase(at, masked.size() - 1);
  }
  return o;
}

StatusOr<std::unique_ptr<Store>> OpenPostgresFromUri(const Uri& uri, std::string_view /*raw*/,
                                                     const OpenOptions& options) {
  auto o = PostgresOptionsFromUri(uri);
  if (!o.ok()) return o.status();
  o->must_exist = options.must_exist;
  o->read_only = options.read_only;
  auto s = OpenPostgresStore(*o);
  if (!s.ok()) return s.status();
  return std::unique_ptr<Store>(std::move(s).value());
}

}  // namespace internal

StatusOr<std::unique_ptr<PostgresStore>> OpenPostgresStore(std::string_view uri) {
  auto parsed = internal::ParseUri(uri);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme != "postgres" && parsed->scheme != "postgresql") {
    return Status::InvalidArgument("not a postgres:// URI: '" + parsed->Redacted() + "'");
  }
  auto o = internal::PostgresOptionsFromUri(*parsed);
  if (!o.ok()) return o.status();
  return OpenPostgresStore(*o);
}

Processed ProcessOnceInTransaction(Buffer& buffer, PostgresStore& store, std::string_view key,
                                   std::string_view payload,
                                   const TransactionalHandler& handler) {
  return ProcessOnceInTransaction(
      buffer, store, key, payload,
      GuardedTransactionalHandler(
          [&](PostgresTransaction& tx, const ClaimGuard&) { return handler(tx); }));
}

Processed ProcessOnceInTransaction(Buffer& buffer, PostgresStore& store, std::string_view key,
                                   std::string_view payload,
                                   const GuardedTransactionalHandler& guarded) {
  // Every answer but ACQUIRED (and a bad key, and a store error on the claim) is
  // decided as ProcessOnce decides it; the handler is not run for those.
  const Buffer::Handler not_run = [](ClaimGuard&) { return HandlerResult::Retry("not run"); };
  if (Status s = ValidateKey(key); !s.ok()) return buffer.ProcessClaimed(key, std::move(s), not_run);
  std::string fingerprint;
  if (buffer.options().fingerprint_payloads) fingerprint = PayloadFingerprint(payload);
  StatusOr<ClaimGuard> c = buffer.Claim(key, fingerprint);
  if (!c.ok() || !c->acquired()) return buffer.ProcessClaimed(key, std::move(c), not_run);
  ClaimGuard& g = *c;
  Processed p;
  p.claim = g.result();
  HandlerResult hr;
  // `ran` only once the handler is called: RunInTransaction can fail before it
  // (no pooled connection within the timeout, BEGIN refused), and a handler
  // never run must not be counted as run (a draining Consumer hands a message
  // whose handler ran without an outcome back at once, not after the delay).
  const TransactionalHandler handler = [&](PostgresTransaction& tx) {
    p.ran = true;
    return guarded(tx, g);
  };
  auto w = store.RunInTransaction(key, g.token(), g.fence(), g.attempt(),
                                  buffer.options().retention, handler, &hr);
  // The guard's own release when it goes out of scope gives the claim back when
  // the record is still this claim's (the handler never ran, or its transaction
  // was rolled back); else it answers LOST (the record is already completed or
  // released) and changes nothing.
  if (!w.ok()) {
    p.status = w.status();
    p.retry_after = buffer.options().retry_delay;
    p.reason = (p.ran ? "store error recording the outcome: "
                      : "store error before the handler ran (its transaction could not begin): ") +
               w.status().ToString();
    return p;
  }
  p.completion = *w;
  switch (hr.kind) {
    case HandlerResult::Kind::kDone:
      p.action = BrokerAction::kAck;
      p.result = hr.result;
      break;
    case HandlerResult::Kind::kFail:
      p.action = BrokerAction::kDeadLetter;
      p.reason = hr.result;
      break;
    case HandlerResult::Kind::kRetry:
      p.action = BrokerAction::kRetry;
      p.retry_after = buffer.options().retry_delay;
      p.reason = hr.result;
      break;
  }
  if (*w == WriteResult::kLost && hr.kind != HandlerResult::Kind::kRetry) {
    p.action = BrokerAction::kRetry;
    p.retry_after = buffer.options().retry_delay;
    p.reason = "lease lost to another owner before the outcome was recorded (nothing committed)";
  }
  return p;
}

StatusOr<std::string> FenceHelperSql(std::string_view schema) {
  if (!pg::ValidIdentifier(schema)) {
    return Status::InvalidArgument(pg::IdentifierError("schema", schema, 63));
  }
  return "CREATE SCHEMA IF NOT EXISTS " + pg::Quote(schema) + ";\n" + FenceHelperBody(schema);
}

namespace {

std::string FenceHelperBody(std::string_view schema) {
  const std::string s = pg::Quote(schema);
  return "CREATE TABLE IF NOT EXISTS " + s + ".dedup_fences (\n"
         "  scope text NOT NULL, key text NOT NULL, fence bigint NOT NULL,\n"
         "  applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),\n"
         "  PRIMARY KEY (scope, key));\n"
         "CREATE OR REPLACE FUNCTION " + s + ".dedup_apply_fence(p_scope text, p_key text, "
         "p_fence bigint)\n"
         "RETURNS bigint LANGUAGE plpgsql AS $dedup$\n"
         "DECLARE applied bigint;\n"
         "BEGIN\n"
         "  INSERT INTO " + s + ".dedup_fences AS f (scope, key, fence) VALUES (p_scope, p_key, p_fence)\n"
         "  ON CONFLICT (scope, key) DO UPDATE SET fence = EXCLUDED.fence, applied_at = clock_timestamp()\n"
         "    WHERE f.fence <= EXCLUDED.fence\n"
         "  RETURNING f.fence INTO applied;\n"
         "  IF applied IS NULL THEN\n"
         "    SELECT f.fence INTO applied FROM " + s + ".dedup_fences f\n"
         "      WHERE f.scope = p_scope AND f.key = p_key;\n"
         "    RAISE EXCEPTION 'dedup: stale fence % for %/%: fence % was already applied',\n"
         "      p_fence, p_scope, p_key, applied USING ERRCODE = 'DF001';\n"
         "  END IF;\n"
         "  RETURN applied;\n"
         "END $dedup$;\n"
         "CREATE OR REPLACE FUNCTION " + s + ".dedup_refuse_stale_fence()\n"
         "RETURNS trigger LANGUAGE plpgsql AS $dedup$\n"
         "BEGIN\n"
         "  IF NEW.fence < OLD.fence THEN\n"
         "    RAISE EXCEPTION 'dedup: stale fence % on %: fence % was already applied',\n"
         "      NEW.fence, TG_TABLE_NAME, OLD.fence USING ERRCODE = 'DF001';\n"
         "  END IF;\n"
         "  RETURN NEW;\n"
         "END $dedup$;\n";
}

}  // namespace

}  // namespace dedup
