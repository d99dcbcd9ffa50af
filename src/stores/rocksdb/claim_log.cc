// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "stores/rocksdb/claim_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace dedup::internal {
namespace {

constexpr size_t kHeader = 8;

constexpr std::array<uint32_t, 256> MakeCrcTable() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kCrcTable = MakeCrcTable();

uint32_t Crc32cSoft(const unsigned char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = kCrcTable[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHard(const unsigned char* p, size_t n) {
  uint64_t c = 0xFFFFFFFFu;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}
bool HaveSse42() {
  static const bool have = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("sse4.2") != 0;
  }();
  return have;
}
#endif

void PutU32(char* at, uint32_t v) {
  for (int i = 0; i < 4; ++i) at[i] = static_cast<char>(v >> (8 * i));
}
void AppendU32(std::string* out, uint32_t v) {
  char b[4];
  PutU32(b, v);
  out->append(b, 4);
}
uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace

uint32_t Crc32c(std::string_view data) {
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
#if defined(__x86_64__)
  if (HaveSse42()) return Crc32cHard(p, data.size());
#endif
  return Crc32cSoft(p, data.size());
}

std::string ClaimLogName(uint64_t number) {
  char digits[24];
  const int n = std::snprintf(digits, sizeof digits, "%06llu", static_cast<unsigned long long>(number));
  return std::string(kClaimLogPrefix) + std::string(digits, static_cast<size_t>(n));
}

Status ListClaimLogs(const std::string& dir, std::vector<uint64_t>* numbers) {
  numbers->clear();
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return Status::Ok();
  if (ec) return Status::Unavailable("claim logs in " + dir + ": " + ec.message());
  for (const auto& e : it) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with(kClaimLogPrefix)) continue;
    const std::string_view digits = std::string_view(name).substr(kClaimLogPrefix.size());
    uint64_t n = 0;
    auto [p, err] = std::from_chars(digits.data(), digits.data() + digits.size(), n);
    if (err != std::errc() || p != digits.data() + digits.size() || digits.empty()) continue;
    numbers->push_back(n);
  }
  std::sort(numbers->begin(), numbers->end());
  return Status::Ok();
}

void ClaimLogFrame::Clear() {
  buf_.assign(kHeader, '\0');
  entries_ = 0;
}

void ClaimLogFrame::Add(uint8_t type, std::string_view key, std::string_view value) {
  buf_.push_back(static_cast<char>(type));
  AppendU32(&buf_, static_cast<uint32_t>(key.size()));
  buf_.append(key);
  AppendU32(&buf_, static_cast<uint32_t>(value.size()));
  buf_.append(value);
  ++entries_;
}

void ClaimLogFrame::AddClaim(std::string_view key, std::string_view record) {
  Add(kClaimEntry, key, record);
}

void ClaimLogFrame::AddForget(std::string_view key, uint64_t fence) {
  char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<char>(fence >> (8 * i));
  Add(kForgetEntry, key, std::string_view(b, 8));
}

std::string_view ClaimLogFrame::Finish() {
  const std::string_view payload = std::string_view(buf_).substr(kHeader);
  PutU32(buf_.data(), static_cast<uint32_t>(payload.size()));
  PutU32(buf_.data() + 4, Crc32c(payload));
  return buf_;
}

