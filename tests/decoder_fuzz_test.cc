// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Fuzzing every decoder of untrusted bytes (issue 13 item 10): the RocksDB record
// codec, the Redis store's C++ reading of record format 2 (the claim fast path),
// store/broker URIs (ParseUri, ParseRedisUri), durations and token hex.
//
// Approach: a corpus-driven gtest rather than libFuzzer. Each decoder gets a small
// seed corpus of valid encodings and then a fixed number of deterministic mutations
// (bit flips, byte sets, truncations, insertions, deletions, splices; fixed seed), so
// that CI runs the same inputs every time, in a bounded time (well under a second
// per decoder in a plain build, a few seconds under ASan+UBSan), with no
// extra toolchain or fuzzing engine, and any failure reproduces from the test alone.
// The properties checked for every input:
//   - no crash, abort, hang or sanitizer report, and no exception escapes;
//   - the input is either refused (false / a non-OK Status), or it decodes to a
//     value whose canonical encoding decodes to the same value (for the byte
//     codecs: the canonical encoding is the input itself, so no decoder accepts
//     two spellings of one record).
// DEDUP_FUZZ_ITERATIONS (default 20000 per decoder) runs longer by hand.

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <random>
#include <optional>
#include <tuple>
#include <string>
#include <string_view>
#include <vector>

#include "core/duration.h"
#include "core/redact.h"
#include "core/uri.h"
#include "dedup/record.h"
#include "dedup/store.h"

#ifdef DEDUP_WITH_ROCKSDB
#include "stores/rocksdb/record_codec.h"
#endif
#ifdef DEDUP_WITH_REDIS
#include "redis/options.h"
#include "stores/redis/record_format.h"
#endif

namespace dedup {
namespace {

size_t Iterations() {
  const char* s = std::getenv("DEDUP_FUZZ_ITERATIONS");
  if (s != nullptr && *s != '\0') return static_cast<size_t>(std::strtoull(s, nullptr, 10));
  return 20000;
}

// Deterministic mutations of the seeds; the seed list also grows with the inputs
// the decoder accepted, so that later mutations start from valid-but-odd values.
class Mutator {
 public:
  explicit Mutator(std::vector<std::string> seeds, std::string_view alphabet = {})
      : seeds_(std::move(seeds)), alphabet_(alphabet), rng_(0x5eedded0ULL) {}

  std::string Next() {
    std::string s = seeds_[Pick(seeds_.size())];
    const size_t rounds = 1 + Pick(4);
    for (size_t k = 0; k < rounds; ++k) Mutate(&s);
    return s;
  }
  void Keep(const std::string& s) {
    if (seeds_.size() < 256) seeds_.push_back(s);
  }

 private:
  size_t Pick(size_t n) { return n == 0 ? 0 : static_cast<size_t>(rng_() % n); }
  char Byte() {
    static constexpr unsigned char kInteresting[] = {0x00, 0x01, 0x7f, 0x80, 0xff, 0x40, 0x42, 0x10};
    switch (Pick(3)) {
      case 0: return static_cast<char>(kInteresting[Pick(sizeof kInteresting)]);
      case 1: if (!alphabet_.empty()) return alphabet_[Pick(alphabet_.size())]; [[fallthrough]];
      default: return static_cast<char>(rng_());
    }
  }
  void Mutate(std::string* s) {
    switch (Pick(7)) {
      case 0:  // flip one bit
        if (!s->empty()) (*s)[Pick(s->size())] ^= static_cast<char>(1u << Pick(8));
        break;
      case 1:  // set one byte
        if (!s->empty()) (*s)[Pick(s->size())] = Byte();
        break;
      case 2:  // truncate
        s->resize(Pick(s->size() + 1));
        break;
      case 3:  // insert bytes
        s->insert(Pick(s->size() + 1), std::string(1 + Pick(3), Byte()));
        break;
      case 4:  // delete a run
        if (!s->empty()) {
          const size_t at = Pick(s->size());
          s->erase(at, 1 + Pick(4));
        }
        break;
      case 5: {  // splice: our prefix, another seed's suffix
        const std::string& o = seeds_[Pick(seeds_.size())];
        *s = s->substr(0, Pick(s->size() + 1)) + o.substr(Pick(o.size() + 1));
        break;
      }
      default:  // duplicate a run
        if (!s->empty()) {
          const size_t at = Pick(s->size());
          s->insert(at, s->substr(at, 1 + Pick(8)));
        }
        break;
    }
  }

