// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "serve/http_server.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/duration.h"
#include "core/printable.h"
#include "core/uri.h"
#include "serve/connection_pool.h"

namespace dedup::serve {
namespace {

using SteadyClock = std::chrono::steady_clock;
using TimePoint = SteadyClock::time_point;

constexpr size_t kRecvChunk = 4096;

// poll() for `events` until `until`, never waking before it: > 0 ready (or an
// error or hang-up the next call will report), 0 timed out, < 0 failed.
int WaitFor(int fd, short events, TimePoint until) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - SteadyClock::now());
    const int ms = static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && SteadyClock::now() < until) continue;
    return r;
  }
}

// One of at most `max` connections waiting for a request head, while held.
class WaitingSlot {
 public:
  explicit WaitingSlot(std::atomic<size_t>& waiting) : waiting_(waiting) {}
  WaitingSlot(std::atomic<size_t>& waiting, size_t max) : waiting_(waiting) { Take(max); }
  ~WaitingSlot() { Release(); }
  WaitingSlot(const WaitingSlot&) = delete;
  WaitingSlot& operator=(const WaitingSlot&) = delete;
  bool held() const { return held_; }
  // Takes a place, unless `max` are taken; true when one is held.
  bool Take(size_t max) {
    if (held_) return true;
    size_t n = waiting_.load();
    while (n < max && !waiting_.compare_exchange_weak(n, n + 1)) {
    }
    held_ = n < max;
    return held_;
  }
  // Takes over the place `other` (on the same counter) holds, if any.
  void TakeOver(WaitingSlot& other) {
    if (!other.held_) return;
    Release();
    other.held_ = false;
    held_ = true;
  }
  void Release() {
    if (held_) waiting_.fetch_sub(1);
    held_ = false;
  }

 private:
  std::atomic<size_t>& waiting_;
  bool held_ = false;
};

// As WaitFor, but also ends (0) soon after `listener` is closed (the server's
// stop()): for waits where no request has begun yet, so that stopping the server
// is not held by idle connections or heads still arriving.
int WaitUnlessStopped(int fd, TimePoint until, const std::atomic<socket_t>& listener) {
  constexpr auto kSlice = std::chrono::milliseconds(100);
  for (;;) {
    if (listener == INVALID_SOCKET) return 0;
    const TimePoint now = SteadyClock::now();
    if (now >= until) return 0;
    const int r = WaitFor(fd, POLLIN, std::min(until, now + kSlice));
    if (r != 0) return r;
  }
}

TimePoint After(time_t sec, time_t usec) {
  return SteadyClock::now() + std::chrono::seconds(sec) + std::chrono::microseconds(usec);
}

void IpAndPort(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  if (addr.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port);
  } else if (addr.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
  } else {
    return;
  }
  char host[NI_MAXHOST] = {};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                  NI_NUMERICHOST) == 0) {
    ip = host;
  }
}

const char* Reason(int status) {
  switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Payload Too Large";
    case 414: return "URI Too Long";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return "Error";
  }
}

// Ends a connection whose client does not read its answers: what is queued for
// it is dropped (a reset), not kept by the kernel until the client reads.
void AbortiveClose(int fd) {
  const linger l{1, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
  ::close(fd);
}

// After an answer that ends the connection while the client may still be
// sending: a close with unread bytes would reset the connection, and the client
// could lose the answer. Ends our side, reads what the client still sends for a
// moment, then closes.
void LingeringClose(int fd) {
  ::shutdown(fd, SHUT_WR);
  const TimePoint until = SteadyClock::now() + std::chrono::seconds(1);
  char sink[kRecvChunk];
  while (WaitFor(fd, POLLIN, until) > 0 && ::recv(fd, sink, sizeof(sink), 0) > 0) {
  }
  ::close(fd);
}

// The length of `req`'s body when its head frames it one way only: by no
// Content-Length and no Transfer-Encoding (0), or by Content-Lengths that all
// say the same number. nullopt otherwise: with a Transfer-Encoding (alone, where
// cpp-httplib's lenient reading of a chunked body cannot be checked from here, or
// with a Content-Length, RFC 9112 6.1), or Content-Lengths that differ or are
// not numbers; a proxy in front may have framed such a body otherwise.
std::optional<uint64_t> FramedBodyLength(const httplib::Request& req) {
  if (req.has_header("Transfer-Encoding")) return std::nullopt;
  std::optional<uint64_t> length;
  const auto [from, to] = req.headers.equal_range("Content-Length");
  for (auto it = from; it != to; ++it) {
    const std::string& v = it->second;
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
    if (v.empty() || ec != std::errc() || end != v.data() + v.size() || (length && *length != n)) {
      return std::nullopt;
    }
    length = n;
  }
  return length.value_or(0);
}

}  // namespace

