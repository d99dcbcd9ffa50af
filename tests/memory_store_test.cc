// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// What the memory store does beyond the conformance suite: incremental reclaim,
// its own table (growth, deletion, keys kept inline or out of line) against a
// plain std::map model.

#include "dedup/memory_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <initializer_list>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "core/state_machine.h"
#include "stores/memory/memory_store_internal.h"

namespace dedup {
namespace {

using namespace std::chrono_literals;

// `shards` shards (rounded up to a power of two), reclaiming at most `most`
// expired records per operation, on `clock`.
auto ShardedStore(SimulatedClock* clock, size_t shards, size_t most = 4) {
  MemoryStoreOptions o;
  o.clock = clock;
  o.shards = shards;
  o.reclaim_per_operation = most;
  return NewMemoryStore(o);
}

// One shard, reclaiming at most `most` expired records per operation, on `clock`.
auto OneShardStore(SimulatedClock* clock, size_t most = 4) { return ShardedStore(clock, 1, most); }

// Claims `key` and expects an answer (any outcome).
void ClaimAnswered(Store& store, const std::string& key, Millis lease, Millis retention) {
  ClaimRequest r;
  r.key = key;
  r.lease = lease;
  r.retention = retention;
  ASSERT_TRUE(store.Claim(r).ok()) << key;
}

TEST(MemoryStore, ExpiredRecordsAreReclaimedByLaterOperations) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  for (int i = 0; i < 100; ++i) {
    ClaimRequest r;
    std::string key = "old:" + std::to_string(i);
    r.key = key;
    r.lease = 1s;
    r.retention = 1s;
    auto c = store->Claim(r);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(store->Complete(key, c->token, 1s, CompletionStatus::kOk, "").ok());
  }
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 100u);
  clock.Advance(10s);
  // Each operation reclaims at most 4: 10 claims leave 100 - 40 expired records.
  for (int i = 0; i < 10; ++i) {
    ClaimRequest r;
    std::string key = "new:" + std::to_string(i);
    r.key = key;
    ASSERT_TRUE(store->Claim(r).ok());
  }
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 60u + 10u);
  for (int i = 10; i < 30; ++i) {
    ClaimRequest r;
    std::string key = "new:" + std::to_string(i);
    r.key = key;
    ASSERT_TRUE(store->Claim(r).ok());
  }
  auto all = store->Scan("", 1000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), 30u);
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 30u) << "all expired reclaimed";
  // Forget returns false for a reclaimed (or expired) record.
  auto f = store->Forget("old:0");
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(*f);
}

// Records kept for hours do not hold reclaim up: short-lived records behind a
// whole chunk (4096 slots) of long-lived ones are reclaimed by the next few
// operations, `reclaim_per_operation` each, not after the sweep has crawled
// through the long-lived chunk 16 slots a call (the memory_stall bench phase's
// reclaim waves).
TEST(MemoryStore, LongLivedRecordsDoNotDelayReclaim) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  auto claim = [&](const std::string& key, std::chrono::milliseconds lease,
                   std::chrono::milliseconds retention) {
    ClaimRequest r;
    r.key = key;
    r.lease = lease;
    r.retention = retention;
    ASSERT_TRUE(store->Claim(r).ok()) << key;
  };
  for (int i = 0; i < 4096; ++i) claim("keep:" + std::to_string(i), 1h, 1h);
  for (int i = 0; i < 40; ++i) claim("short:" + std::to_string(i), 1s, 1s);
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 4096u + 40u);
  clock.Advance(10s);
  for (int i = 0; i < 10; ++i) claim("new:" + std::to_string(i), 1h, 1h);
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 4096u + 10u)
      << "10 operations, 4 each: every expired record reclaimed";
}

// The sweep returns at once while nothing in the shard is due (a shard-wide
// lower bound of the deadlines, made exact each time the cursor goes round). A
// record added after the bound was made exact, behind the cursor or ahead of
// it, must lower the bound, and be reclaimed once it expires.
TEST(MemoryStore, ShortRecordsAfterManyIdleSweepsAreReclaimed) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  auto claim = [&](const std::string& key, Millis retention) { ClaimAnswered(*store, key, 1ms, retention); };
  // Two and a half chunks of long-lived records; the sweep goes round many
  // times meanwhile, finding nothing due.
  for (int i = 0; i < 10'000; ++i) claim("keep:" + std::to_string(i), 1h);
  for (int i = 0; i < 2'000; ++i) {
    ASSERT_TRUE(store->Inspect("keep:" + std::to_string(i)).ok());
    claim("keep:" + std::to_string(i), 1h);  // BUSY or DUPLICATE: nothing written
  }
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 40; ++i) claim("short:" + std::to_string(round) + ":" + std::to_string(i), 1s);
    EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 10'000u + 40u) << round;
    clock.Advance(999ms);
    for (int i = 0; i < 20; ++i) claim("keep:" + std::to_string(i), 1h);
    EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 10'000u + 40u) << "not yet due, round " << round;
    clock.Advance(2ms);
    // Each operation looks at up to 16 slots, or steps over a chunk for 4 of
    // them: 10,040 slots need at most ~700 operations to go round once.
    for (int i = 0; i < 1'000; ++i) claim("keep:" + std::to_string(i), 1h);
    EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 10'000u) << "round " << round;
  }
}

