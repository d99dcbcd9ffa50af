// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "stores/redis/redis_client.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <chrono>
#include <charconv>
#include <set>
#include <utility>

namespace dedup::redis {
namespace {

int64_t SteadyMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

timeval ToTimeval(Millis d) {
  timeval tv;
  tv.tv_sec = static_cast<time_t>(d.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((d.count() % 1000) * 1000);
  return tv;
}

// hiredis says "Connection refused"; our messages are lower case.
std::string Lower1(const char* s) {
  std::string out = s == nullptr ? std::string("unknown error") : std::string(s);
  if (!out.empty()) out[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(out[0])));
  return out;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// CRC16-CCITT (XMODEM), the one Redis Cluster uses for key slots.
constexpr std::array<uint16_t, 256> MakeCrc16Table() {
  std::array<uint16_t, 256> t{};
  for (int i = 0; i < 256; ++i) {
    uint16_t crc = static_cast<uint16_t>(i << 8);
    for (int b = 0; b < 8; ++b) {
      crc = (crc & 0x8000) ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                           : static_cast<uint16_t>(crc << 1);
    }
    t[i] = crc;
  }
  return t;
}
constexpr std::array<uint16_t, 256> kCrc16Table = MakeCrc16Table();

uint16_t Crc16(std::string_view s) {
  uint16_t crc = 0;
  for (unsigned char c : s) {
    crc = static_cast<uint16_t>((crc << 8) ^ kCrc16Table[((crc >> 8) ^ c) & 0xff]);
  }
  return crc;
}

}  // namespace

void ReplyDeleter::operator()(redisReply* r) const {
  if (r != nullptr) freeReplyObject(r);
}

bool IsError(const redisReply* r) { return r != nullptr && r->type == REDIS_REPLY_ERROR; }

std::string_view ReplyText(const redisReply* r) {
  if (r == nullptr || r->str == nullptr) return {};
  return std::string_view(r->str, r->len);
}

std::string Endpoint::Name() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

StatusOr<Endpoint> ParseEndpoint(std::string_view text) {
  Endpoint ep;
  std::string_view host = text, port;
  if (StartsWith(text, "[")) {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) {
      return Status::InvalidArgument("redis: bad host '" + std::string(text) + "'");
    }
    host = text.substr(1, close - 1);
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return Status::InvalidArgument("redis: bad host '" + std::string(text) + "'");
      port = rest.substr(1);
    }
  } else if (size_t c = text.rfind(':'); c != std::string_view::npos) {
    host = text.substr(0, c);
    port = text.substr(c + 1);
  }
  if (host.empty()) {
    return Status::InvalidArgument("redis: host missing in '" + std::string(text) + "'");
  }
  ep.host.assign(host);
  if (!port.empty()) {
    int p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535) {
      return Status::InvalidArgument("redis: bad port '" + std::string(port) + "' in '" +
                                     std::string(text) + "'");
    }
    ep.port = p;
  }
  return ep;
}

// ---- Connection ---------------------------------------------------------------

Connection::~Connection() {
  if (c_ != nullptr) redisFree(c_);
}

