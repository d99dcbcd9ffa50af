// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Small helpers for tests that start real servers as child processes.

#ifndef DEDUP_TESTS_TEST_PROCESS_H_
#define DEDUP_TESTS_TEST_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace dedup::testing {

// True when nothing accepts connections on 127.0.0.1:port.
bool PortFree(int port);

// Starts `args` (looked up on PATH) with stdout and stderr sent to /dev/null.
// Returns the child's PID, or -1.
pid_t Spawn(const std::vector<std::string>& args);

}  // namespace dedup::testing

#endif  // DEDUP_TESTS_TEST_PROCESS_H_
