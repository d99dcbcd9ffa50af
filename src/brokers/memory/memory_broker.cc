// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/memory/memory_broker.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <queue>
#include <unordered_map>

namespace dedup {

using SteadyClock = std::chrono::steady_clock;

struct MemoryBroker::Shared {
  enum class State : uint8_t { kWaiting, kReady, kInFlight, kAcked, kDead };
  struct Msg {
    std::string key, payload, key_error;
    State state = State::kWaiting;
    uint32_t gen = 0;         // bumped by every hand-out, retry and finish
    uint32_t deliveries = 0;  // hand-outs so far
  };
  struct Timer {
    SteadyClock::time_point due;
    uint64_t msg;
    uint32_t gen;
    bool operator>(const Timer& o) const { return due > o.due; }
  };

  explicit Shared(MemoryBrokerOptions o) : options(o) {}

  void FireTimers(SteadyClock::time_point now) {
    size_t fired = 0;
    while (!timers.empty() && timers.top().due <= now) {
      const Timer t = timers.top();
      timers.pop();
      Msg& m = msgs[t.msg];
      if (m.gen != t.gen) continue;  // stale: acked, retried or redelivered since
      if (m.state == State::kInFlight) {
        ++redeliveries;  // visibility timeout: nobody settled it
        --in_flight;
      } else if (m.state != State::kWaiting) {
        continue;
      }
      m.state = State::kReady;
      ready.push_back(t.msg);
      ++fired;
    }
    if (fired > 1) cv.notify_all();
  }

  // Caller holds mu.
  void Finish(uint64_t id, State to, std::string reason) {
    Msg& m = msgs[id];
    if (m.state == State::kAcked || m.state == State::kDead) return;
    if (m.state == State::kInFlight) --in_flight;
    m.state = to;
    ++m.gen;  // its pending timers are stale now
    if (to == State::kAcked) {
      ++acked;
    } else {
      ++dead;
      dead_letters.emplace_back(id, std::move(reason));
    }
    if (--open == 0) {
      cv.notify_all();
      done_cv.notify_all();
    }
  }

  const MemoryBrokerOptions options;
  mutable std::mutex mu;
  std::condition_variable cv;
  mutable std::condition_variable done_cv;
  std::vector<Msg> msgs;
  std::deque<uint64_t> ready;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<>> timers;
  uint64_t open = 0, in_flight = 0, acked = 0, dead = 0, deliveries = 0, redeliveries = 0;
  bool stopped = false;
  uint64_t next_source = 1;
  std::unordered_map<uint64_t, uint64_t> source_epoch;  // source id -> crashes so far
  std::vector<std::pair<uint64_t, std::string>> dead_letters;
};

namespace {

using Shared = MemoryBroker::Shared;

class MemoryDelivery final : public Delivery {
 public:
  MemoryDelivery(std::shared_ptr<Shared> shared, uint64_t msg, uint32_t gen, uint64_t source,
                 uint64_t epoch, const Shared::Msg& m)
      : shared_(std::move(shared)), msg_(msg), gen_(gen), source_(source), epoch_(epoch) {
    key_ = m.key;
    payload_ = m.payload;
    if (m.key.empty()) key_error_ = m.key_error.empty() ? "message has no key" : m.key_error;
    id_ = std::to_string(msg);
    delivery_count_ = m.deliveries;
  }

  Status Ack() override {
    std::lock_guard lock(shared_->mu);
    DEDUP_RETURN_IF_ERROR(Alive());
    shared_->Finish(msg_, Shared::State::kAcked, {});
    return Status::Ok();
  }

  Status Retry(Millis after) override {
    std::lock_guard lock(shared_->mu);
    DEDUP_RETURN_IF_ERROR(Alive());
    Shared::Msg& m = shared_->msgs[msg_];
    // Delivered again meanwhile, or finished: nothing to do.
    if (m.state != Shared::State::kInFlight || m.gen != gen_) return Status::Ok();
    m.state = Shared::State::kWaiting;
    --shared_->in_flight;
    ++m.gen;
    shared_->timers.push(
        Shared::Timer{SteadyClock::now() + std::max(after, Millis(0)), msg_, m.gen});
    shared_->cv.notify_one();  // the new timer may be the earliest
    return Status::Ok();
  }

  Status DeadLetter(std::string_view reason) override {
    std::lock_guard lock(shared_->mu);
    DEDUP_RETURN_IF_ERROR(Alive());
    shared_->Finish(msg_, Shared::State::kDead, std::string(reason));
    return Status::Ok();
  }

 private:
  // Caller holds mu.
  Status Alive() const {
    auto it = shared_->source_epoch.find(source_);
    if (it == shared_->source_epoch.end() || it->second != epoch_) {
      return Status::Unavailable("memory broker: the consumer that fetched message " + id_ +
                                 " is gone (crashed)");
    }
    return Status::Ok();
  }