// A deadline written behind the sweep's cursor, into a chunk the current pass
// has already passed, must still count when the cursor wraps and the shard's
// lower bound is made exact again; and the last, partial chunk's bound is made
// exact when the cursor has scanned up to its end (else a short record that
// once lived there would keep the bound low until the chunk filled).
TEST(MemoryStore, DeadlineWrittenBehindTheCursorIsReclaimed) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  // Five chunks (4096 slots each): a pass cannot step over all of them in one
  // operation (4 of its budget of 16 per chunk), so it ends in a later one.
  for (int i = 0; i < 20'000; ++i) ClaimAnswered(*store, "keep:" + std::to_string(i), 1ms, 1h);
  for (int i = 0; i < 40; ++i) ClaimAnswered(*store, "a:" + std::to_string(i), 1ms, 1s);  // the last chunk
  clock.Advance(2s);  // the a: records are due
  // One operation: the cursor steps over chunks 0 to 3.
  ClaimAnswered(*store, "keep:19000", 1ms, 1h);
  // Behind the cursor: keep:5 (slot 5, chunk 0) is taken over, kept 1 s.
  ClaimAnswered(*store, "keep:5", 1ms, 1s);
  // The cursor finishes the pass (removing the a: records) and wraps.
  for (int i = 0; i < 400; ++i) ClaimAnswered(*store, "keep:" + std::to_string(10'000 + i), 1ms, 1h);
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 20'000u);
  clock.Advance(2s);  // keep:5 is due
  for (int i = 0; i < 400; ++i) ClaimAnswered(*store, "keep:" + std::to_string(10'400 + i), 1ms, 1h);
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 19'999u) << "keep:5 reclaimed";
  auto r = store->Inspect("keep:5");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
}

// The factory cannot return an error: shards outside 1 to kMaxMemoryShards are
// clamped (2^40 threw bad_alloc, SIZE_MAX went through an undefined bit_ceil).
TEST(MemoryStore, ShardsOutOfRangeAreClamped) {
  for (size_t shards : {size_t{0}, size_t{1} << 40, SIZE_MAX}) {
    MemoryStoreOptions o;
    o.shards = shards;
    auto store = NewMemoryStore(o);
    ClaimRequest r;
    r.key = "k";
    auto c = store->Claim(r);
    ASSERT_TRUE(c.ok()) << shards << ": " << c.status();
    EXPECT_TRUE(c->acquired());
  }
}

// Claim checks its arguments inline, and asks ValidateClaim only for the error:
// at every edge of every limit, it answers as ValidateClaim does.
TEST(MemoryStore, ClaimChecksItsArgumentsAsValidateClaim) {
  auto store = NewMemoryStore();
  const std::string big(kMaxKeyBytes + 1, 'k');
  const std::string fp(kMaxFingerprintBytes + 1, 'f');
  int n = 0;
  for (size_t key_len : {size_t{0}, size_t{1}, kMaxKeyBytes, kMaxKeyBytes + 1}) {
    for (Millis lease : {Millis(-1), Millis(0), Millis(1), kMaxDuration, kMaxDuration + Millis(1)}) {
      for (Millis retention : {Millis(-1), Millis(0), Millis(1), kMaxDuration, kMaxDuration + Millis(1)}) {
        for (size_t fp_len : {size_t{0}, kMaxFingerprintBytes, kMaxFingerprintBytes + 1}) {
          // A key of its own per request (its first bytes), so that every valid one is ACQUIRED.
          std::string key = std::string_view(big).substr(0, key_len).data() == nullptr ? "" : big.substr(0, key_len);
          if (key_len > 0) key.replace(0, std::min(key_len, size_t{4}), std::to_string(1000 + n++).substr(0, std::min(key_len, size_t{4})));
          ClaimRequest r;
          r.key = key;
          r.lease = lease;
          r.retention = retention;
          r.fingerprint = std::string_view(fp).substr(0, fp_len);
          const Status want = ValidateClaim(r);
          auto got = store->Claim(r);
          EXPECT_EQ(got.ok(), want.ok()) << key_len << " " << lease.count() << " " << retention.count() << " " << fp_len;
          if (!want.ok()) EXPECT_EQ(got.status(), want);
        }
      }
    }
  }
}

// The sweep decides from its compact deadline array, which holds each record's
// retention deadline to the millisecond: nothing is reclaimed a millisecond
// early, everything is reclaimed once the deadline has passed.
TEST(MemoryStore, ReclaimFollowsTheDeadlineToTheMillisecond) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  auto claim = [&](const std::string& key) {
    ClaimRequest r;
    r.key = key;
    r.lease = 1h;
    r.retention = 1h;
    ASSERT_TRUE(store->Claim(r).ok()) << key;
  };
  clock.Advance(250ms);  // deadlines in the middle of a second
  for (int i = 0; i < 100; ++i) {
    ClaimRequest r;
    const std::string key = "done:" + std::to_string(i);
    r.key = key;
    auto c = store->Claim(r);
    ASSERT_TRUE(c.ok());
    ASSERT_TRUE(store->Complete(key, c->token, 1500ms, CompletionStatus::kOk, "").ok());
  }
  clock.Advance(1499ms);
  for (int i = 0; i < 30; ++i) claim("early:" + std::to_string(i));
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 100u + 30u) << "none reclaimed before its deadline";
  clock.Advance(1ms);
  for (int i = 0; i < 30; ++i) claim("late:" + std::to_string(i));
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 30u + 30u) << "all reclaimed at their deadline";
}

// The sweep's array holds deadlines in 4 bytes, as milliseconds after a base
// that moves every ~24.9 days; a deadline more than ~49.7 days ahead is stored
// low and corrected when the sweep reads its slot. Across months of the store's
// clock, nothing is reclaimed early and everything once expired.
TEST(MemoryStore, ReclaimKeepsItsDeadlinesAcrossMonths) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  auto claim = [&](const std::string& key, Millis retention) { ClaimAnswered(*store, key, 1s, retention); };
  auto records = [&] { return internal::MemoryStorePhysicalRecords(store.get()); };
  constexpr auto kDay = std::chrono::hours(24);
  for (int i = 0; i < 50; ++i) claim("long:" + std::to_string(i), 60 * kDay);  // past the array's range
  for (int i = 0; i < 50; ++i) claim("month:" + std::to_string(i), 26 * kDay);
  clock.Advance(25 * kDay);  // past the base's ~24.9 days: the next sweep moves it
  for (int i = 0; i < 30; ++i) claim("a:" + std::to_string(i), 1h);
  EXPECT_EQ(records(), 130u) << "nothing expired yet";
  clock.Advance(kDay + 2s);
  for (int i = 0; i < 30; ++i) claim("b:" + std::to_string(i), 1h);
  EXPECT_EQ(records(), 80u) << "month and a reclaimed, long kept";
  clock.Advance(24 * kDay);  // day 50: long's stored deadline (lowered) is due, its own is not
  for (int i = 0; i < 30; ++i) claim("c:" + std::to_string(i), 1h);
  EXPECT_EQ(records(), 80u) << "b reclaimed, long kept";
  auto rec = store->Inspect("long:7");
  ASSERT_TRUE(rec.ok());
  EXPECT_TRUE(rec->has_value());
  clock.Advance(11 * kDay);  // day 61: long has expired
  for (int i = 0; i < 30; ++i) claim("d:" + std::to_string(i), 1h);
  EXPECT_EQ(records(), 30u) << "long and c reclaimed";
}

// Keys of every length class (inline up to 24 bytes, out of line beyond),
// results and fingerprints (which move a short key out of line and back).
TEST(MemoryStore, KeysOfAnyLengthKeepTheirRecords) {
  SimulatedClock clock;
  MemoryStoreOptions o;
  o.clock = &clock;
  auto store = NewMemoryStore(o);
  for (size_t len : {1u, 23u, 24u, 25u, 40u, 1024u}) {
    const std::string key(len, static_cast<char>('a' + len % 26));
    ClaimRequest r;
    r.key = key;
    r.fingerprint = len % 2 ? "fp" : "";
    auto c = store->Claim(r);
    ASSERT_TRUE(c.ok() && c->acquired()) << len;
    ASSERT_TRUE(store->Complete(key, c->token, 1h, CompletionStatus::kOk, "result-" + key).ok());
    auto again = store->Claim(r);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->outcome, ClaimOutcome::kDuplicate) << len;
    EXPECT_EQ(again->result, "result-" + key) << len;
    auto rec = store->Inspect(key);
    ASSERT_TRUE(rec.ok() && rec->has_value());
    EXPECT_EQ((*rec)->key, key);
    EXPECT_EQ((*rec)->fingerprint, len % 2 ? "fp" : "");
  }
}

// The model of the growth tests: each completed key and its retention deadline.
using Deadlines = std::map<std::string, int64_t>;

// Whether `model` has `key` completed and kept at `now`.
bool LiveIn(const Deadlines& model, const std::string& key, int64_t now) {
  auto it = model.find(key);
  return it != model.end() && now < it->second;
}

// Claims `key` at `now` (operation `at`): acquired exactly when `model` has it not
// live; then completed, kept for keep() (called only then), and so in the model.
template <typename Keep>
void ClaimAndCompleteAsModel(Store& store, Deadlines& model, const std::string& key, int64_t now, int at,
                             Keep&& keep) {
  ClaimRequest r;
  r.key = key;
  auto c = store.Claim(r);
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->acquired(), !LiveIn(model, key, now)) << key << " at " << at;
  if (!c->acquired()) return;
  const Millis kept = keep();
  ASSERT_TRUE(store.Complete(key, c->token, kept, CompletionStatus::kOk, "").ok());
  model[key] = now + kept.count();
}

// Forgets `key` at `now` (operation `at`): forgotten exactly when `model` has it
// live; then gone from the model.
void ForgetAsModel(Store& store, Deadlines& model, const std::string& key, int64_t now, int at) {
  auto f = store.Forget(key);
  ASSERT_TRUE(f.ok());
  ASSERT_EQ(*f, LiveIn(model, key, now)) << key << " at " << at;
  model.erase(key);
}

// Each key of `model` is found exactly while it is kept at `now`, and a scan
// finds those and no other record.
void ExpectRecordsAsModel(Store& store, const Deadlines& model, int64_t now) {
  size_t live = 0;
  for (const auto& [k, deadline] : model) {
    auto rec = store.Inspect(k);
    ASSERT_TRUE(rec.ok());
    const bool want = now < deadline;
    ASSERT_EQ(rec->has_value(), want) << k;
    live += want;
  }
  auto all = store.Scan("", 1'000'000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), live);
}

// Many keys through a few shards: the index doubles many times, and forgets and
// reclaims delete from the middle of probe clusters. Every key answers as a map
// of the same operations says it should.
TEST(MemoryStore, MatchesAModelThroughGrowthAndDeletion) {
  SimulatedClock clock;
  auto store = ShardedStore(&clock, 2);
  Deadlines model;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 60'000; ++i) {
    const std::string key = "k" + std::to_string(rng() % 20'000);
    const int op = static_cast<int>(rng() % 10);
    const int64_t now = clock.NowMillis();
    if (op < 7) {
      ASSERT_NO_FATAL_FAILURE(
          ClaimAndCompleteAsModel(*store, model, key, now, i, [&] { return Millis(1 + rng() % 3000); }));
    } else if (op < 9) {
      ASSERT_NO_FATAL_FAILURE(ForgetAsModel(*store, model, key, now, i));
    } else {
      clock.Advance(std::chrono::milliseconds(rng() % 200));
    }
  }
  ExpectRecordsAsModel(*store, model, clock.NowMillis());
}

