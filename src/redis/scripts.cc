// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "redis/scripts.h"

#include <openssl/evp.h>

namespace dedup::redis {

std::string Sha1Hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(data.data(), data.size(), md, &n, EVP_sha1(), nullptr);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (unsigned int i = 0; i < n; ++i) {
    out.push_back(kHex[md[i] >> 4]);
    out.push_back(kHex[md[i] & 15]);
  }
  return out;
}

ScriptSet::ScriptSet(
    std::initializer_list<std::pair<std::string_view, std::string_view>> scripts)
    : ScriptSet(std::vector<std::pair<std::string_view, std::string_view>>(scripts)) {}

ScriptSet::ScriptSet(const std::vector<std::pair<std::string_view, std::string_view>>& scripts) {
  for (const auto& [name, body] : scripts) {
    scripts_.push_back({std::string(name), std::string(body), Sha1Hex(body)});
  }
}

const Script* ScriptSet::Find(std::string_view name) const {
  for (const Script& s : scripts_) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

const Script* ScriptSet::FindBySha(std::string_view sha) const {
  for (const Script& s : scripts_) {
    if (s.sha == sha) return &s;
  }
  return nullptr;
}

}  // namespace dedup::redis
