// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/nats/nats_source.h"

#include "brokers/dead_letter.h"

#include <nats/nats.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <set>

#include "brokers/key_spec.h"
#include "core/printable.h"
#include "core/secret.h"
#include "core/sha256.h"
#include "core/uri.h"

namespace dedup::nats {
namespace {

constexpr int64_t kNanosPerMilli = 1'000'000;

Status FromNats(natsStatus s, const std::string& what, jsErrCode jerr = static_cast<jsErrCode>(0)) {
  if (s == NATS_OK) return Status::Ok();
  if (jerr == JSStreamMessageExceedsMaximumErr) {
    // The stream's own max_msg_size (below the server's max_payload): the
    // stream refuses this message every time; no retry changes its size.
    return Status::InvalidArgument(what + ": the message is larger than the stream's "
                                          "max_msg_size (data and headers count; JetStream "
                                          "error 10054): no retry changes its size");
  }
  // A header block over the server's 64 KiB bound: refused every time.
  if (static_cast<int>(jerr) == 10097) {
    return Status::InvalidArgument(what + ": the message's headers are larger than the "
                                          "server takes (64 KiB; JetStream error 10097): no "
                                          "retry changes their size");
  }
  std::string m = what + ": " + natsStatus_GetText(s);
  if (jerr != 0) {
    // The server's own description, which nats.c keeps as the thread's last
    // error text ("(js.c:535): maximum messages exceeded", nats_setError) while
    // the status says only "Error". 10077 is any failed store: "maximum messages
    // exceeded", "maximum bytes exceeded" (a stream full with discard new, which
    // empties as consumers ack or messages age out: Unavailable like the rest).
    std::string_view text = nats_GetLastError(nullptr) ? nats_GetLastError(nullptr) : "";
    if (text.starts_with('(')) {
      const size_t end = text.find("): ");
      if (end != std::string_view::npos) text.remove_prefix(end + 3);
    }
    if (!text.empty()) m = what + ": " + internal::Printable(text.substr(0, 200));
    m += " (JetStream error " + std::to_string(static_cast<int>(jerr)) + ")";
  }
  if (jerr == JSStreamSubjectOverlapErr) {
    // A stream made on a subject another stream holds: refused every time.
    return Status::FailedPrecondition(m + ": another stream holds this subject (subjects "
                                          "overlap); name that stream in stream=, or another "
                                          "subject=");
  }
  switch (s) {
    case NATS_TIMEOUT:
      return Status::DeadlineExceeded(std::move(m));
    case NATS_CONNECTION_CLOSED:
    case NATS_CONNECTION_DISCONNECTED:
    case NATS_NO_SERVER:
    case NATS_STALE_CONNECTION:
    case NATS_NO_RESPONDERS:
    case NATS_IO_ERROR:
      return Status::Unavailable(std::move(m));
    case NATS_NOT_PERMITTED:
    case NATS_CONNECTION_AUTH_FAILED:
      return Status::PermissionDenied(std::move(m));
    case NATS_NOT_FOUND:
      return Status::NotFound(std::move(m));
    case NATS_INVALID_ARG:
    case NATS_INVALID_SUBJECT:
    case NATS_MAX_PAYLOAD:  // the server's max_payload: no retry changes the size
      return Status::InvalidArgument(std::move(m));
    default:
      return Status::Unavailable(std::move(m));
  }
}

// One connection and its JetStream context; destroyed together.
struct Conn {
  natsConnection* nc = nullptr;
  jsCtx* js = nullptr;
  ~Conn() {
    if (js != nullptr) jsCtx_Destroy(js);
    if (nc != nullptr) {
      natsConnection_Close(nc);
      natsConnection_Destroy(nc);
    }
  }
};

// nats.c writes the user, password and token into its CONNECT message's JSON as
// they are, unescaped: a '"' in a password ended the string and what followed was
// read as more fields ('x","pass":"other' logged in with "other"), and a backslash or a
// control byte made the server refuse every connect (a "Protocol Error" retried
// forever, exit 75). Refused before connecting, naming which one; never echoed.
Status CheckCredentials(const NatsOptions& o) {
  auto bad = [](std::string_view v) {
    return std::any_of(v.begin(), v.end(), [](char c) {
      const auto u = static_cast<unsigned char>(c);
      return c == '"' || c == '\\' || u < 0x20 || u == 0x7f;
    });
  };
  for (auto [value, what] : {std::pair<std::string_view, const char*>{o.user, "user"},
                             {o.password, "password"},
                             {o.token, "token"}}) {
    if (bad(value)) {
      return Status::InvalidArgument(
          std::string("nats URI: the ") + what + " holds a '\"', a '\\' or a control byte "
          "(from %22, %5C, %0A ... in the URI, or in its file): nats.c would send it "
          "unescaped inside its CONNECT message, where it could change other fields; "
          "use a " + what + " without them");
    }
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<Conn>> Connect(const NatsOptions& o) {
  DEDUP_RETURN_IF_ERROR(CheckCredentials(o));
  natsOptions* opts = nullptr;
  natsStatus s = natsOptions_Create(&opts);
  if (s != NATS_OK) return FromNats(s, "nats: options");
  std::vector<const char*> ptrs;
  for (const auto& x : o.servers) ptrs.push_back(x.c_str());
  s = natsOptions_SetServers(opts, ptrs.data(), static_cast<int>(ptrs.size()));
  if (s == NATS_OK && !o.user.empty()) {
    s = natsOptions_SetUserInfo(opts, o.user.c_str(), o.has_password ? o.password.c_str() : nullptr);
  }
  if (s == NATS_OK && !o.token.empty()) s = natsOptions_SetToken(opts, o.token.c_str());
  if (s == NATS_OK) s = natsOptions_SetTimeout(opts, o.timeout.count());
  if (s == NATS_OK) s = natsOptions_SetMaxReconnect(opts, -1);  // forever
  if (s == NATS_OK) s = natsOptions_SetReconnectWait(opts, 250);
  if (s == NATS_OK) s = natsOptions_SetReconnectBufSize(opts, 8 * 1024 * 1024);
  auto c = std::make_unique<Conn>();
  if (s == NATS_OK) s = natsConnection_Connect(&c->nc, opts);
  natsOptions_Destroy(opts);
  if (s != NATS_OK) return FromNats(s, "nats " + o.host_port + ": connect");
  jsOptions jo;
  jsOptions_Init(&jo);
  jo.Wait = o.timeout.count();
  s = natsConnection_JetStream(&c->js, c->nc, &jo);
  if (s != NATS_OK) return FromNats(s, "nats " + o.host_port + ": JetStream context");
  return c;
}

// Makes sure a stream holds `subject`: nothing when stream `name` exists,
// else creates it (file storage).
// *created (when given): the stream was not there and this call made it.
Status EnsureStream(Conn& c, const NatsOptions& o, const std::string& name, const std::string& subject,
                    bool* created = nullptr) {
  if (created != nullptr) *created = false;
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus s = js_GetStreamInfo(&si, c.js, name.c_str(), nullptr, &jerr);
  if (s == NATS_OK) {
    jsStreamInfo_Destroy(si);
    return Status::Ok();
  }
  if (s != NATS_NOT_FOUND && jerr != JSStreamNotFoundErr) {
    return FromNats(s, "nats " + o.host_port + ": stream info " + name, jerr);
  }
  jsStreamConfig cfg;
  jsStreamConfig_Init(&cfg);
  cfg.Name = name.c_str();
  const char* subjects[] = {subject.c_str()};
  cfg.Subjects = subjects;
  cfg.SubjectsLen = 1;
  cfg.Storage = js_FileStorage;
  jerr = static_cast<jsErrCode>(0);
  s = js_AddStream(&si, c.js, &cfg, nullptr, &jerr);
  if (s == NATS_OK) jsStreamInfo_Destroy(si);
  if (s == NATS_OK && created != nullptr) *created = true;
  return FromNats(s, "nats " + o.host_port + ": add stream " + name + " on " + subject, jerr);
}

// An existing durable consumer is used as it is, unless a setting of it would
// break the contract: with AckPolicy all (or none) an ack (or the delivery
// itself) settles messages whose outcome is not recorded; with a MaxDeliver a
// message redelivered that often (BUSY NAKs and AckWait expiries count) is
// never delivered again, neither done nor dead-lettered; a filter on another
// subject (or none, on a stream holding more) reads other messages than the
// URI says. AckWait is left as it is (a short one is wasteful, not wrong:
// docs/WORKER.md).
Status CheckConsumer(Conn& conn, const NatsOptions& o, const jsConsumerInfo& ci) {
  const jsConsumerConfig* c = ci.Config;
  if (c == nullptr) return Status::Ok();
  const std::string what = "nats " + o.host_port + ": the existing consumer '" + o.consumer +
                           "' of stream " + o.stream + " ";
  // A push consumer (a deliver subject): nats.c's pull subscribe failed with the
  // one word "Error", read as "try again later" (exit 75) every time.
  if (c->DeliverSubject != nullptr && *c->DeliverSubject != '\0') {
    return Status::FailedPrecondition(
        what + "is a push consumer (deliver subject '" + internal::Printable(c->DeliverSubject) +
        "'); dedup pulls, and needs a pull consumer (delete it or name another one)");
  }
  if (c->AckPolicy != js_AckExplicit) {
    return Status::FailedPrecondition(
        what + "has AckPolicy " + (c->AckPolicy == js_AckAll ? "all" : "none") +
        "; dedup acks each message after its outcome is recorded and needs AckPolicy explicit "
        "(delete the consumer or name another one)");
  }
  if (c->MaxDeliver > 0) {
    return Status::FailedPrecondition(
        what + "has MaxDeliver " + std::to_string(c->MaxDeliver) +
        ": a message delivered that often (busy elsewhere, or redelivered after AckWait) would "
        "be dropped without its outcome or a dead letter; dedup needs MaxDeliver -1 (its "
        "buffer's max attempts dead-letter instead)");
  }
  const std::string filter = c->FilterSubject != nullptr ? c->FilterSubject : "";
  if (!filter.empty() && filter != o.Subject()) {
    return Status::FailedPrecondition(what + "filters on '" + filter + "', not on subject=" +
                                      o.Subject());
  }
  if (filter.empty()) {
    // No filter: it reads every subject of the stream, which is subject= only
    // when the stream holds that one subject and no other.
    jsStreamInfo* si = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    natsStatus s = js_GetStreamInfo(&si, conn.js, o.stream.c_str(), nullptr, &jerr);
    if (s != NATS_OK) return FromNats(s, "nats " + o.host_port + ": stream info " + o.stream, jerr);
    std::string held;
    bool only = si->Config != nullptr && si->Config->SubjectsLen == 1 &&
                o.Subject() == si->Config->Subjects[0];
    if (si->Config != nullptr) {
      for (int i = 0; i < si->Config->SubjectsLen; ++i) {
        held += std::string(i == 0 ? "" : ", ") + si->Config->Subjects[i];
      }
    }
    jsStreamInfo_Destroy(si);
    if (!only) {
      return Status::FailedPrecondition(
          what + "has no filter: it reads every subject the stream holds (" +
          internal::Printable(held) + "), not subject=" + o.Subject() + " only");
    }
  }
  return Status::Ok();
}

bool FilterMatches(std::string_view filter, std::string_view subject);
bool SubjectsCollide(std::string_view a, std::string_view b);

// What CheckStreamHolds asks of o.Subject(): a publish subject (no wildcards)
// one of the stream's subjects takes, or a consumer's filter that selects some
// subject of the stream ("jobs.*" on a stream of "jobs.in"), as the server asks.
enum class SubjectUse { kPublish, kFilter };

// FailedPrecondition when the existing stream `o.stream` does not hold
// o.Subject() (`why` says what that would do); *max_msg_size (when given): the
// stream's bound on a message, -1 when none.
Status CheckStreamHolds(Conn& conn, const NatsOptions& o, SubjectUse use, const char* why,
                        int64_t* max_msg_size = nullptr) {
  jsStreamInfo* si = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus s = js_GetStreamInfo(&si, conn.js, o.stream.c_str(), nullptr, &jerr);
  if (s != NATS_OK) return FromNats(s, "nats " + o.host_port + ": stream info " + o.stream, jerr);
  bool holds = false;
  std::string held;
  if (si->Config != nullptr) {
    for (int i = 0; i < si->Config->SubjectsLen; ++i) {
      holds = holds || (use == SubjectUse::kPublish
                            ? FilterMatches(si->Config->Subjects[i], o.Subject())
                            : SubjectsCollide(si->Config->Subjects[i], o.Subject()));
      held += std::string(i == 0 ? "" : ", ") + si->Config->Subjects[i];
    }
    // No subjects: the server stores the stream's own name.
    if (si->Config->SubjectsLen == 0) {
      holds = use == SubjectUse::kPublish ? o.Subject() == o.stream
                                          : SubjectsCollide(o.stream, o.Subject());
    }
    if (max_msg_size != nullptr) *max_msg_size = si->Config->MaxMsgSize;
  }
  jsStreamInfo_Destroy(si);
  if (holds) return Status::Ok();
  return Status::FailedPrecondition(
      "nats " + o.host_port + ": stream " + o.stream + " holds subjects " +
      internal::Printable(held.empty() ? o.stream : held) + ", not subject=" +
      internal::Printable(o.Subject()) + ": " + why);
}

// An existing consumer is used as it is (CheckConsumer refuses what cannot work):
// settings that work but are likely not meant are told through o.on_warning.
void WarnAboutConsumer(const NatsOptions& o, const jsConsumerInfo& ci) {
  const jsConsumerConfig* c = ci.Config;
  if (!o.on_warning || c == nullptr) return;
  const std::string what = "nats " + o.host_port + ": the existing consumer '" + o.consumer +
                           "' of stream " + o.stream + " ";
  const auto ms = [](int64_t ns) { return std::to_string(ns / kNanosPerMilli) + "ms"; };
  const char* used = " (an existing consumer is used as it is: delete it, or edit it, to have "
                     "the URI's)";
  if (o.ack_wait_set && c->AckWait != o.ack_wait.count() * kNanosPerMilli) {
    o.on_warning(what + "has AckWait " + ms(c->AckWait) + ", not ack_wait=" +
                 std::to_string(o.ack_wait.count()) + "ms of the URI" + used);
  }
  if (o.max_ack_pending_set && c->MaxAckPending != o.max_ack_pending) {
    o.on_warning(what + "has MaxAckPending " + std::to_string(c->MaxAckPending) +
                 ", not max_ack_pending=" + std::to_string(o.max_ack_pending) + " of the URI" +
                 used);
  }
  if (o.lease.count() > 0 && c->AckWait > 0 &&
      c->AckWait < o.lease.count() / 3 * kNanosPerMilli) {
    o.on_warning(what + "has AckWait " + ms(c->AckWait) + ", under the lease's heartbeat (" +
                 std::to_string(o.lease.count() / 3) + "ms = lease / 3): a running handler's "
                 "message is redelivered between two heartbeats and answered BUSY");
  }
}

// The dead subject needs a stream to store it; makes <stream>_DEAD unless a
// stream holds it.
Status EnsureDeadStream(Conn& conn, const NatsOptions& o) {
  Status ds = EnsureStream(conn, o, o.stream + "_DEAD", o.DeadSubject());
  // Another stream may already hold the subject (JetStream error 10065,
  // subjects overlap): that one stores the dead letters.
  if (!ds.ok() && ds.message().find("10065") != std::string::npos) return Status::Ok();
  return ds;
}

}  // namespace

std::string NatsOptions::Describe() const {
  // A publisher's options have no consumer: not shown as "consumer= ".
  return "nats " + host_port + " stream=" + stream + (consumer.empty() ? "" : " consumer=" + consumer) +
         " subject=" + Subject();
}

namespace {

std::vector<std::string_view> Tokens(std::string_view subject) {
  std::vector<std::string_view> out;
  size_t start = 0;
  while (true) {
    const size_t dot = subject.find('.', start);
    out.push_back(subject.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start));
    if (dot == std::string_view::npos) return out;
    start = dot + 1;
  }
}

// True when some subject matches both `a` and `b` (either may hold wildcards):
// token by token equal, or '*' on either side, or '>' on either side for the rest.
bool SubjectsCollide(std::string_view a, std::string_view b) {
  const auto x = Tokens(a);
  const auto y = Tokens(b);
  for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
    if (x[i] == ">" || y[i] == ">") return true;
    if (x[i] != "*" && y[i] != "*" && x[i] != y[i]) return false;
  }
  return x.size() == y.size();
}

// True when a message published to `subject` (no wildcards) is one that filter
// subject `filter` ('*' one token, '>' the rest) selects.
bool FilterMatches(std::string_view filter, std::string_view subject) {
  const auto f = Tokens(filter);
  const auto t = Tokens(subject);
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] == ">") return t.size() > i;
    if (i >= t.size()) return false;
    if (f[i] != "*" && f[i] != t[i]) return false;
  }
  return f.size() == t.size();
}

