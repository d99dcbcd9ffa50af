// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Prints what tests/rabbitmq_nats_chaos_test.sh needs to know about a JetStream
// consumer, from the server itself (nats.c, no dedup code):
//   nats_chaos_probe nats://HOST:PORT STREAM CONSUMER
//   -> "<num_pending> <num_ack_pending> <messages in STREAM> <messages in STREAM_DEAD>"
// Exit 1 when the server cannot answer.

#include <nats/nats.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: nats_chaos_probe URL STREAM CONSUMER\n");
    return 2;
  }
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  if (natsConnection_ConnectTo(&nc, argv[1]) != NATS_OK ||
      natsConnection_JetStream(&js, nc, nullptr) != NATS_OK) {
    std::fprintf(stderr, "nats_chaos_probe: cannot reach %s\n", argv[1]);
    return 1;
  }
  int rc = 1;
  jsConsumerInfo* ci = nullptr;
  jsStreamInfo* si = nullptr;
  jsStreamInfo* dead = nullptr;
  const std::string dead_name = std::string(argv[2]) + "_DEAD";
  if (js_GetConsumerInfo(&ci, js, argv[2], argv[3], nullptr, nullptr) == NATS_OK &&
      js_GetStreamInfo(&si, js, argv[2], nullptr, nullptr) == NATS_OK) {
    unsigned long long dead_msgs = 0;
    if (js_GetStreamInfo(&dead, js, dead_name.c_str(), nullptr, nullptr) == NATS_OK) {
      dead_msgs = dead->State.Msgs;
    }
    std::printf("%llu %lld %llu %llu\n", static_cast<unsigned long long>(ci->NumPending),
                static_cast<long long>(ci->NumAckPending),
                static_cast<unsigned long long>(si->State.Msgs), dead_msgs);
    rc = 0;
  }
  if (ci != nullptr) jsConsumerInfo_Destroy(ci);
  if (si != nullptr) jsStreamInfo_Destroy(si);
  if (dead != nullptr) jsStreamInfo_Destroy(dead);
  jsCtx_Destroy(js);
  natsConnection_Destroy(nc);
  return rc;
}