StatusOr<std::unique_ptr<Connection>> Connection::Open(const Endpoint& ep,
                                                       const ClientOptions& o) {
  const timeval tv = ToTimeval(o.timeout);
  redisContext* c = redisConnectWithTimeout(ep.host.c_str(), ep.port, tv);
  if (c == nullptr) return Status::Unavailable("connect: out of memory");
  if (c->err != 0) {
    Status s = Status::Unavailable("connect: " + Lower1(c->errstr));
    redisFree(c);
    return s;
  }
  if (redisSetTimeout(c, tv) != REDIS_OK || redisEnableKeepAlive(c) != REDIS_OK) {
    Status s = Status::Unavailable("connect: " + Lower1(c->errstr));
    redisFree(c);
    return s;
  }
  std::unique_ptr<Connection> conn(new Connection(ep, c, o.timeout));

  // The handshake: AUTH, SELECT, PING, in one round trip.
  std::vector<Command> cmds;
  if (o.has_password) {
    if (o.user.empty()) cmds.push_back({{"AUTH", o.password}});
    else cmds.push_back({{"AUTH", o.user, o.password}});
  }
  if (o.db != 0) cmds.push_back({{"SELECT", std::to_string(o.db)}});
  cmds.push_back({{"PING"}});
  std::vector<const Command*> ptrs;
  for (const Command& cmd : cmds) ptrs.push_back(&cmd);
  std::vector<Reply> replies;
  Status s = conn->Pipeline(ptrs, &replies, "connect");
  if (!s.ok()) {
    // A silent or babbling peer during the handshake: say what we think it is.
    if (s.code() == StatusCode::kDeadlineExceeded) {
      return Status::Unavailable("connect: no answer to PING within " +
                                 std::to_string(o.timeout.count()) +
                                 " ms (is it a Redis server?)");
    }
    return s;
  }
  size_t i = 0;
  if (o.has_password) {
    const redisReply* r = replies[i++].get();
    if (IsError(r)) {
      std::string_view e = ReplyText(r);
      if (StartsWith(e, "WRONGPASS") || e.find("invalid") != std::string_view::npos ||
          e.find("password") != std::string_view::npos) {
        return Status::Unauthenticated("AUTH: " + std::string(e));
      }
      return Status::FailedPrecondition("AUTH: " + std::string(e));
    }
  }
  if (o.db != 0) {
    const redisReply* r = replies[i++].get();
    if (IsError(r)) {
      return Status::InvalidArgument("SELECT " + std::to_string(o.db) + ": " +
                                     std::string(ReplyText(r)));
    }
  }
  const redisReply* pong = replies[i].get();
  if (IsError(pong)) {
    std::string_view e = ReplyText(pong);
    if (StartsWith(e, "NOAUTH")) {
      return Status::Unauthenticated(
          "server requires a password (NOAUTH); put it in the URI as redis://[user]:pass@host");
    }
    return Status::FailedPrecondition("PING: " + std::string(e));
  }
  if (pong->type != REDIS_REPLY_STATUS || ReplyText(pong) != "PONG") {
    return Status::FailedPrecondition("PING was not answered PONG (is it a Redis server?)");
  }
  return conn;
}

Status Connection::TransportError(std::string_view op, bool sent) const {
  const int err = c_->err;
  const std::string what = Lower1(c_->errstr);
  std::string prefix = std::string(op) + ": ";
  if (err == REDIS_ERR_PROTOCOL) {
    return Status::FailedPrecondition(prefix + "peer does not speak the Redis protocol (" + what +
                                      "); is it a Redis server?");
  }
  if (err == REDIS_ERR_EOF) return Status::Unavailable(prefix + "server closed the connection");
  const bool timed_out = err == REDIS_ERR_IO &&
                         (what.find("temporarily unavailable") != std::string::npos ||
                          what.find("timed out") != std::string::npos);
  if (timed_out) {
    if (sent) {
      return Status::DeadlineExceeded(prefix + "no reply within " +
                                      std::to_string(timeout_.count()) +
                                      " ms (effect unknown; safe to retry)");
    }
    return Status::Unavailable(prefix + "send timed out");
  }
  return Status::Unavailable(prefix + what);
}

Status Connection::Pipeline(std::span<const Command* const> cmds, std::vector<Reply>* replies,
                            std::string_view op) {
  replies->clear();
  // The whole pipeline is formatted here into one buffer (RESP arrays of bulk
  // strings) and handed to hiredis in one piece: no per-argument formatting or
  // allocation in hiredis, one write for every command.
  thread_local std::string buf;
  buf.clear();
  auto append_len = [](std::string& b, char tag, size_t n) {
    char num[24];
    num[0] = tag;
    auto [end, ec] = std::to_chars(num + 1, num + sizeof num, n);
    (void)ec;
    b.append(num, end);
    b.append("\r\n", 2);
  };
  for (const Command* cmd : cmds) {
    append_len(buf, '*', cmd->args.size());
    for (const std::string& a : cmd->args) {
      append_len(buf, '$', a.size());
      buf.append(a);
      buf.append("\r\n", 2);
    }
  }
  if (redisAppendFormattedCommand(c_, buf.data(), buf.size()) != REDIS_OK) {
    return TransportError(op, false);
  }
  if (buf.capacity() > (1u << 20)) std::string().swap(buf);  // don't keep a huge one
  replies->reserve(cmds.size());
  for (size_t i = 0; i < cmds.size(); ++i) {
    void* r = nullptr;
    if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) {
      if (r != nullptr) freeReplyObject(r);
      return TransportError(op, true);
    }
    replies->emplace_back(static_cast<redisReply*>(r));
  }
  return Status::Ok();
}

