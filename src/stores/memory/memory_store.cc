// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// How the memory store keeps records, and why (docs/DESIGN.md, "Memory store: no
// allocation per record"):
//
// A store that lives as long as its worker must cost the same on its millionth
// hour as on its first. The first design (absl::flat_hash_map<std::string, ...>
// plus a heap of (deadline, key copy) for reclaim) made two small allocations per
// record — a 20-byte key does not fit libstdc++'s 15-byte inline string — and
// freed them again on reclaim. Its speed then depended on the history of glibc's
// heap: in a process that had allocated and freed a gigabyte before, perf showed
// half the time in _int_malloc / unlink_chunk / malloc_consolidate, windows of
// 200 ms collapsing to a tenth of the median, and single calls of 230 ms
// (`dedup bench --phase memory_stall`).
//
// So each shard owns its memory outright and makes no allocation per record:
//
//  - Records sit in a slab of 64-byte slots (one cache line), in chunks of 4096
//    mapped straight from the kernel (mmap), never moved. A key of up to 24
//    bytes is stored in the slot; a longer key, a fingerprint or a result moves
//    the key out to one heap block (Extra) for that record only.
//  - An index of 8-byte entries (32 hash bits + slot number), open addressing
//    with linear probing from the start of a cache line (IndexHome) and
//    backward-shift deletion (no tombstones), also mmapped. It grows by
//    doubling; since an entry carries its hash bits, a doubling moves 8-byte
//    entries and never reads a record or a key. A doubling is spread over the
//    inserts that follow it, a few entries each, old and new table side by side
//    meanwhile (Shard::GrowStep): done in one call it stalled every shard at
//    about the same time (docs/DESIGN.md). Tables of 64 KiB to 1 MiB share
//    the store's IndexArena of huge pages (a random probe then costs no page
//    walk).
//  - Reclaim sweeps the slab with a cursor: each operation looks at a few slots
//    after the cursor (in a compact array of their deadlines, to the
//    millisecond, so that only an expired record's slot is read) and frees the
//    expired ones (their slot goes on a free list and is reused by the next
//    insert). No heap of deadlines, no key copies.
//  - The index of a shard past ~4 k records lives on transparent huge pages:
//    random reads over 4 KiB pages were the long run's p99.9 (MapHuge,
//    IndexArena; docs/DESIGN.md). The slots do not (AddChunk says why).

#include "dedup/memory_store.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "core/printable.h"
#include "core/state_machine.h"
#include "stores/memory/memory_store_internal.h"

