// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "redis/client.h"

#include "core/secret.h"

#include <hiredis/hiredis.h>
#include <hiredis/sds.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cerrno>
#include <cctype>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <mutex>
#include <set>
#include <system_error>
#include <thread>
#include <utility>

namespace dedup::redis {
namespace {

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

// The error reply to AUTH, its echoed arguments cut off, fit to be shown: not
// if it still holds the password anywhere.
std::string AuthReplyText(std::string_view e, const std::string& password) {
  if (!password.empty() && e.find(password) != std::string_view::npos) {
    return "(the server's reply is not shown: it holds the password)";
  }
  return std::string(e);
}

// Steady ms at the kernel tick's resolution (1 to 4 ms): a few instructions, where
// the precise clock costs a vDSO call. Enough for the idle check of LooksAlive.
int64_t CoarseMillis() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1'000'000;
}

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

// The two replies a claim gets most (a nil, and +OK), when they are a whole
// reply and not an element of an array, are not allocated: the reader hands out
// one shared, never written object for each, and the deleter leaves them alone.
// Everything else is hiredis's own reply object.
namespace {
redisReply shared_nil{REDIS_REPLY_NIL, 0, 0, nullptr, 0, nullptr};
char ok_text[] = "OK";
redisReply shared_ok{REDIS_REPLY_STATUS, 0, 2, ok_text, 0, nullptr};

bool IsShared(const void* r) { return r == &shared_nil || r == &shared_ok; }

// hiredis's own functions, taken from the first reader made (they are the same
// static table for every context).
const redisReplyObjectFunctions* hiredis_fn = nullptr;

void* CreateString(const redisReadTask* task, char* str, size_t len) {
  if (task->parent == nullptr && task->type == REDIS_REPLY_STATUS && len == 2 && str[0] == 'O' &&
      str[1] == 'K') {
    return &shared_ok;
  }
  return hiredis_fn->createString(task, str, len);
}
void* CreateArray(const redisReadTask* task, int elements) {
  return hiredis_fn->createArray(task, elements);
}
void* CreateInteger(const redisReadTask* task, long long value) {
  return hiredis_fn->createInteger(task, value);
}
void* CreateNil(const redisReadTask* task) {
  if (task->parent == nullptr) return &shared_nil;
  return hiredis_fn->createNil(task);
}
void FreeObject(void* r) {
  if (!IsShared(r)) hiredis_fn->freeObject(r);
}
redisReplyObjectFunctions reply_functions{CreateString, CreateArray, CreateInteger, CreateNil,
                                          FreeObject};

void UseSharedReplies(redisContext* c) {
  static std::once_flag once;
  std::call_once(once, [c] { hiredis_fn = c->reader->fn; });
  if (c->reader->fn == hiredis_fn) c->reader->fn = &reply_functions;
}
}  // namespace

void ReplyDeleter::operator()(redisReply* r) const {
  if (r != nullptr && !IsShared(r)) freeReplyObject(r);
}

bool IsError(const redisReply* r) { return r != nullptr && r->type == REDIS_REPLY_ERROR; }

bool AnyReadOnly(const Reply* replies, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const redisReply* r = replies[i].get();
    if (r != nullptr && r->type == REDIS_REPLY_ERROR && r->str != nullptr &&
        StartsWith(std::string_view(r->str, r->len), "READONLY")) {
      return true;
    }
  }
  return false;
}

std::string_view ReplyText(const redisReply* r) {
  if (r == nullptr || r->str == nullptr) return {};
  return std::string_view(r->str, r->len);
}

// ---- CommandBuffer ------------------------------------------------------------

void CommandBuffer::Clear() {
  len_ = 0;
  cmds_.clear();
  side_keys_.clear();
  if (cap_ > (1u << 20)) {  // don't keep a huge one
    buf_.reset();
    cap_ = 0;
  }
}

void CommandBuffer::Grow(size_t n) {
  const size_t cap = std::max<size_t>({len_ + n, 2 * cap_, 256});
  std::unique_ptr<char[]> b(new char[cap]);
  if (len_ > 0) std::memcpy(b.get(), buf_.get(), len_);
  buf_ = std::move(b);
  cap_ = cap;
}

namespace {
// "<tag><n>\r\n" at p; returns the end. p must have room for 23 bytes.
char* Header(char* p, char tag, size_t n) {
  *p++ = tag;
  if (n < 10) *p++ = static_cast<char>('0' + n);  // most arguments
  else p = std::to_chars(p, p + 20, n).ptr;
  *p++ = '\r';
  *p++ = '\n';
  return p;
}
}  // namespace

void CommandBuffer::Begin(size_t nargs) {
  cmds_.push_back(Span{len_, 0, 0, false});
  len_ = static_cast<size_t>(Header(Room(23), '*', nargs) - buf_.get());
}

char* CommandBuffer::Bulk(std::string_view a, std::string_view b) {
  char* p = Header(Room(a.size() + b.size() + 25), '$', a.size() + b.size());
  char* const at = p;
  if (!a.empty()) std::memcpy(p, a.data(), a.size());
  p += a.size();
  if (!b.empty()) std::memcpy(p, b.data(), b.size());
  p += b.size();
  *p++ = '\r';
  *p++ = '\n';
  len_ = static_cast<size_t>(p - buf_.get());
  return at;
}

void CommandBuffer::Arg(std::string_view a, std::string_view b) { (void)Bulk(a, b); }

void CommandBuffer::Number(uint64_t n) {
  char num[20];
  const char* end = std::to_chars(num, num + sizeof num, n).ptr;
  (void)Bulk(std::string_view(num, static_cast<size_t>(end - num)), {});
}

void CommandBuffer::Key(std::string_view a, std::string_view b) {
  const char* at = Bulk(a, b);
  Span& s = cmds_.back();
  s.key_at = static_cast<size_t>(at - buf_.get());
  s.key_len = a.size() + b.size();
  s.side = false;
}

void CommandBuffer::Append(const Command& cmd, std::string_view key) {
  Begin(cmd.args.size());
  bool found = key.empty();
  for (const std::string& a : cmd.args) {
    if (!found && a == key) {
      Key(a);
      found = true;
    } else {
      Arg(a);
    }
  }
  if (!found) {  // routed by a key that is not one of its arguments
    Span& s = cmds_.back();
    s.key_at = side_keys_.size();
    s.key_len = key.size();
    s.side = true;
    side_keys_.append(key);
  }
}

void CommandBuffer::AppendFrom(const CommandBuffer& from, size_t i) {
  const std::string_view c = from.command(i);
  const Span& f = from.cmds_[i];
  Span s{len_, 0, f.key_len, f.side};
  if (f.side) {
    s.key_at = side_keys_.size();
    side_keys_.append(from.key(i));
  } else if (f.key_len > 0) {
    s.key_at = len_ + (f.key_at - f.begin);
  }
  std::memcpy(Room(c.size()), c.data(), c.size());
  len_ += c.size();
  cmds_.push_back(s);
}

