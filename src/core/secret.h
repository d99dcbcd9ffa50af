// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Where a Redis password comes from, so that it need not be on the command line
// (where `ps` shows it to every user of the machine):
//   1. the URI:            redis://:PASS@host or redis://USER:PASS@host, or
//                          redis://PASS@host (a lone user-info is the password,
//                          as redis-cli reads it);
//   2. a file:             redis://host?password_file=/run/secrets/redis (the
//                          whole file, one trailing newline dropped; USER may
//                          still be given in the URI: redis://USER@host?password_file=...
//                          is then the ACL user);
//   3. the environment:    DEDUP_REDIS_PASSWORD, when neither of the above gives
//                          one.
// Giving both 1 and 2 is an error. No message ever contains the password.

#ifndef DEDUP_SRC_CORE_SECRET_H_
#define DEDUP_SRC_CORE_SECRET_H_

#include <string>

#include "core/uri.h"
#include "dedup/status.h"

namespace dedup::internal {

inline constexpr const char* kRedisPasswordEnv = "DEDUP_REDIS_PASSWORD";
inline constexpr const char* kPasswordFileParam = "password_file";

struct RedisCredentials {
  std::string user;
  std::string password;
  bool has_password = false;
};

// The credentials of a redis:// or redis+cluster:// URI, by the rules above.
StatusOr<RedisCredentials> ResolveRedisCredentials(const Uri& uri);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_SECRET_H_
