// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Small helpers for tests that start real servers as child processes.

#ifndef DEDUP_TESTS_TEST_PROCESS_H_
#define DEDUP_TESTS_TEST_PROCESS_H_

#include <sys/types.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

namespace dedup::testing {

// True when nothing accepts connections on 127.0.0.1:port.
bool PortFree(int port);

// Starts `args` (looked up on PATH) with stdout and stderr sent to /dev/null.
// Returns the child's PID, or -1.
pid_t Spawn(const std::vector<std::string>& args);

// A TCP listener on an ephemeral loopback port that answers every connection with
// `greeting` (or nothing) and closes it after a while: a peer that is not the
// server a client expects.
class FakePeer {
 public:
  explicit FakePeer(std::string greeting);
  ~FakePeer();
  int port() const { return port_; }

 private:
  std::string greeting_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace dedup::testing

#endif  // DEDUP_TESTS_TEST_PROCESS_H_
