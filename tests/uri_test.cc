// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/uri.h"

#include <gtest/gtest.h>

#include "dedup/store.h"

namespace dedup::internal {
namespace {

TEST(Uri, Memory) {
  auto u = ParseUri("memory:");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, "memory");
  EXPECT_FALSE(u->has_authority);
  EXPECT_TRUE(u->path.empty());
}

TEST(Uri, PathAndParams) {
  auto u = ParseUri("rocksdb:/var/lib/dedup%20x?sync=interval:50&x=1");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->path, "/var/lib/dedup x");
  EXPECT_EQ(u->Param("sync"), "interval:50");
  EXPECT_EQ(u->Param("x"), "1");
  EXPECT_EQ(u->Param("y"), std::nullopt);
  Status s = u->CheckParams({"sync"});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s;
}

TEST(Uri, AuthorityWithCredentials) {
  auto u = ParseUri("redis://app:s%3Acret@127.0.0.1:6390/2?prefix=jobs:");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, "redis");
  EXPECT_EQ(u->user, "app");
  EXPECT_EQ(u->password, "s:cret");
  EXPECT_EQ(u->hosts, "127.0.0.1:6390");
  EXPECT_EQ(u->path, "/2");
  EXPECT_EQ(u->Param("prefix"), "jobs:");
  EXPECT_EQ(u->Redacted(), "redis://app:***@127.0.0.1:6390/2?prefix=jobs:");
}

TEST(Uri, ClusterHosts) {
  auto u = ParseUri("redis+cluster://127.0.0.1:7100,127.0.0.1:7101");
  ASSERT_TRUE(u.ok()) << u.status();
  EXPECT_EQ(u->scheme, "redis+cluster");
  EXPECT_EQ(u->hosts, "127.0.0.1:7100,127.0.0.1:7101");
}

TEST(Uri, Malformed) {
  EXPECT_EQ(ParseUri("").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseUri("/just/a/path").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseUri(":x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseUri("rocksdb:/x%zz").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseUri("rocksdb:/x%4").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseUri("rocksdb:/x?novalue").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseUri("ro cks:/x").status().code(), StatusCode::kInvalidArgument);
}

TEST(OpenStore, NamesWhatIsWrong) {
  auto bad_scheme = OpenStore("mongo://x");
  EXPECT_EQ(bad_scheme.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_scheme.status().message().find("mongo"), std::string::npos);
  auto bad_param = OpenStore("memory:?colour=red");
  EXPECT_EQ(bad_param.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad_param.status().message().find("colour"), std::string::npos);
  EXPECT_EQ(OpenStore("memory:/some/path").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(OpenStore("memory:?shards=0").status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(OpenStore("memory:?shards=8").ok());
  EXPECT_TRUE(OpenStore("memory:").ok());
}

}  // namespace
}  // namespace dedup::internal
