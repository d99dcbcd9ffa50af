// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup serve`: the HTTP API, the web view and /metrics over one store, or the
// Idempotency-Key proxy in front of an HTTP application (docs/SERVE.md).
//
//   dedup serve --store rocksdb:/var/lib/dedup                    # 127.0.0.1:8077
//   dedup serve --store redis://127.0.0.1:6379 --proxy http://127.0.0.1:3000
//   dedup serve --store ... --listen 0.0.0.0:8077 --auth-token-file /etc/dedup/token

#ifdef DEDUP_WITH_SERVE

#include <signal.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <memory>
#include <thread>
#include <utility>

#include "cli/command.h"
#include "cli/common.h"
#include "cli/flags.h"
#include "core/secret.h"
#include "core/uri.h"
#include "dedup/store.h"
#include "serve/server.h"

namespace dedup::cli {
namespace {

struct ServeFlags {
  std::string store;
  std::string listen = "127.0.0.1:8077";
  std::string auth_token_file;
  bool auth_token_given = false;
  bool quiet = false;
  serve::ServeOptions o;
};

int RunServe(ServeFlags& f) {
  serve::ServeOptions& o = f.o;
  // SIGTERM / SIGINT stop the listener from a thread of their own (Stop is not
  // async-signal-safe). Blocked first, so that every thread started later (the
  // store's, the server's) inherits the mask and none takes the default action.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  const size_t colon = f.listen.rfind(':');
  if (colon == std::string::npos || colon + 1 == f.listen.size()) {
    std::fprintf(stderr, "dedup serve: --listen: give HOST:PORT, got '%s'\n", f.listen.c_str());
    return kExitUsage;
  }
  o.host = f.listen.substr(0, colon);
  // "[::1" splits at its last ':' into "[:" and "1": name the whole text, since
  // the host alone would not show what is wrong.
  if (f.listen.front() == '[' && o.host.back() != ']') {
    std::fprintf(stderr, "dedup serve: --listen: malformed address '%s': write an IPv6 address "
                         "in brackets, [::1]:8077\n", f.listen.c_str());
    return kExitUsage;
  }
  // Digits only: stoi alone took "+8130" and " 8130".
  const std::string port = f.listen.substr(colon + 1);
  o.port = -1;
  if (port.size() <= 5 && std::all_of(port.begin(), port.end(), [](unsigned char c) {
        return c >= '0' && c <= '9';
      })) {
    o.port = std::stoi(port);
  }
  if (o.port < 0 || o.port > 65535) {
    std::fprintf(stderr, "dedup serve: --listen: bad port in '%s' (0 to 65535)\n",
                 f.listen.c_str());
    return kExitUsage;
  }
  // Given, even as "", the file must hold a token: an empty one (a secret not
  // mounted yet) must not turn the token check off. Read as every secret file is.
  if (f.auth_token_given) {
    auto token = internal::ReadSecretFile("--auth-token-file", "--auth-token-file",
                                          f.auth_token_file);
    if (!token.ok()) {
      std::fprintf(stderr, "dedup serve: %s\n", token.status().message().c_str());
      return kExitUsage;
    }
    o.auth_token = std::move(token).value();
  }
  // Known before the store is opened, so that no message of serve carries it.
  if (auto u = internal::ParseUri(f.store); u.ok() && u->has_password) {
    o.secret_to_redact = u->password;
  }
  o.version = DEDUP_VERSION;
  if (!f.quiet) {
    o.log = [](const std::string& line) { std::fprintf(stderr, "dedup serve: %s\n", line.c_str()); };
  }
  if (Status s = serve::ValidateServeOptions(o); !s.ok()) {
    std::fprintf(stderr, "dedup serve: %s\n", s.message().c_str());
    return kExitUsage;
  }
  auto store = OpenStore(f.store, WarnOnStderr("dedup serve"));
  if (!store.ok()) {
    std::fprintf(stderr, "dedup serve: --store: %s\n", store.status().ToString().c_str());
    return ExitCodeFor(store.status());  // 75: unreachable, or held by another process
  }
  auto server = serve::Server::Create(store->get(), o);
  if (!server.ok()) {
    std::fprintf(stderr, "dedup serve: %s\n", server.status().ToString().c_str());
    return kExitUsage;
  }
  if (Status s = (*server)->Bind(); !s.ok()) {
    std::fprintf(stderr, "dedup serve: --listen: %s\n", s.ToString().c_str());
    return ExitCodeFor(s);  // 75: in use by another process
  }
  serve::Server* srv = server->get();
  std::thread stopper([stop_signals, srv] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (sig != 0) srv->Stop();
  });
  std::fprintf(stderr, "dedup serve: listening on http://%s:%d/ (store %s%s%s)\n",
               o.host.c_str(), srv->port(), (*store)->Describe().c_str(),
               o.proxy.empty() ? "" : ", proxy to ", o.proxy.c_str());
  Status run = srv->Run();
  // Wake the stopper if the listener ended on its own.
  pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  if (!run.ok()) {
    std::fprintf(stderr, "dedup serve: %s\n", run.ToString().c_str());
    return kExitUsage;
  }
  return kExitOk;
}

}  // namespace

