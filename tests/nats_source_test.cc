// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The NATS JetStream source against a real server (tests/with_nats.sh starts it
// and sets DEDUP_TEST_NATS_URI and DEDUP_TEST_NATS_RESTART). Every case uses a
// stream of its own.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>

#include <nats/nats.h>

#include "brokers/nats/nats_source.h"

namespace dedup::nats {
namespace {

using std::chrono::steady_clock;
using namespace std::string_literals;

std::string BaseUri() {
  const char* u = std::getenv("DEDUP_TEST_NATS_URI");
  return u != nullptr ? u : "";
}

class NatsSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(BaseUri().empty()) << "run me through tests/with_nats.sh";
    stream_ = std::string("T") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }
  std::string Uri(const std::string& extra = "") const {
    return BaseUri() + "?stream=" + stream_ + "&consumer=c&subject=" + stream_ + ".in" + extra;
  }
  void Publish(const std::string& key, const std::string& data, const std::string& extra = "",
               bool* dup = nullptr) {
    auto o = ParseNatsUri(Uri(extra), false);
    ASSERT_TRUE(o.ok()) << o.status().ToString();
    auto p = NatsPublisher::Open(*o);
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    bool d = false;
    Status s = (*p)->Publish(key, data, &d);
    ASSERT_TRUE(s.ok()) << s.ToString();
    if (dup != nullptr) *dup = d;
  }
  std::vector<std::unique_ptr<Delivery>> FetchAll(MessageSource& s, size_t want, Millis within) {
    std::vector<std::unique_ptr<Delivery>> got;
    const auto end = steady_clock::now() + within;
    while (got.size() < want && steady_clock::now() < end) {
      auto b = s.Fetch(want - got.size(), Millis(200));
      if (!b.ok()) {
        std::fprintf(stderr, "fetch: %s\n", b.status().ToString().c_str());
        std::this_thread::sleep_for(Millis(50));
        continue;
      }
      for (auto& d : *b) got.push_back(std::move(d));
    }
    return got;
  }
  // What reached the dead stream <stream>_DEAD (the deliveries keep their
  // connection), keyed by the original Nats-Msg-Id.
  std::vector<std::unique_ptr<Delivery>> DeadLetters(size_t want) {
    auto dead = OpenNatsSource(BaseUri() + "?stream=" + stream_ + "_DEAD&consumer=d&subject=dedup.dead." +
                               stream_ + "&key=header:Dedup-Original-Msg-Id");
    EXPECT_TRUE(dead.ok()) << dead.status().ToString();
    if (!dead.ok()) return {};
    return FetchAll(**dead, want, Millis(5000));
  }
  // Opens the source (consumer c), has one message "a" delivered and acked,
  // then deletes the consumer under the running source.
  void OpenAckOneAndDeleteTheConsumer(std::unique_ptr<MessageSource>* src);
  std::string stream_;
};

TEST(NatsUriTest, ParsesEveryPart) {
  auto o = ParseNatsUri(
      "nats://u:pw@10.0.0.1:4999?stream=JOBS&consumer=w&subject=jobs.in&key=header:Idem&prefix=n:"
      "&dead=jobs.dead&ack_wait=5s&max_ack_pending=64");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->host_port, "10.0.0.1:4999");
  EXPECT_EQ(o->servers, std::vector<std::string>{"nats://10.0.0.1:4999"});
  // One source of truth for the connection: the servers, and the user apart.
  EXPECT_EQ(o->user, "u");
  EXPECT_EQ(o->password, "pw");
  EXPECT_TRUE(o->has_password);
  // Each host split and checked once; the default port and IPv6 brackets added.
  auto many = ParseNatsUri("nats://a,b:4300,[::1],[::1]:4301?stream=S&consumer=c");
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(many->servers, (std::vector<std::string>{"nats://a:4222", "nats://b:4300",
                                                     "nats://[::1]:4222", "nats://[::1]:4301"}));
  // A zone id, as RFC 6874 writes it in a URI ("%25" and the zone, itself
  // percent-encoded), goes to nats.c with a bare '%': nats.c's natsUrl_Create
  // (src/url.c, 3.4.1 and main) decodes only the user and password, keeps the
  // host as written, and natsSock_ConnectTcp strips the brackets and hands
  // "fe80::1%eth0" to getaddrinfo, which reads the zone. "%25eth0" would reach
  // the resolver as such (no interface "25eth0"). Checked by hand against a
  // nats-server on [fe80::1%lo] in a network namespace (tidyuri report).
  auto zone = ParseNatsUri("nats://[fe80::1%25eth0]:4300,[fe80::2%25en%2D1]?stream=S&consumer=c");
  ASSERT_TRUE(zone.ok()) << zone.status();
  EXPECT_EQ(zone->servers, (std::vector<std::string>{"nats://[fe80::1%eth0]:4300",
                                                     "nats://[fe80::2%en-1]:4222"}));
  EXPECT_EQ(o->stream, "JOBS");
  EXPECT_EQ(o->consumer, "w");
  EXPECT_EQ(o->Subject(), "jobs.in");
  EXPECT_EQ(o->key, (brokers::KeySpec{brokers::KeyKind::kHeader, "Idem"}));
  EXPECT_EQ(o->key_prefix, "n:");
  EXPECT_EQ(o->DeadSubject(), "jobs.dead");
  EXPECT_EQ(o->ack_wait, Millis(5000));
  EXPECT_EQ(o->max_ack_pending, 64);
  EXPECT_EQ(o->Describe().find("pw"), std::string::npos);
  auto d = ParseNatsUri("nats://h?stream=S&consumer=c");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->Subject(), "S");
  EXPECT_EQ(d->DeadSubject(), "dedup.dead.S");
  EXPECT_TRUE(ParseNatsUri("nats://h?stream=S", /*need_consumer=*/false).ok());
}

TEST(NatsUriTest, RejectsBadInputNamingIt) {
  struct Case {
    const char* uri;
    const char* says;
  } cases[] = {
      {"nats://h?consumer=c", "stream="},
      {"nats://h?stream=S", "consumer="},
      {"nats://h?stream=a.b&consumer=c", "stream name"},
      {"nats://h?stream=S&consumer=c&key=x", "key="},
      {"nats://h?stream=S&consumer=c&ack_wait=10ms", "ack_wait"},
      {"nats://h?stream=S&consumer=c&max_ack_pending=0", "max_ack_pending"},
      {"nats://h?stream=S&consumer=c&what=1", "what"},
      {"amqp://h?stream=S&consumer=c", "nats"},
      // Ports are checked here, not at the first connect (which answered
      // UNAVAILABLE: a typo treated as a server to wait for).
      {"nats://h:0?stream=S&consumer=c", "host 'h:0'"},
      {"nats://a:4222,h:99999?stream=S&consumer=c", "host 'h:99999'"},
      {"nats://h:abc?stream=S&consumer=c", "the port is not a number"},
      {"nats://h?stream=S&consumer=c&stream=T", "'stream' is given twice"},
      // JetStream refuses these names at the first connect (error 10103, an
      // invalid subject), which answered UNAVAILABLE: a worker exited 75 (try
      // again later) and was restarted for ever on a typo.
      {"nats://h?stream=S&consumer=a.b", "consumer name"},
      {"nats://h?stream=S&consumer=a*", "consumer name"},
      {"nats://h?stream=S&consumer=c&subject=jobs..in", "subject"},
      {"nats://h?stream=S&consumer=c&subject=jobs%20in", "subject"},
      {"nats://h?stream=S&consumer=c&subject=.jobs", "subject"},
  };
  for (const Case& c : cases) {
    auto o = ParseNatsUri(c.uri);
    ASSERT_FALSE(o.ok()) << c.uri;
    EXPECT_NE(o.status().message().find(c.says), std::string::npos)
        << c.uri << ": " << o.status().ToString();
  }
}