// Under AddressSanitizer the index arena poisons its free blocks, so that a
// read or write of a table after its shard gave it back is reported (ASan
// knows nothing of mmapped memory otherwise). Without ASan these do nothing.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define DEDUP_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define DEDUP_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define DEDUP_POISON(p, n) ((void)(p), (void)(n))
#define DEDUP_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace dedup {
namespace {

using internal::DecideClaim;
using internal::DecideComplete;
using internal::DecideExtend;
using internal::DecideForget;
using internal::DecideRelease;
using internal::ForgetAction;
using internal::IsFenceFloor;
using internal::LeasedForgetError;

// ---- hashing ------------------------------------------------------------------

__extension__ typedef unsigned __int128 U128;

inline uint64_t Mix(uint64_t a, uint64_t b) {
  const U128 r = static_cast<U128>(a) * b;
  return static_cast<uint64_t>(r) ^ static_cast<uint64_t>(r >> 64);
}

inline uint64_t Load64(const char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

inline uint64_t LoadTail(const char* p, size_t n) {  // 1 to 7 bytes
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return v;
}

// A wyhash-style hash: two 64x64->128 multiplies per 16 bytes.
uint64_t HashKey(std::string_view k) {
  constexpr uint64_t s0 = 0xa0761d6478bd642full, s1 = 0xe7037ed1a0b428dbull, s2 = 0x8ebc6af09c88c6e3ull;
  const char* p = k.data();
  size_t n = k.size();
  uint64_t h = s0 ^ (n * s2);
  while (n >= 16) {
    h = Mix(Load64(p) ^ s1, Load64(p + 8) ^ h);
    p += 16;
    n -= 16;
  }
  uint64_t a = 0, b = 0;
  if (n >= 8) {
    a = Load64(p);
    b = n > 8 ? LoadTail(p + 8, n - 8) : 0;
  } else if (n > 0) {
    a = LoadTail(p, n);
  }
  return Mix(Mix(a ^ s1, b ^ h) ^ s2, k.size() ^ s0);
}

// ---- memory from the kernel ------------------------------------------------------

void* MapBytes(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

void UnmapBytes(void* p, size_t bytes) {
  if (p != nullptr) munmap(p, bytes);
}

constexpr size_t kHugePage = size_t{2} << 20;

// Like MapBytes, but a region of at least 2 MiB is aligned to 2 MiB and asks for
// transparent huge pages (MADV_HUGEPAGE; the kernel's default here is
// "madvise", so without it every page is 4 KiB). A lookup in a large index
// lands on a random entry: with 4 KiB pages each one is a TLB miss, and on a
// virtual machine a few in ten thousand of those took 50 us to 1 ms (the
// p99.9 of `dedup bench --phase memory_stall --full`; docs/DESIGN.md). Smaller
// regions stay on 4 KiB pages: a huge page would make an almost empty shard
// cost 2 MiB of RSS. Without THP the advice is ignored and nothing changes.
// Free with UnmapBytes(p, bytes).
void* MapHuge(size_t bytes) {
  if (bytes < kHugePage) return MapBytes(bytes);
  const size_t span = bytes + kHugePage;
  auto* raw = static_cast<char*>(MapBytes(span));
  const uintptr_t at = (reinterpret_cast<uintptr_t>(raw) + kHugePage - 1) & ~(kHugePage - 1);
  char* p = reinterpret_cast<char*>(at);
  if (p > raw) munmap(raw, static_cast<size_t>(p - raw));
  char* end = p + bytes;
  if (end < raw + span) munmap(end, static_cast<size_t>(raw + span - end));
#ifdef MADV_HUGEPAGE
  madvise(p, bytes, MADV_HUGEPAGE);  // advice: failure leaves 4 KiB pages
#endif
  return p;
}

// ---- index tables of middle size: one arena of huge pages per store ------------

// Index tables of 64 KiB up to 1 MiB, carved by a buddy allocator out of 2 MiB
// regions on transparent huge pages (MapHuge) that the store's shards share.
//
// Every lookup reads one index line at random. A shard's own table reaches
// 2 MiB (MapHuge's own threshold) only at ~196 k records, 12.6 M in a store of
// 64 shards; below that the tables were on 4 KiB pages, 64 MiB of them at 5 M
// records, so that nearly every claim of a fresh key missed the TLB, and the
// page walk (two levels of it on a virtual machine) stalled the very prefetch
// meant to hide the line's miss: 70 % of ClaimValidated's samples in perf sat
// on that prefetch and the load after it. On shared regions a table of any of
// these sizes costs no slack beyond the arena's last region and the spares.
//
// Smaller tables (a store of up to ~4 k records a shard) stay on 4 KiB pages,
// so that a small store does not take 2 MiB. Called under a shard's lock (StartGrow, GrowStep,
// ~Shard); the arena's own lock is taken inside it, never the other way round.
class IndexArena {
 public:
  static constexpr size_t kMin = size_t{64} << 10;  // order 0
  static constexpr int kRegionOrder = 5;             // kMin << 5 = 2 MiB: a whole region
  static_assert((kMin << kRegionOrder) == kHugePage);

  IndexArena() = default;
  IndexArena(const IndexArena&) = delete;
  IndexArena& operator=(const IndexArena&) = delete;
  ~IndexArena() {
    for (const Region& r : regions_) {
      void* p = reinterpret_cast<void*>(r.base);
      DEDUP_UNPOISON(p, kHugePage);  // the addresses may be mapped again, for anything
      UnmapBytes(p, kHugePage);
    }
  }

  static bool Serves(size_t bytes) { return bytes >= kMin && bytes < kHugePage; }

  // A block of `bytes` (a power of two that Serves), 64-byte aligned; its
  // contents are undefined (recycled memory is not zeroed). Throws
  // std::bad_alloc when no region can be mapped or recorded.
  void* Alloc(size_t bytes) {
    std::lock_guard lock(mu_);
    const int want = OrderOf(bytes);
    Region* from = nullptr;
    int o = want;
    for (; o <= kRegionOrder && from == nullptr; ++o) {
      for (Region& r : regions_) {  // the lowest free block of the smallest order
        if ((r.free & OrderMask(o)) != 0) {
          from = &r;
          break;
        }
      }
    }
    --o;
    if (from == nullptr) {
      // Room for the region's entry first: once mapped, nothing may throw.
      if (regions_.size() == regions_.capacity()) regions_.reserve(std::max<size_t>(8, 2 * regions_.size()));
      void* p = MapHuge(kHugePage);
      DEDUP_POISON(p, kHugePage);
      const Region fresh{reinterpret_cast<uintptr_t>(p), Bit(kRegionOrder, 0)};
      from = &*regions_.insert(
          std::lower_bound(regions_.begin(), regions_.end(), fresh.base,
                           [](const Region& r, uintptr_t b) { return r.base < b; }),
          fresh);
      ++whole_free_;
      o = kRegionOrder;
    }
    const uint64_t in_order = from->free & OrderMask(o);
    size_t index = static_cast<size_t>(std::countr_zero(in_order)) - OrderShift(o);
    from->free &= ~Bit(o, index);
    if (o == kRegionOrder) --whole_free_;
    while (o > want) {  // split: keep the lower half, free the upper one
      --o;
      index *= 2;
      from->free |= Bit(o, index + 1);
    }
    auto* block = reinterpret_cast<void*>(from->base + index * (kMin << want));
    DEDUP_UNPOISON(block, bytes);
    return block;
  }

  // Returns a block from Alloc(bytes), merging it with its free buddies. A
  // region that becomes wholly free is kept for the next tables (at most
  // kSpareRegions of them: in a doubling round the old tables free regions
  // just as the new ones want them, and a fresh huge page costs its first touch
  // of 2 MiB) or given back to the kernel. Allocates nothing and never throws:
  // it runs in a shard's destructor (the free blocks are bits of their region's
  // word, not nodes of a container that would allocate on insert).
  void Free(void* p, size_t bytes) noexcept {
    std::lock_guard lock(mu_);
    DEDUP_POISON(p, bytes);
    const uintptr_t at = reinterpret_cast<uintptr_t>(p);
    const uintptr_t base = at & ~(uintptr_t{kHugePage} - 1);  // regions are 2 MiB-aligned
    const auto it = std::lower_bound(regions_.begin(), regions_.end(), base,
                                     [](const Region& r, uintptr_t b) { return r.base < b; });
    Region& r = *it;  // a block of ours: its region is there
    int o = OrderOf(bytes);
    size_t index = (at - base) / (kMin << o);
    while (o < kRegionOrder && (r.free & Bit(o, index ^ 1)) != 0) {
      r.free &= ~Bit(o, index ^ 1);
      index /= 2;
      ++o;
    }
    if (o == kRegionOrder) {
      if (whole_free_ >= kSpareRegions) {
        void* region = reinterpret_cast<void*>(base);
        regions_.erase(it);  // moves trivially copyable entries: no allocation
        DEDUP_UNPOISON(region, kHugePage);
        UnmapBytes(region, kHugePage);
        return;
      }
      ++whole_free_;
    }
    r.free |= Bit(o, index);
  }

 private:
  // A mapped 2 MiB region and its free blocks: one bit per block of each order,
  // 32 of order 0 (bits 0-31), 16 of order 1 (32-47), ... 1 of order 5 (bit 62).
  struct Region {
    uintptr_t base;
    uint64_t free;
  };
  static constexpr size_t kSpareRegions = 2;
  static int OrderOf(size_t bytes) { return std::countr_zero(bytes / kMin); }
  static constexpr size_t OrderShift(int o) { return 64 - (size_t{64} >> o); }  // 0, 32, 48, ...
  static constexpr uint64_t OrderMask(int o) {
    return ((uint64_t{1} << (size_t{32} >> o)) - 1) << OrderShift(o);
  }
  static constexpr uint64_t Bit(int o, size_t index) { return uint64_t{1} << (OrderShift(o) + index); }

  std::mutex mu_;
  std::vector<Region> regions_;  // every region mapped, by address
  size_t whole_free_ = 0;        // regions wholly free (the spares)
};

// ---- a record ------------------------------------------------------------------

constexpr size_t kInlineKey = 24;
constexpr uint8_t kKeyOut = 0xFF;  // key_len: the key is in extra

struct Extra {
  std::string key;
  std::string fingerprint;
  std::string result;
};

struct Slot {
  int64_t lease_deadline;
  int64_t retention_deadline;
  uint64_t token;
  uint64_t fence;
  uint32_t attempt;
  uint8_t live;  // 1: holds a record; 0: free
  RecordState state;
  CompletionStatus status;
  uint8_t key_len;  // <= kInlineKey: the key is in `key`; kKeyOut: in extra
  union {
    char key[kInlineKey];
    Extra* extra;
  };

  std::string_view Key() const {
    return key_len == kKeyOut ? std::string_view(extra->key) : std::string_view(key, key_len);
  }
  bool ExpiredAt(int64_t now) const { return now >= retention_deadline; }

  // The heap part a new record needs (made before anything changes: it may
  // throw): for a key longer than kInlineKey, or when the record has a
  // fingerprint or result (`heap`); null for a key kept inline otherwise.
  static std::unique_ptr<Extra> KeyOut(std::string_view k, bool heap) {
    return k.size() <= kInlineKey && !heap ? nullptr
                                           : std::make_unique<Extra>(Extra{std::string(k), {}, {}});
  }
  // `out`: KeyOut(k). Never throws.
  void SetKey(std::string_view k, std::unique_ptr<Extra> out) noexcept {
    if (out == nullptr) {
      key_len = static_cast<uint8_t>(k.size());
      std::memcpy(key, k.data(), k.size());
    } else {
      extra = out.release();
      key_len = kKeyOut;
    }
  }

  void FreeExtra() {
    if (key_len == kKeyOut) {
      delete extra;
      key_len = 0;
    }
  }

  void ToRecord(Record* r) const {
    r->state = state;
    r->token = Token{token};
    r->fence = fence;
    r->attempt = attempt;
    r->lease_deadline = lease_deadline;
    r->retention_deadline = retention_deadline;
    r->status = status;
    if (key_len == kKeyOut) {
      r->fingerprint = extra->fingerprint;
      r->result = extra->result;
    } else {
      r->fingerprint.clear();
      r->result.clear();
    }
  }

  // Takes the record's fields; the key stays.
  // The heap part a fingerprint or result needs is allocated first: when that
  // throws, the record is as it was (never half-written).
  void FromRecord(Record&& r) {
    const bool need_extra = !r.fingerprint.empty() || !r.result.empty();
    if (need_extra && key_len != kKeyOut) {
      extra = new Extra{std::string(key, key_len), {}, {}};
      key_len = kKeyOut;
    }
    state = r.state;
    token = r.token.value;
    fence = r.fence;
    attempt = r.attempt;
    lease_deadline = r.lease_deadline;
    retention_deadline = r.retention_deadline;
    status = r.status;
    if (key_len == kKeyOut) {
      extra->fingerprint = std::move(r.fingerprint);
      extra->result = std::move(r.result);
      if (!need_extra && extra->key.size() <= kInlineKey) {  // back inline
        Extra* e = extra;
        key_len = static_cast<uint8_t>(e->key.size());
        std::memcpy(key, e->key.data(), e->key.size());
        delete e;
      }
    }
  }
};
static_assert(sizeof(Slot) == 64, "a record is one cache line");

// ---- one shard -------------------------------------------------------------------

constexpr uint32_t kNoSlot = 0xFFFFFFFFu;

struct IndexEntry {
  uint32_t hash;  // the low 32 bits of the key's hash: its home (IndexHome)
  uint32_t slot;  // kNoSlot: empty
};

// An entry's home position: the first entry of the cache line (8 entries) its
// hash picks. Linear probing works with any home; starting every probe at a
// line's start means a lookup reads one line unless that line is full, where a
// home anywhere in the line ran past its end about as often as not. At the
// load of 10^7 retained (~0.72), in a simulation of the table: lines a lookup
// of an absent key reads 1.68 -> 1.48, an erase 2.13 -> 1.76.
constexpr size_t kLineEntries = 64 / sizeof(IndexEntry);
inline size_t IndexHome(uint32_t hash, size_t mask) { return hash & mask & ~(kLineEntries - 1); }

class alignas(64) Shard {
 public:
  Shard() = default;
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;
  ~Shard() {
    for (uint32_t i = 0; i < used_; ++i) {
      if (At(i).live) At(i).FreeExtra();
    }
    for (Chunk* c : chunks_) delete c;
    for (const auto& [p, bytes] : maps_) UnmapBytes(p, bytes);
    if (index_ != nullptr) FreeIndex(index_, mask_ + 1);
    if (next_ != nullptr) FreeIndex(next_, 2 * (mask_ + 1));
    if (old_ != nullptr) FreeIndex(old_, old_mask_ + 1);
  }

  std::mutex mu;

  // Called without the lock, before taking it: starts loading the index line a
  // lookup of hash `h` will read, so the cache miss overlaps the lock. Reads
  // only the hint below (a stale one is harmless: prefetch never faults).
  void Prefetch(uint64_t h) const {
    const uintptr_t base = hint_base_.load(std::memory_order_relaxed);
    if (base == 0) return;
    const size_t mask = hint_mask_.load(std::memory_order_relaxed);
    const size_t home = IndexHome(static_cast<uint32_t>(h), mask);
    __builtin_prefetch(reinterpret_cast<const void*>(base + home * sizeof(IndexEntry)));
  }

  // The slot holding `key`, or nullptr. Sets *pos to the index position where
  // `key` is (kInOld set when that is in the old table, see GrowStep) or would be
  // inserted (always in the current table).
  Slot* Find(std::string_view key, uint64_t h, size_t* pos) {
    if (index_ == nullptr) [[unlikely]] MakeFirstIndex();
    const uint32_t tag = static_cast<uint32_t>(h);
    for (size_t i = IndexHome(tag, mask_);; i = (i + 1) & mask_) {
      const IndexEntry e = index_[i];
      if (e.slot == kNoSlot) {
        *pos = i;
        return old_ == nullptr ? nullptr : FindOld(key, tag, pos);
      }
      if (e.hash == tag) {
        Slot& s = At(e.slot);
        if (s.Key() == key) {
          *pos = i;
          return &s;
        }
      }
    }
  }

  // A new slot for `key` at index position `pos` (from a Find that returned null).
  // `heap`: the record to be written has a fingerprint or result, so that the
  // caller's FromRecord allocates nothing (and cannot throw).
  Slot& Insert(std::string_view key, uint64_t h, size_t pos, uint32_t* number, bool heap) {
    // Load above grow_at_ / 1024: the next table is mapped now (it may throw:
    // nothing has changed yet), and filled by this insert and the next ones.
    if (next_ == nullptr && old_ == nullptr && (count_ + 1) * 1024 > (mask_ + 1) * grow_at_) [[unlikely]] {
      StartGrow();
    }
    // The key's copy (and the record's heap part) next (it may throw: nothing
    // has changed yet either), so that no index entry is written for a record
    // without its key, and the record's FromRecord does not allocate.
    std::unique_ptr<Extra> out = Slot::KeyOut(key, heap);
    uint32_t n;
    if (!free_.empty()) {
      n = free_.back();
      free_.pop_back();
    } else {
      if (used_ == chunks_.size() * kChunkSlots) AddChunk();
      n = used_++;
    }
    index_[pos] = {static_cast<uint32_t>(h), n};
    ++count_;
    Slot& s = At(n);
    s.live = 1;
    // Expired, so absent (fence 0: the next claim's is 1), until the caller's
    // FromRecord writes the record. (It does not allocate, given `heap`: a slot
    // left so would never be swept, its due[] being the free slot's kNeverDue.)
    s.retention_deadline = 0;
    s.fence = 0;
    *number = n;
    s.SetKey(key, std::move(out));
    // With the record in: a step of growth moves entries (pos is stale after it).
    if (next_ != nullptr || old_ != nullptr) [[unlikely]] GrowStep();
    return s;
  }

  // Removes the record at index position `pos` (from Find).
  void Erase(size_t pos) {
    IndexEntry* table = index_;
    size_t mask = mask_;
    if ((pos & kInOld) != 0) [[unlikely]] {
      // In the old table's part not yet moved. The shift below only fills holes
      // at or after pos, all in that part: it stops at the first empty entry, at
      // the latest at move_from_ (empty when the move began, and nothing is
      // ever inserted into the old table).
      table = old_;
      mask = old_mask_;
      pos &= ~kInOld;
    }
    const uint32_t n = table[pos].slot;
    // The free list first: it may grow (and throw), and nothing has changed yet.
    // A slot freed before it threw kept its index entry, found by its key.
    free_.push_back(n);
    Slot& s = At(n);
    s.FreeExtra();
    s.live = 0;
    chunks_[n >> kChunkShift]->due[n & (kChunkSlots - 1)] = kNeverDue;
    --count_;
    // Backward-shift deletion: pull later entries of the cluster into the hole.
    size_t hole = pos;
    for (size_t j = (pos + 1) & mask;; j = (j + 1) & mask) {
      const IndexEntry e = table[j];
      if (e.slot == kNoSlot) break;
      const size_t home = IndexHome(e.hash, mask);
      // The entry may move to the hole if the hole lies cyclically in [home, j).
      const bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        table[hole] = e;
        hole = j;
      }
    }
    table[hole] = {0, kNoSlot};
  }

  // Looks at up to 4 * `most` slots after the sweep cursor and removes up to
  // `most` expired records among them. It reads the chunks' compact deadline
  // arrays (16 slots per cache line), and a slot itself only when it has
  // expired: the deadline there is the record's own, to the millisecond. (It
  // was in whole seconds: every record due later in the current second was
  // read and passed over, up to 16 slot lines a call, each a cache miss — 12 of
  // the ~16 lines a claim missed in callgrind at 10^7 retained.)
  //
  // A chunk in which nothing is due (its min_due, a lower bound of its
  // deadlines, is in the future) is stepped over whole, for four slots' worth
  // of the budget (a call reads at most a few chunk headers when nothing is due
  // anywhere). Without that, the cursor crawled through long runs of records
  // kept for hours (10^7 retained: ~40 chunks a shard) at 16 slots a call while
  // short-lived records expired behind it; it then met them all at once and
  // every call removed `most` of them: windows of 200 ms at under half the
  // median, in CPU time too (`dedup bench --phase memory_stall --full`).
  //
  // When nothing in the whole shard is due (min_due_, a lower bound of every
  // deadline in it, is in the future) it returns at once. In a store whose
  // records all live longer than the sweep takes to go round, that is every
  // call; stepping over four chunk headers each time was ~130 of a claim's
  // ~1,100 instructions (callgrind, bench/claim_steps).
  void Sweep(int64_t now, size_t most) {
    if (used_ == 0) return;
    // Forward every ~24.9 days. Back when the clock has stepped back by a
    // second or more (an NTP step): else nothing would be due by the array, and
    // no record reclaimed, until the clock caught up with the old base. A
    // smaller step back only pauses the sweep that long (no pass over the
    // slots for each millisecond of jitter).
    if (now - due_base_ >= kRebaseAfter || due_base_ - now >= kRebaseBack) Rebase(now);
    if (now < due_base_) return;
    const uint32_t now_d = static_cast<uint32_t>(now - due_base_);
    if (min_due_ > now_d) return;
    SweepDue(now, now_d, most);
  }

  // The sweep proper (see Sweep).
  void SweepDue(int64_t now, uint32_t now_d, size_t most) {
    size_t removed = 0;
    for (size_t k = 0; k < 4 * most && removed < most; ++k) {
      if (cursor_ >= used_) {  // a pass over every chunk is over: min_due_ is exact again
        // The last chunk may be partial. Scanned up to used_ (not stepped
        // over), its scan_min covers every slot in use (the rest are free,
        // kNeverDue): its min_due is exact too, else it would stay as low as
        // its lowest deadline ever until the chunk filled, and min_due_ with it.
        Chunk& last = *chunks_[(used_ - 1) >> kChunkShift];
        if (cursor_ == used_ && (used_ & (kChunkSlots - 1)) != 0) last.min_due = last.scan_min;
        pass_min_ = std::min(pass_min_, last.min_due);
        min_due_ = pass_min_;
        pass_min_ = kNeverDue;
        cursor_ = 0;
      }
      const uint32_t n = cursor_;
      Chunk& c = *chunks_[n >> kChunkShift];
      const uint32_t i = n & (kChunkSlots - 1);
      if (i == 0) {  // a chunk begins
        if (c.min_due > now_d) {
          pass_min_ = std::min(pass_min_, c.min_due);
          cursor_ = n + kChunkSlots;
          k += 3;
          continue;
        }
        c.scan_min = kNeverDue;
      }
      if (c.due[i] <= now_d) {  // a live record past its retention deadline
        Slot& s = At(n);
        if (s.live && s.ExpiredAt(now)) {
          const std::string_view key = s.Key();
          size_t pos;
          Find(key, HashKey(key), &pos);
          // Its due becomes kNeverDue. It may throw (std::bad_alloc: the free
          // list could not grow) with nothing changed: the cursor is still at
          // this slot, and the next sweep reads it again. Stepped past, its due
          // would be missing from the chunk's scan_min, so from min_due: every
          // later sweep would find nothing due and keep the expired record
          // until another record of its chunk came due.
          Erase(pos);
          ++removed;
        } else if (s.live) {  // its due was low (saturated, or lowered by a rebase)
          SetDue(n, s.retention_deadline);
        }
      }
      ++cursor_;
      c.scan_min = std::min(c.scan_min, c.due[i]);
      if (i == kChunkSlots - 1) {  // the whole chunk was seen
        c.min_due = c.scan_min;
        pass_min_ = std::min(pass_min_, c.min_due);
      }
    }
  }

  // The slot number of the record Find found at index position `pos`.
  uint32_t NumberAt(size_t pos) const {
    return (pos & kInOld) == 0 ? index_[pos].slot : old_[pos & ~kInOld].slot;
  }
  // After the retention deadline of slot `n` was written.
  void Touched(uint32_t n) { SetDue(n, At(n).retention_deadline); }

  size_t size() const { return count_; }
  size_t doublings() const { return doublings_; }
  size_t most_growth_work() const { return most_growth_work_; }
  bool filling() const { return next_ != nullptr; }
  bool moving() const { return old_ != nullptr; }

  // For tests: "" when the index holds every live slot exactly once (in the
  // current table, or in the old table's part not yet moved) under its key's
  // hash, where Find finds it, and nothing else, and no table is fuller than
  // growth allows; else what is wrong.
  std::string CheckIndex() {
    if (index_ == nullptr) return count_ == 0 ? "" : "records but no index";
    std::vector<uint8_t> seen(used_, 0);
    size_t entries = 0;
    std::string err;
    auto visit = [&](const IndexEntry& e, size_t pos) {
      if (!err.empty()) return;
      if (e.slot >= used_ || !At(e.slot).live) {
        err = "an entry of free slot " + std::to_string(e.slot);
        return;
      }
      const std::string key(At(e.slot).Key());
      if (seen[e.slot]++ != 0) {
        err = "'" + key + "' indexed twice";
        return;
      }
      const uint64_t h = HashKey(key);
      size_t found = 0;
      if (static_cast<uint32_t>(h) != e.hash) {
        err = "'" + key + "' under another hash";
      } else if (Find(key, h, &found) != &At(e.slot) || found != pos) {
        err = "'" + key + "' not found where it is";
      }
      ++entries;
    };
    size_t in_current = 0;
    for (size_t i = 0; i <= mask_; ++i) {
      if (index_[i].slot != kNoSlot) {
        visit(index_[i], i);
        ++in_current;
      }
    }
    // The bound growth keeps (StartGrow, GrowStep): a table is replaced by the
    // time its load reaches 3/4, and a move ends before the new one is half full.
    if (err.empty() && 4 * in_current > 3 * (mask_ + 1)) {
      err = std::to_string(in_current) + " entries in a table of " + std::to_string(mask_ + 1);
    }
    if (err.empty() && old_ != nullptr && 2 * count_ > mask_ + 1) {
      err = std::to_string(count_) + " records in the middle of a move to a table of " + std::to_string(mask_ + 1);
    }
    if (old_ != nullptr) {
      for (size_t i = 0; i <= old_mask_; ++i) {
        if (!Moved(i) && old_[i].slot != kNoSlot) visit(old_[i], i | kInOld);
      }
    }
    if (!err.empty()) return err;
    if (entries != count_) return std::to_string(entries) + " entries for " + std::to_string(count_) + " records";
    for (uint32_t i = 0; i < used_; ++i) {
      if (At(i).live && seen[i] == 0) return "live slot " + std::to_string(i) + " not indexed";
    }
    return "";
  }
  // Once, before the first record: the store's clock now, where index tables
  // of middle size come from (it outlives the shard), and the shard's number.
  void Init(int64_t now, IndexArena* arena, size_t number) {
    due_base_ = now;
    arena_ = arena;
    grow_at_ = 512 + (number % 64) * 15 / 4;  // see StartGrow
  }

  template <typename Fn>
  void ForEach(Fn&& fn) {
    for (uint32_t i = 0; i < used_; ++i) {
      if (At(i).live && !fn(At(i))) return;
    }
  }

 private:
  static constexpr uint32_t kChunkShift = 12;
  static constexpr uint32_t kChunkSlots = 1u << kChunkShift;  // 256 KiB of slots
  static constexpr size_t kChunkBytes = kChunkSlots * sizeof(Slot);
  static constexpr size_t kChunksPerBatch = 8;  // 2 MiB of slots
  static constexpr uint32_t kNeverDue = 0xFFFFFFFFu;
  // The deadlines in the chunks are milliseconds after due_base_ (a reading of
  // the store's clock), so that 4 bytes hold one to the millisecond; ~24.9 days
  // after due_base_, Rebase moves it to the present. Due values ahead of base by
  // up to ~49.7 days are exact; later deadlines are stored low (kNeverDue - 1),
  // which costs the sweep a read of the slot when it gets there, never a late
  // reclaim.
  static constexpr int64_t kRebaseAfter = int64_t{1} << 31;
  static constexpr int64_t kRebaseBack = 1000;  // ms the clock stepped back (Sweep)

  // Beside each chunk of slots (slots_), each slot's retention deadline in
  // milliseconds after due_base_ (never above the slot's own; kNeverDue when
  // free) for the sweep. min_due is at
  // most every due[] of the chunk (lowered by SetDue, made exact again each time
  // the sweep has seen the whole chunk); scan_min is the sweep's running minimum.
  struct Chunk {
    uint32_t due[kChunkSlots];
    uint32_t min_due;
    uint32_t scan_min;
  };

  Slot& At(uint32_t n) { return slots_[n >> kChunkShift][n & (kChunkSlots - 1)]; }

  // Adds a chunk of kChunkSlots slots. A shard's first kChunksPerBatch chunks
  // are mapped one by one (a small store stays small); after that, slots come
  // kChunksPerBatch chunks (2 MiB) at a time from one mapping.
  //
  // All on 4 KiB pages. Slots were on transparent huge pages past the first 8
  // chunks, but slots are not where the random reads are: a new record fills
  // the slab's next slot or one the sweep has just freed near its cursor, and
  // the calls that read a record (complete, extend, a redelivered claim)
  // mostly come soon after its claim, on a recent page; every call reads the
  // index at random (on huge pages: IndexArena, MapHuge). A huge page
  // is zeroed whole at its first touch; on this KVM guest a fresh one cost 6-10
  // ms (memory the host backs anew) against 1.7-2.1 ms for the same 2 MiB in
  // 4 KiB faults, and claim_steps with 5 M claims spent 0.87-1.07 s in the
  // kernel with huge slots against 0.29-0.34 s without, the same user time.
  void AddChunk() {
    if (spare_chunks_ == 0) {
      const size_t count = chunks_.size() >= kChunksPerBatch ? kChunksPerBatch : 1;
      const size_t bytes = count * kChunkBytes;
      spare_ = static_cast<Slot*>(MapBytes(bytes));
      maps_.emplace_back(spare_, bytes);
      spare_chunks_ = count;
    }
    auto* c = new Chunk;
    for (uint32_t& d : c->due) d = kNeverDue;
    c->min_due = c->scan_min = kNeverDue;
    chunks_.push_back(c);
    slots_.push_back(spare_);
    spare_ += kChunkSlots;
    --spare_chunks_;
  }
  void SetDue(uint32_t n, int64_t retention_deadline) {
    // Deadlines are within 20 years of a clock reading; no overflow.
    const int64_t rel = retention_deadline - due_base_;
    const uint32_t d = rel <= 0 ? 0 : rel >= kNeverDue ? kNeverDue - 1 : static_cast<uint32_t>(rel);
    Chunk& c = *chunks_[n >> kChunkShift];
    c.due[n & (kChunkSlots - 1)] = d;
    c.min_due = std::min(c.min_due, d);
    c.scan_min = std::min(c.scan_min, d);
    min_due_ = std::min(min_due_, d);
    pass_min_ = std::min(pass_min_, d);
  }

  // Moves due_base_ to `now` and every stored deadline with it (those already
  // past become 0; moving back, those beyond the range become kNeverDue - 1). A
  // saturated deadline ends up lower than its slot's: the sweep reads that slot
  // early and stores it again (Sweep). O(slots), once in ~24.9 days of the
  // store's clock, and once per step back of the clock.
  void Rebase(int64_t now) {
    const int64_t delta = now - due_base_;
    due_base_ = now;
    auto shift = [delta](uint32_t d) -> uint32_t {
      if (d == kNeverDue || d == 0) return d;  // 0: due at or before the old base
      const int64_t moved = static_cast<int64_t>(d) - delta;
      return moved <= 0 ? 0 : moved >= kNeverDue ? kNeverDue - 1 : static_cast<uint32_t>(moved);
    };
    for (Chunk* c : chunks_) {
      for (uint32_t& d : c->due) d = shift(d);
      c->min_due = shift(c->min_due);
      c->scan_min = shift(c->scan_min);
    }
    min_due_ = shift(min_due_);
    pass_min_ = shift(pass_min_);
  }

  // ---- growth of the index, a few entries per insert ----
  //
  // The index doubles as its load nears 3/4. Doing it in one go (make a table
  // twice the size empty, move every entry into it) made one insert per shard
  // take milliseconds, and with keys spread evenly all shards cross the load
  // at about the same time: 64 such calls in a row, 200 ms windows of claims at
  // a tenth of the median (docs/DESIGN.md, "Memory store: growth without a
  // stall"). So, as Redis's dict does, a doubling is spread over inserts:
  //
  //  1. Filling: at a load between 1/2 and ~0.73 (grow_at_ / 1024, a
  //     threshold of its own for each of 64 shards, evenly spaced), StartGrow
  //     maps the next table (next_); each insert from then on makes
  //     fill_per_insert_ (kFillPerInsert) of its entries empty: it is all
  //     empty after 1/128 of the old size's inserts, before a load of 3/4.
  //     Meanwhile the current table takes the inserts. The fill is also what
  //     first touches the new table's memory: a fresh 2 MiB huge page is
  //     zeroed by the kernel at its first touch (~4.5 ms of CPU on the KVM
  //     guest of docs/PERFORMANCE.md; a table of up to 1 MiB is in one, shared
  //     in the arena). Done at once, 64 shards crossing 3/4 together met 32 to
  //     128 such faults in a row; the thresholds spread over loads 1/2 to
  //     ~3/4 put them apart.
  //
  //     Each shard's growth is short (fill and move together 1/64 of its
  //     inserts per doubling) and the thresholds are apart, so that only a few
  //     shards grow at a time: a table of the arena then reuses the blocks
  //     that shards grown earlier gave back. A fill of 8-15 entries an insert
  //     from thresholds over 1/2-5/8 (the first version) kept the old tables
  //     of every shard until all new ones were mapped: twice the fresh huge
  //     pages of a doubling in one call, and the 3.1 M round's faults paid
  //     from 2.1 M records on (docs/PERFORMANCE.md, "Memory store: claims
  //     while growing").
  //  2. Moving: when next_ is all empty it becomes the current table (inserts
  //     and lookups go there first) and the one before is old_; each insert
  //     moves the entries of kMovePerInsert old positions, in order from
  //     move_from_ (a position empty when the move began) round the table.
  //     A lookup that misses in the current table looks in old_'s part not yet
  //     moved (FindOld); an erase there shifts only within that part (Erase).
  //     Moved entries stay in old_ but are never read again.
  //  3. When every old position is moved, old_ goes back.
  //
  // The move ends long before the current table fills again: it takes
  // N / kMovePerInsert inserts, and the new table of 2N entries starts at a
  // load of 3/8 at most (below 1/2 at the move's end). A short move also
  // means few lookups that probe both tables. A shard that takes no
  // more inserts stays in the middle of its growth; lookups then cost a probe
  // of both tables.
  static constexpr size_t kMovePerInsert = 128;
  static constexpr size_t kFillPerInsert = 256;
  static constexpr size_t kFirstIndex = 64;
  static_assert(kFirstIndex * 3 / 4 + kFirstIndex / kMovePerInsert < kFirstIndex,
                "a move ends before the new table is half full");
  static constexpr size_t kInOld = size_t{1} << (8 * sizeof(size_t) - 1);  // Find's pos: in old_

  void MakeFirstIndex() {
    index_ = AllocIndex(kFirstIndex);
    for (size_t i = 0; i < kFirstIndex; ++i) index_[i] = {0, kNoSlot};
    mask_ = kFirstIndex - 1;
    hint_base_.store(reinterpret_cast<uintptr_t>(index_), std::memory_order_relaxed);
    hint_mask_.store(mask_, std::memory_order_relaxed);
  }

  void StartGrow() {
    const size_t size = mask_ + 1;
    next_ = AllocIndex(2 * size);  // contents undefined until filled
    filled_ = 0;
    // 2 * size entries to fill before the load reaches 3/4: kFillPerInsert a
    // step, which from every threshold of grow_at_ (at most ~0.73) is done by
    // a load of ~0.74; the bound below holds whatever the load at the start.
    const size_t room = size * 3 / 4 > count_ ? size * 3 / 4 - count_ : 1;
    fill_per_insert_ = std::max(kFillPerInsert, (2 * size + room - 1) / room);
    ++doublings_;
  }

  // One insert's share of the growth under way.
  void GrowStep() {
    size_t work = 0;
    if (next_ != nullptr) {
      const size_t size = 2 * (mask_ + 1);
      const size_t end = std::min(size, filled_ + fill_per_insert_);
      std::fill(next_ + filled_, next_ + end, IndexEntry{0, kNoSlot});
      work = end - filled_;
      filled_ = end;
      if (filled_ == size) SwitchTables();
    } else {
      const size_t n = old_mask_ + 1;
      const size_t end = std::min(n, moved_ + kMovePerInsert);
      work = end - moved_;
      for (; moved_ < end; ++moved_) {
        const IndexEntry e = old_[(move_from_ + moved_) & old_mask_];
        if (e.slot == kNoSlot) continue;
        size_t p = IndexHome(e.hash, mask_);
        while (index_[p].slot != kNoSlot) p = (p + 1) & mask_;
        index_[p] = e;
      }
      if (moved_ == n) {
        FreeIndex(old_, n);
        old_ = nullptr;
      }
    }
    most_growth_work_ = std::max(most_growth_work_, work);
  }

  // The filled next table becomes the current one; the move begins.
  void SwitchTables() {
    old_ = index_;
    old_mask_ = mask_;
    index_ = next_;
    mask_ = 2 * old_mask_ + 1;
    next_ = nullptr;
    // An empty position to start from (the load is below 1): a cluster never
    // wraps past it, so a probe in the part not yet moved stays in that part.
    size_t from = 0;
    while (old_[from].slot != kNoSlot) ++from;
    move_from_ = from;
    moved_ = 0;
    hint_base_.store(reinterpret_cast<uintptr_t>(index_), std::memory_order_relaxed);
    hint_mask_.store(mask_, std::memory_order_relaxed);
  }

  // Whether old position `i` has been moved to the current table.
  bool Moved(size_t i) const { return ((i - move_from_) & old_mask_) < moved_; }

  // Find's second half while a move is under way: `key` in old_'s part not yet
  // moved. A probe from a home already moved starts where the move is: every
  // entry of that home's cluster between the two is in the current table, and
  // the old table is unchanged there (moved entries stay, so its clusters hold
  // together). *pos is set only when the key is found.
  Slot* FindOld(std::string_view key, uint32_t tag, size_t* pos) {
    size_t i = IndexHome(tag, old_mask_);
    if (Moved(i)) i = (move_from_ + moved_) & old_mask_;
    for (;; i = (i + 1) & old_mask_) {
      const IndexEntry e = old_[i];
      if (e.slot == kNoSlot) return nullptr;
      if (e.hash == tag) {
        Slot& s = At(e.slot);
        if (s.Key() == key) {
          *pos = i | kInOld;
          return &s;
        }
      }
    }
  }

  // An index table of `entries` entries: from the arena in its size range,
  // else mapped (MapHuge: 4 KiB pages below 2 MiB, huge pages from there).
  IndexEntry* AllocIndex(size_t entries) {
    const size_t bytes = entries * sizeof(IndexEntry);
    return static_cast<IndexEntry*>(IndexArena::Serves(bytes) ? arena_->Alloc(bytes) : MapHuge(bytes));
  }
  void FreeIndex(IndexEntry* table, size_t entries) {
    const size_t bytes = entries * sizeof(IndexEntry);
    if (IndexArena::Serves(bytes)) {
      arena_->Free(table, bytes);
    } else {
      UnmapBytes(table, bytes);
    }
  }

  IndexArena* arena_ = nullptr;
  IndexEntry* index_ = nullptr;  // the current table: inserts go here, lookups look here first
  size_t mask_ = 0;
  IndexEntry* next_ = nullptr;  // while filling: the next table, 2 * (mask_ + 1) entries
  size_t filled_ = 0;           // its entries made empty so far
  size_t fill_per_insert_ = 0;  // StartGrow
  size_t grow_at_ = 640;        // the load, in 1024ths, at which the next table is made (Init)
  IndexEntry* old_ = nullptr;   // while moving: the table before, old_mask_ + 1 entries
  size_t old_mask_ = 0;
  size_t move_from_ = 0;  // an old position empty when the move began
  size_t moved_ = 0;      // old positions moved so far, from move_from_ on
  std::atomic<uintptr_t> hint_base_{0};  // index_ and mask_ for Prefetch
  std::atomic<size_t> hint_mask_{0};
  size_t count_ = 0;
  size_t doublings_ = 0;         // internal::MemoryStoreIndex
  size_t most_growth_work_ = 0;  // entries written or moved by one call for a doubling
  std::vector<Chunk*> chunks_;
  std::vector<Slot*> slots_;                      // chunk k's slots: slots_[k][0 .. kChunkSlots)
  std::vector<std::pair<void*, size_t>> maps_;    // the mappings slots_ point into
  Slot* spare_ = nullptr;                         // the next chunk's slots in the last mapping
  size_t spare_chunks_ = 0;                       // chunks left there
  uint32_t used_ = 0;  // slots ever handed out (the slab's high-water mark)
  std::vector<uint32_t> free_;
  uint32_t cursor_ = 0;
  // Like a chunk's min_due and scan_min, for the whole shard: min_due_ is at
  // most every due[] of the shard (lowered by SetDue, made exact again when the
  // sweep's cursor wraps round), pass_min_ the minimum of the chunks the cursor
  // has passed since it last wrapped (and of every SetDue since).
  uint32_t min_due_ = kNeverDue;
  uint32_t pass_min_ = kNeverDue;
  int64_t due_base_ = 0;  // see kRebaseAfter; Init when the store is made
};

// ---- the store --------------------------------------------------------------------

class MemoryStore final : public Store {
 public:
  explicit MemoryStore(const MemoryStoreOptions& o)
      : clock_(o.clock != nullptr ? o.clock : Clock::System()),
        sweep_(o.reclaim_per_operation),
        // Clamped first: bit_ceil of a value above 2^63 is undefined, and 2^40
        // shards threw bad_alloc out of a factory that returns no status.
        shard_bits_(std::countr_zero(std::bit_ceil(std::clamp<size_t>(o.shards, 1, kMaxMemoryShards)))),
        shards_(size_t{1} << shard_bits_) {
    const int64_t now = clock_->NowMillis();
    for (size_t i = 0; i < shards_.size(); ++i) shards_[i].Init(now, &arena_, i);
  }

  StatusOr<ClaimResult> Claim(const ClaimRequest& req) override {
    if (!ClaimRequestValid(req)) [[unlikely]] DEDUP_RETURN_IF_ERROR(ValidateClaim(req));
    return ClaimValidated(req);
  }

  StatusOr<std::vector<ClaimResult>> ClaimBatch(std::span<const ClaimRequest> reqs) override {
    DEDUP_RETURN_IF_ERROR(ValidateClaimBatch(reqs));
    std::vector<ClaimResult> out;
    out.reserve(reqs.size());
    for (const ClaimRequest& r : reqs) {
      StatusOr<ClaimResult> res = ClaimValidated(r);
      if (!res.ok()) [[unlikely]] {
        ReleaseAcquired(*this, reqs, out);  // nobody will hold them (store.h)
        return res.status();
      }
      out.push_back(std::move(res).value());
    }
    return out;
  }

  StatusOr<WriteResult> Extend(std::string_view key, Token token, Millis lease) override {
    DEDUP_RETURN_IF_ERROR(ValidateExtend(key, token, lease));
    return Update(key, [&](Record* r, int64_t now) { return DecideExtend(r, token, lease, now); });
  }

  StatusOr<WriteResult> Complete(std::string_view key, Token token, Millis retention,
                                 CompletionStatus status, std::string_view result) override {
    DEDUP_RETURN_IF_ERROR(ValidateComplete(key, token, retention, status, result));
    return Update(key, [&](Record* r, int64_t now) {
      return DecideComplete(r, token, retention, status, result, now);
    });
  }

  StatusOr<WriteResult> Release(std::string_view key, Token token, Millis retention) override {
    DEDUP_RETURN_IF_ERROR(ValidateRelease(key, token, retention));
    return Update(key, [&](Record* r, int64_t now) {
      return DecideRelease(r, token, retention, now);
    });
  }

  StatusOr<std::optional<Record>> Inspect(std::string_view key) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    const uint64_t h = HashKey(key);
    Shard& s = ShardFor(h);
    std::lock_guard lock(s.mu);
    const int64_t now = clock_->NowMillis();
    size_t pos;
    Slot* slot = s.Find(key, h, &pos);
    if (slot == nullptr || slot->ExpiredAt(now)) return std::optional<Record>();
    Record r;
    slot->ToRecord(&r);
    if (IsFenceFloor(r)) return std::optional<Record>();
    r.key.assign(key);
    return std::optional<Record>(std::move(r));
  }

  StatusOr<bool> Forget(std::string_view key, const ForgetOptions& options) override {
    DEDUP_RETURN_IF_ERROR(ValidateKey(key));
    const uint64_t h = HashKey(key);
    Shard& s = ShardFor(h);
    std::lock_guard lock(s.mu);
    const int64_t now = clock_->NowMillis();
    size_t pos;
    Slot* slot = s.Find(key, h, &pos);
    if (slot == nullptr) return false;
    Record cur, floor;
    slot->ToRecord(&cur);
    switch (DecideForget(&cur, options.force, now, &floor)) {
      case ForgetAction::kNone:
        return false;
      case ForgetAction::kRefuse:
        return LeasedForgetError(key, Millis(cur.lease_deadline - now));
      case ForgetAction::kFloor:
        slot->FromRecord(std::move(floor));
        s.Touched(s.NumberAt(pos));
        return true;
      case ForgetAction::kRemove:
        break;
    }
    s.Erase(pos);
    return true;
  }

  // Every record is decodable here: it is kept as a Slot, never as bytes.
  StatusOr<ScanResult> Scan(std::string_view prefix, size_t limit,
                            const ScanOptions& options) override {
    ScanResult result;
    std::vector<Record>& out = result.records;
    const int64_t now = clock_->NowMillis();
    for (Shard& s : shards_) {
      std::lock_guard lock(s.mu);
      s.ForEach([&](const Slot& r) {
        if (out.size() >= limit) return false;
        const std::string_view k = r.Key();
        if (r.ExpiredAt(now) || !k.starts_with(prefix)) return true;
        out.emplace_back();
        r.ToRecord(&out.back());
        if (IsFenceFloor(out.back())) {
          out.pop_back();
          return true;
        }
        out.back().key = k;
        result.result_bytes.push_back(out.back().result.size());
        if (!options.with_results) std::string().swap(out.back().result);
        return true;
      });
      if (out.size() >= limit) break;
    }
    return result;
  }

  std::string Describe() const override { return "memory:"; }

  size_t PhysicalRecords() {
    size_t n = 0;
    for (Shard& s : shards_) {
      std::lock_guard lock(s.mu);
      n += s.size();
    }
    return n;
  }

  internal::MemoryStoreIndexStats IndexStats() {
    internal::MemoryStoreIndexStats st;
    for (Shard& s : shards_) {
      std::lock_guard lock(s.mu);
      st.doublings += s.doublings();
      st.most_growth_work = std::max(st.most_growth_work, s.most_growth_work());
      st.filling += s.filling();
      st.moving += s.moving();
    }
    return st;
  }

  std::string CheckIndex() {
    for (size_t i = 0; i < shards_.size(); ++i) {
      std::lock_guard lock(shards_[i].mu);
      std::string err = shards_[i].CheckIndex();
      if (!err.empty()) return "shard " + std::to_string(i) + ": " + err;
    }
    return "";
  }

 private:
  // The top bits pick the shard; the index inside uses the low ones.
  Shard& ShardFor(uint64_t h) { return shards_[shard_bits_ == 0 ? 0 : h >> (64 - shard_bits_)]; }

  // DataLoss, nothing changed, for a record whose fence or attempt is at the
  // largest it holds (DecideClaim).
  StatusOr<ClaimResult> ClaimValidated(const ClaimRequest& req) {
    const uint64_t h = HashKey(req.key);
    Shard& s = ShardFor(h);
    s.Prefetch(h);
    const Token fresh = Token::Random();
    std::lock_guard lock(s.mu);
    const int64_t now = clock_->NowMillis();
    s.Sweep(now, sweep_);
    size_t pos;
    Slot* slot = s.Find(req.key, h, &pos);
    thread_local Record cur, next;
    thread_local std::string at_limit;
    if (slot != nullptr) slot->ToRecord(&cur);
    bool write = false;
    ClaimResult res =
        DecideClaim(slot == nullptr ? nullptr : &cur, req, now, fresh, &next, &write, &at_limit);
    if (!at_limit.empty()) [[unlikely]] {
      return Status::DataLoss("memory store: claim: the record of key \"" +
                              internal::Printable(req.key) + "\": its " + at_limit +
                              "; nothing was changed");
    }
    if (write) {
      uint32_t n;
      if (slot == nullptr) {
        slot = &s.Insert(req.key, h, pos, &n, !next.fingerprint.empty() || !next.result.empty());
      } else {
        n = s.NumberAt(pos);
      }
      slot->FromRecord(std::move(next));
      s.Touched(n);
    }
    return res;
  }

  template <typename Fn>
  WriteResult Update(std::string_view key, Fn&& decide) {
    const uint64_t h = HashKey(key);
    Shard& s = ShardFor(h);
    s.Prefetch(h);
    std::lock_guard lock(s.mu);
    const int64_t now = clock_->NowMillis();
    s.Sweep(now, sweep_);
    size_t pos;
    Slot* slot = s.Find(key, h, &pos);
    if (slot == nullptr) return WriteResult::kLost;
    thread_local Record rec;
    slot->ToRecord(&rec);
    const WriteResult r = decide(&rec, now);
    if (r == WriteResult::kOk) {
      slot->FromRecord(std::move(rec));
      s.Touched(s.NumberAt(pos));
    }
    return r;
  }

  Clock* const clock_;
  const size_t sweep_;
  const int shard_bits_;
  IndexArena arena_;  // before shards_: they return their tables to it when destroyed
  std::vector<Shard> shards_;
};

}  // namespace

namespace internal {
size_t MemoryStorePhysicalRecords(Store* store) {
  auto* m = dynamic_cast<MemoryStore*>(store);
  return m == nullptr ? 0 : m->PhysicalRecords();
}

MemoryStoreIndexStats MemoryStoreIndex(Store* store) {
  auto* m = dynamic_cast<MemoryStore*>(store);
  return m == nullptr ? MemoryStoreIndexStats{} : m->IndexStats();
}

std::string MemoryStoreCheckIndex(Store* store) {
  auto* m = dynamic_cast<MemoryStore*>(store);
  return m == nullptr ? "not a memory store" : m->CheckIndex();
}

uint64_t MemoryStoreKeyHash(std::string_view key) { return HashKey(key); }
}  // namespace internal

std::unique_ptr<Store> NewMemoryStore(const MemoryStoreOptions& options) {
  return std::make_unique<MemoryStore>(options);
}

}  // namespace dedup