namespace {

// The frame at `at` of `data`: kWhole (its payload checks and its entries are
// whole), kCut (it runs past the end of the data), kDamaged (its payload does
// not check), kMalformed (it checks, but its entries break the format: no
// crash and no changed byte leaves that) or kUnknownType (it checks and holds
// an entry of a type this build does not know); `len` its payload's length,
// `why` what is wrong with a kMalformed or kUnknownType one.
enum class Frame { kWhole, kCut, kDamaged, kMalformed, kUnknownType };
Frame CheckFrame(std::string_view data, size_t at, uint32_t* len, std::string* why = nullptr) {
  if (data.size() - at < kHeader) return Frame::kCut;
  *len = GetU32(data.data() + at);
  if (*len > data.size() - at - kHeader) return Frame::kCut;
  const std::string_view payload(data.data() + at + kHeader, *len);
  if (Crc32c(payload) != GetU32(data.data() + at + 4)) return Frame::kDamaged;
  const auto bad = [&](Frame f, size_t p, const std::string& what) {
    if (why != nullptr) *why = what + " at byte " + std::to_string(at + kHeader + p);
    return f;
  };
  // Entries are checked whole before any is handed on: a frame is all or nothing.
  for (size_t p = 0; p < payload.size();) {
    const uint8_t type = static_cast<uint8_t>(payload[p]);
    if (type != kClaimEntry && type != kForgetEntry) {
      return bad(Frame::kUnknownType, p, "an entry of unknown type " + std::to_string(type));
    }
    if (payload.size() - p < 9) return bad(Frame::kMalformed, p, "an entry cut short");
    const uint32_t k = GetU32(payload.data() + p + 1);
    if (payload.size() - p - 5 < static_cast<size_t>(k) + 4) {
      return bad(Frame::kMalformed, p, "an entry whose key runs past its frame");
    }
    const uint32_t v = GetU32(payload.data() + p + 5 + k);
    if (payload.size() - p - 9 - k < v) {
      return bad(Frame::kMalformed, p, "an entry whose value runs past its frame");
    }
    if (type == kForgetEntry && v != 8) {
      return bad(Frame::kMalformed, p,
                 "a forget entry of " + std::to_string(v) + " bytes, not an 8-byte fence,");
    }
    p += 9 + static_cast<size_t>(k) + v;
  }
  return Frame::kWhole;
}

// The first offset after `at` that holds a frame whose payload checks, or
// npos. Empty frames do not count: zeros (a file extended but never written)
// read as one. Cheap: a CRC is computed only where the length fits in the rest
// of the data, which a random length almost never does.
size_t NextCheckingFrame(std::string_view data, size_t at) {
  for (size_t p = at + 1; p < data.size() && data.size() - p > kHeader; ++p) {
    const uint32_t len = GetU32(data.data() + p);
    if (len == 0 || len > data.size() - p - kHeader) continue;
    if (Crc32c(data.substr(p + kHeader, len)) == GetU32(data.data() + p + 4)) return p;
  }
  return std::string_view::npos;
}

}  // namespace

Status ReadClaimLog(const std::string& path,
                    const std::function<void(uint8_t, std::string_view, std::string_view)>& fn,
                    ClaimLogDamage* damage) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return Status::Unavailable("claim log " + path + ": cannot open: " + std::strerror(errno));
  }
  std::string data;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int e = errno;
      close(fd);
      return Status::Unavailable("claim log " + path + ": cannot read: " + std::strerror(e));
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  size_t at = 0;
  while (true) {
    uint32_t len = 0;
    std::string why;
    const Frame f = CheckFrame(data, at, &len, &why);
    // Not damage: a format this build does not read.
    if (f == Frame::kUnknownType) {
      return Status::FailedPrecondition("claim log " + path + " holds " + why +
                                        " (written by a newer dedup?); refusing to misread it. "
                                        "Nothing was changed");
    }
    // Its checksum matches, so its length is right: what follows is read. A
    // crash cannot leave it, so it is damage wherever it is, even last.
    if (f == Frame::kMalformed) {
      if (damage == nullptr) break;
      if (damage->at < 0) {
        damage->at = static_cast<int64_t>(at);
        damage->next = static_cast<int64_t>(at + kHeader + len);
        damage->what = "a frame at byte " + std::to_string(at) +
                       " whose checksum matches but which holds " + why +
                       " (not what any crash or writer leaves)";
      }
      at += kHeader + len;
      continue;
    }
    if (f == Frame::kCut || f == Frame::kDamaged) {
      // A crash (or a full disk) cuts the last frame short, and nothing follows
      // it. A frame that checks after this one says the damage is not that: a
      // changed byte. It is looked for at every offset, not only where this
      // frame's length says the next one starts: a changed length (read as a
      // frame running past the end, or as a shorter one) pointed elsewhere, and
      // every frame after it was dropped as a torn tail.
      if (damage == nullptr || data.size() - at <= kHeader) break;
      const size_t next = NextCheckingFrame(data, at);
      if (next == std::string_view::npos) break;
      if (damage->at < 0) {
        damage->at = static_cast<int64_t>(at);
        damage->next = static_cast<int64_t>(next);
        damage->what = "a damaged frame at byte " + std::to_string(at) +
                       " followed by whole ones from byte " + std::to_string(next) +
                       " (a crash leaves damage only at the end)";
      }
      at = next;
      continue;
    }
    const std::string_view payload(data.data() + at + kHeader, len);
    for (size_t p = 0; p < payload.size();) {
      const uint8_t type = static_cast<uint8_t>(payload[p]);
      const uint32_t k = GetU32(payload.data() + p + 1);
      const uint32_t v = GetU32(payload.data() + p + 5 + k);
      fn(type, payload.substr(p + 5, k), payload.substr(p + 9 + k, v));
      p += 9 + static_cast<size_t>(k) + v;
    }
    at += kHeader + len;
  }
  return Status::Ok();
}

}  // namespace dedup::internal
