// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The one grammar of key= (src/brokers/key_spec.h): what each broker accepts,
// that every bad value is refused with an error naming it, and that the three
// sources' URI parsers read key= through it.

#include "brokers/key_spec.h"

#include <gtest/gtest.h>

#include <string>

#include "dedup/worker.h"
#ifdef DEDUP_WITH_RABBITMQ
#include "brokers/rabbitmq/rabbitmq_source.h"
#endif
#ifdef DEDUP_WITH_NATS
#include "brokers/nats/nats_source.h"
#endif

namespace dedup::brokers {
namespace {

const KeyGrammar kAmqp{.broker = "amqp", .properties = {"message_id"}, .headers = true};
const KeyGrammar kNats{.broker = "nats", .properties = {"msgid"}, .headers = true};
const KeyGrammar kStreams{.broker = "redis streams", .properties = {}, .fields = true,
                           .bare_word_is_field = true};

KeySpec Parse(std::string_view text, const KeyGrammar& g) {
  auto s = ParseKeySpec(text, g);
  EXPECT_TRUE(s.ok()) << text << ": " << s.status();
  return s.ok() ? *s : KeySpec{};
}

TEST(KeySpec, EveryFormOfEveryBroker) {
  EXPECT_EQ(Parse("message_id", kAmqp), (KeySpec{KeyKind::kProperty, "message_id"}));
  EXPECT_EQ(Parse("header:idem", kAmqp), (KeySpec{KeyKind::kHeader, "idem"}));
  EXPECT_EQ(Parse("sha256", kAmqp), (KeySpec{KeyKind::kContentSha256, ""}));
  EXPECT_EQ(Parse("msgid", kNats), (KeySpec{KeyKind::kProperty, "msgid"}));
  EXPECT_EQ(Parse("header:Dedup-Key", kNats), (KeySpec{KeyKind::kHeader, "Dedup-Key"}));
  EXPECT_EQ(Parse("sha256", kNats), (KeySpec{KeyKind::kContentSha256, ""}));
  EXPECT_EQ(Parse("id", kStreams), (KeySpec{KeyKind::kField, "id"}));
  EXPECT_EQ(Parse("field:order id", kStreams), (KeySpec{KeyKind::kField, "order id"}));
  EXPECT_EQ(Parse("field:sha256", kStreams), (KeySpec{KeyKind::kField, "sha256"}))
      << "a field called sha256 stays reachable";
  EXPECT_EQ(Parse("sha256", kStreams), (KeySpec{KeyKind::kContentSha256, ""}));
  // A header name is taken as written, colons and all.
  EXPECT_EQ(Parse("header:a:b", kAmqp), (KeySpec{KeyKind::kHeader, "a:b"}));
}

TEST(KeySpec, ToStringParsesBack) {
  for (const auto& [text, g] : std::vector<std::pair<std::string, KeyGrammar>>{
           {"message_id", kAmqp}, {"header:idem", kAmqp}, {"sha256", kNats},
           {"msgid", kNats}, {"field:id", kStreams}, {"sha256", kStreams}}) {
    const KeySpec s = Parse(text, g);
    EXPECT_EQ(s.ToString(), text);
    EXPECT_EQ(Parse(s.ToString(), g), s);
  }
}

TEST(KeySpec, BadValuesAreRefusedByName) {
  struct Case {
    std::string text;
    const KeyGrammar* g;
    std::string why;  // in the error besides the value itself
  };
  const std::string long_name(256, 'h');
  for (const Case& c : std::vector<Case>{
           {"", &kAmqp, "empty"},
           {"nope", &kAmqp, "not a form"},
           {"msgid", &kAmqp, "not a form"},       // NATS's word, not AMQP's
           {"message_id", &kNats, "not a form"},  // and the other way round
           {"SHA256", &kNats, "not a form"},
           {"header:", &kAmqp, "header name is empty"},
           {"header:" + long_name, &kNats, "longer than 255"},
           {"header:a\nb", &kNats, "control character"},
           {"field:id", &kAmqp, "have no fields"},
           {"header:id", &kStreams, "have no headers"},
           {"field:", &kStreams, "field name is empty"},
           {"a\tb", &kStreams, "control character"},
       }) {
    auto s = ParseKeySpec(c.text, *c.g);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    const std::string m = s.status().message();
    EXPECT_NE(m.find(c.g->broker + " key="), std::string::npos) << m;
    EXPECT_NE(m.find(c.why), std::string::npos) << m;
    EXPECT_NE(m.find("key= must be"), std::string::npos) << m << ": names the accepted forms";
    if (c.text.find_first_of("\n\t") == std::string::npos && c.text.size() < 100) {
      EXPECT_NE(m.find("'" + c.text + "'"), std::string::npos) << m << ": names the value";
    }
    EXPECT_EQ(m.find('\n'), std::string::npos) << "a control character is escaped: " << m;
  }
}

TEST(KeySpec, TheErrorListsThisBrokersForms) {
  auto a = ParseKeySpec("x", kAmqp);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("message_id, header:NAME or sha256"), std::string::npos)
      << a.status();
  auto s = ParseKeySpec("header:x", kStreams);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("field:NAME, NAME (a field) or sha256"), std::string::npos)
      << s.status();
}