// One connection's bytes: those read ahead of cpp-httplib (the head, and what
// came with it: the body's first bytes, a pipelined request), then the socket.
// Every read from the socket ends at the read timeout or the deadline, whichever
// comes first; only the deadline counts as the request's timeout.
class HttpServer::ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(int fd, std::chrono::microseconds read_timeout,
                   std::chrono::microseconds write_timeout,
                   std::chrono::milliseconds response_timeout, std::atomic<size_t>& waiting)
      : fd_(fd),
        read_timeout_(read_timeout),
        write_timeout_(write_timeout),
        response_timeout_(response_timeout),
        next_wait_(waiting) {}

  // ---- httplib::Stream
  bool is_readable() const override {
    return off_ < buf_.size() || WaitFor(fd_, POLLIN, ReadUntil()) > 0;
  }
  bool is_writable() const override {
    return !write_timed_out_ && WaitFor(fd_, POLLOUT, WriteUntil()) > 0;
  }
  ssize_t read(char* ptr, size_t size) override {
    if (off_ == buf_.size() && size >= kRecvChunk) {
      if (!WaitReadable()) return -1;
      const ssize_t n = Recv(ptr, size);
      if (n > 0) consumed_ += static_cast<size_t>(n);
      return n;
    }
    if (off_ == buf_.size()) {
      // Small reads (cpp-httplib reads lines a byte at a time) come from a chunk.
      if (!WaitReadable()) return -1;
      if (ssize_t n = Fill(); n <= 0) return n;
    }
    const size_t n = std::min(size, buf_.size() - off_);
    std::memcpy(ptr, buf_.data() + off_, n);
    off_ += n;
    consumed_ += n;
    return static_cast<ssize_t>(n);
  }
  // Writes what the socket takes now, within the write timeout and the answer's
  // deadline: never blocked in send() (the socket's SO_SNDTIMEO would let one
  // call wait past the deadline), so a client that reads slowly is given up on
  // time, not only one that does not read at all. Once a write has timed out,
  // every later one fails at once: cpp-httplib ignores how the write of an
  // answer's head went and goes on to its body, whose first write waited a whole
  // write timeout more (a head that stalled cost two).
  ssize_t write(const char* ptr, size_t size) override {
    if (write_timed_out_) return -1;
    // The answer's first byte starts its deadline; an interim 1xx answer
    // (100 Continue, before the body is read) does not.
    static constexpr std::string_view kInterim = "HTTP/1.1 1";
    if (write_deadline_ == TimePoint::max() &&
        std::string_view(ptr, std::min(size, kInterim.size())) != kInterim) {
      write_deadline_ = SteadyClock::now() + response_timeout_;
    }
    for (;;) {
      // Past the deadline nothing more is written, writable or not.
      if (SteadyClock::now() >= write_deadline_ || WaitFor(fd_, POLLOUT, WriteUntil()) <= 0) {
        write_timed_out_ = true;
        return -1;
      }
      const ssize_t n = ::send(fd_, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      return n;
    }
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getpeername(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) IpAndPort(addr, len, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    if (getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) == 0) IpAndPort(addr, len, ip, port);
  }
  socket_t socket() const override { return fd_; }

  // ---- per request
  // Drops what the last request consumed; true when bytes of the next are here.
  bool NextRequest() {
    buf_.erase(0, off_);
    off_ = 0;
    scan_ = 0;
    deadline_ = TimePoint::max();
    timed_out_ = false;
    write_deadline_ = TimePoint::max();
    consumed_ = 0;
    head_bytes_ = 0;
    body_length_ = std::nullopt;
    hidden_ranges_.clear();
    empty_fields_.clear();
    malformed_.clear();
    return !buf_.empty();
  }

  enum class Head {
    kRead, kClosed, kTimedOut, kTooLarge, kMalformed, kBodyTooLarge, kUnknownMethod
  };
  // Reads until the buffered bytes hold a whole request head, by `deadline` and
  // within `max_bytes`. kBodyTooLarge: its Content-Length is over `max_body`;
  // kUnknownMethod: a method cpp-httplib does not read (method()).
  Head ReadHead(TimePoint deadline, size_t max_bytes, size_t max_body,
                const std::atomic<socket_t>& listener) {
    for (;;) {
      if (HeadBuffered()) {
        if (malformed_ = MalformedLine(); !malformed_.empty()) return Head::kMalformed;
        if (malformed_ = OriginForm(); !malformed_.empty()) return Head::kMalformed;
        if (declared_length_ > max_body) return Head::kBodyTooLarge;
        if (!KnownMethod()) return Head::kUnknownMethod;
        if (!framed_) FrameAsEmpty();
        HideRanges();
        KeepEmptyFields();
        KeepFieldValues();
        head_bytes_ = head_end_ - off_;
        return Head::kRead;
      }
      if (buf_.size() - off_ >= max_bytes) return Head::kTooLarge;
      int r = WaitUnlessStopped(fd_, deadline, listener);
      if (r == 0 && listener == INVALID_SOCKET) return Head::kClosed;  // stopping
      if (r == 0) {
        // Past the deadline, what has arrived still counts (a head that came
        // while its connection waited for a thread); within max_bytes.
        pollfd p{fd_, POLLIN, 0};
        r = ::poll(&p, 1, 0);
        if (r == 0) return Head::kTimedOut;
      }
      if (r < 0 || Fill() <= 0) return Head::kClosed;
    }
  }
  // What is wrong with the head ReadHead found kMalformed.
  const std::string& malformed() const { return malformed_; }
  // The request line's method (escaped, cut), for kUnknownMethod.
  std::string method() const { return internal::PrintableCut(Method(), 32); }
  // The head's Content-Length (0 when it has none).
  uint64_t declared_length() const { return declared_length_; }
  // The values of the Range fields HideRanges took out of the request's head,
  // in order, as sent (spaces and tabs around them trimmed).
  std::vector<std::string> TakeHiddenRanges() { return std::move(hidden_ranges_); }
  // The names of the header fields with an empty value KeepEmptyFields found in
  // the request's head, in order.
  std::vector<std::string> TakeEmptyFields() { return std::move(empty_fields_); }
  // The length of the buffered request line so far (to its '\n', or all).
  size_t RequestLineBytes() const {
    const size_t nl = buf_.find('\n', off_);
    return (nl == std::string::npos ? buf_.size() : nl + 1) - off_;
  }

  // Bytes of the request's body cpp-httplib has read so far (after the head
  // ReadHead found).
  size_t body_bytes_read() const { return consumed_ - std::min(consumed_, head_bytes_); }

  void set_deadline(TimePoint deadline) { deadline_ = deadline; }
  bool timed_out() const { return timed_out_; }
  // A write missed the write timeout or the answer's deadline: the connection
  // cannot carry another answer.
  bool write_timed_out() const { return write_timed_out_; }
  // A place among the connections waiting for a request head, for the wait
  // for this connection's next request: taken as its answer is about to say the
  // connection is kept (HttpServer's post-routing handler), not once that answer
  // is written, when the places may have filled meanwhile and the connection
  // would be closed after an answer that said it was kept. False when
  // `max` are taken: the answer says Connection: close instead.
  bool ReserveNextWait(size_t max) { return next_wait_.Take(max); }
  WaitingSlot& next_wait() { return next_wait_; }
  // The answer being written says Connection: close, as the waiting places
  // were full (HttpServer's post-routing handler): the connection ends after it.
  void set_close_announced() { close_announced_ = true; }
  bool close_announced() const { return close_announced_; }
  // The request's body length as its head frames it (FramedBodyLength).
  void set_body_length(std::optional<uint64_t> n) { body_length_ = n; }
  // The request's body is not read whole (a request refused before it, a GET's
  // body), or its framing was ambiguous: where the next request starts is not
  // known, and the connection ends after the answer.
  bool body_left() const { return body_length_ != body_bytes_read(); }

 private:
  TimePoint ReadUntil() const {
    return std::min(SteadyClock::now() + read_timeout_, deadline_);
  }
  TimePoint WriteUntil() const {
    return std::min(SteadyClock::now() + write_timeout_, write_deadline_);
  }
  bool WaitReadable() {
    if (WaitFor(fd_, POLLIN, ReadUntil()) > 0) return true;
    if (SteadyClock::now() >= deadline_) timed_out_ = true;
    return false;
  }
  ssize_t Recv(char* ptr, size_t size) {
    ssize_t n;
    do {
      n = ::recv(fd_, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    return n;
  }
  // Appends one chunk from the socket (which is readable) to the buffer.
  ssize_t Fill() {
    if (off_ == buf_.size()) {
      buf_.clear();
      off_ = 0;
      scan_ = 0;
    }
    const size_t had = buf_.size();
    buf_.resize(had + kRecvChunk);
    const ssize_t n = Recv(buf_.data() + had, kRecvChunk);
    buf_.resize(had + static_cast<size_t>(std::max<ssize_t>(n, 0)));
    return n;
  }
  // Whether the buffer holds the end of a head: the first line that is exactly
  // "\r\n" after the request line, where cpp-httplib stops reading headers. A
  // bare "\n" ends no head: cpp-httplib (built without
  // CPPHTTPLIB_ALLOW_LF_AS_LINE_TERMINATOR, as Debian's is) skips a line that
  // does not end in "\r\n" and reads on, so a head ended here at "\n\n" would
  // let it read further header lines past the head's deadline and size bound.
  bool HeadBuffered() {
    // The request line ends at the first '\n'; every later line starts after a
    // '\n', so the blank line is the first "\n\r\n".
    static constexpr std::string_view kEnd = "\n\r\n";
    const size_t from = std::max(scan_, off_);
    const size_t at = std::string_view(buf_).find(kEnd, from);
    if (at == std::string_view::npos) {
      // Bytes still to come decide a "\n" or "\n\r" at the end.
      scan_ = std::max(from, buf_.size() >= kEnd.size() - 1 ? buf_.size() - (kEnd.size() - 1) : 0);
      return false;
    }
    head_end_ = at + kEnd.size();
    return true;
  }

  // Why the buffered head is refused before cpp-httplib parses it, or "": a
  // header line cpp-httplib would skip without a word, where a peer in front
  // may read it, and the two would see different requests (a skipped
  // "Transfer-Encoding: chunked" framed the body otherwise in front, and what
  // was body there was a request of its own here: request smuggling). Those
  // are a line that ends in a bare LF (RFC 9112 2.2 lets a recipient take it as
  // a line's end), an obs-fold continuation (RFC 9112 5.2: rejected with 400,
  // or unfolded; never dropped) and a line without a colon; and one over
  // cpp-httplib's bound on a line, which it refused with a bare 400.
  //
  // And the fields that frame the request, which a server in front and this one
  // must read alike (RFC 9112 6.3): a Content-Length that is not one run of
  // digits ("abc", "+3", "3, 3": cpp-httplib read a prefix of it or 0, and ran
  // the request with a body cut short), two Content-Length or Host fields, a
  // Transfer-Encoding that is not "chunked" alone, one beside a Content-Length,
  // and an HTTP/1.1 request without a Host (RFC 9112 3.2).
  std::string MalformedLine() {
    declared_length_ = 0;
    framed_ = false;
    size_t line = buf_.find('\n', off_);  // the request line's end
    if (line == std::string::npos || line >= head_end_) return "";
    const std::string_view request_line(buf_.data() + off_, line - off_);
    int content_lengths = 0, hosts = 0, transfer_encodings = 0;
    for (++line; line + 2 < head_end_;) {  // up to the blank line
      const size_t next = buf_.find('\n', line) + 1;  // within the head
      const std::string_view text(buf_.data() + line, next - line);
      line = next;
      if (text.size() < 2 || text[text.size() - 2] != '\r') {
        return "a header line ends in a bare LF, not CRLF (RFC 9112 2.2)";
      }
      if (text.front() == ' ' || text.front() == '\t') {
        return "a header line begins with whitespace: obs-fold (RFC 9112 5.2)";
      }
      const size_t colon = text.find(':');
      if (colon == std::string_view::npos) {
        return "a header line has no colon (RFC 9112 5)";
      }
      // cpp-httplib's bound on a line, as it will read it: a Range line goes
      // as sent (HideRanges), every other with each '%' in its value written
      // "%25" (KeepFieldValues). Over it, cpp-httplib answered a bare 400.
      size_t size = text.size();
      if (!IsRangeLine(text)) {
        size += 2 * static_cast<size_t>(
                        std::count(text.begin() + static_cast<ptrdiff_t>(colon), text.end(), '%'));
      }
      if (size > CPPHTTPLIB_HEADER_MAX_LENGTH) {
        return "a header line is longer than 8 KiB (" + std::to_string(CPPHTTPLIB_HEADER_MAX_LENGTH) +
               " bytes with its CRLF, each '%' in its value counted as three)";
      }
      const std::string_view name = text.substr(0, colon);
      std::string_view value = text.substr(colon + 1, text.size() - colon - 3);  // less CRLF
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
      while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
      if (NameIs(name, "content-length")) {
        if (++content_lengths > 1) return "two Content-Length fields (RFC 9112 6.3)";
        // Digits only ("+3", "-0", "3, 3" are refused), within a long long.
        auto length = internal::ParseCount(value, "Content-Length");
        if (!length.ok()) {
          return "Content-Length '" + internal::PrintableCut(value, 64) +
                 "' is not a number of bytes (RFC 9112 6.3: digits only, one value)";
        }
        declared_length_ = static_cast<uint64_t>(*length);
      } else if (NameIs(name, "transfer-encoding")) {
        if (++transfer_encodings > 1) return "two Transfer-Encoding fields";
        if (!NameIs(value, "chunked")) {
          return "Transfer-Encoding '" + internal::PrintableCut(value, 64) +
                 "' (only 'chunked' is read here)";
        }
      } else if (NameIs(name, "host")) {
        if (++hosts > 1) return "two Host fields (RFC 9112 3.2)";
      }
    }
    framed_ = content_lengths > 0 || transfer_encodings > 0;
    if (content_lengths > 0 && transfer_encodings > 0) {
      return "both Content-Length and Transfer-Encoding (RFC 9112 6.1: the two may frame the body "
             "differently)";
    }
    if (hosts == 0 && request_line.ends_with(" HTTP/1.1\r")) {
      return "an HTTP/1.1 request without a Host field (RFC 9112 3.2)";
    }
    return "";
  }

  // RFC 9112 3.2.2: a server accepts a target in absolute-form ("POST
  // http://127.0.0.1:8077/v1/keys/a/claim HTTP/1.1", what a client set up for a
  // forward proxy sends) and takes the host from it, ignoring Host. cpp-httplib
  // read the whole URL as the path: the API answered 404 "no such route", and
  // the proxy forwarded it to the application as sent, past its checks of
  // dedup's own paths (/_dedup/...). The target is rewritten to origin-form
  // ("/v1/keys/a/claim", "/" for none) and the Host field's value (or a Host
  // field added, for HTTP/1.0) to the target's authority, before cpp-httplib
  // reads the head: every check after sees the request as if sent to the host
  // named. Only "http" and "https" targets; "*" and other schemes go as sent.
  std::string OriginForm() {
    const size_t nl = buf_.find('\n', off_);
    if (nl == std::string::npos || nl >= head_end_) return "";
    const size_t sp1 = buf_.find(' ', off_);
    if (sp1 == std::string::npos || sp1 >= nl) return "";
    const size_t start = sp1 + 1;
    const size_t end = std::min(buf_.find(' ', start), nl);
    const std::string_view target(buf_.data() + start, end - start);
    size_t scheme = 0;
    if (target.size() > 7 && NameIs(target.substr(0, 7), "http://")) scheme = 7;
    if (target.size() > 8 && NameIs(target.substr(0, 8), "https://")) scheme = 8;
    if (scheme == 0) return "";
    const size_t auth_end = std::min(target.find_first_of("/?#", scheme), target.size());
    const std::string authority(target.substr(scheme, auth_end - scheme));
    if (authority.empty()) return "an absolute-form request target without a host (RFC 9112 3.2.2)";
    if (authority.find('@') != std::string::npos) {
      return "a request target with user information (RFC 9110 4.2.4: not sent in http URIs)";
    }
    for (unsigned char c : authority) {
      if (c <= ' ' || c >= 0x7f) return "a control byte or space in the request target's host";
    }
    std::string path(target.substr(auth_end));
    if (path.empty() || path.front() != '/') path.insert(0, "/");
    buf_.replace(start, end - start, path);
    head_end_ = head_end_ + path.size() - target.size();
    // The Host field: its value replaced (MalformedLine allowed one at most).
    size_t line = buf_.find('\n', off_) + 1;
    while (line + 2 < head_end_) {
      const size_t next = buf_.find('\n', line) + 1;
      const size_t colon = buf_.find(':', line);
      if (colon < next && NameIs(std::string_view(buf_).substr(line, colon - line), "host")) {
        const std::string value = " " + authority;
        buf_.replace(colon + 1, next - 2 - (colon + 1), value);
        head_end_ = head_end_ + value.size() - (next - 2 - (colon + 1));
        return "";
      }
      line = next;
    }
    const std::string field = "Host: " + authority + "\r\n";
    buf_.insert(head_end_ - 2, field);
    head_end_ += field.size();
    return "";
  }

  // Whether the method is one cpp-httplib reads; it answered any other (PROPFIND,
  // TRACE, a typo) with a bare 400 that spoke of a missing body.
  bool KnownMethod() const {
    const std::string_view m = Method();
    if (m.size() == head_end_ - off_) return true;  // no space in the head: its own 400
    return m == "GET" || m == "HEAD" || m == "POST" || m == "PUT" || m == "DELETE" ||
           m == "OPTIONS" || m == "PATCH";
  }

  // A POST, PUT or PATCH with neither Content-Length nor Transfer-Encoding has an
  // empty body (RFC 9112 6.3), which cpp-httplib refused with 400 ("curl -X POST"
  // sends such a request): "Content-Length: 0" is added to its head.
  void FrameAsEmpty() {
    const std::string_view m = Method();
    if (m != "POST" && m != "PUT" && m != "PATCH") return;
    static constexpr std::string_view kZero = "Content-Length: 0\r\n";
    buf_.insert(head_end_ - 2, kZero);
    head_end_ += kZero.size();
  }

  // The buffered head's method: up to the request line's first space (the whole
  // head when it has none).
  std::string_view Method() const {
    const size_t sp = std::min(buf_.find(' ', off_), head_end_);
    return std::string_view(buf_).substr(off_, sp - off_);
  }

  // Whether a field name (or token) is `lower`, in any case.
  static bool NameIs(std::string_view name, std::string_view lower) {
    if (name.size() != lower.size()) return false;
    for (size_t i = 0; i < lower.size(); ++i) {
      if (std::tolower(static_cast<unsigned char>(name[i])) != lower[i]) return false;
    }
    return true;
  }

  // Whether a header line (with its line end) names the Range field: "Range:"
  // in any case, as cpp-httplib reads the name.
  static bool IsRangeLine(std::string_view text) {
    static constexpr std::string_view kName = "range:";
    return text.size() >= kName.size() && NameIs(text.substr(0, kName.size()), kName);
  }

  // Takes the Range fields out of the buffered head (head_end_ moves back) before
  // cpp-httplib parses it, and keeps their values for TakeHiddenRanges:
  // cpp-httplib answers 416 to a Range it cannot parse (another unit than bytes,
  // a backwards range) before serve sees the request, where serve ignores a
  // Range on its own answers (RFC 9110 14.2) and in proxy mode the application
  // must get it as sent. The lines taken are those cpp-httplib would read as a
  // Range field: "Range:" in any case, ending in CRLF, at most
  // CPPHTTPLIB_HEADER_MAX_LENGTH bytes (a longer one is left for it to refuse,
  // 400), with a value once the spaces and tabs around it are trimmed (an empty
  // one it skips).
  void HideRanges() {
    hidden_ranges_.clear();
    static constexpr std::string_view kName = "range:";
    size_t line = buf_.find('\n', off_);  // the request line's end
    if (line == std::string::npos || line >= head_end_) return;
    for (++line; line < head_end_;) {
      const size_t next = buf_.find('\n', line) + 1;  // within the head
      std::string_view text(buf_.data() + line, next - line);
      bool range = text.size() >= kName.size() + 2 && text.size() <= CPPHTTPLIB_HEADER_MAX_LENGTH &&
                   text.substr(text.size() - 2) == "\r\n";
      for (size_t i = 0; range && i < kName.size(); ++i) {
        range = std::tolower(static_cast<unsigned char>(text[i])) == kName[i];
      }
      if (range) {
        std::string_view value = text.substr(kName.size(), text.size() - kName.size() - 2);
        while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
          value.remove_prefix(1);
        }
        while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) {
          value.remove_suffix(1);
        }
        if (!value.empty()) {
          hidden_ranges_.emplace_back(value);
          buf_.erase(line, next - line);
          head_end_ -= next - line;
          continue;
        }
      }
      line = next;
    }
  }

  // Notes the names of the header fields whose value is empty, for
  // TakeEmptyFields: cpp-httplib drops them, so that an empty Idempotency-Key
  // sent to the proxy was no key at all, the request forwarded unprotected (a
  // retry ran it again) where it is refused, 400. The lines cpp-httplib would
  // have read as a field but for its empty value: ending in CRLF, at most
  // CPPHTTPLIB_HEADER_MAX_LENGTH bytes, a name before the first ':', nothing but
  // spaces and tabs after it.
  void KeepEmptyFields() {
    empty_fields_.clear();
    size_t line = buf_.find('\n', off_);  // the request line's end
    if (line == std::string::npos || line >= head_end_) return;
    for (++line; line < head_end_;) {
      const size_t next = buf_.find('\n', line) + 1;  // within the head
      std::string_view text(buf_.data() + line, next - line);
      line = next;
      if (text.size() < 3 || text.size() > CPPHTTPLIB_HEADER_MAX_LENGTH ||
          text.substr(text.size() - 2) != "\r\n") {
        continue;
      }
      text.remove_suffix(2);
      const size_t colon = text.find(':');
      if (colon == 0 || colon == std::string_view::npos ||
          text.find_first_not_of(" \t", colon + 1) != std::string_view::npos) {
        continue;
      }
      empty_fields_.emplace_back(text.substr(0, colon));
    }
  }

  // cpp-httplib (0.11) percent-decodes the value of every header field it reads:
  // "a%41b" reached the handlers, and in proxy mode the application, as "aAb",
  // two Idempotency-Keys that differ only in an escape were one key, and
  // "%0D%0A" became a line break, forwarded as a header line of its own (a
  // client's forged Dedup-Fence). So each '%' after the first ':' of a header
  // line is written "%25" in the buffered head (head_end_ moves on), which that
  // decoding gives back as '%': the values arrive as sent. In one pass, so that
  // a head full of '%' costs its length, not its square.
  void KeepFieldValues() {
    const size_t line = buf_.find('\n', off_) + 1;  // after the request line
    if (line == 0 || line >= head_end_) return;
    const std::string_view fields(buf_.data() + line, head_end_ - line);
    if (fields.find('%') == std::string_view::npos) return;
    std::string out;
    out.reserve(fields.size() + fields.size() / 4);
    bool value = false;  // past the line's first ':'
    for (const char c : fields) {
      out += c;
      if (c == '\n') {
        value = false;
      } else if (c == ':') {
        value = true;
      } else if (c == '%' && value) {
        out += "25";
      }
    }
    buf_.replace(line, fields.size(), out);
    head_end_ = line + out.size();
  }

  const int fd_;
  const std::chrono::microseconds read_timeout_, write_timeout_;
  const std::chrono::milliseconds response_timeout_;
  std::string buf_;
  size_t off_ = 0;   // the next byte cpp-httplib reads
  size_t scan_ = 0;  // where HeadBuffered goes on
  size_t head_end_ = 0;    // in buf_, past the head HeadBuffered found
  size_t head_bytes_ = 0;  // the size of the request's head
  size_t consumed_ = 0;    // bytes of the request handed to cpp-httplib
  TimePoint deadline_ = TimePoint::max();
  bool timed_out_ = false;
  TimePoint write_deadline_ = TimePoint::max();  // the answer's, from its first byte
  bool write_timed_out_ = false;                 // for good: the connection ends
  bool close_announced_ = false;                 // for good: the connection ends
  std::optional<uint64_t> body_length_;
  WaitingSlot next_wait_;  // ReserveNextWait
  std::vector<std::string> hidden_ranges_;  // HideRanges
  std::vector<std::string> empty_fields_;   // KeepEmptyFields
  std::string malformed_;                   // MalformedLine
  uint64_t declared_length_ = 0;            // MalformedLine: the Content-Length
  bool framed_ = false;                     // MalformedLine: a Content-Length or
                                            // Transfer-Encoding field
};

