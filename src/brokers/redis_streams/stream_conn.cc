// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/redis_streams/stream_conn.h"

namespace dedup::streams {

StreamConn::StreamConn(ConnOptions o) {
  options_.endpoints = {{std::move(o.host), o.port}};
  options_.user = std::move(o.user);
  options_.password = std::move(o.password);
  options_.has_password = o.has_password;
  options_.db = o.db;
  options_.timeout = o.timeout;
}

StatusOr<ReplyPtr> StreamConn::Run(const std::vector<std::string>& args, Millis extra_timeout) {
  const std::string op = args.empty() ? std::string() : args[0];
  if (conn_ == nullptr) {
    auto c = redis::Connection::Open(options_.endpoints.front(), options_);
    if (!c.ok()) return Status(c.status().code(), "redis " + Name() + ": " + c.status().message());
    conn_ = std::move(c).value();
  }
  const redis::Command cmd{args};
  const redis::Command* one[] = {&cmd};
  std::vector<redis::Reply> replies;
  Status s = conn_->Pipeline(one, &replies, op, nullptr, extra_timeout);
  if (!s.ok()) {
    conn_.reset();
    return Status(s.code(), "redis " + Name() + ": " + s.message());
  }
  return std::move(replies[0]);
}

}  // namespace dedup::streams
