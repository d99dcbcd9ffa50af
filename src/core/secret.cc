// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/secret.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace dedup::internal {

StatusOr<RedisCredentials> ResolveRedisCredentials(const Uri& uri) {
  RedisCredentials c;
  const std::optional<std::string> file = uri.Param(kPasswordFileParam);
  if (uri.has_password) {
    if (file) {
      return Status::InvalidArgument(
          "redis URI gives a password both inline and in password_file=; give one");
    }
    c.user = uri.user;
    c.password = uri.password;
    c.has_password = true;
    return c;
  }
  if (file) {
    // With a file, a lone user-info is the ACL user name.
    c.user = uri.user;
    if (file->empty()) return Status::InvalidArgument("redis URI: password_file= is empty");
    std::ifstream in(*file, std::ios::binary);
    if (!in) {
      return Status::InvalidArgument("redis URI: cannot read password_file '" + *file +
                                     "': " + std::strerror(errno));
    }
    std::ostringstream text;
    text << in.rdbuf();
    c.password = text.str();
    if (!c.password.empty() && c.password.back() == '\n') c.password.pop_back();
    if (!c.password.empty() && c.password.back() == '\r') c.password.pop_back();
    if (c.password.empty()) {
      return Status::InvalidArgument("redis URI: password_file '" + *file + "' is empty");
    }
    c.has_password = true;
    return c;
  }
  if (!uri.user.empty()) {
    // "redis://secret@host": the part before '@' is a password, as redis-cli reads it.
    c.password = uri.user;
    c.has_password = true;
    return c;
  }
  if (const char* env = std::getenv(kRedisPasswordEnv); env != nullptr && *env != '\0') {
    c.password = env;
    c.has_password = true;
  }
  return c;
}

}  // namespace dedup::internal
