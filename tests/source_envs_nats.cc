// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The NATS JetStream env of the consumer conformance suite (tests/source_envs.h).
// It uses the server tests/with_nats.sh started (DEDUP_TEST_NATS_URI); without
// it the env is not available. Each case gets a stream of its own, and its
// consumer's AckWait is the suite's redelivery_after. Keys travel in a header
// (key=header:Dedup-Key), not in Nats-Msg-Id: the stream's duplicate window would
// drop the suite's deliberate repeats before the Consumer saw them.
// Outstanding() is the consumer's NumPending + NumAckPending, from the server.

#ifdef DEDUP_WITH_NATS

#include <nats/nats.h>

#include <cstdlib>

#include "brokers/nats/nats_source.h"
#include "dedup/record.h"
#include "source_envs.h"

namespace dedup::testing {
namespace {

class NatsEnv final : public SourceEnv {
 public:
  ~NatsEnv() override { Close(); }
  std::string Name() const override { return "nats"; }

  Status Reset(const SourceEnvOptions& o) override {
    const char* base = std::getenv("DEDUP_TEST_NATS_URI");
    if (base == nullptr) return Status::Unavailable("DEDUP_TEST_NATS_URI is not set");
    url_ = base;
    stream_ = "CONF" + Token::Random().ToHex().substr(0, 16);
    auto opts = nats::ParseNatsUri(url_ + "?stream=" + stream_ + "&consumer=c&subject=" + stream_ +
                                   ".in&key=header:Dedup-Key&ack_wait=" +
                                   std::to_string(o.redelivery_after.count()) + "ms");
    if (!opts.ok()) return opts.status();
    options_ = *opts;
    auto p = nats::NatsPublisher::Open(options_);
    if (!p.ok()) return p.status();
    publisher_ = std::move(p).value();
    auto s = nats::OpenNatsSource(options_);  // creates the durable consumer
    if (!s.ok()) return s.status();
    Close();
    if (natsConnection_ConnectTo(&nc_, url_.c_str()) != NATS_OK ||
        natsConnection_JetStream(&js_, nc_, nullptr) != NATS_OK) {
      return Status::Unavailable("nats env: cannot connect to " + url_);
    }
    return Status::Ok();
  }

  StatusOr<std::unique_ptr<MessageSource>> OpenSource() override {
    return nats::OpenNatsSource(options_);
  }

  Status Publish(std::string_view key, std::string_view payload) override {
    return publisher_->Publish(key, payload, nullptr);
  }

  StatusOr<size_t> Outstanding() override {
    jsConsumerInfo* ci = nullptr;
    if (js_GetConsumerInfo(&ci, js_, stream_.c_str(), "c", nullptr, nullptr) != NATS_OK) {
      return Status::Unavailable("nats env: consumer info");
    }
    const size_t n = static_cast<size_t>(ci->NumPending) + static_cast<size_t>(ci->NumAckPending);
    jsConsumerInfo_Destroy(ci);
    return n;
  }

  StatusOr<std::vector<std::string>> DeadLetterReasons() override {
    std::vector<std::string> out;
    const std::string dead = stream_ + "_DEAD";
    jsStreamInfo* si = nullptr;
    if (js_GetStreamInfo(&si, js_, dead.c_str(), nullptr, nullptr) != NATS_OK) return out;
    const uint64_t first = si->State.FirstSeq, last = si->State.LastSeq, msgs = si->State.Msgs;
    jsStreamInfo_Destroy(si);
    if (msgs == 0) return out;
    for (uint64_t seq = first; seq <= last; ++seq) {
      natsMsg* m = nullptr;
      if (js_GetMsg(&m, js_, dead.c_str(), seq, nullptr, nullptr) != NATS_OK) continue;
      const char* reason = nullptr;
      out.emplace_back(natsMsgHeader_Get(m, "Dedup-Reason", &reason) == NATS_OK && reason != nullptr
                           ? reason
                           : "");
      natsMsg_Destroy(m);
    }
    return out;
  }

  void Crash(std::unique_ptr<MessageSource> source) override {
    // Nothing it fetched is settled; JetStream redelivers after AckWait.
    source.reset();
  }

 private:
  void Close() {
    if (js_ != nullptr) jsCtx_Destroy(js_);
    if (nc_ != nullptr) natsConnection_Destroy(nc_);
    js_ = nullptr;
    nc_ = nullptr;
  }

  std::string url_, stream_;
  nats::NatsOptions options_;
  std::unique_ptr<nats::NatsPublisher> publisher_;
  natsConnection* nc_ = nullptr;
  jsCtx* js_ = nullptr;
};

}  // namespace

bool NatsEnvAvailable() { return std::getenv("DEDUP_TEST_NATS_URI") != nullptr; }
std::unique_ptr<SourceEnv> MakeNatsEnv() { return std::make_unique<NatsEnv>(); }

}  // namespace dedup::testing

#endif  // DEDUP_WITH_NATS
