// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Hash and equality for tables keyed by std::string and looked up by
// std::string_view without a copy. (Debian's abseil has its own string_view, so its
// default string hasher does not take std::string_view.)

#ifndef DEDUP_SRC_CORE_KEY_HASH_H_
#define DEDUP_SRC_CORE_KEY_HASH_H_

#include <cstddef>
#include <functional>
#include <string_view>

namespace dedup::internal {

struct KeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view k) const { return std::hash<std::string_view>{}(k); }
};

struct KeyEq {
  using is_transparent = void;
  bool operator()(std::string_view a, std::string_view b) const { return a == b; }
};

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_KEY_HASH_H_