// A shard's index doubles as it fills. The work of a doubling (making the new
// table's entries empty, moving every old entry into it) must be spread over
// the operations that follow, not done by the one insert that crosses the load
// threshold: with keys spread evenly every shard crosses it at about the same
// time, and `dedup bench --phase retained --full` showed 200 ms windows of claims
// at a tenth of the median while 64 shards of ~200 k records each doubled.
TEST(MemoryStore, IndexGrowthIsSpreadOverOperations) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  constexpr int kRecords = 200'000;  // tables of 64 .. 2^19 entries: 13 doublings
  for (int i = 0; i < kRecords; ++i) ClaimAnswered(*store, "grow:" + std::to_string(i), 1h, 1h);
  const internal::MemoryStoreIndexStats st = internal::MemoryStoreIndex(store.get());
  EXPECT_GE(st.doublings, 12u);
  EXPECT_LE(st.most_growth_work, 1024u) << "index entries one call wrote or moved for a doubling";
  for (int i = 0; i < kRecords; i += 101) {
    auto rec = store->Inspect("grow:" + std::to_string(i));
    ASSERT_TRUE(rec.ok() && rec->has_value()) << i;
  }
}

// A doubling is spread over many operations (IndexGrowthIsSpreadOverOperations):
// meanwhile a shard has two tables, and its records are in one or the other.
// Through several doublings of one shard, with claims of new and of live keys,
// completions, forgets (backward shifts in the old table's part not yet moved
// and in the new one) and reclaims by the sweep between the steps of each move,
// every record stays indexed exactly once, found where it is, and the store
// agrees with a model of what is live.
TEST(MemoryStore, EveryRecordIsIndexedOnceWhileTheIndexGrows) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  Deadlines model;
  std::mt19937_64 rng(11);
  size_t checks_moving = 0, checks_filling = 0;
  constexpr int kOps = 60'000;
  for (int i = 0; i < kOps; ++i) {
    // Mostly new keys, some old ones again: the store grows to ~30 k records.
    const std::string key = "g" + std::to_string(rng() % 4 == 0 ? rng() % (i + 1) : i);
    const int op = static_cast<int>(rng() % 16);
    const int64_t now = clock.NowMillis();
    if (op < 12) {
      ASSERT_NO_FATAL_FAILURE(ClaimAndCompleteAsModel(*store, model, key, now, i, [&] {
        return Millis(rng() % 3 != 0 ? 3'600'000 : 1 + rng() % 2'000);  // a third expire soon
      }));
    } else if (op < 15) {
      // An older key, likely still in the old table while a move is under way.
      const std::string older = "g" + std::to_string(rng() % (i + 1));
      ASSERT_NO_FATAL_FAILURE(ForgetAsModel(*store, model, older, now, i));
      // At once, before an insert reuses its slot: a moved entry left behind in
      // the old table must not be found.
      auto gone = store->Inspect(older);
      ASSERT_TRUE(gone.ok());
      ASSERT_FALSE(gone->has_value()) << older << " at " << i;
      ASSERT_FALSE(*store->Forget(older)) << older << " at " << i;
    } else {
      clock.Advance(std::chrono::milliseconds(rng() % 20));
    }
    const internal::MemoryStoreIndexStats st = internal::MemoryStoreIndex(store.get());
    const size_t records = internal::MemoryStorePhysicalRecords(store.get());
    // After every operation while the shard grows (a fill or a move takes
    // 1/128 of the old table's size in inserts) and while the table is small.
    const size_t every = (st.moving + st.filling) != 0 || records < 2048 ? 1 : 1000;
    if (i % every == 0) {
      ASSERT_EQ(internal::MemoryStoreCheckIndex(store.get()), "") << "after operation " << i;
      checks_moving += st.moving;
      checks_filling += st.filling;
    }
  }
  const internal::MemoryStoreIndexStats st = internal::MemoryStoreIndex(store.get());
  EXPECT_GE(st.doublings, 8u);  // 64 .. >= 2^14 entries
  EXPECT_GT(checks_moving, 500u);
  EXPECT_GT(checks_filling, 500u);
  ExpectRecordsAsModel(*store, model, clock.NowMillis());
}

// Whether the home of `key` (internal::MemoryStoreKeyHash) is one of `lines`,
// index lines of 8 entries in a table of up to 1024: keys made to collide.
bool HomeLineIn(const std::string& key, std::initializer_list<uint64_t> lines) {
  const uint64_t line = (internal::MemoryStoreKeyHash(key) >> 3) & 127;
  return std::find(lines.begin(), lines.end(), line) != lines.end();
}

// Keys made to collide (internal::MemoryStoreKeyHash): most of them have their
// home in one of a few index lines, among them the last line of a table of 64
// or 128 entries, so that probe runs are long, wrap round the table's end, and
// straddle the position a move starts from; the rest are spread. One shard,
// tables of 64 entries up, claims (completed, released, left leased), forced
// forgets, and a sweep reclaiming up to 16 expired records per operation,
// each of them erasing in the current table or in the old table's part not yet
// moved. After every operation every record is indexed exactly once where a
// lookup finds it, and a claim is acquired exactly when the model says the key
// is free.
TEST(MemoryStore, CollidingKeysStayIndexedThroughEveryStepOfAGrowth) {
  SimulatedClock clock;
  std::vector<std::string> pool;
  size_t crowded = 0;
  for (int i = 0; pool.size() < 900; ++i) {
    std::string k = "c" + std::to_string(i);
    const bool crowd = HomeLineIn(k, {0, 7, 15, 127});
    if (crowd || i % 128 == 0) pool.push_back(std::move(k));
    crowded += crowd;
  }
  ASSERT_GT(crowded, 600u);
  size_t checks_moving = 0, checks_filling = 0;
  // Eight stores, each grown from empty through four doublings (64 .. 1024
  // entries), then churned.
  for (uint64_t round = 0; round < 8; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    auto store = OneShardStore(&clock, round % 2 == 0 ? 16 : 1);
    std::unordered_map<std::string, int64_t> busy_until;  // a claim is refused before then
    std::mt19937_64 rng(20261130 + round);
    constexpr int kOps = 16'000;
    for (int i = 0; i < kOps; ++i) {
      // The keys in play grow with i, so that the shard grows through its
      // doublings; then it holds a few hundred records, some expiring, some
      // forgotten.
      const size_t reach = std::min(pool.size(), static_cast<size_t>(16 + i / 12));
      const std::string& key = pool[rng() % reach];
      const int64_t now = clock.NowMillis();
      const int op = static_cast<int>(rng() % 32);
      if (op < 24) {
        ClaimRequest r;
        r.key = key;
        r.lease = Millis(1 + rng() % 40);
        auto c = store->Claim(r);
        ASSERT_TRUE(c.ok()) << key << " at " << i;
        const auto it = busy_until.find(key);
        const bool busy = it != busy_until.end() && now < it->second;
        ASSERT_EQ(c->acquired(), !busy) << key << " at " << i;
        if (c->acquired()) {
          busy_until[key] = now + r.lease.count();
          const int then = static_cast<int>(rng() % 8);
          if (then < 5) {
            const Millis keep(then < 2 ? 3'600'000 : 1 + rng() % 60);
            ASSERT_EQ(*store->Complete(key, c->token, keep, CompletionStatus::kOk, ""), WriteResult::kOk);
            busy_until[key] = now + keep.count();
          } else if (then < 7) {
            ASSERT_EQ(*store->Release(key, c->token, Millis(1 + rng() % 60)), WriteResult::kOk);
            busy_until[key] = now;
          }
        }
      } else if (op < 29) {
        ASSERT_TRUE(store->Forget(key, ForgetOptions{.force = true}).ok()) << key << " at " << i;
        busy_until[key] = now;
      } else {
        clock.Advance(std::chrono::milliseconds(rng() % 8));
      }
      ASSERT_EQ(internal::MemoryStoreCheckIndex(store.get()), "") << "after operation " << i << " on " << key;
      const internal::MemoryStoreIndexStats st = internal::MemoryStoreIndex(store.get());
      checks_moving += st.moving;
      checks_filling += st.filling;
    }
    EXPECT_GE(internal::MemoryStoreIndex(store.get()).doublings, 4u);
  }
  EXPECT_GT(checks_moving, 100u);
  EXPECT_GT(checks_filling, 100u);
}

