// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/secret.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

namespace dedup::internal {

StatusOr<UriCredentials> ResolveUriCredentials(const Uri& uri, const CredentialRules& rules) {
  // The scheme passed ParseUri: letters, digits, '+', '-', '.' only.
  const std::string what = uri.scheme + " URI";
  UriCredentials c;
  const std::optional<std::string> file = uri.Param(kPasswordFileParam);
  if (uri.has_password) {
    if (file) {
      return Status::InvalidArgument(
          what + " gives a password both inline and in password_file=; give one");
    }
    c.user = uri.user;
    c.password = uri.password;
    c.has_password = true;
    return c;
  }
  if (file) {
    // With a file, a lone user-info is the user name.
    c.user = uri.user;
    if (file->empty()) return Status::InvalidArgument(what + ": password_file= is empty");
    std::ifstream in(*file, std::ios::binary);
    if (!in) {
      return Status::InvalidArgument(what + ": cannot read password_file '" + *file +
                                     "': " + std::strerror(errno));
    }
    // A directory opens, and reads as nothing; /dev/zero or a huge file would be
    // read without end. Neither is a password file: named for what it is.
    std::error_code ec;
    if (std::filesystem::is_directory(*file, ec)) {
      return Status::InvalidArgument(what + ": password_file '" + *file + "' is a directory");
    }
    c.password.resize(kMaxPasswordFileBytes + 1);
    in.read(c.password.data(), static_cast<std::streamsize>(c.password.size()));
    c.password.resize(static_cast<size_t>(in.gcount()));
    if (c.password.size() > kMaxPasswordFileBytes) {
      c.password.clear();
      return Status::InvalidArgument(what + ": password_file '" + *file + "' is larger than " +
                                     std::to_string(kMaxPasswordFileBytes / 1024) +
                                     " KiB: not a password file");
    }
    if (!c.password.empty() && c.password.back() == '\n') c.password.pop_back();
    if (!c.password.empty() && c.password.back() == '\r') c.password.pop_back();
    if (c.password.empty()) {
      return Status::InvalidArgument(what + ": password_file '" + *file + "' is empty");
    }
    c.has_password = true;
    return c;
  }
  if (!uri.user.empty()) {
    if (!rules.lone_user_is_password) {
      c.user = uri.user;
    } else {
      // "redis://secret@host": the part before '@' is a password, as redis-cli reads it.
      c.password = uri.user;
      c.has_password = true;
      return c;
    }
  }
  if (rules.env != nullptr) {
    if (const char* env = std::getenv(rules.env); env != nullptr && *env != '\0') {
      c.password = env;
      c.has_password = true;
    }
  }
  return c;
}

StatusOr<RedisCredentials> ResolveRedisCredentials(const Uri& uri) {
  return ResolveUriCredentials(uri, {.env = kRedisPasswordEnv, .lone_user_is_password = true});
}

}  // namespace dedup::internal
