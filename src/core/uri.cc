// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/uri.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

#include "core/duration.h"
#include "core/printable.h"
#include "core/redact.h"
#include "dedup/store.h"

namespace dedup::internal {
namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

StatusOr<std::string> Decode(std::string_view s, std::string_view part) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out.push_back(s[i]);
      continue;
    }
    const int hi = i + 1 < s.size() ? HexValue(s[i + 1]) : -1;
    const int lo = i + 2 < s.size() ? HexValue(s[i + 2]) : -1;
    if (hi < 0 || lo < 0) {
      return Status::InvalidArgument("bad percent-escape in URI " + std::string(part));
    }
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

// What a scheme is made of (RFC 3986): a letter, then letters, digits, '+', '-'
// and '.'. "127.0.0.1:6379" (a host and port, the scheme forgotten) is not a URI
// whose scheme is "127.0.0.1".
bool IsSchemeText(std::string_view s) {
  if (s.empty() || !std::isalpha(static_cast<unsigned char>(s[0]))) return false;
  for (char c : s) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.')) {
      return false;
    }
  }
  return true;
}
}  // namespace

std::optional<std::string> Uri::Param(std::string_view name) const {
  for (const auto& [k, v] : params) {
    if (k == name) return v;
  }
  return std::nullopt;
}

// Why a name is not shown (ParamPlace::hide_names).
constexpr char kHiddenName[] =
    " (not shown: with no user-info before the host, it may be the tail of a password or "
    "token whose '?' or '/' was written raw, which ends the host: write them %3F, %2F)";

Status CheckParamRepeats(const std::vector<std::string>& names, ParamPlace place) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (std::find(names.begin(), names.begin() + i, names[i]) == names.begin() + i) continue;
    if (place.hide_names) {
      return Status::InvalidArgument("a " + std::string(place.noun) + " is given twice in " +
                                     std::string(place.where) + kHiddenName);
    }
    return Status::InvalidArgument(std::string(place.noun) + " '" +
                                   PrintableCut(names[i], 64) + "' is given twice in " +
                                   std::string(place.where) + " (give it once)");
  }
  return Status::Ok();
}

Status CheckParamNames(const std::vector<std::string>& names,
                       std::initializer_list<std::string_view> known, ParamPlace place) {
  return CheckParamNames(names, std::span<const std::string_view>(known.begin(), known.size()),
                         place);
}

Status CheckParamNames(const std::vector<std::string>& names,
                       std::span<const std::string_view> known, ParamPlace place) {
  DEDUP_RETURN_IF_ERROR(CheckParamRepeats(names, place));
  for (const std::string& name : names) {
    if (std::find(known.begin(), known.end(), name) != known.end()) continue;
    std::string list;
    for (std::string_view k : known) list += (list.empty() ? "" : ", ") + std::string(k);
    if (place.hide_names) {
      return Status::InvalidArgument("unknown " + std::string(place.noun) + " in " +
                                     std::string(place.where) + kHiddenName + " (known: " +
                                     (list.empty() ? "none" : list) + ")");
    }
    return Status::InvalidArgument("unknown " + std::string(place.noun) + " '" +
                                   PrintableCut(name, 64) + "' in " +
                                   std::string(place.where) + " (known: " +
                                   (list.empty() ? "none" : list) + ")");
  }
  return Status::Ok();
}

Status Uri::CheckParams(std::initializer_list<std::string_view> known) const {
  std::vector<std::string> names;
  // No name holds the tail of a password whose '?' was written raw: ParseUri
  // refused those.
  for (const auto& [k, v] : params) names.push_back(k);
  return CheckParamNames(names, known, {"parameter", scheme + " URI", names_may_hold_secret});
}

std::string Uri::Redacted() const {
  std::string s = scheme + ":";
  if (has_authority) {
    s += "//";
    if (!user.empty() || has_password) {
      // "user:@" is a password typed in the user's place: hidden whole.
      s += has_password && !password.empty() ? Printable(user) + ":***@" : "***@";
    }
    bool first = true;
    for (std::string_view h : SplitHosts(hosts)) {
      s += (first ? "" : ",") + ShownHost(h);
      first = false;
    }
  }
  // Decoded parts are shown Printable: a prefix or database name holding an ESC
  // or a newline drew on the terminal, or forged a log line, wherever the
  // store's description went (serve's log and /v1/info, errors).
  s += Printable(path);
  for (size_t i = 0; i < params.size(); ++i) {
    s += i == 0 ? "?" : "&";
    s += Printable(params[i].first) + "=" + Printable(params[i].second);
  }
  // Also hides a lone user-info (Redis reads it as the password) and whatever a
  // typo left in the path ("redis:///:pass@host").
  return RedactUri(s);
}