// ---- Node -----------------------------------------------------------------------

Node::Node(Endpoint ep, const ClientOptions* options)
    : ep_(std::move(ep)), name_(ep_.Name()), options_(options) {}

Node::~Node() = default;

StatusOr<std::unique_ptr<Connection>> Node::Acquire(std::string_view op, bool* reused) {
  const std::string where = "redis " + name_ + ": " + std::string(op) + ": ";
  std::unique_lock lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() + options_->timeout;
  while (idle_.empty() && open_ >= options_->pool_size) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout && idle_.empty() &&
        open_ >= options_->pool_size) {
      return Status::Unavailable(where + "all " + std::to_string(options_->pool_size) +
                                 " connections stayed busy for " +
                                 std::to_string(options_->timeout.count()) + " ms");
    }
  }
  if (!idle_.empty()) {
    std::unique_ptr<Connection> c = std::move(idle_.back());
    idle_.pop_back();
    *reused = true;
    return c;
  }
  const int64_t now = SteadyMillis();
  if (now < down_until_) {
    // Still backing off: fail at once with the cause of the last failed connect.
    return Status(last_error_.code(), where + last_error_.message() + " (next reconnect in " +
                                          std::to_string(down_until_ - now) + " ms)");
  }
  ++open_;
  lock.unlock();
  StatusOr<std::unique_ptr<Connection>> c = Connection::Open(ep_, *options_);
  lock.lock();
  if (!c.ok()) {
    --open_;
    backoff_ms_ = backoff_ms_ == 0 ? 50 : std::min<int64_t>(backoff_ms_ * 2, 1'000);
    down_until_ = SteadyMillis() + backoff_ms_;
    last_error_ = c.status();
    cv_.notify_one();
    return Status(c.status().code(), where + c.status().message());
  }
  backoff_ms_ = 0;
  down_until_ = 0;
  *reused = false;
  return c;
}

void Node::Return(std::unique_ptr<Connection> c) {
  std::lock_guard lock(mu_);
  idle_.push_back(std::move(c));
  cv_.notify_one();
}

void Node::Discard(bool drop_idle) {
  std::vector<std::unique_ptr<Connection>> dropped;
  {
    std::lock_guard lock(mu_);
    --open_;
    if (drop_idle) {
      open_ -= idle_.size();
      dropped.swap(idle_);
    }
    cv_.notify_all();
  }
}

Status Node::Pipeline(std::span<const Command* const> cmds, std::vector<Reply>* replies,
                      std::string_view op) {
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    StatusOr<std::unique_ptr<Connection>> c = Acquire(op, &reused);
    if (!c.ok()) return c.status();
    Status s = (*c)->Pipeline(cmds, replies, op);
    if (s.ok()) {
      Return(std::move(c).value());
      return s;
    }
    c.value().reset();
    // The other idle connections most likely died with this one (restart).
    Discard(/*drop_idle=*/true);
    if (!reused || attempt > 0 || s.code() != StatusCode::kUnavailable) {
      return Status(s.code(), "redis " + name_ + ": " + s.message());
    }
  }
}

// ---- Router ---------------------------------------------------------------------