std::string_view CommandBuffer::command(size_t i) const {
  const size_t end = i + 1 < cmds_.size() ? cmds_[i + 1].begin : len_;
  return std::string_view(buf_.get() + cmds_[i].begin, end - cmds_[i].begin);
}

std::string_view CommandBuffer::key(size_t i) const {
  const Span& s = cmds_[i];
  if (s.key_len == 0) return {};
  if (s.side) return std::string_view(side_keys_).substr(s.key_at, s.key_len);
  return std::string_view(buf_.get() + s.key_at, s.key_len);
}

// ---- Connection ---------------------------------------------------------------

Connection::~Connection() {
  if (c_ != nullptr) redisFree(c_);
}

StatusOr<std::unique_ptr<Connection>> Connection::Open(const Endpoint& ep,
                                                       const ConnectionOptions& o) {
  const timeval tv = ToTimeval(o.timeout);
  // Once the caller stops waiting, a connect gets the grace at most.
  timeval connect_tv = tv;
  if (o.wait_stop != nullptr && o.wait_stop->stopped()) {
    const int64_t now = SteadyMillis();
    const int64_t left = o.wait_stop->GiveUpAt(now, ep.Name()) - now;
    if (left <= 0) {
      return Status::Aborted(
          "connect: given up: the caller is stopping, and the server let an earlier call "
          "wait out its grace (nothing of the call was sent)");
    }
    connect_tv = ToTimeval(Millis(std::min<int64_t>(left, o.timeout.count())));
  }
  redisContext* c = redisConnectWithTimeout(ep.host.c_str(), ep.port, connect_tv);
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
  // Not inherited by what this process runs (`--exec` handlers, `dedup exec`'s
  // command): hiredis 0.14 opens its socket without SOCK_CLOEXEC, so it is set
  // here, right after the connect, as libpq does for its own socket.
  if (fcntl(c->fd, F_SETFD, FD_CLOEXEC) != 0) {
    Status s = Status::Unavailable(std::string("connect: close-on-exec: ") + std::strerror(errno));
    redisFree(c);
    return s;
  }
  UseSharedReplies(c);
  std::unique_ptr<Connection> conn(new Connection(ep, c, o.timeout, o.reply_spin, o.wait_stop));

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
  conn->handshake_ = true;
  Status s = conn->Pipeline(ptrs, &replies, "connect");
  conn->handshake_ = false;
  if (!s.ok()) {
    if (s.code() == StatusCode::kAborted) return s;  // given up: the caller stops
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
      // Classified by the server's words, shown without the password. A server
      // that does not know AUTH (renamed away in a hardened config; some
      // proxies) answers "ERR unknown command 'AUTH', with args beginning with:
      // 'user' 'password'": the arguments are cut off first.
      std::string_view e = ReplyText(r);
      e = e.substr(0, e.find(", with args beginning with"));
      const std::string shown = AuthReplyText(e, o.password);
      if (StartsWith(e, "WRONGPASS") || e.find("invalid") != std::string_view::npos ||
          e.find("password") != std::string_view::npos) {
        return Status::Unauthenticated("AUTH: " + shown);
      }
      // The first reply of a connection over maxclients.
      if (ErrorReplyStatus("", e).retryable()) return Status::Unavailable("AUTH: " + shown);
      return Status::FailedPrecondition("AUTH: " + shown);
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
      // Not "put it in the URI": a URI on the command line is shown by ps.
      return Status::Unauthenticated(std::string("server requires a password (NOAUTH): add ") +
                                     internal::kPasswordFileParam + "=FILE to the URI or set " +
                                     internal::kRedisPasswordEnv);
    }
    // LOADING, BUSY, MASTERDOWN: the server cannot answer yet; later it will
    // (publish exits 75 on these, the stores retry), as ErrorReplyStatus says.
    if (ErrorReplyStatus("", e).retryable()) return Status::Unavailable("PING: " + std::string(e));
    return Status::FailedPrecondition("PING: " + std::string(e));
  }
  if (pong->type != REDIS_REPLY_STATUS || ReplyText(pong) != "PONG") {
    return Status::FailedPrecondition("PING was not answered PONG (is it a Redis server?)");
  }
  return conn;
}

namespace {
constexpr char kEffectUnknown[] =
    " after the commands were sent (effect unknown: they may have run; not sent again)";
}  // namespace

Status Connection::TransportError(std::string_view op, bool sent, bool reading) const {
  const int err = c_->err;
  const std::string what = Lower1(c_->errstr);
  const std::string prefix = op.empty() ? std::string() : std::string(op) + ": ";
  if (err == REDIS_ERR_PROTOCOL) {
    return Status::FailedPrecondition(prefix + "peer does not speak the Redis protocol (" + what +
                                      "); is it a Redis server?");
  }
  // Once the commands (or some of them) were written, the server may have run
  // them: said so, and never sent again here (client.h). A new connection's
  // handshake is not the caller's commands: none of those was written then.
  std::string unknown;
  if (handshake_) unknown = " during the handshake (AUTH/SELECT/PING; nothing of the call was sent)";
  else if (sent) unknown = kEffectUnknown;
  if (err == REDIS_ERR_EOF) {
    return Status::Unavailable(prefix + "server closed the connection" + unknown);
  }
  const bool timed_out = err == REDIS_ERR_IO &&
                         (what.find("temporarily unavailable") != std::string::npos ||
                          what.find("timed out") != std::string::npos);
  if (timed_out && reading) {
    return Status::DeadlineExceeded(prefix + "no reply within " +
                                    std::to_string(current_timeout_.count()) + " ms" + unknown);
  }
  if (timed_out) return Status::Unavailable(prefix + "send timed out" + unknown);
  return Status::Unavailable(prefix + what + unknown);
}

Status Connection::Queue(std::string_view resp, std::string_view op) {
  // hiredis copies the bytes into its output buffer as they are: no formatting.
  if (redisAppendFormattedCommand(c_, resp.data(), resp.size()) != REDIS_OK) {
    return TransportError(op, false, false);
  }
  return Status::Ok();
}

Status Connection::Send(std::string_view resp, std::string_view op) {
  reached_ = false;
  if (sdslen(c_->obuf) != 0) {
    // Bytes hiredis queued go first.
    DEDUP_RETURN_IF_ERROR(Queue(resp, op));
    return Flush(op);
  }
  // Nothing queued before: the caller's bytes as they are, sparing the copy into
  // hiredis's output buffer (and its free and malloc per write).
  return WriteAll(resp, op);
}

Status Connection::Flush(std::string_view op) {
  reached_ = false;
  if (sdslen(c_->obuf) == 0) return Status::Ok();
  Status s = WriteAll(std::string_view(c_->obuf, sdslen(c_->obuf)), op);
  // Written, or the connection is done for: never sent again either way.
  sdssetlen(c_->obuf, 0);
  c_->obuf[0] = '\0';
  return s;
}

