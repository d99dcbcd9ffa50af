// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "redis/options.h"

#include <algorithm>
#include <charconv>
#include <iterator>
#include <string>
#include <vector>

#include "core/duration.h"
#include "core/redact.h"
#include "core/secret.h"

namespace dedup::redis {
namespace {

constexpr std::string_view kConnectionParams[] = {"timeout", "pool", "pipeline", "spin",
                                                   internal::kPasswordFileParam};
constexpr std::string_view kTlsParams[] = {"tls", "tls_ca", "tls_cert", "tls_key", "tls_sni"};

Status TlsNotSupported(std::string_view what) {
  return Status::Unimplemented("redis: TLS is not supported yet (" + std::string(what) +
                               "); use redis:// on a trusted network, or a TLS tunnel "
                               "such as stunnel in front of Redis");
}

}  // namespace

std::string Endpoint::Name() const {
  if (host.find(':') == std::string::npos) return host + ":" + std::to_string(port);
  // As a URI writes it (RFC 6874): a zone id's '%' is "%25", so that the name
  // parses back to this endpoint (ParseEndpoint; the cluster's node map).
  std::string name = "[";
  for (char ch : host) {
    if (ch == '%') name += "%25";
    else name += ch;
  }
  return name + "]:" + std::to_string(port);
}

StatusOr<Endpoint> ParseEndpoint(std::string_view text) {
  // The one host grammar of every URI (core/uri.h), which never echoes a password.
  StatusOr<internal::HostPort> hp = internal::ParseHostPort(text, "redis");
  if (!hp.ok()) return hp.status();
  Endpoint ep;
  ep.host = std::move(hp->host);
  if (hp->port != 0) ep.port = hp->port;
  return ep;
}

Status ConnectionOptions::Validate() const {
  if (endpoints.empty()) return Status::InvalidArgument("redis: no host given");
  if (!cluster && endpoints.size() > 1) {
    return Status::InvalidArgument(
        "redis: redis:// takes one host; use redis+cluster:// for a cluster");
  }
  if (cluster && db != 0) {
    return Status::InvalidArgument("redis: a cluster has only database 0, got /" +
                                   std::to_string(db));
  }
  if (db < 0) return Status::InvalidArgument("redis: database must be >= 0");
  if (timeout.count() <= 0) {
    return Status::InvalidArgument("redis: timeout must be longer than 0, got " +
                                   internal::FormatDuration(timeout));
  }
  if (pool_size < 1 || pool_size > 1024) {
    return Status::InvalidArgument("redis: pool must be 1 to 1024, got " +
                                   std::to_string(pool_size));
  }
  if (reply_spin.count() < 0 || reply_spin.count() > 1000) {
    return Status::InvalidArgument("redis: spin must be 0 to 1000 (microseconds), got " +
                                   std::to_string(reply_spin.count()));
  }
  return Status::Ok();
}

std::string ConnectionOptions::Describe() const {
  std::string s = cluster ? "redis+cluster://" : "redis://";
  // "user:@" is a password typed in the user's place: hidden whole.
  if (has_password) s += password.empty() ? "***@" : user + ":***@";
  for (size_t i = 0; i < endpoints.size(); ++i) s += (i ? "," : "") + endpoints[i].Name();
  if (db != 0) s += "/" + std::to_string(db);
  return s;
}

StatusOr<RedisUri> ParseRedisUri(std::string_view text,
                                 std::initializer_list<std::string_view> caller_params,
                                 Connections connections) {
  // The scheme first: the rest of a value that is no Redis URI is neither parsed
  // nor shown ("u:PASSWORD" given where a URI belongs; core/uri.h).
  if (std::optional<std::string_view> scheme = internal::UriScheme(text);
      scheme && *scheme != "redis" && *scheme != "redis+cluster" && *scheme != "rediss" &&
      *scheme != "rediss+cluster") {
    return Status::InvalidArgument("redis: scheme " + internal::SchemeForMessage(*scheme) +
                                   " is not redis:// or redis+cluster://");
  }
  StatusOr<internal::Uri> uri = internal::ParseUri(text);
  if (!uri.ok()) return uri.status();
  return ParseRedisUri(*uri, caller_params, connections);
}

namespace {
StatusOr<RedisUri> ParseRedisUriUnredacted(const internal::Uri& uri,
                                           std::initializer_list<std::string_view> caller_params,
                                           Connections connections);
}  // namespace

StatusOr<RedisUri> ParseRedisUri(const internal::Uri& uri,
                                 std::initializer_list<std::string_view> caller_params,
                                 Connections connections) {
  StatusOr<RedisUri> out = ParseRedisUriUnredacted(uri, caller_params, connections);
  // Host and port errors echo what they were given, and a mistyped URI
  // ("redis://:PASS" without '@') makes the password a host: redacted.
  if (!out.ok()) return Status(out.status().code(), internal::RedactWords(out.status().message()));
  return out;
}

namespace {
StatusOr<RedisUri> ParseRedisUriUnredacted(const internal::Uri& uri,
                                           std::initializer_list<std::string_view> caller_params,
                                           Connections connections) {
  RedisUri out;
  out.uri = uri;
  ConnectionOptions& o = out.connection;
  if (uri.scheme == "rediss" || uri.scheme == "rediss+cluster") {
    return TlsNotSupported(uri.scheme + "://");
  }
  if (uri.scheme != "redis" && uri.scheme != "redis+cluster") {
    return Status::InvalidArgument("redis: scheme '" + uri.scheme +
                                   "' is not redis:// or redis+cluster://");
  }
  o.cluster = uri.scheme == "redis+cluster";
  // Quoted, with a numeric port: the redaction below (RedactWords) read the words
  // "redis://HOST:PORT)" as a user and a password, and showed "redis://HOST:***".
  const std::string example = "'" + uri.scheme + "://HOST:6379'";
  if (!uri.has_authority) {
    return Status::InvalidArgument("redis: no '//' after '" + uri.scheme + ":' (expected " +
                                   example + ")");
  }
  if (uri.hosts.empty()) {
    return Status::InvalidArgument("redis: no host (expected " + example + ")");
  }
  // "redis://:PASS" with the '@' forgotten: the password would be read, and
  // echoed, as a port.
  if (uri.user.empty() && !uri.has_password && uri.hosts[0] == ':' &&
      uri.hosts.find_first_not_of("0123456789", 1) != std::string::npos &&
      uri.hosts.find_first_of("[],") == std::string::npos &&
      uri.hosts.find(':', 1) == std::string::npos) {
    return Status::InvalidArgument("redis: no host before the ':' (expected " + example +
                                   "; a password goes before an at-sign)");
  }

  // TLS options are named and refused (tls=false asks for none); the others are
  // checked by the one grammar of every URI's parameters (core/uri.h): the
  // caller's, then the connection's.
  std::vector<std::string> names;
  for (const auto& [k, v] : uri.params) {
    if (std::find(std::begin(kTlsParams), std::end(kTlsParams), k) != std::end(kTlsParams)) {
      if (k == "tls" && (v == "false" || v == "0" || v == "no")) continue;
      return TlsNotSupported("option '" + k + "'");
    }
    names.push_back(k);
  }
  std::vector<std::string_view> known(caller_params);
  if (connections == Connections::kPooled) {
    known.insert(known.end(), std::begin(kConnectionParams), std::end(kConnectionParams));
  } else {
    known.insert(known.end(), {"timeout", internal::kPasswordFileParam});
  }
  DEDUP_RETURN_IF_ERROR(
      internal::CheckParamNames(names, known,
                                {"parameter", uri.scheme + " URI", uri.names_may_hold_secret}));

  // Inline (a lone user-info is the password, as redis-cli reads it), a
  // password_file= or $DEDUP_REDIS_PASSWORD: core/secret.h.
  StatusOr<internal::RedisCredentials> cred = internal::ResolveRedisCredentials(uri);
  if (!cred.ok()) return cred.status();
  o.user = cred->user;
  o.password = cred->password;
  o.has_password = cred->has_password;

  for (std::string_view h : internal::SplitHosts(uri.hosts)) {
    if (h.empty()) return Status::InvalidArgument("redis: empty host in '" + uri.hosts + "'");
    StatusOr<Endpoint> ep = ParseEndpoint(h);
    if (!ep.ok()) return ep.status();
    o.endpoints.push_back(std::move(ep).value());
  }
  if (!o.cluster && o.endpoints.size() > 1) {
    return Status::InvalidArgument("redis: redis:// takes one host, got '" + uri.hosts +
                                   "'; use redis+cluster:// for a cluster");
  }

  if (!uri.path.empty() && uri.path != "/") {
    const std::string_view db = std::string_view(uri.path).substr(1);
    int n = -1;
    auto [end, ec] = std::from_chars(db.data(), db.data() + db.size(), n);
    if (ec != std::errc() || end != db.data() + db.size() || n < 0) {
      return Status::InvalidArgument("redis: database '" + std::string(db) +
                                     "' is not a whole number (expected /0, /1, ...)");
    }
    if (o.cluster && n != 0) {
      return Status::InvalidArgument("redis: redis+cluster:// has only database 0, got '" +
                                     uri.path + "'");
    }
    o.db = n;
  }

  if (auto t = uri.Param("timeout")) {
    StatusOr<Millis> d = internal::ParseDuration(*t, "redis: timeout");
    if (!d.ok()) return d.status();
    o.timeout = *d;
  }
  if (auto p = uri.Param("pool")) {
    StatusOr<long long> n = internal::ParseCount(*p, "redis: pool");
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > 1024) {
      return Status::InvalidArgument("redis: pool must be 1 to 1024, got '" + *p + "'");
    }
    o.pool_size = static_cast<size_t>(*n);
  }
  if (auto p = uri.Param("pipeline")) {
    if (*p == "auto") o.auto_pipeline = true;
    else if (*p == "off") o.auto_pipeline = false;
    else return Status::InvalidArgument("redis: pipeline must be auto or off, got '" + *p + "'");
  }
  if (auto p = uri.Param("spin")) {
    StatusOr<long long> n = internal::ParseCount(*p, "redis: spin (whole microseconds)");
    if (!n.ok()) return n.status();
    if (*n < 0 || *n > 1000) {
      return Status::InvalidArgument("redis: spin must be 0 to 1000 (microseconds), got '" + *p +
                                     "'");
    }
    o.reply_spin = std::chrono::microseconds(*n);
  }
  DEDUP_RETURN_IF_ERROR(o.Validate());
  return out;
}
}  // namespace

}  // namespace dedup::redis