// The dead subject is published to: no wildcard, no empty token, no space. And
// the consumer must not read it back (a dead letter would come round again for
// ever: it has no Nats-Msg-Id, so it is dead-lettered once more as keyless).
Status CheckDeadSubject(const NatsOptions& o) {
  const std::string dead = o.DeadSubject();
  DEDUP_RETURN_IF_ERROR(internal::RefuseControlBytes(dead, "nats dead="));
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("nats dead='" + internal::Printable(dead) + "' " + why);
  };
  for (std::string_view t : Tokens(dead)) {
    if (t.empty()) return bad("has an empty token (a leading, trailing or double '.')");
    if (t.find_first_of("*> ") != std::string_view::npos) {
      return bad("must be a subject to publish to: no '*', '>' or space");
    }
  }
  if (FilterMatches(o.Subject(), dead)) {
    return bad("is read by the consumer itself (subject=" + o.Subject() +
               "): every dead letter would be delivered again; name another subject");
  }
  return Status::Ok();
}

constexpr const char* kTokenFileParam = "token_file";

// subject= (a filter: '*' and '>' as whole tokens, '>' last): no empty token,
// no white space. Refused by JetStream at the first connect otherwise, which
// read as a server to wait for.
Status CheckSubject(const std::string& subject) {
  if (subject.empty()) return Status::Ok();  // the stream's name
  DEDUP_RETURN_IF_ERROR(internal::RefuseControlBytes(subject, "nats subject="));
  const auto bad = [&](const std::string& why) {
    return Status::InvalidArgument("nats subject='" + internal::Printable(subject) + "' " + why);
  };
  const auto tokens = Tokens(subject);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const std::string_view t = tokens[i];
    if (t.empty()) return bad("has an empty token (a leading, trailing or double '.')");
    if (t.find(' ') != std::string_view::npos) return bad("has a space");
    if (t.find_first_of("*>") != std::string_view::npos && t != "*" && t != ">") {
      return bad("has '*' or '>' inside a token (a wildcard is a whole token)");
    }
    if (t == ">" && i + 1 != tokens.size()) return bad("has '>' before its last token");
  }
  return Status::Ok();
}