// The sources read key= through the grammar.
#ifdef DEDUP_WITH_REDIS_STREAMS
TEST(KeySpec, RedisStreamsUriKeepsItsBareFieldAndGainsFieldColon) {
  auto o = WorkerOptionsFromUri("redis://127.0.0.1:6379?stream=s&key=order");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->key_field, "order");
  EXPECT_FALSE(o->key_from_content);
  o = WorkerOptionsFromUri("redis://127.0.0.1:6379?stream=s&key=field:sha256");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->key_field, "sha256");
  EXPECT_FALSE(o->key_from_content);
  o = WorkerOptionsFromUri("redis://127.0.0.1:6379?stream=s&key=sha256");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_TRUE(o->key_from_content);
  o = WorkerOptionsFromUri("redis://127.0.0.1:6379?stream=s&key=header:x");
  ASSERT_FALSE(o.ok());
  EXPECT_NE(o.status().message().find("redis streams key='header:x'"), std::string::npos)
      << o.status();
}
#endif

// The key a source's parsed options carry; the error of a refused URI.
template <typename Options>
KeySpec KeyOf(const StatusOr<Options>& o) {
  EXPECT_TRUE(o.ok()) << o.status();
  return o.ok() ? o->key : KeySpec{KeyKind::kProperty, "(refused)"};
}
template <typename Options>
std::string ErrorOf(const StatusOr<Options>& o) {
  return o.ok() ? "(accepted)" : o.status().message();
}

// prefix= leaves room for a key on every broker: a prefix of 1024 bytes (961
// before key=sha256's 64 hex digits) made every key longer than a store takes,
// and the whole queue was dead-lettered. Refused when the URI is read.
TEST(KeySpec, APrefixThatLeavesNoRoomForAKeyIsRefused) {
  EXPECT_TRUE(CheckKeyPrefix(std::string(1023, 'p'), false, "x").ok());
  EXPECT_FALSE(CheckKeyPrefix(std::string(1024, 'p'), false, "x").ok());
  EXPECT_TRUE(CheckKeyPrefix(std::string(960, 'p'), true, "x").ok());
  EXPECT_FALSE(CheckKeyPrefix(std::string(961, 'p'), true, "x").ok());
  const std::string p1024 = "&prefix=" + std::string(1024, 'p');
  auto w = WorkerOptionsFromUri("redis://127.0.0.1:1?stream=s&group=g" + p1024);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.status().message().find("prefix= is 1024 bytes"), std::string::npos) << w.status();
  EXPECT_EQ(w.status().message().find("pppp"), std::string::npos) << "the prefix is not echoed";
#ifdef DEDUP_WITH_RABBITMQ
  auto a = rabbitmq::ParseRabbitMqUri("amqp://h?queue=q" + p1024);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.status().message().find("prefix= is 1024 bytes"), std::string::npos) << a.status();
  rabbitmq::RabbitMqOptions built = *rabbitmq::ParseRabbitMqUri("amqp://h?queue=q");
  built.key_prefix = std::string(1024, 'p');
  auto src = rabbitmq::OpenRabbitMqSource(built);
  ASSERT_FALSE(src.ok());
  EXPECT_EQ(src.status().code(), StatusCode::kInvalidArgument) << src.status();
#endif
}

#ifdef DEDUP_WITH_RABBITMQ
TEST(KeySpec, AmqpUri) {
  auto parse = [](const std::string& key) {
    return rabbitmq::ParseRabbitMqUri("amqp://h?queue=q" + key);
  };
  EXPECT_EQ(KeyOf(parse("")), (KeySpec{KeyKind::kProperty, "message_id"})) << "the default";
  EXPECT_EQ(KeyOf(parse("&key=header:idem")), (KeySpec{KeyKind::kHeader, "idem"}));
  EXPECT_EQ(KeyOf(parse("&key=sha256")), (KeySpec{KeyKind::kContentSha256, ""}));
  EXPECT_NE(ErrorOf(parse("&key=header:")).find("amqp key='header:'"), std::string::npos);
}
#endif

#ifdef DEDUP_WITH_NATS
TEST(KeySpec, NatsUri) {
  auto parse = [](const std::string& key) {
    return nats::ParseNatsUri("nats://h?stream=S&consumer=c" + key);
  };
  EXPECT_EQ(KeyOf(parse("")), (KeySpec{KeyKind::kProperty, "msgid"})) << "the default";
  EXPECT_EQ(KeyOf(parse("&key=msgid")), (KeySpec{KeyKind::kProperty, "msgid"}));
  EXPECT_EQ(KeyOf(parse("&key=header:Dedup-Key")), (KeySpec{KeyKind::kHeader, "Dedup-Key"}));
  EXPECT_NE(ErrorOf(parse("&key=field:x")).find("nats messages have no fields"), std::string::npos);
}
#endif

}  // namespace
}  // namespace dedup::brokers