namespace {
// A value no header sent holds (a NUL: the proxy replaces those in an
// application's values): HttpServer's pre-routing handler's mark on a HEAD's
// answer, never written.
const std::string kNoRangesPlaceholder(1, '\0');
}  // namespace

HttpServer::HttpServer() {
  // cpp-httplib answers a body it could not read 400; the body's deadline is
  // what passed: 408, and the connection is closed after the answer (the
  // request is the server's own object, handed over as const).
  httplib::Server::set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (BodyTimedOut(req)) {
      auto& headers = const_cast<httplib::Headers&>(req.headers);
      headers.erase("Connection");
      headers.emplace("Connection", "close");
      Refuse(Limit::kBodyTimeout, res);
      return;
    }
    if (error_handler_) error_handler_(req, res);
  });
  // cpp-httplib (0.11) adds "Accept-Ranges: bytes" to the answer to every HEAD
  // that has none, just before the post-routing handler, though no route serves
  // a range (a Range is ignored: HideRanges) and the GET of the same route says
  // nothing of ranges. So a HEAD's answer gets a placeholder Accept-Ranges before
  // routing, which keeps cpp-httplib from adding one, and the placeholder is
  // taken out below; one a handler sets (an application's, through the proxy)
  // stays. A HEAD's answer without the placeholder was never routed (a head
  // cpp-httplib refused itself): no handler set the Accept-Ranges it has.
  httplib::Server::set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (req.method == "HEAD") res.headers.emplace("Accept-Ranges", kNoRangesPlaceholder);
        return pre_routing_handler_ ? pre_routing_handler_(req, res)
                                    : httplib::Server::HandlerResponse::Unhandled;
      });
  // Just before an answer is written: the connection takes its place among
  // those waiting for a head now, for the wait for its next request; when
  // max_waiting_ connections already wait, it could not wait (it is closed after
  // its answer), so the answer says so. A client that is not told sends its next
  // request on the connection closed under it, and fails; and the place is taken
  // before the answer is written, not after, so that the places filling while it
  // is written cannot close a connection its answer said was kept.
  // And every answer after which the connection ends says so: one to a head
  // cpp-httplib refused itself (400, 414; not handed to serve, so not
  // answering_), or one that left the request's body unread.
  httplib::Server::set_post_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (req.method == "HEAD") {
          bool routed = false;
          for (auto [it, end] = res.headers.equal_range("Accept-Ranges"); it != end;) {
            if (it->second == kNoRangesPlaceholder) {
              routed = true;
              it = res.headers.erase(it);
            } else {
              ++it;
            }
          }
          if (!routed) res.headers.erase("Accept-Ranges");
        }
        bool close = true;
        {
          std::lock_guard<std::mutex> lock(answering_mu_);
          if (const auto it = answering_.find(&req); it != answering_.end()) {
            ConnectionStream& strm = *it->second;
            // (Not for an answer cpp-httplib already says Connection: close
            // on: the connection ends after it anyway.)
            if (!strm.body_left() && res.get_header_value("Connection") != "close" &&
                !strm.ReserveNextWait(max_waiting_)) {
              strm.set_close_announced();
            }
            close = strm.body_left() || strm.close_announced();
          }
        }
        if (close) {
          res.headers.erase("Keep-Alive");
          res.headers.erase("Connection");
          res.set_header("Connection", "close");
        }
        if (post_routing_handler_) post_routing_handler_(req, res);
      });
}

