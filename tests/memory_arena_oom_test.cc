// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The memory store's index arena when the heap is exhausted: giving a table back
// (a shard's destructor, a table replaced as it grows) must not allocate, or a
// std::bad_alloc escapes a destructor and terminates the process. And a claim
// whose key cannot be copied changes nothing. This binary
// replaces the global operator new with one that throws while g_fail is set
// (every other allocation goes to malloc as usual), so it has a binary of its own.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <string_view>
#include <vector>

#include "dedup/clock.h"
#include "dedup/memory_store.h"
#include "dedup/store.h"
#include "stores/memory/memory_store_internal.h"

namespace {
std::atomic<bool> g_fail{false};
std::atomic<long> g_refused{0};

void* Allocate(std::size_t n, std::size_t align) {
  if (g_fail.load(std::memory_order_relaxed)) {
    g_refused.fetch_add(1, std::memory_order_relaxed);
    throw std::bad_alloc();
  }
  if (n == 0) n = 1;
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n)
                : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

// Every replaceable form, so that new and delete always pair (malloc and free).
void* operator new(std::size_t n) { return Allocate(n, 0); }
void* operator new[](std::size_t n) { return Allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return Allocate(n, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t n, std::align_val_t a) { return Allocate(n, static_cast<std::size_t>(a)); }
void* operator new(std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return Allocate(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept {
  try {
    return Allocate(n, 0);
  } catch (...) {
    return nullptr;
  }
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace dedup {
namespace {

using namespace std::chrono_literals;

// A store of one shard (on `clock`, or the system's), and a claim request for
// `key` (a view: the caller keeps the key).
std::unique_ptr<Store> OneShardStore(Clock* clock = nullptr) {
  MemoryStoreOptions o;
  o.clock = clock;
  o.shards = 1;
  return NewMemoryStore(o);
}
ClaimRequest Request(std::string_view key) {
  ClaimRequest r;
  r.key = key;
  r.lease = 60s;
  r.retention = 600s;
  return r;
}

// Runs `fn` while the heap refuses every allocation; true when it threw
// std::bad_alloc.
template <typename Fn>
bool ThrowsBadAlloc(Fn&& fn) {
  g_fail = true;
  bool threw = false;
  try {
    fn();
  } catch (const std::bad_alloc&) {
    threw = true;
  }
  g_fail = false;
  return threw;
}

// A store of two shards whose index tables (40 000 records: 256 KiB each) come
// from the arena.
std::unique_ptr<Store> FilledStore() {
  MemoryStoreOptions o;
  o.shards = 2;
  auto store = NewMemoryStore(o);
  for (int i = 0; i < 40000; ++i) {
    const std::string key = "key-" + std::to_string(i);
    auto c = store->Claim(Request(key));
    if (!c.ok() || !c->acquired()) std::abort();
  }
  return store;
}

// Destroying the store gives every shard's table back to the arena with the heap
// refusing every allocation: the process must survive it (before the fix, the
// arena's std::set allocated a node per freed block, and the bad_alloc left
// ~Shard: std::terminate).
TEST(MemoryArenaOomTest, FreeingTablesWhileTheHeapRefusesDoesNotThrow) {
  EXPECT_EXIT(
      {
        auto store = FilledStore();
        g_refused = 0;
        g_fail = true;
        store.reset();
        g_fail = false;
        std::exit(g_refused == 0 ? 0 : 4);  // 4: the free allocated but swallowed it
      },
      ::testing::ExitedWithCode(0), "");
}

// A key longer than a record holds inline (24 bytes) is copied to the heap as
// the claim inserts it. When that allocation fails, the claim fails
// (std::bad_alloc) and the store is as it was. Before, the index entry was
// written first: it stayed, pointing to a record without its key, which no
// lookup found.
TEST(MemoryArenaOomTest, AClaimWhoseKeyCannotBeCopiedLeavesTheStoreAsItWas) {
  auto store = OneShardStore();
  ASSERT_TRUE(store->Claim(Request("warm")).ok());  // the shard's index and first chunk exist
  const std::string long_key(40, 'k');
  const ClaimRequest r = Request(long_key);
  ASSERT_TRUE(ThrowsBadAlloc([&] { (void)store->Claim(r); }));
  EXPECT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 1u);
  auto c = store->Claim(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->acquired());
  EXPECT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 2u);
}

// A completion whose result needs the record's heap part (a key kept inline,
// no fingerprint: the record had none) when that allocation fails: the
// completion fails (std::bad_alloc) and the record is as it was, IN_PROGRESS
// under its lease, so that the owner can complete it again. Before, the record
// was written COMPLETED without its result: a later claim got DUPLICATE and an
// empty result, and the owner, told its completion failed, could not redo it.
TEST(MemoryArenaOomTest, ACompletionWhoseResultCannotBeKeptChangesNothing) {
  auto store = OneShardStore();
  const ClaimRequest r = Request("k");
  auto c = store->Claim(r);
  ASSERT_TRUE(c.ok() && c->acquired());
  ASSERT_TRUE(ThrowsBadAlloc(
      [&] { (void)store->Complete("k", c->token, 600s, CompletionStatus::kOk, "receipt"); }));
  auto busy = store->Claim(r);
  ASSERT_TRUE(busy.ok()) << busy.status();
  EXPECT_EQ(busy->outcome, ClaimOutcome::kBusy) << "result '" << busy->result << "'";
  auto w = store->Complete("k", c->token, 600s, CompletionStatus::kOk, "receipt");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, WriteResult::kOk);
  auto dup = store->Claim(r);
  ASSERT_TRUE(dup.ok()) << dup.status();
  EXPECT_EQ(dup->outcome, ClaimOutcome::kDuplicate);
  EXPECT_EQ(dup->result, "receipt");
  EXPECT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
}

// A claim of a new key whose record needs its heap part (a fingerprint, the key
// kept inline) when that allocation fails: the claim fails (std::bad_alloc) and
// the key reads as absent (Insert marked the new slot expired). That slot must
// not outlive the key's absence either: the sweep reclaims it like any expired
// record. Before, its sweep deadline stayed "never" (Insert left the slot's
// entry in the chunk's deadlines as the free slot's), so the slot stayed,
// counted, until the same key was claimed again, which may never happen.
TEST(MemoryArenaOomTest, AClaimWhoseRecordCannotBeWrittenLeavesNothingTheSweepKeeps) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  ClaimRequest warm = Request("warm");
  warm.lease = 1s;
  warm.retention = 1s;
  ASSERT_TRUE(store->Claim(warm).ok());  // the shard's index and first chunk exist
  ClaimRequest r = Request("k");
  r.fingerprint = "fp";  // short: the request's copy needs no allocation
  ASSERT_TRUE(ThrowsBadAlloc([&] { (void)store->Claim(r); }));
  auto absent = store->Inspect("k");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE(absent->has_value());
  clock.Advance(3600s);  // "warm" expired too
  for (int i = 0; i < 8; ++i) {  // each claim sweeps up to 4 expired records
    const std::string key = "later-" + std::to_string(i);
    ASSERT_TRUE(store->Claim(Request(key)).ok());
  }
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 8u)
      << "the expired 'warm' and the slot of the refused claim are reclaimed";
  EXPECT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  auto c = store->Claim(r);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->acquired());
  EXPECT_EQ(c->fence, 1u);
}

// A forget that removes a record gives its slot back (the shard's free list, a
// vector that may grow). When that allocation fails, the forget fails
// (std::bad_alloc) and the record is as it was. Before, the slot was freed
// first: its index entry stayed, pointing to a free slot that a lookup of the
// key (kept inline) still found, and that no insert or sweep would touch again.
TEST(MemoryArenaOomTest, AForgetWhoseSlotCannotBeListedFreeChangesNothing) {
  auto store = OneShardStore();
  const ClaimRequest r = Request("k");
  auto c = store->Claim(r);
  ASSERT_TRUE(c.ok() && c->acquired());
  ASSERT_EQ(*store->Complete("k", c->token, 600s, CompletionStatus::kOk, ""), WriteResult::kOk);
  ASSERT_TRUE(ThrowsBadAlloc([&] { (void)store->Forget("k"); }));
  EXPECT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 1u);
  auto f = store->Forget("k");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(*f);
  EXPECT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 0u);
  auto again = store->Claim(r);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->acquired());
}