uint16_t KeySlot(std::string_view key) {
  // Only the part between the first '{' and the next '}' is hashed, if not empty.
  if (size_t open = key.find('{'); open != std::string_view::npos) {
    if (size_t close = key.find('}', open + 1);
        close != std::string_view::npos && close != open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  return Crc16(key) & 16383;
}

Router::Router(std::vector<Endpoint> seeds, bool cluster, ClientOptions options)
    : seeds_(std::move(seeds)), cluster_(cluster), options_(std::move(options)) {}

Node* Router::NodeAt(const std::string& address) {
  {
    std::shared_lock lock(mu_);
    if (auto it = nodes_.find(address); it != nodes_.end()) return it->second.get();
  }
  StatusOr<Endpoint> ep = ParseEndpoint(address);
  Endpoint e = ep.ok() ? *ep : Endpoint{address, 6379};
  std::unique_lock lock(mu_);
  auto& slot = nodes_[address];
  if (slot == nullptr) slot = std::make_unique<Node>(std::move(e), &options_);
  return slot.get();
}

Status Router::Start() {
  for (const Endpoint& ep : seeds_) NodeAt(ep.Name());
  if (!cluster_) return Status::Ok();
  return Refresh();
}

Node* Router::NodeFor(std::string_view key) {
  if (!cluster_) return NodeAt(seeds_.front().Name());
  MaybeRefresh();
  Node* n;
  {
    std::shared_lock lock(mu_);
    n = slots_[KeySlot(key)];
  }
  // A slot nobody serves: ask a seed, which answers MOVED or CLUSTERDOWN.
  return n != nullptr ? n : NodeAt(seeds_.front().Name());
}

std::vector<Node*> Router::Primaries() {
  if (!cluster_) return {NodeAt(seeds_.front().Name())};
  MaybeRefresh();
  std::shared_lock lock(mu_);
  std::vector<Node*> out;
  std::set<Node*> seen;
  for (Node* n : slots_) {
    if (n != nullptr && seen.insert(n).second) out.push_back(n);
  }
  return out;
}

void Router::OnMoved(uint16_t slot, const std::string& address) {
  Node* n = NodeAt(address);
  {
    std::unique_lock lock(mu_);
    slots_[slot] = n;
  }
  stale_ = true;
}

void Router::MaybeRefresh() {
  if (!stale_.load(std::memory_order_relaxed)) return;
  const int64_t now = SteadyMillis();
  if (now - last_refresh_.load() < 100) return;
  std::unique_lock lock(refresh_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  (void)Refresh();
}

Status Router::Refresh() {
  last_refresh_ = SteadyMillis();
  std::vector<Node*> candidates = [&] {
    std::shared_lock lock(mu_);
    std::vector<Node*> v;
    for (auto& [name, node] : nodes_) v.push_back(node.get());
    return v;
  }();
  Status last = Status::Unavailable("redis cluster: no node to ask for CLUSTER SLOTS");
  const Command cmd{{"CLUSTER", "SLOTS"}};
  const Command* cmds[] = {&cmd};
  for (Node* n : candidates) {
    std::vector<Reply> replies;
    Status s = n->Pipeline(cmds, &replies, "CLUSTER SLOTS");
    if (!s.ok()) {
      last = s;
      continue;
    }
    const redisReply* r = replies[0].get();
    if (IsError(r)) {
      last = Status::FailedPrecondition("redis " + n->name() + ": CLUSTER SLOTS: " +
                                        std::string(ReplyText(r)) +
                                        " (use redis:// for a server that is not a cluster)");
      continue;
    }
    if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
      last = Status::Unavailable("redis " + n->name() + ": CLUSTER SLOTS: no slot is served");
      continue;
    }
    std::array<Node*, 16384> fresh{};
    for (size_t i = 0; i < r->elements; ++i) {
      const redisReply* range = r->element[i];
      if (range->type != REDIS_REPLY_ARRAY || range->elements < 3) continue;
      const redisReply* master = range->element[2];
      if (master->type != REDIS_REPLY_ARRAY || master->elements < 2) continue;
      std::string host(ReplyText(master->element[0]));
      if (host.empty() || host == "?") host = n->endpoint().host;
      Endpoint ep{host, static_cast<int>(master->element[1]->integer)};
      Node* owner = NodeAt(ep.Name());
      const long long lo = std::max<long long>(0, range->element[0]->integer);
      const long long hi = std::min<long long>(16383, range->element[1]->integer);
      for (long long s2 = lo; s2 <= hi; ++s2) fresh[s2] = owner;
    }
    {
      std::unique_lock lock(mu_);
      slots_ = fresh;
    }
    stale_ = false;
    return Status::Ok();
  }
  return last;
}

}  // namespace dedup::redis