// CollidingKeysStayIndexedThroughEveryStepOfAGrowth on four shards from four
// threads, each with its own keys (so each has its own model), while a fifth
// checks the whole index (every shard under its lock) as they grow: under
// TSan, the growth of one shard touches nothing of another but the store's
// arena of index tables, under its own lock.
TEST(MemoryStore, CollidingKeysOnSeveralShardsGrowingConcurrently) {
  SimulatedClock clock;
  auto store = ShardedStore(&clock, 4, 8);
  constexpr int kThreads = 4, kKeys = 1500, kOps = 20'000;
  std::vector<std::vector<std::string>> pools(kThreads);
  for (int i = 0; pools.back().size() < kKeys || pools.front().size() < kKeys; ++i) {
    std::string k = "p" + std::to_string(i);
    if (!HomeLineIn(k, {0, 7, 127}) && i % 64 != 0) continue;
    auto& pool = pools[static_cast<size_t>(i) % kThreads];
    if (pool.size() < kKeys) pool.push_back(std::move(k));
  }
  std::atomic<int> running{kThreads};
  std::atomic<int> failed{0};
  std::string check_error;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      std::unordered_map<std::string, bool> held;  // leased for an hour or completed for an hour
      std::mt19937_64 rng(77 + t);
      for (int i = 0; i < kOps && failed == 0; ++i) {
        const auto& pool = pools[t];
        const std::string& key = pool[rng() % std::min<size_t>(pool.size(), 16 + i / 8)];
        if (rng() % 4 != 0) {
          ClaimRequest r;
          r.key = key;
          r.lease = 1h;
          auto c = store->Claim(r);
          if (!c.ok() || c->acquired() == held[key]) ++failed;
          if (c.ok() && c->acquired()) {
            held[key] = true;
            if (rng() % 2 == 0 && *store->Complete(key, c->token, 1h, CompletionStatus::kOk, "") != WriteResult::kOk) {
              ++failed;
            }
          }
        } else {
          if (!store->Forget(key, ForgetOptions{.force = true}).ok()) ++failed;
          held[key] = false;
        }
      }
      --running;
    });
  }
  ts.emplace_back([&] {
    while (running > 0 && check_error.empty()) check_error = internal::MemoryStoreCheckIndex(store.get());
  });
  for (auto& th : ts) th.join();
  ASSERT_EQ(failed.load(), 0);
  ASSERT_EQ(check_error, "");
  ASSERT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  EXPECT_GE(internal::MemoryStoreIndex(store.get()).doublings, 4u * 4);
}

// From `threads` threads at once, thread t claims the new keys key(t, 0) to
// key(t, per_thread - 1), each leased for an hour and kept for `retention`, and
// after each claim calls also(t, i, the request) (false: a failure). Returns how
// many claims were not acquired and how many also() calls failed.
template <typename Key, typename Also>
int ClaimNewKeysOnThreads(Store& store, int threads, int per_thread, Key&& key, Millis retention,
                          Also&& also) {
  std::atomic<int> failed{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < threads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < per_thread; ++i) {
        ClaimRequest r;
        const std::string k = key(t, i);
        r.key = k;
        r.lease = 1h;
        r.retention = retention;
        auto c = store.Claim(r);
        if (!c.ok() || !c->acquired()) ++failed;
        if (!also(t, i, r)) ++failed;
      }
    });
  }
  for (auto& th : ts) th.join();
  return failed.load();
}

// Many shards growing at once from several threads (each shard's growth under
// its own lock; those in the middle of a move at the end stay so): the index
// stays whole, and lookups find every record.
TEST(MemoryStore, ShardsGrowingConcurrentlyKeepEveryRecord) {
  SimulatedClock clock;
  auto store = ShardedStore(&clock, 16);
  constexpr int kThreads = 4, kPerThread = 50'000;
  auto key = [](int t, int i) { return "conc:" + std::to_string(t) + ":" + std::to_string(i); };
  ASSERT_EQ(ClaimNewKeysOnThreads(*store, kThreads, kPerThread, key, kDefaultRetention,
                                  [&](int t, int i, const ClaimRequest&) {
                                    return i % 7 != 0 ||
                                           store->Forget(key(t, i / 2), ForgetOptions{.force = true}).ok();
                                  }),
            0);
  ASSERT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  EXPECT_GE(internal::MemoryStoreIndex(store.get()).doublings, 16u * 8);
  std::vector<bool> forgotten(kPerThread);  // a forced forget of a lease leaves a fence floor
  for (int i = 0; i < kPerThread; i += 7) forgotten[i / 2] = true;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      auto rec = store->Inspect(key(t, i));
      ASSERT_TRUE(rec.ok());
      ASSERT_EQ(rec->has_value(), !forgotten[i]) << key(t, i);
    }
  }
}

// A shard past 2 MiB of slots takes its slots 8 chunks at a time from one
// mapping, and its index from the store's arena of huge pages (64 KiB to 1 MiB)
// and then from a huge-page mapping of its own (2 MiB and more): records on
// both sides of those lines keep their keys, expire, are reclaimed, and their
// slots are reused.
TEST(MemoryStore, LargeShardKeepsEveryRecordAcrossHugePageRegions) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  constexpr int kRecords = 300'000;  // 73 chunks of 4096: 8 alone, then 9 mappings; index 4 MiB
  auto key = [](int i) { return "large:" + std::to_string(i); };
  std::vector<std::string> keys;
  std::vector<ClaimRequest> reqs;
  for (int i = 0; i < kRecords; ++i) keys.push_back(key(i));
  for (int i = 0; i < kRecords; ++i) {
    ClaimRequest r;
    r.key = keys[i];
    r.lease = 1s;
    r.retention = i % 2 ? 1h : 1s;  // odd keys stay, even keys expire
    reqs.push_back(r);
  }
  auto claimed = store->ClaimBatch(reqs);
  ASSERT_TRUE(claimed.ok());
  for (const ClaimResult& c : *claimed) ASSERT_TRUE(c.acquired());
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), size_t{kRecords});
  for (int i = 0; i < kRecords; i += 997) {
    auto rec = store->Inspect(keys[i]);
    ASSERT_TRUE(rec.ok() && rec->has_value()) << keys[i];
    EXPECT_EQ((*rec)->key, keys[i]);
  }
  clock.Advance(10s);
  // Each claim reclaims at most 4: 40,000 claims reclaim all 150,000 expired.
  for (int i = 0; i < 40'000; ++i) {
    ClaimRequest r;
    const std::string k = "after:" + std::to_string(i);
    r.key = k;
    ASSERT_TRUE(store->Claim(r).ok());
  }
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), size_t{kRecords / 2 + 40'000});
  for (int i = 0; i < kRecords; i += 499) {
    auto rec = store->Inspect(keys[i]);
    ASSERT_TRUE(rec.ok());
    EXPECT_EQ(rec->has_value(), i % 2 == 1) << keys[i];
  }
  auto all = store->Scan("", 1'000'000);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(all->size(), size_t{kRecords / 2 + 40'000});
}

// Index tables of 64 KiB to 1 MiB of all shards share one arena of 2 MiB
// regions: tables split from and merged back into the same regions as shards
// double at their own pace, from several threads at once. Every record stays
// where its key finds it, through growth, forgets (backward shifts in arena
// tables), and a second store's arena beside the first.
TEST(MemoryStore, ShardsSharingTheIndexArenaKeepEveryRecord) {
  SimulatedClock clock;
  // 400 k keys: ~50 k a shard, tables 64 KiB .. 1 MiB from the arena.
  auto store = ShardedStore(&clock, 8);
  auto other = ShardedStore(&clock, 8);
  constexpr int kThreads = 4, kPerThread = 100'000;
  auto key = [](int t, int i) { return "arena:" + std::to_string(t) + ":" + std::to_string(i); };
  ASSERT_EQ(ClaimNewKeysOnThreads(*store, kThreads, kPerThread, key, 1s,
                                  [&](int, int i, const ClaimRequest& r) {
                                    return i % 4 != 0 || other->Claim(r).ok();
                                  }),
            0);
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), size_t{kThreads * kPerThread});
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(other.get()), size_t{kThreads * kPerThread / 4});
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; i += 3) {
      ASSERT_TRUE(store->Forget(key(t, i), ForgetOptions{.force = true}).ok());
    }
  }
  other.reset();
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPerThread; ++i) {
      auto rec = store->Inspect(key(t, i));
      ASSERT_TRUE(rec.ok());
      ASSERT_EQ(rec->has_value(), i % 3 != 0) << key(t, i);
      if (rec->has_value()) ASSERT_EQ((*rec)->key, key(t, i));
    }
  }
  // A forced forget of a running lease leaves a fence floor: the records stay
  // physically until the lease's end.
  clock.Advance(2h);
  for (int i = 0; i < 200'000; ++i) ClaimAnswered(*store, "after:" + std::to_string(i), 1s, 1s);
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), size_t{200'000});
}

