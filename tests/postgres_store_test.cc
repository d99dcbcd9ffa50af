// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The PostgreSQL store beyond the conformance suite: opening and its errors, the
// transactional API (writes and completion commit together or not at all), the
// fence helper, expiry in bounded batches, the pool under many threads, and a
// server restart while a Buffer works. Starts its own PostgreSQL 15 on 127.0.0.1
// (port 5441, docs/PORTS.md) through scripts/lib/postgres.sh, as a child process
// stopped by PID; skips when no PostgreSQL server binaries are installed. One
// server for the whole binary (ctest runs it as one test): each case works in a
// database of its own, created in its SetUp; the restart case restarts that
// server, which is back up when it ends.

#include <gtest/gtest.h>
#include <libpq-fe.h>
#include <signal.h>
#include <sys/wait.h>

#include <atomic>
#include <barrier>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/printable.h"
#include "dedup/buffer.h"
#include "dedup/postgres_store.h"
#include "dedup/store.h"
#include "test_process.h"

namespace dedup {
namespace {

using namespace std::chrono_literals;
using testing::FakePeer;
using testing::PortFree;
using testing::Spawn;

constexpr int kPort = 5441;
constexpr const char* kPassword = "dedup-test-pw";

// The database of the running case: every case has its own (one server for the
// whole binary), so that no case sees another's tables, rows, functions or schemas.
std::string g_db = "dedup";
const std::string& Db() { return g_db; }

std::string Uri(const std::string& extra = "") {
  return "postgres://dedup:" + std::string(kPassword) + "@127.0.0.1:" + std::to_string(kPort) +
         "/" + Db() + "?" + (extra.find("expire_interval") == std::string::npos ? "expire_interval=0" : "") +
         extra;
}

// A PostgreSQL server, child of this process (scripts/lib/postgres.sh run).
class PgServer {
 public:
  bool Init() {
    FILE* f = popen((std::string("bash ") + DEDUP_PG_SCRIPT + " init").c_str(), "r");
    if (f == nullptr) return false;
    char buf[512] = {0};
    if (fgets(buf, sizeof buf, f) != nullptr) dir_ = buf;
    if (pclose(f) != 0 || dir_.empty()) return false;
    while (!dir_.empty() && dir_.back() == '\n') dir_.pop_back();
    return Start();
  }
  bool Start() {
    pid_ = Spawn({"bash", DEDUP_PG_SCRIPT, "run", std::to_string(kPort), dir_});
    if (pid_ <= 0) return false;
    const std::string conninfo = "host=127.0.0.1 port=" + std::to_string(kPort) + " dbname=postgres";
    for (auto until = std::chrono::steady_clock::now() + 30s; std::chrono::steady_clock::now() < until;
         std::this_thread::sleep_for(50ms)) {
      if (PQping(conninfo.c_str()) == PQPING_OK) return true;
    }
    return false;
  }
  // The server's directory, where its Unix socket is too (scripts/lib/postgres.sh).
  const std::string& dir() const { return dir_; }
  void Stop() {  // fast shutdown (SIGINT), waited for by PID
    if (pid_ <= 0) return;
    kill(pid_, SIGINT);
    int st;
    waitpid(pid_, &st, 0);
    pid_ = -1;
  }
  // Sends `sig` to the server and to every process it started (backends
  // included), by PID from /proc: SIGSTOP freezes the whole server, SIGCONT thaws it.
  void SignalAll(int sig) const {
    if (pid_ <= 0) return;
    kill(pid_, sig);  // first: a frozen postmaster starts no new backend
    for (const auto& e : std::filesystem::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.empty() || !std::isdigit(static_cast<unsigned char>(name[0]))) continue;
      std::ifstream f(e.path() / "stat");
      std::string stat;
      std::getline(f, stat);
      const size_t close = stat.rfind(')');
      if (close == std::string::npos || close + 2 > stat.size()) continue;
      std::istringstream rest(stat.substr(close + 2));
      char state = 0;
      long ppid = 0;
      if (rest >> state >> ppid && ppid == pid_) kill(static_cast<pid_t>(std::stol(name)), sig);
    }
  }
  ~PgServer() {
    Stop();
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }
  // Runs SQL as the superuser; true when it succeeded.
  static bool Sql(const std::string& db, const std::string& sql, std::string* first = nullptr) {
    const std::string conninfo = "host=127.0.0.1 port=" + std::to_string(kPort) + " dbname=" + db +
                                 " user=dedup password=" + kPassword;
    PGconn* c = PQconnectdb(conninfo.c_str());
    bool ok = PQstatus(c) == CONNECTION_OK;
    if (ok) {
      PGresult* r = PQexec(c, sql.c_str());
      const ExecStatusType st = PQresultStatus(r);
      ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
      if (!ok) std::fprintf(stderr, "sql: %s", PQresultErrorMessage(r));
      if (ok && first != nullptr && PQntuples(r) > 0) *first = PQgetvalue(r, 0, 0);
      PQclear(r);
    }
    PQfinish(c);
    return ok;
  }
  static std::string Value(const std::string& sql) {
    std::string v;
    EXPECT_TRUE(Sql(Db(), sql, &v)) << sql;
    return v;
  }

 private:
  std::string dir_;
  pid_t pid_ = -1;
};

PgServer* g_server = nullptr;

// One server for every case of the binary (initdb and a start cost about a
// second each, more on a busy machine; ctest runs the binary as one test).
class PgEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!std::filesystem::exists(DEDUP_PG_SCRIPT) || !PortFree(kPort)) return;
    g_server = new PgServer();
    if (!g_server->Init()) {
      delete g_server;
      g_server = nullptr;
    }
  }
  void TearDown() override {
    delete g_server;
    g_server = nullptr;
  }
};
::testing::Environment* const g_environment = ::testing::AddGlobalTestEnvironment(new PgEnvironment);

class PostgresStoreTest : public ::testing::Test {
 protected:
  // A fresh database for the case, named after it.
  void SetUp() override {
    if (g_server == nullptr) GTEST_SKIP() << "no PostgreSQL server could be started on " << kPort;
    std::string name = "t_";
    for (const char ch : std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())) {
      name += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    g_db = name.substr(0, 63);
    ASSERT_TRUE(PgServer::Sql("postgres", "CREATE DATABASE " + g_db));
  }

  std::unique_ptr<PostgresStore> Open(const std::string& extra = "") {
    auto s = OpenPostgresStore(Uri(extra));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(s).value() : nullptr;
  }

  ClaimResult MustClaim(Store& s, std::string_view key, Millis lease = 120s) {
    ClaimRequest r;
    r.key = key;
    r.lease = lease;
    r.retention = 600s;
    auto c = s.Claim(r);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : ClaimResult{};
  }
};

// ---- opening and its errors ------------------------------------------------------

TEST_F(PostgresStoreTest, ConcurrentFirstOpensMigrateOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> ok{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      auto s = OpenPostgresStore(Uri("&table=race"));
      if (s.ok()) ++ok;
      else ADD_FAILURE() << s.status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ok.load(), 4);
  EXPECT_EQ(PgServer::Value("SELECT obj_description('public.race'::regclass, 'pg_class')"),
            "dedup store records, format 1");
  EXPECT_EQ(PgServer::Value("SELECT count(*) FROM pg_indexes WHERE tablename = 'race' AND "
                            "indexdef LIKE '%retention_deadline%'"),
            "1");
}

TEST_F(PostgresStoreTest, ErrorsNameTheProblemAndNeverThePassword) {
  const std::string secret = "s3cret-Pa55";
  auto wrong = OpenStore("postgres://dedup:" + secret + "@127.0.0.1:" + std::to_string(kPort) + "/dedup");
  EXPECT_EQ(wrong.status().code(), StatusCode::kUnauthenticated) << wrong.status();
  EXPECT_NE(wrong.status().message().find("password"), std::string::npos);
  EXPECT_EQ(wrong.status().ToString().find(secret), std::string::npos);

  auto nodb = OpenStore("postgres://dedup:" + std::string(kPassword) + "@127.0.0.1:" +
                        std::to_string(kPort) + "/no_such_db");
  EXPECT_EQ(nodb.status().code(), StatusCode::kNotFound) << nodb.status();
  EXPECT_NE(nodb.status().message().find("no_such_db"), std::string::npos);
  EXPECT_EQ(nodb.status().ToString().find(kPassword), std::string::npos);
  // A name with a newline or an ESC is shown escaped, on one line: it forged a
  // line of the log (the database's, in libpq's words too), or drew on the
  // terminal (the prefix, in the store's description: serve's log, /v1/info).
  auto forged = OpenStore("postgres://dedup:" + std::string(kPassword) + "@127.0.0.1:" +
                          std::to_string(kPort) + "/no%0aFAKE%20LINE");
  EXPECT_EQ(forged.status().code(), StatusCode::kNotFound) << forged.status();
  EXPECT_EQ(forged.status().message().find('\n'), std::string::npos) << forged.status();
  EXPECT_NE(forged.status().message().find("no\\x0aFAKE LINE"), std::string::npos)
      << forged.status();
  auto painted = Open("&prefix=%1b%5b31mX%0aY");
  ASSERT_NE(painted, nullptr);
  const std::string d = painted->Describe();
  EXPECT_EQ(d.find('\x1b'), std::string::npos) << d;
  EXPECT_EQ(d.find('\n'), std::string::npos) << d;
  EXPECT_NE(d.find("prefix=\\x1b[31mX\\x0aY"), std::string::npos) << d;

  int closed = 5449;
  while (!PortFree(closed)) --closed;
  auto down = OpenStore("postgres://dedup:" + secret + "@127.0.0.1:" + std::to_string(closed) + "/dedup");
  EXPECT_EQ(down.status().code(), StatusCode::kUnavailable) << down.status();
  EXPECT_EQ(down.status().ToString().find(secret), std::string::npos);

  FakePeer http("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
  auto other = OpenStore("postgres://dedup:" + secret + "@127.0.0.1:" + std::to_string(http.port()) +
                         "/dedup?sslmode=disable");
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition) << other.status();
  EXPECT_NE(other.status().message().find("PostgreSQL"), std::string::npos) << other.status();

  ASSERT_TRUE(PgServer::Sql(Db(), "CREATE TABLE future (key bytea primary key); "
                                     "COMMENT ON TABLE future IS 'dedup store records, format 99'; "
                                     "CREATE TABLE someone_elses (id int)"));
  auto future = OpenStore(Uri("&table=future"));
  EXPECT_EQ(future.status().code(), StatusCode::kFailedPrecondition) << future.status();
  EXPECT_NE(future.status().message().find("format 99"), std::string::npos) << future.status();
  auto foreign = OpenStore(Uri("&table=someone_elses"));
  EXPECT_EQ(foreign.status().code(), StatusCode::kFailedPrecondition) << foreign.status();
  EXPECT_NE(foreign.status().message().find("not a dedup table"), std::string::npos);

  // A table that carries dedup's comment but not its shape: no unique key (every
  // claim would fail, or with a plain index, two rows per key), or other columns.
  ASSERT_TRUE(PgServer::Sql(
      Db(),
      "CREATE TABLE nokey (key bytea, state smallint NOT NULL, token bigint NOT NULL, "
      "fence bigint NOT NULL, attempt integer NOT NULL, lease_deadline bigint NOT NULL, "
      "retention_deadline bigint NOT NULL, fingerprint bytea NOT NULL, status smallint NOT NULL, "
      "result bytea NOT NULL); COMMENT ON TABLE nokey IS 'dedup store records, format 1'; "
      "CREATE TABLE textkey (key text PRIMARY KEY, state smallint NOT NULL, token bigint NOT NULL, "
      "fence bigint NOT NULL, attempt integer NOT NULL, lease_deadline bigint NOT NULL, "
      "retention_deadline bigint NOT NULL, fingerprint bytea NOT NULL, status smallint NOT NULL, "
      "result bytea NOT NULL); COMMENT ON TABLE textkey IS 'dedup store records, format 1'"));
  for (const std::string t : {"nokey", "textkey"}) {
    auto shaped = OpenStore(Uri("&table=" + t));
    EXPECT_EQ(shaped.status().code(), StatusCode::kFailedPrecondition)
        << t << ": " << (shaped.ok() ? "opened" : shaped.status().ToString());
    EXPECT_NE(shaped.status().message().find(t), std::string::npos) << shaped.status();
  }
  // A column added by hand that is NOT NULL without a default: the table opened,
  // then every claim failed with a not-null violation whose detail echoed the row
  // (key and token), retried for ever. Refused at open; with a default it opens.
  ASSERT_TRUE(OpenStore(Uri("&table=extra")).ok());
  ASSERT_TRUE(PgServer::Sql(Db(), "ALTER TABLE extra ADD COLUMN note text; "
                                  "ALTER TABLE extra ADD COLUMN tenant int NOT NULL DEFAULT 0"));
  EXPECT_TRUE(OpenStore(Uri("&table=extra")).ok());
  ASSERT_TRUE(PgServer::Sql(Db(), "ALTER TABLE extra ADD COLUMN must text; "
                                  "ALTER TABLE extra ALTER COLUMN must SET NOT NULL"));
  auto extra = OpenStore(Uri("&table=extra"));
  EXPECT_EQ(extra.status().code(), StatusCode::kFailedPrecondition) << extra.status();
  EXPECT_NE(extra.status().message().find("'must' that is NOT NULL without a default"),
            std::string::npos) << extra.status();

  // pg_temp, pg_catalog: PostgreSQL's own schemas, whose CREATE SCHEMA failed as
  // INTERNAL; timeout=5: 5 ms to this grammar, 5 s to a libpq user.
  for (const std::string bad : {"&table=x;drop", "&pool=0", "&schema=", "&timeout=-1", "&nope=1",
                                "&schema=pg_temp", "&schema=pg_catalog", "&timeout=5"}) {
    auto s = OpenStore(Uri(bad));
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad << ": " << s.status();
  }
  EXPECT_EQ(OpenStore("postgres://127.0.0.1:5441").status().code(), StatusCode::kInvalidArgument);
  // Quoted, "PUBLIC" and "DEDUP_RECORDS" were a second schema and table beside
  // the ones an unquoted name means (a key ran once in each); dedup_fences was
  // taken from the fence helper, whose CREATE TABLE IF NOT EXISTS then skipped.
  for (const std::string bad : {"&schema=PUBLIC", "&table=DEDUP_RECORDS", "&table=Inbox"}) {
    auto s = OpenStore(Uri(bad));
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad << ": " << s.status();
    EXPECT_NE(s.status().message().find("lower case"), std::string::npos) << s.status();
  }
  // The test server has no SSL: a setting to fix, not a state to wait out.
  auto ssl = OpenStore(Uri("&sslmode=require"));
  EXPECT_EQ(ssl.status().code(), StatusCode::kFailedPrecondition) << ssl.status();
  auto fences = OpenStore(Uri("&table=dedup_fences"));
  EXPECT_EQ(fences.status().code(), StatusCode::kInvalidArgument) << fences.status();
  EXPECT_EQ(FenceHelperSql("ops\"; DROP TABLE orders; --").status().code(),
            StatusCode::kInvalidArgument);
  ASSERT_TRUE(FenceHelperSql("ops").ok());

  auto good = OpenStore(Uri());
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ((*good)->Describe().find(kPassword), std::string::npos) << (*good)->Describe();
  EXPECT_NE((*good)->Describe().find("127.0.0.1:5441/" + Db()), std::string::npos);
}

