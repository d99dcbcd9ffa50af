// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The worker process of tests/postgres_chaos_test.sh. It plays an at-least-once
// broker against itself: every pass walks all messages m-0 .. m-(N-1) in a random
// order and delivers each one that is not yet acked; it exits 0 after a pass in
// which every message was acked. Its effect per message is one business row,
// INSERT INTO chaos_effects (msg, fence, pid), in PostgreSQL.
//
//   postgres_chaos_worker MODE STORE_URI BUSINESS_URI MESSAGES
//
//   MODE tx     the buffer is the PostgreSQL store; the INSERT and the completion
//               commit in one transaction (ProcessOnceInTransaction)
//   MODE redis  the buffer is a Redis store (STORE_URI); the INSERT commits on its
//               own, then the buffer completes in Redis (ProcessOnce)
//
// Environment: WORK_MS (default 2): time the handler spends after its INSERT and
// before returning, i.e. inside the transaction (tx) or between the effect and the
// completion (redis). The parent SIGKILLs this process at random moments.

#include <libpq-fe.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "dedup/buffer.h"
#include "dedup/postgres_store.h"
#include "dedup/store.h"

namespace {

using namespace std::chrono_literals;

int Usage() {
  std::fprintf(stderr, "usage: postgres_chaos_worker tx|redis STORE_URI BUSINESS_URI MESSAGES\n");
  return 2;
}

// libpq takes postgres:// URIs as they are, minus dedup's own parameters.
std::string Conninfo(std::string uri) {
  const size_t q = uri.find('?');
  return q == std::string::npos ? uri : uri.substr(0, q);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) return Usage();
  const std::string mode = argv[1];
  if (mode != "tx" && mode != "redis") return Usage();
  const std::string store_uri = argv[2];
  const std::string business = Conninfo(argv[3]);
  const int messages = std::atoi(argv[4]);
  const char* w = std::getenv("WORK_MS");
  const auto work = std::chrono::milliseconds(w != nullptr ? std::atoi(w) : 2);
  const std::string pid = std::to_string(getpid());

  std::unique_ptr<dedup::PostgresStore> pg;
  std::unique_ptr<dedup::Store> store;
  for (int i = 0;; ++i) {  // the server may be restarting when this process starts
    dedup::Status s;
    if (mode == "tx") {
      auto o = dedup::OpenPostgresStore(store_uri);
      if (o.ok()) pg = std::move(o).value();
      s = o.status();
    } else {
      auto o = dedup::OpenStore(store_uri);
      if (o.ok()) store = std::move(o).value();
      s = o.status();
    }
    if (pg != nullptr || store != nullptr) break;
    if (!s.retryable() || i > 600) {
      std::fprintf(stderr, "chaos worker %s: %s\n", pid.c_str(), s.ToString().c_str());
      return 1;
    }
    std::this_thread::sleep_for(100ms);
  }
  dedup::BufferOptions bo;
  bo.lease = 1s;
  bo.retry_delay = 50ms;
  dedup::Buffer buffer(pg != nullptr ? static_cast<dedup::Store*>(pg.get()) : store.get(), bo);

  // The redis mode's own business connection (autocommit), reopened when lost.
  PGconn* conn = nullptr;
  auto business_insert = [&](const std::string& msg, uint64_t fence) -> bool {
    if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
      if (conn != nullptr) PQfinish(conn);
      conn = PQconnectdb(business.c_str());
      if (PQstatus(conn) != CONNECTION_OK) return false;
    }
    const std::string f = std::to_string(fence);
    const char* values[] = {msg.c_str(), f.c_str(), pid.c_str()};
    PGresult* r = PQexecParams(conn, "INSERT INTO chaos_effects (msg, fence, pid) VALUES ($1, $2, $3)",
                               3, nullptr, values, nullptr, nullptr, 0);
    const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
    PQclear(r);
    return ok;
  };

  std::vector<int> order(messages);
  for (int i = 0; i < messages; ++i) order[i] = i;
  std::vector<bool> acked(messages, false);
  std::mt19937 rng(std::random_device{}());
  uint64_t unavailable = 0, ran = 0;
  for (int pass = 0;; ++pass) {
    std::shuffle(order.begin(), order.end(), rng);
    int left = 0;
    for (int i : order) {
      if (acked[i]) continue;
      const std::string msg = "m-" + std::to_string(i);
      dedup::Processed p;
      if (mode == "tx") {
        p = dedup::ProcessOnceInTransaction(
            buffer, *pg, msg, msg, [&](dedup::PostgresTransaction& tx) {
              auto r = tx.Exec("INSERT INTO chaos_effects (msg, fence, pid) VALUES ($1, $2, $3)",
                               {msg, std::to_string(tx.fence()), pid});
              if (!r.ok()) return dedup::HandlerResult::Retry(r.status().ToString());
              std::this_thread::sleep_for(work);
              return dedup::HandlerResult::Done();
            });
      } else {
        p = buffer.ProcessOnce(msg, msg, [&](dedup::ClaimGuard& g) {
          if (!business_insert(msg, g.fence())) return dedup::HandlerResult::Retry("business insert failed");
          std::this_thread::sleep_for(work);
          return dedup::HandlerResult::Done();
        });
      }
      if (p.ran) ++ran;
      if (p.status.code() == dedup::StatusCode::kUnavailable) ++unavailable;
      if (p.action == dedup::BrokerAction::kAck) {
        acked[i] = true;
      } else {
        ++left;
        if (!p.status.ok()) std::this_thread::sleep_for(20ms);
      }
    }
    if (left == 0) break;
    std::this_thread::sleep_for(100ms);
  }
  std::printf("chaos worker %s: done, handler runs %llu, unavailable answers %llu\n", pid.c_str(),
              static_cast<unsigned long long>(ran), static_cast<unsigned long long>(unavailable));
  if (conn != nullptr) PQfinish(conn);
  return 0;
}