// Many threads on one shard and a few keys: most claims meet a held lock and
// sleep on it (the shard lock's contended path). Each acquisition of a key raises
// its fence and attempt by one inside the lock; a claim lost to a broken lock (two
// holders, or a waiter never woken) shows as a fence below the acquisitions
// counted here, or as a hang.
TEST(MemoryStore, OneShardUnderContentionLosesNoClaim) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  constexpr int kThreads = 8, kPerThread = 20'000, kKeys = 4;
  std::atomic<uint64_t> acquired[kKeys] = {};
  std::atomic<int> failed{0};
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int k = (i + t) % kKeys;
        ClaimRequest r;
        const std::string key = "hot:" + std::to_string(k);
        r.key = key;
        r.lease = 1h;
        r.retention = 1h;
        auto c = store->Claim(r);
        if (!c.ok()) {
          ++failed;
          continue;
        }
        if (!c->acquired()) continue;
        ++acquired[k];
        auto rel = store->Release(key, c->token, 1h);
        if (!rel.ok() || *rel != WriteResult::kOk) ++failed;
      }
    });
  }
  for (auto& th : ts) th.join();
  ASSERT_EQ(failed.load(), 0);
  for (int k = 0; k < kKeys; ++k) {
    auto rec = store->Inspect("hot:" + std::to_string(k));
    ASSERT_TRUE(rec.ok() && rec->has_value()) << k;
    EXPECT_GT(acquired[k].load(), 0u) << k;
    EXPECT_EQ((*rec)->fence, acquired[k].load()) << k;
    EXPECT_EQ((*rec)->attempt, acquired[k].load()) << k;
  }
}

TEST(MemoryStore, ShardCountIsRoundedUp) {
  MemoryStoreOptions o;
  o.shards = 5;
  auto store = NewMemoryStore(o);
  ClaimRequest r;
  r.key = "x";
  EXPECT_TRUE(store->Claim(r).ok());
}

// The system clock can step back (an NTP step, an operator). After the store's
// clock reads earlier than when the store was made (or last moved its sweep's
// base), records that expire by that clock are still reclaimed by the next
// operations, not only once the clock has caught up with the old reading.
TEST(MemoryStore, ReclaimContinuesAfterTheClockStepsBack) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  clock.Set(clock.NowMillis() - 3'600'000);  // one hour back, before any record
  for (int i = 0; i < 100; ++i) {
    ClaimRequest r;
    const std::string key = "old:" + std::to_string(i);
    r.key = key;
    auto c = store->Claim(r);
    ASSERT_TRUE(c.ok() && c->acquired());
    ASSERT_TRUE(store->Complete(key, c->token, 1s, CompletionStatus::kOk, "").ok());
  }
  clock.Advance(10s);  // all 100 expired, still 59 minutes before the store was made
  for (int i = 0; i < 30; ++i) {
    ClaimRequest r;
    const std::string key = "new:" + std::to_string(i);
    r.key = key;
    ASSERT_TRUE(store->Claim(r).ok());
  }
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 30u) << "all expired reclaimed";
  auto again = store->Claim([] { ClaimRequest r; r.key = "old:3"; return r; }());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->acquired());
}

// The model tests' steps: one operation on the store and on `model`, the pure
// state machine (core/state_machine.h) over a map that never reclaims; their
// answers must agree. `at` names the step in a failure.
using Model = std::map<std::string, Record>;

// A claim of `key` with a lease and a retention from `span`, limited to 2
// attempts one time in 4.
template <typename Span>
ClaimRequest ModelClaim(const std::string& key, Span& span, std::mt19937_64& rng) {
  ClaimRequest r;
  r.key = key;
  r.lease = span();
  r.retention = span();
  r.max_attempts = rng() % 4 == 0 ? 2 : 0;
  return r;
}

// Claims r.key; *acquired: the store answered ACQUIRED.
void ClaimBoth(Store& store, Model& model, const ClaimRequest& r, int64_t now, const std::string& at,
               bool* acquired) {
  auto c = store.Claim(r);
  ASSERT_TRUE(c.ok()) << at;
  auto it = model.find(std::string(r.key));
  Record next;
  bool write = false;
  std::string at_limit;  // the model's fences and attempts stay small
  const ClaimResult want = internal::DecideClaim(it == model.end() ? nullptr : &it->second, r, now,
                                                 c->token, &next, &write, &at_limit);
  ASSERT_EQ(static_cast<int>(c->outcome), static_cast<int>(want.outcome)) << at;
  ASSERT_EQ(c->attempt, want.attempt) << at;
  *acquired = c->acquired();
  if (write) model[std::string(r.key)] = next;
}

// Extend (kind 0), Complete (1) or Release (2) of `key` with `token` and `d`
// (the lease or the retention).
void WriteBoth(Store& store, Model& model, const std::string& key, int kind, Token token, Millis d,
               int64_t now, const std::string& at) {
  auto it = model.find(key);
  Record* cur = it == model.end() ? nullptr : &it->second;
  Record copy = cur != nullptr ? *cur : Record{};
  StatusOr<WriteResult> got = kind == 0   ? store.Extend(key, token, d)
                              : kind == 1 ? store.Complete(key, token, d, CompletionStatus::kOk, "")
                                          : store.Release(key, token, d);
  ASSERT_TRUE(got.ok()) << at;
  const WriteResult want =
      kind == 0   ? internal::DecideExtend(cur ? &copy : nullptr, token, d, now)
      : kind == 1 ? internal::DecideComplete(cur ? &copy : nullptr, token, d, CompletionStatus::kOk, "", now)
                  : internal::DecideRelease(cur ? &copy : nullptr, token, d, now);
  ASSERT_EQ(static_cast<int>(*got), static_cast<int>(want)) << at << " write " << kind;
  if (want == WriteResult::kOk) *cur = copy;
}

void ForgetBoth(Store& store, Model& model, const std::string& key, bool force, int64_t now,
                const std::string& at) {
  auto it = model.find(key);
  Record* cur = it == model.end() ? nullptr : &it->second;
  auto f = store.Forget(key, ForgetOptions{force});
  Record floor;
  const internal::ForgetAction a = internal::DecideForget(cur, force, now, &floor);
  if (a == internal::ForgetAction::kRefuse) {
    ASSERT_FALSE(f.ok()) << at;
    return;
  }
  ASSERT_TRUE(f.ok()) << at;
  ASSERT_EQ(*f, a != internal::ForgetAction::kNone) << at;
  if (a == internal::ForgetAction::kRemove) model.erase(key);
  if (a == internal::ForgetAction::kFloor) *cur = floor;
}

// After the clock stepped back from `now`: the records whose retention had
// passed by `now` leave the model (the store may have reclaimed them, which the
// model does not know), a key "k<j>.<generation[j]>" of theirs moves on to the
// next generation, and each one's deadline goes to *retired when given.
void RetireExpired(Model& model, std::vector<int>& generation, int64_t now,
                   std::map<std::string, int64_t>* retired) {
  for (auto m = model.begin(); m != model.end();) {
    if (!m->second.ExpiredAt(now)) {
      ++m;
      continue;
    }
    const std::string& k = m->first;
    if (k[0] == 'k') {
      const size_t j = std::stoul(k.substr(1, k.find('.') - 1));
      if (k == "k" + std::to_string(j) + "." + std::to_string(generation[j])) ++generation[j];
    }
    if (retired != nullptr) (*retired)[k] = m->second.retention_deadline;
    m = model.erase(m);
  }
}