// A stream or durable consumer name is a token of JetStream's API subjects
// ($JS.API.CONSUMER.INFO.<stream>.<consumer>): JetStream refuses one with a
// '.', '*', '>' or white space at the first connect, which read as a server to
// wait for.
Status CheckName(std::string_view name, const char* what) {
  DEDUP_RETURN_IF_ERROR(internal::RefuseControlBytes(name, std::string("nats ") + what + "="));
  if (name.find_first_of(" .*>") != std::string_view::npos) {
    return Status::InvalidArgument(std::string("nats ") + what + " name '" +
                                   internal::PrintableCut(name, 64) +
                                   "' may not contain '.', '*', '>' or white space");
  }
  return Status::Ok();
}

// key=header:NAME: a NATS header line is "NAME: value", so a name with ':' or
// white space (or a control byte) is no header any message can carry; it was
// accepted, and every message then had no key.
Status CheckKeyHeader(const NatsOptions& o) {
  if (o.key.kind != brokers::KeyKind::kHeader) return Status::Ok();
  for (char c : o.key.name) {
    const auto u = static_cast<unsigned char>(c);
    if (c == ':' || u <= ' ' || u >= 0x7f) {
      return Status::InvalidArgument("nats key=header:" + internal::PrintableCut(o.key.name, 64) +
                                     ": a header name is printable ASCII without ':' or white "
                                     "space (a header line is NAME: value)");
    }
  }
  return Status::Ok();
}

// Every name of `o` the broker would refuse or misread, and a key prefix that
// leaves no room for a key, checked once for the URI (ParseNatsUri) and the C++
// API (OpenNatsSource) alike.
Status CheckNames(const NatsOptions& o) {
  DEDUP_RETURN_IF_ERROR(CheckKeyHeader(o));
  DEDUP_RETURN_IF_ERROR(brokers::CheckKeyPrefix(
      o.key_prefix, o.key.kind == brokers::KeyKind::kContentSha256, "nats"));
  DEDUP_RETURN_IF_ERROR(CheckName(o.stream, "stream"));
  DEDUP_RETURN_IF_ERROR(CheckName(o.consumer, "consumer"));
  DEDUP_RETURN_IF_ERROR(CheckSubject(o.subject));
  return CheckDeadSubject(o);
}

// A wildcard is a filter, not a subject to publish to (the server stored the
// message under the literal "jobs.*", where every consumer whose filter
// matches it read it).
Status CheckNoWildcard(const NatsOptions& o) {
  for (std::string_view t : Tokens(o.Subject())) {
    if (t == "*" || t == ">") {
      return Status::InvalidArgument("nats subject='" + internal::Printable(o.Subject()) +
                                     "' has a wildcard: a filter to consume from, not a "
                                     "subject to publish to; name one subject");
    }
  }
  return Status::Ok();
}

// What a publisher needs of `o`: a stream name, and one subject to publish to.
Status CheckPublishNames(const NatsOptions& o) {
  DEDUP_RETURN_IF_ERROR(CheckKeyHeader(o));
  DEDUP_RETURN_IF_ERROR(CheckName(o.stream, "stream"));
  DEDUP_RETURN_IF_ERROR(CheckSubject(o.subject));
  return CheckNoWildcard(o);
}

StatusOr<internal::Uri> ParseAndCheck(std::string_view text) {
  auto parsed = internal::ParseUri(text);
  if (!parsed.ok()) return parsed.status();
  if (parsed->scheme != "nats") {
    return Status::InvalidArgument("broker URI '" + parsed->Redacted() + "': not nats://");
  }
  if (!parsed->has_authority) {
    // Not echoed: "nats:PASSWORD" is a USER:PASSWORD given where a URI belongs;
    // what follows the ':' is no host.
    return Status::InvalidArgument("nats: no '//' after 'nats:' (expected "
                                   "nats://HOST:4222?stream=S&consumer=C)");
  }
  if (!parsed->path.empty() && parsed->path != "/") {
    // nats:// has no path: one here is a '/' written raw in a token or password
    // ("nats://TO/KEN@HOST" reads as host "TO", path "/KEN@HOST"), or a typo.
    // Not echoed, nor the host before it: it may be the head of the token.
    return Status::InvalidArgument(
        "nats URI has a path after its host (nats:// takes none); a '/' or '?' in a "
        "token or password is written %2F, %3F");
  }
  DEDUP_RETURN_IF_ERROR(parsed->CheckParams({"stream", "consumer", "subject", "key", "prefix",
                                             "dead", "ack_wait", "max_ack_pending", "timeout",
                                             internal::kPasswordFileParam, kTokenFileParam}));
  return parsed;
}
}  // namespace

namespace {
StatusOr<NatsOptions> ParseNatsUriFields(std::string_view text, bool need_consumer);
}  // namespace