  std::shared_ptr<Shared> shared_;
  uint64_t msg_;
  uint32_t gen_;
  uint64_t source_, epoch_;
};

}  // namespace

MemoryBroker::MemoryBroker(MemoryBrokerOptions options)
    : shared_(std::make_shared<Shared>(options)) {}

MemoryBroker::~MemoryBroker() { Stop(); }

uint64_t MemoryBroker::Publish(std::string key, std::string payload, Millis delay,
                               std::string key_error) {
  std::lock_guard lock(shared_->mu);
  const uint64_t id = shared_->msgs.size();
  Shared::Msg m;
  m.key = std::move(key);
  m.payload = std::move(payload);
  m.key_error = std::move(key_error);
  shared_->msgs.push_back(std::move(m));
  ++shared_->open;
  if (delay.count() <= 0) {
    shared_->msgs.back().state = Shared::State::kReady;
    shared_->ready.push_back(id);
  } else {
    shared_->timers.push(Shared::Timer{SteadyClock::now() + delay, id, 0});
  }
  shared_->cv.notify_one();
  return id;
}

std::unique_ptr<MemorySource> MemoryBroker::Connect(std::string name) {
  return std::unique_ptr<MemorySource>(new MemorySource(shared_, std::move(name)));
}

void MemoryBroker::Stop() {
  std::lock_guard lock(shared_->mu);
  shared_->stopped = true;
  shared_->cv.notify_all();
}

MemoryBroker::Counts MemoryBroker::counts() const {
  std::lock_guard lock(shared_->mu);
  Counts c;
  c.published = shared_->msgs.size();
  c.open = shared_->open;
  c.in_flight = shared_->in_flight;
  c.acked = shared_->acked;
  c.dead = shared_->dead;
  c.deliveries = shared_->deliveries;
  c.redeliveries = shared_->redeliveries;
  return c;
}

bool MemoryBroker::WaitAllFinished(SteadyClock::time_point deadline) const {
  std::unique_lock lock(shared_->mu);
  return shared_->done_cv.wait_until(lock, deadline, [this] { return shared_->open == 0; });
}

std::vector<bool> MemoryBroker::OpenMessages() const {
  std::lock_guard lock(shared_->mu);
  std::vector<bool> open(shared_->msgs.size());
  for (size_t i = 0; i < open.size(); ++i) {
    const auto s = shared_->msgs[i].state;
    open[i] = s != Shared::State::kAcked && s != Shared::State::kDead;
  }
  return open;
}

std::vector<std::pair<uint64_t, std::string>> MemoryBroker::DeadLetters() const {
  std::lock_guard lock(shared_->mu);
  return shared_->dead_letters;
}

MemorySource::MemorySource(std::shared_ptr<MemoryBroker::Shared> shared, std::string name)
    : shared_(std::move(shared)), name_(std::move(name)) {
  std::lock_guard lock(shared_->mu);
  source_id_ = shared_->next_source++;
  shared_->source_epoch[source_id_] = 0;
}

MemorySource::~MemorySource() {
  // A source dropped without settling is a crash: its deliveries are abandoned.
  std::lock_guard lock(shared_->mu);
  shared_->source_epoch.erase(source_id_);
}

void MemorySource::Crash() {
  std::lock_guard lock(shared_->mu);
  ++shared_->source_epoch[source_id_];
}

std::string MemorySource::Describe() const { return "memory broker (" + name_ + ")"; }

StatusOr<std::vector<std::unique_ptr<Delivery>>> MemorySource::Fetch(size_t max, Millis wait) {
  std::vector<std::unique_ptr<Delivery>> out;
  const auto deadline = SteadyClock::now() + wait;
  std::unique_lock lock(shared_->mu);
  for (;;) {
    if (shared_->stopped) return out;
    const auto now = SteadyClock::now();
    shared_->FireTimers(now);
    const uint64_t epoch = shared_->source_epoch[source_id_];
    while (!shared_->ready.empty() && out.size() < max) {
      const uint64_t id = shared_->ready.front();
      shared_->ready.pop_front();
      Shared::Msg& m = shared_->msgs[id];
      if (m.state != Shared::State::kReady) continue;  // finished meanwhile
      m.state = Shared::State::kInFlight;
      ++m.gen;
      ++m.deliveries;
      ++shared_->deliveries;
      ++shared_->in_flight;
      shared_->timers.push(
          Shared::Timer{now + shared_->options.visibility_timeout, id, m.gen});
      out.push_back(std::make_unique<MemoryDelivery>(shared_, id, m.gen, source_id_, epoch, m));
    }
    if (!out.empty() || now >= deadline) return out;
    auto until = deadline;
    if (!shared_->timers.empty()) until = std::min(until, shared_->timers.top().due);
    shared_->cv.wait_until(lock, until);
  }
}

}  // namespace dedup
