// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/secret.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>

namespace dedup::internal {

StatusOr<std::string> ReadSecretFile(const std::string& what, std::string_view param,
                                     const std::string& file) {
  const std::string p(param);
  // "password_file" names a "password file", "token_file" and "--auth-token-file"
  // a "token file": the last word before "file".
  std::string noun = p;
  if (noun.ends_with("_file") || noun.ends_with("-file")) noun.resize(noun.size() - 5);
  if (size_t cut = noun.find_last_of("-_"); cut != std::string::npos) noun.erase(0, cut + 1);
  // A URI parameter is named as written in the URI (password_file=), a flag as a flag.
  const bool flag = p.starts_with("--");
  if (file.empty()) {
    return Status::InvalidArgument(what + ": " + (flag ? "no file named (the value is empty)"
                                                       : p + "= is empty"));
  }
  // "password_file '/x'"; a flag is already named by `what`: "'/x'".
  const std::string named = (flag ? "" : p + " ") + "'" + file + "'";
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return Status::InvalidArgument(what + ": cannot read " + named + ": " +
                                   std::strerror(errno));
  }
  // A directory opens, and reads as nothing; /dev/zero or a huge file would be
  // read without end. Neither is a secret file: named for what it is.
  std::error_code ec;
  if (std::filesystem::is_directory(file, ec)) {
    return Status::InvalidArgument(what + ": " + named + " is a directory");
  }
  std::string secret;
  secret.resize(kMaxPasswordFileBytes + 1);
  in.read(secret.data(), static_cast<std::streamsize>(secret.size()));
  secret.resize(static_cast<size_t>(in.gcount()));
  if (secret.size() > kMaxPasswordFileBytes) {
    secret.clear();
    return Status::InvalidArgument(what + ": " + named + " is larger than " +
                                   std::to_string(kMaxPasswordFileBytes / 1024) +
                                   " KiB: not a " + noun + " file");
  }
  if (!secret.empty() && secret.back() == '\n') secret.pop_back();
  if (!secret.empty() && secret.back() == '\r') secret.pop_back();
  // An empty file (a secret not mounted yet, a truncated one) is refused: read as
  // "no secret" it would turn a password or token check off.
  if (secret.empty()) {
    return Status::InvalidArgument(what + ": " + named + " is empty: it holds no " + noun);
  }
  return secret;
}

namespace {
StatusOr<UriCredentials> ResolveUriCredentialsOf(const Uri& uri, const CredentialRules& rules);
}  // namespace

// A NUL in a user or password (%00 in the URI, or in a file) is refused: the
// client libraries take them as C strings and sent only what came before it
// (amqp://guest:guest%00anything@... logged in as guest:guest). Not echoed.
StatusOr<UriCredentials> ResolveUriCredentials(const Uri& uri, const CredentialRules& rules) {
  auto c = ResolveUriCredentialsOf(uri, rules);
  if (c.ok() && (c->user.find('\0') != std::string::npos ||
                 c->password.find('\0') != std::string::npos)) {
    return Status::InvalidArgument(uri.scheme + " URI: the user or password holds a NUL byte "
                                   "(from %00?); client libraries would cut it there");
  }
  return c;
}

namespace {
StatusOr<UriCredentials> ResolveUriCredentialsOf(const Uri& uri, const CredentialRules& rules) {
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
    auto pw = ReadSecretFile(what, kPasswordFileParam, *file);
    if (!pw.ok()) return pw.status();
    c.password = std::move(pw).value();
    c.has_password = true;
    return c;
  }
  // The environment's password, when the rules name a variable and it is set.
  const char* env = rules.env != nullptr ? std::getenv(rules.env) : nullptr;
  const bool from_env = env != nullptr && *env != '\0';
  // A lone user-info is the user name, unless the rules read it as the password
  // ("redis://secret@host", as redis-cli does) and the environment gives none:
  // with DEDUP_REDIS_PASSWORD set, "redis://alice@host" is the ACL user alice,
  // as with password_file= (read as the password, the environment was ignored
  // and AUTH failed for the default user).
  if (!uri.user.empty() && rules.lone_user_is_password && !from_env) {
    c.password = uri.user;
    c.has_password = true;
    return c;
  }
  c.user = uri.user;
  if (from_env) {
    c.password = env;
    c.has_password = true;
  }
  return c;
}
}  // namespace

StatusOr<RedisCredentials> ResolveRedisCredentials(const Uri& uri) {
  return ResolveUriCredentials(uri, {.env = kRedisPasswordEnv, .lone_user_is_password = true});
}

}  // namespace dedup::internal
