// Builds against an installed dedup and runs one message through a Buffer.
#include <cstdio>

#include "dedup/buffer.h"
#include "dedup/store.h"

int main() {
  auto store = dedup::OpenStore("memory:");
  if (!store.ok()) return 1;
  dedup::Buffer buffer(store->get());
  int runs = 0;
  auto handler = [&](dedup::ClaimGuard&) {
    ++runs;
    return dedup::HandlerResult::Done("ok");
  };
  auto a = buffer.ProcessOnce("m1", "", handler);
  auto b = buffer.ProcessOnce("m1", "", handler);
  const bool good = runs == 1 && a.action == dedup::BrokerAction::kAck &&
                    b.claim.outcome == dedup::ClaimOutcome::kDuplicate;
  std::printf("consumer: %s\n", good ? "ok" : "FAILED");
  return good ? 0 : 1;
}