StatusOr<NatsOptions> ParseNatsUri(std::string_view text, bool need_consumer) {
  StatusOr<NatsOptions> o = ParseNatsUriFields(text, need_consumer);
  if (o.ok()) DEDUP_RETURN_IF_ERROR(CheckCredentials(*o));
  return o;
}

namespace {
StatusOr<NatsOptions> ParseNatsUriFields(std::string_view text, bool need_consumer) {
  auto parsed = ParseAndCheck(text);
  if (!parsed.ok()) return parsed.status();
  const internal::Uri& u = *parsed;
  NatsOptions o;
  o.host_port = u.hosts.empty() ? "127.0.0.1:4222" : u.hosts;
  // Each server in the one host grammar (core/uri.h), here rather than at the first
  // connect: a bad port is a typo to name (not a server to wait for), and
  // "nats://user:pass" (no "@host") must not echo the password.
  o.servers.clear();
  for (std::string_view h : internal::SplitHosts(o.host_port)) {
    auto hp = internal::ParseHostPort(h, "nats");
    if (!hp.ok()) return hp.status();
    const bool v6 = hp->host.find(':') != std::string::npos;
    o.servers.push_back("nats://" + (v6 ? "[" + hp->host + "]" : hp->host) + ":" +
                        std::to_string(hp->port != 0 ? hp->port : 4222));
  }
  o.stream = u.Param("stream").value_or("");
  if (o.stream.empty()) return Status::InvalidArgument("broker URI '" + u.Redacted() + "' needs stream=NAME");
  o.consumer = u.Param("consumer").value_or("");
  if (need_consumer && o.consumer.empty()) {
    return Status::InvalidArgument("broker URI '" + u.Redacted() + "' needs consumer=NAME");
  }
  o.subject = u.Param("subject").value_or("");
  o.dead = u.Param("dead").value_or("");
  if (auto k = u.Param("key")) {
    // The one key= grammar (brokers/key_spec.h): Nats-Msg-Id, a header or the
    // data's hash.
    auto spec = brokers::ParseKeySpec(*k, {.broker = "nats", .properties = {"msgid"},
                                           .headers = true});
    if (!spec.ok()) return spec.status();
    o.key = *spec;
  }
  o.key_prefix = u.Param("prefix").value_or("");
  DEDUP_RETURN_IF_ERROR(CheckNames(o));
  if (!need_consumer) DEDUP_RETURN_IF_ERROR(CheckNoWildcard(o));
  if (auto a = u.Param("ack_wait")) {
    auto ms = internal::ParseDurationMillis(*a, "nats ack_wait");
    if (!ms.ok()) return ms.status();
    if (*ms < 100) return Status::InvalidArgument("nats ack_wait must be at least 100ms, got " + *a);
    o.ack_wait = Millis(*ms);
    o.ack_wait_set = true;
  }
  if (auto m = u.Param("max_ack_pending")) {
    auto n = internal::ParseCount(*m, "nats max_ack_pending");
    if (!n.ok()) return n.status();
    if (*n < 1 || *n > 1'000'000) return Status::InvalidArgument("nats max_ack_pending must be 1..1000000");
    o.max_ack_pending = static_cast<int>(*n);
    o.max_ack_pending_set = true;
  }
  if (auto t = u.Param("timeout")) {
    auto ms = internal::ParseDurationMillis(*t, "nats timeout");
    if (!ms.ok()) return ms.status();
    if (*ms <= 0) return Status::InvalidArgument("nats timeout must be positive");
    o.timeout = Millis(*ms);
  }
  // A token: token_file=, alone (no user, no password).
  if (auto file = u.Param(kTokenFileParam)) {
    if (!u.user.empty() || u.has_password || u.Param(internal::kPasswordFileParam)) {
      return Status::InvalidArgument(
          "nats URI gives token_file= and a user or password too; a token is the only "
          "credential: give nats://HOST?token_file=F, or a user and password without it");
    }
    auto token = internal::ReadSecretFile("nats URI", kTokenFileParam, *file);
    if (!token.ok()) return token.status();
    o.token = std::move(token).value();
    return o;
  }
  // Inline or password_file= (core/secret.h).
  auto cred = internal::ResolveUriCredentials(u, {});
  if (!cred.ok()) return cred.status();
  if (cred->has_password && cred->user.empty()) {
    // nats.c sends a password only with a user name: it would go unused.
    return Status::InvalidArgument("nats URI gives a password without a user; give "
                                   "nats://USER:PASS@HOST or nats://USER@HOST?password_file=F "
                                   "(a token goes alone: nats://TOKEN@HOST or token_file=F)");
  }
  if (!cred->user.empty() && cred->has_password && cred->password.empty()) {
    // "nats://TOKEN:@HOST": nats.c reads it as a token (no password after an
    // empty one, and a user without a password is sent as auth_token), the URI
    // grammar as a user with an empty password. Not echoed: it may be a token.
    return Status::InvalidArgument(
        "nats URI gives an empty password (USER:@HOST), which nats.c reads as a "
        "token and the URI as a user: write nats://TOKEN@HOST or token_file=F for a "
        "token, nats://USER:PASSWORD@HOST or nats://USER@HOST?password_file=F for a user");
  }
  if (!cred->user.empty() && !cred->has_password) {
    // "nats://TOKEN@HOST": a lone user-info is a token, as every NATS client
    // reads a URL (sent as a user name, nats-server --auth refused it).
    o.token = cred->user;
    return o;
  }
  o.user = cred->user;
  o.password = cred->password;
  o.has_password = cred->has_password;
  return o;
}
}  // namespace

// ---- publisher ---------------------------------------------------------------

struct NatsPublisher::Impl {
  NatsOptions o;
  std::unique_ptr<Conn> conn;
  bool created_stream = false;
  int64_t max_msg_size = -1;  // the stream's, when Open() looked (-1: none, or not known)
};

bool NatsPublisher::created_stream() const { return impl_->created_stream; }

NatsPublisher::~NatsPublisher() = default;

StatusOr<std::unique_ptr<NatsPublisher>> NatsPublisher::Open(const NatsOptions& o) {
  if (o.stream.empty()) return Status::InvalidArgument("nats publisher: a stream is required");
  DEDUP_RETURN_IF_ERROR(CheckPublishNames(o));
  if (o.servers.empty()) return Status::InvalidArgument("nats publisher: no server");
  auto c = Connect(o);
  if (!c.ok()) return c.status();
  bool created = false;
  int64_t max_msg_size = -1;
  DEDUP_RETURN_IF_ERROR(EnsureStream(**c, o, o.stream, o.Subject(), &created));
  if (!created) {
    // An existing stream is taken as it is: a subject= it does not hold would
    // reach no stream ("no responders", read as a server to wait for), for ever.
    DEDUP_RETURN_IF_ERROR(CheckStreamHolds(**c, o, SubjectUse::kPublish,
                                           "a message published there reaches no stream",
                                           &max_msg_size));
  }
  std::unique_ptr<NatsPublisher> p(new NatsPublisher());
  p->impl_ = std::make_unique<Impl>();
  p->impl_->created_stream = created;
  p->impl_->max_msg_size = max_msg_size;
  p->impl_->o = o;
  p->impl_->conn = std::move(*c);
  return p;
}

Status NatsPublisher::Publish(std::string_view key, std::string_view data, bool* duplicate) {
  const NatsOptions& o = impl_->o;
  const std::string subject = o.Subject();
  natsMsg* msg = nullptr;
  natsStatus s = natsMsg_Create(&msg, subject.c_str(), nullptr, data.data(), static_cast<int>(data.size()));
  if (s != NATS_OK) return FromNats(s, "nats: message");
  const std::string k(key);
  jsPubOptions po;
  jsPubOptions_Init(&po);
  if (!k.empty()) {
    if (o.key.kind == brokers::KeyKind::kProperty) po.MsgId = k.c_str();
    if (o.key.kind == brokers::KeyKind::kHeader) s = natsMsgHeader_Set(msg, o.key.name.c_str(), k.c_str());
  }
  jsPubAck* pa = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  if (s == NATS_OK) s = js_PublishMsg(&pa, impl_->conn->js, msg, &po, &jerr);
  natsMsg_Destroy(msg);
  if (s != NATS_OK) {
    std::string what = "nats " + o.host_port + ": publish to " + subject;
    if (jerr == JSStreamMessageExceedsMaximumErr) {
      what += " (stream " + o.stream + ": " + std::to_string(data.size()) + " bytes of data" +
              (impl_->max_msg_size > 0
                   ? ", and it takes " + std::to_string(impl_->max_msg_size) + " bytes at most"
                   : std::string()) +
              ")";
    }
    return FromNats(s, what, jerr);
  }
  if (duplicate != nullptr) *duplicate = pa->Duplicate;
  jsPubAck_Destroy(pa);
  return Status::Ok();
}