// The C++ API checks the names the URI parser checks (one CheckNames for
// both): OpenNatsSource refused only control bytes, so a NatsOptions with the
// stream "a.b" or the consumer "c*" reached JetStream, which refused it at the
// first connect (read as a server to wait for), and NatsPublisher::Open checked
// nothing (a wildcard subject was published to literally). No server runs here:
// each is refused before any connect.
TEST(NatsUriTest, TheCppApiRefusesTheNamesTheUriRefuses) {
  auto base = ParseNatsUri("nats://127.0.0.1:1?stream=S&consumer=c");
  ASSERT_TRUE(base.ok()) << base.status();
  struct Case {
    void (*edit)(NatsOptions&);
    const char* says;
  } cases[] = {
      {[](NatsOptions& o) { o.stream = "a.b"; }, "nats stream name 'a.b'"},
      {[](NatsOptions& o) { o.stream = "a b"; }, "nats stream name"},
      {[](NatsOptions& o) { o.consumer = "c*"; }, "nats consumer name 'c*'"},
      {[](NatsOptions& o) { o.consumer = "c\nd"; }, "nats consumer='c\\x0ad'"},
      {[](NatsOptions& o) { o.subject = "jobs..in"; }, "nats subject="},
      {[](NatsOptions& o) { o.dead = "S"; }, "nats dead='S'"},
  };
  for (const Case& c : cases) {
    NatsOptions o = *base;
    c.edit(o);
    auto src = OpenNatsSource(o);
    ASSERT_FALSE(src.ok()) << c.says;
    EXPECT_EQ(src.status().code(), StatusCode::kInvalidArgument) << src.status();
    EXPECT_NE(src.status().message().find(c.says), std::string::npos) << src.status();
  }
  NatsOptions pub = *base;
  pub.subject = "jobs.*";
  auto p = NatsPublisher::Open(pub);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("has a wildcard"), std::string::npos) << p.status();
  pub.subject = "";
  pub.stream = "a>b";
  p = NatsPublisher::Open(pub);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("nats stream name"), std::string::npos) << p.status();
}

// tidyuri: "nats://TOKEN:@HOST" was read as the user TOKEN with an empty
// password, and sent so (CONNECT user/pass), where nats.c itself reads that URL
// as a token (natsUrl_Create keeps no password after an empty one, and the
// CONNECT sends a user without a password as auth_token), while the URI grammar
// reads a user with an empty password. Neither reading is sure to be the one
// meant: refused, naming the forms, showing no part of the user-info.
TEST(NatsUriTest, AnEmptyPasswordIsRefusedAsAmbiguous) {
  for (const char* uri : {"nats://S3cr3tT0k:@h:4222?stream=S&consumer=c",
                          "nats://S3cr3tT0k:@h?stream=S"}) {
    auto o = ParseNatsUri(uri, /*need_consumer=*/false);
    ASSERT_FALSE(o.ok()) << uri << ": taken, user '" << o->user << "', token '" << o->token
                         << "', has_password " << o->has_password;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << o.status().ToString();
    EXPECT_NE(o.status().message().find("empty password"), std::string::npos)
        << o.status().ToString();
    EXPECT_NE(o.status().message().find("nats://TOKEN@HOST"), std::string::npos)
        << o.status().ToString();
    EXPECT_EQ(o.status().message().find("S3cr3tT0k"), std::string::npos) << o.status().ToString();
  }
}

// Token authentication (nats-server --auth): a lone user-info is the token, as
// every NATS client reads a URL; token_file= reads it from a file; neither goes
// with a user or a password, and no message shows it.
TEST(NatsUriTest, ALoneUserInfoIsATokenAndTokenFileReadsOne) {
  auto t = ParseNatsUri("nats://s3cr3t-tok@h:4999?stream=S&consumer=c");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->token, "s3cr3t-tok");
  EXPECT_EQ(t->user, "");
  EXPECT_FALSE(t->has_password);
  EXPECT_EQ(t->Describe().find("s3cr3t"), std::string::npos);
  // With a password it is the user name, as before.
  auto up = ParseNatsUri("nats://u:pw@h?stream=S&consumer=c");
  ASSERT_TRUE(up.ok());
  EXPECT_EQ(up->user, "u");
  EXPECT_EQ(up->token, "");
  char path[] = "/tmp/dedup-token-XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(write(fd, "file-tok\n", 9), 9);
  close(fd);
  auto f = ParseNatsUri(std::string("nats://h?stream=S&consumer=c&token_file=") + path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->token, "file-tok");
  for (const std::string bad : {std::string("nats://x@h?stream=S&consumer=c&token_file=") + path,
                                std::string("nats://u:file-tok@h?stream=S&consumer=c&token_file=") + path,
                                std::string("nats://h?stream=S&consumer=c&token_file=") + path +
                                    "&password_file=" + path,
                                std::string("nats://h?stream=S&consumer=c&token_file=")}) {
    auto o = ParseNatsUri(bad);
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(o.status().message().find("token_file="), std::string::npos) << o.status();
    EXPECT_EQ(o.status().message().find("file-tok"), std::string::npos) << o.status();
  }
  unlink(path);
}

// A token holding a '/' (or '?', '#') written raw: the authority ends there, so
// its head was read as the host and the rest as a path nats:// ignored: the
// URI was taken, and the token's head shown as the host of every connect error
// and of Describe() ("nats tok: connect: ..."). A path means nothing to
// nats://: refused, naming neither it nor the host before it.
TEST(NatsUriTest, APathIsRefusedSoATokenWithASlashIsNotReadAsAHost) {
  for (const char* uri : {"nats://s3cr3t/tok@h:4999?stream=S&consumer=c",
                          "nats://s3cr3t/@h?stream=S&consumer=c",
                          "nats://h:4999/s3cr3t?stream=S&consumer=c"}) {
    auto o = ParseNatsUri(uri);
    ASSERT_FALSE(o.ok()) << uri << " was taken, host " << o->host_port;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << o.status().ToString();
    EXPECT_NE(o.status().message().find("path"), std::string::npos) << o.status().ToString();
    EXPECT_EQ(o.status().message().find("s3cr3t"), std::string::npos) << o.status().ToString();
  }
  // Escaped, the '/' is the token's; a lone '/' after the host is no path.
  auto t = ParseNatsUri("nats://s3cr3t%2Ftok@h:4999/?stream=S&consumer=c");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  EXPECT_EQ(t->token, "s3cr3t/tok");
  EXPECT_EQ(t->host_port, "h:4999");
  // '@' and ':' in a token: the last '@' ends the user-info; a ':' makes it a
  // user and a password (as every NATS client reads it), escaped it is the token's.
  auto at = ParseNatsUri("nats://s3@cr3t@h?stream=S&consumer=c");
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  EXPECT_EQ(at->token, "s3@cr3t");
  auto colon = ParseNatsUri("nats://s3%3Acr3t@h?stream=S&consumer=c");
  ASSERT_TRUE(colon.ok()) << colon.status().ToString();
  EXPECT_EQ(colon->token, "s3:cr3t");
  // A raw '?' ends the authority as well: the token's tail and the host became
  // the first parameter's name, echoed as unknown ("unknown parameter
  // 'r3t@h?stream'"). A '#' is the token's (nats:// reads no fragment).
  auto q = ParseNatsUri("nats://s3c?r3t@h?stream=S&consumer=c");
  ASSERT_FALSE(q.ok()) << "taken, host " << q->host_port;
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument) << q.status().ToString();
  EXPECT_EQ(q.status().message().find("r3t"), std::string::npos) << q.status().ToString();
  EXPECT_EQ(q.status().message().find("s3c"), std::string::npos) << q.status().ToString();
  EXPECT_NE(q.status().message().find("%3F"), std::string::npos) << q.status().ToString();
  auto hash = ParseNatsUri("nats://s3c#r3t@h?stream=S&consumer=c");
  ASSERT_TRUE(hash.ok()) << hash.status().ToString();
  EXPECT_EQ(hash->token, "s3c#r3t");
  auto bad = ParseNatsUri("nats://s3cr3t%zz@h?stream=S&consumer=c");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().find("s3cr3t"), std::string::npos) << bad.status().ToString();
}

// "nats://user:pass" with the "@host" forgotten: the password was echoed as the
// host of the connect error ("nats default:hunter2: connect: Invalid Argument").
// nats.c puts the user, password and token into its CONNECT JSON unescaped: a
// password 'x","pass":"real' logged in with "real", and a backslash or a line
// end made every connect a "Protocol Error" (exit 75, for ever). Refused when
// the URI is read (and by Connect, for options built in C++), never echoed.
TEST(NatsUriTest, ACredentialThatWouldBreakTheConnectJsonIsRefused) {
  for (const std::string uri :
       {"nats://alice:x%22,%22pass%22:%22Secret9@127.0.0.1:1?stream=S&consumer=c",
        "nats://alice:x%5CSecret9@127.0.0.1:1?stream=S&consumer=c",
        "nats://alice:x%0D%0ASecret9@127.0.0.1:1?stream=S&consumer=c",
        "nats://al%22ice:Secret9@127.0.0.1:1?stream=S&consumer=c",
        "nats://tok%22Secret9@127.0.0.1:1?stream=S&consumer=c"}) {
    auto o = ParseNatsUri(uri);
    ASSERT_FALSE(o.ok()) << uri;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << o.status().ToString();
    EXPECT_NE(o.status().message().find("CONNECT"), std::string::npos) << o.status().ToString();
    EXPECT_EQ(o.status().message().find("Secret9"), std::string::npos) << o.status().ToString();
  }
  auto fine = ParseNatsUri("nats://alice:Sec%2Fret@127.0.0.1:1?stream=S&consumer=c");
  ASSERT_TRUE(fine.ok()) << fine.status().ToString();
  NatsOptions built = *fine;
  built.password = "a\"b";
  auto src = OpenNatsSource(built);
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kInvalidArgument) << src.status().ToString();
}

