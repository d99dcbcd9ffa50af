// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Where the password of a store or broker URI comes from, so that it need not be
// on the command line (where `ps` shows it to every user of the machine):
//   1. the URI:            scheme://USER:PASS@host (redis:// also :PASS@host, and
//                          PASS@host: a lone user-info is the password, as
//                          redis-cli reads it);
//   2. a file:             scheme://host?password_file=/run/secrets/pw (the whole
//                          file, at most 64 KiB, one trailing newline dropped; USER may still be
//                          given in the URI: scheme://USER@host?password_file=...);
//   3. the environment:    DEDUP_REDIS_PASSWORD, for redis:// and redis+cluster://
//                          only, when neither of the above gives one; a lone
//                          user-info is then the ACL user (redis://alice@host),
//                          as with password_file=.
// Used by redis://, redis+cluster://, amqp:// and nats://. Giving both 1 and 2 is
// an error. nats:// also takes a token (nats://TOKEN@host, or token_file=, read
// by ReadSecretFile as password_file= is: brokers/nats/nats_source.h). Messages
// name the URI's scheme ("amqp URI: password_file= is empty"); no message ever
// contains the password (or token).

#ifndef DEDUP_SRC_CORE_SECRET_H_
#define DEDUP_SRC_CORE_SECRET_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "core/uri.h"
#include "dedup/status.h"

namespace dedup::internal {

inline constexpr const char* kRedisPasswordEnv = "DEDUP_REDIS_PASSWORD";
// The environment variables above that hold a secret. A handler process
// (consumer/handler_process.h: `dedup worker --exec`, `dedup exec`) does not
// inherit them: it is the user's command, not the worker, and is given its own
// credentials if it needs any (docs/EXEC.md). libpq's PGPASSWORD is not dedup's
// and is inherited: a handler using psql may rely on it.
inline constexpr const char* kSecretEnvVars[] = {kRedisPasswordEnv};
inline constexpr const char* kPasswordFileParam = "password_file";
// A password file larger than this is refused (not read whole: /dev/zero).
inline constexpr size_t kMaxPasswordFileBytes = 64 * 1024;

struct UriCredentials {
  std::string user;  // empty: none given
  std::string password;
  bool has_password = false;
};
using RedisCredentials = UriCredentials;

// A scheme's own reading of rules 1 and 3 above.
struct CredentialRules {
  // The environment variable read when the URI gives no password; nullptr: none.
  const char* env = nullptr;
  // "scheme://secret@host" is the password (redis-cli's reading), not the user.
  bool lone_user_is_password = false;
};

// The secret in `file`, named by URI parameter `param` ("password_file",
// "token_file") or by a flag ("--auth-token-file", dedup serve): the whole file,
// at most kMaxPasswordFileBytes, one trailing newline (LF or CR LF) dropped.
// InvalidArgument "<what>: ..." naming the file (missing, a directory, empty,
// too large), never what it holds. One rule for every secret file dedup reads.
StatusOr<std::string> ReadSecretFile(const std::string& what, std::string_view param,
                                     const std::string& file);

// The credentials of `uri` by the rules above.
StatusOr<UriCredentials> ResolveUriCredentials(const Uri& uri, const CredentialRules& rules);

// The credentials of a redis:// or redis+cluster:// URI: DEDUP_REDIS_PASSWORD,
// and a lone user-info is the password.
StatusOr<RedisCredentials> ResolveRedisCredentials(const Uri& uri);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_SECRET_H_