// ---- source ------------------------------------------------------------------

namespace {

// nats.c hands header values out as C strings: a NUL byte in a value (which
// NATS allows, and other clients publish) ends the string there, silently.
// Reading a value whole means reading the header block after nats.c lifted it
// in place (src/msg.c, _liftHeaders and _processKeyValue; nats.c 3.4; it lifts
// a message without data already inside the fetch): the message is one
// allocation, subject NUL [reply NUL] block NUL data NUL (src/msg.h,
// natsMsg_create), and in the block nats.c wrote a NUL over each line's colon
// and over the first byte after each value (its first trailing white-space
// byte, or the line's CR when nothing trails it). Looking forward from a value
// alone cannot tell that NUL from one of the value: a value may hold a bare LF,
// and a single trailing space is gone under the NUL. So each value's line is
// bounded by where the next line begins, found backward from the next value
// (white space, the NUL over its colon, its key's bytes, an LF), or by the
// block's end. Within that bound the written NUL is exact: where the CR was when
// the byte before the LF is a NUL, else just before the white space that runs to
// the CR. A block that does not fit (a folded line, which nats.c joins into a
// copy cut at a NUL; a line that is no value's; a layout not as above) is
// refused whole: values are read whole or the headers "cannot be read", never
// cut. Reads stay inside [block, data).
static_assert(NATS_VERSION_MAJOR == 3, "re-check ReadHeadersWhole against nats.c's src/msg.c");
using Attributes = std::vector<std::pair<std::string, std::string>>;

struct HeaderValue {
  std::string key;
  const char* v;  // nats.c's value
  size_t n;       // strlen(v)
  const char* line = nullptr;  // where the line of this value begins
  std::string whole;
};

// "" when every value in `vals` got its `whole`; else why not.
std::string WholeValues(natsMsg* m, std::vector<HeaderValue>& vals) {
  const auto at = [](const char* p) { return reinterpret_cast<uintptr_t>(p); };
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  const std::string bad = "its header block is not laid out as nats.c 3 lifts it";
  const char* reply = natsMsg_GetReply(m);
  const char* before = reply != nullptr ? reply : natsMsg_GetSubject(m);
  const char* data = natsMsg_GetData(m);
  if (before == nullptr || data == nullptr) return bad;
  const char* b = before + std::strlen(before) + 1;
  const char* end = data - 1;  // the NUL natsMsg_create wrote after the block
  if (at(end) <= at(b) || at(end) - at(b) < 10 || *end != '\0' || std::memcmp(b, "NATS/1.0", 8) != 0) {
    return bad;
  }
  std::vector<HeaderValue*> in;
  for (auto& h : vals) {
    if (at(h.v) > at(b) && at(h.v) < at(end)) {
      in.push_back(&h);
    } else if (h.key == "Status" || h.key == "Description") {
      h.whole.assign(h.v, h.n);  // nats.c's own, from the status line
    } else {
      return "header " + h.key + " is folded over lines (nats.c joins them into a copy cut at a NUL byte)";
    }
  }
  std::sort(in.begin(), in.end(), [&](auto* x, auto* y) { return at(x->v) < at(y->v); });
  for (HeaderValue* h : in) {
    const char* c = h->v;
    while (at(c) > at(b) && space(c[-1])) --c;
    const size_t kl = h->key.size();
    if (at(c) - at(b) < kl + 2 || c[-1] != '\0') return bad;
    const char* s = c - 1 - kl;
    if (std::memcmp(s, h->key.data(), kl) != 0 || s[-1] != '\n') return bad;
    h->line = s;
  }
  const char* last = nullptr;  // where the line after the last value begins
  if (end[-1] == '\n' && end[-2] == '\r' && end[-3] == '\n') {
    last = end - 2;  // the empty line that ends the block
  } else if (end[-1] == '\r' && end[-2] == '\n') {
    last = end - 1;
  } else if (end[-1] == '\n') {
    last = end;
  } else {
    return bad;
  }
  for (size_t i = 0; i < in.size(); ++i) {
    HeaderValue& h = *in[i];
    const char* next = i + 1 < in.size() ? in[i + 1]->line : last;
    const char* z = h.v + h.n;  // the first NUL after v
    if (at(next) < at(z) + 2 || next[-1] != '\n') return bad;
    const char* e = next - 2;
    const char* p = nullptr;  // the NUL nats.c wrote
    if (*e == '\0') {
      p = e;  // over the CR: nothing trailed the value
    } else if (*e == '\r') {
      const char* x = e;
      while (at(x) > at(z) + 1 && space(x[-1])) --x;
      if (x[-1] != '\0') return bad;
      p = x - 1;  // over the first trailing white-space byte
    } else {
      return bad;
    }
    std::string w(h.v, static_cast<size_t>(p - h.v));
    // A line end inside: a line that is no value's was taken in (or a NUL then a
    // bare LF in the value, which cannot be told from one).
    if (w.find("\r\n") != std::string::npos || w.find(std::string_view("\0\n", 2)) != std::string::npos) {
      return "header " + h.key + " cannot be told from the line after it";
    }
    h.whole = std::move(w);
  }
  return "";
}

// The message's headers, every value of a repeated one, in nats.c's order.
// "" when read whole; else why not (`out` then holds nats.c's C strings, and
// none may be taken for a key).
std::string ReadHeadersWhole(natsMsg* m, Attributes* out) {
  const char** keys = nullptr;
  int nk = 0;
  const natsStatus hs = natsMsgHeader_Keys(m, &keys, &nk);
  if (hs == NATS_NOT_FOUND) return "";
  // A header block nats.c cannot parse (a NUL byte in a name, no colon).
  if (hs != NATS_OK) return std::string("nats.c: ") + natsStatus_GetText(hs);
  std::vector<HeaderValue> vals;
  for (int i = 0; i < nk; ++i) {
    const char** values = nullptr;
    int nv = 0;
    if (natsMsgHeader_Values(m, keys[i], &values, &nv) == NATS_OK) {
      for (int j = 0; j < nv; ++j) {
        if (values[j] != nullptr) vals.push_back({keys[i], values[j], std::strlen(values[j]), nullptr, {}});
      }
      free(values);
    }
  }
  free(keys);
  const std::string why = WholeValues(m, vals);
  for (const auto& h : vals) out->emplace_back(h.key, why.empty() ? h.whole : std::string(h.v, h.n));
  return why;
}

struct Shared {
  NatsOptions o;
  std::unique_ptr<Conn> conn;
  natsSubscription* sub = nullptr;
  ~Shared() {
    if (sub != nullptr) natsSubscription_Destroy(sub);
  }
};

class NatsDelivery final : public Delivery {
 public:
  NatsDelivery(std::shared_ptr<Shared> s, natsMsg* m) : s_(std::move(s)), msg_(m) {
    jsMsgMetaData* meta = nullptr;
    if (natsMsg_GetMetaData(&meta, msg_) == NATS_OK) {
      id_ = std::to_string(meta->Sequence.Stream);
      consumer_seq_ = meta->Sequence.Consumer;
      delivery_count_ = static_cast<uint32_t>(meta->NumDelivered);
      jsMsgMetaData_Destroy(meta);
    }
    const char* data = natsMsg_GetData(msg_);
    payload_.assign(data != nullptr ? data : "", static_cast<size_t>(natsMsg_GetDataLength(msg_)));
    // Every value of a repeated header, whole: a NUL byte in it included. Headers
    // that cannot be read whole give no key, nor does a key header given twice.
    const std::string unread = ReadHeadersWhole(msg_, &attributes_);
    if (!unread.empty()) headers_error_ = "its headers cannot be read (" + unread + ")";
    const NatsOptions& o = s_->o;
    size_t copies = 0;  // of the key's header
    auto header = [&](const std::string& name) -> const std::string* {
      const std::string* first = nullptr;
      for (const auto& [k, v] : attributes_) {
        if (k != name) continue;
        ++copies;
        if (first == nullptr) first = &v;
      }
      return first;
    };
    switch (o.key.kind) {
      case brokers::KeyKind::kContentSha256:
        key_ = o.key_prefix + internal::HexSha256(payload_);
        break;
      default: {  // msgid (the only property NATS's grammar names) reads Nats-Msg-Id
        const std::string name = o.key.kind == brokers::KeyKind::kHeader ? o.key.name : "Nats-Msg-Id";
        const std::string* v = header(name);
        if (!headers_error_.empty()) {
          key_error_ = "message has no readable " + name + " header: " + headers_error_;
        } else if (v == nullptr || v->empty()) {
          key_error_ = "message has no " + name + " header";
        } else if (copies > 1) {
          // Which one is the key? Taking the first ran "K: a / K: b" as a and
          // "K: b / K: a" as b (the Redis source's key field given twice gives no key too).
          key_error_ = "message has " + std::to_string(copies) + " " + name +
                       " headers: a key is one value";
        } else if (v->find('\0') != std::string::npos) {
          // Read as a C string it would be cut at the NUL: "k\0one" and "k\0two"
          // one key, the second skipped as a duplicate of the first.
          key_error_ = "header " + name + " holds a NUL byte ('" + internal::Printable(*v) +
                       "'): not used as a key";
        } else {
          key_ = o.key_prefix + *v;
        }
        break;
      }
    }
  }
  ~NatsDelivery() override { natsMsg_Destroy(msg_); }
  uint64_t consumer_seq() const { return consumer_seq_; }

