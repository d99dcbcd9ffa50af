// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "dedup/status.h"

#include <gtest/gtest.h>

#include "dedup/record.h"

namespace dedup {
namespace {

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(Status, CodeAndMessage) {
  Status s = Status::Unavailable("redis 127.0.0.1:6390: connection refused");
  EXPECT_FALSE(s.ok());
  EXPECT_TRUE(s.retryable());
  EXPECT_EQ(s.ToString(), "UNAVAILABLE: redis 127.0.0.1:6390: connection refused");
  EXPECT_FALSE(Status::InvalidArgument("x").retryable());
  EXPECT_EQ(s.WithContext("claim").message(), "claim: redis 127.0.0.1:6390: connection refused");
}

TEST(StatusOr, HoldsValueOrStatus) {
  StatusOr<int> v = 7;
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 7);
  StatusOr<int> e = Status::NotFound("nope");
  EXPECT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
}

// The value of an error was an assert only: in a release build (NDEBUG, as
// the project's own builds), `*OpenStore("bogus:")` read an empty optional.
TEST(StatusOrDeathTest, TheValueOfAnErrorAbortsNamingIt) {
  StatusOr<std::string> e = Status::NotFound("no such thing");
  EXPECT_DEATH((void)e.value(), "StatusOr that holds an error was used: NOT_FOUND: no such thing");
  EXPECT_DEATH((void)e->size(), "NOT_FOUND: no such thing");
  EXPECT_DEATH((void)std::move(e).value(), "NOT_FOUND");
}

TEST(Token, HexRoundTrip) {
  Token t = Token::Random();
  EXPECT_TRUE(t.valid());
  EXPECT_EQ(t.ToHex().size(), 16u);
  EXPECT_EQ(Token::FromHex(t.ToHex()), t);
  EXPECT_EQ(Token::FromHex("zz"), std::nullopt);
  EXPECT_EQ(Token::FromHex("0"), std::nullopt);
  EXPECT_EQ(Token::FromHex("00000000000000001"), std::nullopt);
  EXPECT_EQ(Token::FromHex("0000000000000000"), std::nullopt);
  EXPECT_EQ(Token::FromHex("ABCDEF0123456789"), std::nullopt);  // one spelling only
  EXPECT_EQ(Token::FromHex("abc"), std::nullopt);
  EXPECT_EQ(Token::FromHex("0x0123456789abcd"), std::nullopt);
  EXPECT_EQ(Token::FromHex("0123456789abcdef")->value, 0x0123456789abcdefULL);
}

TEST(Token, RandomTokensDiffer) {
  Token a = Token::Random(), b = Token::Random();
  EXPECT_NE(a, b);
}

TEST(Names, Stable) {
  EXPECT_EQ(ClaimOutcomeName(ClaimOutcome::kDuplicate), "DUPLICATE");
  EXPECT_EQ(CompletionStatusName(CompletionStatus::kExhausted), "exhausted");
  EXPECT_EQ(ParseCompletionStatus("failed"), CompletionStatus::kFailed);
  EXPECT_EQ(ParseCompletionStatus("nope"), std::nullopt);
  EXPECT_EQ(RecordStateName(RecordState::kReleased), "released");
}

}  // namespace
}  // namespace dedup
