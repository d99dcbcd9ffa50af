// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The one duration grammar (core/duration.h) and the Buffer options it feeds.

#include "core/duration.h"

#include <gtest/gtest.h>

#include "core/uri.h"
#include "dedup/buffer.h"
#include "dedup/memory_store.h"

namespace dedup::internal {
namespace {

TEST(Duration, EveryUnit) {
  EXPECT_EQ(*ParseDuration("250ms", "lease"), Millis(250));
  EXPECT_EQ(*ParseDuration("1.5s", "lease"), Millis(1500));
  EXPECT_EQ(*ParseDuration("2m", "lease"), Millis(120'000));
  EXPECT_EQ(*ParseDuration("1h", "lease"), Millis(3'600'000));
  EXPECT_EQ(*ParseDuration("1d", "lease"), Millis(86'400'000));
  EXPECT_EQ(*ParseDuration("0.25h", "lease"), Millis(900'000));
  EXPECT_EQ(*ParseDuration("0.001s", "lease"), Millis(1));
  EXPECT_EQ(*ParseDuration("250", "lease"), Millis(250));  // no unit: milliseconds
  EXPECT_EQ(*ParseDuration("0", "lease"), Millis(0));
  EXPECT_EQ(*ParseDuration("3650d", "lease"), kMaxDuration);
}

TEST(Duration, BadFormsNameTheOptionAndTheText) {
  for (const char* bad : {"", "s", "ms", ".5s", "1.s", "1..5s", "10 s", " 1s", "1s ", "3w",
                          "1S", "1sec", "1min", "1e3ms", "+1s", "1,5s"}) {
    auto r = ParseDuration(bad, "--lease");
    ASSERT_EQ(r.status().code(), StatusCode::kInvalidArgument) << "'" << bad << "'";
    EXPECT_NE(r.status().message().find("--lease '" + std::string(bad) + "'"), std::string::npos)
        << r.status().message();
  }
}

TEST(Duration, NegativeFineAndHugeSaySo) {
  EXPECT_NE(ParseDuration("-1s", "lease").status().message().find("negative"), std::string::npos);
  EXPECT_NE(ParseDuration("1.5ms", "lease").status().message().find("finer than a millisecond"),
            std::string::npos);
  EXPECT_NE(ParseDuration("0.0001s", "lease").status().message().find("finer"),
            std::string::npos);
  for (const char* huge : {"3651d", "99999999999999999999999999d", "87601h",
                           "9223372036854775807ms", "3650.5d"}) {
    EXPECT_NE(ParseDuration(huge, "lease").status().message().find("longer than 10 years"),
              std::string::npos)
        << huge;
  }
}

TEST(Duration, FormatRoundTrips) {
  EXPECT_EQ(FormatDuration(Millis(0)), "0ms");
  EXPECT_EQ(FormatDuration(Millis(250)), "250ms");
  EXPECT_EQ(FormatDuration(Millis(1500)), "1500ms");
  EXPECT_EQ(FormatDuration(Millis(30'000)), "30s");
  EXPECT_EQ(FormatDuration(Millis(120'000)), "2m");
  EXPECT_EQ(FormatDuration(kDefaultRetention), "1d");
  const int64_t samples[] = {0, 1, 999, 1000, 61'000, 3'600'000, 90'000'000,
                             kMaxDuration.count()};
  for (int64_t ms : samples) {
    EXPECT_EQ(*ParseDuration(FormatDuration(Millis(ms)), "x"), Millis(ms)) << ms;
  }
}

TEST(Duration, UriOptionsUseTheSameGrammar) {
  EXPECT_EQ(*ParseDurationMillis("1.5s", "redis: timeout"), 1500);
  EXPECT_EQ(ParseDurationMillis("1.5ms", "redis: timeout").status().code(),
            StatusCode::kInvalidArgument);
}

TEST(Defaults, WrittenOnce) {
  EXPECT_EQ(kDefaultLease, Millis(30'000));
  EXPECT_EQ(kDefaultRetention, Millis(24LL * 3600 * 1000));
  EXPECT_EQ(BufferOptions{}.lease, kDefaultLease);
  EXPECT_EQ(BufferOptions{}.retention, kDefaultRetention);
  EXPECT_EQ(ClaimRequest{}.lease, kDefaultLease);
  EXPECT_EQ(ClaimRequest{}.retention, kDefaultRetention);
}

}  // namespace
}  // namespace dedup::internal

namespace dedup {
namespace {

// Each bad option is refused by Buffer::Create with its flag-spelled name.
TEST(BufferOptions, ValidatedAtConstruction) {
  auto store = NewMemoryStore();
  ASSERT_TRUE(Buffer::Create(store.get()).ok());
  struct Case {
    const char* name;
    void (*set)(BufferOptions*);
  };
  const Case cases[] = {
      {"lease", [](BufferOptions* o) { o->lease = Millis(0); }},
      {"lease", [](BufferOptions* o) { o->lease = Millis(-5); }},
      {"lease", [](BufferOptions* o) { o->lease = kMaxDuration + Millis(1); }},
      {"retention", [](BufferOptions* o) { o->retention = Millis(0); }},
      {"retention", [](BufferOptions* o) { o->retention = Millis(-1); }},
      {"retry-delay", [](BufferOptions* o) { o->retry_delay = Millis(0); }},
      {"retry-delay", [](BufferOptions* o) { o->retry_delay = Millis(-1000); }},
      {"heartbeat-interval", [](BufferOptions* o) { o->heartbeat_interval = Millis(-1); }},
      {"heartbeat-interval", [](BufferOptions* o) { o->heartbeat_interval = o->lease; }},
      {"complete-tries", [](BufferOptions* o) { o->complete_tries = 0; }},
      {"complete-tries", [](BufferOptions* o) { o->complete_tries = -3; }},
  };
  for (const Case& c : cases) {
    BufferOptions o;
    c.set(&o);
    auto made = Buffer::Create(store.get(), o);
    ASSERT_EQ(made.status().code(), StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(made.status().message().rfind(c.name, 0), 0u) << made.status().message();
    EXPECT_EQ(ValidateBufferOptions(o).code(), StatusCode::kInvalidArgument);
  }
  EXPECT_EQ(Buffer::Create(nullptr).status().code(), StatusCode::kInvalidArgument);
}

TEST(BufferOptions, EdgesThatAreFine) {
  auto store = NewMemoryStore();
  BufferOptions o;
  o.lease = Millis(1);
  o.retention = kMaxDuration;
  o.retry_delay = Millis(1);
  o.heartbeat_interval = Millis(0);  // lease / 3
  o.complete_tries = 1;
  EXPECT_TRUE(ValidateBufferOptions(o).ok());
  o.lease = Millis(3000);
  o.heartbeat_interval = Millis(2999);
  auto made = Buffer::Create(store.get(), o);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  auto g = (*made)->Claim("k");
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(g->acquired());
  EXPECT_TRUE(g->Complete("r").ok());
}

}  // namespace
}  // namespace dedup