// prefix= of 1024 bytes or more (1024 - 64 before key=sha256) makes every key
// longer than a store takes: every message was dead-lettered. Refused at start.
TEST(NatsUriTest, APrefixThatLeavesNoRoomForAKeyIsRefused) {
  const std::string base = "nats://127.0.0.1:1?stream=S&consumer=c&prefix=";
  EXPECT_TRUE(ParseNatsUri(base + std::string(1023, 'p')).ok());
  auto o = ParseNatsUri(base + std::string(1024, 'p'));
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("prefix= is 1024 bytes"), std::string::npos)
      << o.status().ToString();
  EXPECT_FALSE(ParseNatsUri(base + std::string(961, 'p') + "&key=sha256").ok());
  EXPECT_TRUE(ParseNatsUri(base + std::string(960, 'p') + "&key=sha256").ok());
}

// A header name NATS cannot carry (a header line is "NAME: value") was accepted,
// and every message then had no key.
TEST(NatsUriTest, AKeyHeaderNameWithAColonOrSpaceIsRefused) {
  for (const std::string bad : {"a:b", "a%20b", "a%09b"}) {
    auto o = ParseNatsUri("nats://127.0.0.1:1?stream=S&consumer=c&key=header:" + bad);
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_NE(o.status().message().find("header name"), std::string::npos) << o.status().ToString();
  }
  EXPECT_TRUE(ParseNatsUri("nats://127.0.0.1:1?stream=S&consumer=c&key=header:Dedup-Key").ok());
}

TEST(NatsUriTest, APasswordReadAsAPortIsNotEchoed) {
  auto o = ParseNatsUri("nats://default:hunter2?stream=S&consumer=c");
  ASSERT_FALSE(o.ok());
  EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << o.status().ToString();
  EXPECT_EQ(o.status().message().find("hunter2"), std::string::npos) << o.status().ToString();
  EXPECT_NE(o.status().message().find("default:***"), std::string::npos) << o.status().ToString();
}

TEST_F(NatsSourceTest, DeliversWithKeyAndCountAndAckRemovesIt) {
  auto src = OpenNatsSource(Uri());
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  Publish("m-1", "one");
  Publish("m-2", "two");
  auto got = FetchAll(**src, 2, Millis(5000));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0]->key(), "m-1");
  EXPECT_EQ(got[0]->payload(), "one");
  EXPECT_EQ(got[0]->delivery_count(), 1u);
  EXPECT_EQ(got[1]->key(), "m-2");
  std::vector<Delivery*> all = {got[0].get(), got[1].get()};
  for (const Status& st : (*src)->AckBatch(all)) ASSERT_TRUE(st.ok()) << st.ToString();
  auto later = FetchAll(**src, 1, Millis(700));
  EXPECT_TRUE(later.empty());
}

TEST_F(NatsSourceTest, ATrickleIsNotHeldBackToFillABatch) {
  auto src = OpenNatsSource(Uri());
  ASSERT_TRUE(src.ok());
  std::thread pub([&] {
    std::this_thread::sleep_for(Millis(300));
    Publish("m-1", "x");
  });
  const auto t0 = steady_clock::now();
  auto b = (*src)->Fetch(32, Millis(3000));
  pub.join();
  ASSERT_TRUE(b.ok());
  ASSERT_EQ(b->size(), 1u);
  EXPECT_LT(steady_clock::now() - t0, Millis(2000));
  ASSERT_TRUE((*b)[0]->Ack().ok());
}

TEST_F(NatsSourceTest, PublishSetsNatsMsgIdAndTheStreamDropsARepeatInItsWindow) {
  bool dup = true;
  Publish("k-1", "a", "", &dup);
  EXPECT_FALSE(dup);
  Publish("k-1", "a", "", &dup);
  EXPECT_TRUE(dup);
  // With the key in a header instead, the stream keeps the repeat.
  Publish("k-2", "b", "&key=header:Dedup-Key", &dup);
  Publish("k-2", "b", "&key=header:Dedup-Key", &dup);
  EXPECT_FALSE(dup);
  auto src = OpenNatsSource(Uri("&key=header:Dedup-Key"));
  ASSERT_TRUE(src.ok());
  auto got = FetchAll(**src, 3, Millis(5000));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_TRUE(got[0]->key().empty());  // k-1 carries no Dedup-Key header
  EXPECT_NE(got[0]->key_error().find("Dedup-Key"), std::string::npos);
  EXPECT_EQ(got[1]->key(), "k-2");
  EXPECT_EQ(got[2]->key(), "k-2");
  for (auto& d : got) ASSERT_TRUE(d->Ack().ok());
}

TEST_F(NatsSourceTest, RetryNaksWithTheDelay) {
  auto src = OpenNatsSource(Uri());
  ASSERT_TRUE(src.ok());
  Publish("slow", "a");
  auto first = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(first.size(), 1u);
  const auto t0 = steady_clock::now();
  ASSERT_TRUE(first[0]->Retry(Millis(600)).ok());
  Publish("next", "b");
  auto second = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0]->key(), "next");
  ASSERT_TRUE(second[0]->Ack().ok());
  auto back = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0]->key(), "slow");
  EXPECT_EQ(back[0]->delivery_count(), 2u);
  EXPECT_GE(steady_clock::now() - t0, Millis(550));
  ASSERT_TRUE(back[0]->Ack().ok());
}

TEST_F(NatsSourceTest, InProgressKeepsItFromRedeliveryPastAckWait) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok());
  Publish("long", "a");
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  // 2.5 AckWaits of work, with +WPI every 300 ms: no redelivery meanwhile.
  const auto end = steady_clock::now() + Millis(2500);
  while (steady_clock::now() < end) {
    ASSERT_TRUE(got[0]->InProgress().ok());
    auto b = (*src)->Fetch(1, Millis(300));
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(b->empty()) << "redelivered while in progress";
  }
  // Without it, AckWait redelivers.
  auto again = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0]->key(), "long");
  EXPECT_EQ(again[0]->delivery_count(), 2u);
  ASSERT_TRUE(again[0]->Ack().ok());
}

TEST_F(NatsSourceTest, DeadLetterTermsAndCopiesWithTheReason) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok());
  Publish("bad", "payload");
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(got[0]->DeadLetter("EXHAUSTED: 5 attempts").ok());
  // Terminated: not redelivered after AckWait.
  EXPECT_TRUE(FetchAll(**src, 1, Millis(1800)).empty());
  auto d = DeadLetters(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->key(), "bad");
  EXPECT_EQ(d[0]->payload(), "payload");
  std::string reason;
  for (const auto& [k, v] : d[0]->attributes()) {
    if (k == "Dedup-Reason") reason = v;
  }
  EXPECT_EQ(reason, "EXHAUSTED: 5 attempts");
  ASSERT_TRUE(d[0]->Ack().ok());
}

TEST_F(NatsSourceTest, ServerRestartKeepsTheStreamAndRedeliversUnacked) {
  const char* restart = std::getenv("DEDUP_TEST_NATS_RESTART");
  ASSERT_NE(restart, nullptr);
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok());
  Publish("m-1", "x");
  Publish("m-2", "y");
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  { std::ofstream(restart) << "restart\n"; }
  for (int i = 0; i < 200; ++i) {  // wait until the script has restarted it
    std::this_thread::sleep_for(Millis(50));
    std::ifstream f(restart);
    if (f.peek() == std::ifstream::traits_type::eof()) break;
  }
  // Both come back (m-1 was never acked), from the file-backed stream.
  auto after = FetchAll(**src, 2, Millis(15000));
  ASSERT_EQ(after.size(), 2u);
  std::set<std::string> keys;
  for (auto& d : after) {
    keys.insert(d->key());
    ASSERT_TRUE(d->Ack().ok());
  }
  EXPECT_EQ(keys, (std::set<std::string>{"m-1", "m-2"}));
}

// ---- adversarial review (brokerreview) ----------------------------------------

