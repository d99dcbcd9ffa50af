// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "sim/redis_textbook_keys.h"

#include <hiredis/hiredis.h>

#include <algorithm>
#include <string>

namespace dedup::streams {

StatusOr<ReplyPtr> RedisTextbookKeys::Run(const std::vector<std::string>& args) {
  std::unique_ptr<StreamConn> c;
  {
    std::lock_guard lock(mu_);
    if (!pool_.empty()) {
      c = std::move(pool_.back());
      pool_.pop_back();
    }
  }
  if (c == nullptr) c = std::make_unique<StreamConn>(conn_);
  auto r = c->Run(args);
  if (r.ok() && IsError(r->get())) {
    r = Status::Unavailable("redis " + c->Name() + ": " + args[0] + ": " + ReplyText(r->get()));
  }
  std::lock_guard lock(mu_);
  pool_.push_back(std::move(c));
  return r;
}

StatusOr<bool> RedisTextbookKeys::SetNx(const std::string& key, Millis ttl,
                                        bool* expired_before) {
  *expired_before = false;
  const long long ttl_s = std::max<long long>(1, (ttl.count() + 999) / 1000);
  auto r = Run({"SET", key, "processing", "NX", "EX", std::to_string(ttl_s)});
  if (!r.ok()) return r.status();
  return r->get()->type != REDIS_REPLY_NIL;
}

Status RedisTextbookKeys::Del(const std::string& key) {
  auto r = Run({"DEL", key});
  return r.ok() ? Status::Ok() : r.status();
}

}  // namespace dedup::streams