std::optional<std::string_view> UriScheme(std::string_view text) {
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  if (!IsSchemeText(text.substr(0, colon))) return std::nullopt;
  return text.substr(0, colon);
}

std::string SchemeForMessage(std::string_view scheme) {
  constexpr size_t kMax = 32;
  bool printable = scheme.size() <= kMax;
  for (char c : scheme) printable = printable && c > ' ' && c < 0x7f && c != '\'';
  if (printable) return "'" + std::string(scheme) + "'";
  return "(not shown: not printable or longer than " + std::to_string(kMax) + " bytes)";
}

StatusOr<Uri> ParseUri(std::string_view text) {
  Uri u;
  const size_t colon = text.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    // Not echoed: without a scheme nothing tells a password from a host.
    return Status::InvalidArgument("store URI has no scheme (expected e.g. memory:, "
                                   "rocksdb:PATH, redis://HOST:PORT)");
  }
  u.scheme.assign(text.substr(0, colon));
  if (!IsSchemeText(u.scheme)) {
    return Status::InvalidArgument(
        "URI does not start with a scheme (a letter, then letters, digits, '+', '-', '.' "
        "before the first ':'), e.g. redis://HOST:PORT");
  }
  std::string_view rest = text.substr(colon + 1);
  bool had_userinfo = false;  // an '@' before the query
  std::string_view query;
  if (size_t q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  if (rest.starts_with("//")) {
    u.has_authority = true;
    rest.remove_prefix(2);
    size_t slash = rest.find('/');
    std::string_view authority = rest.substr(0, slash);
    rest = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
    if (size_t at = authority.rfind('@'); at != std::string_view::npos) {
      had_userinfo = true;
      std::string_view userinfo = authority.substr(0, at);
      authority = authority.substr(at + 1);
      std::string_view user = userinfo, pass;
      if (size_t c = userinfo.find(':'); c != std::string_view::npos) {
        user = userinfo.substr(0, c);
        pass = userinfo.substr(c + 1);
        u.has_password = true;
      }
      auto du = Decode(user, "user");
      if (!du.ok()) return du.status();
      auto dp = Decode(pass, "password");
      if (!dp.ok()) return dp.status();
      u.user = *du;
      u.password = *dp;
    }
    u.hosts.assign(authority);
  }
  auto path = Decode(rest, "path");
  if (!path.ok()) return path.status();
  u.path = *path;
  // The query's parts, split once at each '&' (empty ones dropped), not yet
  // decoded: the name before the first '=' (the whole part when it has none), the
  // value after it, and the whole part for the message of one not name=value.
  struct RawParam {
    std::string_view kv, name, value;
  };
  std::vector<RawParam> raw;
  for (std::string_view q = query; !q.empty();) {
    const size_t amp = q.find('&');
    const std::string_view kv = q.substr(0, amp);
    q = amp == std::string_view::npos ? std::string_view() : q.substr(amp + 1);
    if (kv.empty()) continue;
    const size_t eq = kv.find('=');
    raw.push_back({kv, kv.substr(0, eq),
                   eq == std::string_view::npos ? std::string_view() : kv.substr(eq + 1)});
  }
  // "redis://u:p?ss@h?timeout=1s", "amqp://u:p?s&s@h?queue=q": a '?' written raw
  // in a password or token began the query inside the user-info, so the secret's
  // tail, cut at each '&' and '=', is read as parameters, and the host after its
  // '@' is in a name, or (a '=' in the tail: "u:p?s=s@h?queue=q") in a value
  // followed by the URI's own '?'. No parameter name of any scheme has an '@', and
  // no query an '@' and then a '?': checked on the whole query before any name is
  // read, so that none is echoed, nor the secret. (A value may hold an '@':
  // "consumer=me@host", "password_file=/run/credentials/dedup@1.service/pw".)
  for (const RawParam& p : raw) {
    if (p.name.find('@') != std::string_view::npos) {
      return Status::InvalidArgument(u.scheme + " URI has an '@' in a parameter name: a '?' "
                                     "written raw in a password or token ends the host; "
                                     "write it %3F");
    }
  }
  // "redis://u:p?s=s@h", "redis://u:pw?x": no user-info before the '?', and a
  // "host" whose port is no number: the user and the head of the password.
  bool userinfo_as_host = false;
  if (u.has_authority && !had_userinfo && u.hosts.find('[') == std::string::npos) {
    for (std::string_view h : SplitHosts(u.hosts)) {
      const size_t c = h.find(':');
      if (c != std::string_view::npos &&
          (c + 1 == h.size() ||
           h.find_first_not_of("0123456789", c + 1) != std::string_view::npos)) {
        userinfo_as_host = true;
      }
    }
  }
  if (const size_t at = query.find('@'); at != std::string_view::npos) {
    if (userinfo_as_host) {
      return Status::InvalidArgument(u.scheme + " URI has an '@' in its query after a host "
                                     "whose port is no number: a '?' written raw in a "
                                     "password or token ends the host; write it %3F");
    }
    if (query.find('?', at) != std::string_view::npos) {
      return Status::InvalidArgument(u.scheme + " URI has an '@' and then a second '?' in its "
                                     "query: a '?' written raw in a password or token ends the "
                                     "host; write it %3F");
    }
  }
  // "redis://48613/Qz1'Hunt3r@h", "amqp://Qz1/Hunt3r@h/?queue=q": a '/' written
  // raw in a password or token whose head reads as a host ends the host, and the
  // path holds the tail, the '@' and the host (a Redis database echoed, a
  // PostgreSQL database or AMQP vhost sent to the server, the head resolved as a
  // host). Nor may a path come before an '@' of the query ("redis://48613/Qz1?
  // Hunt3r=Vv7@h"), but for a Redis database ("/2?password_file=/run/x@1/pw").
  // Checked on the text as written: an '@' written %40 is the path's own.
  if (u.has_authority && !had_userinfo) {
    if (rest.find('@') != std::string_view::npos) {
      return Status::InvalidArgument(u.scheme + " URI has an '@' in its path and no user-info "
                                     "before its host: a '/' written raw in a password or token "
                                     "ends the host; write it %2F (an '@' of the path is "
                                     "written %40)");
    }
    const std::string_view db = rest.empty() ? rest : rest.substr(1);
    if (query.find('@') != std::string_view::npos && !db.empty() &&
        db.find_first_not_of("0123456789") != std::string_view::npos) {
      return Status::InvalidArgument(u.scheme + " URI has a path, then an '@' in its query, and "
                                     "no user-info before its host: a '/' or '?' written raw in "
                                     "a password or token ends the host; write them %2F, %3F "
                                     "(an '@' of a value is written %40)");
    }
  }
  // What ends the host early leaves the names of the query unfit to show.
  u.names_may_hold_secret = (!had_userinfo && query.find('@') != std::string_view::npos) ||
                            query.find('?') != std::string_view::npos ||
                            userinfo_as_host;  // "u:pw?x": the '@host' forgotten
  for (const RawParam& p : raw) {
    if (p.name.size() == p.kv.size() || p.name.empty()) {
      if (u.names_may_hold_secret) {
        return Status::InvalidArgument(std::string("URI parameter is not of the form name=value") +
                                       kHiddenName);
      }
      return Status::InvalidArgument("URI parameter '" + RedactUri(p.kv) +
                                     "' is not of the form name=value");
    }
    auto k = Decode(p.name, "parameter name");
    if (!k.ok()) return k.status();
    auto v = Decode(p.value, "parameter value");
    if (!v.ok()) return v.status();
    const bool repeat = u.Param(*k).has_value();
    u.params.emplace_back(*k, *v);
    if (repeat) {
      std::vector<std::string> names;
      for (const auto& [name, value] : u.params) names.push_back(name);
      return CheckParamRepeats(names, {"parameter", u.scheme + " URI", u.names_may_hold_secret});
    }
  }
  return u;
}