void RegisterServe(CLI::App& root, CommandContext& ctx) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* app = root.add_subcommand(
      "serve", "HTTP API, web view and metrics over a store, or an Idempotency-Key proxy");
  app->add_option("--store", f->store, "Store URI: memory:, rocksdb:PATH, redis://HOST:PORT, redis+cluster://HOST:PORT,..., postgres://USER@HOST:PORT/DB")->required();
  app->add_option("--listen", f->listen,
                  "HOST:PORT to listen on; not loopback needs --auth-token-file")
      ->capture_default_str();
  CLI::Option* token_file = app->add_option("--auth-token-file", f->auth_token_file,
                  "File holding the token (16 or more printable characters) every request "
                  "must carry, as Authorization: Bearer T or Dedup-Token: T");
  CLI::Option* proxy = app->add_option(
      "--proxy", f->o.proxy,
      "Proxy mode: the application's http://HOST:PORT; API and page move to /_dedup/");
  // The proxy-mode flags without --proxy would be ignored: refused by name instead.
  app->add_option("--key-prefix", f->o.key_prefix, "Proxy mode: store key prefix")
      ->capture_default_str()
      ->needs(proxy);
  AddDurationOption(*app, "--lease", &f->o.lease,
                    "Proxy mode: lease of a forwarded request (heartbeated every lease/3)",
                    DurationBound::kPositive)
      ->needs(proxy);
  AddDurationOption(*app, "--retention", &f->o.retention,
                    "Proxy mode: how long recorded responses are replayed",
                    DurationBound::kPositive)
      ->needs(proxy);
  app->add_option("--max-response-bytes", f->o.max_response_bytes,
                  "Proxy mode: record response bodies up to this size")
      ->capture_default_str()
      ->needs(proxy);
  app->add_option("--max-body-bytes", f->o.max_body_bytes, "Larger request bodies get 413")
      ->capture_default_str();
  app->add_option("--threads", f->o.threads, "Threads always waiting for connections (1 to 1024)")
      ->capture_default_str();
  app->add_option("--max-connections", f->o.max_connections,
                  "Connections answered at once (a thread each; 0: 256, or --threads when "
                  "more); more wait their turn")
      ->capture_default_str();
  app->add_option("--max-waiting-connections", f->o.max_waiting_connections,
                  "Connections that may hold a thread while waiting for a request head; when "
                  "that many wait, a new one must bring its head at once, else 503 (0: 3/4 "
                  "of --max-connections)")
      ->capture_default_str();
  AddDurationOption(*app, "--header-timeout", &f->o.header_timeout,
                    "A request's whole head must arrive within this, else 408 and close",
                    DurationBound::kPositive);
  AddDurationOption(*app, "--body-timeout", &f->o.body_timeout,
                    "A request's whole body must arrive within this after its head, else 408 "
                    "and close",
                    DurationBound::kPositive);
  AddDurationOption(*app, "--response-timeout", &f->o.response_timeout,
                    "A whole answer must be written within this of its first byte, else it is "
                    "given up and the connection reset (a client that does not read)",
                    DurationBound::kPositive);
  app->add_flag("--quiet", f->quiet, "No line per request on stderr");
  app->callback([f, token_file, &ctx] {
    f->auth_token_given = token_file->count() > 0;
    ctx.exit_code = RunServe(*f);
  });
}

}  // namespace dedup::cli

#endif  // DEDUP_WITH_SERVE
