// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The PostgreSQL phase of `dedup bench`: what the store costs, and what
// exactly-once effects cost, on the server in DEDUP_BENCH_POSTGRES_URI
// (scripts/bench.sh starts one on 127.0.0.1:5444). Contenders run interleaved,
// round by round, each with the same threads for the same time:
//
//   claim                 Claim of a new key
//   claim+complete        Claim then Complete
//   claim (ClaimBatch 16) ClaimBatch of 16 new keys (one transaction), counted
//                         as 16 claims
//   insert alone          the business INSERT on its own (autocommit): the effect
//                         with no guard at all
//   insert, then complete ProcessOnce (Buffer) whose handler INSERTs in autocommit:
//                         the guard beside the effect (at-least-once effect)
//   insert + complete, 1 tx  ProcessOnceInTransaction: the INSERT and the
//                         completion commit together (exactly-once effect)
//
// The ratio "1 tx / insert alone" (median of the per-round ratios) is what
// exactly-once costs against doing the write with no guard. Then expiry: rows
// past their retention are bulk-loaded and ExpireNow() deletes them in batches.

#ifdef DEDUP_WITH_POSTGRES

#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include "bench/bench.h"
#include "dedup/buffer.h"
#include "dedup/postgres_store.h"

namespace dedup::bench {
namespace {

struct PgContender {
  PgContender(std::string n, std::function<bool(int, uint64_t)> f, int per = 1)
      : name(std::move(n)), op(std::move(f)), per_call(per) {}
  std::string name;
  // One call (one message); false when it failed.
  std::function<bool(int thread, uint64_t n)> op;
  int per_call = 1;            // messages one call handles (op's n .. n + per_call - 1)
  std::vector<double> rates;  // messages/s per round
  uint64_t errors = 0;
};

std::string Conninfo(const std::string& uri) {
  const size_t q = uri.find('?');
  return q == std::string::npos ? uri : uri.substr(0, q);
}

// Runs `c` on `threads` threads for `seconds`; returns ops/s.
double Measure(PgContender& c, int threads, double seconds) {
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> done{0}, errors{0};
  std::vector<std::thread> ts;
  const auto t0 = Clk::now();
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      const uint64_t base = NextKeyBlock();
      uint64_t n = 0, e = 0;
      while (!stop.load(std::memory_order_relaxed)) {
        if (!c.op(t, base + n)) ++e;
        n += static_cast<uint64_t>(c.per_call);
      }
      done += n;
      errors += e;
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& th : ts) th.join();
  c.errors += errors.load();
  return static_cast<double>(done.load()) / Seconds(Clk::now() - t0);
}

}  // namespace

