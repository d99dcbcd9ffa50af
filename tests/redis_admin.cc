// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "redis_admin.h"

#include <sys/time.h>

namespace dedup::testing {
namespace {

// The reply (error replies included), or nullptr with `why` set: "(connect failed)"
// or "(io error)" followed by hiredis' reason.
RedisReply Send(const std::string& host, int port, const std::vector<std::string>& args,
                std::string* why) {
  timeval tv{2, 0};
  redisContext* c = redisConnectWithTimeout(host.c_str(), port, tv);
  if (c == nullptr || c->err) {
    *why = std::string("(connect failed) ") + (c ? c->errstr : "out of memory");
    if (c) redisFree(c);
    return nullptr;
  }
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  RedisReply r(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
  if (r == nullptr) *why = std::string("(io error) ") + c->errstr;
  redisFree(c);
  return r;
}

std::string Text(const redisReply* r) {
  return r->str != nullptr ? std::string(r->str, r->len) : std::string();
}

}  // namespace

StatusOr<RedisReply> RedisCommand(const std::string& host, int port,
                                  const std::vector<std::string>& args) {
  std::string why;
  RedisReply r = Send(host, port, args, &why);
  if (r == nullptr) {
    return Status::Unavailable("redis " + host + ":" + std::to_string(port) + ": " +
                               (args.empty() ? "" : args[0] + ": ") + why);
  }
  if (r->type == REDIS_REPLY_ERROR) {
    return Status::Internal("redis: " + (args.empty() ? "" : args[0] + ": ") + Text(r.get()));
  }
  return r;
}

std::string Admin(int port, const std::vector<std::string>& args) {
  std::string why;
  RedisReply r = Send("127.0.0.1", port, args, &why);
  if (r == nullptr) return why.substr(0, why.find(')') + 1);
  if (r->type == REDIS_REPLY_INTEGER) return std::to_string(r->integer);
  if (r->type == REDIS_REPLY_ARRAY) {
    std::string out;
    for (size_t i = 0; i < r->elements; ++i) {
      if (i) out += "\n";
      out += Text(r->element[i]);
    }
    return out;
  }
  return Text(r.get());
}

std::vector<std::string> AdminList(int port, const std::vector<std::string>& args) {
  std::string why;
  RedisReply r = Send("127.0.0.1", port, args, &why);
  std::vector<std::string> out;
  if (r != nullptr && r->type == REDIS_REPLY_ARRAY) {
    for (size_t i = 0; i < r->elements; ++i) out.push_back(Text(r->element[i]));
  }
  return out;
}

}  // namespace dedup::testing
