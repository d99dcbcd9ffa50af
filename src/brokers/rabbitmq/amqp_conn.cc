// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/rabbitmq/amqp_conn.h"

#include <amqp_tcp_socket.h>
#include <sys/time.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>

namespace dedup::rabbitmq {

void TableBuilder::AddString(std::string key, std::string value) {
  entries_.push_back({std::move(key), std::move(value), 0, false});
}
void TableBuilder::AddInt(std::string key, int64_t value) {
  entries_.push_back({std::move(key), {}, value, true});
}
amqp_table_t TableBuilder::Table() {
  built_.clear();
  for (const Entry& e : entries_) {
    amqp_table_entry_t t{};
    t.key = Bytes(e.key);
    if (e.is_num) {
      t.value.kind = AMQP_FIELD_KIND_I64;
      t.value.value.i64 = e.num;
    } else {
      t.value.kind = AMQP_FIELD_KIND_UTF8;
      t.value.value.bytes = Bytes(e.str);
    }
    built_.push_back(t);
  }
  return amqp_table_t{static_cast<int>(built_.size()), built_.empty() ? nullptr : built_.data()};
}

namespace {

// The short-string properties, each with its flag.
struct ShortString {
  amqp_flags_t flag;
  amqp_bytes_t amqp_basic_properties_t::*field;
};
constexpr ShortString kShortStrings[] = {
    {AMQP_BASIC_CONTENT_TYPE_FLAG, &amqp_basic_properties_t::content_type},
    {AMQP_BASIC_CONTENT_ENCODING_FLAG, &amqp_basic_properties_t::content_encoding},
    {AMQP_BASIC_CORRELATION_ID_FLAG, &amqp_basic_properties_t::correlation_id},
    {AMQP_BASIC_REPLY_TO_FLAG, &amqp_basic_properties_t::reply_to},
    {AMQP_BASIC_EXPIRATION_FLAG, &amqp_basic_properties_t::expiration},
    {AMQP_BASIC_MESSAGE_ID_FLAG, &amqp_basic_properties_t::message_id},
    {AMQP_BASIC_TYPE_FLAG, &amqp_basic_properties_t::type},
    {AMQP_BASIC_USER_ID_FLAG, &amqp_basic_properties_t::user_id},
    {AMQP_BASIC_APP_ID_FLAG, &amqp_basic_properties_t::app_id},
    {AMQP_BASIC_CLUSTER_ID_FLAG, &amqp_basic_properties_t::cluster_id},
};

// An original header a copy leaves off (AmqpMessage::original). CC and BCC
// (case-sensitive, as the broker reads them) route a published message to more
// queues: the original was routed by them already, and a copy that kept them
// would be delivered there again.
bool LeftOffCopies(std::string_view name) {
  return name == "x-delivery-count" || name == "x-death" || name.starts_with("x-first-death-") ||
         name.starts_with("x-last-death-") || name.starts_with("x-dedup-") || name == "CC" ||
         name == "BCC";
}

}  // namespace

OwnedProperties::OwnedProperties(const amqp_basic_properties_t& p) : p_(p) {
  init_amqp_pool(&pool_, 512);
  for (const ShortString& f : kShortStrings) {
    amqp_bytes_t& b = p_.*f.field;
    if ((p_._flags & f.flag) == 0 || b.len == 0) {
      b = amqp_empty_bytes;
      continue;
    }
    amqp_bytes_t copy;
    amqp_pool_alloc_bytes(&pool_, b.len, &copy);
    if (copy.bytes == nullptr) {
      empty_amqp_pool(&pool_);
      throw std::bad_alloc();
    }
    std::memcpy(copy.bytes, b.bytes, b.len);
    b = copy;
  }
  p_.headers = amqp_empty_table;
  if ((p._flags & AMQP_BASIC_HEADERS_FLAG) != 0 &&
      amqp_table_clone(&p.headers, &p_.headers, &pool_) != AMQP_STATUS_OK) {
    empty_amqp_pool(&pool_);
    throw std::bad_alloc();
  }
}

CopyProperties::CopyProperties(const AmqpMessage& m, std::string_view sender) {
  const auto added = [&](std::string_view name) {
    return std::any_of(m.headers.begin(), m.headers.end(),
                       [&](const auto& kv) { return kv.first == name; });
  };
  if (m.original != nullptr) {
    const amqp_basic_properties_t& o = m.original->get();
    p_ = o;
    p_._flags &= ~(AMQP_BASIC_EXPIRATION_FLAG | AMQP_BASIC_HEADERS_FLAG);
    if ((p_._flags & AMQP_BASIC_USER_ID_FLAG) != 0 &&
        std::string_view(static_cast<const char*>(p_.user_id.bytes), p_.user_id.len) != sender) {
      p_._flags &= ~AMQP_BASIC_USER_ID_FLAG;
      p_.user_id = amqp_empty_bytes;
    }
    p_.headers = amqp_empty_table;
    if ((o._flags & AMQP_BASIC_HEADERS_FLAG) != 0 && !m.drop_original_headers) {
      for (int i = 0; i < o.headers.num_entries; ++i) {
        const amqp_table_entry_t& e = o.headers.entries[i];
        const std::string_view name(static_cast<const char*>(e.key.bytes), e.key.len);
        if (!LeftOffCopies(name) && !added(name)) entries_.push_back(e);
      }
    }
  }
  p_._flags |= AMQP_BASIC_DELIVERY_MODE_FLAG;
  p_.delivery_mode = 2;  // persistent
  p_._flags &= ~AMQP_BASIC_MESSAGE_ID_FLAG;
  p_.message_id = amqp_empty_bytes;
  if (!m.message_id.empty()) {
    p_._flags |= AMQP_BASIC_MESSAGE_ID_FLAG;
    p_.message_id = Bytes(m.message_id);
  }
  for (const auto& [k, v] : m.headers) {
    amqp_table_entry_t t{};
    t.key = Bytes(k);
    t.value.kind = AMQP_FIELD_KIND_UTF8;
    t.value.value.bytes = Bytes(v);
    entries_.push_back(t);
  }
  if (!entries_.empty()) {
    p_._flags |= AMQP_BASIC_HEADERS_FLAG;
    p_.headers = amqp_table_t{static_cast<int>(entries_.size()), entries_.data()};
  }
}

size_t CopyProperties::EncodedSize() const {
  size_t n = 2;  // the flags
  for (const ShortString& f : kShortStrings) {
    if ((p_._flags & f.flag) != 0) n += 1 + (p_.*f.field).len;
  }
  if ((p_._flags & AMQP_BASIC_DELIVERY_MODE_FLAG) != 0) n += 1;
  if ((p_._flags & AMQP_BASIC_PRIORITY_FLAG) != 0) n += 1;
  if ((p_._flags & AMQP_BASIC_TIMESTAMP_FLAG) != 0) n += 8;
  if ((p_._flags & AMQP_BASIC_HEADERS_FLAG) != 0) {
    // Encoded by rabbitmq-c itself (its own bounds checks), into a scratch
    // buffer of one frame: too large is too large, however much larger.
    std::vector<char> scratch(131072);
    size_t offset = 0;
    amqp_table_t t = p_.headers;
    if (amqp_encode_table(amqp_bytes_t{scratch.size(), scratch.data()}, &t, &offset) !=
        AMQP_STATUS_OK) {
      return SIZE_MAX;
    }
    n += offset;
  }
  return n;
}

std::string AmqpConn::Name() const { return "rabbitmq " + o_.host + ":" + std::to_string(o_.port); }

Status AmqpConn::Open() {
  if (state_ != nullptr && !broken_ && !channel_open_) {
    // Only the channel was closed (a channel exception): the connection serves on.
    amqp_channel_open(state_, kChannel);
    if (RpcStatus("channel.open").ok()) {
      channel_open_ = true;
      return Status::Ok();
    }
  }
  Close();
  state_ = amqp_new_connection();
  if (state_ == nullptr) return Status::Internal(Name() + ": out of memory");
  amqp_socket_t* sock = amqp_tcp_socket_new(state_);
  if (sock == nullptr) {
    Drop();  // never opened, or refused: nothing to say goodbye on
    return Status::Internal(Name() + ": cannot create a socket");
  }
  timeval tv{};
  tv.tv_sec = o_.timeout.count() / 1000;
  tv.tv_usec = (o_.timeout.count() % 1000) * 1000;
  const int rc = amqp_socket_open_noblock(sock, o_.host.c_str(), o_.port, &tv);
  if (rc != AMQP_STATUS_OK) {
    Drop();  // never opened, or refused: nothing to say goodbye on
    return Status::Unavailable(Name() + ": connect: " + amqp_error_string2(rc));
  }
  amqp_set_rpc_timeout(state_, &tv);
  amqp_set_handshake_timeout(state_, &tv);
  const int heartbeat_s = static_cast<int>((o_.heartbeat.count() + 999) / 1000);
  // consumer_cancel_notify: without it the broker cancels a consumer whose
  // queue is deleted without a word, and the source waited on a silent
  // connection for ever (rabbitmq-c merges this with its own capabilities).
  amqp_table_entry_t capability{};
  capability.key = amqp_cstring_bytes("consumer_cancel_notify");
  capability.value.kind = AMQP_FIELD_KIND_BOOLEAN;
  capability.value.value.boolean = 1;
  amqp_table_entry_t property{};
  property.key = amqp_cstring_bytes("capabilities");
  property.value.kind = AMQP_FIELD_KIND_TABLE;
  property.value.value.table = amqp_table_t{1, &capability};
  const amqp_table_t properties{1, &property};
  amqp_rpc_reply_t r =
      amqp_login_with_properties(state_, o_.vhost.c_str(), 0, 131072, heartbeat_s, &properties,
                                 AMQP_SASL_METHOD_PLAIN, o_.user.c_str(), o_.password.c_str());
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    // Refused is the server's answer (connection.close: ACCESS_REFUSED, or
    // NOT_ALLOWED for the vhost). A peer that said nothing within the timeout,
    // or hung up, may answer later (75, not 2); one that speaks another protocol
    // will not.
    Status s = Status::Unauthenticated(Name() + ": login as '" + o_.user + "' to vhost '" +
                                       o_.vhost + "' refused");
    if (r.reply_type != AMQP_RESPONSE_SERVER_EXCEPTION) {
      const int e = r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION ? r.library_error : 0;
      const std::string m = Name() + ": login: " + (e != 0 ? amqp_error_string2(e) : "no reply");
      if (e == AMQP_STATUS_TIMEOUT || e == AMQP_STATUS_HEARTBEAT_TIMEOUT) {
        s = Status::DeadlineExceeded(Name() + ": login: no answer within " +
                                     std::to_string(o_.timeout.count()) + " ms");
      } else if (e == AMQP_STATUS_BAD_AMQP_DATA || e == AMQP_STATUS_INCOMPATIBLE_AMQP_VERSION ||
                 e == AMQP_STATUS_UNEXPECTED_STATE || e == AMQP_STATUS_UNKNOWN_CLASS ||
                 e == AMQP_STATUS_UNKNOWN_METHOD) {
        s = Status::FailedPrecondition(m + " (is it an AMQP 0-9-1 server?)");
      } else {
        s = Status::Unavailable(
            e == AMQP_STATUS_SOCKET_ERROR ? Name() + ": login: connection closed" : m);
      }
    }
    Drop();  // never opened, or refused: nothing to say goodbye on
    return s;
  }
  amqp_channel_open(state_, kChannel);
  DEDUP_RETURN_IF_ERROR(RpcStatus("channel.open"));
  channel_open_ = true;
  return Status::Ok();
}

