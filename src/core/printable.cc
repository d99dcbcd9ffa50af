// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "core/printable.h"

#include <cstdint>
#include <string>

namespace dedup::internal {
namespace {

// Length of the well-formed UTF-8 sequence at s[i] and its code point, or 0.
size_t Utf8At(std::string_view s, size_t i, uint32_t* cp) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  size_t n = 0;
  uint32_t c = 0, min = 0;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  } else if ((b0 & 0xe0) == 0xc0) {
    n = 2, c = b0 & 0x1f, min = 0x80;
  } else if ((b0 & 0xf0) == 0xe0) {
    n = 3, c = b0 & 0x0f, min = 0x800;
  } else if ((b0 & 0xf8) == 0xf0) {
    n = 4, c = b0 & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if ((b & 0xc0) != 0x80) return 0;
    c = (c << 6) | (b & 0x3f);
  }
  if (c < min || c > 0x10ffff || (c >= 0xd800 && c <= 0xdfff)) return 0;
  *cp = c;
  return n;
}

bool Dangerous(uint32_t cp) {
  return cp < 0x20 || cp == 0x7f || (cp >= 0x80 && cp < 0xa0) ||  // C0, DEL, C1
         cp == 0x2028 || cp == 0x2029 ||                          // line / paragraph separators
         (cp >= 0x200e && cp <= 0x200f) || (cp >= 0x202a && cp <= 0x202e) ||
         (cp >= 0x2066 && cp <= 0x2069) || cp == 0x061c ||  // bidirectional controls
         cp == 0xfeff;                                       // zero-width no-break space
}

void AppendHexByte(std::string* out, uint8_t b) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->append("\\x");
  out->push_back(kHex[b >> 4]);
  out->push_back(kHex[b & 15]);
}

}  // namespace

std::string Printable(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    const size_t n = Utf8At(bytes, i, &cp);
    if (n == 0 || Dangerous(cp)) {
      const size_t bad = n == 0 ? 1 : n;
      for (size_t k = 0; k < bad; ++k) AppendHexByte(&out, static_cast<uint8_t>(bytes[i + k]));
      i += bad;
    } else if (cp == '\\') {
      out.append("\\\\");
      i += 1;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  return out;
}

namespace {
// The largest end <= max (bytes.size() > max) that splits no character: the
// continuation bytes (10xxxxxx) of one a cut at max would split go too, at most
// 3, so that bytes that are not UTF-8 are still cut at max.
size_t CharacterBoundaryAtOrBefore(std::string_view bytes, size_t max) {
  size_t end = max;
  for (int k = 0; k < 3 && end > 0 && (static_cast<uint8_t>(bytes[end]) & 0xc0) == 0x80; ++k) {
    --end;
  }
  if ((static_cast<uint8_t>(bytes[end]) & 0xc0) == 0x80) end = max;  // not UTF-8 there
  return end;
}
}  // namespace

std::string CutAtCharacter(std::string_view bytes, size_t max) {
  if (bytes.size() <= max) return std::string(bytes);
  return std::string(bytes.substr(0, CharacterBoundaryAtOrBefore(bytes, max))) + "... [cut: " +
         std::to_string(bytes.size()) + " bytes in all]";
}

std::string PrintableCut(std::string_view bytes, size_t max) {
  if (bytes.size() <= max) return Printable(bytes);
  return Printable(bytes.substr(0, CharacterBoundaryAtOrBefore(bytes, max))) + "...";
}

std::string CutReasonToFitARecord(std::string_view reason, size_t max) {
  if (reason.size() <= max) return std::string(reason);
  const std::string note =
      "... [reason cut to fit a record: " + std::to_string(reason.size()) + " bytes in all]";
  const size_t room = max > note.size() ? max - note.size() : 0;
  return std::string(reason.substr(0, CharacterBoundaryAtOrBefore(reason, room))) + note;
}

bool IsValidUtf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    uint32_t cp = 0;
    const size_t n = Utf8At(bytes, i, &cp);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

std::string HexBytes(std::string_view bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char ch : bytes) {
    const auto b = static_cast<uint8_t>(ch);
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

std::optional<std::string> BytesFromHex(std::string_view hex) {
  if (hex.size() % 2 != 0) return std::nullopt;
  auto digit = [](char ch) -> int {
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F') return ch - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(hex.size() / 2);
  for (size_t i = 0; i < hex.size(); i += 2) {
    const int hi = digit(hex[i]), lo = digit(hex[i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi << 4 | lo));
  }
  return out;
}

}  // namespace dedup::internal
