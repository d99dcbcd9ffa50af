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
  const redis::Command cmd{args};
  const redis::Command* one[] = {&cmd};
  auto replies = Pipeline(one, extra_timeout);
  if (!replies.ok()) return replies.status();
  return std::move((*replies)[0]);
}

StatusOr<std::vector<ReplyPtr>> StreamConn::RunAll(
    const std::vector<std::vector<std::string>>& commands) {
  if (commands.empty()) return std::vector<ReplyPtr>{};
  std::vector<redis::Command> cmds;
  cmds.reserve(commands.size());
  for (const auto& args : commands) cmds.push_back(redis::Command{args});
  std::vector<const redis::Command*> ptrs;
  ptrs.reserve(cmds.size());
  for (const auto& c : cmds) ptrs.push_back(&c);
  return Pipeline(ptrs, Millis(0));
}

StatusOr<std::vector<ReplyPtr>> StreamConn::Pipeline(std::span<const redis::Command* const> cmds,
                                                     Millis extra_timeout) {
  const std::string op = cmds.front()->args.empty() ? std::string() : cmds.front()->args[0];
  if (conn_ == nullptr) {
    auto c = redis::Connection::Open(options_.endpoints.front(), options_);
    if (!c.ok()) return Status(c.status().code(), "redis " + Name() + ": " + c.status().message());
    conn_ = std::move(c).value();
  }
  std::vector<redis::Reply> replies;
  Status s = conn_->Pipeline(cmds, &replies, op, nullptr, extra_timeout);
  if (!s.ok()) {
    conn_.reset();
    return Status(s.code(), "redis " + Name() + ": " + s.message());
  }
  // A replica now (redis::AnyReadOnly): the next command connects again. The
  // replies go to the caller, which reads the READONLY as Unavailable.
  if (redis::AnyReadOnly(replies.data(), replies.size())) conn_.reset();
  return replies;
}

}  // namespace dedup::streams
