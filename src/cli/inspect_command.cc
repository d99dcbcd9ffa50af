// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// `dedup inspect` shows stored records; `dedup forget` removes one.
//
//   dedup inspect --store rocksdb:/var/lib/dedup m-42
//   dedup inspect --store redis://127.0.0.1:6390 --prefix m- --json
//   dedup forget  --store rocksdb:/var/lib/dedup m-42
//   dedup forget  --store rocksdb:/var/lib/dedup --key-hex 6e00756c   # "n\0ul"
//
// inspect exits 0 when something was shown, 1 when the key (or prefix) has no
// record, 2 when a record it met cannot be decoded (with --prefix: after listing
// every other record, and each undecodable one with why). forget exits 0 when a record was removed, 1 when there was none, 75
// (EX_TEMPFAIL) when the key's lease is still running and --force was not given,
// 2 when the key holds no record but a Redis value of another type (--force
// removes it) or the store refuses.

#include <nlohmann/json.hpp>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "cli/command.h"
#include "cli/common.h"
#include "core/printable.h"
#include "core/state_machine.h"
#include "dedup/store.h"

namespace dedup::cli {
namespace {

struct InspectFlags {
  std::string store;
  std::string key;
  bool key_given = false;      // KEY given, even as ""
  std::string key_hex;         // --key-hex: the key's exact bytes
  bool key_hex_given = false;
  std::string prefix;
  bool has_prefix = false;
  bool limit_given = false;
  size_t limit = 1000;
  bool json = false;
  bool force = false;  // forget: also a key whose lease is running
};

// Keys are bytes; JSON strings are Unicode. A key that is valid UTF-8 is "key" as
// it is. Any other key is "key_hex" (its exact bytes, lower-case hex) and "key"
// (the same bytes made printable: see core/printable.h), so that every key has a
// "key" to show and an exact form to act on.
nlohmann::json KeyJson(const std::string& key) {
  const bool utf8 = internal::IsValidUtf8(key);
  nlohmann::json j = {{"key", utf8 ? key : internal::Printable(key)}};
  // Also for a key that is UTF-8 but shown escaped elsewhere (a NUL, a control
  // byte): the exact bytes forget --key-hex takes.
  if (!utf8 || internal::Printable(key) != key) j["key_hex"] = internal::HexBytes(key);
  return j;
}

nlohmann::json ToJson(const Record& r, uint64_t result_bytes) {
  nlohmann::json j = KeyJson(r.key);
  j["state"] = RecordStateName(r.state);
  j["token"] = r.token.ToHex();
  j["fence"] = r.fence;
  j["attempt"] = r.attempt;
  j["retention_deadline"] = FormatMillisUtc(r.retention_deadline);
  j["result_bytes"] = result_bytes;
  if (r.state == RecordState::kInProgress) {
    j["lease_deadline"] = FormatMillisUtc(r.lease_deadline);
  }
  if (r.state == RecordState::kCompleted) j["status"] = CompletionStatusName(r.status);
  return j;
}

// A record the store cannot decode: its key and why; "undecodable" marks it.
nlohmann::json ToJson(const UndecodableRecord& u) {
  nlohmann::json j = KeyJson(u.key);
  j["undecodable"] = u.why;
  return j;
}

// The key named by KEY or --key-hex HEX (the exact bytes of a key that cannot
// be typed: a NUL, bytes that are not UTF-8, as inspect shows them in key_hex);
// one of them, not empty. False after saying what is wrong.
bool KeyOf(const InspectFlags& f, const char* cmd, std::string* key) {
  if (f.key_given && f.key_hex_given) {
    std::fprintf(stderr, "dedup %s: give KEY or --key-hex HEX, not both\n", cmd);
    return false;
  }
  if (f.key_hex_given) {
    std::optional<std::string> bytes = internal::BytesFromHex(f.key_hex);
    if (f.key_hex.empty() || !bytes) {
      std::fprintf(stderr, "dedup %s: --key-hex takes the key's bytes as hex digits, two a "
                           "byte (as inspect --json shows them in key_hex), got '%s'\n",
                   cmd, internal::PrintableCut(f.key_hex, 64).c_str());
      return false;
    }
    *key = std::move(*bytes);
    return true;
  }
  if (f.key_given && f.key.empty()) {
    std::fprintf(stderr, "dedup %s: KEY is empty (keys are 1 to %zu bytes)\n", cmd, kMaxKeyBytes);
    return false;
  }
  *key = f.key;
  return true;
}

void PrintRecord(const Record& r, uint64_t result_bytes) {
  std::printf("%s\n  state      %s\n  token      %s\n  fence      %llu\n  attempt    %u\n",
              internal::Printable(r.key).c_str(), std::string(RecordStateName(r.state)).c_str(),
              r.token.ToHex().c_str(), static_cast<unsigned long long>(r.fence), r.attempt);
  if (r.state == RecordState::kInProgress) {
    std::printf("  lease      until %s\n", FormatMillisUtc(r.lease_deadline).c_str());
  }
  std::printf("  retention  until %s\n", FormatMillisUtc(r.retention_deadline).c_str());
  if (r.state == RecordState::kCompleted) {
    std::printf("  status     %s\n", std::string(CompletionStatusName(r.status)).c_str());
  }
  std::printf("  result     %llu bytes\n", static_cast<unsigned long long>(result_bytes));
  // A key shown escaped cannot be typed back: its exact bytes, for --key-hex.
  if (internal::Printable(r.key) != r.key) {
    std::printf("  key_hex    %s\n", internal::HexBytes(r.key).c_str());
  }
}

void PrintUndecodable(const UndecodableRecord& u) {
  std::printf("%s\n  undecodable  %s\n", internal::Printable(u.key).c_str(),
              internal::Printable(u.why).c_str());
  if (internal::Printable(u.key) != u.key) {
    std::printf("  key_hex      %s\n", internal::HexBytes(u.key).c_str());
  }
}

// Admin commands never create a store where there is none (a mistyped path);
// inspect only reads, so it also works on a read-only copy and beside a worker.
StatusOr<std::unique_ptr<Store>> Open(const std::string& uri, const char* cmd, bool read_only) {
  OpenOptions o;
  o.must_exist = true;
  o.read_only = read_only;
  // What a server's settings mean for workers is the worker's to say.
  o.on_warning = [](const std::string&) {};
  auto s = OpenStore(uri, o);
  if (!s.ok()) std::fprintf(stderr, "dedup %s: --store: %s\n", cmd, s.status().ToString().c_str());
  return s;
}

int RunInspect(const InspectFlags& f) {
  std::string key;
  if (!KeyOf(f, "inspect", &key)) return kExitUsage;
  const bool one_key = f.key_given || f.key_hex_given;
  if (one_key == f.has_prefix) {
    std::fprintf(stderr, "dedup inspect: give a KEY (or --key-hex HEX) or --prefix P, not both\n");
    return kExitUsage;
  }
  if (f.limit_given && !f.has_prefix) {
    std::fprintf(stderr, "dedup inspect: --limit is for --prefix (one KEY shows one record)\n");
    return kExitUsage;
  }
  if (f.has_prefix && f.limit == 0) {
    std::fprintf(stderr, "dedup inspect: --limit must be at least 1\n");
    return kExitUsage;
  }
  auto store = Open(f.store, "inspect", /*read_only=*/true);
  if (!store.ok()) return ExitCodeFor(store.status());
  ScanResult shown;  // one key's record, or a listing's
  if (one_key) {
    auto r = (*store)->Inspect(key);
    if (!r.ok()) {
      std::fprintf(stderr, "dedup inspect: %s\n", r.status().ToString().c_str());
      return ExitCodeFor(r.status());
    }
    if (r->has_value()) shown.records.push_back(std::move(**r));
  } else {
    // Only the results' sizes are shown: the results (up to 1 MiB each) are not read.
    ScanOptions so;
    so.with_results = false;
    auto r = (*store)->Scan(f.prefix, f.limit, so);
    if (!r.ok()) {
      std::fprintf(stderr, "dedup inspect: %s\n", r.status().ToString().c_str());
      return ExitCodeFor(r.status());
    }
    shown = std::move(r).value();
  }
  const std::vector<Record>& records = shown.records;
  const std::vector<UndecodableRecord>& undecodable = shown.undecodable;
  if (f.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (size_t i = 0; i < records.size(); ++i) arr.push_back(ToJson(records[i], shown.ResultBytes(i)));
    for (const auto& u : undecodable) arr.push_back(ToJson(u));
    // Every string is valid UTF-8 by now; "replace" is a last guard, never an abort.
    // ASCII only (\uXXXX escapes): nothing in it can act on a terminal.
    const std::string text =
        arr.dump(-1, ' ', /*ensure_ascii=*/true, nlohmann::json::error_handler_t::replace);
    std::printf("%s\n", text.c_str());
  } else {
    for (size_t i = 0; i < records.size(); ++i) PrintRecord(records[i], shown.ResultBytes(i));
    for (const auto& u : undecodable) PrintUndecodable(u);
    if (records.empty() && undecodable.empty()) std::fprintf(stderr, "dedup inspect: no record\n");
  }
  if (!undecodable.empty()) {
    // As `inspect KEY` of one of them answers (DataLoss).
    std::fprintf(stderr,
                 "dedup inspect: %zu record%s cannot be decoded (claims of %s key fail and change "
                 "nothing; `dedup forget` removes %s, --force if it is of another Redis type)\n",
                 undecodable.size(), undecodable.size() == 1 ? "" : "s",
                 undecodable.size() == 1 ? "its" : "each", undecodable.size() == 1 ? "it" : "one");
    return ExitCodeFor(Status::DataLoss(""));
  }
  return records.empty() ? kExitCheckFailed : kExitOk;
}

}  // namespace

void RegisterInspect(CLI::App& root, CommandContext& ctx) {
  auto f = std::make_shared<InspectFlags>();
  CLI::App* app = root.add_subcommand("inspect", "Show stored records (one key, or a prefix); "
                                                  "exit 1 when there is none, 2 when one cannot be "
                                                  "decoded, 75 when the store is unreachable");
  app->add_option("--store", f->store, "Store URI: memory:, rocksdb:PATH, redis://HOST:PORT, redis+cluster://HOST:PORT,..., postgres://USER@HOST:PORT/DB")->required();
  app->add_option("key", f->key, "The key to show")
      ->each([f](const std::string&) { f->key_given = true; });
  app->add_option("--key-hex", f->key_hex,
                  "The key as hex digits, two a byte (a key with bytes that cannot be typed)")
      ->each([f](const std::string&) { f->key_hex_given = true; });
  app->add_option("--prefix", f->prefix, "Show records whose key starts with this")
      ->each([f](const std::string&) { f->has_prefix = true; });
  app->add_option("--limit", f->limit, "At most this many records with --prefix (at least 1)")
      ->capture_default_str()
      ->each([f](const std::string&) { f->limit_given = true; });
  app->add_flag("--json", f->json, "One JSON array");
  app->callback([f, &ctx] { ctx.exit_code = RunInspect(*f); });
}

void RegisterForget(CLI::App& root, CommandContext& ctx) {
  auto f = std::make_shared<InspectFlags>();
  CLI::App* app = root.add_subcommand("forget", "Remove the record of one key; exit 1 when "
                                                 "there is none, 75 while its lease runs "
                                                 "(without --force), 2 when the key holds no "
                                                 "record but another Redis type (without --force)");
  app->add_option("--store", f->store, "Store URI: memory:, rocksdb:PATH, redis://HOST:PORT, redis+cluster://HOST:PORT,..., postgres://USER@HOST:PORT/DB")->required();
  app->add_option("key", f->key, "The key to forget")
      ->each([f](const std::string&) { f->key_given = true; });
  app->add_option("--key-hex", f->key_hex,
                  "The key as hex digits, two a byte (as inspect shows it in key_hex)")
      ->each([f](const std::string&) { f->key_hex_given = true; });
  app->add_flag("--force", f->force,
                "Also forget a key whose lease is still running (its worker loses the "
                "claim; the next claim gets a higher fence), or a Redis key of another "
                "type (a hash, a stream: removed whole)");
  app->callback([f, &ctx] {
    std::string key;
    if (!KeyOf(*f, "forget", &key)) {
      ctx.exit_code = kExitUsage;
      return;
    }
    if (!f->key_given && !f->key_hex_given) {
      std::fprintf(stderr, "dedup forget: give the KEY to forget (or --key-hex HEX)\n");
      ctx.exit_code = kExitUsage;
      return;
    }
    auto store = Open(f->store, "forget", /*read_only=*/false);
    if (!store.ok()) {
      ctx.exit_code = ExitCodeFor(store.status());  // 75: held by another process
      return;
    }
    ForgetOptions o;
    o.force = f->force;
    auto r = (*store)->Forget(key, o);
    if (!r.ok()) {
      std::fprintf(stderr, "dedup forget: %s\n", r.status().ToString().c_str());
      // A running lease: not now (wait for it, or --force). Any other refusal
      // (a Redis key of another type, a read-only store) waiting does not cure.
      ctx.exit_code = internal::IsLeasedForgetError(r.status(), key) ? kExitTempFail
                                                                 : ExitCodeFor(r.status());
      return;
    }
    std::fprintf(stderr, "dedup forget: %s\n", *r ? "removed" : "no record");
    ctx.exit_code = *r ? kExitOk : kExitCheckFailed;
  });
}

}  // namespace dedup::cli