// A table changed by hand to other column types than dedup made it with. A
// `result` of type text took the bytes through an assignment cast and handed
// back their escaped text (a completion's result not the one recorded); a fence
// of type integer was read as no fence, so every claim wrote its row and then
// answered DataLoss ("cannot be decoded"). Refused at open, naming the column.
// libpq's URI form for a Unix socket: the directory, percent-encoded, as the host.
// It was passed to libpq raw, which looked "%2Ftmp%2F..." up as a host name.
TEST_F(PostgresStoreTest, APercentEncodedHostIsTheUnixSocketDirectory) {
  std::string host;
  for (char c : g_server->dir()) host += c == '/' ? std::string("%2F") : std::string(1, c);
  const std::string uri = "postgres://dedup:" + std::string(kPassword) + "@" + host + ":" +
                          std::to_string(kPort) + "/" + Db() + "?expire_interval=0";
  auto s = OpenStore(uri);
  ASSERT_TRUE(s.ok()) << s.status();
  ClaimRequest req;
  req.key = "socket-1";
  req.lease = Millis(60000);
  auto c = (*s)->Claim(req);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->outcome, ClaimOutcome::kAcquired);
  // Over the socket, not TCP: the server sees a client without an address (this
  // test's own query comes over TCP).
  EXPECT_NE(PgServer::Value("SELECT count(*) FROM pg_stat_activity WHERE datname = '" + Db() +
                            "' AND client_addr IS NULL AND backend_type = 'client backend'"),
            "0");

  auto bad = OpenStore("postgres://dedup@%2Ftmp%ZZ:" + std::to_string(kPort) + "/" + Db());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument) << bad.status();
  EXPECT_NE(bad.status().message().find("percent-escape"), std::string::npos) << bad.status();
  auto nul = OpenStore("postgres://dedup@%2Ftmp%00x:" + std::to_string(kPort) + "/" + Db());
  EXPECT_EQ(nul.status().code(), StatusCode::kInvalidArgument) << nul.status();
}

TEST_F(PostgresStoreTest, ATableWhoseColumnsHaveOtherTypesIsRefusedAtOpen) {
  struct Case {
    std::string column, type, alter;
  };
  const std::vector<Case> cases = {
      {"result", "text", "ALTER COLUMN result TYPE text USING encode(result, 'escape')"},
      {"fence", "integer", "ALTER COLUMN fence TYPE integer USING fence::integer"},
  };
  for (const Case& k : cases) {
    const std::string table = "typed_" + k.column;
    ASSERT_NE(Open("&table=" + table), nullptr);
    ASSERT_TRUE(PgServer::Sql(Db(), "ALTER TABLE " + table + " " + k.alter));
    auto s = OpenStore(Uri("&table=" + table));
    EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition)
        << k.column << ": " << (s.ok() ? "opened" : s.status().ToString());
    EXPECT_NE(s.status().message().find("column " + k.column + " is " + k.type), std::string::npos)
        << s.status();
    if (!s.ok()) continue;
    // Opened: what a claim, a completion and a second claim then do.
    auto first = (*s)->Claim(ClaimRequest{.key = "k"});
    std::string seen = first.ok() ? "claim outcome " + std::to_string(static_cast<int>(first->outcome))
                                  : "claim: " + first.status().ToString();
    if (first.ok() && first->acquired()) {
      (void)(*s)->Complete("k", first->token, 600s, CompletionStatus::kOk, std::string("r\0\x01", 3));
      auto again = (*s)->Claim(ClaimRequest{.key = "k"});
      seen += again.ok() ? "; then result '" + internal::Printable(again->result) + "'"
                         : "; then " + again.status().ToString();
    }
    ADD_FAILURE() << k.column << " " << k.type << ": " << seen << "; row: "
                  << PgServer::Value("SELECT state || ' ' || fence FROM " + table + " WHERE key = 'k'");
  }
}

// The column check reads the table the store names, schema included: a table of
// the same name in another schema (changed by hand) changes nothing here, and a
// view of the right columns with dedup's comment, where the table should be, is
// refused (a view has no unique key), never written through.
TEST_F(PostgresStoreTest, TheColumnCheckReadsTheNamedTableNotAViewOrAnotherSchemas) {
  ASSERT_TRUE(PgServer::Sql(Db(), "CREATE SCHEMA other"));
  ASSERT_NE(Open("&schema=other&table=same"), nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "ALTER TABLE other.same ALTER COLUMN result TYPE text "
                                  "USING encode(result, 'escape')"));
  auto mine = Open("&table=same");  // public.same: made, and checked, on its own
  ASSERT_NE(mine, nullptr);
  EXPECT_TRUE(MustClaim(*mine, "k").acquired());
  auto other = OpenStore(Uri("&schema=other&table=same"));
  EXPECT_EQ(other.status().code(), StatusCode::kFailedPrecondition) << other.status();

  ASSERT_TRUE(PgServer::Sql(Db(), "CREATE SCHEMA v"));
  ASSERT_TRUE(PgServer::Sql(Db(), "CREATE VIEW v.same AS SELECT * FROM public.same"));
  ASSERT_TRUE(PgServer::Sql(Db(), "COMMENT ON VIEW v.same IS 'dedup store records, format 1'"));
  auto view = OpenStore(Uri("&schema=v&table=same"));
  EXPECT_EQ(view.status().code(), StatusCode::kFailedPrecondition)
      << (view.ok() ? "opened over a view" : view.status().ToString());
}

// The usual least-privilege setup: an application role that may create tables
// in its schema but not schemas in the database (only the database's owner and
// superusers may; PUBLIC has CONNECT and TEMPORARY). A second such role makes a
// second table in the same schema, where the first role owns the fence helper.
TEST_F(PostgresStoreTest, ARoleWithCreateOnItsSchemaOnlyCanOpenTheStore) {
  ASSERT_TRUE(PgServer::Sql(Db(),
                            "CREATE ROLE app1 LOGIN PASSWORD 'app1pw'; "
                            "CREATE ROLE app2 LOGIN PASSWORD 'app2pw'; CREATE SCHEMA apps; "
                            "GRANT USAGE, CREATE ON SCHEMA apps TO app1, app2"));
  for (const std::string role : {"app1", "app2"}) {
    auto s = OpenStore("postgres://" + role + ":" + role + "pw@127.0.0.1:" + std::to_string(kPort) +
                       "/" + Db() + "?schema=apps&table=" + role + "_records&expire_interval=0");
    ASSERT_TRUE(s.ok()) << role << ": " << s.status();
    ClaimResult c = MustClaim(**s, "k");
    EXPECT_TRUE(c.acquired()) << role;
  }
  // A role without CREATE there opens a table another role made, even with the
  // session reset function missing (only RunInTransaction needs it).
  ASSERT_TRUE(PgServer::Sql(Db(), "CREATE ROLE app3 LOGIN PASSWORD 'app3pw'; "
                                  "GRANT USAGE ON SCHEMA apps TO app3; "
                                  "GRANT SELECT, INSERT, UPDATE, DELETE ON apps.app1_records TO app3; "
                                  "DROP FUNCTION apps.dedup_forget_handler_statements()"));
  auto s = OpenStore("postgres://app3:app3pw@127.0.0.1:" + std::to_string(kPort) + "/" + Db() +
                     "?schema=apps&table=app1_records&expire_interval=0");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_TRUE(MustClaim(**s, "k3").acquired());
  // A role that may only read the table: its claim was INTERNAL (exit 75 from
  // dedup exec, for ever); a missing grant is PERMISSION_DENIED, naming it.
  ASSERT_TRUE(PgServer::Sql(Db(), "CREATE ROLE app4 LOGIN PASSWORD 'app4pw'; "
                                  "GRANT USAGE ON SCHEMA apps TO app4; "
                                  "GRANT SELECT ON apps.app1_records TO app4"));
  auto reader = OpenStore("postgres://app4:app4pw@127.0.0.1:" + std::to_string(kPort) + "/" +
                          Db() + "?schema=apps&table=app1_records&expire_interval=0");
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto denied = (*reader)->Claim(ClaimRequest{.key = "k4"});
  ASSERT_FALSE(denied.ok());
  EXPECT_EQ(denied.status().code(), StatusCode::kPermissionDenied) << denied.status();
  EXPECT_NE(denied.status().message().find("42501"), std::string::npos) << denied.status();
}

// ---- the transactional API ----------------------------------------------------------

class PostgresTxTest : public PostgresStoreTest {
 protected:
  void SetUp() override {
    PostgresStoreTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_TRUE(PgServer::Sql(Db(), "DROP TABLE IF EXISTS orders; "
                                       "CREATE TABLE orders (msg text, fence bigint)"));
    store_ = Open("&table=tx");
    ASSERT_NE(store_, nullptr);
  }
  static std::string Orders(const std::string& msg) {
    return PgServer::Value("SELECT count(*) FROM orders WHERE msg = '" + msg + "'");
  }
  TransactionalHandler InsertThen(const std::string& msg, std::function<HandlerResult()> then) {
    return [msg, then](PostgresTransaction& tx) {
      auto r = tx.Exec("INSERT INTO orders (msg, fence) VALUES ($1, $2)",
                       {msg, std::to_string(tx.fence())});
      if (!r.ok()) return HandlerResult::Retry(r.status().ToString());
      return then();
    };
  }
  // A fresh database `db` with `setting` (ALTER DATABASE ... SET) and an orders
  // table, and a store on it.
  static StatusOr<std::unique_ptr<PostgresStore>> OpenDatabaseWith(const std::string& db,
                                                                   const std::string& setting) {
    EXPECT_TRUE(PgServer::Sql("postgres", "DROP DATABASE IF EXISTS " + db));
    EXPECT_TRUE(PgServer::Sql("postgres", "CREATE DATABASE " + db));
    EXPECT_TRUE(PgServer::Sql("postgres", "ALTER DATABASE " + db + " SET " + setting));
    EXPECT_TRUE(PgServer::Sql(db, "CREATE TABLE orders (msg text, fence bigint)"));
    return OpenPostgresStore("postgres://dedup:" + std::string(kPassword) + "@127.0.0.1:" +
                             std::to_string(kPort) + "/" + db + "?expire_interval=0");
  }
  std::unique_ptr<PostgresStore> store_;
};

TEST_F(PostgresTxTest, WritesAndCompletionCommitTogether) {
  ClaimResult c = MustClaim(*store_, "m1");
  ASSERT_TRUE(c.acquired());
  HandlerResult hr;
  auto w = store_->RunInTransaction("m1", c.token, c.fence, c.attempt, 600s,
                                    InsertThen("m1", [] { return HandlerResult::Done("receipt"); }), &hr);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(Orders("m1"), "1");
  ClaimResult d = MustClaim(*store_, "m1");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.result, "receipt");
}

TEST_F(PostgresTxTest, HandlerThrowsLeavesNothingAndReleases) {
  ClaimResult c = MustClaim(*store_, "m2");
  HandlerResult hr;
  auto w = store_->RunInTransaction(
      "m2", c.token, c.fence, c.attempt, 600s,
      InsertThen("m2", []() -> HandlerResult { throw std::runtime_error("card service down"); }), &hr);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(hr.kind, HandlerResult::Kind::kRetry);
  EXPECT_NE(hr.result.find("card service down"), std::string::npos);
  EXPECT_EQ(Orders("m2"), "0") << "the business write must be rolled back";
  auto rec = store_->Inspect("m2");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->state, RecordState::kReleased);
  ClaimResult again = MustClaim(*store_, "m2");
  EXPECT_TRUE(again.acquired());
  EXPECT_EQ(again.attempt, 2u);
}

TEST_F(PostgresTxTest, FailingStatementRollsBackEvenIfHandlerSaysDone) {
  ClaimResult c = MustClaim(*store_, "m3");
  HandlerResult hr;
  auto w = store_->RunInTransaction("m3", c.token, c.fence, c.attempt, 600s,
                                    [](PostgresTransaction& tx) {
                                      (void)tx.Exec("INSERT INTO orders (msg) VALUES ('m3')");
                                      (void)tx.Exec("INSERT INTO no_such_table VALUES (1)");
                                      return HandlerResult::Done();
                                    },
                                    &hr);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(hr.kind, HandlerResult::Kind::kRetry);
  EXPECT_NE(hr.result.find("no_such_table"), std::string::npos) << hr.result;
  EXPECT_EQ(Orders("m3"), "0");
  EXPECT_EQ((*store_->Inspect("m3"))->state, RecordState::kReleased);
}

TEST_F(PostgresTxTest, TakeoverMeanwhileRefusesTheCommit) {
  ClaimResult c = MustClaim(*store_, "m4", 250ms);
  ClaimResult taker;
  auto w = store_->RunInTransaction("m4", c.token, c.fence, c.attempt, 600s,
                                    InsertThen("m4", [&] {
                                      // The lease ran out while the work ran; another
                                      // worker took the key over.
                                      std::this_thread::sleep_for(700ms);
                                      taker = MustClaim(*store_, "m4");
                                      return HandlerResult::Done();
                                    }));
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(taker.acquired());
  EXPECT_EQ(*w, WriteResult::kLost);
  EXPECT_EQ(Orders("m4"), "0") << "a refused completion must take the business write with it";
  auto rec = store_->Inspect("m4");
  ASSERT_TRUE(rec.ok() && rec->has_value());
  EXPECT_EQ((*rec)->token, taker.token) << "the new owner's claim is untouched";
  EXPECT_EQ((*rec)->state, RecordState::kInProgress);
}

TEST_F(PostgresTxTest, FailRollsBackWritesAndCompletesAsFailed) {
  ClaimResult c = MustClaim(*store_, "m5");
  auto w = store_->RunInTransaction("m5", c.token, c.fence, c.attempt, 600s,
                                    InsertThen("m5", [] { return HandlerResult::Fail("bad card"); }));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(Orders("m5"), "0");
  ClaimResult d = MustClaim(*store_, "m5");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.status, CompletionStatus::kFailed);
  EXPECT_EQ(d.result, "bad card");
}

TEST_F(PostgresTxTest, ProcessOnceInTransactionAcksOnceAndNeverRunsTwice) {
  BufferOptions bo;
  bo.lease = 5s;
  Buffer buffer(store_.get(), bo);
  int runs = 0;
  auto handler = InsertThen("m6", [&] {
    ++runs;
    return HandlerResult::Done("ok");
  });
  Processed a = ProcessOnceInTransaction(buffer, *store_, "m6", "payload", handler);
  EXPECT_TRUE(a.status.ok()) << a.status;
  EXPECT_EQ(a.action, BrokerAction::kAck);
  EXPECT_TRUE(a.ran);
  Processed b = ProcessOnceInTransaction(buffer, *store_, "m6", "payload", handler);
  EXPECT_EQ(b.action, BrokerAction::kAck);
  EXPECT_FALSE(b.ran);
  EXPECT_EQ(b.result, "ok");
  EXPECT_EQ(runs, 1);
  EXPECT_EQ(Orders("m6"), "1");
}

// The handler's SQL (ExecScript, `dedup worker --sql-output`) cannot end the
// transaction: a COMMIT in it would commit the effect without the completion, so
// that a crash, a Retry or a lost lease afterwards leaves the effect behind and the
// next delivery runs it again. "BEGIN; ...; COMMIT;" is what a handler that prints
// a SQL script naturally writes.
TEST_F(PostgresTxTest, HandlerSqlCannotCommitOrEndTheTransaction) {
  const std::vector<std::string> scripts = {
      "INSERT INTO orders (msg) VALUES ('s1'); COMMIT;",
      "BEGIN; INSERT INTO orders (msg) VALUES ('s2'); COMMIT;",
      "ROLLBACK; INSERT INTO orders (msg) VALUES ('s3');",
      "INSERT INTO orders (msg) VALUES ('s4'); END; BEGIN;",
  };
  for (size_t i = 0; i < scripts.size(); ++i) {
    const std::string key = "s" + std::to_string(i + 1);
    ClaimResult c = MustClaim(*store_, key);
    ASSERT_TRUE(c.acquired());
    HandlerResult hr;
    auto w = store_->RunInTransaction(key, c.token, c.fence, c.attempt, 600s,
                                      [&](PostgresTransaction& tx) {
                                        Status s = tx.ExecScript(scripts[i]);
                                        // The handler then fails (or its worker dies):
                                        // nothing of it may stay.
                                        return HandlerResult::Retry(s.ToString());
                                      },
                                      &hr);
    EXPECT_TRUE(w.ok()) << scripts[i] << ": " << w.status();
    EXPECT_EQ(Orders(key), "0") << scripts[i] << ": the script committed its effect by itself";
    ClaimResult again = MustClaim(*store_, key);
    EXPECT_TRUE(again.acquired()) << scripts[i];
  }
}