void HttpServer::Configure(const HttpServerOptions& o) {
  deadlines_ = o.deadlines;
  max_waiting_ = o.max_waiting != 0
                     ? o.max_waiting
                     : std::max<size_t>(1, o.max_connections -
                                               std::max<size_t>(1, o.max_connections / 4));
  new_task_queue = [n = o.threads, m = o.max_connections] { return new ConnectionPool(n, m); };
  set_payload_max_length(o.max_body_bytes);
  max_body_bytes_ = o.max_body_bytes;
  // Per read or write; the whole head, body and answer have their deadlines.
  set_read_timeout(std::chrono::seconds(10));
  set_write_timeout(std::chrono::seconds(10));
  // How long an idle connection (before its first request, or between two)
  // holds its thread.
  set_keep_alive_timeout(5);
  set_keep_alive_max_count(1000);
  set_tcp_nodelay(true);
  // SO_REUSEADDR only (a restart binds at once past TIME_WAIT). cpp-httplib's
  // default also sets SO_REUSEPORT, with which a second `dedup serve` on the
  // same port bound without an error and the kernel split the connections
  // between the two: two stores answering for one key, one of them perhaps
  // without the other's token.
  set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
}

namespace {
// Why `host`:`port` cannot be bound, as errno after the attempt cpp-httplib makes
// (getaddrinfo with AI_PASSIVE, then per address: socket, SO_REUSEADDR as set
// in Configure(), bind); cpp-httplib itself answers only false. EADDRINUSE if
// any address is in use (a name of two addresses, one held by another process
// and one not this host's, such as localhost with ::1 and no IPv6: the held one
// is what to report); else the last address's. 0 when one binds now (the port
// came free in between).
int BindErrno(const std::string& host, int port, std::string* resolve_error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    *resolve_error = gai_strerror(rc);
    return EINVAL;
  }
  int err = EADDRNOTAVAIL;
  bool in_use = false;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    const int rc = ::bind(fd, a->ai_addr, a->ai_addrlen);
    err = rc == 0 ? 0 : errno;
    ::close(fd);
    if (rc == 0) break;
    in_use = in_use || err == EADDRINUSE;
  }
  freeaddrinfo(res);
  return err != 0 && in_use ? EADDRINUSE : err;
}
}  // namespace

