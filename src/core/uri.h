// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// The store and broker URIs: scheme:[//[user[:password]@]hosts][path][?k=v&...].
// Percent-escapes are decoded in the user, password, path and query.

#ifndef DEDUP_SRC_CORE_URI_H_
#define DEDUP_SRC_CORE_URI_H_

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dedup/status.h"

namespace dedup::internal {

struct Uri {
  std::string scheme;                 // "rocksdb", "redis", "redis+cluster", ...
  bool has_authority = false;         // "//" followed the scheme
  std::string user, password;         // from "user:password@"
  bool has_password = false;
  std::string hosts;                  // "h1:p1,h2:p2" as written
  std::string path;                   // after the hosts, before '?'
  std::vector<std::pair<std::string, std::string>> params;
  // The parameter names may hold the tail of a password or token whose '?' was
  // written raw, which ends the host: no user-info before the host and an '@' in
  // the query ("redis://Qz1?Hunt3r=Vv7@h", host "Qz1"), a second '?' in the
  // query, or a host whose port is no number ("redis://u:pw?x", the '@host'
  // forgotten). Messages then name no parameter (ParamPlace::hide_names).
  bool names_may_hold_secret = false;

  std::optional<std::string> Param(std::string_view name) const;
  // InvalidArgument naming the first parameter not in `known` and listing those
  // (CheckParamNames).
  Status CheckParams(std::initializer_list<std::string_view> known) const;
  // The URI with any password replaced by "***", for messages and logs.
  std::string Redacted() const;
};

// The one grammar of "known parameters", for a store or broker URI's query, an
// HTTP query string and a JSON body's fields alike: each name at most once, and
// each one of `known`. `names` in the order given, repeats kept. The error names
// the first name at fault (printable, at most 64 bytes) and where it was:
//   "<noun> 'x' is given twice in <where> (give it once)"
//   "unknown <noun> 'x' in <where> (known: a, b)"   ("(known: none)")
struct ParamPlace {
  std::string_view noun;   // "parameter", "field"
  std::string_view where;  // "redis URI", "the query", "the request body"
  // The names are not shown (Uri::names_may_hold_secret): "unknown <noun> in
  // <where> (not shown: ...) (known: a, b)", "a <noun> is given twice in <where> ...".
  bool hide_names = false;
};
Status CheckParamNames(const std::vector<std::string>& names,
                       std::initializer_list<std::string_view> known, ParamPlace place);
// The same, with the known names in a list made at run time (a Redis URI's:
// the caller's, then the connection's).
Status CheckParamNames(const std::vector<std::string>& names,
                       std::span<const std::string_view> known, ParamPlace place);
// Only the repeats: for a URI read before its opener says which names it knows.
Status CheckParamRepeats(const std::vector<std::string>& names, ParamPlace place);

// The scheme of `text`, the letters, digits, '+', '-', '.' before its first ':'
// (ParseUri's rule), without parsing the rest; nullopt when it has none.
std::optional<std::string_view> UriScheme(std::string_view text);

// How a message names the scheme of a value that is not a URI this build knows:
// 'x' when printable and at most 32 bytes, else "(not shown: ...)". Nothing after
// the value's first ':' is ever shown: in "u:PASSWORD", given where a URI belongs,
// it is a password.
std::string SchemeForMessage(std::string_view scheme);

// InvalidArgument naming what is wrong when `text` is not a URI. A parameter
// given twice ("?ttl=1s&ttl=2s") is refused: neither copy would be sure to win.
// A parameter name with an '@' is refused for every scheme, before any name is
// read and without naming it: it is the tail of a password or token whose '?'
// was written raw ("redis://u:p?ss@h"), and the host.
StatusOr<Uri> ParseUri(std::string_view text);

// The parts of a comma-separated list of hosts ("h1:p1,h2:p2"), in order, empty
// ones kept ("" is one empty part, "a," two): the one splitter of a URI's hosts.
std::vector<std::string_view> SplitHosts(std::string_view hosts);

// One server of a URI's hosts: "host", "host:port", "[v6]" or "[v6]:port".
struct HostPort {
  std::string host;  // without brackets: "::1"
  int port = 0;      // 0: none written
};
// InvalidArgument "`scheme`: host 'TEXT': why" when `text` is not one host with
// an optional port from 1 to 65535. What follows the ':' is echoed only when it
// is a number: in "user:pass" (a URI whose "@host" was forgotten) it is a password.
StatusOr<HostPort> ParseHostPort(std::string_view text, std::string_view scheme);

// `text` with its percent-escapes decoded (the rule ParseUri applies to the user,
// password, path and query); InvalidArgument "bad percent-escape in URI `part`"
// for a '%' without two hex digits. For a part a scheme reads itself: a
// PostgreSQL host that is a Unix socket directory ("%2Fvar%2Frun%2Fpostgresql").
StatusOr<std::string> PercentDecode(std::string_view text, std::string_view part);

// ParseDuration (core/duration.h, the one grammar) as a count of milliseconds.
StatusOr<long long> ParseDurationMillis(std::string_view text, std::string_view what);
// A non-negative integer that fits in long long.
StatusOr<long long> ParseCount(std::string_view text, std::string_view what);

// InvalidArgument naming `what` ("amqp queue=") when `name` holds a control byte
// (below 0x20, or 0x7f), as %00 or %0a in a URI gives: a C library cut a name at
// its NUL (nats.c made stream "AB" of "AB%00CD"), and a broker strips or refuses
// the others only after part of the topology was declared. The name is shown
// escaped and cut to 64 bytes.
Status RefuseControlBytes(std::string_view name, std::string_view what);

// The canonical identity of a Redis server, as BrokerAck::server carries it
// (broker_ack.h): "host:port/db" with localhost and ::1 written 127.0.0.1.
std::string RedisServerIdentity(std::string_view host, int port, int db);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_URI_H_