  // +ACK and waits for the server's reply, so that once Ack() returned the
  // consumer no longer counts the message (AckBatch pipelines instead).
  Status Ack() override {
    std::lock_guard<std::mutex> lock(mu_);
    return Settle(natsMsg_AckSync(msg_, nullptr, nullptr), "ack");
  }
  // +ACK without waiting; AckBatch flushes once for all.
  Status AckNoWait() {
    std::lock_guard<std::mutex> lock(mu_);
    return Settle(natsMsg_Ack(msg_, nullptr), "ack");
  }
  Status Retry(Millis after) override {
    std::lock_guard<std::mutex> lock(mu_);
    natsStatus s = after.count() > 0 ? natsMsg_NakWithDelay(msg_, after.count(), nullptr)
                                     : natsMsg_Nak(msg_, nullptr);
    // The server handles a connection's messages in order: after the flush's PONG
    // it has the NAK.
    if (s == NATS_OK) s = natsConnection_FlushTimeout(s_->conn->nc, s_->o.timeout.count());
    return FromNats(s, "nats " + s_->o.host_port + ": nak");
  }
  // The copy, whole; refused as too large (the server's max_payload, the dead
  // stream's max_msg_size: every later try would be refused the same way, and
  // the message would come back after every AckWait, never recorded nor
  // settled), the copy without the data, then without the headers too (Shape):
  // what names the message (its stream and sequence, where the original stays
  // while the stream's limits keep it) and why it died are always recorded.
  Status DeadLetter(std::string_view reason) override {
    std::string too_large, without_data, without_headers;
    Status copied = CopyDead(reason, Shape::kWhole, "", "", &too_large);
    if (!copied.ok() && !too_large.empty()) {
      without_data = too_large;
      copied = CopyDead(reason, Shape::kNoData, without_data, "", &too_large);
    }
    if (!copied.ok() && !too_large.empty()) {
      without_headers = too_large;
      copied = CopyDead(reason, Shape::kBare, without_data, without_headers, &too_large);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!copied.ok()) {
      // No copy: give it back rather than lose it. Redelivered after ack_wait,
      // as if never settled: at once, a copy that failed (a full dead stream, a
      // lost connection) would fail again, in a loop as fast as the network.
      (void)natsMsg_NakWithDelay(msg_, s_->o.ack_wait.count(), nullptr);
      return copied;
    }
    natsStatus s = natsMsg_Term(msg_, nullptr);
    if (s == NATS_OK) s = natsConnection_FlushTimeout(s_->conn->nc, s_->o.timeout.count());
    return FromNats(s, "nats " + s_->o.host_port + ": term");
  }
  // Called by the Consumer's fetch thread with the Consumer's lock held: never
  // waits for an Ack / Retry / DeadLetter in progress (they hold mu_ across a
  // flush, a round trip); a delivery being settled needs no +WPI.
  Status InProgress() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return Status::Ok();
    return FromNats(natsMsg_InProgress(msg_, nullptr), "nats " + s_->o.host_port + ": in progress");
  }

 private:
  Status Settle(natsStatus s, const char* what) {
    return FromNats(s, "nats " + s_->o.host_port + ": " + what);
  }

  // What a dead letter's copy carries (DeadLetter): kWhole, the data and every
  // header; kNoData, every header (Dedup-Payload-Dropped says how many bytes of
  // data were left off, and why); kBare, only the original Nats-Msg-Id and the
  // Dedup-* headers, the reason cut to kBareReasonBytes (Dedup-Headers-Dropped
  // says how many headers were left off).
  enum class Shape { kWhole, kNoData, kBare };
  static constexpr size_t kBareReasonBytes = 256;

  // PublishDead, and once more after making the dead stream again when no
  // stream took it (deleted meanwhile), instead of NAKing every delivery of it
  // for ever.
  Status CopyDead(std::string_view reason, Shape shape, const std::string& data_why,
                  const std::string& headers_why, std::string* too_large) {
    Status copied = PublishDead(reason, shape, data_why, headers_why, too_large);
    if (copied.code() == StatusCode::kUnavailable &&
        copied.message().find("No responders") != std::string::npos) {
      if (EnsureDeadStream(*s_->conn, s_->o).ok()) {
        copied = PublishDead(reason, shape, data_why, headers_why, too_large);
      }
    }
    return copied;
  }