Status HttpServer::Bind(const std::string& host, int port, int* bound) {
  if (port == 0) {
    const int p = bind_to_any_port(host);
    if (p > 0) {
      *bound = p;
      return Status::Ok();
    }
  } else if (bind_to_port(host, port)) {
    *bound = port;
    return Status::Ok();
  }
  const std::string where = (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                            ":" + std::to_string(port);
  std::string resolve_error;
  const int err = BindErrno(host, port, &resolve_error);
  if (!resolve_error.empty()) {
    return Status::InvalidArgument("cannot listen on " + where + ": the host does not resolve (" +
                                   resolve_error + ")");
  }
  if (err == EADDRINUSE) {
    return Status::Unavailable("cannot listen on " + where +
                               ": address in use (another process listens there)");
  }
  if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
    // Out of descriptors or memory for now: nothing wrong with the address.
    return Status::ResourceExhausted("cannot listen on " + where + ": " + std::strerror(err));
  }
  if (err == EADDRNOTAVAIL) {
    return Status::InvalidArgument("cannot listen on " + where + ": not an address of this host");
  }
  if (err == 0) {
    // Free when asked again: whatever held it has let go; a second try may bind.
    return Status::Unavailable("cannot listen on " + where + ": it was in use a moment ago");
  }
  return Status::InvalidArgument("cannot listen on " + where + ": " + std::strerror(err));
}

