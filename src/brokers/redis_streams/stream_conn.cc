// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/redis_streams/stream_conn.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <cerrno>

namespace dedup::streams {
namespace {

timeval ToTimeval(Millis d) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

}  // namespace

void ReplyFree::operator()(redisReply* r) const {
  if (r != nullptr) freeReplyObject(r);
}

bool IsError(const redisReply* r) { return r != nullptr && r->type == REDIS_REPLY_ERROR; }

std::string ReplyText(const redisReply* r) {
  if (r == nullptr) return "";
  if (r->type == REDIS_REPLY_STRING || r->type == REDIS_REPLY_STATUS ||
      r->type == REDIS_REPLY_ERROR) {
    return std::string(r->str, r->len);
  }
  return "";
}

StreamConn::~StreamConn() { Drop(); }

void StreamConn::Drop() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
  current_timeout_ = Millis(-1);
}

Status StreamConn::Connect() {
  ctx_ = redisConnectWithTimeout(o_.host.c_str(), o_.port, ToTimeval(o_.timeout));
  if (ctx_ == nullptr || ctx_->err != 0) {
    std::string why = ctx_ != nullptr ? ctx_->errstr : "out of memory";
    Drop();
    return Status::Unavailable("redis " + Name() + ": connect: " + why);
  }
  if (o_.has_password) {
    auto r = static_cast<redisReply*>(redisCommand(ctx_, "AUTH %b", o_.password.data(),
                                                   o_.password.size()));
    ReplyPtr reply(r);
    if (r == nullptr) {
      Drop();
      return Status::Unavailable("redis " + Name() + ": AUTH: connection lost");
    }
    if (IsError(r)) {
      std::string why = ReplyText(r);
      Drop();
      return Status::Unauthenticated("redis " + Name() + ": AUTH: " + why);
    }
  }
  return Status::Ok();
}

StatusOr<ReplyPtr> StreamConn::Run(const std::vector<std::string>& args, Millis extra_timeout) {
  if (ctx_ == nullptr) DEDUP_RETURN_IF_ERROR(Connect());
  const Millis t = o_.timeout + extra_timeout;
  if (t != current_timeout_) {
    redisSetTimeout(ctx_, ToTimeval(t));
    current_timeout_ = t;
  }
  std::vector<const char*> argv;
  std::vector<size_t> argl;
  argv.reserve(args.size());
  argl.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    argl.push_back(a.size());
  }
  auto* r = static_cast<redisReply*>(
      redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), argl.data()));
  if (r == nullptr) {
    const bool timed_out = ctx_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == ETIMEDOUT);
    std::string why = ctx_->errstr;
    Drop();
    std::string msg = "redis " + Name() + ": " + (args.empty() ? "" : args[0]) + ": " + why;
    return timed_out ? Status::DeadlineExceeded(msg) : Status::Unavailable(msg);
  }
  return ReplyPtr(r);
}

}  // namespace dedup::streams