// A raw nats.c connection for what the source must cope with but never does
// itself: consumers made by someone else, messages with JetStream's own headers.
class RawNats {
 public:
  RawNats() {
    EXPECT_EQ(natsConnection_ConnectTo(&nc_, BaseUri().c_str()), NATS_OK);
    EXPECT_EQ(natsConnection_JetStream(&js_, nc_, nullptr), NATS_OK);
  }
  ~RawNats() {
    if (js_ != nullptr) jsCtx_Destroy(js_);
    if (nc_ != nullptr) natsConnection_Destroy(nc_);
  }
  // Adds durable pull consumer `name` on `stream`, filtered on `subject` (a push
  // consumer when `deliver_subject` is given).
  void AddConsumer(const std::string& stream, const std::string& name, const std::string& subject,
                   jsAckPolicy policy, int64_t max_deliver, const std::string& deliver_subject = "") {
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = name.c_str();
    cc.DeliverSubject = deliver_subject.empty() ? nullptr : deliver_subject.c_str();
    cc.AckPolicy = policy;
    cc.MaxDeliver = max_deliver;
    cc.FilterSubject = subject.empty() ? nullptr : subject.c_str();
    jsConsumerInfo* ci = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    ASSERT_EQ(js_AddConsumer(&ci, js_, stream.c_str(), &cc, nullptr, &jerr), NATS_OK)
        << "jerr " << jerr;
    jsConsumerInfo_Destroy(ci);
  }
  // Adds stream `name` on `subject` that holds at most `max_msgs` and refuses
  // more (discard new).
  void AddFullStream(const std::string& name, const std::string& subject, int64_t max_msgs) {
    jsStreamConfig cfg;
    jsStreamConfig_Init(&cfg);
    cfg.Name = name.c_str();
    const char* subjects[] = {subject.c_str()};
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.MaxMsgs = max_msgs;
    cfg.Discard = js_DiscardNew;
    jsStreamInfo* si = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    ASSERT_EQ(js_AddStream(&si, js_, &cfg, nullptr, &jerr), NATS_OK) << "jerr " << jerr;
    jsStreamInfo_Destroy(si);
  }
  // Adds stream `name` on `subject` that refuses a message (data and headers)
  // over `max_msg_size` bytes.
  void AddSizedStream(const std::string& name, const std::string& subject, int32_t max_msg_size) {
    jsStreamConfig cfg;
    jsStreamConfig_Init(&cfg);
    cfg.Name = name.c_str();
    const char* subjects[] = {subject.c_str()};
    cfg.Subjects = subjects;
    cfg.SubjectsLen = 1;
    cfg.MaxMsgSize = max_msg_size;
    jsStreamInfo* si = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    ASSERT_EQ(js_AddStream(&si, js_, &cfg, nullptr, &jerr), NATS_OK) << "jerr " << jerr;
    jsStreamInfo_Destroy(si);
  }
  // The server's max_payload.
  int64_t MaxPayload() { return natsConnection_GetMaxPayload(nc_); }
  void DeleteConsumer(const std::string& stream, const std::string& name) {
    jsErrCode jerr = static_cast<jsErrCode>(0);
    ASSERT_EQ(js_DeleteConsumer(js_, stream.c_str(), name.c_str(), nullptr, &jerr), NATS_OK)
        << "jerr " << jerr;
  }
  // The consumer's AckPolicy and filter, or false when it does not exist.
  bool ConsumerConfig(const std::string& stream, const std::string& name, jsAckPolicy* policy,
                      std::string* filter) {
    jsConsumerInfo* ci = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    if (js_GetConsumerInfo(&ci, js_, stream.c_str(), name.c_str(), nullptr, &jerr) != NATS_OK) {
      return false;
    }
    *policy = ci->Config->AckPolicy;
    *filter = ci->Config->FilterSubject != nullptr ? ci->Config->FilterSubject : "";
    jsConsumerInfo_Destroy(ci);
    return true;
  }
  void DeleteStream(const std::string& stream) {
    jsErrCode jerr = static_cast<jsErrCode>(0);
    ASSERT_EQ(js_DeleteStream(js_, stream.c_str(), nullptr, &jerr), NATS_OK) << "jerr " << jerr;
  }
  // Publishes `data` to `subject` with the headers given.
  void Publish(const std::string& subject, const std::string& data,
               const std::vector<std::pair<std::string, std::string>>& headers) {
    natsMsg* m = nullptr;
    ASSERT_EQ(natsMsg_Create(&m, subject.c_str(), nullptr, data.data(), static_cast<int>(data.size())),
              NATS_OK);
    for (const auto& [k, v] : headers) ASSERT_EQ(natsMsgHeader_Add(m, k.c_str(), v.c_str()), NATS_OK);
    jsPubAck* pa = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    EXPECT_EQ(js_PublishMsg(&pa, js_, m, nullptr, &jerr), NATS_OK) << "jerr " << jerr;
    if (pa != nullptr) jsPubAck_Destroy(pa);
    natsMsg_Destroy(m);
  }

 private:
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
};

// An existing durable consumer was used "as it is". With AckPolicy all, one +ACK
// acks every earlier message too, including ones still being worked on (or
// NAKed as BUSY) whose outcome is not recorded; with a MaxDeliver, a message
// redelivered that often (BUSY NAKs count) is never delivered again, neither
// done nor dead-lettered. Both must be refused when the source opens, naming
// the setting. On main both opened: "Value of: src.ok() Actual: true".
TEST_F(NatsSourceTest, AnExistingConsumerThatAcksOrDropsUnrecordedWorkIsRefused) {
  Publish("m", "x");  // creates the stream
  RawNats raw;
  raw.AddConsumer(stream_, "all", stream_ + ".in", js_AckAll, -1);
  raw.AddConsumer(stream_, "few", stream_ + ".in", js_AckExplicit, 3);
  const std::string base = BaseUri() + "?stream=" + stream_ + "&subject=" + stream_ + ".in";
  auto all = OpenNatsSource(base + "&consumer=all");
  ASSERT_FALSE(all.ok()) << "a consumer with AckPolicy all was accepted";
  EXPECT_EQ(all.status().code(), StatusCode::kFailedPrecondition) << all.status().ToString();
  EXPECT_NE(all.status().message().find("AckPolicy"), std::string::npos) << all.status().ToString();
  auto few = OpenNatsSource(base + "&consumer=few");
  ASSERT_FALSE(few.ok()) << "a consumer with MaxDeliver 3 was accepted";
  EXPECT_EQ(few.status().code(), StatusCode::kFailedPrecondition) << few.status().ToString();
  EXPECT_NE(few.status().message().find("MaxDeliver"), std::string::npos) << few.status().ToString();
  // The one this source makes itself is still fine when opened again.
  ASSERT_TRUE(OpenNatsSource(Uri()).ok());
  auto again = OpenNatsSource(Uri());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
}

// A push consumer (with a deliver subject): nats.c's pull subscribe failed with
// "pull subscribe push1: Error", UNAVAILABLE, which the worker read as "try
// again later" (exit 75) every time. Refused naming what it is.
TEST_F(NatsSourceTest, AnExistingPushConsumerIsRefusedNamingIt) {
  Publish("m", "x");  // creates the stream
  RawNats raw;
  raw.AddConsumer(stream_, "push1", stream_ + ".in", js_AckExplicit, -1, "deliver." + stream_);
  auto src = OpenNatsSource(BaseUri() + "?stream=" + stream_ + "&subject=" + stream_ +
                            ".in&consumer=push1");
  ASSERT_FALSE(src.ok()) << "a push consumer was accepted";
  EXPECT_EQ(src.status().code(), StatusCode::kFailedPrecondition) << src.status().ToString();
  EXPECT_NE(src.status().message().find("push consumer"), std::string::npos)
      << src.status().ToString();
}

// A subject= the existing stream does not hold (the default, the stream's own
// name, among them) was refused by the server as "add consumer nosub: Not Found
// (JetStream error 10014)"; publish named the stream's subjects. Now both do.
TEST_F(NatsSourceTest, ASubjectTheStreamDoesNotHoldIsNamedAtOpen) {
  Publish("m", "x");  // stream_ holds stream_.in
  for (const std::string& extra : {std::string(), "&subject=" + stream_ + ".typo"}) {
    auto src = OpenNatsSource(BaseUri() + "?stream=" + stream_ + "&consumer=nosub" + extra);
    ASSERT_FALSE(src.ok()) << "subject not held, accepted: " << extra;
    EXPECT_EQ(src.status().code(), StatusCode::kFailedPrecondition) << src.status().ToString();
    EXPECT_NE(src.status().message().find("holds subjects " + stream_ + ".in"), std::string::npos)
        << src.status().ToString();
  }
  // A filter with a wildcard that selects the stream's subject is one it holds.
  auto wild = OpenNatsSource(BaseUri() + "?stream=" + stream_ + "&consumer=wild&subject=" +
                             stream_ + ".*");
  EXPECT_TRUE(wild.ok()) << wild.status().ToString();
}