void AmqpConn::Close() {
  if (state_ == nullptr) return;
  if (!broken_) {
    // connection.close closes every channel; its close-ok is awaited briefly (a
    // broker that does not answer is dropped all the same).
    timeval tv{};
    const long long ms = std::min<long long>(o_.timeout.count(), 1'000);
    tv.tv_sec = ms / 1000;
    tv.tv_usec = (ms % 1000) * 1000;
    amqp_set_rpc_timeout(state_, &tv);
    (void)amqp_connection_close(state_, AMQP_REPLY_SUCCESS);
  }
  amqp_destroy_connection(state_);
  state_ = nullptr;
  channel_open_ = false;
  broken_ = false;
}

void AmqpConn::Drop() {
  broken_ = true;
  Close();
}

void AmqpConn::KeepAlive() {
  if (!open() || broken_) return;
  const int heartbeat_s = amqp_get_heartbeat(state_);
  if (heartbeat_s <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_beat_ < std::chrono::milliseconds(heartbeat_s * 1000 / 2)) return;
  last_beat_ = now;
  amqp_frame_t beat{};
  beat.frame_type = AMQP_FRAME_HEARTBEAT;
  beat.channel = 0;
  const int rc = amqp_send_frame(state_, &beat);
  if (rc != AMQP_STATUS_OK) (void)LibraryError(rc, "heartbeat");
}

Status AmqpConn::LibraryError(int code, std::string_view what) {
  std::string m = Name() + ": " + std::string(what) + ": " + amqp_error_string2(code);
  if (code == AMQP_STATUS_TIMEOUT) return Status::DeadlineExceeded(std::move(m));
  Drop();
  return Status::Unavailable(std::move(m));
}

Status AmqpConn::ServerClosed(const amqp_method_t& method, std::string_view what) {
  std::string text = "server closed the channel";
  uint16_t code = 0;
  if (method.id == AMQP_CHANNEL_CLOSE_METHOD) {
    auto* m = static_cast<amqp_channel_close_t*>(method.decoded);
    code = m->reply_code;
    text = Str(m->reply_text);
    // A channel exception closes the channel, not the connection (AMQP 0-9-1;
    // rabbitmq-c: send channel.close-ok, then the channel "must be re-opened
    // before it can be used again"). Without the close-ok the broker refuses a
    // new channel.open on it ("second 'channel.open' seen").
    channel_open_ = false;
    amqp_channel_close_ok_t ok{};
    if (state_ != nullptr &&
        amqp_send_method(state_, kChannel, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok) != AMQP_STATUS_OK) {
      Drop();
    }
  } else if (method.id == AMQP_CONNECTION_CLOSE_METHOD) {
    auto* m = static_cast<amqp_connection_close_t*>(method.decoded);
    code = m->reply_code;
    text = Str(m->reply_text);
    // The server ends the connection: its close-ok is the last word.
    amqp_connection_close_ok_t ok{};
    if (state_ != nullptr) (void)amqp_send_method(state_, 0, AMQP_CONNECTION_CLOSE_OK_METHOD, &ok);
    Drop();
  } else {
    Drop();
  }
  std::string m = Name() + ": " + std::string(what) + ": " + text;
  if (code == 404) return Status::NotFound(std::move(m));
  if (code == 403) return Status::PermissionDenied(std::move(m));
  if (code == 406) return Status::FailedPrecondition(std::move(m));
  return Status::Unavailable(std::move(m));
}

Status AmqpConn::RpcStatus(std::string_view what) {
  if (state_ == nullptr) return Status::Unavailable(Name() + ": " + std::string(what) + ": not connected");
  amqp_rpc_reply_t r = amqp_get_rpc_reply(state_);
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return Status::Ok();
    case AMQP_RESPONSE_NONE:
      Drop();
      return Status::Unavailable(Name() + ": " + std::string(what) + ": no reply");
    case AMQP_RESPONSE_LIBRARY_EXCEPTION: {
      const int code = r.library_error;
      Status s = Status::Unavailable(Name() + ": " + std::string(what) + ": " +
                                     amqp_error_string2(code));
      Drop();
      return s;
    }
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      return ServerClosed(r.reply, what);
  }
  return Status::Internal(Name() + ": unknown reply type");
}

}  // namespace dedup::rabbitmq