const char* HttpServer::TimeoutPart(Limit limit) {
  switch (limit) {
    case Limit::kHeadTimeout: return "head";
    case Limit::kBodyTimeout: return "body";
    case Limit::kResponseTimeout: return "response";
    default: return "";
  }
}

void HttpServer::Refuse(Limit limit, httplib::Response& res, const std::string& why) const {
  std::string detail;
  switch (limit) {
    case Limit::kMalformedHead:
      res.status = 400;
      detail = "the request head is malformed: " + why;
      break;
    case Limit::kHeadTimeout:
      res.status = 408;
      detail = "the request head did not arrive within " +
               internal::FormatDuration(deadlines_.header_timeout);
      break;
    case Limit::kBodyTimeout:
      res.status = 408;
      detail = "the request body did not arrive within " +
               internal::FormatDuration(deadlines_.body_timeout) + " of its head";
      break;
    case Limit::kUriTooLong:
      res.status = 414;
      detail = "the request line is longer than 8 KiB";
      break;
    case Limit::kUnknownMethod:
      res.status = 501;
      detail = "the method '" + why +
               "' is not one serve reads (GET, HEAD, POST, PUT, DELETE, OPTIONS, PATCH)";
      break;
    case Limit::kBodyTooLarge:
      res.status = 413;
      detail = "the request body (Content-Length: " + why + ") is larger than " +
               std::to_string(max_body_bytes_) + " bytes";
      break;
    case Limit::kHeadTooLarge:
      res.status = 431;
      detail = "the request head is larger than " + std::to_string(deadlines_.max_head_bytes) +
               " bytes";
      break;
    case Limit::kWaitingFull:
      res.status = 503;
      res.set_header("Retry-After", "1");
      detail = std::to_string(max_waiting_) +
               " connections are already waiting for their request heads, and this one's "
               "did not come with it";
      break;
    case Limit::kResponseTimeout:
    case Limit::kWaitingFullIdle:
      if (limit_handler_) limit_handler_(limit, nullptr);
      return;
  }
  // The detail may echo the request (a method, a Content-Length), escaped
  // already (no control byte); its quotes and backslashes are escaped for JSON.
  std::string json_detail;
  for (char c : detail) {
    if (c == '"' || c == '\\') json_detail += '\\';
    json_detail += c;
  }
  res.set_content(std::string("{\"type\":\"about:blank\",\"title\":\"") + Reason(res.status) +
                      "\",\"status\":" + std::to_string(res.status) + ",\"detail\":\"" +
                      json_detail + "\"}",
                  "application/problem+json");
  if (limit_handler_) limit_handler_(limit, &res);
}