// An existing consumer is used as it is: its AckWait and MaxAckPending won over
// the URI's without a word, and an AckWait under the lease's heartbeat made a
// running handler's message come back between two heartbeats. Said at open.
TEST_F(NatsSourceTest, AnExistingConsumersOwnSettingsAreToldAtOpen) {
  Publish("m", "x");  // creates the stream
  RawNats raw;
  raw.AddConsumer(stream_, "own", stream_ + ".in", js_AckExplicit, -1);  // AckWait 30 s default
  std::vector<std::string> told;
  SourceOptions so;
  so.lease = Millis(300'000);
  so.on_warning = [&](const std::string& m) { told.push_back(m); };
  auto src = OpenNatsSource(BaseUri() + "?stream=" + stream_ + "&subject=" + stream_ +
                                ".in&consumer=own&ack_wait=10s&max_ack_pending=7",
                            so);
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  ASSERT_EQ(told.size(), 3u) << (told.empty() ? "" : told[0]);
  EXPECT_NE(told[0].find("AckWait 30000ms, not ack_wait=10000ms"), std::string::npos) << told[0];
  EXPECT_NE(told[1].find("not max_ack_pending=7"), std::string::npos) << told[1];
  EXPECT_NE(told[2].find("under the lease's heartbeat (100000ms"), std::string::npos) << told[2];
  // The consumer the source makes itself is the URI's: nothing to tell.
  told.clear();
  so.lease = Millis(30'000);  // AckWait 10 s is its heartbeat interval: fine
  auto made = OpenNatsSource(Uri("&ack_wait=10s&max_ack_pending=7"), so);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  made->reset();
  auto again = OpenNatsSource(Uri("&ack_wait=200s&max_ack_pending=7"), so);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(told.size(), 1u) << "only the AckWait it was made with differs";
}

// A consumer with no filter reads every subject of its stream. On a stream that
// holds more than subject= (an operator's "jobs.>" read as subject=jobs.in) it
// handed the workers messages the URI does not name, and with dead= under the
// stream's subjects their own dead letters too; "a filter on another subject"
// was refused, no filter at all was used. On 766d916:
//   Value of: src.ok() Actual: true  (a consumer without a filter was accepted)
TEST_F(NatsSourceTest, AnExistingConsumerWithoutAFilterOnAWiderStreamIsRefused) {
  RawNats raw;
  raw.AddFullStream(stream_, stream_ + ".>", -1);
  raw.AddConsumer(stream_, "nofilter", "", js_AckExplicit, -1);
  auto src = OpenNatsSource(BaseUri() + "?stream=" + stream_ + "&consumer=nofilter&subject=" +
                            stream_ + ".in");
  ASSERT_FALSE(src.ok()) << "a consumer without a filter was accepted";
  EXPECT_EQ(src.status().code(), StatusCode::kFailedPrecondition) << src.status().ToString();
  EXPECT_NE(src.status().message().find("filter"), std::string::npos) << src.status().ToString();
  // Without a filter on a stream that holds only the subject: the same messages.
  const std::string one = stream_ + "ONE";
  raw.AddFullStream(one, one + ".in", -1);
  raw.AddConsumer(one, "nofilter", "", js_AckExplicit, -1);
  auto fine = OpenNatsSource(BaseUri() + "?stream=" + one + "&consumer=nofilter&subject=" + one + ".in");
  EXPECT_TRUE(fine.ok()) << fine.status().ToString();
  // The consumer the source makes on the wider stream opens, also again.
  ASSERT_TRUE(OpenNatsSource(Uri()).ok());
  auto again = OpenNatsSource(Uri());
  EXPECT_TRUE(again.ok()) << again.status().ToString();
}

// A dead subject the source itself consumes sends every dead letter back to the
// workers, which dead-letter it again (it has no Nats-Msg-Id: "no key"), for
// ever; a wildcard can never be published to, so every dead letter failed and
// was NAKed back at once. Both are refused when the URI is read. On main both
// parsed: "Value of: o.ok() Actual: true".
TEST(NatsUriTest, ADeadSubjectThatLoopsOrCannotBePublishedIsRefused) {
  const char* bad[] = {
      "nats://h?stream=S&consumer=c&subject=jobs.in&dead=jobs.in",
      "nats://h?stream=S&consumer=c&subject=jobs.>&dead=jobs.dead",
      "nats://h?stream=S&consumer=c&subject=jobs.*.in&dead=jobs.x.in",
      "nats://h?stream=S&consumer=c&dead=S",  // the subject defaults to the stream name
      "nats://h?stream=S&consumer=c&dead=dead.*",
      "nats://h?stream=S&consumer=c&dead=dead.>",
      "nats://h?stream=S&consumer=c&dead=dead..x",
      "nats://h?stream=S&consumer=c&dead=dead%20x",
  };
  for (const char* uri : bad) {
    auto o = ParseNatsUri(uri);
    ASSERT_FALSE(o.ok()) << uri;
    EXPECT_EQ(o.status().code(), StatusCode::kInvalidArgument) << uri;
    EXPECT_NE(o.status().message().find("dead"), std::string::npos) << uri << ": " << o.status();
  }
  EXPECT_TRUE(ParseNatsUri("nats://h?stream=S&consumer=c&subject=jobs.>&dead=dead.jobs").ok());
  EXPECT_TRUE(ParseNatsUri("nats://h?stream=S&consumer=c&subject=jobs.*&dead=jobs.x.y").ok());
}

// The dead-letter copy carried the original's headers as they were, JetStream's
// own included: Nats-Expected-Stream names the work stream, so the dead stream
// refused the copy (JetStream error 10060), the original was NAKed back at once,
// and the MISMATCH or EXHAUSTED message came round again for ever. On main:
// "DeadLetter: ... expected stream does not match (JetStream error 10060)".
TEST_F(NatsSourceTest, DeadLetterOfAMessageWithJetStreamHeadersIsStored) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  RawNats raw;
  raw.Publish(stream_ + ".in", "payload",
              {{"Nats-Msg-Id", "k-1"}, {"Nats-Expected-Stream", stream_}, {"Other", "kept"},
               {"Other", "too"}});
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0]->key(), "k-1");
  Status dl = got[0]->DeadLetter("MISMATCH: same id, different payload");
  ASSERT_TRUE(dl.ok()) << dl.ToString();
  EXPECT_TRUE(FetchAll(**src, 1, Millis(1500)).empty()) << "the original came back";
  auto d = DeadLetters(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->key(), "k-1");
  std::map<std::string, std::string> h(d[0]->attributes().begin(), d[0]->attributes().end());
  EXPECT_EQ(h["Other"], "kept");
  EXPECT_EQ(h["Dedup-Reason"], "MISMATCH: same id, different payload");
  EXPECT_EQ(h["Dedup-Original-Nats-Expected-Stream"], stream_);
  EXPECT_EQ(h.count("Nats-Expected-Stream"), 0u);
  // A repeated header keeps all its values on the copy (it kept the first).
  EXPECT_EQ(std::count(d[0]->attributes().begin(), d[0]->attributes().end(),
                       std::pair<std::string, std::string>("Other", "too")),
            1);
  ASSERT_TRUE(d[0]->Ack().ok());
}

// The dead stream deleted while the source runs: no stream took the copy (no
// responders), the original was NAKed back at once and failed the same way on
// every delivery, as fast as the network goes. On main:
//   UNAVAILABLE: nats 127.0.0.1:4239: dead letter to dedup.dead.T...: No responders
//   available for request (JetStream error 10076)
TEST_F(NatsSourceTest, DeadLetterAfterTheDeadStreamWasDeletedMakesItAgain) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  RawNats raw;
  raw.DeleteStream(stream_ + "_DEAD");
  Publish("gone", "payload");
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  Status dl = got[0]->DeadLetter("EXHAUSTED: 3 attempts");
  ASSERT_TRUE(dl.ok()) << dl.ToString();
  auto back = FetchAll(**src, 1, Millis(1500));
  EXPECT_TRUE(back.empty()) << "the original came back: " << back[0]->key() << " #"
                            << back[0]->delivery_count();
  auto d = DeadLetters(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->key(), "gone");
  ASSERT_TRUE(d[0]->Ack().ok());
}

