// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// NATS JetStream as a MessageSource (consumer.h), on nats.c (libnats).
//
//   nats://host:4222?stream=JOBS&consumer=workers&subject=jobs.in
//
// Parameters:
//   stream=NAME        the stream (created, file-backed, on `subject` if missing)
//   consumer=NAME      the durable pull consumer (created if missing: explicit
//                      acks, unlimited deliveries, filtered on `subject`; an
//                      existing one with other acks, a MaxDeliver or another
//                      filter, or none on a stream holding more, is refused)
//   subject=SUBJ       the subject the stream holds and the consumer filters.
//                      Default: the stream name
//   key=msgid          the dedup key is the Nats-Msg-Id header (default)
//   key=header:NAME    ... the value of header NAME
//   key=sha256         ... the hex SHA-256 of the data
//                      (the key= grammar every source shares: brokers/key_spec.h)
//   prefix=P           prepended to every key
//   dead=SUBJ          where dead letters go. Default: dedup.dead.<stream>, held by
//                      a stream <stream>_DEAD created if no stream holds it. No
//                      wildcard, and not a subject the consumer's filter selects
//   ack_wait=DUR       the consumer's AckWait when it is created. Default: the
//                      lease + 1 s through OpenSource, else 30 s
//   max_ack_pending=N  ... its MaxAckPending. Default: 1000
//   password_file=F    the password from file F (core/secret.h):
//                      nats://USER@HOST?password_file=F
//   token_file=F       a token (nats-server --auth) from file F, read as
//                      password_file= is; the URI then names no user
//
// Credentials as the NATS clients read a URL (nats.c's natsOptions_SetToken,
// nats.go, the docs' "nats://token@server:port"): nats://USER:PASS@HOST is a
// user and password, and a lone nats://TOKEN@HOST is a token, not a user name.
// Neither the token nor the password is ever in a message.
//
// How the consumer seam maps onto JetStream:
//   Ack()            +ACK (after the outcome is recorded)
//   Retry(after)     -NAK with a delay of `after`: the server redelivers then
//   DeadLetter(why)  a copy (data, headers, Dedup-Reason: <why>) published to the
//                    dead subject and stored (PubAck awaited); then +TERM. A
//                    copy too large (max_payload, the dead stream's
//                    max_msg_size) goes without the data, then with only what
//                    names the message (Dedup-Payload-Dropped, -Headers-
//                    Dropped). No copy: -NAK with a delay of ack_wait (never
//                    at once: a loop)
//   InProgress()     +WPI: resets AckWait. The Consumer sends it every heartbeat
//                    interval for each delivery it holds (running or fetched
//                    ahead), so a message worked on longer than AckWait is not
//                    redelivered while its lease is alive. AckWait should be longer
//                    than the heartbeat interval (lease / 3); after a crash the
//                    message comes back after AckWait (a redelivery that finds the
//                    lease still held gets BUSY and is NAKed until it ends).
// nats.c reconnects by itself (forever, every 250 ms); acks sent while the
// connection is down are buffered and sent after the reconnect, and anything the
// server did not get an ack for is redelivered after AckWait.
//
// `dedup publish` to NATS writes the key where the source reads it: with
// key=msgid as Nats-Msg-Id, so the stream's duplicate window (2 minutes by
// default) drops publish-side repeats before any worker sees them; with
// key=header:NAME in that header only (the broker then keeps repeats, and the
// buffer's retention decides).

#ifndef DEDUP_SRC_BROKERS_NATS_NATS_SOURCE_H_
#define DEDUP_SRC_BROKERS_NATS_NATS_SOURCE_H_

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dedup/clock.h"
#include "brokers/key_spec.h"
#include "dedup/consumer.h"
#include "dedup/status.h"

namespace dedup::nats {

struct NatsOptions {
  // The one source of truth for where to connect: the servers of the URI's
  // hosts, each "nats://host:port" (port 4222 when none is written), split and
  // checked once by ParseNatsUri; the user and password apart (never in a
  // message).
  std::vector<std::string> servers = {"nats://127.0.0.1:4222"};
  std::string user;      // empty: none
  std::string password;  // with has_password
  bool has_password = false;
  // Token authentication (nats-server --auth, authorization { token: ... }):
  // empty when none. Never with a user.
  std::string token;
  std::string host_port = "127.0.0.1:4222";  // the URI's hosts as written, for messages
  std::string stream;
  std::string consumer;
  std::string subject;  // default: stream
  // Where the key is (brokers/key_spec.h): msgid (Nats-Msg-Id, default),
  // header:NAME or sha256.
  brokers::KeySpec key{brokers::KeyKind::kProperty, "msgid"};
  std::string key_prefix;
  std::string dead;  // default: dedup.dead.<stream>
  Millis ack_wait{30'000};
  bool ack_wait_set = false;  // ack_wait= was in the URI
  int max_ack_pending = 1000;
  bool max_ack_pending_set = false;  // max_ack_pending= was in the URI
  // The Buffer's lease (SourceOptions::lease; 0: not known), and where settings
  // that work but are likely not meant are told at open: an existing consumer
  // whose AckWait or MaxAckPending is not the URI's, or whose AckWait is under
  // the heartbeat interval (lease / 3). Unset: not told.
  Millis lease{0};
  std::function<void(const std::string&)> on_warning;
  // Connect timeout and the wait for JetStream API replies and PubAcks. Default: 5 s.
  Millis timeout{5'000};

  std::string Subject() const { return subject.empty() ? stream : subject; }
  std::string DeadSubject() const { return dead.empty() ? "dedup.dead." + stream : dead; }
  std::string Describe() const;
};

// InvalidArgument naming the problem. `need_consumer`: false for `dedup publish`
// (which also needs a subject without wildcards).
StatusOr<NatsOptions> ParseNatsUri(std::string_view uri, bool need_consumer = true);

// Publishes to the stream's subject and waits for each PubAck. One caller at a
// time.
class NatsPublisher {
 public:
  ~NatsPublisher();
  NatsPublisher(const NatsPublisher&) = delete;
  NatsPublisher& operator=(const NatsPublisher&) = delete;
  // Connects and creates the stream when it is missing.
  static StatusOr<std::unique_ptr<NatsPublisher>> Open(const NatsOptions& o);
  // Open() made the stream: it was not there (a mistyped stream= would otherwise
  // fill a stream no consumer reads, without a word).
  bool created_stream() const;

  // Publishes `data` with `key` placed as the options say (Nats-Msg-Id or a
  // header; nothing for sha256). *duplicate: the stream dropped it as a repeat
  // of a Nats-Msg-Id inside its duplicate window.
  [[nodiscard]] Status Publish(std::string_view key, std::string_view data, bool* duplicate);

 private:
  NatsPublisher() = default;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

StatusOr<std::unique_ptr<MessageSource>> OpenNatsSource(const NatsOptions& o);
// From a nats:// URI (the broker scheme table's row). Without ack_wait= in the
// URI, AckWait is the lease + 1 s: a crashed worker's message comes back once its
// lease has ended, and a live one's +WPI (every lease / 3) keeps it.
StatusOr<std::unique_ptr<MessageSource>> OpenNatsSource(std::string_view uri,
                                                        const SourceOptions& options = {});

}  // namespace dedup::nats

#endif  // DEDUP_SRC_BROKERS_NATS_NATS_SOURCE_H_
