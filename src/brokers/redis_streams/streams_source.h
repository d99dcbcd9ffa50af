// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Redis Streams as a MessageSource (consumer.h): a consumer group read with
// XREADGROUP, settled with XACK / XADD to a dead-letter stream. Every behaviour
// of the stream worker is here:
//
//   Delivery     stream
//   Ack()        XACK (the Consumer calls it only after the outcome is recorded)
//   Retry(after) no ack: the entry stays pending; this source fetches it again no
//                earlier than `after` (XCLAIM of its own entry, which also reads
//                its current fields; an entry acked elsewhere meanwhile is gone);
//                Retry(0) (a drain's hand-back) also sets its idle time past
//                every reclaim min-idle (XCLAIM IDLE JUSTID), so any consumer's
//                next XAUTOCLAIM takes it at once
//   DeadLetter   XADD <dead stream> with the original fields + reason + entry_id,
//                then XACK
//   InProgress() XCLAIM <id> JUSTID of its own entry (min-idle: the time since
//                this consumer last reset its idle time), which sets the idle
//                time back to 0 without counting a delivery, so that no
//                XAUTOCLAIM takes the entry while it runs; queued, and sent by
//                the source's own thread, several in one pipelined round trip
//   fused_ack()  {"redis-stream", "host:port/0", stream, group, entry id}: a Redis
//                store on the same server and database completes and XACKs in one
//                script (complete_ack.lua)
//
// Fetch, in turn: this consumer's own pending entries first (a restart with the
// same consumer name), entries of any consumer idle for longer than
// `reclaim_min_idle` (XAUTOCLAIM: a crashed worker's entries), own entries whose
// retry time has come (XCLAIM), then new entries (XREADGROUP >, BLOCK bounded by
// the next retry or reclaim). An entry deleted from the stream while pending
// comes back without fields: it is XACKed and not handed out.
//
// The dedup key is the entry's `key_field` (default "id"), or the hex SHA-256 of
// its fields; never the stream entry id. An entry without the field carries a
// key_error and is dead-lettered by the Consumer, never processed unguarded.
// A dead-letter entry may be written twice if the worker dies between XADD and
// XACK; it carries `entry_id` so readers can tell.

#ifndef DEDUP_SRC_BROKERS_REDIS_STREAMS_STREAMS_SOURCE_H_
#define DEDUP_SRC_BROKERS_REDIS_STREAMS_STREAMS_SOURCE_H_

#include <memory>
#include <string>

#include "brokers/redis_streams/stream_conn.h"
#include "dedup/consumer.h"
#include "dedup/worker.h"

namespace dedup {

// Checks the options, fills the defaults (consumer name, dead stream,
// reclaim_min_idle = lease + 5 s when 0) and creates the group if missing.
// InvalidArgument for bad options, Unavailable when Redis cannot be reached.
[[nodiscard]] StatusOr<std::unique_ptr<MessageSource>> OpenRedisStreamsSource(
    WorkerOptions options, Millis lease);

// The connection options of the stream's server.
streams::ConnOptions StreamConnOptions(const WorkerOptions& o);

}  // namespace dedup

#endif  // DEDUP_SRC_BROKERS_REDIS_STREAMS_STREAMS_SOURCE_H_