std::vector<std::string_view> SplitHosts(std::string_view hosts) {
  std::vector<std::string_view> parts;
  for (size_t b = 0;;) {
    const size_t e = std::min(hosts.find(',', b), hosts.size());
    parts.push_back(hosts.substr(b, e - b));
    if (e == hosts.size()) return parts;
    b = e + 1;
  }
}

StatusOr<HostPort> ParseHostPort(std::string_view text, std::string_view scheme) {
  const auto bad = [&](std::string_view why) {
    return Status::InvalidArgument(std::string(scheme) + ": host '" + ShownHost(text) + "': " +
                                   std::string(why));
  };
  HostPort hp;
  std::string_view host = text, port;
  if (text.starts_with("[")) {
    const size_t close = text.find(']');
    if (close == std::string_view::npos) return bad("no ']' after an IPv6 address");
    host = text.substr(1, close - 1);
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return bad("expected ':PORT' after ']'");
      port = rest.substr(1);
      if (port.empty()) return bad("empty port");
    }
    if (host.find(':') == std::string_view::npos) return bad("brackets hold an IPv6 address");
    if (const size_t pct = host.find('%'); pct != std::string_view::npos) {
      // RFC 6874: a zone id (the interface of a link-local address) follows the
      // address as "%25" and the zone, itself percent-encoded: "[fe80::1%25eth0]".
      // The host is what the resolver reads: "fe80::1%eth0".
      static constexpr char kZoneForm[] = " (RFC 6874: [fe80::1%25eth0])";
      if (host.substr(pct, 3) != "%25") {
        return bad(std::string("a zone id follows the address as %25 and the zone") + kZoneForm);
      }
      if (pct + 3 == host.size()) return bad(std::string("empty zone id") + kZoneForm);
      StatusOr<std::string> zone = Decode(host.substr(pct + 3), "zone id");
      if (!zone.ok()) return bad(std::string("bad percent-escape in the zone id") + kZoneForm);
      for (unsigned char ch : *zone) {
        if (ch <= ' ' || ch >= 0x7f || ch == '/' || ch == '?' || ch == '@' || ch == '[' ||
            ch == ']') {
          return bad(std::string("bad character in the zone id") + kZoneForm);
        }
      }
      hp.host.assign(host.substr(0, pct)).append("%").append(*zone);
    }
  } else if (size_t c = text.find(':'); c != std::string_view::npos) {
    if (text.find(':', c + 1) != std::string_view::npos) {
      // Not an IPv6 address's characters ("shop:PW127.0.0.1:5432"): more likely
      // a user:password whose '@' was left out.
      if (text.find_first_not_of("0123456789abcdefABCDEF:.%") != std::string_view::npos) {
        return bad("more than one ':' (an IPv6 address goes in brackets, [::1]:PORT; a "
                   "user:password needs its '@' before the host)");
      }
      return bad("an IPv6 address must be in brackets, e.g. [::1]:PORT");
    }
    host = text.substr(0, c);
    port = text.substr(c + 1);
    if (port.empty()) return bad("empty port");
  }
  if (host.empty()) return bad("no host name");
  // The address before a zone id (set in hp.host above, already checked).
  for (char ch : hp.host.empty() ? host : host.substr(0, host.find('%'))) {
    if (ch == '/' || ch == '?' || ch == '@' || ch == '[' || ch == ']' || ch == ' ') {
      return bad("bad character in the host name");
    }
  }
  if (hp.host.empty()) hp.host.assign(host);
  if (!port.empty()) {
    int p = 0;
    auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
    if (ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535) {
      // Not echoed (see above): said why, so that '***' is not read as a redaction
      // of something the user did not write.
      const bool shown = !port.empty() && std::all_of(port.begin(), port.end(), [](char ch) {
        return ch >= '0' && ch <= '9';
      });
      return bad(shown ? "the port is not a number from 1 to 65535"
                       : "the port is not a number from 1 to 65535 (what follows ':' is not "
                         "shown: it may be a password whose host was left out)");
    }
    hp.port = p;
  }
  return hp;
}