// The handler's SQL runs as one EXECUTE inside the server; its error must say
// what went wrong and where in the text, as a plain statement's error did, not
// quote the whole text back (a script of 200 KB made a 200 KB reason, logged on
// every retry, with whatever literals it held).
TEST_F(PostgresTxTest, HandlerSqlErrorsNameTheProblemWithoutQuotingTheScript) {
  const std::string filler = "-- " + std::string(200'000, 'f') + "\n";
  struct Case {
    std::string script, want1, want2;
  };
  const std::vector<Case> cases = {
      {filler + "INSERT INTO orders (msg) VALUES ('e1');\nSELEC 1;", "syntax error", "line 3"},
      {filler + "SELECT 1/0;", "division by zero", "22012"},
      {filler + "INSERT INTO no_such_table VALUES (1);", "no_such_table", "line 2"},
  };
  for (const Case& c : cases) {
    ClaimResult cl = MustClaim(*store_, "err");
    ASSERT_TRUE(cl.acquired());
    Status got;
    auto w = store_->RunInTransaction("err", cl.token, cl.fence, cl.attempt, 600s,
                                      [&](PostgresTransaction& tx) {
                                        got = tx.ExecScript(c.script);
                                        return HandlerResult::Retry("no");
                                      });
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_FALSE(got.ok());
    EXPECT_LT(got.message().size(), 1000u) << got.message().substr(0, 400);
    EXPECT_NE(got.message().find(c.want1), std::string::npos) << got.message().substr(0, 400);
    EXPECT_NE(got.message().find(c.want2), std::string::npos) << got.message().substr(0, 400);
  }
}

// Prepared statements are not transactional: a handler's DEALLOCATE ALL drops
// the store's own ("claim", "complete" ...) on that pooled connection, whatever
// happens to its transaction. The connection must not go on failing every
// statement for ever: at most one call fails, and the pool replaces it.
TEST_F(PostgresTxTest, AHandlerDeallocatingTheStoresStatementsCostsOneCallAtMost) {
  auto store = Open("&table=tx&pool=2");
  ASSERT_NE(store, nullptr);
  ClaimResult c = MustClaim(*store, "dealloc");
  ASSERT_TRUE(c.acquired());
  auto w = store->RunInTransaction("dealloc", c.token, c.fence, c.attempt, 600s,
                                   [](PostgresTransaction& tx) {
                                     auto r = tx.Exec("DEALLOCATE ALL");
                                     EXPECT_TRUE(r.ok()) << r.status();
                                     return HandlerResult::Retry("gone");
                                   });
  int failed = w.ok() ? 0 : 1;  // the release after the rollback may be the one
  for (int i = 0; i < 20; ++i) {
    const std::string key = "after-dealloc-" + std::to_string(i);
    ClaimRequest r;
    r.key = key;
    r.lease = 60s;
    r.retention = 600s;
    auto got = store->Claim(r);
    if (!got.ok()) ++failed;
  }
  EXPECT_LE(failed, 1) << "claims kept failing on a connection without its statements";
}

// Whatever the text holds reaches EXECUTE unchanged: quotes, backslashes, the
// DO block's own $dedup$ tag, a value of almost 1 MiB; and a SELECT or an
// INSERT ... RETURNING among the statements is fine (its rows are dropped).
TEST_F(PostgresTxTest, HandlerSqlTextReachesTheServerUnchanged) {
  const std::string odd = "it''s $dedup$ END $dedup$; \\ \" x";
  const std::string big(1'000'000, 'b');
  const std::string script = "INSERT INTO orders (msg) VALUES ('" + odd + "');\n"
                             "SELECT 1; WITH c AS (SELECT 2) SELECT * FROM c;\n"
                             "INSERT INTO orders (msg) VALUES ('" + big + "') RETURNING msg;";
  ClaimResult c = MustClaim(*store_, "text");
  ASSERT_TRUE(c.acquired());
  auto w = store_->RunInTransaction("text", c.token, c.fence, c.attempt, 600s,
                                    [&](PostgresTransaction& tx) {
                                      Status s = tx.ExecScript(script);
                                      return s.ok() ? HandlerResult::Done()
                                                    : HandlerResult::Retry(s.ToString());
                                    });
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(PgServer::Value("SELECT count(*) FROM orders WHERE msg = 'it''s $dedup$ END $dedup$; \\ \" x'"), "1");
  EXPECT_EQ(PgServer::Value("SELECT count(*) FROM orders WHERE length(msg) = 1000000"), "1");
}

// Exec's parameters are text: a NUL byte cannot travel in one, and libpq would
// silently cut the value at it (a key "a\0b" written as "a"). Refused instead.
TEST_F(PostgresTxTest, ExecRefusesAParameterItWouldCut) {
  ClaimResult c = MustClaim(*store_, "nul");
  ASSERT_TRUE(c.acquired());
  StatusOr<std::vector<PostgresTransaction::Row>> got = Status::Internal("not run");
  auto w = store_->RunInTransaction("nul", c.token, c.fence, c.attempt, 600s,
                                    [&](PostgresTransaction& tx) {
                                      got = tx.Exec("SELECT length($1::text)",
                                                    {std::string("a\0b", 3)});
                                      return HandlerResult::Retry("done looking");
                                    });
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument)
      << (got.ok() && !got->empty() && (*got)[0][0] ? "length " + *(*got)[0][0] : got.status().ToString());
}

// The database (or role) may default to REPEATABLE READ or SERIALIZABLE. The
// completion's owner check must still see the record as the heartbeat left it: a
// transaction snapshot taken by the handler's first statement, older than the
// heartbeat's extend, must not make every handler longer than a heartbeat fail.
TEST_F(PostgresTxTest, ADatabaseDefaultingToRepeatableReadStillCompletes) {
  auto rr = OpenDatabaseWith("rr", "default_transaction_isolation = 'repeatable read'");
  ASSERT_TRUE(rr.ok()) << rr.status();
  BufferOptions bo;
  bo.lease = 600ms;
  Buffer buffer(rr->get(), bo);
  Processed p = ProcessOnceInTransaction(buffer, **rr, "rr1", "", [](PostgresTransaction& tx) {
    auto r = tx.Exec("INSERT INTO orders (msg) VALUES ('rr1')");  // takes the snapshot
    if (!r.ok()) return HandlerResult::Retry(r.status().ToString());
    std::this_thread::sleep_for(900ms);  // heartbeats extend the record meanwhile
    return HandlerResult::Done();
  });
  EXPECT_EQ(p.action, BrokerAction::kAck) << p.reason;
  std::string n;
  EXPECT_TRUE(PgServer::Sql("rr", "SELECT count(*) FROM orders", &n));
  EXPECT_EQ(n, "1");
}

// A handler's SQL may SET things for its own statements (search_path, a
// statement_timeout, a role). The connection goes back to the pool afterwards:
// the next handler's SQL, and the store's own statements, must not run under
// them (a search_path leaking into the next handler puts its effect into
// another schema's table).
TEST_F(PostgresTxTest, HandlerSettingsDoNotOutliveItsTransaction) {
  ASSERT_TRUE(PgServer::Sql(Db(), "CREATE SCHEMA IF NOT EXISTS elsewhere"));
  auto store = Open("&table=tx&pool=2");  // one connection for transactions: the same one
  ASSERT_NE(store, nullptr);
  std::string before_path, before_timeout;
  // And the settings the store itself relies on (its connections' startup
  // options): RESET ALL must bring back the store's values, not the server's.
  const std::vector<std::string> own = {"default_transaction_isolation",
                                        "idle_in_transaction_session_timeout",
                                        "application_name", "client_encoding"};
  std::vector<std::string> before_own(own.size());
  auto run = [&](const std::string& key, const TransactionalHandler& h) {
    ClaimResult c = MustClaim(*store, key);
    ASSERT_TRUE(c.acquired());
    auto w = store->RunInTransaction(key, c.token, c.fence, c.attempt, 600s, h);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(*w, WriteResult::kOk) << key;
  };
  auto show = [](PostgresTransaction& tx, const std::string& what) {
    auto r = tx.Exec("SELECT current_setting('" + what + "')");
    return r.ok() && !r->empty() && (*r)[0][0] ? *(*r)[0][0] : r.status().ToString();
  };
  run("set0", [&](PostgresTransaction& tx) {
    before_path = show(tx, "search_path");
    before_timeout = show(tx, "statement_timeout");
    for (size_t i = 0; i < own.size(); ++i) before_own[i] = show(tx, own[i]);
    return HandlerResult::Done();
  });
  run("set1", [&](PostgresTransaction& tx) {
    Status s = tx.ExecScript(
        "SET search_path TO elsewhere; SET statement_timeout = '1h'; "
        "SET default_transaction_isolation = 'serializable'; "
        "SET idle_in_transaction_session_timeout = '1s'; SET application_name = 'handler'; "
        "SET client_encoding = 'LATIN1'");
    return s.ok() ? HandlerResult::Done() : HandlerResult::Retry(s.ToString());
  });
  run("set2", [&](PostgresTransaction& tx) {
    EXPECT_EQ(show(tx, "search_path"), before_path) << "the last handler's search_path leaked";
    EXPECT_EQ(show(tx, "statement_timeout"), before_timeout)
        << "the last handler's statement_timeout leaked";
    for (size_t i = 0; i < own.size(); ++i) {
      EXPECT_EQ(show(tx, own[i]), before_own[i]) << "the last handler's " << own[i] << " leaked";
    }
    EXPECT_EQ(before_own[0], "read committed");
    EXPECT_EQ(before_own[1], "0");
    EXPECT_EQ(before_own[2], "dedup");
    return HandlerResult::Done();
  });
}

// The same for session state that is not a setting: a session-level advisory
// lock taken by the handler's SQL (pg_advisory_lock, not _xact_) would stay held
// by the pooled connection for ever, and every other session waiting for it hang.
TEST_F(PostgresTxTest, HandlerSessionLocksDoNotOutliveItsTransaction) {
  ClaimResult c = MustClaim(*store_, "lock1");
  ASSERT_TRUE(c.acquired());
  auto w = store_->RunInTransaction("lock1", c.token, c.fence, c.attempt, 600s,
                                    [](PostgresTransaction& tx) {
                                      Status s = tx.ExecScript("SELECT pg_advisory_lock(4242)");
                                      return s.ok() ? HandlerResult::Done()
                                                    : HandlerResult::Retry(s.ToString());
                                    });
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(PgServer::Value("SELECT pg_try_advisory_lock(4242)"), "t")
      << "the handler's session lock is still held by the store's pooled connection";
  // A rollback does not end a session lock either.
  ClaimResult r = MustClaim(*store_, "lock2");
  ASSERT_TRUE(r.acquired());
  w = store_->RunInTransaction("lock2", r.token, r.fence, r.attempt, 600s,
                               [](PostgresTransaction& tx) {
                                 (void)tx.ExecScript("SELECT pg_advisory_lock(4243)");
                                 return HandlerResult::Retry("after the lock");
                               });
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(PgServer::Value("SELECT pg_try_advisory_lock(4243)"), "t")
      << "a rolled-back handler's session lock is still held by the store's pooled connection";
}

// Session state that RESET does not touch: a temporary table, a prepared
// statement (PREPARE is not transactional: a rollback keeps it), a sequence's
// currval (kept by a rollback too), a LISTEN, a cursor WITH HOLD. On a pooled
// connection the next message's handler, perhaps another tenant's, would see
// them (and its own CREATE TEMP TABLE or PREPARE of the same name would fail).
TEST_F(PostgresTxTest, HandlerSessionObjectsDoNotReachTheNextHandler) {
  ASSERT_TRUE(PgServer::Sql(Db(), "CREATE SEQUENCE IF NOT EXISTS tenant_seq"));
  auto store = Open("&table=tx&pool=2");  // one connection for transactions: the same one
  ASSERT_NE(store, nullptr);
  std::string first_pid;
  // Runs `h` for a fresh key; `done`: whether it commits (else it asks a retry).
  auto run = [&](const std::string& key, bool done, const std::function<void(PostgresTransaction&)>& h) {
    ClaimResult c = MustClaim(*store, key);
    ASSERT_TRUE(c.acquired());
    auto w = store->RunInTransaction(key, c.token, c.fence, c.attempt, 600s, [&](PostgresTransaction& tx) {
      auto pid = tx.Exec("SELECT pg_backend_pid()::text");
      EXPECT_TRUE(pid.ok() && !pid->empty() && (*pid)[0][0]);
      if (pid.ok() && !pid->empty() && (*pid)[0][0]) {
        if (first_pid.empty()) first_pid = *(*pid)[0][0];
        EXPECT_EQ(*(*pid)[0][0], first_pid) << "not the same pooled connection: the test shows nothing";
      }
      h(tx);
      return done ? HandlerResult::Done() : HandlerResult::Retry("asked");
    });
    ASSERT_TRUE(w.ok()) << w.status();
  };
  auto leave = [](PostgresTransaction& tx) {
    Status s = tx.ExecScript(
        "CREATE TEMP TABLE leftover (secret text); INSERT INTO leftover VALUES ('tenant 1'); "
        "PREPARE leftover_stmt AS SELECT 'tenant 1'; SELECT nextval('tenant_seq'); "
        "DECLARE leftover_cursor CURSOR WITH HOLD FOR SELECT 'tenant 1'; LISTEN leftover_channel");
    EXPECT_TRUE(s.ok()) << s;
  };
  auto value = [](PostgresTransaction& tx, const std::string& sql) {
    auto r = tx.Exec(sql);
    if (!r.ok()) return "error: " + r.status().ToString();
    return !r->empty() && (*r)[0][0] ? *(*r)[0][0] : std::string("NULL");
  };
  auto check = [&](PostgresTransaction& tx, const std::string& after) {
    EXPECT_EQ(value(tx, "SELECT to_regclass('pg_temp.leftover')::text"), "NULL")
        << "the temporary table of the handler " << after << " is still there";
    EXPECT_EQ(value(tx, "SELECT string_agg(name, ',') FROM pg_prepared_statements WHERE from_sql"), "NULL")
        << "the statement the handler " << after << " prepared is still there";
    EXPECT_EQ(value(tx, "SELECT count(*) FROM pg_listening_channels()"), "0") << after;
    EXPECT_EQ(value(tx, "SELECT string_agg(name, ',') FROM pg_cursors WHERE name <> ''"), "NULL")
        << "a cursor of the handler " << after << " is still open";
    // The one statement that fails: last, since it aborts the transaction.
    EXPECT_NE(value(tx, "SELECT currval('tenant_seq')::text"), "1")
        << "currval of the handler " << after << " is still known";
  };
  run("obj1", true, leave);
  run("obj2", false, [&](PostgresTransaction& tx) { check(tx, "before (committed)"); });
  // A rollback drops the temporary table, the cursor and the LISTEN, but not
  // the prepared statement nor currval.
  run("obj3", false, leave);
  run("obj4", false, [&](PostgresTransaction& tx) { check(tx, "before (rolled back)"); });
  // And the store's own statements still run on that connection.
  ClaimResult after = MustClaim(*store, "obj5");
  EXPECT_TRUE(after.acquired());
}

