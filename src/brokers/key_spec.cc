// Copyright dedup authors. Licensed under the Apache License 2.0.

#include "brokers/key_spec.h"

#include <algorithm>

#include "core/printable.h"
#include "dedup/store.h"

namespace dedup::brokers {
namespace {

constexpr std::string_view kSha256 = "sha256";
constexpr std::string_view kHeader = "header:";
constexpr std::string_view kField = "field:";
constexpr size_t kMaxName = 255;

// "message_id, header:NAME or sha256": the forms `g` accepts, for errors.
std::string Forms(const KeyGrammar& g) {
  std::vector<std::string> forms = g.properties;
  if (g.headers) forms.emplace_back("header:NAME");
  if (g.fields) forms.emplace_back("field:NAME");
  if (g.bare_word_is_field) forms.emplace_back("NAME (a field)");
  forms.emplace_back(kSha256);
  std::string out;
  for (size_t i = 0; i < forms.size(); ++i) {
    if (i > 0) out += i + 1 == forms.size() ? " or " : ", ";
    out += forms[i];
  }
  return out;
}

Status Bad(const KeyGrammar& g, std::string_view text, std::string_view why) {
  return Status::InvalidArgument(g.broker + " key='" + internal::Printable(text) + "': " +
                                 std::string(why) + "; key= must be " + Forms(g));
}

Status CheckName(const KeyGrammar& g, std::string_view text, std::string_view name,
                 std::string_view what) {
  if (name.empty()) return Bad(g, text, "the " + std::string(what) + " name is empty");
  if (name.size() > kMaxName) {
    return Bad(g, text, "the " + std::string(what) + " name is longer than 255 bytes");
  }
  if (std::any_of(name.begin(), name.end(),
                  [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; })) {
    return Bad(g, text, "the " + std::string(what) + " name contains a control character");
  }
  return Status::Ok();
}

}  // namespace

std::string KeySpec::ToString() const {
  switch (kind) {
    case KeyKind::kProperty: return name;
    case KeyKind::kHeader: return std::string(kHeader) + name;
    case KeyKind::kField: return std::string(kField) + name;
    case KeyKind::kContentSha256: return std::string(kSha256);
  }
  return {};
}

StatusOr<KeySpec> ParseKeySpec(std::string_view text, const KeyGrammar& g) {
  if (text.empty()) return Bad(g, text, "empty");
  if (text == kSha256) return KeySpec{KeyKind::kContentSha256, ""};
  if (text.starts_with(kHeader)) {
    if (!g.headers) return Bad(g, text, g.broker + " messages have no headers");
    std::string_view name = text.substr(kHeader.size());
    DEDUP_RETURN_IF_ERROR(CheckName(g, text, name, "header"));
    return KeySpec{KeyKind::kHeader, std::string(name)};
  }
  if (text.starts_with(kField)) {
    if (!g.fields) return Bad(g, text, g.broker + " messages have no fields");
    std::string_view name = text.substr(kField.size());
    DEDUP_RETURN_IF_ERROR(CheckName(g, text, name, "field"));
    return KeySpec{KeyKind::kField, std::string(name)};
  }
  if (std::find(g.properties.begin(), g.properties.end(), text) != g.properties.end()) {
    return KeySpec{KeyKind::kProperty, std::string(text)};
  }
  if (g.bare_word_is_field) {
    DEDUP_RETURN_IF_ERROR(CheckName(g, text, text, "field"));
    return KeySpec{KeyKind::kField, std::string(text)};
  }
  return Bad(g, text, "not a form this broker knows");
}

Status CheckKeyPrefix(std::string_view prefix, bool sha256_key, std::string_view broker) {
  const size_t room = sha256_key ? kMaxKeyBytes - 64 : kMaxKeyBytes - 1;
  if (prefix.size() <= room) return Status::Ok();
  return Status::InvalidArgument(
      std::string(broker) + ": prefix= is " + std::to_string(prefix.size()) +
      " bytes: with it every key would be longer than " + std::to_string(kMaxKeyBytes) +
      " bytes (at most " + std::to_string(room) + " bytes of prefix" +
      (sha256_key ? " before key=sha256's 64 hex digits)" : ")") +
      ", and every message would be dead-lettered");
}

}  // namespace dedup::brokers
