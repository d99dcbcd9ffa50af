// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "stores/postgres/pg_conn.h"

#include <endian.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "core/printable.h"

namespace dedup::pg {

using internal::SteadyMillis;

namespace {

// A server's NOTICE or WARNING (a handler's RAISE, "there is no transaction in
// progress"): libpq's default printed it to stderr byte for byte, so a
// handler's escape sequences reached the terminal. Escaped, one line each.
void PrintNotice(void*, const char* message) {
  std::string_view m(message);
  while (!m.empty() && (m.back() == '\n' || m.back() == ' ')) m.remove_suffix(1);
  const std::string line = "dedup: postgres server says: " + internal::PrintableCut(m, 4096) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

// Classifies a connection failure by libpq's words (no SQLSTATE exists before the
// session is up, and libpq never puts the password into them).
Status ConnectError(const std::string& where, const std::string& msg, const std::string& db_raw) {
  // libpq's words on one line (its line breaks and tabs, and any a name quoted
  // in them holds, as one space), anything else unprintable escaped: a database
  // name with a newline forged a line of the log.
  std::string flat;
  for (char c : Trim(msg)) {
    if (c == '\n' || c == '\t' || c == '\r') {
      if (!flat.empty() && flat.back() != ' ') flat += ' ';
    } else {
      flat += c;
    }
  }
  const std::string m = internal::Printable(flat), db = internal::Printable(db_raw);
  if (m.find("password authentication failed") != std::string::npos ||
      m.find("no password supplied") != std::string::npos ||
      m.find("SASL authentication") != std::string::npos) {
    return Status::Unauthenticated(where + ": wrong password or user (" + m + ")");
  }
  if (m.find("does not exist") != std::string::npos && m.find("database") != std::string::npos) {
    return Status::NotFound(where + ": database '" + db + "' does not exist (" + m + ")");
  }
  if (m.find("role") != std::string::npos && m.find("does not exist") != std::string::npos) {
    return Status::Unauthenticated(where + ": " + m);
  }
  if (m.find("expected authentication request") != std::string::npos ||
      m.find("invalid response to SSL negotiation") != std::string::npos ||
      m.find("unsupported frontend protocol") != std::string::npos ||
      m.find("received invalid response") != std::string::npos) {
    return Status::FailedPrecondition(where + " does not speak the PostgreSQL protocol (" + m + ")");
  }
  // A setting, not a passing state: sslmode=require (or verify-*) against a
  // server without SSL was UNAVAILABLE, retried for ever as if it could pass.
  if (m.find("does not support SSL") != std::string::npos ||
      m.find("SSL support is not compiled in") != std::string::npos) {
    return Status::FailedPrecondition(where + ": sslmode asks for SSL, which " +
                                      (m.find("compiled") != std::string::npos
                                           ? "this libpq was built without"
                                           : "the server does not accept") +
                                      " (" + m + ")");
  }
  if (m.find("timeout expired") != std::string::npos) {
    return Status::DeadlineExceeded(where + ": connect timed out (" + m + ")");
  }
  if (m.find("starting up") != std::string::npos || m.find("shutting down") != std::string::npos ||
      m.find("too many") != std::string::npos) {
    return Status::Unavailable(where + ": " + m);
  }
  return Status::Unavailable(where + ": cannot connect (" + m + ")");
}

// How a wait for the server ended.
enum class Waited { kReady, kTimedOut, kGivenUp, kFailed };

// Waits until `fd` is ready for `events`, or the wait that began at `start_ms`
// has lasted `limit_ms`, or (once `stop` is stopped) its grace has passed.
Waited AwaitFd(int fd, short events, int64_t start_ms, int64_t limit_ms, WaitStop* stop) {
  if (fd < 0) return Waited::kFailed;  // no socket (libpq closed it)
  for (;;) {
    const int64_t now = SteadyMillis();
    const int64_t give_up = stop != nullptr ? stop->GiveUpAt(start_ms) : INT64_MAX;
    const int64_t timed_out = start_ms + limit_ms;
    const int64_t until = std::min(give_up, timed_out);
    if (now >= until) return give_up <= timed_out ? Waited::kGivenUp : Waited::kTimedOut;
    pollfd fds[2] = {{fd, events, 0}, {-1, POLLIN, 0}};
    nfds_t n = 1;
    // The stop's eventfd wakes the wait at the stop; once stopped, the
    // deadline above already holds the grace (and the fd stays readable).
    if (stop != nullptr && stop->fd() >= 0 && !stop->stopped()) {
      fds[1].fd = stop->fd();
      n = 2;
    }
    const int64_t left = until - now;
    const int r = poll(fds, n, static_cast<int>(std::min<int64_t>(left, 60'000)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Waited::kFailed;
    }
    if (r > 0 && fds[0].revents != 0) return Waited::kReady;
  }
}

}  // namespace

Params& Params::Bytes(std::string_view b) {
  storage_.emplace_back(b);
  lengths_.push_back(static_cast<int>(b.size()));
  formats_.push_back(1);
  return *this;
}

Params& Params::Int8(int64_t v) {
  const uint64_t be = htobe64(static_cast<uint64_t>(v));
  storage_.emplace_back(reinterpret_cast<const char*>(&be), sizeof(be));
  lengths_.push_back(8);
  formats_.push_back(1);
  return *this;
}

const char* const* Params::values() {
  values_.clear();
  for (const std::string& s : storage_) values_.push_back(s.data());
  return values_.data();
}

int64_t GetInt8(const PGresult* r, int row, int col) {
  uint64_t be = 0;
  if (PQgetlength(r, row, col) != 8) return 0;
  std::memcpy(&be, PQgetvalue(r, row, col), 8);
  return static_cast<int64_t>(be64toh(be));
}

std::string GetBytes(const PGresult* r, int row, int col) {
  return std::string(PQgetvalue(r, row, col), static_cast<size_t>(PQgetlength(r, row, col)));
}

StatusOr<std::unique_ptr<Conn>> Conn::Open(const PostgresStoreOptions& o,
                                           const std::string& where, int server_version,
                                           WaitStop* stop) {
  const std::string port = std::to_string(o.port);
  const std::string timeout =
      std::to_string(std::max<long long>(2, (o.timeout.count() + 999) / 1000));
  // READ COMMITTED whatever the database or role defaults to: the store's
  // statements, and the completion inside a handler's transaction, must see the
  // record's latest committed version (under REPEATABLE READ a heartbeat's extend
  // would make the completion fail with a serialization error).
  std::string options = "-c statement_timeout=" + std::to_string(o.timeout.count()) +
                        " -c client_min_messages=warning"
                        " -c default_transaction_isolation=read\\ committed";
  // A transaction of RunInTransaction stays open, idle on the server, while its
  // handler runs (for as long as the heartbeat keeps the lease): a DBA's
  // idle_in_transaction_session_timeout (or PostgreSQL 17's transaction_timeout)
  // shorter than a handler would end the session under it every time, and the
  // message be retried for ever. The store's own connections are exempt; the
  // lease bounds how long a live worker keeps one (a lost lease stops the handler
  // and rolls back). Startup options, so that the COMMIT's RESET ALL keeps them.
  // Each statement stays bounded by statement_timeout (`timeout`).
  if (server_version >= 120000) options += " -c idle_in_transaction_session_timeout=0";
  if (server_version >= 170000) options += " -c transaction_timeout=0";
  std::vector<const char*> keys = {"host", "port", "dbname", "connect_timeout",
                                   "application_name", "options", "client_encoding"};
  std::vector<const char*> values = {o.host.c_str(), port.c_str(), o.database.c_str(),
                                     timeout.c_str(), "dedup", options.c_str(), "UTF8"};
  if (!o.user.empty()) {
    keys.push_back("user");
    values.push_back(o.user.c_str());
  }
  if (!o.password.empty()) {
    keys.push_back("password");
    values.push_back(o.password.c_str());
  }
  if (!o.sslmode.empty()) {
    keys.push_back("sslmode");
    values.push_back(o.sslmode.c_str());
  }
  keys.push_back(nullptr);
  values.push_back(nullptr);
  const int64_t start = SteadyMillis();
  if (stop != nullptr && stop->GiveUpAt(start) <= start) {
    return Status::Aborted(where + ": connect: given up: the caller is stopping, and the server "
                           "let an earlier call wait out its grace (nothing was sent)");
  }
  // Connected step by step (PQconnectPoll), so that the wait is ours to bound
  // and to give up; libpq's connect_timeout (whole seconds) is the same bound.
  PGconn* c = PQconnectStartParams(keys.data(), values.data(), 0);
  if (c == nullptr) return Status::ResourceExhausted(where + ": libpq could not allocate a connection");
  PQsetNoticeProcessor(c, PrintNotice, nullptr);
  const int64_t limit = std::max<int64_t>(2, (o.timeout.count() + 999) / 1000) * 1000;
  PostgresPollingStatusType st =
      PQstatus(c) == CONNECTION_BAD ? PGRES_POLLING_FAILED : PGRES_POLLING_WRITING;
  while (st != PGRES_POLLING_OK && st != PGRES_POLLING_FAILED) {
    const Waited w = AwaitFd(PQsocket(c), st == PGRES_POLLING_READING ? POLLIN : POLLOUT, start,
                             limit, stop);
    if (w == Waited::kTimedOut || w == Waited::kGivenUp) {
      PQfinish(c);
      if (w == Waited::kGivenUp) {
        stop->GaveUp();
        return Status::Aborted(where + ": connect: given up: the caller is stopping and the "
                               "server did not answer within the grace");
      }
      // A PostgreSQL server answers the startup packet at once; a Redis or an HTTP
      // server at that port waits for a line that never comes.
      return Status::DeadlineExceeded(where + ": connect timed out (no answer within " +
                                      std::to_string(limit) +
                                      " ms; a PostgreSQL server answers at once: is this its "
                                      "port, or is it frozen?)");
    }
    st = PQconnectPoll(c);
  }
  if (PQstatus(c) != CONNECTION_OK) {
    Status s = ConnectError(where, PQerrorMessage(c), o.database);
    PQfinish(c);
    return s;
  }
  return std::unique_ptr<Conn>(new Conn(c, where, o.timeout + kAnswerSlack, stop));
}

Conn::~Conn() {
  // An abandoned connection may hold bytes the server does not read: its
  // goodbye must not wait for room (PQsetnonblocking never flushes here: what
  // is left unsent left it non-blocking already).
  if (abandoned_) (void)PQsetnonblocking(conn_, 1);
  PQfinish(conn_);
}

bool Conn::broken() const {
  return poisoned_ || abandoned_ || PQstatus(conn_) != CONNECTION_OK;
}

bool Conn::ClosedWhileIdle() {
  if (broken()) return true;
  // A read that got bytes (the goodbye) does not look further: the end of the
  // stream behind them is seen by the next one. A few rounds, not a loop on a
  // stream of NOTIFYs.
  for (int round = 0; round < 4; ++round) {
    pollfd p{PQsocket(conn_), POLLIN, 0};
    if (p.fd < 0) return true;
    int r;
    do {
      r = poll(&p, 1, 0);
    } while (r < 0 && errno == EINTR);
    if (r <= 0 || p.revents == 0) return false;
    // libpq's socket never blocks a read: PQconsumeInput takes what is there.
    if (PQconsumeInput(conn_) == 0 || PQstatus(conn_) != CONNECTION_OK) return true;
  }
  return false;
}

Status Conn::AwaitSocket(short events, int64_t start_ms, std::string_view op) {
  const Waited w = AwaitFd(PQsocket(conn_), events, start_ms, wait_.count(), stop_);
  if (w == Waited::kReady) return Status::Ok();
  abandoned_ = true;  // what was sent may still run; the connection is closed
  if (w == Waited::kGivenUp) {
    stop_->GaveUp();
    return Status::Aborted(where_ + ": " + std::string(op) +
                           ": given up: the caller is stopping and the server did not answer "
                           "within the grace; its effect is unknown");
  }
  if (w == Waited::kTimedOut) {
    return Status::DeadlineExceeded(
        where_ + ": " + std::string(op) + ": no answer within " + std::to_string(wait_.count()) +
        " ms (timeout + " + std::to_string(kAnswerSlack.count()) +
        " ms: the server frozen, or the network cut?); the connection is closed, the "
        "effect unknown");
  }
  return Status::Unavailable(where_ + ": " + std::string(op) + ": poll: " + std::strerror(errno));
}

Status Conn::BeginExchange(int64_t start, std::string_view op) {
  last_sqlstate_.clear();
  if (abandoned_) {
    return Status::Unavailable(where_ + ": " + std::string(op) +
                               ": the connection was abandoned by an earlier call");
  }
  if (stop_ != nullptr && stop_->GiveUpAt(start) <= start) {
    abandoned_ = true;
    return Status::Aborted(where_ + ": " + std::string(op) +
                           ": given up: the caller is stopping, and the server let an earlier "
                           "call wait out its grace (nothing was sent)");
  }
  // Non-blocking while ours, so that neither the send nor the wait blocks past
  // the bound (EndExchange goes back to blocking).
  if (PQsetnonblocking(conn_, 1) != 0) return Lost(op);
  return Status::Ok();
}

void Conn::EndExchange() {
  // Back to blocking for a handler's own libpq calls (an abandoned connection
  // stays non-blocking, for its goodbye in ~Conn).
  if (!abandoned_ && PQstatus(conn_) == CONNECTION_OK) (void)PQsetnonblocking(conn_, 0);
}

Status Conn::Lost(std::string_view op) {
  abandoned_ = true;
  return ErrorOf(nullptr, op);
}

Status Conn::FlushSent(int64_t start, std::string_view op) {
  for (;;) {
    const int f = PQflush(conn_);
    if (f == 0) return Status::Ok();
    if (f < 0) return Lost(op);
    DEDUP_RETURN_IF_ERROR(AwaitSocket(POLLOUT | POLLIN, start, op));
    if (PQconsumeInput(conn_) == 0) return Lost(op);
  }
}

Status Conn::NextResult(int64_t start, std::string_view op, Result* out) {
  while (PQisBusy(conn_)) {
    DEDUP_RETURN_IF_ERROR(AwaitSocket(POLLIN, start, op));
    if (PQconsumeInput(conn_) == 0) return Lost(op);
  }
  out->reset(PQgetResult(conn_));
  return Status::Ok();
}

StatusOr<Result> Conn::Run(const std::function<int(PGconn*)>& send, std::string_view op) {
  const int64_t start = SteadyMillis();
  DEDUP_RETURN_IF_ERROR(BeginExchange(start, op));
  struct End {
    Conn* c;
    ~End() { c->EndExchange(); }
  } end{this};
  // A failure with no answer: the connection is closed (Unavailable).
  auto lost = [&] { return Lost(op); };
  if (send(conn_) == 0) {
    // Refused by libpq before anything was sent (e.g. too many parameters)?
    return PQstatus(conn_) == CONNECTION_OK ? ErrorOf(nullptr, op) : lost();
  }
  DEDUP_RETURN_IF_ERROR(FlushSent(start, op));
  Result last;
  for (;;) {
    Result r;
    DEDUP_RETURN_IF_ERROR(NextResult(start, op, &r));
    if (!r) break;
    const ExecStatusType st = PQresultStatus(r.get());
    // As PQexec: the first error is the answer (the server skips what follows it).
    if (!last || PQresultStatus(last.get()) != PGRES_FATAL_ERROR) last = std::move(r);
    if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT || st == PGRES_COPY_BOTH) {
      // A COPY nobody feeds or reads: the connection is of no further use, and
      // its transaction never commits. A mistake in the SQL, never a transient
      // failure: retrying it would do the same.
      abandoned_ = true;
      return Status::FailedPrecondition(
          where_ + ": " + std::string(op) +
          ": the statement started a COPY (FROM STDIN, TO STDOUT), which the store's calls do "
          "not carry: write the rows with INSERT (or read them with SELECT); the connection "
          "is closed, its transaction rolled back");
    }
  }
  if (!last) return lost();
  return last;
}

StatusOr<std::vector<Result>> Conn::RunPipeline(size_t n,
                                                const std::function<int(PGconn*, size_t)>& send,
                                                std::string_view op) {
  const int64_t start = SteadyMillis();
  // Non-blocking, as Run (libpq's pipeline mode needs it too: blocking, the
  // client can wait to send while the server waits to send its answers).
  DEDUP_RETURN_IF_ERROR(BeginExchange(start, op));
  struct End {
    Conn* c;
    ~End() { c->EndExchange(); }
  } end{this};
  // Anything short of every answer leaves the protocol state unknown: the
  // connection is closed (Unavailable), its transaction rolled back by the server.
  auto lost = [&] { return Lost(op); };
  if (PQenterPipelineMode(conn_) == 0) return lost();
  for (size_t i = 0; i < n; ++i) {
    if (send(conn_, i) == 0) return lost();
  }
  if (PQpipelineSync(conn_) == 0) return lost();
  DEDUP_RETURN_IF_ERROR(FlushSent(start, op));
  std::vector<Result> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Result r;
    DEDUP_RETURN_IF_ERROR(NextResult(start, op, &r));
    if (!r) return lost();
    const ExecStatusType st = PQresultStatus(r.get());
    if (st == PGRES_COPY_IN || st == PGRES_COPY_OUT || st == PGRES_COPY_BOTH ||
        st == PGRES_PIPELINE_SYNC) {
      return lost();  // not what the statements sent can answer
    }
    // Each statement's results end with a null (one result each here).
    for (Result extra;;) {
      DEDUP_RETURN_IF_ERROR(NextResult(start, op, &extra));
      if (!extra) break;
      if (PQresultStatus(extra.get()) == PGRES_PIPELINE_SYNC) return lost();
    }
    out.push_back(std::move(r));
  }
  Result sync;
  DEDUP_RETURN_IF_ERROR(NextResult(start, op, &sync));
  if (!sync || PQresultStatus(sync.get()) != PGRES_PIPELINE_SYNC) return lost();
  if (PQexitPipelineMode(conn_) == 0) return lost();
  return out;
}

namespace {

// SQLSTATE classes whose messages name objects and states, never a row's values:
// the store's own statements show these as the server words them.
bool ValueFreeClass(std::string_view state) {
  static constexpr std::string_view kClasses[] = {
      "08", "0A", "25", "28", "2D", "3D", "3F", "40", "42", "53", "54", "55", "57", "58", "XX"};
  for (std::string_view c : kClasses) {
    if (state.substr(0, 2) == c) return true;
  }
  return false;
}

// What a class of SQLSTATE is, for the ones whose messages are not shown.
const char* ClassName(std::string_view state) {
  const std::string_view c = state.substr(0, 2);
  if (c == "22") return "data exception";
  if (c == "23") return "integrity constraint violation";
  if (c == "P0") return "an error raised by PL/pgSQL (a trigger or function on the table?)";
  if (c == "09") return "triggered action exception";
  if (c == "27") return "triggered data change violation";
  if (c == "38" || c == "39") return "external routine exception";
  if (c == "2F") return "SQL routine exception";
  if (c == "44") return "WITH CHECK OPTION violation";
  return "error";
}

}  // namespace

Status Conn::ErrorOf(const PGresult* r, std::string_view op) {
  auto field = [&](int f) -> std::string_view {
    const char* v = r != nullptr ? PQresultErrorField(r, f) : nullptr;
    return v != nullptr ? v : "";
  };
  const std::string_view state = field(PG_DIAG_SQLSTATE), primary = field(PG_DIAG_MESSAGE_PRIMARY);
  if (primary.empty()) return UserErrorOf(r, op);  // no result: the connection's message
  // Raised inside a function or trigger (a context, or a query of its own): its
  // words are whatever that code made of the row, under any SQLSTATE it chose
  // (RAISE ... USING ERRCODE = 'XX000'), so its class says nothing about them.
  const bool inside = !field(PG_DIAG_CONTEXT).empty() || !field(PG_DIAG_INTERNAL_QUERY).empty();
  if (ValueFreeClass(state) && !inside) {
    std::string msg = "ERROR:  " + internal::Printable(primary);
    if (const std::string_view d = field(PG_DIAG_MESSAGE_DETAIL); !d.empty()) {
      msg += "\nDETAIL:  " + internal::Printable(d);
    }
    if (const std::string_view h = field(PG_DIAG_MESSAGE_HINT); !h.empty()) {
      msg += "\nHINT:  " + internal::Printable(h);
    }
    return ErrorWith(r, op, msg);
  }
  // Any other class may quote what the statement carried: an integrity violation
  // (a NOT NULL, CHECK or foreign key added to the store's table by hand) shows
  // the failing row in its DETAIL, a data exception the value in its message
  // ("invalid input syntax for type bigint: \"...\""), a trigger's RAISE anything:
  // the key, the owner's token, the handler's result. Named by its class, its
  // constraint and column instead; the primary message only for class 23, whose
  // words name the relation and constraint.
  std::string msg = "ERROR:  ";
  if (state.starts_with("23") && !inside) {
    msg += internal::Printable(primary);
  } else if (inside && !state.starts_with("P0")) {
    msg += "an error raised inside a function or trigger";
  } else {
    msg += ClassName(state);
  }
  for (const auto& [f, what] : {std::pair{PG_DIAG_CONSTRAINT_NAME, "constraint"},
                                std::pair{PG_DIAG_COLUMN_NAME, "column"},
                                std::pair{PG_DIAG_DATATYPE_NAME, "type"},
                                std::pair{PG_DIAG_TABLE_NAME, "table"}}) {
    const std::string v = internal::Printable(field(f));
    if (!v.empty() && msg.find(v) == std::string::npos) {
      msg += std::string(" (") + what + " " + v + ")";
    }
  }
  return ErrorWith(r, op, msg + "; the server's message is not shown: it may quote the row's values");
}

Status Conn::UserErrorOf(const PGresult* r, std::string_view op) {
  return ErrorWith(r, op, Trim(r != nullptr ? PQresultErrorMessage(r) : ""));
}

Status Conn::ScriptErrorOf(const PGresult* r, std::string_view op) {
  auto field = [&](int f) {
    const char* v = r != nullptr ? PQresultErrorField(r, f) : nullptr;
    return std::string(v != nullptr ? v : "");
  };
  std::string msg = field(PG_DIAG_MESSAGE_PRIMARY);
  if (msg.empty()) return ErrorOf(r, op);
  msg = "ERROR:  " + msg;
  // The position counts characters (UTF-8 here) from 1 in the text run.
  const std::string query = field(PG_DIAG_INTERNAL_QUERY);
  const long pos = std::strtol(field(PG_DIAG_INTERNAL_POSITION).c_str(), nullptr, 10);
  if (pos > 0 && !query.empty()) {
    long line = 1, column = 1, chars = 0;
    for (size_t i = 0; i < query.size() && chars < pos - 1; ++i) {
      if ((static_cast<unsigned char>(query[i]) & 0xC0) == 0x80) continue;  // continuation
      ++chars;
      if (query[i] == '\n') {
        ++line;
        column = 1;
      } else {
        ++column;
      }
    }
    msg += " (at line " + std::to_string(line) + ", column " + std::to_string(column) + ")";
  }
  if (const std::string d = field(PG_DIAG_MESSAGE_DETAIL); !d.empty()) msg += "\nDETAIL:  " + d;
  if (const std::string h = field(PG_DIAG_MESSAGE_HINT); !h.empty()) msg += "\nHINT:  " + h;
  return ErrorWith(r, op, msg);
}

Status Conn::ErrorWith(const PGresult* r, std::string_view op, std::string msg) {
  if (msg.empty()) msg = Trim(PQerrorMessage(conn_));
  const char* state = r != nullptr ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
  const std::string code = state != nullptr ? state : "";
  last_sqlstate_ = code;
  const char* primary = r != nullptr ? PQresultErrorField(r, PG_DIAG_MESSAGE_PRIMARY) : nullptr;
  last_primary_ = primary != nullptr ? primary : "";
  // Prepared statements are not transactional: a handler's DEALLOCATE dropped
  // the store's own on this connection, and every later call on it would fail.
  // Closed when handed back (broken()); the pool opens a fresh one.
  if (code == "26000") {
    poisoned_ = true;
    msg += "; this connection lost the store's prepared statements (a handler's DEALLOCATE?) "
           "and is replaced";
  }
  const std::string text = where_ + ": " + std::string(op) + ": " + msg +
                           (code.empty() ? "" : " (SQLSTATE " + code + ")");
  if (broken() || code.rfind("08", 0) == 0 || code == "57P01" || code == "57P02" ||
      code == "57P03" || code.rfind("53", 0) == 0 || code.rfind("40", 0) == 0) {
    return Status::Unavailable(text);
  }
  if (code == "57014") return Status::DeadlineExceeded(text);
  // insufficient_privilege: the role may not read or write the table (a grant is
  // missing). No retry changes that: named, not INTERNAL.
  if (code == "42501") {
    return Status::PermissionDenied(text + "; the role of the URI needs SELECT, INSERT, UPDATE "
                                           "and DELETE on the store's tables (docs/POSTGRES.md)");
  }
  if (code == "25006") {  // read_only_sql_transaction: a standby, or read-only by default
    return Status::FailedPrecondition(
        text + "; the server is read-only here (a hot standby, or default_transaction_read_only)");
  }
  if (code == "42P01" || code == "42703" || code == "42883") {
    return Status::FailedPrecondition(text + "; was the table dropped or changed by hand?");
  }
  if (code.rfind("22", 0) == 0 || code.rfind("23", 0) == 0) return Status::InvalidArgument(text);
  return Status::Internal(text);
}

StatusOr<Result> Conn::Exec(std::string_view sql, std::string_view op) {
  const std::string text(sql);
  auto r = Run([&](PGconn* c) { return PQsendQuery(c, text.c_str()); }, op);
  if (!r.ok()) return r.status();
  const ExecStatusType st = PQresultStatus(r->get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK && st != PGRES_EMPTY_QUERY) {
    return ErrorOf(r->get(), op);
  }
  return r;
}

StatusOr<Result> Conn::ExecParams(std::string_view sql, Params& p, int result_format,
                                  std::string_view op) {
  const std::string text(sql);
  auto r = Run(
      [&](PGconn* c) {
        return PQsendQueryParams(c, text.c_str(), p.size(), nullptr, p.values(), p.lengths(),
                                 p.formats(), result_format);
      },
      op);
  if (!r.ok()) return r.status();
  const ExecStatusType st = PQresultStatus(r->get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return ErrorOf(r->get(), op);
  return r;
}

StatusOr<Result> Conn::ExecPrepared(const char* name, Params& p, std::string_view op) {
  auto r = Run(
      [&](PGconn* c) {
        return PQsendQueryPrepared(c, name, p.size(), p.values(), p.lengths(), p.formats(), 1);
      },
      op);
  if (!r.ok()) return r.status();
  const ExecStatusType st = PQresultStatus(r->get());
  if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) return ErrorOf(r->get(), op);
  return r;
}

Status Conn::Prepare(const char* name, const std::string& sql, const std::vector<unsigned>& types) {
  std::vector<Oid> oids(types.begin(), types.end());
  const std::string op = std::string("prepare ") + name;
  auto r = Run(
      [&](PGconn* c) {
        return PQsendPrepare(c, name, sql.c_str(), static_cast<int>(oids.size()), oids.data());
      },
      op);
  if (!r.ok()) return r.status();
  if (PQresultStatus(r->get()) != PGRES_COMMAND_OK) return ErrorOf(r->get(), op);
  return Status::Ok();
}

Status Pool::CheckTransactions(int concurrent) const {
  const int64_t need = std::max<int64_t>(2, int64_t{concurrent} + 1);
  if (static_cast<int64_t>(size_) >= need) return Status::Ok();
  if (need == 2) {
    return Status::FailedPrecondition(
        "postgres: pool=1 is too small for transactions: a transaction holds its connection "
        "while the handler runs, and pool=1 would leave none for the heartbeat that keeps its "
        "lease; use pool=2 or more");
  }
  return Status::FailedPrecondition(
      "postgres: pool=" + std::to_string(size_) + " is too small for " + std::to_string(concurrent) +
      " transactions at once: each holds a connection while its handler runs, and one is kept for "
      "the heartbeats; use pool=" + std::to_string(need) +
      " or more (else handlers wait for a connection until the timeout, each wait counted as an "
      "attempt)");
}

StatusOr<Pool::Handle> Pool::Get(bool long_hold) {
  if (long_hold) {
    DEDUP_RETURN_IF_ERROR(CheckTransactions());
  }
  int64_t start = -1;  // when this call began to wait for a free connection
  for (;;) {
    std::unique_ptr<Conn> idle;
    {
      std::unique_lock lock(mu_);
      const auto available = [&] {
        return (!long_hold || long_held_ < size_ - 1) && (!idle_.empty() || live_ < size_);
      };
      while (!available()) {
        const int64_t now = SteadyMillis();
        if (start < 0) start = now;
        const int64_t give_up = stop_ != nullptr ? stop_->GiveUpAt(start) : INT64_MAX;
        const int64_t timed_out = start + wait_.count();
        if (now >= give_up && give_up <= timed_out) {
          return Status::Aborted(where_ + ": waiting for a free connection of the pool: given "
                                 "up: the caller is stopping");
        }
        if (now >= timed_out) {
          return Status::DeadlineExceeded(
              where_ + ": no free connection in the pool within the timeout (" +
              std::to_string(wait_.count()) + "ms): " +
              (long_hold && long_held_ >= size_ - 1
                   ? "transactions hold " + std::to_string(long_held_) + ", the most they may (pool - 1)"
                   : "all " + std::to_string(size_) + " are busy") +
              "; a larger pool= lets more calls run at once");
        }
        cv_.wait_for(lock, std::chrono::milliseconds(std::min(give_up, timed_out) - now));
      }
      if (long_hold) ++long_held_;
      if (idle_.empty()) {
        ++live_;
        break;  // opened below
      }
      idle = std::move(idle_.back());
      idle_.pop_back();
    }
    // Checked outside the lock (a system call): nothing was sent on it yet.
    if (!idle->ClosedWhileIdle()) return Handle(this, std::move(idle), long_hold);
    idle.reset();  // closed: the server is gone from it already
    std::lock_guard lock(mu_);
    --live_;
    if (long_hold) --long_held_;
    cv_.notify_all();
  }
  auto c = open_();
  std::lock_guard lock(mu_);
  if (!c.ok()) {
    --live_;
    if (long_hold) --long_held_;
    cv_.notify_all();
    return c.status();
  }
  ++opened_;
  return Handle(this, std::move(c).value(), long_hold);
}

void Pool::Put(std::unique_ptr<Conn> c, bool long_hold) {
  std::lock_guard lock(mu_);
  if (long_hold) --long_held_;
  if (c == nullptr) {
    --live_;
  } else if (c->broken() || PQtransactionStatus(c->raw()) != PQTRANS_IDLE) {
    --live_;  // closed below, outside nothing: PQfinish does not block
    c.reset();
  } else {
    idle_.push_back(std::move(c));
  }
  // notify_all: a waiter for a transaction and a waiter for a statement wait for
  // different things, and the one woken must be able to go on.
  cv_.notify_all();
}

void Pool::WakeWaiters() {
  std::lock_guard lock(mu_);
  cv_.notify_all();
}

uint64_t Pool::opened() const {
  std::lock_guard lock(mu_);
  return opened_;
}

bool ValidIdentifier(std::string_view s) {
  if (s.empty() || s.size() > 63) return false;
  // Lower case only: quoted (Quote), "Billing" is not the billing that an
  // unquoted name in anyone's SQL means, and two spellings made two stores.
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || c == '_'; };
  if (!alpha(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [&](char c) { return alpha(c) || (c >= '0' && c <= '9'); });
}

std::string IdentifierError(std::string_view what, std::string_view ident, size_t max) {
  std::string e = "postgres: " + std::string(what) + " '" + internal::PrintableCut(ident, 64) +
                  "' is not a plain identifier ([a-z_][a-z0-9_]*, at most " + std::to_string(max) +
                  " bytes)";
  if (std::any_of(ident.begin(), ident.end(), [](char c) { return c >= 'A' && c <= 'Z'; })) {
    e += ": write it in lower case, as PostgreSQL folds an unquoted name (quoted, '" +
         internal::PrintableCut(ident, 64) + "' would be a second " + std::string(what) +
         " beside the one your SQL means)";
  }
  return e;
}

std::string Quote(std::string_view ident) { return "\"" + std::string(ident) + "\""; }

}  // namespace dedup::pg