// The statements a handler PREPAREd are deallocated by a function in the store's
// schema: dropped (from another connection) or replaced by another body (inside
// the handler's own transaction), the commit fails and nothing leaks; a store
// opened after makes it again.
TEST_F(PostgresTxTest, SessionResetFunctionDroppedOrReplacedFailsTheCommit) {
  auto store = Open("&table=tx&pool=2");
  ASSERT_NE(store, nullptr);
  std::set<std::string> pids;
  // Runs a handler that PREPAREs and INSERTs, plus `extra`; the write's status.
  // `done`: whether it commits (else it asks a retry: a rollback).
  auto run = [&](const std::string& key, const std::string& extra, bool done = true) {
    ClaimResult c = MustClaim(*store, key);
    EXPECT_TRUE(c.acquired());
    return store->RunInTransaction(key, c.token, c.fence, c.attempt, 600s, [&](PostgresTransaction& tx) {
      auto pid = tx.Exec("SELECT pg_backend_pid()::text");
      if (pid.ok() && !pid->empty() && (*pid)[0][0]) pids.insert(*(*pid)[0][0]);
      Status s = tx.ExecScript("PREPARE leftover_stmt AS SELECT 1; INSERT INTO orders VALUES ('" +
                               key + "', 1); " + extra);
      EXPECT_TRUE(s.ok()) << s;
      return done ? HandlerResult::Done() : HandlerResult::Retry("asked");
    });
  };
  auto committed = [&](const std::string& key) {
    std::string n;
    EXPECT_TRUE(PgServer::Sql(Db(), "SELECT count(*) FROM orders WHERE msg = '" + key + "'", &n));
    return n == "1";
  };
  auto w = run("f1", "");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(committed("f1"));

  // Replaced inside the handler's transaction: the call's answer is checked.
  w = run("f2", "CREATE OR REPLACE FUNCTION public.dedup_forget_handler_statements() "
                "RETURNS integer LANGUAGE sql AS 'SELECT 2'");
  EXPECT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("was replaced"), std::string::npos) << w.status();
  EXPECT_FALSE(committed("f2"));

  // Dropped by another connection: the commit cannot call it.
  ASSERT_TRUE(PgServer::Sql(Db(), "DROP FUNCTION public.dedup_forget_handler_statements()"));
  w = run("f3", "");
  EXPECT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("dedup_forget_handler_statements"), std::string::npos)
      << w.status();
  EXPECT_FALSE(committed("f3"));
  // After a rollback the prepared statement cannot be forgotten either: that
  // connection is closed too, not handed to the next handler.
  w = run("f3r", "", false);
  ASSERT_TRUE(w.ok()) << w.status();  // the release of the claim

  // A store opened now makes it again; the one still open then commits too.
  auto again = Open("&table=tx&pool=2");
  ASSERT_NE(again, nullptr);
  w = run("f4", "");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(committed("f4"));
  // Each failed reset closed its connection (the prepared statement with it).
  EXPECT_EQ(pids.size(), 4u);
}

// The handler's connection dies mid-transaction (server kills the backend, a
// network cut): nothing of the effect stays, the message is retried, never
// acked, and the next delivery does the work once on a fresh connection.
TEST_F(PostgresTxTest, ConnectionKilledMidTransactionLeavesNothingThenRunsOnce) {
  BufferOptions bo;
  bo.lease = 5s;
  bo.retry_delay = 10ms;
  Buffer buffer(store_.get(), bo);
  int runs = 0;
  auto handler = [&](PostgresTransaction& tx) {
    ++runs;
    auto r = tx.Exec("INSERT INTO orders (msg) VALUES ('cut')");
    if (!r.ok()) return HandlerResult::Retry(r.status().ToString());
    if (runs == 1) {
      auto pid = tx.Exec("SELECT pg_backend_pid()::text");
      EXPECT_TRUE(pid.ok() && !pid->empty());
      if (pid.ok() && !pid->empty()) {
        EXPECT_TRUE(PgServer::Sql(Db(), "SELECT pg_terminate_backend(" + *(*pid)[0][0] + ")"));
      }
    }
    return HandlerResult::Done();
  };
  Processed first = ProcessOnceInTransaction(buffer, *store_, "cut", "", handler);
  EXPECT_EQ(first.action, BrokerAction::kRetry) << first.reason;
  EXPECT_EQ(first.status.code(), StatusCode::kUnavailable) << first.status;
  EXPECT_EQ(Orders("cut"), "0");
  Processed second;
  for (int i = 0; i < 20; ++i) {  // until the claim is free again (released, or its lease over)
    second = ProcessOnceInTransaction(buffer, *store_, "cut", "", handler);
    if (second.action == BrokerAction::kAck) break;
    std::this_thread::sleep_for(300ms);
  }
  EXPECT_EQ(second.action, BrokerAction::kAck) << second.reason;
  EXPECT_EQ(Orders("cut"), "1");
}

// What arrives while a handler's statement waits, on the asynchronous connection:
// a NOTIFY from another session (the handler LISTENs), warnings raised mid-wait,
// and a result of many rows and megabytes that comes in pieces. Each statement
// gets its whole answer, the next one finds the connection ready, and the commit
// goes through.
TEST_F(PostgresTxTest, NotifiesNoticesAndALargeResultMidWaitAreAllConsumed) {
  ClaimResult c = MustClaim(*store_, "mid");
  ASSERT_TRUE(c.acquired());
  std::string why;
  auto handler = [&](PostgresTransaction& tx) {
    auto fail = [&](const std::string& w) {
      why = w;
      return HandlerResult::Retry(w);
    };
    if (auto r = tx.Exec("LISTEN dedup_mid"); !r.ok()) return fail(r.status().ToString());
    std::thread notifier([] {
      std::this_thread::sleep_for(150ms);
      EXPECT_TRUE(PgServer::Sql(Db(), "NOTIFY dedup_mid, 'hello'"));
    });
    auto slept = tx.Exec(
        "SELECT pg_sleep(0.4), (SELECT count(*) FROM (SELECT 1 FROM generate_series(1, 3)) g)::text");
    notifier.join();
    if (!slept.ok()) return fail("pg_sleep: " + slept.status().ToString());
    auto warned = tx.Exec(
        "DO $$ BEGIN FOR i IN 1..200 LOOP RAISE WARNING 'w %', i; PERFORM pg_sleep(0.001); "
        "END LOOP; END $$");
    if (!warned.ok()) return fail("warnings: " + warned.status().ToString());
    auto big = tx.Exec("SELECT i::text, repeat('x', 100000) FROM generate_series(1, 300) i");
    if (!big.ok()) return fail("big: " + big.status().ToString());
    if (big->size() != 300 || !(*big)[299][1] || (*big)[299][1]->size() != 100000) {
      return fail("big: " + std::to_string(big->size()) + " rows");
    }
    auto many = tx.Exec("SELECT i::text FROM generate_series(1, 200000) i");
    if (!many.ok() || many->size() != 200000) return fail("many rows");
    auto ins = tx.Exec("INSERT INTO orders (msg) VALUES ('mid')");
    if (!ins.ok()) return fail(ins.status().ToString());
    return HandlerResult::Done("ok");
  };
  HandlerResult hr;
  auto w = store_->RunInTransaction("mid", c.token, c.fence, c.attempt, 600s, handler, &hr);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk) << why;
  EXPECT_EQ(hr.kind, HandlerResult::Kind::kDone) << why;
  EXPECT_EQ(Orders("mid"), "1");
  EXPECT_EQ(MustClaim(*store_, "mid").outcome, ClaimOutcome::kDuplicate);
}

// Signals delivered to the waiting thread (poll(2) fails with EINTR whatever
// SA_RESTART says): the wait goes on, bounded from its start, and the answer
// comes back as if nothing happened.
TEST_F(PostgresTxTest, SignalsDuringAWaitAreNotFailures) {
  struct sigaction sa = {};
  sa.sa_handler = [](int) {};
  sigemptyset(&sa.sa_mask);
  struct sigaction old = {};
  ASSERT_EQ(sigaction(SIGUSR1, &sa, &old), 0);
  ClaimResult c = MustClaim(*store_, "eintr");
  ASSERT_TRUE(c.acquired());
  std::atomic<bool> done{false};
  const pthread_t me = pthread_self();
  std::thread pester([&] {
    while (!done.load()) {
      pthread_kill(me, SIGUSR1);
      std::this_thread::sleep_for(2ms);
    }
  });
  Status slept;
  auto handler = [&](PostgresTransaction& tx) {
    auto r = tx.Exec("SELECT pg_sleep(0.5)");
    slept = r.status();
    if (!r.ok()) return HandlerResult::Retry(r.status().ToString());
    auto ins = tx.Exec("INSERT INTO orders (msg) VALUES ('eintr')");
    if (!ins.ok()) return HandlerResult::Retry(ins.status().ToString());
    return HandlerResult::Done();
  };
  HandlerResult hr;
  auto w = store_->RunInTransaction("eintr", c.token, c.fence, c.attempt, 600s, handler, &hr);
  auto claim = store_->Claim(ClaimRequest{.key = "eintr-2"});
  done = true;
  pester.join();
  sigaction(SIGUSR1, &old, nullptr);
  EXPECT_TRUE(slept.ok()) << slept;
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(Orders("eintr"), "1");
  EXPECT_TRUE(claim.ok()) << claim.status();
}

// pg_terminate_backend while a handler's statement waits for its answer: the
// wait ends at once with Unavailable (not a DeadlineExceeded timeout + 1 s
// later), nothing commits, and the next delivery runs once.
TEST_F(PostgresTxTest, ABackendTerminatedDuringAWaitIsUnavailableAtOnce) {
  ClaimResult c = MustClaim(*store_, "term");
  ASSERT_TRUE(c.acquired());
  Status slept;
  std::chrono::steady_clock::duration took{};
  auto handler = [&](PostgresTransaction& tx) {
    auto pid = tx.Exec("SELECT pg_backend_pid()::text");
    if (!pid.ok() || pid->empty()) return HandlerResult::Retry("no pid");
    const std::string p = *(*pid)[0][0];
    auto ins = tx.Exec("INSERT INTO orders (msg) VALUES ('term')");
    if (!ins.ok()) return HandlerResult::Retry(ins.status().ToString());
    std::thread killer([p] {
      std::this_thread::sleep_for(300ms);
      EXPECT_TRUE(PgServer::Sql(Db(), "SELECT pg_terminate_backend(" + p + ")"));
    });
    const auto t0 = std::chrono::steady_clock::now();
    auto r = tx.Exec("SELECT pg_sleep(3)");
    took = std::chrono::steady_clock::now() - t0;
    killer.join();
    slept = r.status();
    return HandlerResult::Done();
  };
  HandlerResult hr;
  auto w = store_->RunInTransaction("term", c.token, c.fence, c.attempt, 600s, handler, &hr);
  EXPECT_EQ(slept.code(), StatusCode::kUnavailable) << slept;
  EXPECT_LT(took, 2s);
  EXPECT_EQ(hr.kind, HandlerResult::Kind::kRetry);
  EXPECT_TRUE(w.ok()) << w.status();  // the claim released on another connection
  EXPECT_EQ(Orders("term"), "0");
  ClaimResult again = MustClaim(*store_, "term");
  EXPECT_TRUE(again.acquired());
}

// A handler that ends the transaction itself through Exec ("COMMIT": the
// extended protocol runs it, where ExecScript refuses it) has committed its
// effect without the completion. The store cannot undo that; what it must not do
// is release the claim, so that the next delivery runs the handler again and
// applies the effect twice: the statement is an error naming it, the key is
// completed as failed (dead-lettered), and later statements are refused.
TEST_F(PostgresTxTest, AHandlerCommittingThroughExecIsNeverRunAgain) {
  ClaimResult c = MustClaim(*store_, "selfcommit");
  ASSERT_TRUE(c.acquired());
  Status committed, after;
  auto handler = [&](PostgresTransaction& tx) {
    auto ins = tx.Exec("INSERT INTO orders (msg) VALUES ('selfcommit')");
    if (!ins.ok()) return HandlerResult::Retry(ins.status().ToString());
    committed = tx.Exec("COMMIT").status();
    after = tx.Exec("INSERT INTO orders (msg) VALUES ('selfcommit')").status();
    return HandlerResult::Retry("try again");
  };
  HandlerResult hr;
  auto w = store_->RunInTransaction("selfcommit", c.token, c.fence, c.attempt, 600s, handler, &hr);
  EXPECT_EQ(committed.code(), StatusCode::kFailedPrecondition) << committed;
  EXPECT_FALSE(after.ok()) << "a statement after the handler's COMMIT ran on its own";
  EXPECT_EQ(hr.kind, HandlerResult::Kind::kFail) << hr.result;
  EXPECT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(Orders("selfcommit"), "1");
  ClaimResult again = MustClaim(*store_, "selfcommit");
  EXPECT_EQ(again.outcome, ClaimOutcome::kDuplicate) << "the handler would run again";
}

// COMMIT AND CHAIN (or ROLLBACK AND CHAIN) ends the transaction and leaves the
// connection inside a new one, as does a "COMMIT; BEGIN" sent on connection()
// itself: PQtransactionStatus alone did not tell, so the effect was committed,
// the claim released, and the next delivery applied it again (3 rows after 3
// runs); after ROLLBACK AND CHAIN and Done the key was recorded as done
// without its effect. Each is completed as failed, never run again.
TEST_F(PostgresTxTest, AHandlerEndingTheTransactionAndChainingIsNeverRunAgain) {
  struct Case {
    std::string key;
    std::function<void(PostgresTransaction&)> end;
    HandlerResult answer;
    std::string rows;  // of the effect, after
  };
  const std::vector<Case> cases = {
      {"chain-exec", [](PostgresTransaction& tx) { (void)tx.Exec("COMMIT AND CHAIN"); },
       HandlerResult::Retry("again"), "1"},
      {"rollback-chain", [](PostgresTransaction& tx) { (void)tx.Exec("ROLLBACK AND CHAIN"); },
       HandlerResult::Done(), "0"},
      {"raw-commit-begin",
       [](PostgresTransaction& tx) { PQclear(PQexec(tx.connection(), "COMMIT; BEGIN")); },
       HandlerResult::Retry("again"), "1"},
      {"raw-chain",
       [](PostgresTransaction& tx) { PQclear(PQexec(tx.connection(), "COMMIT AND CHAIN")); },
       HandlerResult::Done(), "1"},
      // A chain, then a statement that fails: the connection is in an aborted
      // transaction, whose id cannot be read to compare. The effect was
      // committed, the claim released and the handler run again (2 rows).
      {"raw-chain-then-error",
       [](PostgresTransaction& tx) {
         PQclear(PQexec(tx.connection(), "COMMIT AND CHAIN"));
         PQclear(PQexec(tx.connection(), "SELECT 1/0"));
       },
       HandlerResult::Retry("again"), "1"},
      {"raw-chain-then-error-done",
       [](PostgresTransaction& tx) {
         PQclear(PQexec(tx.connection(), "COMMIT; BEGIN; SELECT 1/0"));
       },
       HandlerResult::Done(), "1"},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.key);
    ClaimResult c = MustClaim(*store_, k.key);
    ASSERT_TRUE(c.acquired());
    auto handler = [&](PostgresTransaction& tx) {
      auto ins = tx.Exec("INSERT INTO orders (msg) VALUES ($1)", {k.key});
      if (!ins.ok()) return HandlerResult::Retry(ins.status().ToString());
      k.end(tx);
      return k.answer;
    };
    HandlerResult hr;
    auto w = store_->RunInTransaction(k.key, c.token, c.fence, c.attempt, 600s, handler, &hr);
    EXPECT_TRUE(w.ok()) << w.status();
    EXPECT_EQ(hr.kind, HandlerResult::Kind::kFail) << hr.result;
    EXPECT_EQ(Orders(k.key), k.rows);
    ClaimResult again = MustClaim(*store_, k.key);
    EXPECT_EQ(again.outcome, ClaimOutcome::kDuplicate) << "the handler would run again";
  }
}