  std::vector<std::string> seeds_;
  std::string alphabet_;
  std::mt19937_64 rng_;
};

#ifdef DEDUP_WITH_ROCKSDB
TEST(DecoderFuzz, RocksDbRecordCodec) {
  std::vector<std::string> seeds;
  auto add = [&](RecordState st, CompletionStatus cs, std::string fp, std::string result) {
    Record r;
    r.state = st;
    r.token.value = 0x0123456789abcdefULL;
    r.fence = 7;
    r.attempt = 3;
    r.lease_deadline = 1'700'000'000'000;
    r.retention_deadline = 1'800'000'000'000;
    r.fingerprint = std::move(fp);
    r.status = cs;
    r.result = std::move(result);
    std::string v;
    internal::EncodeRecord(r, &v);
    seeds.push_back(v);
  };
  add(RecordState::kInProgress, CompletionStatus::kOk, "", "");
  add(RecordState::kInProgress, CompletionStatus::kOk, std::string(32, '\xab'), "");
  add(RecordState::kCompleted, CompletionStatus::kOk, "fp", "result bytes");
  add(RecordState::kCompleted, CompletionStatus::kFailed, std::string(64, 'f'), std::string(300, 'r'));
  add(RecordState::kCompleted, CompletionStatus::kExhausted, "", "");
  add(RecordState::kReleased, CompletionStatus::kOk, "x", "");
  Mutator m(seeds);
  size_t accepted = 0;
  const size_t n = Iterations();
  for (size_t it = 0; it < n + seeds.size(); ++it) {
    const std::string v = it < seeds.size() ? seeds[it] : m.Next();
    Record r;
    std::string why;
    const std::optional<int64_t> peek = internal::PeekRetentionDeadline(v);
    EXPECT_LE(internal::QuoteBytes(v).size(), 64u * 4 + 3);
    if (!internal::DecodeRecord(v, &r, &why)) {
      ASSERT_FALSE(why.empty()) << "refused without a reason: " << internal::QuoteBytes(v);
      continue;
    }
    ++accepted;
    ASSERT_TRUE(peek.has_value()) << internal::QuoteBytes(v);
    EXPECT_EQ(*peek, r.retention_deadline);
    std::string again;
    internal::EncodeRecord(r, &again);
    ASSERT_EQ(again, v) << "accepted a non-canonical record: " << internal::QuoteBytes(v);
    Record back;
    ASSERT_TRUE(internal::DecodeRecord(again, &back, &why)) << why;
    ASSERT_EQ(back, r);
    m.Keep(v);
  }
  // The seeds themselves, at least; a decoder that refuses all is no codec.
  EXPECT_GE(accepted, seeds.size());
}
#endif

#ifdef DEDUP_WITH_REDIS
// The canonical format-2 COMPLETED encoding, from docs/REDIS_PROTOCOL.md (written
// here from the document, independently of the Lua encoder).
std::string EncodeCompleted2(const redis::CompletedRecord2& r) {
  std::string v;
  v.push_back(static_cast<char>(redis::kFormat2 | redis::kCompleted2 |
                                (static_cast<uint8_t>(r.status) << 2) |
                                (r.fingerprint.empty() ? 0 : redis::kHasFp2)));
  for (int i = 7; i >= 0; --i) v.push_back(static_cast<char>(r.token >> (8 * i)));
  redis::AppendVarint(&v, r.fence);
  redis::AppendVarint(&v, r.attempt);
  if (!r.fingerprint.empty()) {
    v.push_back(static_cast<char>(r.fingerprint.size()));
    v.append(r.fingerprint);
  }
  v.append(r.result);
  return v;
}

bool Same(const redis::CompletedRecord2& a, const redis::CompletedRecord2& b) {
  return a.status == b.status && a.token == b.token && a.fence == b.fence &&
         a.attempt == b.attempt && a.fingerprint == b.fingerprint && a.result == b.result;
}

TEST(DecoderFuzz, RedisRecordFormat2) {
  std::vector<std::string> seeds;
  const std::string fp64(64, 'p');
  for (auto [st, fence, attempt, fp, result] :
       std::vector<std::tuple<CompletionStatus, uint64_t, uint64_t, std::string_view, std::string_view>>{
           {CompletionStatus::kOk, 1, 1, "", ""},
           {CompletionStatus::kOk, 300, 2, "sha", "ok"},
           {CompletionStatus::kFailed, 1ULL << 40, 127, fp64, "boom"},
           {CompletionStatus::kExhausted, 128, 16384, "", std::string_view("\0\x01\xff", 3)}}) {
    redis::CompletedRecord2 r;
    r.status = st;
    r.token = 0xfedcba9876543210ULL;
    r.fence = fence;
    r.attempt = attempt;
    r.fingerprint = fp;
    r.result = result;
    seeds.push_back(EncodeCompleted2(r));
  }
  // Records the fast path must leave to claim.lua: IN_PROGRESS, RELEASED, format 1.
  seeds.push_back(std::string("\x41\0\0\0\0\0\0\0\x01\x01\x01\xe8\x07", 13));
  seeds.push_back(std::string("\x43\0\0\0\0\0\0\0\x02\x02\x01", 11));
  Mutator m(seeds);
  size_t accepted = 0;
  const size_t n = Iterations();
  for (size_t it = 0; it < n + seeds.size(); ++it) {
    const std::string v = it < seeds.size() ? seeds[it] : m.Next();
    redis::CompletedRecord2 r;
    if (!redis::DecodeCompletedRecord2(v, &r)) continue;
    ++accepted;
    ASSERT_EQ(static_cast<uint8_t>(v[0]) & 3, redis::kCompleted2);
    ASSERT_LE(static_cast<uint8_t>(r.status), 2);
    ASSERT_LE(r.fingerprint.size(), kMaxFingerprintBytes);
    const std::string again = EncodeCompleted2(r);
    ASSERT_EQ(again, v) << "accepted a non-canonical record of " << v.size() << " bytes";
    redis::CompletedRecord2 back;
    ASSERT_TRUE(redis::DecodeCompletedRecord2(again, &back));
    ASSERT_TRUE(Same(back, r));
    m.Keep(v);
  }
  EXPECT_GE(accepted, 4u);
}

// clusterreview: the fast path reads no fence, attempt or keep that the scripts'
// Lua numbers cannot hold exactly (record.lua's MAX_VARINT, 2^53 - 1), nor an
// attempt over 32 bits (MAX_ATTEMPT, clusterfix): such a record goes to
// claim.lua, which refuses it, instead of being replayed here.
TEST(DecoderFuzz, RedisVarintsStopAtTwoToThe53MinusOne) {
  for (auto [fence, attempt, ok] : std::vector<std::tuple<uint64_t, uint64_t, bool>>{
           {redis::kMaxVarint, 1, true},
           {redis::kMaxVarint + 1, 1, false},
           {(1ULL << 56) - 1, 1, false},
           {1, redis::kMaxAttempt, true},
           {1, redis::kMaxAttempt + 1, false},
           {1, redis::kMaxVarint, false},
           {1, redis::kMaxVarint + 1, false}}) {
    redis::CompletedRecord2 r;
    r.token = 0xaa;
    r.fence = fence;
    r.attempt = attempt;
    const std::string v = EncodeCompleted2(r);
    redis::CompletedRecord2 out;
    EXPECT_EQ(redis::DecodeCompletedRecord2(v, &out), ok) << fence << " " << attempt;
    uint64_t tok = 0, f = 0, a = 0;
    std::string in_progress = v;
    in_progress[0] = static_cast<char>(redis::kFormat2 | redis::kInProgress2);
    in_progress += '\x01';  // keep
    EXPECT_EQ(redis::DecodeInProgressHead2(in_progress, &tok, &f, &a), ok)
        << fence << " " << attempt;
  }
}
#endif

// Redaction of text that does not parse is best effort (core/redact.h): it is
// promised where a password is recognisable, right after the scheme's "//"
// ("//user:pw", "//:pw", "//pw@"), or before an '@' ("user:pw@"), not wherever a
// mutation moved the bytes (inside a path or an option's name).
bool PasswordWhereAPasswordGoes(std::string_view text, std::string_view pw) {
  const std::string s(pw);
  const size_t slashes = text.find("//");
  if (slashes != std::string_view::npos) {
    const std::string_view after = text.substr(slashes + 2);
    if (after.starts_with(":" + s) || after.starts_with(s + "@")) return true;
    if (const size_t c = after.find(':'); c != std::string_view::npos &&
        after.substr(0, c).find_first_of("/?@[") == std::string_view::npos &&
        after.substr(c + 1).starts_with(s)) {
      return true;
    }
  }
  return text.find(":" + s + "@") != std::string_view::npos;
}

// A URI that parses is redacted without its password, and the redacted form
// parses again to the same scheme, hosts and path.
TEST(DecoderFuzz, Uris) {
  const std::string kPassword = "s3cretPW";
  std::vector<std::string> seeds = {
      "memory:",
      "rocksdb:/var/lib/dedup?sync=always",
      "redis://127.0.0.1:6390/2?prefix=dedup%3A&timeout=1500ms",
      "redis://user:" + kPassword + "@[::1]:6390/1?pool=4",
      "redis://:" + kPassword + "@localhost",
      "redis+cluster://a:7000,b:7001,[::1]:7002?prefix=x&timeout=2s",
      "postgres://u:" + kPassword + "@h:5432/db?table=t",
      "redis-stream://127.0.0.1/0?stream=s&group=g",
  };
  Mutator m(seeds, ":/@?&=%[],.0123456789abcdefAF+-");
  const size_t n = Iterations();
  for (size_t it = 0; it < n + seeds.size(); ++it) {
    const std::string text = it < seeds.size() ? seeds[it] : m.Next();
    StatusOr<internal::Uri> u = internal::ParseUri(text);
    if (u.ok()) {
      const std::string red = u->Redacted();
      if (u->has_password && u->password == kPassword) {
        ASSERT_EQ(red.find(kPassword), std::string::npos) << red;
      }
      StatusOr<internal::Uri> again = internal::ParseUri(red);
      if (again.ok()) EXPECT_EQ(again->scheme, u->scheme) << text;
      (void)u->Param("prefix");
      (void)u->CheckParams({"prefix"});
    } else {
      ASSERT_FALSE(u.status().message().empty());
      if (PasswordWhereAPasswordGoes(text, kPassword)) {
        ASSERT_EQ(u.status().message().find(kPassword), std::string::npos) << u.status().message();
      }
    }
#ifdef DEDUP_WITH_REDIS
    StatusOr<redis::RedisUri> r = redis::ParseRedisUri(text, {"prefix", "stream", "group"});
    if (r.ok()) {
      ASSERT_TRUE(r->connection.Validate().ok()) << text;
      ASSERT_FALSE(r->connection.endpoints.empty()) << text;
      const std::string d = r->connection.Describe();
      if (r->connection.password == kPassword) ASSERT_EQ(d.find(kPassword), std::string::npos) << d;
    } else {
      ASSERT_FALSE(r.status().message().empty());
      if (PasswordWhereAPasswordGoes(text, kPassword)) {
        ASSERT_EQ(r.status().message().find(kPassword), std::string::npos) << text << " => " << r.status().message();
      }
    }
#endif
    if (u.ok()) m.Keep(text);
  }
}

// ParseDuration either refuses or gives d >= 0 whose FormatDuration parses back to d.
TEST(DecoderFuzz, Durations) {
  std::vector<std::string> seeds = {"0",  "250ms", "1.5s", "2m",  "1h", "1d",
                                    "3650d", "999999", "0.001s", "12.25m"};
  Mutator m(seeds, "0123456789.msdh");
  const size_t n = Iterations();
  for (size_t it = 0; it < n + seeds.size(); ++it) {
    const std::string text = it < seeds.size() ? seeds[it] : m.Next();
    StatusOr<Millis> d = internal::ParseDuration(text, "--lease");
    if (!d.ok()) {
      ASSERT_EQ(d.status().code(), StatusCode::kInvalidArgument) << text;
      StatusOr<long long> ms = internal::ParseDurationMillis(text, "lease");
      ASSERT_FALSE(ms.ok()) << text;
      continue;
    }
    ASSERT_GE(d->count(), 0) << text;
    const std::string canon = internal::FormatDuration(*d);
    StatusOr<Millis> back = internal::ParseDuration(canon, "--lease");
    ASSERT_TRUE(back.ok()) << text << " -> " << canon;
    ASSERT_EQ(*back, *d) << text << " -> " << canon;
    ASSERT_EQ(internal::FormatDuration(*back), canon);
    StatusOr<long long> ms = internal::ParseDurationMillis(text, "lease");
    ASSERT_TRUE(ms.ok()) << text;
    ASSERT_EQ(*ms, d->count());
    m.Keep(text);
  }
}

// Token::FromHex reads the tokens of Redis inspect replies and of the serve API.
// It accepts one spelling per token, so the property is exact: what it accepts
// is a valid token whose ToHex is the very text it was read from.
TEST(DecoderFuzz, TokenHex) {
  std::vector<std::string> seeds = {"0123456789abcdef", "0000000000000001", "ffffffffffffffff"};
  Mutator m(seeds, "0123456789abcdefABCDEFx");
  const size_t n = Iterations();
  for (size_t it = 0; it < n + seeds.size(); ++it) {
    const std::string text = it < seeds.size() ? seeds[it] : m.Next();
    std::optional<Token> t = Token::FromHex(text);
    if (!t) continue;
    ASSERT_TRUE(t->valid()) << text;
    ASSERT_EQ(t->ToHex(), text);
    std::optional<Token> back = Token::FromHex(t->ToHex());
    ASSERT_TRUE(back.has_value()) << text;
    ASSERT_EQ(*back, *t) << text;
    m.Keep(text);
  }
}

}  // namespace
}  // namespace dedup