// The store against the pure state machine (core/state_machine.h) over a map
// that never reclaims: a small table (a few cache lines, so probe clusters
// cross lines and wrap from the last line to the first; the sweep deletes from
// them), every operation, and retentions, leases and clock steps around the
// sweep array's limits (2^31 and 2^32 ms, ~49.7 days, months, years, 10 years)
// and right onto deadlines. Every answer must match: a reclaim before a
// record's deadline shows as an acquired claim where the model answers
// duplicate or busy. The clock also steps back; keys whose deadline had passed
// before a step back are retired then (the store may have reclaimed them,
// which the model does not know).
TEST(MemoryStore, SmallTableMatchesTheStateMachineAcrossTheDeadlineArraysRange) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock, 2);
  std::map<std::string, Record> model;
  std::vector<int> generation(40, 0);
  std::mt19937_64 rng(11);
  const int64_t kDayMs = 86'400'000;
  const std::vector<int64_t> spans = {1,
                                      2,
                                      1000,
                                      (int64_t{1} << 31) - 1,
                                      int64_t{1} << 31,
                                      (int64_t{1} << 31) + 1,
                                      (int64_t{1} << 32) - 2,
                                      (int64_t{1} << 32) - 1,
                                      int64_t{1} << 32,
                                      (int64_t{1} << 32) + 1,
                                      50 * kDayMs,
                                      100 * kDayMs,
                                      3 * 365 * kDayMs,
                                      kMaxDuration.count()};
  auto span = [&] {
    int64_t v = spans[rng() % spans.size()];
    if (rng() % 2) v = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(v));
    return Millis(v);
  };
  const std::vector<int64_t> steps = {0, 1, 1, 7, 1000, 60'000, (int64_t{1} << 31) - 1, int64_t{1} << 31,
                                      (int64_t{1} << 32) - 1, 25 * kDayMs, 30 * kDayMs, 100 * kDayMs};
  for (int i = 0; i < 300'000; ++i) {
    const size_t idx = rng() % generation.size();
    const std::string key = "k" + std::to_string(idx) + "." + std::to_string(generation[idx]);
    const int op = static_cast<int>(rng() % 20);
    const int64_t now = clock.NowMillis();
    auto it = model.find(key);
    Record* cur = it == model.end() ? nullptr : &it->second;
    const std::string at = key + " at op " + std::to_string(i);
    if (op < 8) {
      bool acquired;
      ASSERT_NO_FATAL_FAILURE(ClaimBoth(*store, model, ModelClaim(key, span, rng), now, at, &acquired));
    } else if (op < 14) {
      const Token token = cur != nullptr && rng() % 8 != 0 ? cur->token : Token{rng()};
      const Millis d = span();
      ASSERT_NO_FATAL_FAILURE(WriteBoth(*store, model, key, op % 3, token, d, now, at));
    } else if (op < 15) {
      ASSERT_NO_FATAL_FAILURE(ForgetBoth(*store, model, key, rng() % 2, now, at));
    } else if (op < 16) {
      auto rec = store->Inspect(key);
      ASSERT_TRUE(rec.ok()) << at;
      const bool want = cur != nullptr && !cur->ExpiredAt(now) && !internal::IsFenceFloor(*cur);
      ASSERT_EQ(rec->has_value(), want) << at;
      if (want) {
        ASSERT_EQ(static_cast<int>((*rec)->state), static_cast<int>(cur->state)) << at;
        ASSERT_EQ((*rec)->lease_deadline, cur->lease_deadline) << at;
        ASSERT_EQ((*rec)->retention_deadline, cur->retention_deadline) << at;
      }
    } else if (op < 19) {
      int64_t step = steps[rng() % steps.size()];
      if (rng() % 2 && step > 1) step = static_cast<int64_t>(rng() % static_cast<uint64_t>(step));
      if (rng() % 3 == 0 && !model.empty()) {  // onto, or beside, a record's deadline
        auto pick = model.begin();
        std::advance(pick, static_cast<long>(rng() % model.size()));
        const int64_t deadline = rng() % 2 ? pick->second.retention_deadline : pick->second.lease_deadline;
        const int64_t to = deadline - 1 + static_cast<int64_t>(rng() % 3);
        if (to > now) step = to - now;
      }
      clock.Advance(Millis(step));
    } else {
      const int64_t back = rng() % 2 ? 1 + static_cast<int64_t>(rng() % 2000) : static_cast<int64_t>(rng() % (60 * kDayMs));
      clock.Set(now - back);
      RetireExpired(model, generation, now, nullptr);
    }
  }
  // Retired keys may still hold a record until the sweep gets to them.
  EXPECT_LE(internal::MemoryStorePhysicalRecords(store.get()), model.size() + generation.size());
}

// The sweep moves its base (Rebase, a pass over the shard's slots) while other
// threads claim and complete in the same shard and the clock jumps by up to a
// month at a time. No completed key may be claimed again before its retention
// deadline: a claim that acquires a key must have read a clock at or past
// (the clock before its Complete) + retention.
TEST(MemoryStore, NoEarlyReclaimWhileTheBaseMovesUnderConcurrentWrites) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  const int64_t kDayMs = 86'400'000;
  const std::vector<int64_t> keeps = {1, 1000, int64_t{1} << 31, (int64_t{1} << 32) - 1, int64_t{1} << 32,
                                      50 * kDayMs, 100 * kDayMs};
  std::atomic<bool> stop{false};
  std::atomic<int> early{0};
  auto worker = [&](int w) {
    std::mt19937_64 rng(100 + w);
    std::vector<std::pair<std::string, int64_t>> done;  // key, lower bound of its deadline
    for (int i = 0; i < 20'000; ++i) {
      if (!done.empty() && rng() % 2) {
        auto& [key, bound] = done[rng() % done.size()];
        ClaimRequest r;
        r.key = key;
        r.lease = kMaxDuration;  // Complete comes before the clock ends the lease
        auto c = store->Claim(r);
        ASSERT_TRUE(c.ok());
        if (c->acquired()) {
          if (clock.NowMillis() < bound) ++early;
          const int64_t before = clock.NowMillis();
          const int64_t keep = keeps[rng() % keeps.size()];
          auto done_now = store->Complete(key, c->token, Millis(keep), CompletionStatus::kOk, "");
          ASSERT_TRUE(done_now.ok());
          // LOST: the clock ran past the lease meanwhile; nothing to hold it to.
          bound = *done_now == WriteResult::kOk ? before + keep : 0;
        }
        continue;
      }
      const std::string key = "w" + std::to_string(w) + ":" + std::to_string(i);
      ClaimRequest r;
      r.key = key;
      r.lease = kMaxDuration;
      auto c = store->Claim(r);
      ASSERT_TRUE(c.ok() && c->acquired());
      const int64_t before = clock.NowMillis();
      const int64_t keep = keeps[rng() % keeps.size()];
      auto done_now = store->Complete(key, c->token, Millis(keep), CompletionStatus::kOk, "");
      ASSERT_TRUE(done_now.ok());
      done.emplace_back(key, *done_now == WriteResult::kOk ? before + keep : 0);
    }
  };
  std::thread ticker([&] {
    std::mt19937_64 rng(99);
    while (!stop.load()) {
      clock.Advance(Millis(1 + static_cast<int64_t>(rng() % (30 * kDayMs))));
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) workers.emplace_back(worker, w);
  for (auto& t : workers) t.join();
  stop = true;
  ticker.join();
  EXPECT_EQ(early.load(), 0);
}

// The sweep's shard-wide bound (it returns at once while nothing in the shard
// is due) against a model, for leaks as well as early reclaims: random claims,
// extends, completions, releases and forgets on a few hot keys, bulk claims of
// up to 5,000 new keys (so that the slots span chunks and the last one is
// partly filled), and clock steps forward (past the 2^31 ms rebase) and back
// (under and over the 1 s that moves the base back). At each check the store
// must hold every record the model keeps past the clock (none reclaimed early)
// and, after at most two passes of the sweep, none the model saw expire (none
// kept forever because the bound stayed above a deadline). Records whose
// deadline passed before a step back are retired: the store may or may not
// have reclaimed them before the step; they must be gone once the clock is past
// their deadline again.
TEST(MemoryStore, SweepBoundNeitherKeepsNorCutsShortAcrossChunksAndClockSteps) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock, 2);
  Model model;
  std::map<std::string, int64_t> retired;  // key -> retention deadline
  std::vector<int> generation(30, 0);
  std::mt19937_64 rng(23);
  const int64_t kDayMs = 86'400'000;
  const std::vector<int64_t> spans = {1, 2, 50, 1000, 60'000, (int64_t{1} << 31) + 1, 50 * kDayMs};
  auto span = [&] {
    int64_t v = spans[rng() % spans.size()];
    if (rng() % 2) v = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(v));
    return Millis(v);
  };
  size_t inserts = 0;  // acquired claims: at least the slots ever handed out
  auto claim = [&](const std::string& key, const std::string& at) {
    bool acquired;
    ASSERT_NO_FATAL_FAILURE(
        ClaimBoth(*store, model, ModelClaim(key, span, rng), clock.NowMillis(), at, &acquired));
    inserts += acquired;
  };
  auto check = [&](int round) {
    // A step back of under 1 s pauses the sweep until the clock is past its
    // base again (Sweep; a longer one moves the base back): after one sweep
    // and a second on, it runs.
    ASSERT_TRUE(store->Extend("drain", Token{1}, 1ms).ok());
    clock.Advance(1000ms);
    const int64_t now = clock.NowMillis();
    size_t keep = 0, maybe = 0, gone = 0;
    for (const auto& [k, rec] : model) rec.ExpiredAt(now) ? ++gone : ++keep;
    for (const auto& [k, deadline] : retired) maybe += deadline > now;
    const std::string at = "round " + std::to_string(round);
    ASSERT_GE(internal::MemoryStorePhysicalRecords(store.get()), keep) << at << ": reclaimed early";
    // Two passes (the cursor may be just past an expired record) at 8 slots a
    // call, and a call for every 2 records reclaimed.
    const size_t budget = 2 * (inserts / 8 + 2) + (gone + retired.size()) / 2 + 8;
    for (size_t i = 0; i < budget; ++i) {
      ASSERT_TRUE(store->Extend("drain", Token{1}, 1ms).ok());  // sweeps, writes nothing
    }
    const size_t phys = internal::MemoryStorePhysicalRecords(store.get());
    ASSERT_GE(phys, keep) << at << ": reclaimed early";
    ASSERT_LE(phys, keep + maybe) << at << ": expired records kept after two passes of the sweep";
    for (auto m = model.begin(); m != model.end();) m = m->second.ExpiredAt(now) ? model.erase(m) : std::next(m);
    std::erase_if(retired, [&](const auto& e) { return e.second <= now; });
  };
  for (int round = 0; round < 80; ++round) {
    if (rng() % 3 == 0) {  // bulk: new keys, up to a chunk and more
      const size_t n = 1 + rng() % 5000;
      for (size_t j = 0; j < n; ++j) {
        ASSERT_NO_FATAL_FAILURE(claim("b" + std::to_string(round) + "." + std::to_string(j), "bulk"));
      }
    }
    for (int i = 0; i < 200; ++i) {
      const size_t idx = rng() % generation.size();
      const std::string key = "k" + std::to_string(idx) + "." + std::to_string(generation[idx]);
      const std::string at = key + " round " + std::to_string(round) + " op " + std::to_string(i);
      const int64_t now = clock.NowMillis();
      auto it = model.find(key);
      Record* cur = it == model.end() ? nullptr : &it->second;
      const int op = static_cast<int>(rng() % 20);
      if (op < 8) {
        ASSERT_NO_FATAL_FAILURE(claim(key, at));
      } else if (op < 14) {
        const Token token = cur != nullptr && rng() % 8 != 0 ? cur->token : Token{rng() | 1};
        const Millis d = span();
        ASSERT_NO_FATAL_FAILURE(WriteBoth(*store, model, key, op % 3, token, d, now, at));
      } else if (op < 15) {
        ASSERT_NO_FATAL_FAILURE(ForgetBoth(*store, model, key, rng() % 2, now, at));
      } else if (op < 19) {
        const std::vector<int64_t> steps = {1, 7, 999, 1000, 60'000, int64_t{1} << 31, 30 * kDayMs};
        int64_t step = steps[rng() % steps.size()];
        if (rng() % 2 && step > 1) step = static_cast<int64_t>(rng() % static_cast<uint64_t>(step));
        clock.Advance(Millis(step));
      } else {
        const int64_t back =
            rng() % 2 ? 1 + static_cast<int64_t>(rng() % 2000) : static_cast<int64_t>(rng() % (60 * kDayMs));
        clock.Set(now - back);
        RetireExpired(model, generation, now, &retired);
      }
    }
    ASSERT_NO_FATAL_FAILURE(check(round));
    // And onto a record's deadline (or just past it): records in chunks the
    // sweep stepped over fall due with no write since.
    for (int j = 0; j < 3 && !model.empty(); ++j) {
      auto pick = model.begin();
      std::advance(pick, static_cast<long>(rng() % model.size()));
      const int64_t to = pick->second.retention_deadline - 1000 + static_cast<int64_t>(rng() % 2);
      if (to > clock.NowMillis()) clock.Set(to);
      ASSERT_NO_FATAL_FAILURE(check(round));
    }
  }
}