// A role the handler SETs holds for its own statements; the completion ran
// under it too, was refused for want of privileges on the store's table, and
// the message was retried for ever ("permission denied for table tx").
TEST_F(PostgresTxTest, AHandlersRoleIsNotTheCompletions) {
  ASSERT_TRUE(PgServer::Sql(Db(), "DROP ROLE IF EXISTS order_writer; "
                                  "CREATE ROLE order_writer NOLOGIN; "
                                  "GRANT INSERT ON orders TO order_writer; "
                                  "GRANT order_writer TO CURRENT_USER"));
  ClaimResult c = MustClaim(*store_, "role");
  ASSERT_TRUE(c.acquired());
  std::string who;
  auto handler = [&](PostgresTransaction& tx) {
    auto set = tx.Exec("SET ROLE order_writer");
    if (!set.ok()) return HandlerResult::Retry(set.status().ToString());
    auto ins = tx.Exec("INSERT INTO orders (msg) VALUES ('role')");
    if (!ins.ok()) return HandlerResult::Retry(ins.status().ToString());
    auto me = tx.Exec("SELECT current_user");
    if (me.ok() && !me->empty() && (*me)[0][0]) who = *(*me)[0][0];
    return HandlerResult::Done("ok");
  };
  HandlerResult hr;
  auto w = store_->RunInTransaction("role", c.token, c.fence, c.attempt, 600s, handler, &hr);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  EXPECT_EQ(who, "order_writer") << "the handler's statements run under its role";
  EXPECT_EQ(Orders("role"), "1");
  EXPECT_EQ(MustClaim(*store_, "role").outcome, ClaimOutcome::kDuplicate);
  // The next handler on the pooled connection starts as the connection's own role.
  ClaimResult d = MustClaim(*store_, "role2");
  std::string who2;
  auto second = [&](PostgresTransaction& tx) {
    auto me = tx.Exec("SELECT current_user");
    if (me.ok() && !me->empty() && (*me)[0][0]) who2 = *(*me)[0][0];
    return HandlerResult::Done();
  };
  ASSERT_TRUE(store_->RunInTransaction("role2", d.token, d.fence, d.attempt, 600s, second, &hr).ok());
  EXPECT_NE(who2, "order_writer");
  ASSERT_TRUE(PgServer::Sql(Db(), "REVOKE ALL ON orders FROM order_writer"));
}

// A COPY through Exec: the protocol enters a copy that nobody feeds. The handler
// hears an error naming COPY, nothing commits, and the next message on the store
// works.
TEST_F(PostgresTxTest, ACopyThroughExecIsAnErrorNamingIt) {
  ClaimResult c = MustClaim(*store_, "copy");
  ASSERT_TRUE(c.acquired());
  Status copy_status;
  auto handler = [&](PostgresTransaction& tx) {
    auto r = tx.Exec("COPY orders (msg) FROM STDIN");
    copy_status = r.status();
    return HandlerResult::Done();
  };
  HandlerResult hr;
  auto w = store_->RunInTransaction("copy", c.token, c.fence, c.attempt, 600s, handler, &hr);
  EXPECT_FALSE(copy_status.ok());
  EXPECT_NE(copy_status.message().find("COPY"), std::string::npos) << copy_status;
  EXPECT_EQ(hr.kind, HandlerResult::Kind::kRetry);
  EXPECT_TRUE(w.ok()) << w.status();
  ClaimResult again = MustClaim(*store_, "copy");
  EXPECT_TRUE(again.acquired());
  EXPECT_EQ(Orders("copy"), "0");
}

// A COMMIT whose answer is lost: the effect and the completion commit on the server
// while the worker hears nothing (here: a deferred trigger holds the COMMIT on a
// lock, the caller stops waiting, then the lock is freed). The worker cannot know
// (Aborted: effect unknown); what decides is the record, read back by the next
// claim: DUPLICATE with the result, the broker acks, the handler never runs again.
TEST_F(PostgresTxTest, ACommitWhoseAnswerIsLostIsReadBackAndNeverRunsTwice) {
  ASSERT_TRUE(PgServer::Sql(
      Db(), "CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_advisory_xact_lock(4242); RETURN NULL; END $$; "
            "CREATE CONSTRAINT TRIGGER orders_hold AFTER INSERT ON orders DEFERRABLE INITIALLY "
            "DEFERRED FOR EACH ROW EXECUTE FUNCTION hold_commit()"));
  PGconn* holder = PQconnectdb(("host=127.0.0.1 port=" + std::to_string(kPort) + " dbname=" + Db() +
                                " user=dedup password=" + kPassword).c_str());
  PGresult* locked = PQexec(holder, "SELECT pg_advisory_lock(4242)");
  ASSERT_EQ(PQresultStatus(locked), PGRES_TUPLES_OK) << PQerrorMessage(holder);
  PQclear(locked);
  auto store = Open("&table=tx&timeout=30s");
  ASSERT_NE(store, nullptr);
  ClaimResult c = MustClaim(*store, "lostcommit");
  ASSERT_TRUE(c.acquired());
  std::atomic<int> runs{0};
  auto handler = InsertThen("lostcommit", [&] {
    ++runs;
    return HandlerResult::Done("receipt");
  });
  auto tx = std::async(std::launch::async, [&] {
    return store->RunInTransaction("lostcommit", c.token, c.fence, c.attempt, 600s, handler);
  });
  bool commit_waits = false;
  for (int i = 0; i < 100 && !commit_waits; ++i, std::this_thread::sleep_for(50ms)) {
    commit_waits = PgServer::Value("SELECT count(*) FROM pg_stat_activity WHERE wait_event = "
                                   "'advisory' AND datname = current_database()") == "1";
  }
  if (commit_waits) store->StopWaiting(250ms);
  const bool answered = tx.wait_for(5s) == std::future_status::ready;
  PQfinish(holder);  // the lock is free: the server finishes the COMMIT nobody hears
  auto w = tx.get();
  ASSERT_TRUE(commit_waits) << "the COMMIT never waited on the trigger's lock";
  ASSERT_TRUE(answered) << "RunInTransaction still waited 5 s after StopWaiting(250ms)";
  EXPECT_EQ(w.status().code(), StatusCode::kAborted) << (w.ok() ? "answered" : w.status().ToString());
  for (int i = 0; i < 100 && Orders("lostcommit") != "1"; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_EQ(Orders("lostcommit"), "1") << "the COMMIT did not complete on the server";

  auto fresh = Open("&table=tx");  // the stopped store is done; a restarted worker's
  ASSERT_NE(fresh, nullptr);
  ClaimResult d = MustClaim(*fresh, "lostcommit");
  EXPECT_EQ(d.outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(d.result, "receipt");
  Buffer buffer(fresh.get());
  Processed p = ProcessOnceInTransaction(buffer, *fresh, "lostcommit", "", handler);
  EXPECT_EQ(p.action, BrokerAction::kAck) << p.reason;
  EXPECT_FALSE(p.ran);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(Orders("lostcommit"), "1");
}

// ---- fences where the effect lands ------------------------------------------------

TEST_F(PostgresStoreTest, FenceHelperRefusesALowerFence) {
  auto store = Open("&table=fences");
  ASSERT_NE(store, nullptr);
  const std::string f = store->FenceFunction();
  EXPECT_EQ(PgServer::Value("SELECT " + f + "('payments', 'order-7', 5)"), "5");
  EXPECT_EQ(PgServer::Value("SELECT " + f + "('payments', 'order-7', 5)"), "5")
      << "the same owner may write twice";
  EXPECT_FALSE(PgServer::Sql(Db(), "SELECT " + f + "('payments', 'order-7', 4)"))
      << "a superseded owner's write must be refused";
  EXPECT_EQ(PgServer::Value("SELECT " + f + "('payments', 'order-7', 6)"), "6");
  EXPECT_EQ(PgServer::Value("SELECT " + f + "('other', 'order-7', 1)"), "1") << "scopes are apart";

  // The refusal is SQLSTATE DF001 and rolls back the effect written beside it.
  ASSERT_TRUE(PgServer::Sql(Db(), "DROP TABLE IF EXISTS ledger; CREATE TABLE ledger (k text)"));
  EXPECT_FALSE(PgServer::Sql(Db(), "BEGIN; INSERT INTO ledger VALUES ('order-7'); SELECT " + f +
                                          "('payments', 'order-7', 3); COMMIT;"));
  EXPECT_EQ(PgServer::Value("SELECT count(*) FROM ledger"), "0");

  // The trigger form, for a table that keeps one row per key with its fence.
  ASSERT_TRUE(PgServer::Sql(
      Db(),
      "DROP TABLE IF EXISTS accounts; CREATE TABLE accounts (id text PRIMARY KEY, balance int, fence bigint);"
      "CREATE TRIGGER accounts_fence BEFORE UPDATE ON accounts FOR EACH ROW "
      "EXECUTE FUNCTION public.dedup_refuse_stale_fence();"
      "INSERT INTO accounts VALUES ('a', 10, 7)"));
  EXPECT_TRUE(PgServer::Sql(Db(), "UPDATE accounts SET balance = 20, fence = 8 WHERE id = 'a'"));
  EXPECT_FALSE(PgServer::Sql(Db(), "UPDATE accounts SET balance = 99, fence = 7 WHERE id = 'a'"));
  EXPECT_EQ(PgServer::Value("SELECT balance FROM accounts WHERE id = 'a'"), "20");
  std::string state;
  PGconn* c = PQconnectdb(("host=127.0.0.1 port=" + std::to_string(kPort) +
                           " dbname=" + Db() + " user=dedup password=" + kPassword).c_str());
  PGresult* r = PQexec(c, ("SELECT " + f + "('payments', 'order-7', 1)").c_str());
  const char* code = PQresultErrorField(r, PG_DIAG_SQLSTATE);
  EXPECT_STREQ(code, "DF001");
  PQclear(r);
  PQfinish(c);
}

// ---- expiry -----------------------------------------------------------------------

TEST_F(PostgresStoreTest, ExpiryDeletesInBoundedBatchesAndSparesLiveRecords) {
  auto store = Open("&table=expiry");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "TRUNCATE expiry"));
  for (int i = 0; i < 1200; ++i) {
    ClaimResult c = MustClaim(*store, "old:" + std::to_string(i));
    ASSERT_TRUE(store->Complete("old:" + std::to_string(i), c.token, 1ms, CompletionStatus::kOk, "").ok());
  }
  for (int i = 0; i < 10; ++i) (void)MustClaim(*store, "live:" + std::to_string(i));
  std::this_thread::sleep_for(20ms);
  auto one = store->ExpireNow(500, 1);
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(*one, 500u) << "one statement deletes at most one batch";
  auto rest = store->ExpireNow(500, 100);
  ASSERT_TRUE(rest.ok());
  EXPECT_EQ(*rest, 700u);
  EXPECT_EQ(PgServer::Value("SELECT count(*) FROM expiry"), "10");
  EXPECT_GE(store->stats().expire_statements, 3u);

  // The background expiry does the same by itself.
  auto bg = Open("&table=expiry&expire_interval=100ms&expire_batch=50");
  ASSERT_NE(bg, nullptr);
  for (int i = 0; i < 120; ++i) {
    ClaimResult c = MustClaim(*bg, "bg:" + std::to_string(i));
    ASSERT_TRUE(bg->Release("bg:" + std::to_string(i), c.token, 1ms).ok());
  }
  for (int i = 0; i < 50 && PgServer::Value("SELECT count(*) FROM expiry") != "10"; ++i) {
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(PgServer::Value("SELECT count(*) FROM expiry"), "10");
  EXPECT_EQ(bg->stats().expired_rows, 120u);
}

// The reclaim racing claims of the records it deletes: a claim of a key whose
// retention is over is ACQUIRED at attempt 1 whether it meets the row (taking it
// over), waits for the reclaim's row lock (then inserts anew) or comes after the
// delete, never an error or BUSY; and the reclaim never deletes a row a claim has
// just renewed (SKIP LOCKED, and the recheck of the retention on the row's newest
// version).
TEST_F(PostgresStoreTest, ClaimsRacingTheReclaimOfTheirExpiredRecordsAreAcquired) {
  auto store = Open("&table=reclaim&pool=4");
  ASSERT_NE(store, nullptr);
  constexpr int kKeys = 1200;
  for (int i = 0; i < kKeys; ++i) {
    const std::string key = "e:" + std::to_string(i);
    ClaimResult c = MustClaim(*store, key);
    ASSERT_TRUE(store->Complete(key, c.token, 1ms, CompletionStatus::kOk, "").ok());
  }
  std::this_thread::sleep_for(20ms);
  std::atomic<bool> done{false};
  std::atomic<uint64_t> reclaimed{0};
  std::thread reaper([&] {
    while (!done.load()) {
      auto n = store->ExpireNow(20, 1);
      if (n.ok()) reclaimed += *n;
    }
  });
  std::atomic<int> bad{0};
  std::mutex mu;
  std::string first_bad;
  std::vector<std::thread> claimers;
  for (int t = 0; t < 3; ++t) {
    claimers.emplace_back([&, t] {
      for (int i = t; i < kKeys; i += 3) {
        const std::string key = "e:" + std::to_string(i);
        auto c = store->Claim(ClaimRequest{.key = key, .lease = 60s});
        if (c.ok() && c->acquired() && c->attempt == 1) continue;
        ++bad;
        std::lock_guard lock(mu);
        if (first_bad.empty()) {
          first_bad = key + ": " + (c.ok() ? "outcome " + std::to_string(static_cast<int>(c->outcome)) +
                                                 " attempt " + std::to_string(c->attempt)
                                           : c.status().ToString());
        }
      }
    });
  }
  for (auto& th : claimers) th.join();
  done = true;
  reaper.join();
  EXPECT_EQ(bad.load(), 0) << first_bad;
  EXPECT_GT(reclaimed.load(), 0u) << "the reclaim never ran beside the claims";
  EXPECT_EQ(PgServer::Value("SELECT count(*) FROM reclaim WHERE state = 1"), std::to_string(kKeys))
      << "a claimed record was reclaimed";
}

// ---- batches ------------------------------------------------------------------------

// store.h: "A batch that fails (a status) leaves none of its claims held". The
// PostgreSQL store's batch is one transaction: the claims before the failure are
// rolled back with it, and count no attempt (they were released, attempt kept).
TEST_F(PostgresStoreTest, FailedClaimBatchLeavesNothingOfItself) {
  auto store = Open("&table=batch&pool=1");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "TRUNCATE batch"));
  (void)MustClaim(*store, "b2");
  // b2's record cannot be decoded (completed, with a status no build writes): its
  // claim fails with DataLoss.
  ASSERT_TRUE(PgServer::Sql(Db(), "UPDATE batch SET state = 2, status = 7 WHERE key = 'b2'::bytea"));
  std::vector<ClaimRequest> reqs(2);
  reqs[0].key = "b1";
  reqs[1].key = "b2";
  auto res = store->ClaimBatch(reqs);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kDataLoss) << res.status();
  ClaimResult b1 = MustClaim(*store, "b1");
  EXPECT_TRUE(b1.acquired()) << "b1 is still held by a batch that returned an error (outcome "
                             << static_cast<int>(b1.outcome) << ")";
  EXPECT_EQ(b1.attempt, 1u) << "the failed batch counted an attempt";
  EXPECT_EQ(b1.fence, 1u);
  // (A connection handed back inside a transaction would be closed by the pool,
  // which keeps only idle ones: pg_conn.cc, Pool::Put.)
}