  // Publishes the copy and awaits its PubAck. `data_why`, `headers_why`: why a
  // larger copy was refused (kNoData, kBare). *too_large: why this one was
  // refused as too large (empty: it was not), which a smaller copy may get past.
  Status PublishDead(std::string_view reason, Shape shape, const std::string& data_why,
                     const std::string& headers_why, std::string* too_large) {
    too_large->clear();
    const NatsOptions& o = s_->o;
    const std::string subject = o.DeadSubject();
    const bool with_data = shape == Shape::kWhole;
    natsMsg* m = nullptr;
    natsStatus s = natsMsg_Create(&m, subject.c_str(), nullptr, with_data ? payload_.data() : "",
                                  with_data ? static_cast<int>(payload_.size()) : 0);
    if (s != NATS_OK) return FromNats(s, "nats: dead-letter message");
    // JetStream's own headers travel under other names: they would act on the
    // dead stream. The original id, so that its duplicate window does not drop
    // a second dead letter of one key; Nats-Expected-Stream (and -Last-*),
    // which made it refuse the copy; Nats-Rollup, which would purge it.
    const auto renamed = [](const std::string& k) {
      return k == "Nats-Msg-Id"        ? std::string("Dedup-Original-Msg-Id")
             : k.starts_with("Nats-") ? "Dedup-Original-" + k
                                       : k;
    };
    // A name the copy gives a renamed header is this message's: a header the
    // original already has under it (a dead letter sent back by hand) is left
    // off, or the copy would carry two values, the stale one possibly first.
    std::set<std::string> given;
    for (const auto& [k, v] : attributes_) {
      if (k.starts_with("Nats-")) given.insert(renamed(k));
    }
    // A value nats.c cannot carry as it is (a NUL byte would cut it; a CR or LF
    // it turns into a space) goes escaped (core/printable.h: "\x00", a backslash
    // as "\\"), and its header is named in Dedup-Escaped-Headers.
    std::string escaped;
    size_t dropped_headers = 0, dropped_bytes = 0;
    for (const auto& [k, v] : attributes_) {
      if (!k.starts_with("Nats-") && given.count(k) != 0) continue;
      if (k == "Dedup-Escaped-Headers" || k == "Dedup-Headers-Unreadable") continue;
      std::string value = v;
      if (shape == Shape::kBare) {
        // Only the original id, which names the message (as its key, mostly).
        if (k != "Nats-Msg-Id") {
          ++dropped_headers;
          dropped_bytes += k.size() + v.size();
          continue;
        }
        value = internal::CutAtCharacter(v, kBareReasonBytes);
      }
      const bool raw = value.find_first_of(std::string_view("\0\r\n", 3)) == std::string::npos;
      const std::string name = renamed(k);
      if (!raw && escaped.find("," + name + ",") == std::string::npos) {
        escaped += (escaped.empty() ? "," : "") + name + ",";
      }
      if (s == NATS_OK) {
        s = natsMsgHeader_Add(m, name.c_str(), raw ? value.c_str() : internal::Printable(value).c_str());
      }
    }
    // The reason too (a handler's own text), cut to what a header holds.
    std::string why = shape == Shape::kBare ? internal::CutAtCharacter(reason, kBareReasonBytes)
                                            : brokers::HeaderReason(reason);
    if (why.find_first_of(std::string_view("\0\r\n", 3)) != std::string::npos) {
      why = internal::Printable(why);
      escaped += (escaped.empty() ? "," : "") + std::string("Dedup-Reason,");
    }
    if (s == NATS_OK && !escaped.empty()) {
      s = natsMsgHeader_Set(m, "Dedup-Escaped-Headers", escaped.substr(1, escaped.size() - 2).c_str());
    }
    if (s == NATS_OK && !headers_error_.empty()) {
      s = natsMsgHeader_Set(m, "Dedup-Headers-Unreadable", headers_error_.c_str());
    }
    if (s == NATS_OK && !with_data && !payload_.empty()) {
      s = natsMsgHeader_Set(m, "Dedup-Payload-Dropped",
                            (std::to_string(payload_.size()) + " bytes: the copy with them was " +
                             data_why)
                                .c_str());
    }
    if (s == NATS_OK && dropped_headers > 0) {
      s = natsMsgHeader_Set(m, "Dedup-Headers-Dropped",
                            (std::to_string(dropped_headers) + " headers (" +
                             std::to_string(dropped_bytes) + " bytes): the copy with them was " +
                             headers_why)
                                .c_str());
    }
    if (s == NATS_OK) s = natsMsgHeader_Set(m, "Dedup-Reason", why.c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(m, "Dedup-Stream", o.stream.c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(m, "Dedup-Sequence", id_.c_str());
    jsPubAck* pa = nullptr;
    jsErrCode jerr = static_cast<jsErrCode>(0);
    if (s == NATS_OK) s = js_PublishMsg(&pa, s_->conn->js, m, nullptr, &jerr);
    natsMsg_Destroy(m);
    if (pa != nullptr) jsPubAck_Destroy(pa);
    if (s == NATS_MAX_PAYLOAD) {
      *too_large = "over the server's max_payload (" +
                   std::to_string(natsConnection_GetMaxPayload(s_->conn->nc)) +
                   " bytes, data and headers)";
    } else if (s != NATS_OK && jerr == JSStreamMessageExceedsMaximumErr) {
      *too_large = "over the max_msg_size of the stream holding " + subject +
                   " (JetStream error 10054)";
    }
    return FromNats(s, "nats " + o.host_port + ": dead letter to " + subject, jerr);
  }

  std::shared_ptr<Shared> s_;
  natsMsg* msg_;
  std::string headers_error_;  // why the headers could not be read; empty: they were
  uint64_t consumer_seq_ = 0;  // the consumer's number of this delivery
  std::mutex mu_;  // natsMsg's ack state is not meant for two threads at once
};

Status EnsureConsumer(Conn& conn, const NatsOptions& o, bool* made, uint64_t* delivered,
                      Millis look_wait);

class NatsSource final : public MessageSource {
 public:
  // `delivered`: the consumer's last delivery sequence when it was looked at.
  NatsSource(std::shared_ptr<Shared> s, uint64_t delivered) : s_(std::move(s)) { last_cseq_ = delivered; }

  StatusOr<std::vector<std::unique_ptr<Delivery>>> Fetch(size_t max, Millis wait) override {
    std::vector<std::unique_ptr<Delivery>> out;
    if (max == 0) return out;
    if (!consumer_ok_) DEDUP_RETURN_IF_ERROR(CheckConsumer());
    Status pulled = Pull(max, std::max(wait, Millis(1)), &out);
    if (out.empty()) {
      // Nothing came (or the pull failed): a consumer that is gone answers no
      // pull, which reads as "nothing there". Look, at most every kConsumerCheckEvery.
      if (std::chrono::steady_clock::now() - last_check_ >= kConsumerCheckEvery) {
        DEDUP_RETURN_IF_ERROR(CheckConsumer());
      }
      DEDUP_RETURN_IF_ERROR(pulled);
      return out;
    }
    // A consumer numbers its deliveries 1, 2, ... : one at or below the last
    // number seen comes from a consumer made since (by another worker of this
    // one, or by someone else), which must pass the checks before its messages
    // are handed out. Refused: they are dropped unsettled (its own AckWait gives
    // them back), and each fetch says why.
    uint64_t lowest = UINT64_MAX, highest = 0;
    for (const auto& d : out) {
      const uint64_t c = static_cast<NatsDelivery*>(d.get())->consumer_seq();
      lowest = std::min(lowest, c);
      highest = std::max(highest, c);
    }
    // A source that has handed out nothing (0) cannot tell a new consumer's 1
    // from the first of its own: that first batch is checked too.
    if (lowest <= last_cseq_ || last_cseq_ == 0) {
      Status fit = CheckConsumer();
      if (!fit.ok()) {
        out.clear();
        return fit;
      }
    }
    last_cseq_ = std::max(last_cseq_, highest);
    return out;
  }

  // Every +ACK sent at once, then one flush (PING/PONG): one round trip, and the
  // server has them all when it answers. One status per delivery: its own when
  // its +ACK could not be sent; the flush's for those sent (a failed flush
  // leaves each of them unknown: counted as not acked, the broker redelivers).
  std::vector<Status> AckBatch(std::span<Delivery* const> deliveries) override {
    std::vector<Status> out;
    out.reserve(deliveries.size());
    std::vector<bool> queued(deliveries.size(), false);
    bool any = false;
    for (size_t i = 0; i < deliveries.size(); ++i) {
      auto* nd = dynamic_cast<NatsDelivery*>(deliveries[i]);
      out.push_back(nd != nullptr ? nd->AckNoWait() : deliveries[i]->Ack());
      queued[i] = nd != nullptr && out.back().ok();
      any = any || queued[i];
    }
    if (!any) return out;
    const natsStatus f = natsConnection_FlushTimeout(s_->conn->nc, s_->o.timeout.count());
    if (f != NATS_OK) {
      const Status flush = FromNats(f, "nats " + s_->o.host_port + ": flush acks");
      for (size_t i = 0; i < out.size(); ++i) {
        if (queued[i]) out[i] = flush;
      }
    }
    return out;
  }

  std::string Describe() const override { return s_->o.Describe(); }

 private:
  // The consumer deleted while the source runs (an operator, an
  // InactiveThreshold): its pulls went unanswered, read as empty batches, for
  // ever. It is looked up when a fetch brings nothing (at most every
  // kConsumerCheckEvery: a consumer info is a round trip) and when a delivery's
  // consumer sequence says it is a new one; missing, it is made again as at open
  // (EnsureConsumer); one that someone else made and that fails the open's checks
  // is refused, each fetch answering what is wrong with it, until it is fixed.
  static constexpr Millis kConsumerCheckEvery{1'000};
  Status CheckConsumer() {
    last_check_ = std::chrono::steady_clock::now();
    bool made = false;
    uint64_t delivered = 0;
    // The look waits a second at most: a broker that hangs holds the fetch
    // thread no longer than that (the open waits the whole timeout).
    Status st = EnsureConsumer(*s_->conn, s_->o, &made, &delivered,
                               std::min(s_->o.timeout, Millis(1'000)));
    // Only a verdict on the consumer counts; a server out of reach says nothing.
    if (st.ok()) {
      consumer_ok_ = true;
      last_cseq_ = made ? 0 : std::min(last_cseq_, delivered);
    }
    if (st.code() == StatusCode::kFailedPrecondition) consumer_ok_ = false;
    return st;
  }

  bool consumer_ok_ = true;  // the last look at the consumer found it fit
  uint64_t last_cseq_ = 0;   // the highest consumer sequence of a delivery handed out
  std::chrono::steady_clock::time_point last_check_ = std::chrono::steady_clock::now();

  // natsSubscription_Fetch asks for what is there without waiting first, and
  // only then waits; it returns a partial batch once the server says no more
  // are available. (A hand-made no-wait request followed by a waiting one is
  // not safe with nats.c 3.4: the first one's late "404 No Messages" ends the
  // second.)
  Status Pull(size_t n, Millis wait, std::vector<std::unique_ptr<Delivery>>* out) {
    natsMsgList list{};
    const natsStatus s = natsSubscription_Fetch(&list, s_->sub, static_cast<int>(std::min<size_t>(n, 1'000'000)),
                                                wait.count(), nullptr);
    for (int i = 0; i < list.Count; ++i) {
      out->push_back(std::make_unique<NatsDelivery>(s_, list.Msgs[i]));
      list.Msgs[i] = nullptr;  // owned by the delivery now
    }
    natsMsgList_Destroy(&list);
    if (s == NATS_OK || s == NATS_TIMEOUT || s == NATS_NOT_FOUND) return Status::Ok();
    if (!out->empty()) return Status::Ok();  // report the error on the next call
    return FromNats(s, "nats " + s_->o.host_port + ": fetch from " + s_->o.stream + "/" + s_->o.consumer);
  }

  std::shared_ptr<Shared> s_;
};

// The durable consumer `o.consumer`: an existing one is used when it passes
// CheckConsumer (FailedPrecondition naming the setting otherwise); a missing one
// is made (explicit acks, no MaxDeliver, filtered on the subject, AckWait =
// ack_wait), *made = true. At open, and again while the source runs when the
// consumer is gone (deleted by an operator or an InactiveThreshold).
Status EnsureConsumer(Conn& conn, const NatsOptions& o, bool* made, uint64_t* delivered,
                      Millis look_wait) {
  if (made != nullptr) *made = false;
  if (delivered != nullptr) *delivered = 0;
  jsConsumerInfo* ci = nullptr;
  jsErrCode jerr = static_cast<jsErrCode>(0);
  jsOptions look;
  jsOptions_Init(&look);
  look.Wait = look_wait.count();
  natsStatus st = js_GetConsumerInfo(&ci, conn.js, o.stream.c_str(), o.consumer.c_str(), &look, &jerr);
  if (st == NATS_OK) {
    if (delivered != nullptr) *delivered = ci->Delivered.Consumer;
    Status usable = CheckConsumer(conn, o, *ci);
    // At open only: the open asks for no `made`, the look while running does.
    if (usable.ok() && made == nullptr) WarnAboutConsumer(o, *ci);
    jsConsumerInfo_Destroy(ci);
    DEDUP_RETURN_IF_ERROR(usable);
  } else if (st == NATS_NOT_FOUND || jerr == JSConsumerNotFoundErr) {
    jsConsumerConfig cc;
    jsConsumerConfig_Init(&cc);
    cc.Durable = o.consumer.c_str();
    cc.AckPolicy = js_AckExplicit;
    cc.DeliverPolicy = js_DeliverAll;
    cc.AckWait = o.ack_wait.count() * kNanosPerMilli;
    cc.MaxDeliver = -1;
    cc.MaxAckPending = o.max_ack_pending;
    const std::string subject = o.Subject();
    cc.FilterSubject = subject.c_str();
    jerr = static_cast<jsErrCode>(0);
    st = js_AddConsumer(&ci, conn.js, o.stream.c_str(), &cc, nullptr, &jerr);
    if (st == NATS_OK) {
      jsConsumerInfo_Destroy(ci);
      if (made != nullptr) *made = true;
    }
    // Two workers starting at once may both create it: the second finds it made
    // (by the other worker, or by anyone: checked as above).
    if (st != NATS_OK) {
      jerr = static_cast<jsErrCode>(0);
      st = js_GetConsumerInfo(&ci, conn.js, o.stream.c_str(), o.consumer.c_str(), nullptr, &jerr);
      if (st == NATS_OK) {
        Status usable = CheckConsumer(conn, o, *ci);
        jsConsumerInfo_Destroy(ci);
        DEDUP_RETURN_IF_ERROR(usable);
      }
    }
    DEDUP_RETURN_IF_ERROR(FromNats(st, "nats " + o.host_port + ": add consumer " + o.consumer, jerr));
  } else {
    return FromNats(st, "nats " + o.host_port + ": consumer info " + o.consumer, jerr);
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<MessageSource>> OpenNatsSource(const NatsOptions& o) {
  if (o.stream.empty() || o.consumer.empty()) {
    return Status::InvalidArgument("nats source: stream and consumer are required");
  }
  DEDUP_RETURN_IF_ERROR(CheckNames(o));
  if (o.servers.empty()) return Status::InvalidArgument("nats source: no server");
  auto c = Connect(o);
  if (!c.ok()) return c.status();
  auto s = std::make_shared<Shared>();
  s->o = o;
  s->conn = std::move(*c);
  Conn& conn = *s->conn;
  bool created = false;
  DEDUP_RETURN_IF_ERROR(EnsureStream(conn, o, o.stream, o.Subject(), &created));
  // A subject= the stream does not hold (the default, the stream's name, too) was
  // refused by the server's "add consumer: Not Found (JetStream error 10014)".
  if (!created) {
    DEDUP_RETURN_IF_ERROR(CheckStreamHolds(
        conn, o, SubjectUse::kFilter, "a consumer filtered on it would never read a message (give subject= one of "
                 "the stream's subjects)"));
  }
  DEDUP_RETURN_IF_ERROR(EnsureDeadStream(conn, o));
  uint64_t delivered = 0;
  DEDUP_RETURN_IF_ERROR(EnsureConsumer(conn, o, nullptr, &delivered, o.timeout));
  jsErrCode jerr = static_cast<jsErrCode>(0);
  natsStatus st = NATS_OK;
  jsSubOptions so;
  jsSubOptions_Init(&so);
  so.Stream = o.stream.c_str();
  so.Consumer = o.consumer.c_str();
  const std::string subject = o.Subject();
  jerr = static_cast<jsErrCode>(0);
  st = js_PullSubscribe(&s->sub, conn.js, subject.c_str(), o.consumer.c_str(), nullptr, &so, &jerr);
  DEDUP_RETURN_IF_ERROR(FromNats(st, "nats " + o.host_port + ": pull subscribe " + o.consumer, jerr));
  return std::unique_ptr<MessageSource>(std::make_unique<NatsSource>(std::move(s), delivered));
}

StatusOr<std::unique_ptr<MessageSource>> OpenNatsSource(std::string_view uri,
                                                        const SourceOptions& options) {
  auto o = ParseNatsUri(uri);
  if (!o.ok()) return o.status();
  if (!o->ack_wait_set) o->ack_wait = options.lease + Millis(1'000);
  o->lease = options.lease;
  o->on_warning = options.on_warning;
  return OpenNatsSource(*o);
}

}  // namespace dedup::nats