// ---- a randomized differential test of the whole store through growth ----------

// The same decisions as the store (internal::Decide*) on a std::map of records that
// are never reclaimed: an expired record answers as absent either way, so every
// answer but a fence (which restarts at 1 once the sweep has removed a record)
// must agree.
class ReferenceStore {
 public:
  ClaimResult Claim(const ClaimRequest& req, int64_t now, Token fresh) {
    const std::string key(req.key);
    auto it = records_.find(key);
    Record next;
    bool write = false;
    std::string at_limit;  // nothing gets near the limits here
    ClaimResult res = internal::DecideClaim(it == records_.end() ? nullptr : &it->second, req, now,
                                            fresh, &next, &write, &at_limit);
    if (write) {
      next.key = key;
      records_[key] = std::move(next);
    }
    return res;
  }
  template <typename Fn>
  WriteResult Update(const std::string& key, Fn&& decide) {
    auto it = records_.find(key);
    if (it == records_.end()) return WriteResult::kLost;
    Record r = it->second;
    const WriteResult w = decide(&r);
    if (w == WriteResult::kOk) it->second = std::move(r);
    return w;
  }
  // -1: refused (a lease is running); else whether it forgot something.
  int Forget(const std::string& key, bool force, int64_t now) {
    auto it = records_.find(key);
    Record floor;
    switch (internal::DecideForget(it == records_.end() ? nullptr : &it->second, force, now, &floor)) {
      case internal::ForgetAction::kNone:
        return 0;
      case internal::ForgetAction::kRefuse:
        return -1;
      case internal::ForgetAction::kFloor:
        floor.key = key;
        it->second = std::move(floor);
        return 1;
      case internal::ForgetAction::kRemove:
        records_.erase(it);
        return 1;
    }
    return 0;
  }
  // What Inspect shows (absent: expired or a fence floor).
  const Record* Visible(const std::string& key, int64_t now) const {
    auto it = records_.find(key);
    if (it == records_.end() || it->second.ExpiredAt(now) || internal::IsFenceFloor(it->second)) return nullptr;
    return &it->second;
  }
  std::vector<std::string> VisibleKeys(int64_t now) const {
    std::vector<std::string> keys;
    for (const auto& [k, r] : records_) {
      if (Visible(k, now) != nullptr) keys.push_back(k);
    }
    return keys;
  }
  Token TokenOf(const std::string& key) const {
    auto it = records_.find(key);
    return it == records_.end() ? Token{} : it->second.token;
  }

 private:
  std::map<std::string, Record> records_;
};

// Keys for the differential test: spread ones; ones whose home is one of a few
// index lines in every table of up to 16 k entries (the first line, and the last
// of tables of 4 k, 8 k and 16 k: long clusters that wrap round the table's end
// and straddle a move's start); pairs whose 32 hash bits an index entry keeps are
// equal (only the key tells them apart); and a third of them longer than a record
// holds inline. Shuffled, so that every kind comes in as the store grows.
std::vector<std::string> DifferentialKeys(size_t spread, size_t crowd) {
  std::vector<std::string> keys;
  auto pad = [](std::string k, size_t i) { return i % 3 == 0 ? k + std::string(28, '.') : k; };
  for (size_t i = 0; i < spread; ++i) keys.push_back(pad("s" + std::to_string(i), i));
  size_t crowded = 0;
  for (size_t i = 0; crowded < crowd; ++i) {
    std::string k = pad("c" + std::to_string(i), i);
    const uint64_t line = internal::MemoryStoreKeyHash(k) & 0x3FF8;
    if (line == 0 || line == 0x0FF8 || line == 0x1FF8 || line == 0x3FF8) {
      keys.push_back(std::move(k));
      ++crowded;
    }
  }
  std::vector<std::pair<uint32_t, std::string>> tags;
  for (size_t i = 0; i < (size_t{1} << 18); ++i) {
    std::string k = "t" + std::to_string(i);
    tags.emplace_back(static_cast<uint32_t>(internal::MemoryStoreKeyHash(k)), std::move(k));
  }
  std::sort(tags.begin(), tags.end());
  size_t twins = 0;
  for (size_t i = 1; i < tags.size(); ++i) {
    if (tags[i].first == tags[i - 1].first) {
      keys.push_back(tags[i - 1].second);
      keys.push_back(tags[i].second);
      ++twins;
    }
  }
  EXPECT_GE(twins, 2u) << "pairs of keys with equal index tags";
  std::shuffle(keys.begin(), keys.end(), std::mt19937_64(5));
  return keys;
}