// A worker that stops between its batch's round trips (SIGSTOP here: a frozen
// container, a cut network) leaves its transaction open on the server, holding
// the rows it claimed. The batch's SET LOCAL idle_in_transaction_session_timeout
// (timeout + 1 s) ends it: another worker's claim of such a key gets it within
// seconds, where it timed out for as long as the first one stayed stopped.
TEST_F(PostgresStoreTest, AClaimBatchOfAStoppedWorkerDoesNotHoldItsRows) {
  const std::string extra = "&table=batch_stall&timeout=1s&pool=1";
  auto store = Open(extra);
  ASSERT_NE(store, nullptr);
  ClaimResult b = MustClaim(*store, "sb", 1ms);  // a row to lock; its lease soon over
  ASSERT_TRUE(b.acquired());
  store.reset();
  // Holds sb's row, so that the child's batch waits in the server for it.
  const std::string conninfo = "host=127.0.0.1 port=" + std::to_string(kPort) + " dbname=" +
                               Db() + " user=dedup password=" + kPassword;
  PGconn* holder = PQconnectdb(conninfo.c_str());
  ASSERT_EQ(PQstatus(holder), CONNECTION_OK);
  auto exec = [&](const char* sql) {
    PGresult* r = PQexec(holder, sql);
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok;
  };
  ASSERT_TRUE(exec("BEGIN"));
  ASSERT_TRUE(exec("SELECT 1 FROM batch_stall WHERE key = 'sb'::bytea FOR UPDATE"));
  const std::string uri = Uri(extra);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto s = OpenPostgresStore(uri);
    if (!s.ok()) _exit(3);
    std::vector<ClaimRequest> reqs(2);
    reqs[0].key = "sa";  // claimed first (byte order), then it waits for sb
    reqs[1].key = "sb";
    for (auto& r : reqs) r.lease = 60s, r.retention = 600s;
    (void)(*s)->ClaimBatch(reqs);
    _exit(0);
  }
  bool waiting = false;
  for (int i = 0; i < 400 && !waiting; ++i) {
    waiting = PgServer::Value("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                              "'Lock' AND datname = current_database()") == "1";
    if (!waiting) std::this_thread::sleep_for(2ms);
  }
  EXPECT_TRUE(waiting) << "the child's batch never waited for sb's row";
  kill(child, SIGSTOP);
  ASSERT_TRUE(exec("COMMIT"));  // sb free: the child's batch ends its statements, then stalls
  PQfinish(holder);
  auto other = Open(extra);
  ASSERT_NE(other, nullptr);
  const auto t0 = std::chrono::steady_clock::now();
  bool acquired = false;
  std::string last;
  while (!acquired && std::chrono::steady_clock::now() - t0 < 15s) {
    ClaimRequest r;
    r.key = "sa";
    r.lease = 60s;
    r.retention = 600s;
    auto c = other->Claim(r);
    acquired = c.ok() && c->acquired();
    last = c.ok() ? "outcome " + std::to_string(static_cast<int>(c->outcome)) : c.status().ToString();
    if (!acquired) std::this_thread::sleep_for(100ms);
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  kill(child, SIGKILL);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(acquired) << "sa still held by the stopped worker's batch after " << waited
                        << " s; last answer: " << last;
  EXPECT_LT(waited, 8.0);
}

// Answers in the order asked, a repeated key BUSY the second time, although the
// keys are claimed in byte order inside the batch's transaction.
TEST_F(PostgresStoreTest, ClaimBatchAnswersInTheOrderAsked) {
  auto store = Open("&table=batch_order");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "TRUNCATE batch_order"));
  ClaimResult done = MustClaim(*store, "m");
  ASSERT_EQ(*store->Complete("m", done.token, 1h, CompletionStatus::kOk, "r"), WriteResult::kOk);
  std::vector<ClaimRequest> reqs(4);
  for (auto& r : reqs) r.lease = 60s, r.retention = 1h;
  reqs[0].key = "z";
  reqs[1].key = "m";
  reqs[2].key = "a";
  reqs[3].key = "z";
  auto res = store->ClaimBatch(reqs);
  ASSERT_TRUE(res.ok()) << res.status();
  ASSERT_EQ(res->size(), 4u);
  EXPECT_TRUE((*res)[0].acquired());
  EXPECT_EQ((*res)[1].outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ((*res)[1].result, "r");
  EXPECT_TRUE((*res)[2].acquired());
  EXPECT_EQ((*res)[3].outcome, ClaimOutcome::kBusy);
  EXPECT_EQ(*store->Complete("z", (*res)[0].token, 1h, CompletionStatus::kOk, ""), WriteResult::kOk);
}

// Two workers' batches holding the same keys in opposite orders: each batch's
// transaction locks rows as it claims, so claimed in the order given they could
// wait for each other (PostgreSQL breaks the cycle after deadlock_timeout, 1 s,
// with an error). In byte order they never do: every batch answers, every key is
// acquired exactly once.
TEST_F(PostgresStoreTest, ClaimBatchesInOppositeOrdersNeverDeadlock) {
  auto store = Open("&table=batch_cross&pool=4");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "TRUNCATE batch_cross"));
  constexpr int kRounds = 100;
  std::atomic<int> acquired{0}, failed{0};
  std::string first_error;
  std::mutex mu;
  std::barrier round_start(2);  // both batches of a round start together
  auto run = [&](bool reversed) {
    for (int i = 0; i < kRounds; ++i) {
      round_start.arrive_and_wait();
      std::vector<ClaimRequest> reqs(3);
      const std::string keys[3] = {"x" + std::to_string(i), "y" + std::to_string(i),
                                   "w" + std::to_string(i)};
      for (int j = 0; j < 3; ++j) {
        reqs[j].key = keys[reversed ? 2 - j : j];
        reqs[j].lease = 60s;
        reqs[j].retention = 1h;
      }
      auto res = store->ClaimBatch(reqs);
      if (!res.ok()) {
        std::lock_guard lock(mu);
        if (failed++ == 0) first_error = res.status().ToString();
        continue;
      }
      for (const ClaimResult& r : *res) acquired += r.acquired() ? 1 : 0;
    }
  };
  std::thread a(run, false), b(run, true);
  a.join();
  b.join();
  EXPECT_EQ(failed.load(), 0) << first_error;
  EXPECT_EQ(acquired.load(), kRounds * 3) << "each key acquired exactly once";
}

// ---- records that cannot be decoded ------------------------------------------------

// SPEC "Bad input": a corrupt record gets a clear error, and no record is lost or
// changed. tests/corrupt_store.h models the PostgreSQL store's answer as DataLoss
// with nothing changed; a claim must not write its new lease over such a row.
TEST_F(PostgresStoreTest, ClaimNeverOverwritesARecordItCannotDecode) {
  auto store = Open("&table=corrupt");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "TRUNCATE corrupt"));
  const std::vector<std::string> damage = {
      "state = 9",                                       // no such state
      "state = 3, status = 7",                           // released, no such status
      "state = 1, lease_deadline = 0, fence = -5",       // lease over, negative fence
      "state = 1, lease_deadline = 0, token = 0",        // lease over, no token
      // Past the filters of Inspect and Scan (a fence floor's state and attempt;
      // retention over): hidden from both, while claims of them failed for ever.
      "state = 3, attempt = 0, token = 0",               // a floor's shape, no token
      "state = 9, retention_deadline = 1000",            // retention long over
  };
  for (size_t i = 0; i < damage.size(); ++i) {
    const std::string key = "c" + std::to_string(i);
    (void)MustClaim(*store, key);
    ASSERT_TRUE(PgServer::Sql(Db(), "UPDATE corrupt SET " + damage[i] + " WHERE key = '" +
                                           key + "'::bytea"));
    const std::string before =
        PgServer::Value("SELECT md5(corrupt::text) FROM corrupt WHERE key = '" + key + "'::bytea");
    ClaimRequest r;
    r.key = key;
    auto c = store->Claim(r);
    EXPECT_EQ(c.status().code(), StatusCode::kDataLoss)
        << damage[i] << ": " << (c.ok() ? "answered outcome " + std::to_string(static_cast<int>(c->outcome))
                                        : c.status().ToString());
    EXPECT_EQ(PgServer::Value("SELECT md5(corrupt::text) FROM corrupt WHERE key = '" + key + "'::bytea"),
              before)
        << damage[i] << ": the claim changed a record it cannot decode";
  }
  // A scan lists each with why, beside the records it reads (it skipped them
  // silently: inspect --prefix showed nothing of a key whose claims all failed).
  (void)MustClaim(*store, "fine");
  // Rows whose key no call can name (empty, over 1024 bytes), written by hand,
  // are not listed: no claim meets them and no Forget could remove them.
  for (const std::string k : {"''::bytea", "convert_to(repeat('L', 2000), 'UTF8')"}) {
    ASSERT_TRUE(PgServer::Sql(
        Db(), "INSERT INTO corrupt (key, state, token, fence, attempt, lease_deadline, "
              "retention_deadline, fingerprint, status, result) SELECT " + k +
              ", state, token, fence, attempt, lease_deadline, retention_deadline, fingerprint, "
              "status, result FROM corrupt WHERE key = 'fine'::bytea")) << k;
  }
  auto scan = store->Scan("", 100);
  ASSERT_TRUE(scan.ok()) << scan.status();
  ASSERT_EQ(scan->records.size(), 1u);
  EXPECT_EQ(scan->records[0].key, "fine");
  // Nor do they count against the limit (LIMIT counted them, then they were
  // dropped: a scan of 1 could list nothing). In a table of their own, written
  // first, so that a scan meets them first.
  auto fresh = Open("&table=unnameable");
  ASSERT_NE(fresh, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "TRUNCATE unnameable"));
  for (const std::string k : {"''::bytea", "convert_to(repeat('L', 2000), 'UTF8')"}) {
    ASSERT_TRUE(PgServer::Sql(
        Db(), "INSERT INTO unnameable (key, state, token, fence, attempt, lease_deadline, "
              "retention_deadline, fingerprint, status, result) VALUES (" + k +
              ", 1, 7, 1, 1, 9999999999999, 9999999999999, ''::bytea, 0, ''::bytea)")) << k;
  }
  (void)MustClaim(*fresh, "a");
  auto first = fresh->Scan("", 1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(first->records.size(), 1u);
  EXPECT_EQ(first->records[0].key, "a");
  std::map<std::string, std::string> why;
  for (const UndecodableRecord& u : scan->undecodable) why[u.key] = u.why;
  EXPECT_EQ(why, (std::map<std::string, std::string>{{"c0", "state 9 is not 1 to 3"},
                                                     {"c1", "status 7 is not 0 to 2"},
                                                     {"c2", "fence -5 is not positive"},
                                                     {"c3", "token 0"},
                                                     {"c4", "token 0"},
                                                     {"c5", "state 9 is not 1 to 3"}}));
  for (const std::string k : {"c4", "c5"}) {
    EXPECT_EQ(store->Inspect(k).status().code(), StatusCode::kDataLoss) << k;
  }
  EXPECT_EQ(store->Scan("c", 2)->size(), 2u) << "the limit counts both";
  auto one = store->Inspect("c0");
  EXPECT_EQ(one.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(one.status().message().find("(state 9 is not 1 to 3)"), std::string::npos)
      << one.status();

  // Forget removes each, without --force even when its columns show a running
  // lease (token 0 is no owner): refused as leased, and forced it became a fence
  // floor still undecodable, hidden from Scan, failing every claim.
  (void)MustClaim(*store, "c-leased");
  ASSERT_TRUE(PgServer::Sql(Db(), "UPDATE corrupt SET token = 0 WHERE key = 'c-leased'::bytea"));
  for (const std::string key : {"c0", "c1", "c2", "c3", "c-leased"}) {
    auto f = store->Forget(key);
    ASSERT_TRUE(f.ok()) << key << ": " << f.status();
    EXPECT_TRUE(*f) << key;
    EXPECT_EQ(PgServer::Value("SELECT count(*) FROM corrupt WHERE key = '" + key + "'::bytea"), "0")
        << key;
    const ClaimResult again = MustClaim(*store, key);
    EXPECT_TRUE(again.acquired()) << key;
    EXPECT_EQ(again.attempt, 1u) << key;
  }
}

// Not only class 23 quotes values: a data exception words the value it could not
// take ("invalid input syntax for type bigint: \"<the result>\""), and a trigger
// may RAISE anything of NEW. Both reached the worker's log whole.
TEST_F(PostgresStoreTest, NoErrorOfTheStoresStatementsQuotesTheRow) {
  auto store = Open("&table=cast_checked");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "ALTER TABLE cast_checked ADD CONSTRAINT numeric_results "
                                  "CHECK (state <> 2 OR result = ''::bytea OR "
                                  "encode(result, 'escape')::bigint >= 0)"));
  ClaimResult c = MustClaim(*store, "order-78");
  auto w = store->Complete("order-78", c.token, 1h, CompletionStatus::kOk, "card=4111-1111");
  ASSERT_FALSE(w.ok());
  std::string m = w.status().message();
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status();
  EXPECT_NE(m.find("data exception"), std::string::npos) << m;
  EXPECT_NE(m.find("SQLSTATE 22P02"), std::string::npos) << m;
  EXPECT_EQ(m.find("4111"), std::string::npos) << m;

  auto traced = Open("&table=raised");
  ASSERT_NE(traced, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(),
      "CREATE FUNCTION raise_result() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
      "IF NEW.state = 2 THEN RAISE EXCEPTION 'refused %', encode(NEW.result, 'escape'); END IF; "
      "RETURN NEW; END $$; "
      "CREATE TRIGGER raise_result BEFORE UPDATE ON raised FOR EACH ROW "
      "EXECUTE FUNCTION raise_result()"));
  // The message of a completion the trigger refuses.
  auto refused = [&](const std::string& key, const std::string& result) {
    const ClaimResult held = MustClaim(*traced, key);
    auto done = traced->Complete(key, held.token, 1h, CompletionStatus::kOk, result);
    EXPECT_FALSE(done.ok()) << key;
    return done.ok() ? std::string() : done.status().message();
  };
  m = refused("order-79", "card=5500-0000");
  EXPECT_NE(m.find("raised by PL/pgSQL"), std::string::npos) << m;
  EXPECT_NE(m.find("SQLSTATE P0001"), std::string::npos) << m;
  EXPECT_EQ(m.find("5500"), std::string::npos) << m;
  // A RAISE may choose a SQLSTATE of a class whose own messages name objects
  // only: raised inside a trigger, its words are hidden all the same.
  ASSERT_TRUE(PgServer::Sql(Db(),
      "CREATE OR REPLACE FUNCTION raise_result() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
      "IF NEW.state = 2 THEN RAISE EXCEPTION 'refused %', encode(NEW.result, 'escape') "
      "USING ERRCODE = 'XX000', DETAIL = 'key ' || encode(NEW.key, 'escape'); END IF; "
      "RETURN NEW; END $$"));
  m = refused("order-80", "card=3400-0000");
  EXPECT_NE(m.find("raised inside a function or trigger"), std::string::npos) << m;
  EXPECT_NE(m.find("SQLSTATE XX000"), std::string::npos) << m;
  EXPECT_EQ(m.find("3400"), std::string::npos) << m;
  EXPECT_EQ(m.find("order-80"), std::string::npos) << m;
  // A class that names objects only is shown as the server words it.
  ASSERT_TRUE(PgServer::Sql(Db(), "ALTER TABLE raised DROP COLUMN result"));
  auto r = traced->Inspect("order-79");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("column r.result does not exist"), std::string::npos)
      << r.status();
}

// A CHECK constraint added to the store's table by hand: the completion that
// breaks it fails, and the server's DETAIL ("Failing row contains (...)")
// showed the key, the owner's token and the handler's result in the error (and
// so in the worker's log): the result may be anything the handler wrote. The
// constraint is named instead; nothing of the row is shown.
TEST_F(PostgresStoreTest, AnIntegrityViolationNamesTheConstraintNotTheRow) {
  auto store = Open("&table=checked");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(PgServer::Sql(Db(), "ALTER TABLE checked ADD CONSTRAINT short_results "
                                  "CHECK (length(result) < 8)"));
  const ClaimResult c = MustClaim(*store, "order-77");
  auto w = store->Complete("order-77", c.token, 1h, CompletionStatus::kOk, "card 4242-4242-4242");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kInvalidArgument) << w.status();
  const std::string m = w.status().message();
  EXPECT_NE(m.find("violates check constraint \"short_results\""), std::string::npos) << m;
  EXPECT_EQ(m.find("(constraint"), std::string::npos) << "named once: " << m;
  EXPECT_NE(m.find("it may quote the row's values"), std::string::npos) << m;
  EXPECT_EQ(m.find("4242"), std::string::npos) << m;
  EXPECT_EQ(m.find(c.token.ToHex()), std::string::npos) << m;
  EXPECT_EQ(m.find(std::to_string(c.token.value)), std::string::npos) << m;
  EXPECT_EQ(m.find("Failing row"), std::string::npos) << m;
  // The record is as the claim left it.
  auto rec = store->Inspect("order-77");
  ASSERT_TRUE(rec.ok() && rec->has_value()) << rec.status();
  EXPECT_EQ((*rec)->state, RecordState::kInProgress);
}

