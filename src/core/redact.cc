// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/redact.h"

#include "core/uri.h"

#include <algorithm>
#include <cctype>

namespace dedup::internal {
namespace {

bool SchemeChar(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
}

// Where the part after "scheme:" and its slashes starts (0 when there is no scheme).
size_t BodyStart(std::string_view t) {
  size_t i = 0;
  while (i < t.size() && SchemeChar(t[i])) ++i;
  if (i == 0 || i >= t.size() || t[i] != ':') return 0;
  ++i;
  while (i < t.size() && t[i] == '/') ++i;
  return i;
}

std::string RedactQuery(std::string_view q) {
  std::string out;
  while (true) {
    const size_t amp = q.find('&');
    std::string_view kv = q.substr(0, amp);
    const size_t eq = kv.find('=');
    std::string name(kv.substr(0, eq));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (eq != std::string_view::npos && (name == "password" || name == "pass" || name == "auth")) {
      out.append(kv.substr(0, eq + 1)).append("***");
    } else {
      out.append(kv);
    }
    if (amp == std::string_view::npos) break;
    out.push_back('&');
    q = q.substr(amp + 1);
  }
  return out;
}

}  // namespace

std::string ShownHost(std::string_view text) {
  // Past a "[v6]"; an unclosed '[' is no address to show whole ("[user:pass").
  size_t from = text.starts_with("[") ? text.find(']') : 0;
  if (from == std::string_view::npos) from = 0;
  const size_t c = text.find(':', from);
  if (c == std::string_view::npos) return std::string(text);
  const std::string_view rest = text.substr(c + 1);
  if (std::all_of(rest.begin(), rest.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return std::string(text);
  }
  return std::string(text.substr(0, c)) + ":***";
}

std::string RedactUri(std::string_view text) {
  const size_t body = BodyStart(text);
  const size_t at = text.rfind('@');
  std::string out;
  if (at != std::string_view::npos && at >= body) {
    // Everything between the scheme and the last '@' is user-info.
    std::string_view info = text.substr(body, at - body);
    out.append(text.substr(0, body));
    // A '?' inside it is part of the password, not a query.
    // The user name stays when a password follows it ("user:pass@"); "pass:@"
    // is a password typed in the user's place.
    // A user name holding an '@' is no user name ("pass@[::1]:6390@host").
    if (const size_t c = info.find(':'); c != std::string_view::npos && c + 1 < info.size() &&
                                         info.substr(0, c).find_first_of("/?@") ==
                                             std::string_view::npos) {
      out.append(info.substr(0, c)).append(":***");
    } else {
      out.append("***");
    }
    text = text.substr(at);  // "@host..."
  } else if (body < text.size() && text[body] == ':' &&
             (body > 0 || text.find_first_not_of("0123456789", 1) != std::string_view::npos)) {
    // "redis://:pass" with the '@' forgotten: all of it up to a '?' is secret.
    out.append(text.substr(0, body + 1)).append("***");
    const size_t q = text.find('?', body);
    text = q == std::string_view::npos ? std::string_view() : text.substr(q);
  } else if (body >= 2 && text.substr(body - 2, 2) == "//") {
    // "scheme://user:pass" with the '@' forgotten: each host of the authority
    // shows what follows its ':' only when it is a port number.
    const size_t end = std::min(text.find_first_of("/?#", body), text.size());
    out.append(text.substr(0, body));
    bool first = true;
    for (std::string_view h : SplitHosts(text.substr(body, end - body))) {
      if (!first) out.push_back(',');
      out.append(ShownHost(h));
      first = false;
    }
    text = text.substr(end);
  }
  if (const size_t q = text.find('?'); q != std::string_view::npos) {
    out.append(text.substr(0, q + 1)).append(RedactQuery(text.substr(q + 1)));
  } else {
    out.append(text);
  }
  return out;
}

std::string RedactWords(std::string_view message) {
  std::string out;
  size_t i = 0;
  while (i < message.size()) {
    const size_t j = message.find_first_of(" \t\n'\"", i);
    const std::string_view word = message.substr(i, j - i);
    // Only words that look like a URI: "':PORT'" in a message stays as it is.
    const bool uri_like = word.find('@') != std::string_view::npos || BodyStart(word) > 0;
    out.append(uri_like ? RedactUri(word) : std::string(word));
    if (j == std::string_view::npos) break;
    out.push_back(message[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace dedup::internal