// The sweep removes an expired record with Erase, which lists its slot free
// first (the free list, a vector, may grow). When that allocation fails, the
// operation fails (std::bad_alloc) and the record stays, expired: a later sweep
// must still remove it. Before, the sweep's cursor had already stepped past the
// slot, so the chunk's bound of its deadlines (min_due), made from the slots
// the cursor read, left out the expired one: every later sweep found nothing
// due and returned at once, and the record stayed until another record of its
// chunk came due (here 600 s later).
TEST(MemoryArenaOomTest, AnExpiredRecordWhoseSweepCouldNotFreeItIsSweptLater) {
  SimulatedClock clock;
  auto store = OneShardStore(&clock);
  ClaimRequest brief = Request("brief");  // the slab's first slot, where the sweep starts
  brief.lease = 1s;
  brief.retention = 1s;
  ASSERT_TRUE(store->Claim(brief).ok());
  std::vector<std::string> keys;
  for (int i = 0; i < 8; ++i) keys.push_back("kept-" + std::to_string(i));  // 600 s each
  for (const std::string& k : keys) ASSERT_TRUE(store->Claim(Request(k)).ok());
  clock.Advance(2s);  // "brief" has expired; nothing has been freed yet (the free list is empty)
  ASSERT_TRUE(ThrowsBadAlloc([&] { (void)store->Claim(Request(keys[0])); }));
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 9u) << "nothing was removed";
  EXPECT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  for (const std::string& k : keys) {  // BUSY: each sweeps, and writes nothing
    auto c = store->Claim(Request(k));
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->outcome, ClaimOutcome::kBusy);
  }
  EXPECT_EQ(internal::MemoryStorePhysicalRecords(store.get()), 8u)
      << "the expired 'brief' is reclaimed once the heap gives again";
  EXPECT_EQ(internal::MemoryStoreCheckIndex(store.get()), "");
  auto absent = store->Inspect("brief");
  ASSERT_TRUE(absent.ok()) << absent.status();
  EXPECT_FALSE(absent->has_value());
}

}  // namespace
}  // namespace dedup