// A fence or an attempt count at the largest its column holds (bigint 2^63 - 1,
// integer 2^31 - 1) cannot be raised by a takeover. The claim failed with the
// server's bare "bigint out of range" as InvalidArgument, naming neither the key
// nor what is out of range (the Redis store refuses its own limits as a record
// it cannot take further, DataLoss). Nothing may change; one below the limit
// still works.
TEST_F(PostgresStoreTest, AFenceOrAttemptAtItsLargestIsRefusedNamingItNothingChanged) {
  auto store = Open("&table=limits");
  ASSERT_NE(store, nullptr);
  struct Case {
    std::string key, set, word, value;
  };
  const std::vector<Case> cases = {
      {"lf", "fence = 9223372036854775807", "fence", "9223372036854775807"},
      {"la", "attempt = 2147483647", "attempt", "2147483647"},
  };
  for (const Case& k : cases) {
    ClaimResult c = MustClaim(*store, k.key);
    ASSERT_TRUE(c.acquired());
    ASSERT_TRUE(store->Release(k.key, c.token, 600s).ok());
    ASSERT_TRUE(PgServer::Sql(Db(), "UPDATE limits SET " + k.set + " WHERE key = '" + k.key + "'::bytea"));
    const std::string row = "SELECT md5(limits::text) FROM limits WHERE key = '" + k.key + "'::bytea";
    const std::string before = PgServer::Value(row);
    auto again = store->Claim(ClaimRequest{.key = k.key});
    EXPECT_EQ(again.status().code(), StatusCode::kDataLoss)
        << k.word << ": " << (again.ok() ? "answered outcome " + std::to_string(static_cast<int>(again->outcome))
                                         : again.status().ToString());
    EXPECT_NE(again.status().message().find(k.word + " " + k.value), std::string::npos) << again.status();
    EXPECT_NE(again.status().message().find("\"" + k.key + "\""), std::string::npos) << again.status();
    EXPECT_EQ(PgServer::Value(row), before) << k.word << ": the refused claim changed the record";
  }
  // One below the largest: the takeover gets the largest.
  ASSERT_TRUE(PgServer::Sql(Db(), "UPDATE limits SET fence = 9223372036854775806, attempt = 5 "
                                  "WHERE key = 'lf'::bytea; UPDATE limits SET attempt = 2147483646, "
                                  "fence = 5 WHERE key = 'la'::bytea"));
  ClaimResult f = MustClaim(*store, "lf");
  EXPECT_TRUE(f.acquired());
  EXPECT_EQ(f.fence, 9223372036854775807ull);
  ClaimResult a = MustClaim(*store, "la");
  EXPECT_TRUE(a.acquired());
  EXPECT_EQ(a.attempt, 2147483647u);
}

// The same in a batch (one pipeline, one transaction): the limit named as a single
// claim names it, the connection rolled back and usable, and the batch's other
// claim (made before it, in byte order) not held.
TEST_F(PostgresStoreTest, ABatchWithAnAttemptAtItsLargestFailsNamingItAndHoldsNothing) {
  auto store = Open("&table=limits_batch&pool=1");
  ASSERT_NE(store, nullptr);
  ClaimResult c = MustClaim(*store, "lb");
  ASSERT_TRUE(store->Release("lb", c.token, 600s).ok());
  ASSERT_TRUE(PgServer::Sql(Db(), "UPDATE limits_batch SET attempt = 2147483647 WHERE key = 'lb'::bytea"));
  std::vector<ClaimRequest> reqs(3);
  reqs[0].key = "lz";
  reqs[1].key = "lb";
  reqs[2].key = "la";  // claimed first (byte order), then lb fails
  auto res = store->ClaimBatch(reqs);
  ASSERT_FALSE(res.ok());
  EXPECT_EQ(res.status().code(), StatusCode::kDataLoss) << res.status();
  EXPECT_NE(res.status().message().find("attempt 2147483647"), std::string::npos) << res.status();
  EXPECT_NE(res.status().message().find("\"lb\""), std::string::npos) << res.status();
  for (const char* key : {"la", "lz"}) {
    ClaimResult r = MustClaim(*store, key);
    EXPECT_TRUE(r.acquired()) << key << " is held by the failed batch";
    EXPECT_EQ(r.attempt, 1u) << key;
  }
}

// A read-only server (a hot standby, or default_transaction_read_only on for the
// database or the role) cannot take a claim: every claim writes. The store
// opened on a table made before, and then every claim failed as INTERNAL ("cannot
// execute INSERT in a read-only transaction"); a new table failed the migration as
// INTERNAL. Refused at open, naming it, like any other setting a worker cannot
// run with.
TEST_F(PostgresStoreTest, AReadOnlyDatabaseIsRefusedAtOpenNamingIt) {
  ASSERT_NE(Open("&table=ro"), nullptr);  // the table exists
  ASSERT_TRUE(PgServer::Sql("postgres", "ALTER DATABASE " + Db() +
                                            " SET default_transaction_read_only = on"));
  for (const std::string table : {"ro", "ro_new"}) {
    auto s = OpenStore(Uri("&table=" + table));
    EXPECT_EQ(s.status().code(), StatusCode::kFailedPrecondition)
        << table << ": " << (s.ok() ? "opened" : s.status().ToString());
    EXPECT_NE(s.status().message().find("read-only"), std::string::npos) << s.status();
    EXPECT_NE(s.status().message().find("default_transaction_read_only"), std::string::npos)
        << s.status();
    if (s.ok()) {
      auto c = (*s)->Claim(ClaimRequest{.key = "k"});
      EXPECT_TRUE(c.ok()) << "opened, then the claim failed: " << c.status();
    }
  }
  // Opened to read (`dedup inspect`), a read-only server is what a replica is.
  auto reader = OpenStore(Uri("&table=ro"), OpenOptions{.read_only = true});
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto rec = (*reader)->Inspect("k");
  EXPECT_TRUE(rec.ok()) << rec.status();
}

// `dedup inspect` and `dedup forget` open their store with must_exist (store.h:
// "a mistyped path must not create one"). The PostgreSQL store ignored it: a
// mistyped ?table= (or ?schema=) made a new, empty table (and schema) and then
// reported every key absent.
TEST_F(PostgresStoreTest, AnAdminOpenOfAMissingTableCreatesNothing) {
  for (const OpenOptions& o : {OpenOptions{.must_exist = true}, OpenOptions{.read_only = true}}) {
    auto s = OpenStore(Uri("&schema=typo_schema&table=typo"), o);
    EXPECT_EQ(s.status().code(), StatusCode::kNotFound)
        << "read_only=" << o.read_only << ": " << (s.ok() ? "opened" : s.status().ToString());
    EXPECT_NE(s.status().message().find("typo_schema.typo"), std::string::npos) << s.status();
    EXPECT_EQ(PgServer::Value("SELECT to_regnamespace('typo_schema') IS NULL"), "t")
        << "read_only=" << o.read_only << ": the open made a schema";
  }
  ASSERT_NE(Open("&table=there"), nullptr);
  auto s = OpenStore(Uri("&table=there"), OpenOptions{.must_exist = true});
  EXPECT_TRUE(s.ok()) << s.status();
}

// ---- options checked at construction ------------------------------------------------

// Values libpq or the server would refuse only when connecting are refused when
// the store is built, as InvalidArgument naming them (not UNAVAILABLE, which a
// worker retries forever as if the server were down).
TEST_F(PostgresStoreTest, OptionsTheServerWouldRefuseAreInvalidArguments) {
  for (const std::string bad : {"&sslmode=bogus", "&timeout=30d"}) {
    auto s = OpenStore(Uri(bad));
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument) << bad << ": " << s.status();
    const std::string param = bad.substr(1, bad.find('=') - 1);
    EXPECT_NE(s.status().message().find(param), std::string::npos) << s.status();
    EXPECT_EQ(s.status().ToString().find(kPassword), std::string::npos) << s.status();
  }
}

// libpq takes every connection field as a C string: a NUL (from %00 in a URI)
// would cut the user, database or password there and connect as someone else
// ("dedup\0x" as "dedup"). Refused, naming the field and never the password.
TEST_F(PostgresStoreTest, NulBytesInConnectionFieldsAreRefused) {
  PostgresStoreOptions base;
  base.port = kPort;
  base.user = "dedup";
  base.password = kPassword;
  base.database = Db();
  base.expire_interval = Millis(0);
  ASSERT_TRUE(OpenPostgresStore(base).ok());
  struct Case {
    const char* field;
    std::function<void(PostgresStoreOptions&)> set;
  };
  const std::vector<Case> cases = {
      {"user", [](PostgresStoreOptions& o) { o.user = std::string("dedup\0x", 7); }},
      {"database", [](PostgresStoreOptions& o) { o.database = std::string("dedup\0x", 7); }},
      {"password", [](PostgresStoreOptions& o) { o.password = std::string(kPassword) + std::string("\0x", 2); }},
      {"host", [](PostgresStoreOptions& o) { o.host = std::string("127.0.0.1\0x", 11); }},
  };
  for (const Case& c : cases) {
    PostgresStoreOptions o = base;
    c.set(o);
    auto s = OpenPostgresStore(o);
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument)
        << c.field << ": " << (s.ok() ? "opened" : s.status().ToString());
    EXPECT_NE(s.status().message().find(c.field), std::string::npos) << s.status();
    EXPECT_EQ(s.status().ToString().find(kPassword), std::string::npos) << s.status();
  }
  auto uri = OpenStore("postgres://dedup%00x:" + std::string(kPassword) + "@127.0.0.1:" +
                       std::to_string(kPort) + "/dedup");
  EXPECT_EQ(uri.status().code(), StatusCode::kInvalidArgument)
      << (uri.ok() ? "opened as user dedup" : uri.status().ToString());
}

// ---- the pool ----------------------------------------------------------------------

TEST_F(PostgresStoreTest, SmallPoolServesManyThreads) {
  auto store = Open("&table=pool&pool=3");
  ASSERT_NE(store, nullptr);
  std::atomic<int> acquired{0}, errors{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 24; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 40; ++i) {
        std::string key = "p:" + std::to_string(t) + ":" + std::to_string(i);
        ClaimRequest r;
        r.key = key;
        auto c = store->Claim(r);
        if (!c.ok() || !c->acquired()) {
          ++errors;
          continue;
        }
        ++acquired;
        auto w = store->Complete(key, c->token, 60s, CompletionStatus::kOk, "");
        if (!w.ok() || *w != WriteResult::kOk) ++errors;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(acquired.load(), 24 * 40);
  EXPECT_LE(std::stoi(PgServer::Value("SELECT count(*) FROM pg_stat_activity WHERE "
                                      "application_name = 'dedup' AND state IS NOT NULL AND datname = current_database()")),
            3 + 1) << "at most pool connections";
}

// A pool too small for the transactions that run at once is refused at start-up
// (`dedup worker --sql-output` passes its --concurrency): with pool=2 and
// --concurrency 4, three of four handlers waited for a connection until the
// timeout, each wait counted as an attempt, and were dead-lettered unrun.
TEST_F(PostgresStoreTest, APoolTooSmallSaysAtOnceItCannotRunTransactions) {
  auto one = Open("&pool=1");
  ASSERT_NE(one, nullptr);
  Status s = one->CanRunTransactions(1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("pool=1"), std::string::npos) << s;
  auto two = Open("&pool=2");
  ASSERT_NE(two, nullptr);
  EXPECT_TRUE(two->CanRunTransactions(1).ok());
  s = two->CanRunTransactions(4);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("use pool=5"), std::string::npos) << s;
  auto five = Open("&pool=5");
  ASSERT_NE(five, nullptr);
  EXPECT_TRUE(five->CanRunTransactions(4).ok());
}

// A transactional handler holds a pool connection for as long as it runs. When
// every connection is held so, the heartbeat's extend waits for one, the lease
// runs out under a running handler, another worker takes the key over and runs
// the handler a second time (the first one's commit is then refused): SPEC
// defect 2 of the textbook guard, which the heartbeat exists to close. Here a
// pool of 2 and two handlers running longer than the lease.
TEST_F(PostgresTxTest, HeartbeatsAreNotStarvedByTransactionsHoldingThePool) {
  ASSERT_TRUE(PgServer::Sql(Db(), "TRUNCATE tx"));
  auto store = Open("&table=tx&pool=2");
  auto other = Open("&table=tx");
  ASSERT_NE(store, nullptr);
  ASSERT_NE(other, nullptr);
  BufferOptions bo;
  bo.lease = 900ms;
  Buffer buffer(store.get(), bo);
  std::atomic<int> runs{0};
  std::vector<Processed> done(2);
  std::vector<std::thread> workers;
  for (int i = 0; i < 2; ++i) {
    workers.emplace_back([&, i] {
      const std::string key = "hb" + std::to_string(i);
      done[i] = ProcessOnceInTransaction(buffer, *store, key, "", InsertThen(key, [&] {
        ++runs;
        std::this_thread::sleep_for(2400ms);  // longer than the lease: heartbeats keep it
        return HandlerResult::Done();
      }));
    });
  }
  std::this_thread::sleep_for(1600ms);
  for (int i = 0; i < 2; ++i) {
    ClaimResult c = MustClaim(*other, "hb" + std::to_string(i));
    EXPECT_EQ(c.outcome, ClaimOutcome::kBusy)
        << "hb" << i << ": the lease of a running, heartbeated handler ran out (outcome "
        << static_cast<int>(c.outcome) << "): another worker took the key over";
    if (c.acquired()) ++runs;
  }
  for (auto& t : workers) t.join();
  EXPECT_EQ(runs.load(), 2) << "each handler runs once";
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(done[i].action, BrokerAction::kAck) << "hb" << i << ": " << done[i].reason;
    EXPECT_EQ(Orders("hb" + std::to_string(i)), "1");
  }
}

// A caller waiting for a pooled connection while every one it may take is busy
// (here: a second transactional handler while a first holds pool=2's one
// connection for transactions) waits at most the store's timeout, then
// DEADLINE_EXCEEDED naming the pool; and a caller that stops (StopWaiting) ends
// that wait within its grace, as any other wait of the store. Before: it waited
// for as long as the holder held (for ever behind a handler that never ends).
TEST_F(PostgresTxTest, AWaitForAPooledConnectionEndsAtTheTimeoutOrAtAStop) {
  for (const bool stop : {false, true}) {
    SCOPED_TRACE(stop ? "StopWaiting(250ms), timeout 20s" : "timeout 1s");
    auto store = Open(std::string("&table=tx&pool=2&timeout=") + (stop ? "20s" : "1s"));
    ASSERT_NE(store, nullptr);
    const std::string k1 = stop ? "ps1" : "pt1", k2 = stop ? "ps2" : "pt2";
    ClaimResult c1 = MustClaim(*store, k1);
    ClaimResult c2 = MustClaim(*store, k2);
    ASSERT_TRUE(c1.acquired() && c2.acquired());
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    std::promise<void> running;
    auto holder = std::async(std::launch::async, [&] {
      return store->RunInTransaction(k1, c1.token, c1.fence, c1.attempt, 600s,
                                     [&](PostgresTransaction&) {
                                       running.set_value();
                                       released.wait_for(30s);
                                       return HandlerResult::Done();
                                     });
    });
    ASSERT_EQ(running.get_future().wait_for(10s), std::future_status::ready);
    const auto t0 = std::chrono::steady_clock::now();
    auto waiter = std::async(std::launch::async, [&] {
      return store->RunInTransaction(k2, c2.token, c2.fence, c2.attempt, 600s,
                                     [](PostgresTransaction&) { return HandlerResult::Done(); });
    });
    auto stopped_at = t0;
    if (stop) {
      std::this_thread::sleep_for(300ms);
      stopped_at = std::chrono::steady_clock::now();
      store->StopWaiting(250ms);
    }
    const bool answered = waiter.wait_for(5s) == std::future_status::ready;
    const auto took = std::chrono::steady_clock::now() - stopped_at;
    release.set_value();
    auto h = holder.get();
    auto w = waiter.get();
    ASSERT_TRUE(answered) << "the wait for a pooled connection still went on 5 s later";
    EXPECT_TRUE(h.ok()) << h.status();
    if (stop) {
      EXPECT_EQ(w.status().code(), StatusCode::kAborted) << w.status();
      EXPECT_NE(w.status().message().find("given up"), std::string::npos) << w.status();
      EXPECT_LT(took, 1s) << "grace 250ms";
    } else {
      EXPECT_EQ(w.status().code(), StatusCode::kDeadlineExceeded) << w.status();
      EXPECT_GE(took, 900ms) << "timeout 1s";
      EXPECT_LT(took, 2500ms) << "timeout 1s";
    }
    EXPECT_NE(w.status().message().find("pool"), std::string::npos) << w.status();
  }
}