// Every write to a Redis socket is ours, with MSG_NOSIGNAL: a peer that reset the
// connection is an error (EPIPE, ECONNRESET), never a SIGPIPE, which kills a
// process that does not ignore it (hiredis 0.14 writes with write(2): a write
// after a reset raised it). The socket blocks up to its send timeout, then
// answers EAGAIN ("send timed out").
Status Connection::WriteAll(std::string_view bytes, std::string_view op) {
  const size_t total = bytes.size();
  while (!bytes.empty()) {
    const ssize_t n = ::send(c_->fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    if (n > 0) {
      reached_ = true;
      bytes.remove_prefix(static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    // As hiredis records an I/O error, so that TransportError words it alike.
    const int e = errno;
    c_->err = REDIS_ERR_IO;
    if (reached_) {
      std::snprintf(c_->errstr, sizeof(c_->errstr), "%s after %zu of %zu bytes",
                    n == 0 ? "send wrote nothing" : std::strerror(e), total - bytes.size(),
                    total);
    } else {
      std::snprintf(c_->errstr, sizeof(c_->errstr), "%s",
                    n == 0 ? "send wrote nothing" : std::strerror(e));
    }
    return TransportError(op, reached_, false);
  }
  return Status::Ok();
}

bool Connection::LooksAlive() {
  if (CoarseMillis() - last_reply_ms_ < kIdleCheck.count()) return true;
  char b;
  const ssize_t n = ::recv(c_->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
  // EOF (0), a reset (ECONNRESET ...) or bytes nobody asked for (> 0): unusable.
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// A thread that blocks in recv right after its write lets its CPU go idle; on a
// virtual machine whose idle vCPUs halt, the reply then has to wake that vCPU
// through the host, which can take longer than the server's whole answer. Polling
// for the reply a little first keeps the CPU awake for a fast answer; yielding
// between polls leaves the CPU to the server (or anyone) when they share it. A
// spin that saw no reply within half its budget (a slow command, a busy server, a
// CPU shared with other work) is not tried again for the next kSkipAfterMiss
// reads, so a slow server costs a spin now and then, not every call. At
// most half the CPUs (at least one) spin at once in a process: with many
// connections the server is the bound, and spinners would take its CPU.
namespace {
// The CPUs this process may run on (taskset, cpusets, a container's cpuset),
// not the machine's: under `taskset -c 0` on 8 CPUs, hardware_concurrency()
// allowed 4 spinners on the one CPU the process has. The machine's count if the
// affinity cannot be read.
int UsableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::thread::hardware_concurrency());
}
std::atomic<int> spinners{0};
// Read at the first spin, not when the library is loaded: a program that never
// asks for spin= never reads its affinity, and one that sets it (taskset in
// main, a cpuset joined after start) before its first call is counted as it runs.
int MaxSpinners() {
  static const int max = std::max(1, UsableCpus() / 2);
  return max;
}
}  // namespace

bool Connection::SpinForReply() {
  constexpr int kSkipAfterMiss = 32;
  if (spin_.count() == 0 || c_->reader->pos < c_->reader->len) return true;
  if (skip_spins_ > 0) {
    --skip_spins_;
    return true;
  }
  if (spinners.fetch_add(1, std::memory_order_relaxed) >= MaxSpinners()) {
    spinners.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  struct Leave {
    ~Leave() { spinners.fetch_sub(1, std::memory_order_relaxed); }
  } leave;
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + spin_;
  char buf[16 * 1024];
  for (;;) {
    const ssize_t n = ::recv(c_->fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      if (redisReaderFeed(c_->reader, buf, static_cast<size_t>(n)) != REDIS_OK) {
        c_->err = REDIS_ERR_PROTOCOL;
        std::snprintf(c_->errstr, sizeof(c_->errstr), "%s", c_->reader->errstr);
        return false;
      }
      if (std::chrono::steady_clock::now() - start > spin_ / 2) skip_spins_ = kSkipAfterMiss;
      return true;
    }
    // EOF: the blocking read that follows finds it and words it as hiredis does.
    if (n == 0) return true;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) {
      c_->err = REDIS_ERR_IO;
      std::snprintf(c_->errstr, sizeof(c_->errstr), "%s", std::strerror(errno));
      return false;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      skip_spins_ = kSkipAfterMiss;
      return true;
    }
    sched_yield();
  }
}

Status Connection::ReadReplies(size_t n, Reply* out, std::string_view op, size_t* read) {
  // No reply to wait for: nothing to poll for (a spin would last its whole budget).
  if (n > 0 && !SpinForReply()) {
    if (read != nullptr) *read = 0;
    return TransportError(op, true, true);
  }
  const int64_t start_ms = stop_ != nullptr ? SteadyMillis() : 0;
  for (size_t i = 0; i < n; ++i) {
    void* r = nullptr;
    if (stop_ != nullptr) {
      Status s = AwaitReply(&r, start_ms, op);
      if (!s.ok()) {
        Reply drop(static_cast<redisReply*>(r));
        if (read != nullptr) *read = i;
        return s;
      }
    } else if (redisGetReply(c_, &r) != REDIS_OK || r == nullptr) {
      Reply drop(static_cast<redisReply*>(r));
      if (read != nullptr) *read = i;
      return TransportError(op, true, true);
    }
    out[i].reset(static_cast<redisReply*>(r));
  }
  last_reply_ms_ = CoarseMillis();
  if (read != nullptr) *read = n;
  return Status::Ok();
}

Status Connection::AwaitReply(void** reply, int64_t start_ms, std::string_view op) {
  for (;;) {
    if (redisGetReplyFromReader(c_, reply) != REDIS_OK) return TransportError(op, true, true);
    if (*reply != nullptr) return Status::Ok();
    // No whole reply buffered: wait for bytes. Each wait gets the timeout, as
    // the socket's receive timeout gives each recv (hiredis's redisGetReply).
    const int64_t wait_start = SteadyMillis();
    const int64_t timed_out_at = wait_start + current_timeout_.count();
    for (;;) {
      const bool stopped = stop_->stopped();
      const int64_t give_up_at = stopped ? stop_->GiveUpAt(start_ms, ep_.Name()) : INT64_MAX;
      const int64_t until = std::min(timed_out_at, give_up_at);
      const int64_t left = std::max<int64_t>(0, until - SteadyMillis());
      pollfd fds[2] = {{c_->fd, POLLIN, 0}, {stop_->fd(), POLLIN, 0}};
      // Once stopped the eventfd stays readable: poll the socket alone.
      const nfds_t nfds = stopped || stop_->fd() < 0 ? 1 : 2;
      const int rc = poll(fds, nfds, static_cast<int>(std::min<int64_t>(left, INT_MAX)));
      if (rc < 0) {
        if (errno == EINTR) continue;
        c_->err = REDIS_ERR_IO;
        std::snprintf(c_->errstr, sizeof(c_->errstr), "%s", std::strerror(errno));
        return TransportError(op, true, true);
      }
      // Readable, closed or failed: the read below finds out which.
      if (rc > 0 && fds[0].revents != 0) break;
      if (rc > 0) continue;  // stopped just now: the bounds are worked out again
      if (SteadyMillis() < until) continue;
      c_->err = REDIS_ERR_IO;
      if (give_up_at < timed_out_at) {
        stop_->GaveUp(ep_.Name());
        std::snprintf(c_->errstr, sizeof(c_->errstr), "given up");
        std::string prefix = op.empty() ? std::string() : std::string(op) + ": ";
        return Status::Aborted(
            prefix + "given up after " + std::to_string(SteadyMillis() - start_ms) +
            " ms without a reply: the caller is stopping" +
            (handshake_ ? " (during the handshake: nothing of the call was sent)"
                        : " (effect unknown: the commands may have run; not sent again)"));
      }
      // As the socket's receive timeout would have it.
      std::snprintf(c_->errstr, sizeof(c_->errstr), "Resource temporarily unavailable");
      return TransportError(op, true, true);
    }
    if (redisBufferRead(c_) != REDIS_OK) return TransportError(op, true, true);
  }
}

Status Connection::Pipeline(std::span<const Command* const> cmds, std::vector<Reply>* replies,
                            std::string_view op, size_t* read, Millis extra_timeout) {
  CommandBuffer buf;
  for (const Command* c : cmds) buf.Append(*c);
  return Pipeline(buf, replies, op, read, extra_timeout);
}

Status Connection::Pipeline(const CommandBuffer& cmds, std::vector<Reply>* replies,
                            std::string_view op, size_t* read, Millis extra_timeout) {
  replies->clear();
  reached_ = false;
  if (read != nullptr) *read = 0;
  const Millis want = timeout_ + extra_timeout;
  if (want != current_timeout_) {
    if (redisSetTimeout(c_, ToTimeval(want)) != REDIS_OK) return TransportError(op, false, false);
    current_timeout_ = want;
  }
  DEDUP_RETURN_IF_ERROR(Send(cmds.bytes(), op));
  replies->resize(cmds.size());
  Status s = ReadReplies(cmds.size(), replies->data(), op, read);
  if (!s.ok()) replies->clear();
  return s;
}

// ---- Node -----------------------------------------------------------------------

// One connection shared by many callers; see "Auto-pipelining" in client.h.
//
// At most one batch is on the wire at a time. Its leader reads its replies, takes
// what was queued meanwhile as the next batch, writes it at once (so the server
// works on it while we wake callers), and hands the connection to the first caller
// of that batch, who will read its replies. So the wire is never idle waiting for a
// thread to be scheduled, and no thread leads twice in a row.
class SharedConnection {
 public:
  explicit SharedConnection(Node* node) : node_(node) {}

  uint32_t load() const { return load_.load(std::memory_order_relaxed); }

  Status Call(const CommandBuffer& cmds, std::vector<Reply>* replies, std::string_view op,
              bool* sent) {
    load_.fetch_add(1, std::memory_order_relaxed);
    Request req{&cmds, replies, op, Status::Ok(), false, {kQueued}};
    bool lead = false;
    {
      std::lock_guard lock(mu_);
      queue_.push_back(&req);
      if (!busy_) busy_ = lead = true;
    }
    if (!lead) {
      // std::atomic::wait spins a little (pause, then sched_yield) before it
      // sleeps. Parking on a plain futex at once was tried and was slower at 16
      // callers per connection (median 35k against 68k claims/s, one connection,
      // busy machine): every hand-off then costs the leader a FUTEX_WAKE and the
      // caller a full wake-up, where a spinning caller sees its reply by itself.
      int state;
      while ((state = req.state.load(std::memory_order_acquire)) == kQueued) {
        req.state.wait(kQueued, std::memory_order_acquire);
      }
      lead = state == kLead;
    }
    if (lead) Lead(&req);
    load_.fetch_sub(1, std::memory_order_relaxed);
    if (sent != nullptr) *sent = req.sent;
    return std::move(req.status);
  }

 private:
  enum : int { kQueued = 0, kLead = 1, kDone = 2 };
  struct Request {
    const CommandBuffer* cmds;  // the caller's, formatted already
    std::vector<Reply>* replies;
    std::string_view op;
    Status status;
    bool sent;  // failed after some of its batch was written: effect unknown
    std::atomic<int> state;
  };

  // Called with the lead (busy_). On entry inflight_ is the batch written by the
  // previous leader, with our request first, or empty (we start cold: our request
  // is queued).
  void Lead(Request* self) {
    // This leader's own lists (the members pass to the heir); their buffers are
    // kept per thread, so a steady stream of calls allocates nothing here.
    thread_local std::vector<Request*> done, next;
    done.clear();
    if (inflight_.empty()) {
      {
        std::lock_guard lock(mu_);
        inflight_.swap(queue_);
      }
      if (!WriteBatch(inflight_)) done.swap(inflight_);
    }
    if (!inflight_.empty()) {
      ReadBatch(inflight_);
      done.swap(inflight_);
    }
    for (;;) {
      next.clear();
      {
        std::lock_guard lock(mu_);
        next.swap(queue_);
        if (next.empty()) {
          busy_ = false;  // from here on, inflight_ and conn_ are the next leader's
          break;
        }
      }
      if (WriteBatch(next)) {
        inflight_.swap(next);
        Request* heir = inflight_.front();
        heir->state.store(kLead, std::memory_order_release);
        heir->state.notify_one();
        break;
      }
      done.insert(done.end(), next.begin(), next.end());  // failed: statuses are set
    }
    for (Request* r : done) {
      if (r == self) continue;
      r->state.store(kDone, std::memory_order_release);
      r->state.notify_one();  // r may be gone already: notify only wakes a futex
    }
    done.clear();
  }

  // Writes every command of `batch`, connecting first if needed. False (and every
  // request failed) when it could not. A connection found closed by the server
  // while idle, or whose write failed before its first byte, is replaced by a
  // fresh one once: nothing of the batch reached the server then.
  bool WriteBatch(const std::vector<Request*>& batch) {
    for (int attempt = 0;; ++attempt) {
      if (conn_ != nullptr && !conn_->LooksAlive()) conn_.reset();
      const bool fresh = conn_ == nullptr;
      if (fresh) {
        StatusOr<std::unique_ptr<Connection>> c = node_->Connect();
        if (!c.ok()) {
          Fail(batch, c.status(), false);
          return false;
        }
        conn_ = std::move(c).value();
      }
      // Each caller's bytes go to the socket buffer as they are, then one write.
      size_t n = 0;
      Status s;
      if (batch.size() == 1) {
        n = batch[0]->cmds->size();
        s = conn_->Send(batch[0]->cmds->bytes(), "");
      } else {
        for (const Request* r : batch) {
          n += r->cmds->size();
          if (s.ok()) s = conn_->Queue(r->cmds->bytes(), "");
        }
        if (s.ok()) s = conn_->Flush("");
      }
      if (s.ok()) {
        node_->round_trips_.fetch_add(1, std::memory_order_relaxed);
        node_->commands_.fetch_add(n, std::memory_order_relaxed);
        return true;
      }
      const bool reached = conn_->reached();
      conn_.reset();
      if (reached || fresh || attempt > 0) {
        Fail(batch, s, reached);
        return false;
      }
    }
  }

  // Reads the replies of a written batch and hands each caller its own.
  void ReadBatch(const std::vector<Request*>& batch) {
    size_t n = 0;
    for (const Request* r : batch) n += r->cmds->size();
    replies_.resize(n);
    size_t read = 0;
    Status s = conn_->ReadReplies(n, replies_.data(), "", &read);
    if (!s.ok()) {
      // The batch was written: the server may have run it (all, part or none).
      // Never sent again here; each caller decides (client.h).
      conn_.reset();
      Fail(batch, s, true);
      replies_.clear();
      return;
    }
    // A replica now: the next batch connects again (AnyReadOnly).
    if (AnyReadOnly(replies_.data(), n)) conn_.reset();
    size_t at = 0;
    for (Request* r : batch) {
      r->replies->clear();
      r->replies->reserve(r->cmds->size());
      for (size_t i = 0; i < r->cmds->size(); ++i) r->replies->push_back(std::move(replies_[at++]));
      r->status = Status::Ok();
    }
    replies_.clear();
  }

  void Fail(const std::vector<Request*>& batch, const Status& s, bool sent) {
    for (Request* r : batch) {
      r->replies->clear();
      r->sent = sent;
      r->status = Status(s.code(), "redis " + node_->name() + ": " + std::string(r->op) + ": " +
                                       s.message());
    }
  }

  Node* const node_;
  std::mutex mu_;
  bool busy_ = false;  // a leader owns the connection
  std::vector<Request*> queue_;
  std::atomic<uint32_t> load_{0};
  // The leader's; passed from leader to heir with the lead.
  std::vector<Request*> inflight_;  // written, replies not read yet
  std::unique_ptr<Connection> conn_;
  std::vector<Reply> replies_;
};

Node::Node(Endpoint ep, const ConnectionOptions* options)
    : ep_(std::move(ep)), name_(ep_.Name()), options_(options) {
  if (options_->auto_pipeline) {
    for (size_t i = 0; i < std::max<size_t>(1, options_->pool_size); ++i) {
      shared_.push_back(std::make_unique<SharedConnection>(this));
    }
  }
}

Node::~Node() = default;

StatusOr<std::unique_ptr<Connection>> Node::Connect() {
  {
    std::lock_guard lock(connect_mu_);
    const int64_t now = SteadyMillis();
    if (now < down_until_) {
      // Still backing off: fail at once with the cause of the last failed connect.
      return Status(last_error_.code(), last_error_.message() + " (next reconnect in " +
                                            std::to_string(down_until_ - now) + " ms)");
    }
  }
  StatusOr<std::unique_ptr<Connection>> c = Connection::Open(ep_, *options_);
  std::lock_guard lock(connect_mu_);
  if (!c.ok()) {
    backoff_ms_ = backoff_ms_ == 0 ? 50 : std::min<int64_t>(backoff_ms_ * 2, 1'000);
    down_until_ = SteadyMillis() + backoff_ms_;
    last_error_ = c.status();
    return c.status();
  }
  backoff_ms_ = 0;
  down_until_ = 0;
  return c;
}

StatusOr<std::unique_ptr<Connection>> Node::Dedicated(std::string_view op) {
  StatusOr<std::unique_ptr<Connection>> c = Connect();
  if (!c.ok()) {
    return Status(c.status().code(),
                  "redis " + name_ + ": " + std::string(op) + ": " + c.status().message());
  }
  return c;
}

Status Node::Pipeline(std::span<const Command* const> cmds, std::vector<Reply>* replies,
                      std::string_view op, bool* sent) {
  // Kept per thread: the caller waits in Pipeline while a leader reads the bytes.
  thread_local CommandBuffer buf;
  buf.Clear();
  for (const Command* c : cmds) buf.Append(*c);
  return Pipeline(buf, replies, op, sent);
}

Status Node::Pipeline(const CommandBuffer& cmds, std::vector<Reply>* replies,
                      std::string_view op, bool* sent) {
  if (sent != nullptr) *sent = false;
  if (shared_.empty()) return PooledPipeline(cmds, replies, op, sent);
  // A thread keeps the connection it used last while nobody else is on it, as a
  // client with one connection per worker would (redis-benchmark -c N): N threads
  // on N connections settle one per connection and never queue behind each other.
  // Otherwise the least loaded connection, starting the search at a rotating place
  // so that ties spread; an idle one is taken at once.
  struct Last {
    const Node* node = nullptr;
    size_t at = 0;
  };
  thread_local Last last;
  const size_t n = shared_.size();
  if (last.node == this && last.at < n && shared_[last.at]->load() == 0) {
    return shared_[last.at]->Call(cmds, replies, op, sent);
  }
  const size_t start = next_.fetch_add(1, std::memory_order_relaxed) % n;
  size_t best = start;
  uint32_t best_load = UINT32_MAX;
  for (size_t i = 0; i < n; ++i) {
    const size_t at = (start + i) % n;
    const uint32_t l = shared_[at]->load();
    if (l < best_load) {
      best = at;
      best_load = l;
      if (l == 0) break;
    }
  }
  last = Last{this, best};
  return shared_[best]->Call(cmds, replies, op, sent);
}

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
  ++open_;
  lock.unlock();
  StatusOr<std::unique_ptr<Connection>> c = Connect();
  lock.lock();
  if (!c.ok()) {
    --open_;
    cv_.notify_one();
    return Status(c.status().code(), where + c.status().message());
  }
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

Status Node::PooledPipeline(const CommandBuffer& cmds, std::vector<Reply>* replies,
                            std::string_view op, bool* sent) {
  for (int attempt = 0;; ++attempt) {
    bool reused = false;
    StatusOr<std::unique_ptr<Connection>> c = Acquire(op, &reused);
    if (!c.ok()) return c.status();
    if (reused && !(*c)->LooksAlive()) {
      // Closed by the server while idle (restart, idle timeout): nothing was
      // written to it. The other idle ones most likely died with it.
      c.value().reset();
      Discard(/*drop_idle=*/true);
      if (attempt > 0) return Status::Unavailable("redis " + name_ + ": " + std::string(op) +
                                                  ": server closed the idle connections");
      continue;
    }
    Status s = (*c)->Pipeline(cmds, replies, op);
    if (s.ok()) {
      round_trips_.fetch_add(1, std::memory_order_relaxed);
      commands_.fetch_add(cmds.size(), std::memory_order_relaxed);
      if (AnyReadOnly(replies->data(), replies->size())) {
        // A replica now (AnyReadOnly): this connection and the idle ones go.
        c.value().reset();
        Discard(/*drop_idle=*/true);
        return s;
      }
      Return(std::move(c).value());
      return s;
    }
    const bool reached = (*c)->reached();
    c.value().reset();
    // The other idle connections most likely died with this one (restart).
    Discard(/*drop_idle=*/true);
    // Sent once more only when nothing of it was written (client.h).
    if (reached || !reused || attempt > 0 || s.code() != StatusCode::kUnavailable) {
      if (sent != nullptr) *sent = reached;
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

namespace {
ConnectionOptions WithWaitStop(ConnectionOptions o, const WaitStop* stop) {
  o.wait_stop = stop;
  return o;
}
}  // namespace

Router::Router(ConnectionOptions options)
    : options_(WithWaitStop(std::move(options), &wait_stop_)) {}

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
  for (const Endpoint& ep : options_.endpoints) NodeAt(ep.Name());
  if (!options_.cluster) return Status::Ok();
  return Refresh();
}

Node* Router::NodeFor(std::string_view key) {
  if (!options_.cluster) {
    Node* n = single_.load(std::memory_order_acquire);
    if (n == nullptr) {
      n = NodeAt(options_.endpoints.front().Name());
      single_.store(n, std::memory_order_release);
    }
    return n;
  }
  MaybeRefresh();
  Node* n;
  {
    std::shared_lock lock(mu_);
    n = slots_[KeySlot(key)];
  }
  // A slot nobody serves: ask a seed, which answers MOVED or CLUSTERDOWN.
  return n != nullptr ? n : NodeAt(options_.endpoints.front().Name());
}

std::vector<Node*> Router::Primaries() {
  if (!options_.cluster) return {NodeFor({})};
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

// One reload's asks: the answer of each node asked, filled by its thread.
struct Router::SlotsAsk {
  std::mutex mu;
  std::condition_variable cv;
  struct Answer {
    bool done = false;
    Status status;
    Reply reply;
  };
  std::vector<Answer> answers;
};

Router::~Router() {
  // An ask still waiting (a frozen node) gives up now (its wait polls the stop's
  // eventfd; a connect in progress ends within its timeout).
  wait_stop_.Stop(Millis(0));
  std::vector<Asker> askers;
  {
    std::lock_guard lock(askers_mu_);  // which each ask takes as it ends
    askers.swap(askers_);
  }
  for (Asker& a : askers) a.thread.join();
}

void Router::AskSlots(const std::shared_ptr<SlotsAsk>& ask, Node* n, size_t i) {
  auto done = std::make_shared<std::atomic<bool>>(false);
  auto body = [this, ask, n, i, done] {
    const Command cmd{{"CLUSTER", "SLOTS"}};
    const Command* cmds[] = {&cmd};
    std::vector<Reply> replies;
    Status s = n->Pipeline(cmds, &replies, "CLUSTER SLOTS");
    {
      std::lock_guard lock(ask->mu);
      SlotsAsk::Answer& a = ask->answers[i];
      if (s.ok()) a.reply = std::move(replies[0]);
      a.status = std::move(s);
      a.done = true;
    }
    ask->cv.notify_all();
    {
      std::lock_guard lock(askers_mu_);
      asking_.erase(n);
    }
    done->store(true, std::memory_order_release);
  };
  {
    std::lock_guard lock(askers_mu_);
    asking_.insert(n);
  }
  std::thread t;
  try {
    t = std::thread(body);
  } catch (const std::system_error&) {
    body();  // no thread to be had: asked here, and waited for
    return;
  }
  std::lock_guard lock(askers_mu_);
  askers_.push_back(Asker{std::move(t), std::move(done)});
}

Status Router::Refresh() {
  last_refresh_ = SteadyMillis();
  std::vector<Node*> candidates;
  {
    std::lock_guard lock(askers_mu_);
    for (auto it = askers_.begin(); it != askers_.end();) {  // the asks that ended
      if (it->done->load(std::memory_order_acquire)) {
        it->thread.join();
        it = askers_.erase(it);
      } else {
        ++it;
      }
    }
    // A node still asked by an earlier reload has not answered it: not again.
    std::shared_lock nodes_lock(mu_);
    for (auto& [name, node] : nodes_) {
      if (asking_.count(node.get()) == 0) candidates.push_back(node.get());
    }
  }
  // A node that just failed is asked last: when it is down or stalled, the
  // others know the new map.
  if (Node* f = failed_.load(); f != nullptr) {
    std::stable_partition(candidates.begin(), candidates.end(), [f](Node* n) { return n != f; });
  }
  Status last = Status::Unavailable("redis cluster: no node to ask for CLUSTER SLOTS");
  const size_t n = candidates.size();
  if (n == 0) return last;
  auto ask = std::make_shared<SlotsAsk>();
  ask->answers.resize(n);
  size_t started = 0, taken = 0;
  std::vector<bool> seen(n, false);
  std::chrono::steady_clock::time_point hedge_at;
  const auto ask_next = [&] {
    const size_t k = started++;
    AskSlots(ask, candidates[k], k);
    hedge_at = std::chrono::steady_clock::now() + kRefreshHedge;
  };
  ask_next();
  for (;;) {
    size_t i = n;
    Reply reply;
    Status status;
    {
      std::unique_lock lock(ask->mu);
      for (;;) {
        for (size_t k = 0; k < started && i == n; ++k) {
          if (ask->answers[k].done && !seen[k]) i = k;
        }
        if (i < n || taken == n) break;
        if (started == n) {
          ask->cv.wait(lock);  // every node asked: the first answer, or each one's timeout
        } else if (ask->cv.wait_until(lock, hedge_at) == std::cv_status::timeout) {
          break;
        }
      }
      if (i < n) {
        seen[i] = true;
        ++taken;
        status = std::move(ask->answers[i].status);
        reply = std::move(ask->answers[i].reply);
      }
    }
    if (i == n && taken == n) return last;  // every node answered, none with a map
    if (i < n) {
      Status s = status.ok() ? UseSlots(candidates[i], reply.get()) : std::move(status);
      if (s.ok()) return s;
      last = std::move(s);
    }
    // A failure, or no map within kRefreshHedge: the next node is asked (too).
    if (started < n) ask_next();
  }
}

Status Router::UseSlots(Node* n, const redisReply* r) {
  if (IsError(r)) {
    return Status::FailedPrecondition("redis " + n->name() + ": CLUSTER SLOTS: " +
                                      std::string(ReplyText(r)) +
                                      " (use redis:// for a server that is not a cluster)");
  }
  if (r->type != REDIS_REPLY_ARRAY || r->elements == 0) {
    return Status::Unavailable("redis " + n->name() + ": CLUSTER SLOTS: no slot is served");
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

// ---- Client ---------------------------------------------------------------------

namespace {

// "MOVED 3999 127.0.0.1:6381" → slot and address; `from` sent it.
bool ParseRedirect(std::string_view e, const Node* from, uint16_t* slot, std::string* address) {
  const size_t a = e.find(' ');
  const size_t b = a == std::string_view::npos ? a : e.find(' ', a + 1);
  if (b == std::string_view::npos) return false;
  unsigned v = 0;
  auto [p, ec] = std::from_chars(e.data() + a + 1, e.data() + b, v);
  if (ec != std::errc() || v > 16383) return false;
  *slot = static_cast<uint16_t>(v);
  const std::string_view node = e.substr(b + 1);
  const size_t colon = node.rfind(':');
  if (colon == std::string_view::npos) return false;
  std::string_view host = node.substr(0, colon);
  // No host: "" (cluster-preferred-endpoint-type unknown-endpoint) or "?"
  // (hostname, on a node that announces none) mean the host this was sent to,
  // as CLUSTER SLOTS's "" and "?" do (Refresh).
  if (host.empty() || host == "?") host = from->endpoint().host;
  // Redis writes ip:port with an IPv6 address unbracketed ("ASK 3999 ::1:7117"):
  // the port is after the last colon, and the node is named as CLUSTER SLOTS's
  // host and port are (Endpoint::Name: "[::1]:7117", a zone id as "%25":
  // "[fe80::1%25lo]:7117"), so that both find one Node.
  if (host.front() == '[') {
    address->assign(host).append(node.substr(colon));
    return true;
  }
  const std::string_view port = node.substr(colon + 1);
  int p2 = 0;
  auto [pe, pec] = std::from_chars(port.data(), port.data() + port.size(), p2);
  if (pec != std::errc() || pe != port.data() + port.size() || p2 <= 0 || p2 > 65535) {
    return false;
  }
  *address = Endpoint{std::string(host), p2}.Name();
  return true;
}

std::string Where(const Node* n, std::string_view op) {
  return "redis " + n->name() + ": " + std::string(op) + ": ";
}

}  // namespace

std::string_view WithoutScriptLocation(std::string_view e) {
  const size_t at = e.find(" script: ");
  return at == std::string_view::npos ? e : e.substr(0, at);
}

std::string_view ScriptErrorWords(std::string_view e) {
  e = WithoutScriptLocation(e);
  const size_t colon = e.find(": ");
  return colon == std::string_view::npos ? e : e.substr(colon + 2);
}

Status ErrorReplyStatus(const std::string& where, std::string_view e) {
  e = WithoutScriptLocation(e);
  const std::string msg = where + std::string(e);
  if (StartsWith(e, "NOAUTH") || StartsWith(e, "WRONGPASS")) return Status::Unauthenticated(msg);
  if (StartsWith(e, "NOPERM")) return Status::PermissionDenied(msg);
  if (StartsWith(e, "WRONGTYPE")) {
    return Status::DataLoss(where + "corrupt record: the key holds a value of another type (a "
                                    "hash, list, set, ...), not a dedup record; nothing changed (" +
                            std::string(e) + ")");
  }
  if (StartsWith(e, "DEDUPCORRUPT")) {
    // `where` names the operation.
    return Status::DataLoss(where + "corrupt record: " + std::string(ScriptErrorWords(e)) +
                            "; nothing changed");
  }
  if (StartsWith(e, "DEDUPARGS")) return Status::InvalidArgument(msg + " (nothing changed)");
  if (StartsWith(e, "DEDUPTYPE")) {
    return Status::FailedPrecondition(where + std::string(ScriptErrorWords(e)) +
                                      " (dedup forget --force, DELETE ?force=true); nothing changed");
  }
  if (StartsWith(e, "OOM")) return Status::ResourceExhausted(msg);
  if (StartsWith(e, "READONLY")) {
    return Status::Unavailable(msg + " (the server is a read-only replica now, e.g. after a "
                                     "failover; the connection is dropped and a later call "
                                     "connects to the address again)");
  }
  if (StartsWith(e, "LOADING") || StartsWith(e, "BUSY") || StartsWith(e, "CLUSTERDOWN") ||
      StartsWith(e, "MASTERDOWN") || StartsWith(e, "TRYAGAIN") ||
      StartsWith(e, "MOVED") || StartsWith(e, "ASK")) {
    return Status::Unavailable(msg);
  }
  // maxclients: the server refuses this connection (and closes it) until a
  // client leaves. A plain ERR, told by its text (Redis 2.6 to 7.x).
  if (StartsWith(e, "ERR max number of clients reached")) return Status::Unavailable(msg);
  return Status::Internal(msg);
}

Client::Client(ConnectionOptions options, const ScriptSet* scripts)
    : router_(std::move(options)), scripts_(scripts) {}

Status Client::Start() { return router_.Start(); }

namespace {

// Replies that ask for the command to be sent again elsewhere or later.
bool IsRedirect(const redisReply* r) {
  if (!IsError(r)) return false;
  std::string_view e = ReplyText(r);
  return StartsWith(e, "MOVED ") || StartsWith(e, "ASK ") || StartsWith(e, "TRYAGAIN");
}

}  // namespace

bool IsNoScript(const redisReply* r) {
  return IsError(r) && StartsWith(ReplyText(r), "NOSCRIPT");
}

StatusOr<Reply> Client::Run(std::string_view op, const CommandBuffer& cmds, size_t i,
                            bool* sent) {
  Node* node = router_.NodeFor(cmds.key(i));
  bool asking = false;
  // Kept per thread: a call allocates no vector (the leader fills it in place).
  thread_local std::vector<Reply> replies;
  CommandBuffer again;  // used only after a redirect
  for (int tries = 0; tries < 8; ++tries) {
    const CommandBuffer* send = &cmds;
    if (asking || cmds.size() != 1) {
      again.Clear();
      if (asking) {
        again.Begin(1);
        again.Arg("ASKING");
      }
      again.AppendFrom(cmds, i);
      send = &again;
    }
    bool reached = false;
    if (Status s = node->Pipeline(*send, &replies, op, &reached); !s.ok()) {
      // The node may be gone for good (a primary killed, its replica promoted):
      // the map is reloaded (at most every 100 ms), and when nothing of the call
      // was written and the new map names another node for the key, it goes there.
      router_.OnNodeFailure(node);
      if (!reached && !asking && router_.cluster()) {
        router_.MaybeRefresh();
        if (Node* now = router_.NodeFor(cmds.key(i)); now != node) {
          node = now;
          continue;
        }
      }
      if (sent != nullptr) *sent = reached;
      return s;
    }
    Reply r = std::move(replies.back());
    asking = false;
    if (!IsRedirect(r.get())) return r;
    std::string_view e = ReplyText(r.get());
    uint16_t slot = 0;
    std::string address;
    if (StartsWith(e, "MOVED ") && ParseRedirect(e, node, &slot, &address)) {
      router_.OnMoved(slot, address);
      node = router_.NodeAt(address);
      continue;
    }
    if (StartsWith(e, "ASK ") && ParseRedirect(e, node, &slot, &address)) {
      node = router_.NodeAt(address);
      asking = true;
      continue;
    }
    if (StartsWith(e, "TRYAGAIN")) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20 << std::min(tries, 4)));
      continue;
    }
    return ErrorReplyStatus(Where(node, op), e);  // a redirect we cannot read
  }
  return Status::Unavailable(Where(node, op) + "too many redirects (cluster resharding?)");
}

StatusOr<Reply> Client::Call(std::string_view op, const CommandBuffer& cmd, bool* sent) {
  if (sent != nullptr) *sent = false;
  return Run(op, cmd, 0, sent);
}

StatusOr<Reply> Client::Exec(std::string_view op, const CommandBuffer& cmd, bool* sent) {
  StatusOr<Reply> r = Call(op, cmd, sent);
  if (r.ok() && IsError(r->get())) {
    return ErrorReplyStatus(Where(router_.NodeFor(cmd.key(0)), op), ReplyText(r->get()));
  }
  return r;
}

StatusOr<Reply> Client::Exec(std::string_view op, const std::string& key, Command cmd,
                             bool* sent) {
  StatusOr<Reply> r = Call(op, key, std::move(cmd), sent);
  if (r.ok() && IsError(r->get())) {
    return ErrorReplyStatus(Where(router_.NodeFor(key), op), ReplyText(r->get()));
  }
  return r;
}

StatusOr<Reply> Client::Call(std::string_view op, const std::string& key, Command cmd,
                             bool* sent) {
  if (sent != nullptr) *sent = false;
  CommandBuffer buf;
  buf.Append(cmd, key);
  StatusOr<Reply> r = Run(op, buf, 0, sent);
  if (r.ok() && IsNoScript(r->get()) && cmd.args.size() >= 2 && cmd.args[0] == "EVALSHA" &&
      scripts_ != nullptr) {
    if (const Script* s = scripts_->FindBySha(cmd.args[1])) {
      // The server lost its script cache (restart, failover, SCRIPT FLUSH):
      // EVAL runs the script and caches it again.
      cmd.args[0] = "EVAL";
      cmd.args[1] = s->body;
      buf.Clear();
      buf.Append(cmd, key);
      r = Run(op, buf, 0, sent);
    }
  }
  return r;
}

Status Client::ExecMany(std::string_view op, const CommandBuffer& cmds,
                        std::vector<Reply>* replies, bool* sent, std::vector<bool>* unknown) {
  if (sent != nullptr) *sent = false;
  if (unknown != nullptr) unknown->assign(cmds.size(), false);
  if (cmds.empty()) {  // nothing to send: no round trip (and no read to wait for)
    replies->clear();
    return Status::Ok();
  }
  Status first;  // the first failure; the other nodes are still asked
  const auto failed = [&](Status s, bool reached) {
    if (sent != nullptr) *sent = *sent || reached;
    if (first.ok()) first = std::move(s);
  };
  if (!router_.cluster()) {
    // One node: one pipeline, no grouping; the replies land in place.
    bool reached = false;
    Status s = router_.NodeFor({})->Pipeline(cmds, replies, op, &reached);
    if (!s.ok()) {
      failed(std::move(s), reached);
      replies->clear();
      replies->resize(cmds.size());
      if (unknown != nullptr) unknown->assign(cmds.size(), reached);
      return first;
    }
  } else {
    replies->clear();
    replies->resize(cmds.size());
    std::map<Node*, std::vector<size_t>> groups;
    for (size_t i = 0; i < cmds.size(); ++i) groups[router_.NodeFor(cmds.key(i))].push_back(i);
    CommandBuffer part;
    std::vector<Reply> got;
    // The parts of nodes that failed before anything of them was written (down,
    // refusing, backing off), with the failure: as Run does for one command, the
    // map is reloaded and each goes to the node that serves its slot now (the
    // replica that took over from a dead primary) in a second round, in this call.
    // A batch answers all its items or none (store.h), so without this one dead
    // primary failed the whole batch until the next call used the new map.
    std::vector<std::pair<Node*, Status>> unsent;
    for (int round = 0; round < 2 && !groups.empty(); ++round) {
      std::map<Node*, std::vector<size_t>> unsent_idx;
      for (auto& [node, idx] : groups) {
        part.Clear();
        for (size_t i : idx) part.AppendFrom(cmds, i);
        bool reached = false;
        if (Status s = node->Pipeline(part, &got, op, &reached); !s.ok()) {
          router_.OnNodeFailure(node);  // the map is reloaded (here, or by the next call)
          if (!reached && round == 0) {
            unsent.emplace_back(node, std::move(s));
            unsent_idx[node] = idx;
            continue;
          }
          failed(std::move(s), reached);
          if (unknown != nullptr) {
            for (size_t i : idx) (*unknown)[i] = reached;
          }
          continue;
        }
        for (size_t j = 0; j < idx.size(); ++j) (*replies)[idx[j]] = std::move(got[j]);
      }
      groups.clear();
      if (unsent.empty()) break;
      router_.MaybeRefresh();
      for (auto& [node, s] : unsent) {
        bool stays = false;  // some command's slot is still the failed node's
        for (size_t i : unsent_idx[node]) {
          Node* now = router_.NodeFor(cmds.key(i));
          if (now != node) groups[now].push_back(i);
          else stays = true;
        }
        if (stays) failed(std::move(s), false);
      }
      unsent.clear();
    }
  }
  for (size_t i = 0; i < cmds.size(); ++i) {
    if (!IsRedirect((*replies)[i].get())) continue;
    bool reached = false;
    StatusOr<Reply> r = Run(op, cmds, i, &reached);
    if (!r.ok()) {
      (*replies)[i].reset();  // not run where it was sent; unknown where it went next
      failed(r.status(), reached);
      if (unknown != nullptr) (*unknown)[i] = reached;
      continue;
    }
    (*replies)[i] = std::move(r).value();
  }
  return first;
}

Status Client::ExecMany(std::string_view op, const std::vector<std::string>& keys,
                        std::vector<Command>& cmds, std::vector<Reply>* replies, bool* sent,
                        std::vector<bool>* unknown) {
  CommandBuffer buf;
  for (size_t i = 0; i < cmds.size(); ++i) buf.Append(cmds[i], keys[i]);
  Status first = ExecMany(op, buf, replies, sent, unknown);
  for (size_t i = 0; i < cmds.size(); ++i) {
    if (!IsNoScript((*replies)[i].get())) continue;
    // Sent again with the script's body (EVAL). Its error replies (a WRONGTYPE,
    // a script's own error) stay replies, as they are when the script was cached:
    // the caller reads them per command (e.g. names the key), and a status is a
    // failure to reach the node only.
    bool reached = false;
    StatusOr<Reply> r = Call(op, keys[i], std::move(cmds[i]), &reached);
    if (!r.ok()) {
      (*replies)[i].reset();
      if (sent != nullptr) *sent = *sent || reached;
      if (unknown != nullptr) (*unknown)[i] = reached;
      if (first.ok()) first = r.status();
      continue;
    }
    (*replies)[i] = std::move(r).value();
  }
  return first;
}

}  // namespace dedup::redis