// A header the original already has under a name the copy gives (a dead letter
// sent back to the stream by hand carries Dedup-Original-Msg-Id): the copy had
// two values under it, the stale one possibly first, so that a reader of the
// dead stream keyed on it got the wrong id.
TEST_F(NatsSourceTest, DeadLetterOriginalIdIsTheOneOfThisMessage) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  RawNats raw;
  raw.Publish(stream_ + ".in", "payload",
              {{"Dedup-Original-Msg-Id", "stale"}, {"Nats-Msg-Id", "k-2"},
               {"Dedup-Original-Nats-Expected-Stream", "stale"}, {"Nats-Expected-Stream", stream_}});
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0]->key(), "k-2");
  Status dl = got[0]->DeadLetter("EXHAUSTED: 3 attempts");
  ASSERT_TRUE(dl.ok()) << dl.ToString();
  auto d = DeadLetters(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->key(), "k-2");
  std::vector<std::string> ids, expected;
  for (const auto& [k, v] : d[0]->attributes()) {
    if (k == "Dedup-Original-Msg-Id") ids.push_back(v);
    if (k == "Dedup-Original-Nats-Expected-Stream") expected.push_back(v);
  }
  EXPECT_EQ(ids, std::vector<std::string>{"k-2"});
  EXPECT_EQ(expected, std::vector<std::string>{stream_});
  ASSERT_TRUE(d[0]->Ack().ok());
}

// A dead letter whose copy the dead stream refuses (full, discard new: it will
// refuse the next one too) was NAKed without a delay: the server redelivered it
// at once, the Consumer dead-lettered it again, and so on as fast as the
// network goes. Now it comes back after AckWait, as if never settled. On
// 766d916:
//   Value of: FetchAll(**src, 1, Millis(600)).empty()  Actual: false
TEST_F(NatsSourceTest, AFailedDeadLetterCopyIsNotRedeliveredAtOnce) {
  RawNats raw;
  raw.AddFullStream(stream_ + "_DEAD", "dedup.dead." + stream_, 1);
  raw.Publish("dedup.dead." + stream_, "filler", {});
  auto src = OpenNatsSource(Uri("&ack_wait=2s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  Publish("full", "payload");
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  const auto t0 = steady_clock::now();
  Status dl = got[0]->DeadLetter("EXHAUSTED: 3 attempts");
  EXPECT_FALSE(dl.ok()) << "the dead stream is full";
  EXPECT_TRUE(FetchAll(**src, 1, Millis(600)).empty()) << "redelivered at once";
  auto back = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(back.size(), 1u) << "never redelivered";
  EXPECT_GE(steady_clock::now() - t0, Millis(1900));
  EXPECT_EQ(back[0]->key(), "full");
  ASSERT_TRUE(back[0]->Ack().ok());
}

// ---- dead letters too large for a copy (brokerfix) --------------------------------

std::map<std::string, std::string> Headers(const Delivery& d) {
  return std::map<std::string, std::string>(d.attributes().begin(), d.attributes().end());
}

// A message near max_payload: its dead-letter copy (the data, its headers, and
// Dedup-Reason, -Stream, -Sequence) is over max_payload whatever the reason's
// length, nats.c refuses it (NATS_MAX_PAYLOAD), the original is NAKed back and
// is dead-lettered again after every AckWait, for ever: never recorded in the
// dead stream, never settled. Now the copy goes without the data, saying so
// (Dedup-Payload-Dropped), and the original is terminated once it is stored.
// On main:
//   dl.ok() Actual: false  INVALID_ARGUMENT: nats ...: dead letter to
//   dedup.dead.T...: Maximum Payload Exceeded
TEST_F(NatsSourceTest, ADeadLetterOfAMessageNearMaxPayloadIsStoredWithoutItsData) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const int64_t max_payload = RawNats().MaxPayload();
  ASSERT_GT(max_payload, 4096);
  // The original (the data, and "NATS/1.0", Nats-Msg-Id: big) fits; the copy's
  // headers (Dedup-Original-Msg-Id, -Reason, -Stream, -Sequence) take more than
  // the 64 bytes left.
  const std::string data(static_cast<size_t>(max_payload - 64), 'x');
  Publish("big", data);
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0]->payload().size(), data.size());
  const std::string seq = got[0]->id();
  Status dl = got[0]->DeadLetter("EXHAUSTED: 3 attempts");
  ASSERT_TRUE(dl.ok()) << dl.ToString();
  // Terminated once the copy was stored: not redelivered after AckWait.
  EXPECT_TRUE(FetchAll(**src, 1, Millis(1800)).empty()) << "the original came back";
  auto d = DeadLetters(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->key(), "big");
  EXPECT_EQ(d[0]->payload().size(), 0u);
  auto h = Headers(*d[0]);
  EXPECT_EQ(h["Dedup-Reason"], "EXHAUSTED: 3 attempts");
  EXPECT_EQ(h["Dedup-Stream"], stream_);
  EXPECT_EQ(h["Dedup-Sequence"], seq);
  EXPECT_NE(h["Dedup-Payload-Dropped"].find(std::to_string(data.size()) + " bytes"),
            std::string::npos)
      << h["Dedup-Payload-Dropped"];
  EXPECT_NE(h["Dedup-Payload-Dropped"].find("max_payload"), std::string::npos)
      << h["Dedup-Payload-Dropped"];
  ASSERT_TRUE(d[0]->Ack().ok());
}

// The dead stream's own max_msg_size (an operator's stream holding the dead
// subject) below the message's size: the stream refused every copy (JetStream
// error 10054), and the original came back after every AckWait, for ever. Now
// the copy goes without the data, as over max_payload. On main:
//   dl.ok() Actual: false  UNAVAILABLE: ... (JetStream error 10054)
TEST_F(NatsSourceTest, ADeadLetterOverTheDeadStreamsMaxMsgSizeIsStoredWithoutItsData) {
  RawNats raw;
  raw.AddSizedStream(stream_ + "_DEAD", "dedup.dead." + stream_, 1024);
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const std::string data(2000, 'y');
  Publish("sized", data);
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  const std::string seq = got[0]->id();
  Status dl = got[0]->DeadLetter("failed: exit 1");
  ASSERT_TRUE(dl.ok()) << dl.ToString();
  EXPECT_TRUE(FetchAll(**src, 1, Millis(1800)).empty()) << "the original came back";
  auto d = DeadLetters(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->key(), "sized");
  EXPECT_EQ(d[0]->payload(), "");
  auto h = Headers(*d[0]);
  EXPECT_EQ(h["Dedup-Reason"], "failed: exit 1");
  EXPECT_EQ(h["Dedup-Sequence"], seq);
  EXPECT_NE(h["Dedup-Payload-Dropped"].find("2000 bytes"), std::string::npos)
      << h["Dedup-Payload-Dropped"];
  EXPECT_NE(h["Dedup-Payload-Dropped"].find("max_msg_size"), std::string::npos)
      << h["Dedup-Payload-Dropped"];
  ASSERT_TRUE(d[0]->Ack().ok());
}

// Headers too large for the dead stream even without the data (a header
// block near the limit, and a long reason): the copy keeps only what names
// the message (its id, stream, sequence) and the reason cut short, and says
// how much was left off; the original is still terminated only once it is
// stored. On main: refused as above.
TEST_F(NatsSourceTest, ADeadLetterWhoseHeadersDoNotFitKeepsWhatNamesTheMessage) {
  RawNats raw;
  raw.AddSizedStream(stream_ + "_DEAD", "dedup.dead." + stream_, 1024);
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  raw.Publish(stream_ + ".in", "data",
              {{"Nats-Msg-Id", "wide"}, {"Trace", std::string(700, 't')}});
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  const std::string seq = got[0]->id();
  const std::string reason(3000, 'r');
  Status dl = got[0]->DeadLetter(reason);
  ASSERT_TRUE(dl.ok()) << dl.ToString();
  EXPECT_TRUE(FetchAll(**src, 1, Millis(1800)).empty()) << "the original came back";
  auto d = DeadLetters(1);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0]->key(), "wide");
  auto h = Headers(*d[0]);
  EXPECT_EQ(h["Dedup-Sequence"], seq);
  EXPECT_EQ(h["Dedup-Stream"], stream_);
  EXPECT_EQ(h.count("Trace"), 0u);
  EXPECT_FALSE(h["Dedup-Headers-Dropped"].empty());
  EXPECT_TRUE(h["Dedup-Reason"].starts_with("rrr")) << h["Dedup-Reason"];
  EXPECT_NE(h["Dedup-Reason"].find("3000 bytes in all"), std::string::npos) << h["Dedup-Reason"];
  ASSERT_TRUE(d[0]->Ack().ok());
}

