// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Lua scripts sent by SHA-1 (EVALSHA), with their bodies at hand for the server
// that lost its script cache (restart, failover, SCRIPT FLUSH): Client answers
// NOSCRIPT with EVAL of the body, which also caches it again.

#ifndef DEDUP_SRC_REDIS_SCRIPTS_H_
#define DEDUP_SRC_REDIS_SCRIPTS_H_

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace dedup::redis {

struct Script {
  std::string name;
  std::string body;
  std::string sha;  // lower-case hex SHA-1 of body, as SCRIPT LOAD answers
};

class ScriptSet {
 public:
  // (name, body) pairs; the SHA-1 of each body is computed here.
  explicit ScriptSet(std::initializer_list<std::pair<std::string_view, std::string_view>> scripts);
  ScriptSet(const std::vector<std::pair<std::string_view, std::string_view>>& scripts);

  // The script called `name`; nullptr if there is none.
  const Script* Find(std::string_view name) const;
  // The script whose SHA-1 is `sha`; nullptr if there is none.
  const Script* FindBySha(std::string_view sha) const;
  const std::vector<Script>& all() const { return scripts_; }

 private:
  std::vector<Script> scripts_;
};

std::string Sha1Hex(std::string_view data);

}  // namespace dedup::redis

#endif  // DEDUP_SRC_REDIS_SCRIPTS_H_