namespace dedup {
namespace {

#ifdef DEDUP_WITH_REDIS
// Found by DecoderFuzz.Uris: a URI whose "@host" was forgotten reads as host
// "user", port "<password>", and the host error echoed it.
TEST(DecoderFuzzRegression, EndpointErrorsDoNotEchoAPasswordReadAsAPort) {
  for (std::string_view text : {"redis://default:hunter2/0", "redis://default:hunter2",
                                "redis+cluster://a:7000,user:hunter2", "redis://[::1]:hunter2",
                                "redis://user:hunter2:x/0"}) {
    StatusOr<redis::RedisUri> r = redis::ParseRedisUri(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_EQ(r.status().message().find("hunter2"), std::string::npos) << r.status().message();
  }
  // A real port is still shown.
  StatusOr<redis::RedisUri> r = redis::ParseRedisUri("redis://host:70000");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("host:70000"), std::string::npos) << r.status().message();
}

// Found by DecoderFuzz.Uris (DEDUP_FUZZ_ITERATIONS=1000000): RedactUri kept as a
// "user name" everything before the first ':' of the user-info, '@' included, so
// "pass@[::1]:6390@host" showed the password.
TEST(DecoderFuzzRegression, RedactUriHidesAUserInfoWithTwoAts) {
  const std::string red = internal::RedactUri("redis://s3cretPW@[::1]:6390@host:1/0");
  EXPECT_EQ(red.find("s3cretPW"), std::string::npos) << red;
  EXPECT_EQ(internal::RedactUri("redis://user:pw@host"), "redis://user:***@host");
}
#endif

}  // namespace
}  // namespace dedup