// A dead stream so small that even the bare copy (what names the message)
// is refused: no copy, so the original is not terminated; it is given back
// after ack_wait (not at once: a loop), and nothing reached the dead stream
// (brokerreview: what held when both smaller copies fail).
TEST_F(NatsSourceTest, ADeadLetterNoCopyFitsIsGivenBackAfterAckWaitNotTerminated) {
  RawNats raw;
  raw.AddSizedStream(stream_ + "_DEAD", "dedup.dead." + stream_, 64);
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  Publish("tiny", std::string(2000, 'z'));
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  Status dl = got[0]->DeadLetter("failed: exit 1");
  ASSERT_FALSE(dl.ok());
  EXPECT_NE(dl.message().find("max_msg_size"), std::string::npos) << dl.ToString();
  got.clear();
  EXPECT_TRUE(FetchAll(**src, 1, Millis(600)).empty()) << "given back at once";
  auto back = FetchAll(**src, 1, Millis(3000));
  ASSERT_EQ(back.size(), 1u) << "terminated without a copy";
  EXPECT_EQ(back[0]->key(), "tiny");
  ASSERT_TRUE(back[0]->Ack().ok());
  auto dead = OpenNatsSource(BaseUri() + "?stream=" + stream_ + "_DEAD&consumer=d&subject=dedup.dead." +
                             stream_ + "&key=header:Dedup-Original-Msg-Id");
  ASSERT_TRUE(dead.ok()) << dead.status().ToString();
  EXPECT_TRUE(FetchAll(**dead, 1, Millis(1000)).empty()) << "a copy reached the dead stream";
}

// ---- edges (brokeredge) ---------------------------------------------------------

// Fetches for 3 s or until a fetch answers FailedPrecondition (a consumer
// refused); counts what was delivered meanwhile and returns the last error.
Status FetchUntilRefused(MessageSource& src, size_t* delivered) {
  Status last;
  const auto end = steady_clock::now() + Millis(3000);
  while (steady_clock::now() < end) {
    auto b = src.Fetch(1, Millis(200));
    if (!b.ok()) {
      last = b.status();
      if (last.code() == StatusCode::kFailedPrecondition) break;
      continue;
    }
    *delivered += b->size();
  }
  return last;
}

void NatsSourceTest::OpenAckOneAndDeleteTheConsumer(std::unique_ptr<MessageSource>* src) {
  auto opened = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  *src = std::move(opened).value();
  Publish("a", "1");
  auto first = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(first.size(), 1u);
  ASSERT_TRUE(first[0]->Ack().ok());
  RawNats().DeleteConsumer(stream_, "c");
}

// A durable consumer deleted while the source runs (by an operator, or an
// InactiveThreshold): every pull went unanswered and timed out, which a fetch
// reads as "nothing there", so the source went quiet for ever without an error.
// Now the source makes it again as it does at open (explicit acks, no
// MaxDeliver, filtered on subject=), and the stream's messages are delivered
// from the start (the buffer answers DUPLICATE for those done). On main:
//   Expected equality of these values: keys Which is: {}  { "a", "b" }
TEST_F(NatsSourceTest, AConsumerDeletedWhileTheSourceRunsIsMadeAgain) {
  std::unique_ptr<MessageSource> src;
  ASSERT_NO_FATAL_FAILURE(OpenAckOneAndDeleteTheConsumer(&src));
  RawNats raw;
  Publish("b", "2");
  auto got = FetchAll(*src, 2, Millis(8000));
  std::set<std::string> keys;
  for (auto& d : got) {
    keys.insert(d->key());
    EXPECT_TRUE(d->Ack().ok());
  }
  EXPECT_EQ(keys, (std::set<std::string>{"a", "b"}));
  jsAckPolicy policy = js_AckNone;
  std::string filter;
  ASSERT_TRUE(raw.ConsumerConfig(stream_, "c", &policy, &filter));
  EXPECT_EQ(policy, js_AckExplicit);
  EXPECT_EQ(filter, stream_ + ".in");
}

// ... but a consumer of that name made meanwhile by someone else is checked as
// at open: one with AckPolicy all is refused (each fetch says why), its
// messages never handed out. (A new consumer numbers its deliveries from 1
// again: a consumer sequence not above the last one seen gives it away.) On
// main the replacement was used:
//   Expected equality of these values: delivered Which is: 2  0u
TEST_F(NatsSourceTest, AConsumerMadeAgainBySomeoneElseIsCheckedAsAtOpen) {
  std::unique_ptr<MessageSource> src;
  ASSERT_NO_FATAL_FAILURE(OpenAckOneAndDeleteTheConsumer(&src));
  RawNats raw;
  raw.AddConsumer(stream_, "c", stream_ + ".in", js_AckAll, -1);
  Publish("b", "2");
  size_t delivered = 0;
  const Status last = FetchUntilRefused(*src, &delivered);
  EXPECT_EQ(delivered, 0u) << "a consumer with AckPolicy all was used";
  EXPECT_EQ(last.code(), StatusCode::kFailedPrecondition) << last.ToString();
  EXPECT_NE(last.message().find("AckPolicy"), std::string::npos) << last.ToString();
}

// The same replacement before this source handed anything out: the last
// consumer sequence seen is 0, and the replacement's first delivery (1) is
// above it, so the check never fired and a consumer with AckPolicy all was used
// (each ack would settle messages whose outcome is not recorded). The first
// batch of a source that has handed out nothing is checked too. On main:
//   Expected equality of these values: delivered Which is: 1  0u
TEST_F(NatsSourceTest, AConsumerReplacedBeforeTheFirstDeliveryIsCheckedToo) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  RawNats raw;
  raw.DeleteConsumer(stream_, "c");
  raw.AddConsumer(stream_, "c", stream_ + ".in", js_AckAll, -1);
  Publish("a", "1");
  size_t delivered = 0;
  const Status last = FetchUntilRefused(**src, &delivered);
  EXPECT_EQ(delivered, 0u) << "a consumer with AckPolicy all was used";
  EXPECT_EQ(last.code(), StatusCode::kFailedPrecondition) << last.ToString();
}

// Publishes one message the way a client other than nats.c can: the header
// block's bytes as given (HPUB on a plain socket). nats.c has no way to write a
// NUL byte into a header: its values are C strings.
void PublishRawHeaders(const std::string& subject, const std::string& headers, const std::string& data,
                       const std::string& status_line = "NATS/1.0") {
  const std::string uri = BaseUri();  // nats://127.0.0.1:PORT
  const int port = std::stoi(uri.substr(uri.rfind(':') + 1));
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  const std::string block = status_line + "\r\n" + headers + "\r\n";
  const std::string out = "CONNECT {\"verbose\":false,\"headers\":true,\"protocol\":1}\r\nHPUB " +
                          subject + " " + std::to_string(block.size()) + " " +
                          std::to_string(block.size() + data.size()) + "\r\n" + block + data +
                          "\r\nPING\r\n";
  ASSERT_EQ(write(fd, out.data(), out.size()), static_cast<ssize_t>(out.size()));
  std::string in;
  char buf[4096];
  while (in.find("PONG") == std::string::npos && in.find("-ERR") == std::string::npos) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  ASSERT_NE(in.find("PONG"), std::string::npos) << in;
}

// A NUL byte in the header the key is read from: nats.c cut the value there, so
// that "k\0one" and "k\0two" were one key, "k", and the second message was
// skipped as a DUPLICATE of the first. Now such a key is refused (the message
// is dead-lettered with that reason). On main:
//   Expected equality of these values: got[0]->key() Which is: "k"  ""
TEST_F(NatsSourceTest, AKeyHeaderWithANulByteIsRefusedNotCut) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s&key=header:Idem"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  PublishRawHeaders(stream_ + ".in", "Idem: k\0one\r\n"s, "1");
  PublishRawHeaders(stream_ + ".in", "Idem: k-plain\r\n", "2");
  // Trailing white space is not part of a value; a NUL at a value's end is.
  PublishRawHeaders(stream_ + ".in", "Idem:  k-spaced \t \r\n", "3");
  PublishRawHeaders(stream_ + ".in", "Idem: k-end\0  \r\n"s, "4");
  // A NUL in a header's name: nats.c reads no header at all.
  PublishRawHeaders(stream_ + ".in", "Id\0em: k-x\r\n"s, "5");
  auto got = FetchAll(**src, 5, Millis(5000));
  ASSERT_EQ(got.size(), 5u);
  EXPECT_EQ(got[0]->key(), "");
  EXPECT_NE(got[0]->key_error().find("NUL"), std::string::npos) << got[0]->key_error();
  EXPECT_NE(got[0]->key_error().find("Idem"), std::string::npos) << got[0]->key_error();
  EXPECT_EQ(got[1]->key(), "k-plain");
  EXPECT_EQ(got[2]->key(), "k-spaced");
  EXPECT_EQ(got[3]->key(), "");
  EXPECT_NE(got[3]->key_error().find("k-end\\x00"), std::string::npos) << got[3]->key_error();
  EXPECT_EQ(got[4]->key(), "");
  EXPECT_NE(got[4]->key_error().find("cannot be read"), std::string::npos) << got[4]->key_error();
  for (auto& d : got) EXPECT_TRUE(d->Ack().ok());
}