// The store against ReferenceStore, operation by operation: claims (single and
// batched, with and without fingerprints and attempt limits), completions,
// extends, releases (by the owner or with a stale token), forgets (forced or
// not), inspections, scans, and the clock moving so that leases end and records
// expire and are reclaimed by the sweep, while the keys in play grow so that
// every shard doubles its index several times and then churns near its
// threshold (also in the last of 64 shards, whose threshold is the highest).
// Every index is checked (MemoryStoreCheckIndex) after every
// operation while any shard grows or the store is small, and every 256
// operations otherwise.
TEST(MemoryStore, MatchesTheStateMachineThroughGrowthWithCollidingKeys) {
  const std::vector<std::string> spread = DifferentialKeys(9000, 3000);
  // Keys all of the last of 64 shards, the one whose doubling starts at the
  // highest load (~0.73): its tables grow to 16 k entries there.
  std::vector<std::string> last;
  for (size_t i = 0; last.size() < 9000; ++i) {
    std::string k = "h" + std::to_string(i) + (i % 3 == 0 ? std::string(28, '.') : "");
    if (internal::MemoryStoreKeyHash(k) >> 58 == 63) last.push_back(std::move(k));
  }
  struct Config {
    size_t shards, reclaim;
    int ops;
    bool last_shard;
  };
  size_t growing_checks = 0;
  for (const Config& cfg : {Config{1, 1, 60'000, false}, Config{1, 16, 40'000, false}, Config{4, 4, 40'000, false},
                            Config{64, 2, 30'000, false}, Config{64, 4, 40'000, true}}) {
    SCOPED_TRACE("shards " + std::to_string(cfg.shards) + ", reclaim " + std::to_string(cfg.reclaim) +
                 (cfg.last_shard ? ", keys of the last shard" : ""));
    const std::vector<std::string>& pool = cfg.last_shard ? last : spread;
    SimulatedClock clock;
    auto store = ShardedStore(&clock, cfg.shards, cfg.reclaim);
    ReferenceStore ref;
    std::mt19937_64 rng(cfg.shards * 1000 + cfg.reclaim);
    // Keys used lately come again often: a record erased (forgotten, reclaimed)
    // in the middle of a move is looked up and claimed again before the move ends.
    std::vector<size_t> recent(64, 0);
    auto pick = [&](int i) -> const std::string& {
      const size_t reach = std::min(pool.size(), static_cast<size_t>(32 + i / 2));
      size_t& r = recent[rng() % recent.size()];
      if (rng() % 3 != 0) r = rng() % reach;
      return pool[r];
    };
    auto request = [&](const std::string& key) {
      ClaimRequest r;
      r.key = key;
      r.lease = Millis(1 + rng() % 50);
      r.retention = Millis(rng() % 2 == 0 ? 3'600'000 : 1 + rng() % 400);
      static const std::string prints[] = {"", "", "", "fp-a", "fp-b"};
      r.fingerprint = prints[rng() % 5];
      r.max_attempts = rng() % 8 == 0 ? 2 : 0;
      return r;
    };
    auto same = [](const ClaimResult& got, const ClaimResult& want) {
      return got.outcome == want.outcome && got.attempt == want.attempt && got.status == want.status &&
             got.result == want.result && got.lease_left == want.lease_left &&
             (!want.acquired() || got.token == want.token);
    };
    for (int i = 0; i < cfg.ops; ++i) {
      const int64_t now = clock.NowMillis();
      const std::string& key = pick(i);
      const int op = static_cast<int>(rng() % 40);
      std::string what = std::to_string(op) + " on '" + key + "' at " + std::to_string(i);
      if (op < 18) {
        const ClaimRequest r = request(key);
        auto c = store->Claim(r);
        ASSERT_TRUE(c.ok()) << what << ": " << c.status();
        const ClaimResult want = ref.Claim(r, now, c->acquired() ? c->token : Token{});
        ASSERT_TRUE(same(*c, want)) << what << ": " << *c << " vs " << want;
      } else if (op < 20) {
        std::vector<std::string> keys;
        std::vector<ClaimRequest> reqs;
        const size_t n = 1 + rng() % 4;
        for (size_t j = 0; j < n; ++j) keys.push_back(pick(i));
        for (const std::string& k : keys) reqs.push_back(request(k));
        auto b = store->ClaimBatch(reqs);
        ASSERT_TRUE(b.ok()) << what << ": " << b.status();
        ASSERT_EQ(b->size(), n);
        for (size_t j = 0; j < n; ++j) {
          const ClaimResult want = ref.Claim(reqs[j], now, (*b)[j].acquired() ? (*b)[j].token : Token{});
          ASSERT_TRUE(same((*b)[j], want)) << what << ", batch " << j << " '" << keys[j] << "': " << (*b)[j]
                                           << " vs " << want;
        }
      } else if (op < 29) {
        // The owner's token mostly, a stale or made-up one sometimes.
        Token token = rng() % 6 != 0 ? ref.TokenOf(key) : Token{1 + rng() % 1000};
        if (!token.valid()) token = Token{1 + rng() % 1000};  // no record: a made-up one
        const int kind = static_cast<int>(rng() % 3);
        StatusOr<WriteResult> got = WriteResult::kLost;
        WriteResult want;
        if (kind == 0) {
          const Millis keep(rng() % 2 == 0 ? 3'600'000 : 1 + rng() % 400);
          const std::string result = rng() % 2 == 0 ? "" : "result-" + std::to_string(i);
          got = store->Complete(key, token, keep, CompletionStatus::kOk, result);
          want = ref.Update(key, [&](Record* rec) {
            return internal::DecideComplete(rec, token, keep, CompletionStatus::kOk, result, now);
          });
        } else if (kind == 1) {
          const Millis lease(1 + rng() % 50);
          got = store->Extend(key, token, lease);
          want = ref.Update(key, [&](Record* rec) { return internal::DecideExtend(rec, token, lease, now); });
        } else {
          const Millis keep(1 + rng() % 400);
          got = store->Release(key, token, keep);
          want = ref.Update(key, [&](Record* rec) { return internal::DecideRelease(rec, token, keep, now); });
        }
        ASSERT_TRUE(got.ok()) << what << ": " << got.status();
        ASSERT_EQ(*got, want) << what << ", write " << kind;
      } else if (op < 34) {
        const bool force = rng() % 2 == 0;
        auto f = store->Forget(key, ForgetOptions{.force = force});
        const int want = ref.Forget(key, force, now);
        if (want < 0) {
          ASSERT_FALSE(f.ok()) << what;
          ASSERT_EQ(f.status().code(), StatusCode::kFailedPrecondition) << what;
        } else {
          ASSERT_TRUE(f.ok()) << what << ": " << f.status();
          ASSERT_EQ(*f, want == 1) << what;
        }
        // At once, before an insert reuses its slot or the move goes on: an
        // entry left behind in the old table must not be found.
        auto gone = store->Inspect(key);
        ASSERT_TRUE(gone.ok()) << what;
        ASSERT_EQ(gone->has_value(), ref.Visible(key, now) != nullptr) << what;
      } else if (op < 38) {
        auto got = store->Inspect(key);
        ASSERT_TRUE(got.ok()) << what;
        const Record* want = ref.Visible(key, now);
        ASSERT_EQ(got->has_value(), want != nullptr) << what;
        if (want != nullptr) {
          const Record& g = **got;
          ASSERT_EQ(g.key, key) << what;
          ASSERT_EQ(g.state, want->state) << what;
          ASSERT_EQ(g.token, want->token) << what;
          ASSERT_EQ(g.attempt, want->attempt) << what;
          ASSERT_EQ(g.lease_deadline, want->lease_deadline) << what;
          ASSERT_EQ(g.retention_deadline, want->retention_deadline) << what;
          ASSERT_EQ(g.fingerprint, want->fingerprint) << what;
          ASSERT_EQ(g.status, want->status) << what;
          ASSERT_EQ(g.result, want->result) << what;
        }
      } else {
        clock.Advance(std::chrono::milliseconds(rng() % 6));
      }
      const internal::MemoryStoreIndexStats st = internal::MemoryStoreIndex(store.get());
      const bool growing = st.moving + st.filling != 0;
      if (growing || i % 256 == 0 || internal::MemoryStorePhysicalRecords(store.get()) < 512) {
        ASSERT_EQ(internal::MemoryStoreCheckIndex(store.get()), "") << "after " << what;
        growing_checks += growing;
      }
      if (i % 4096 == 4095) {
        auto all = store->Scan("", 1'000'000);
        ASSERT_TRUE(all.ok());
        std::vector<std::string> got;
        for (const Record& r : all->records) got.push_back(r.key);
        std::sort(got.begin(), got.end());
        ASSERT_EQ(got, ref.VisibleKeys(clock.NowMillis())) << "scan after " << what;
      }
    }
    const internal::MemoryStoreIndexStats st = internal::MemoryStoreIndex(store.get());
    EXPECT_GE(st.doublings, cfg.shards == 64 && !cfg.last_shard ? 48u : 5u);
  }
  EXPECT_GT(growing_checks, 1000u);
}

}  // namespace
}  // namespace dedup