bool HttpServer::BodyTimedOut(const httplib::Request& req) const {
  std::lock_guard<std::mutex> lock(answering_mu_);
  const auto it = answering_.find(&req);
  return it != answering_.end() && it->second->timed_out();
}

bool HttpServer::process_and_close_socket(socket_t sock) {
  ConnectionStream strm(
      sock, std::chrono::seconds(read_timeout_sec_) + std::chrono::microseconds(read_timeout_usec_),
      std::chrono::seconds(write_timeout_sec_) + std::chrono::microseconds(write_timeout_usec_),
      deadlines_.response_timeout, waiting_);
  bool ret = false;
  bool linger = false;
  bool abort = false;
  bool first = true;
  for (size_t left = keep_alive_max_count_; left > 0 && svr_sock_ != INVALID_SOCKET;
       --left, first = false) {
    const bool buffered = strm.NextRequest();
    // Waiting for a head: one of at most max_waiting_ connections (the place
    // taken as the last answer said the connection is kept), or else only for a
    // moment.
    WaitingSlot slot(waiting_);
    slot.TakeOver(strm.next_wait());
    slot.Take(max_waiting_);
    TimePoint head_deadline;
    if (slot.held()) {
      // Idle: the first byte of the next request, for at most the keep-alive
      // timeout. Both this wait and the head's end when the server stops: no
      // request has begun, nothing is lost.
      if (!buffered &&
          WaitUnlessStopped(sock, After(keep_alive_timeout_sec_, 0), svr_sock_) <= 0) {
        break;
      }
      head_deadline = SteadyClock::now() + deadlines_.header_timeout;
    } else if (!first && !buffered) {
      // Kept alive, and enough connections wait: this one is closed rather than
      // left to wait for its next request (the client opens another). Not
      // after an answer that said the connection is kept: that one took its
      // place then (ReserveNextWait), and holds it here.
      httplib::Response unused;
      Refuse(Limit::kWaitingFullIdle, unused);
      break;
    } else {
      // Within the grace of its accept: a connection that waited in the queue
      // longer has its head there already, or is shed at once.
      const TimePoint now = SteadyClock::now();
      const TimePoint queued = ConnectionPool::QueuedAt();
      const TimePoint accepted = first && queued != TimePoint::min() ? queued : now;
      head_deadline = std::min(accepted + kWaitingFullGrace, now + deadlines_.header_timeout);
    }
    const ConnectionStream::Head head =
        strm.ReadHead(head_deadline, deadlines_.max_head_bytes, max_body_bytes_, svr_sock_);
    const bool shed = !slot.held() && head == ConnectionStream::Head::kTimedOut;
    slot.Release();
    if (head == ConnectionStream::Head::kClosed) break;
    if (head != ConnectionStream::Head::kRead) {
      httplib::Response res;
      Refuse(shed ? Limit::kWaitingFull
             : head == ConnectionStream::Head::kTimedOut ? Limit::kHeadTimeout
             : head == ConnectionStream::Head::kMalformed ? Limit::kMalformedHead
             : head == ConnectionStream::Head::kBodyTooLarge ? Limit::kBodyTooLarge
             : head == ConnectionStream::Head::kUnknownMethod ? Limit::kUnknownMethod
             : strm.RequestLineBytes() > CPPHTTPLIB_REQUEST_URI_MAX_LENGTH ? Limit::kUriTooLong
                                                                           : Limit::kHeadTooLarge,
             res, head == ConnectionStream::Head::kBodyTooLarge ? std::to_string(strm.declared_length())
                  : head == ConnectionStream::Head::kUnknownMethod ? strm.method()
                                                                   : strm.malformed());
      std::string out = "HTTP/1.1 " + std::to_string(res.status) + " " + Reason(res.status) + "\r\n";
      for (const auto& [name, value] : res.headers) {
        if (name != "Connection" && name != "Content-Length") out += name + ": " + value + "\r\n";
      }
      out += "Content-Length: " + std::to_string(res.body.size()) + "\r\nConnection: close\r\n\r\n";
      out += res.body;
      for (size_t at = 0; at < out.size();) {
        const ssize_t n = strm.write(out.data() + at, out.size() - at);
        if (n <= 0) break;
        at += static_cast<size_t>(n);
      }
      if (strm.write_timed_out()) {
        Refuse(Limit::kResponseTimeout, res);
        abort = true;
      }
      // A connection shed is closed at once: reading what it still sends for
      // a second would hold the thread it was shed to free.
      linger = !shed;
      break;
    }
    strm.set_deadline(SteadyClock::now() + deadlines_.body_timeout);
    bool connection_closed = false;
    // cpp-httplib hands over each request once it has parsed its head: from then
    // until its answer is written, BodyTimedOut finds this connection from it.
    struct Answering {
      HttpServer& server;
      const httplib::Request* parsed = nullptr;
      std::optional<uint64_t> body_length;  // FramedBodyLength
      ~Answering() {
        if (parsed == nullptr) return;
        std::lock_guard<std::mutex> lock(server.answering_mu_);
        server.answering_.erase(parsed);
      }
    } answering{*this, nullptr, std::nullopt};
    ret = process_request(strm, /*close_connection=*/left == 1, connection_closed,
                          [this, &strm, &answering](httplib::Request& req) {
                            {
                              std::lock_guard<std::mutex> lock(answering_mu_);
                              answering_.emplace(&req, &strm);
                            }
                            answering.parsed = &req;
                            // Answers go whole: a Range is ignored (RFC 9110
                            // 14.2 allows it). cpp-httplib cut every answer to
                            // it under the answer's own status (a claim's 201
                            // without its token) and, in proxy mode, cut an
                            // application's 206 again; and answered 416 to one
                            // it could not parse. So it never sees one
                            // (HideRanges): req.ranges stays empty, and the
                            // header is given back here, as sent, for the
                            // application.
                            for (std::string& v : strm.TakeHiddenRanges()) {
                              req.headers.emplace("Range", std::move(v));
                            }
                            // And the fields it dropped for their empty value.
                            for (std::string& name : strm.TakeEmptyFields()) {
                              req.headers.emplace(std::move(name), "");
                            }
                            // The framing from every field, those given back
                            // included: an empty Transfer-Encoding or
                            // Content-Length cpp-httplib did not see ends the
                            // connection as any other does (a peer in front may
                            // have framed the body otherwise).
                            answering.body_length = FramedBodyLength(req);
                            strm.set_body_length(answering.body_length);
                            if (!answering.body_length) {
                              // The connection ends after this request: say so
                              // in the answer (cpp-httplib writes what the
                              // request's Connection asks for).
                              req.headers.erase("Connection");
                              req.headers.emplace("Connection", "close");
                            }
                          });
    if (strm.write_timed_out()) {
      // The client did not take its answer in time: given up, and nothing more
      // is written to it.
      httplib::Response unused;
      Refuse(Limit::kResponseTimeout, unused);
      abort = true;
      break;
    }
    if (strm.timed_out()) {
      linger = true;
      break;
    }
    if (strm.close_announced()) {
      // Its answer said Connection: close: not kept, as the waiting places were
      // full (counted as a kept-alive connection closed after its answer).
      httplib::Response unused;
      Refuse(Limit::kWaitingFullIdle, unused);
      linger = true;
      break;
    }
    if (answering.parsed == nullptr) {
      // cpp-httplib answered a head it could not parse (400, 414) and kept
      // the connection, reading on from wherever it stopped: the rest of that
      // head, or a body, would be read as the next request. Where that starts is
      // unknown: end the connection (RFC 9112 9.6).
      linger = true;
      break;
    }
    if (answering.body_length != strm.body_bytes_read()) {
      // The answer left the body unread (a request refused before it, a GET's
      // body), or its framing was ambiguous: the next request's first byte is
      // not known, and reading the body as one would answer a request a proxy
      // in front never sent. End the connection.
      linger = true;
      break;
    }
    if (!ret || connection_closed) break;
  }
  if (abort) {
    AbortiveClose(sock);
  } else if (linger) {
    LingeringClose(sock);
  } else {
    ::shutdown(sock, SHUT_RDWR);
    ::close(sock);
  }
  return ret;
}

}  // namespace dedup::serve
