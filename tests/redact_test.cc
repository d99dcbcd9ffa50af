// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Passwords never reach a message (issue 13, item 6): RedactUri on well-formed
// and mistyped URIs, Uri::Redacted, the errors of ParseUri and OpenStore, and
// where a Redis password may come from instead of the command line.

#include "core/redact.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>

#include "core/printable.h"
#include "core/secret.h"
#include "core/uri.h"
#include "dedup/store.h"

namespace dedup::internal {
namespace {

constexpr std::string_view kSecret = "S3cr3tPW";

// Mistyped and well-formed URIs that hold kSecret as a password.
std::vector<std::string> Typos() {
  const std::string p(kSecret);
  return {"redis://" + p + "@127.0.0.1:1", "redis://:" + p + "@127.0.0.1:1",
          "redis://u:" + p + "@h", "redis:/" + p + "@h", "redis:/:" + p + "@h",
          "redis:" + p + "@h", "redis:/u:" + p + "@h", ":" + p + "@h", p + "@h",
          "redis//:" + p + "@h", "redis:///:" + p + "@h", "redis://:" + p + "@h:badport",
          "redis://:" + p + "@h?prefx=a", "redis://:" + p + "@h/notanumber", "redis://:" + p + "@",
          "redis://:" + p + "@h:1/0/extra", "rediss://:" + p + "@h",
          "redis+cluster://:" + p + "@h1,h2:bad", "redis://:" + p + "@[::1",
          "redis://:" + p + ":more@h", "redis://:" + p + "@@h", "redis://:" + p + "%@h",
          "redis://:" + p + "@h:1?prefix", "redis://:" + p + "@h:1?=x", "redis:/:" + p,
          "redis://:" + p, "postgres://u:" + p + "@h/db", "REDIS://:" + p + "@h",
          "redis://:pa?ss" + p + "@h", "redis://:" + p + "@h?password=" + p,
          "redis://h?auth=" + p, "redis://" + p + ":@h", "redis://:" + p + "@h:1?timeout=abc",
          "https://u:" + p, "http://u:" + p + "/x", "amqp://u:" + p + "?queue=q",
          "nats://a:1,u:" + p + "?stream=s"};
}

TEST(RedactUri, HidesThePasswordOfEveryTypo) {
  for (const std::string& t : Typos()) {
    const std::string r = RedactUri(t);
    EXPECT_EQ(r.find(kSecret), std::string::npos) << t << " -> " << r;
    EXPECT_EQ(RedactWords("bad URI '" + t + "' here").find(kSecret), std::string::npos) << t;
  }
}

TEST(RedactUri, KeepsWhatIsNotSecret) {
  EXPECT_EQ(RedactUri("redis://u:pw@host:6379/2?prefix=x:"), "redis://u:***@host:6379/2?prefix=x:");
  EXPECT_EQ(RedactUri("redis://pw@host:6379"), "redis://***@host:6379");
  EXPECT_EQ(RedactUri("redis://:pw@host"), "redis://:***@host");
  EXPECT_EQ(RedactUri("redis://host:6379?prefix=a"), "redis://host:6379?prefix=a");
  EXPECT_EQ(RedactUri("rocksdb:/var/lib/dedup"), "rocksdb:/var/lib/dedup");
  EXPECT_EQ(RedactUri("memory:"), "memory:");
  EXPECT_EQ(RedactUri("nats://a:4222,[::1]:4223,b?stream=s"), "nats://a:4222,[::1]:4223,b?stream=s");
  EXPECT_EQ(RedactUri("http://127.0.0.1:3000/x"), "http://127.0.0.1:3000/x");
  EXPECT_EQ(RedactWords("rocksdb /tmp/x: open: 12:30"), "rocksdb /tmp/x: open: 12:30");
}

TEST(RedactUri, EveryParseAndOpenErrorIsRedacted) {
  for (const std::string& t : Typos()) {
    auto u = ParseUri(t);
    if (u.ok()) {
      EXPECT_EQ(u->Redacted().find(kSecret), std::string::npos) << t << " -> " << u->Redacted();
    } else {
      EXPECT_EQ(u.status().message().find(kSecret), std::string::npos) << t << ": " << u.status();
    }
    // Nothing listens on port 1; parse errors, unknown schemes, refused connections.
    auto s = OpenStore(t);
    if (!s.ok()) {
      EXPECT_EQ(s.status().message().find(kSecret), std::string::npos) << t << ": " << s.status();
    } else {
      EXPECT_EQ((*s)->Describe().find(kSecret), std::string::npos) << t;
    }
  }
  // A bare word might be a password: not echoed.
  auto u = ParseUri(kSecret);
  ASSERT_FALSE(u.ok());
  EXPECT_EQ(u.status().message().find(kSecret), std::string::npos) << u.status();
}

TEST(Printable, NothingReachesATerminalRaw) {
  EXPECT_EQ(Printable("m-42"), "m-42");
  EXPECT_EQ(Printable("caf\xc3\xa9"), "caf\xc3\xa9");  // UTF-8 letters stay
  EXPECT_EQ(Printable("a\x1b[2Jb"), "a\\x1b[2Jb");
  EXPECT_EQ(Printable(std::string_view("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(Printable("\xff\xfe"), "\\xff\\xfe");
  EXPECT_EQ(Printable("x\xe2\x80\xaey"), "x\\xe2\\x80\\xaey");  // right-to-left override
  EXPECT_EQ(Printable("\xc2\x9b"), "\\xc2\\x9b");                  // C1 CSI
  EXPECT_EQ(Printable("a\\b"), "a\\\\b");
  EXPECT_EQ(Printable("\xc0\xaf"), "\\xc0\\xaf");  // overlong '/'
  EXPECT_TRUE(IsValidUtf8("caf\xc3\xa9"));
  EXPECT_FALSE(IsValidUtf8("\xed\xa0\x80"));  // a surrogate
  EXPECT_FALSE(IsValidUtf8("\xff"));
  EXPECT_EQ(HexBytes("m-\xff"), "6d2dff");
  // Its inverse, as inspect / forget --key-hex read it.
  EXPECT_EQ(BytesFromHex("6d2dff"), std::string("m-\xff"));
  EXPECT_EQ(BytesFromHex("6D2DFF"), std::string("m-\xff"));
  EXPECT_EQ(BytesFromHex("6e00756c"), std::string("n\0ul", 4));
  EXPECT_EQ(BytesFromHex(""), std::string());
  EXPECT_FALSE(BytesFromHex("6d2").has_value());
  EXPECT_FALSE(BytesFromHex("6g").has_value());
}

class Credentials : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv(kRedisPasswordEnv); }
  void TearDown() override { unsetenv(kRedisPasswordEnv); }
  static RedisCredentials Resolve(const std::string& uri) {
    auto u = ParseUri(uri);
    EXPECT_TRUE(u.ok()) << u.status();
    auto c = ResolveRedisCredentials(*u);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : RedisCredentials{};
  }
};

TEST_F(Credentials, InlineLoneAndNone) {
  RedisCredentials c = Resolve("redis://u:pw@h");
  EXPECT_EQ(c.user, "u");
  EXPECT_EQ(c.password, "pw");
  c = Resolve("redis://pw@h");
  EXPECT_EQ(c.user, "");
  EXPECT_EQ(c.password, "pw");
  EXPECT_TRUE(c.has_password);
  EXPECT_FALSE(Resolve("redis://h").has_password);
}

TEST_F(Credentials, FromAFileWithoutTheCommandLine) {
  const std::string f = ::testing::TempDir() + "/dedup-redis-password";
  std::ofstream(f) << "from-file\n";
  RedisCredentials c = Resolve("redis://h?password_file=" + f);
  EXPECT_TRUE(c.has_password);
  EXPECT_EQ(c.password, "from-file");
  c = Resolve("redis://acluser@h?password_file=" + f);
  EXPECT_EQ(c.user, "acluser");
  EXPECT_EQ(c.password, "from-file");
  // Both inline and file: refused. A missing file: named, never its content.
  auto u = ParseUri("redis://:pw@h?password_file=" + f);
  EXPECT_EQ(ResolveRedisCredentials(*u).status().code(), StatusCode::kInvalidArgument);
  u = ParseUri("redis://h?password_file=/nonexistent/x");
  auto bad = ResolveRedisCredentials(*u);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("/nonexistent/x"), std::string::npos);
  std::filesystem::remove(f);
}

TEST_F(Credentials, FromTheEnvironmentWhenTheUriHasNone) {
  setenv(kRedisPasswordEnv, "from-env", 1);
  EXPECT_EQ(Resolve("redis://h").password, "from-env");
  EXPECT_EQ(Resolve("redis://:inline@h").password, "inline");
  // A lone user-info beside it is the ACL user (it was read as the password,
  // the environment ignored: AUTH for the default user failed).
  RedisCredentials c = Resolve("redis://alice@h");
  EXPECT_EQ(c.user, "alice");
  EXPECT_EQ(c.password, "from-env");
  unsetenv(kRedisPasswordEnv);
  c = Resolve("redis://alice@h");
  EXPECT_EQ(c.user, "");
  EXPECT_EQ(c.password, "alice") << "without it, redis-cli's reading";
}

// A reason cut for a header or a log line splits no character: the
// continuation bytes of one the cut would split go too; bytes that are not
// UTF-8 are cut where they are.
TEST(CutAtCharacter, SplitsNoCharacter) {
  EXPECT_EQ(CutAtCharacter("short", 5), "short");
  EXPECT_EQ(CutAtCharacter("abcdef", 3), "abc... [cut: 6 bytes in all]");
  // "x" then u-umlaut (2 bytes), euro (3), a 4-byte emoji, "z": cuts inside each.
  const std::string s = "x\xc3\xbc\xe2\x82\xac\xf0\x9f\x98\x80z";
  EXPECT_EQ(CutAtCharacter(s, 2), "x... [cut: 11 bytes in all]");
  EXPECT_EQ(CutAtCharacter(s, 3), "x\xc3\xbc... [cut: 11 bytes in all]");
  EXPECT_EQ(CutAtCharacter(s, 5), "x\xc3\xbc... [cut: 11 bytes in all]");
  EXPECT_EQ(CutAtCharacter(s, 9), "x\xc3\xbc\xe2\x82\xac... [cut: 11 bytes in all]");
  EXPECT_EQ(CutAtCharacter(s, 10), s.substr(0, 10) + "... [cut: 11 bytes in all]");
  for (size_t max = 0; max < s.size(); ++max) {
    EXPECT_TRUE(IsValidUtf8(CutAtCharacter(s, max))) << max;
    EXPECT_LE(CutAtCharacter(s, max).find("..."), max) << max;
  }
  // Continuation bytes without a lead byte: cut where asked.
  EXPECT_EQ(CutAtCharacter(std::string(10, '\x80'), 4),
            std::string(4, '\x80') + "... [cut: 10 bytes in all]");
}

// What an error message echoes of a value it refuses: escaped, at most 64
// bytes, "..." when cut, no character split (a cut inside the euro sign left
// "\xe2\x82" where the URI had a whole character).
TEST(PrintableCut, EscapesCutsAndSplitsNoCharacter) {
  EXPECT_EQ(PrintableCut("a\x1b[31m", 64), "a\\x1b[31m");
  EXPECT_EQ(PrintableCut(std::string(70, 'x'), 64), std::string(64, 'x') + "...");
  EXPECT_EQ(PrintableCut("ab\xe2\x82\xac", 4), "ab...");
  EXPECT_EQ(PrintableCut("ab\xe2\x82\xac", 5), "ab\xe2\x82\xac");
  EXPECT_EQ(PrintableCut("ab\xff\xfe", 3), "ab\\xff...");
}

}  // namespace
}  // namespace dedup::internal
