// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "cli/common.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

namespace dedup::cli {

MetricsServer::~MetricsServer() {
  stop_.store(true);
  if (fd_ >= 0) shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
  if (fd_ >= 0) close(fd_);
}

Status MetricsServer::Start(int port, std::function<std::string()> body) {
  body_ = std::move(body);
  fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd_ < 0) return Status::Unavailable(std::string("metrics socket: ") + std::strerror(errno));
  int one = 1;
  setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd_, 16) != 0) {
    return Status::Unavailable("metrics: cannot listen on 127.0.0.1:" + std::to_string(port) +
                               ": " + std::strerror(errno));
  }
  thread_ = std::thread([this] { Serve(); });
  return Status::Ok();
}

void MetricsServer::Serve() {
  while (!stop_.load()) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    const int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) continue;
    timeval tv{1, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char req[2048];
    const ssize_t n = recv(c, req, sizeof(req) - 1, 0);
    std::string head(req, n > 0 ? static_cast<size_t>(n) : 0);
    std::string resp;
    if (head.rfind("GET /metrics", 0) == 0) {
      const std::string body = body_();
      resp = "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
             std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    } else {
      resp = "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    }
    (void)!send(c, resp.data(), resp.size(), MSG_NOSIGNAL);
    close(c);
  }
}

void OnStopSignals(void (*on_stop)(int)) {
  struct sigaction sa{};
  sa.sa_handler = on_stop;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

std::string FormatMillisUtc(int64_t millis) {
  const time_t secs = static_cast<time_t>(millis / 1000);
  tm t{};
  gmtime_r(&secs, &t);
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", t.tm_year + 1900,
                t.tm_mon + 1, t.tm_mday, t.tm_hour, t.tm_min, t.tm_sec,
                static_cast<int>(millis % 1000));
  return buf;
}

std::optional<std::pair<std::string, std::string>> SplitField(const std::string& kv) {
  const size_t eq = kv.find('=');
  if (eq == std::string::npos || eq == 0) return std::nullopt;
  return std::make_pair(kv.substr(0, eq), kv.substr(eq + 1));
}

}  // namespace dedup::cli