StatusOr<std::string> PercentDecode(std::string_view text, std::string_view part) {
  return Decode(text, part);
}

StatusOr<long long> ParseCount(std::string_view text, std::string_view what) {
  long long v = 0;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  // A digit first: from_chars takes "-0" as 0.
  if (text.empty() || text.front() < '0' || text.front() > '9' || ec != std::errc() ||
      p != text.data() + text.size() || v < 0) {
    // Escaped and cut: the value came from a URI (an ESC or CR reached the
    // terminal raw, a 1 MB value was printed whole).
    return Status::InvalidArgument(std::string(what) + " '" + PrintableCut(text, 64) +
                                   "' is not a non-negative whole number");
  }
  return v;
}

Status RefuseControlBytes(std::string_view name, std::string_view what) {
  for (size_t i = 0; i < name.size(); ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c != 0x7f) continue;
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x", c);
    return Status::InvalidArgument(std::string(what) + "'" + PrintableCut(name, 64) +
                                   "' holds control byte " + hex + " at byte " + std::to_string(i) +
                                   " (from %" + std::string(hex + 2) + " in the URI?): names may not");
  }
  return Status::Ok();
}

StatusOr<long long> ParseDurationMillis(std::string_view text, std::string_view what) {
  StatusOr<Millis> d = ParseDuration(text, what);
  if (!d.ok()) return d.status();
  return d->count();
}

std::string RedisServerIdentity(std::string_view host, int port, int db) {
  std::string_view h = host;
  if (h == "localhost" || h == "::1" || h == "[::1]") h = "127.0.0.1";
  return std::string(h) + ":" + std::to_string(port) + "/" + std::to_string(db);
}

}  // namespace dedup::internal