// A key header given twice: the first value was the key, so "K: a / K: b" ran as
// a and "K: b / K: a" as b, two keys for one message. Now it has no key (dead-
// lettered with the reason), as a Redis entry whose key field is given twice.
TEST_F(NatsSourceTest, AKeyHeaderGivenTwiceGivesNoKey) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s&key=header:Idem"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  PublishRawHeaders(stream_ + ".in", "Idem: a\r\nIdem: b\r\n", "1");
  PublishRawHeaders(stream_ + ".in", "Idem: once\r\nOther: x\r\n", "2");
  auto got = FetchAll(**src, 2, Millis(5000));
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0]->key(), "");
  EXPECT_NE(got[0]->key_error().find("2 Idem headers"), std::string::npos) << got[0]->key_error();
  EXPECT_EQ(got[1]->key(), "once");
  for (auto& d : got) EXPECT_TRUE(d->Ack().ok());
}

// A dead letter's copied headers: a value with a NUL byte reached the dead
// stream cut at it, without a word. Now it is carried escaped (\x00, a
// backslash as \\) and named in Dedup-Escaped-Headers. On main:
//   Expected equality of these values: h Which is: "a"  "a\\x00b"
TEST_F(NatsSourceTest, ADeadLetterCopiesAHeaderWithANulByteEscapedNotCut) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  PublishRawHeaders(stream_ + ".in",
                    "Nats-Msg-Id: nul-1\r\nH: a\0b\r\nPlain: p\\q\r\n"s, "x");
  auto got = FetchAll(**src, 1, Millis(5000));
  ASSERT_EQ(got.size(), 1u);
  ASSERT_EQ(got[0]->key(), "nul-1");
  Status dl = got[0]->DeadLetter("failed:\nline two");
  ASSERT_TRUE(dl.ok()) << dl.ToString();
  auto d = DeadLetters(1);
  ASSERT_EQ(d.size(), 1u);
  std::string h, plain, escaped, reason;
  for (const auto& [k, v] : d[0]->attributes()) {
    if (k == "H") h = v;
    if (k == "Plain") plain = v;
    if (k == "Dedup-Escaped-Headers") escaped = v;
    if (k == "Dedup-Reason") reason = v;
  }
  EXPECT_EQ(h, "a\\x00b");
  EXPECT_EQ(plain, "p\\q");  // not escaped: it has no NUL
  // A reason with a line break (nats.c would send it as a space) too.
  EXPECT_EQ(reason, "failed:\\x0aline two");
  EXPECT_EQ(escaped, "H,Dedup-Reason");
  ASSERT_TRUE(d[0]->Ack().ok());
}

// One trailing white-space byte after a value (a space, a tab): nats.c writes its
// end-of-value NUL over it, and the whole-value read took the NUL for part of the
// value ("k-one\0"), so an ordinary key was refused as holding a NUL byte and
// the message dead-lettered. Two or more trailing bytes, or none, read right.
// On main:
//   Expected equality of these values: got[0]->key() Which is: ""  "k-one"
TEST_F(NatsSourceTest, AKeyWithOneTrailingSpaceOrTabIsReadTrimmed) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s&key=header:Idem"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  PublishRawHeaders(stream_ + ".in", "Idem: k-one \r\n", "1");
  PublishRawHeaders(stream_ + ".in", "Idem: k-tab\t\r\nOther: o \r\n", "2");
  PublishRawHeaders(stream_ + ".in", "A: a \r\nIdem: k-last \r\n", "");  // no data: nats.c lifts early
  auto got = FetchAll(**src, 3, Millis(5000));
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[0]->key(), "k-one") << got[0]->key_error();
  EXPECT_EQ(got[1]->key(), "k-tab") << got[1]->key_error();
  EXPECT_EQ(got[2]->key(), "k-last") << got[2]->key_error();
  for (const auto& [k, v] : got[1]->attributes()) {
    if (k == "Other") EXPECT_EQ(v, "o");
  }
  for (const auto& [k, v] : got[2]->attributes()) {
    if (k == "A") EXPECT_EQ(v, "a");
  }
  for (auto& d : got) EXPECT_TRUE(d->Ack().ok());
}

// A NUL byte followed, inside the same value, by a bare LF (NATS ends a header
// line at CR LF only): the whole-value read stopped at that LF, so "k\0\nx" and
// "k\0\ny" were both read as the key "k" — one key for two messages, the second
// skipped as a DUPLICATE, the very cut the NUL check exists to refuse. Such a
// key must be refused, never cut. On main:
//   Expected equality of these values: got[0]->key() Which is: "k"  ""
TEST_F(NatsSourceTest, AKeyWithANulThenABareLineFeedIsRefusedNotCut) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s&key=header:Idem"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  PublishRawHeaders(stream_ + ".in", "Idem: k\0\nx\r\n"s, "1");
  PublishRawHeaders(stream_ + ".in", "Idem: k\0\ny\r\nB: b\r\n"s, "2");
  auto got = FetchAll(**src, 2, Millis(5000));
  ASSERT_EQ(got.size(), 2u);
  for (auto& d : got) {
    EXPECT_EQ(d->key(), "");
    EXPECT_FALSE(d->key_error().empty());
    EXPECT_TRUE(d->Ack().ok());
  }
}

// Every shape of header block nats.c accepts is read whole or refused, never
// read wrong: repeated headers, tabs and spaces around values, a NUL inside or
// at the end of a value, a message without data (nats.c lifts it inside the
// fetch), a block without its empty last line, a status line; a folded line
// (which nats.c joins into a copy, cut at a NUL) is refused.
TEST_F(NatsSourceTest, HeaderValuesOfEveryShapeAreReadWholeOrRefused) {
  auto src = OpenNatsSource(Uri("&ack_wait=1s&key=header:Idem"));
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  const std::string shapes = "A: 1\r\nA: 2 \r\nB:\t x\t\t\r\nC: c\0d\r\nD: d\0 \r\nE: e\0\r\n"s;
  PublishRawHeaders(stream_ + ".in", shapes + "Idem: s1\r\n", "x");
  PublishRawHeaders(stream_ + ".in", shapes + "Idem: s2\r\n", "");
  PublishRawHeaders(stream_ + ".in", "Idem: s3 ", "x");  // no empty line ends the block
  PublishRawHeaders(stream_ + ".in", "Idem: s4\r\nF: f\r\n  g\r\n", "x");
  PublishRawHeaders(stream_ + ".in", "Idem: s5\t\r\n", "x", "NATS/1.0 100 Whatever");
  auto got = FetchAll(**src, 5, Millis(5000));
  ASSERT_EQ(got.size(), 5u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(got[i]->key(), "s" + std::to_string(i + 1)) << got[i]->key_error();
    std::multimap<std::string, std::string> h;
    for (const auto& [k, v] : got[i]->attributes()) h.emplace(k, v);
    auto a = h.equal_range("A");
    std::vector<std::string> as;
    for (auto it = a.first; it != a.second; ++it) as.push_back(it->second);
    EXPECT_EQ(as, (std::vector<std::string>{"1", "2"}));
    EXPECT_EQ(h.find("B")->second, "x");
    EXPECT_EQ(h.find("C")->second, "c\0d"s);
    EXPECT_EQ(h.find("D")->second, "d\0"s);
    EXPECT_EQ(h.find("E")->second, "e\0"s);
  }
  EXPECT_EQ(got[2]->key(), "s3") << got[2]->key_error();
  EXPECT_EQ(got[3]->key(), "");
  EXPECT_NE(got[3]->key_error().find("folded"), std::string::npos) << got[3]->key_error();
  EXPECT_EQ(got[4]->key(), "s5") << got[4]->key_error();
  for (auto& d : got) EXPECT_TRUE(d->Ack().ok());
}

TEST(NatsUnreachableTest, OpenSaysUnavailableWithoutThePassword) {
  auto src = OpenNatsSource("nats://u:topsecret@127.0.0.1:1?stream=S&consumer=c&timeout=500ms");
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kUnavailable) << src.status().ToString();
  EXPECT_EQ(src.status().ToString().find("topsecret"), std::string::npos);
}

}  // namespace
}  // namespace dedup::nats
