// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// One command to a redis-server on a plain hiredis connection of its own, for tests
// that set up or inspect a server around the code under test (never through it).
// Each call connects (giving up after 2 s), sends, waits for the reply and closes.

#ifndef DEDUP_TESTS_REDIS_ADMIN_H_
#define DEDUP_TESTS_REDIS_ADMIN_H_

#include <hiredis/hiredis.h>

#include <memory>
#include <string>
#include <vector>

#include "dedup/status.h"

namespace dedup::testing {

struct RedisReplyFree {
  void operator()(redisReply* r) const {
    if (r) freeReplyObject(r);
  }
};
using RedisReply = std::unique_ptr<redisReply, RedisReplyFree>;

// The reply to `args` sent to host:port. UNAVAILABLE (with hiredis' reason) when the
// server cannot be reached or the connection breaks; INTERNAL with the server's text
// for an error reply.
StatusOr<RedisReply> RedisCommand(const std::string& host, int port,
                                  const std::vector<std::string>& args);

// The reply to `args` sent to 127.0.0.1:port, as text: an integer in decimal, a
// string, status or error reply as it is (so "MOVED ..." can be told apart), the
// elements of an array one a line, nil ""; "(connect failed)" or "(io error)" when
// the command did not get an answer.
std::string Admin(int port, const std::vector<std::string>& args);

// The elements of an array reply from 127.0.0.1:port (binary-safe; a nested array
// or nil is ""), or nothing for any other reply or no answer.
std::vector<std::string> AdminList(int port, const std::vector<std::string>& args);

}  // namespace dedup::testing

#endif  // DEDUP_TESTS_REDIS_ADMIN_H_