void RunPostgres(BenchContext& ctx) {
  const char* env = std::getenv("DEDUP_BENCH_POSTGRES_URI");
  if (env == nullptr || *env == '\0') {
    ctx.Skip("postgres: DEDUP_BENCH_POSTGRES_URI is not set (scripts/bench.sh starts a server)");
    return;
  }
  const std::string uri = env;
  const int threads = 4;
  std::string table = "bench_" + Token::Random().ToHex().substr(0, 8);
  auto opened = OpenPostgresStore(uri + (uri.find('?') == std::string::npos ? "?" : "&") +
                                  "table=" + table + "&pool=" + std::to_string(threads + 1) +
                                  "&expire_interval=0");
  if (!opened.ok()) {
    ctx.Skip("postgres: " + opened.status().ToString());
    return;
  }
  PostgresStore& store = **opened;
  const std::string effects = table + "_effects";
  // One plain connection per thread for the INSERTs that are not in the store's
  // transaction, and one for setup.
  std::vector<PGconn*> conns;
  for (int i = 0; i <= threads; ++i) conns.push_back(PQconnectdb(Conninfo(uri).c_str()));
  auto exec = [](PGconn* c, const std::string& sql) {
    PGresult* r = PQexec(c, sql.c_str());
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK || PQresultStatus(r) == PGRES_TUPLES_OK;
    PQclear(r);
    return ok;
  };
  if (PQstatus(conns[threads]) != CONNECTION_OK ||
      !exec(conns[threads], "CREATE TABLE " + effects + " (msg text NOT NULL, fence bigint)")) {
    ctx.Skip("postgres: cannot create the effects table");
    for (PGconn* c : conns) PQfinish(c);
    return;
  }
  auto insert = [&](PGconn* c, const std::string& msg, uint64_t fence) {
    const std::string f = std::to_string(fence);
    const char* v[] = {msg.c_str(), f.c_str()};
    PGresult* r = PQexecParams(c, ("INSERT INTO " + effects + " (msg, fence) VALUES ($1, $2)").c_str(),
                               2, nullptr, v, nullptr, nullptr, 0);
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok;
  };
  BufferOptions bo;
  bo.lease = Millis(60'000);
  Buffer buffer(&store, bo);
  const std::string tx_sql = "INSERT INTO " + effects + " (msg, fence) VALUES ($1, $2)";

  std::vector<PgContender> cs;
  cs.push_back({"claim", [&](int, uint64_t n) {
                  return store.Claim(BenchClaim(TaskKey(n))).ok();
                }});
  cs.push_back({"claim+complete", [&](int, uint64_t n) {
                  const std::string k = TaskKey(n);
                  auto c = store.Claim(BenchClaim(k));
                  if (!c.ok() || !c->acquired()) return false;
                  auto w = store.Complete(k, c->token, Millis(600'000), CompletionStatus::kOk, "");
                  return w.ok() && *w == WriteResult::kOk;
                }});
  cs.push_back({"insert alone", [&](int t, uint64_t n) { return insert(conns[t], TaskKey(n), 0); }});
  cs.push_back({"insert, then complete", [&](int t, uint64_t n) {
                  const std::string k = TaskKey(n);
                  Processed p = buffer.ProcessOnce(k, "", [&](ClaimGuard& g) {
                    return insert(conns[t], k, g.fence()) ? HandlerResult::Done()
                                                          : HandlerResult::Retry("insert failed");
                  });
                  return p.action == BrokerAction::kAck;
                }});
  cs.push_back({"insert + complete, 1 tx", [&](int, uint64_t n) {
                  const std::string k = TaskKey(n);
                  Processed p = ProcessOnceInTransaction(buffer, store, k, "", [&](PostgresTransaction& tx) {
                    auto r = tx.Exec(tx_sql, {k, std::to_string(tx.fence())});
                    return r.ok() ? HandlerResult::Done() : HandlerResult::Retry("insert failed");
                  });
                  return p.action == BrokerAction::kAck;
                }});
  cs.push_back({"claim (ClaimBatch 16)",
                [&](int, uint64_t n) {
                  std::vector<std::string> keys;
                  std::vector<ClaimRequest> reqs;
                  keys.reserve(16);
                  for (uint64_t i = 0; i < 16; ++i) keys.push_back(TaskKey(n + i));
                  for (const std::string& k : keys) reqs.push_back(BenchClaim(k));
                  auto r = store.ClaimBatch(reqs);
                  return r.ok() && std::all_of(r->begin(), r->end(),
                                               [](const ClaimResult& c) { return c.acquired(); });
                },
                16});

  const int rounds = std::max(3, std::min(ctx.plan.rounds, 5));
  const double round_s = std::clamp(ctx.plan.round_s, 1.0, 2.0);
  for (auto& c : cs) (void)Measure(c, threads, 0.2);  // warm-up: connections, plans
  for (auto& c : cs) c.errors = 0;
  for (int r = 0; r < rounds && !ctx.Stop(); ++r) {
    ctx.Say("postgres: round " + std::to_string(r + 1) + "/" + std::to_string(rounds));
    for (size_t i = 0; i < cs.size(); ++i) {
      PgContender& c = cs[(i + r) % cs.size()];  // rotate who goes first
      c.rates.push_back(Measure(c, threads, round_s));
    }
  }
  auto ratio = [&](size_t a, size_t b) {
    std::vector<double> v;
    for (size_t i = 0; i < cs[a].rates.size() && i < cs[b].rates.size(); ++i) {
      v.push_back(cs[a].rates[i] / cs[b].rates[i]);
    }
    return Median(v);
  };

  // Expiry: bulk-load rows already past their retention, then delete them all.
  const uint64_t expired_rows = ctx.options.quick ? 20'000 : 200'000;
  const size_t batch = 500;
  double expire_s = NAN;
  uint64_t expired = 0;
  const auto before = store.stats();
  if (exec(conns[threads], "INSERT INTO " + store.QualifiedTable() +
                               " SELECT convert_to('x' || g, 'UTF8'), 2, 1, 1, 1, 0, 1, '', 0, '' "
                               "FROM generate_series(1, " + std::to_string(expired_rows) + ") g")) {
    ctx.Say("postgres: expiry of " + Rate(static_cast<double>(expired_rows)) + " rows");
    const auto t0 = Clk::now();
    auto n = store.ExpireNow(batch, 1'000'000);
    expire_s = Seconds(Clk::now() - t0);
    if (n.ok()) expired = *n;
  }
  const auto after = store.stats();
  const double statements = static_cast<double>(after.expire_statements - before.expire_statements);
  const double ms_per_statement =
      statements > 0 ? static_cast<double>(after.expire_micros - before.expire_micros) / statements / 1000 : NAN;

  (void)exec(conns[threads], "DROP TABLE " + effects + "; DROP TABLE " + store.QualifiedTable());
  for (PGconn* c : conns) PQfinish(c);

  Section s;
  s.key = "postgres";
  s.data = json::object();
  std::string md = "### PostgreSQL store and exactly-once effects\n\n";
  md += std::to_string(threads) + " threads, " + std::to_string(rounds) + " interleaved rounds of " +
        Fmt("%.1f", round_s) + " s; medians of the rounds.\n\n";
  md += "| operation | messages/s (median) | failed calls |\n|---|---:|---:|\n";
  for (auto& c : cs) {
    const double med = Median(c.rates);
    s.data["ops"][c.name] = {{"ops_per_s", Num(med)}, {"errors", c.errors}};
    md += "| " + c.name + " | " + Rate(med) + " | " + std::to_string(c.errors) + " |\n";
  }
  const double exactly_once = ratio(4, 2), guard_beside = ratio(3, 2), tx_vs_beside = ratio(4, 3);
  const double batch_vs_claim = ratio(5, 0);
  s.data["ratios"] = {{"tx_vs_insert_alone", Num(exactly_once)},
                      {"insert_then_complete_vs_insert_alone", Num(guard_beside)},
                      {"tx_vs_insert_then_complete", Num(tx_vs_beside)},
                      {"claim_batch16_vs_claim", Num(batch_vs_claim)}};
  md += "\nMedian per-round ratios: insert + complete in 1 tx / insert alone = " + Fmt("%.2f", exactly_once) +
        "x; insert, then complete / insert alone = " + Fmt("%.2f", guard_beside) +
        "x; 1 tx / insert, then complete = " + Fmt("%.2f", tx_vs_beside) +
        "x; claims in ClaimBatch 16 / single claims = " + Fmt("%.2f", batch_vs_claim) + "x.\n";
  s.data["expiry"] = {{"rows", expired},
                      {"seconds", Num(expire_s)},
                      {"rows_per_s", Num(static_cast<double>(expired) / expire_s)},
                      {"batch", batch},
                      {"ms_per_statement", Num(ms_per_statement)}};
  md += "\nExpiry: " + Rate(static_cast<double>(expired)) + " expired rows deleted in " +
        Fmt("%.2f", expire_s) + " s (" + Rate(static_cast<double>(expired) / expire_s) +
        " rows/s), batches of " + std::to_string(batch) + ", " + Fmt("%.1f", ms_per_statement) +
        " ms per DELETE statement.\n";
  s.markdown = md;
  ctx.results.sections.push_back(std::move(s));
}

}  // namespace dedup::bench

#else

#include "bench/bench.h"

namespace dedup::bench {
void RunPostgres(BenchContext& ctx) { ctx.Skip("postgres: this build has no PostgreSQL store"); }
}  // namespace dedup::bench

#endif  // DEDUP_WITH_POSTGRES