// The same wait seen through ProcessOnceInTransaction (`dedup worker
// --sql-output`): a handler that got no pooled connection for its transaction
// (DEADLINE_EXCEEDED: every one it may take was busy) never ran, and Processed
// says so. Before, `ran` was set before the transaction was asked for: true for a
// handler never called, and its reason said the outcome could not be recorded.
// A caller counting handler runs by it (tests/postgres_chaos_worker.cc) counted
// one, and a draining Consumer handed the message back at once (Retry(0), as one
// whose handler the drain stopped) instead of after the retry delay.
TEST_F(PostgresTxTest, AHandlerThatGotNoPooledConnectionDidNotRun) {
  auto store = Open("&table=tx&pool=2&timeout=1s");
  ASSERT_NE(store, nullptr);
  Buffer buffer(store.get());
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> running;
  auto holder = std::async(std::launch::async, [&] {
    return ProcessOnceInTransaction(buffer, *store, "nr1", "", [&](PostgresTransaction&) {
      running.set_value();
      released.wait_for(30s);
      return HandlerResult::Done();
    });
  });
  ASSERT_EQ(running.get_future().wait_for(10s), std::future_status::ready);
  std::atomic<int> runs{0};
  const TransactionalHandler counted = [&](PostgresTransaction&) {
    ++runs;
    return HandlerResult::Done();
  };
  Processed p = ProcessOnceInTransaction(buffer, *store, "nr2", "", counted);
  release.set_value();
  Processed h = holder.get();
  EXPECT_EQ(h.action, BrokerAction::kAck) << h.reason;
  EXPECT_TRUE(h.ran);
  EXPECT_EQ(runs.load(), 0);
  EXPECT_EQ(p.status.code(), StatusCode::kDeadlineExceeded) << p.status;
  EXPECT_EQ(p.action, BrokerAction::kRetry);
  EXPECT_FALSE(p.ran) << "the handler was never called; reason: " << p.reason;
  EXPECT_EQ(p.reason.find("recording the outcome"), std::string::npos) << p.reason;
  EXPECT_NE(p.reason.find("pool"), std::string::npos) << p.reason;
  // Its claim was given back: the next delivery runs the handler, once.
  Processed again = ProcessOnceInTransaction(buffer, *store, "nr2", "", counted);
  EXPECT_EQ(again.action, BrokerAction::kAck) << again.reason;
  EXPECT_TRUE(again.ran);
  EXPECT_EQ(runs.load(), 1);
}

// A DBA's idle_in_transaction_session_timeout shorter than a handler: the
// transaction is idle on the server while the handler works (its program runs, it
// waits for a service), and the server would end the session under it, so the
// message failed and was retried for ever. The store's connections are exempt.
TEST_F(PostgresTxTest, ADatabaseIdleInTransactionTimeoutDoesNotKillAHandler) {
  auto store = OpenDatabaseWith("idle", "idle_in_transaction_session_timeout = '300ms'");
  ASSERT_TRUE(store.ok()) << store.status();
  BufferOptions bo;
  bo.lease = 5s;
  Buffer buffer(store->get(), bo);
  for (const char* key : {"idle1", "idle2"}) {  // the second on a connection used before
    Processed p = ProcessOnceInTransaction(buffer, **store, key, "", [&](PostgresTransaction& tx) {
      auto r = tx.Exec("INSERT INTO orders (msg) VALUES ($1)", {std::string(key)});
      if (!r.ok()) return HandlerResult::Retry(r.status().ToString());
      std::this_thread::sleep_for(900ms);  // idle in the transaction, 3x the timeout
      return HandlerResult::Done();
    });
    EXPECT_EQ(p.action, BrokerAction::kAck) << key << ": " << p.reason;
  }
  std::string n;
  EXPECT_TRUE(PgServer::Sql("idle", "SELECT count(*) FROM orders", &n));
  EXPECT_EQ(n, "2");
}

// A result a record cannot hold (over kMaxResultBytes) was answered Retry: the
// message ran again and again for ever, each time rolled back. Now the writes are
// rolled back and the key completed as failed with the reason (dead-lettered);
// a Fail reason that long is recorded cut to fit, not retried for ever either.
TEST_F(PostgresTxTest, AnOversizedResultOrReasonIsAPermanentFailureNotARetryLoop) {
  BufferOptions bo;
  bo.lease = 5s;
  Buffer buffer(store_.get(), bo);
  const std::string huge(kMaxResultBytes + 10, 'r');
  int runs = 0;
  Processed p = ProcessOnceInTransaction(buffer, *store_, "big1", "", InsertThen("big1", [&] {
    ++runs;
    return HandlerResult::Done(huge);
  }));
  EXPECT_EQ(p.action, BrokerAction::kDeadLetter) << p.reason.substr(0, 300);
  EXPECT_NE(p.reason.find(std::to_string(huge.size())), std::string::npos) << p.reason.substr(0, 300);
  EXPECT_LE(p.reason.size(), kMaxResultBytes);
  EXPECT_EQ(Orders("big1"), "0") << "the effect of an outcome that cannot be recorded committed";
  auto rec = store_->Inspect("big1");
  ASSERT_TRUE(rec.ok() && rec->has_value()) << rec.status();
  EXPECT_EQ((*rec)->state, RecordState::kCompleted);
  EXPECT_EQ((*rec)->status, CompletionStatus::kFailed);
  Processed again = ProcessOnceInTransaction(buffer, *store_, "big1", "", InsertThen("big1", [&] {
    ++runs;
    return HandlerResult::Done();
  }));
  EXPECT_EQ(runs, 1) << "the message ran again";

  Processed f = ProcessOnceInTransaction(buffer, *store_, "big2", "", InsertThen("big2", [&] {
    return HandlerResult::Fail(huge);
  }));
  EXPECT_EQ(f.action, BrokerAction::kDeadLetter) << f.reason.substr(0, 300);
  EXPECT_TRUE(f.status.ok()) << f.status;
  EXPECT_EQ(Orders("big2"), "0");
  rec = store_->Inspect("big2");
  ASSERT_TRUE(rec.ok() && rec->has_value()) << rec.status();
  EXPECT_EQ((*rec)->state, RecordState::kCompleted);
  EXPECT_EQ((*rec)->status, CompletionStatus::kFailed);
  EXPECT_LE((*rec)->result.size(), kMaxResultBytes);
  EXPECT_EQ((*rec)->result.substr(0, 100), huge.substr(0, 100)) << "the reason's start is kept";
}

// A Fail reason too long for a record is kept cut to fit; the cut landed inside
// a character (the Buffer's own cut was fixed for this, the store's copy was
// not), so the recorded reason was not UTF-8 where the handler's was.
TEST_F(PostgresTxTest, AReasonCutToFitARecordSplitsNoCharacter) {
  Buffer buffer(store_.get());
  std::string reason = "x";  // then 2-byte characters: the cut lands inside one
  while (reason.size() <= kMaxResultBytes + 1000) reason += "\xc3\xbc";
  Processed f = ProcessOnceInTransaction(buffer, *store_, "cutchar", "",
                                         InsertThen("cutchar", [&] {
                                           return HandlerResult::Fail(reason);
                                         }));
  EXPECT_EQ(f.action, BrokerAction::kDeadLetter) << f.reason.substr(0, 300);
  EXPECT_TRUE(internal::IsValidUtf8(f.reason)) << f.reason.substr(f.reason.size() - 80);
  auto rec = store_->Inspect("cutchar");
  ASSERT_TRUE(rec.ok() && rec->has_value()) << rec.status();
  EXPECT_LE((*rec)->result.size(), kMaxResultBytes);
  EXPECT_TRUE(internal::IsValidUtf8((*rec)->result))
      << (*rec)->result.substr((*rec)->result.size() - 80);
  EXPECT_EQ((*rec)->result.substr(0, 1001), reason.substr(0, 1001));
}

// ---- a server restart during work ----------------------------------------------------

TEST_F(PostgresStoreTest, ServerRestartIsUnavailableFailsClosedThenResumes) {
  auto store = Open("&table=restart&pool=2&timeout=2s");
  ASSERT_NE(store, nullptr);
  BufferOptions bo;
  bo.lease = 3s;
  bo.retry_delay = 50ms;
  Buffer buffer(store.get(), bo);
  int runs = 0;
  auto handler = [&](ClaimGuard&) {
    ++runs;
    return HandlerResult::Done();
  };
  EXPECT_EQ(buffer.ProcessOnce("before", "", handler).action, BrokerAction::kAck);

  g_server->Stop();
  auto c = store->Claim(ClaimRequest{.key = "during"});
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable) << c.status();
  Processed p = buffer.ProcessOnce("during", "", handler);
  EXPECT_EQ(p.action, BrokerAction::kRetry) << "fail closed: never ack without the store";
  EXPECT_FALSE(p.ran);
  EXPECT_EQ(p.status.code(), StatusCode::kUnavailable) << p.status;

  ASSERT_TRUE(g_server->Start());
  Processed after;
  for (int i = 0; i < 100; ++i) {
    after = buffer.ProcessOnce("during", "", handler);
    if (after.action == BrokerAction::kAck) break;
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_EQ(after.action, BrokerAction::kAck) << after.reason;
  EXPECT_EQ(buffer.ProcessOnce("before", "", handler).action, BrokerAction::kAck);
  EXPECT_EQ(runs, 2) << "'before' is a duplicate after the restart, 'during' ran once";
  EXPECT_EQ(buffer.ProcessOnce("during", "", handler).claim.outcome, ClaimOutcome::kDuplicate);
}


// A restart (fast shutdown) while the pool sits idle: no call was in flight, so
// none should fail. Each idle connection already heard the server's goodbye
// (FATAL 57P01, then the end of the stream) before the next call; taking it from
// the pool as it was made the next call fail with Unavailable (one call per dead
// connection), though the server was back and nothing had been sent. The same
// for a pooled connection ended by pg_terminate_backend.
TEST_F(PostgresStoreTest, AServerRestartWhileThePoolIsIdleFailsNoLaterCall) {
  auto store = Open("&table=idlerestart&pool=2&timeout=2s");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(MustClaim(*store, "before").acquired());
  g_server->Stop();
  ASSERT_TRUE(g_server->Start());
  auto after = store->Claim(ClaimRequest{.key = "after-restart"});
  ASSERT_TRUE(after.ok()) << "the first call after the restart: " << after.status();
  EXPECT_TRUE(after->acquired());

  ASSERT_TRUE(PgServer::Sql(Db(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                  "WHERE application_name = 'dedup'"));
  for (int i = 0; i < 100; ++i) {  // until the backends are gone
    if (PgServer::Value("SELECT count(*) FROM pg_stat_activity WHERE application_name = "
                        "'dedup'") == "0") {
      break;
    }
    std::this_thread::sleep_for(20ms);
  }
  auto terminated = store->Claim(ClaimRequest{.key = "after-terminate"});
  ASSERT_TRUE(terminated.ok()) << "the first call after pg_terminate_backend: "
                               << terminated.status();
  EXPECT_TRUE(terminated->acquired());
}


// ---- a frozen server ------------------------------------------------------------------

// statement_timeout is the server's own clock: a server that does not run at all
// (SIGSTOP, a suspended VM, a network cut that drops packets) never sends its
// cancellation, and a call waited for its answer for as long as TCP let it (for
// ever on a quiet loopback). The store's `timeout` now bounds the wait on the
// client too: the call fails, its connection is closed, the effect unknown.
TEST_F(PostgresStoreTest, AClaimOnAFrozenServerFailsWithinItsTimeout) {
  auto store = Open("&table=frozen&pool=1&timeout=1s");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(MustClaim(*store, "warm").acquired());  // its one connection is open
  g_server->SignalAll(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  auto claim = std::async(std::launch::async, [&] { return store->Claim(ClaimRequest{.key = "f1"}); });
  const bool answered = claim.wait_for(8s) == std::future_status::ready;
  const auto waited = std::chrono::steady_clock::now() - t0;
  g_server->SignalAll(SIGCONT);
  auto c = claim.get();
  ASSERT_TRUE(answered) << "the claim still waited on the frozen server after 8 s (timeout=1s)";
  EXPECT_EQ(c.status().code(), StatusCode::kDeadlineExceeded)
      << (c.ok() ? "answered outcome " + std::to_string(static_cast<int>(c->outcome)) : c.status().ToString());
  EXPECT_LT(waited, 3s) << "timeout=1s";
  EXPECT_EQ(c.status().ToString().find(kPassword), std::string::npos) << c.status();
  // Thawed: the next call opens a new connection and works.
  StatusOr<ClaimResult> after = Status::Unavailable("not tried");
  for (int i = 0; i < 50 && !after.ok(); ++i, std::this_thread::sleep_for(100ms)) {
    after = store->Claim(ClaimRequest{.key = "f2"});
  }
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->acquired());
}

// Store::StopWaiting (a worker draining after SIGTERM, store.h): a call waiting on
// a frozen server is given up `grace` after the stop, with Aborted; a later one,
// on the server that let a call wait out its grace, at once, sending nothing.
// The PostgreSQL store kept its own timeouts, and on a frozen server waited for
// ever.
TEST_F(PostgresStoreTest, AClaimWaitingOnAFrozenServerIsGivenUpWhenItsCallerStops) {
  auto store = Open("&table=stopwait&pool=2&timeout=20s");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(MustClaim(*store, "warm").acquired());
  g_server->SignalAll(SIGSTOP);
  auto claim = std::async(std::launch::async, [&] { return store->Claim(ClaimRequest{.key = "s1"}); });
  std::this_thread::sleep_for(300ms);
  const auto stop = std::chrono::steady_clock::now();
  store->StopWaiting(250ms);
  const bool answered = claim.wait_for(5s) == std::future_status::ready;
  const auto took = std::chrono::steady_clock::now() - stop;
  StatusOr<ClaimResult> later = Status::Unavailable("not tried");
  auto later_took = 0ms;
  if (answered) {
    const auto t1 = std::chrono::steady_clock::now();
    later = store->Claim(ClaimRequest{.key = "s2"});
    later_took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t1);
  }
  g_server->SignalAll(SIGCONT);
  auto c = claim.get();
  ASSERT_TRUE(answered) << "the claim still waited on the frozen server 5 s after StopWaiting(250ms)";
  EXPECT_EQ(c.status().code(), StatusCode::kAborted)
      << (c.ok() ? "answered outcome " + std::to_string(static_cast<int>(c->outcome)) : c.status().ToString());
  EXPECT_NE(c.status().message().find("given up"), std::string::npos) << c.status();
  EXPECT_LT(took, 1s) << "grace 250ms";
  EXPECT_EQ(later.status().code(), StatusCode::kAborted) << later.status();
  EXPECT_LT(later_took, 500ms) << "a call after a give-up on that server waits no more";
}

// Destroying a store whose server froze: its background expiry is waiting on the
// server (a DELETE sent, no answer), its idle connections hold nothing. The
// destructor joins the expiry thread; nothing should make it wait on the server
// (a worker exiting after a drain would hang there for timeout + 1 s).
TEST_F(PostgresStoreTest, DestroyingAStoreOnAFrozenServerDoesNotWaitForIt) {
  auto store = Open("&table=frozendtor&pool=2&timeout=5s&expire_interval=20ms");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(MustClaim(*store, "warm").acquired());
  std::this_thread::sleep_for(100ms);  // the expiry runs every 20 ms
  g_server->SignalAll(SIGSTOP);
  std::this_thread::sleep_for(200ms);  // an expiry round is waiting now
  const auto t0 = std::chrono::steady_clock::now();
  auto done = std::async(std::launch::async, [&] { store.reset(); });
  const bool ended = done.wait_for(10s) == std::future_status::ready;
  const auto took = std::chrono::steady_clock::now() - t0;
  g_server->SignalAll(SIGCONT);
  done.get();
  ASSERT_TRUE(ended) << "the destructor still waited 10 s after the server froze";
  EXPECT_LT(took, 1s) << "waited "
                      << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                      << " ms on a frozen server";
}

}  // namespace
}  // namespace dedup
