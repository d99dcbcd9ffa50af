// Copyright dedup authors. Licensed under the Apache License 2.0.
//
// Keys and fields are arbitrary bytes chosen by whoever publishes a message. Shown
// on a terminal or in a log they must not be able to move the cursor, recolour the
// screen, fake a log line or reorder text: every place that prints one prints
// Printable(bytes). JSON output uses IsValidUtf8 to choose an encoding.

#ifndef DEDUP_SRC_CORE_PRINTABLE_H_
#define DEDUP_SRC_CORE_PRINTABLE_H_

#include <optional>
#include <string>
#include <string_view>

namespace dedup::internal {

// `bytes` safe to print: printable ASCII and valid UTF-8 letters as they are;
// a backslash as "\\"; control characters (C0, DEL, C1), Unicode line and
// paragraph separators, bidirectional controls, and bytes that are not valid
// UTF-8 as "\xNN" per byte. Reversible: nothing else produces a backslash.
std::string Printable(std::string_view bytes);

// True when `bytes` is well-formed UTF-8 (no overlong forms, no surrogates,
// nothing above U+10FFFF).
bool IsValidUtf8(std::string_view bytes);

// `bytes` when at most `max` bytes long; else its first bytes, cut so that no
// well-formed UTF-8 character is split (at most `max`), followed by
// "... [cut: N bytes in all]" (not counted in `max`). For reasons carried
// where space is bounded (broker headers, log lines).
std::string CutAtCharacter(std::string_view bytes, size_t max);

// Printable(bytes) for an error message that echoes what it refuses: at most
// `max` bytes of it, cut so that no well-formed UTF-8 character is split, and
// "..." after when it was cut (a 1 MB value is not printed whole).
std::string PrintableCut(std::string_view bytes, size_t max);

// A Fail reason that fits a record of `max` bytes: `reason` when it does; else
// its first bytes, cut so that no well-formed UTF-8 character is split, then
// "... [reason cut to fit a record: N bytes in all]", all within `max`. The one
// cut the Buffer and PostgresStore::RunInTransaction both make.
std::string CutReasonToFitARecord(std::string_view reason, size_t max);

// Lower-case hex of every byte ("6d2dff").
std::string HexBytes(std::string_view bytes);
// The bytes HexBytes wrote (upper-case digits too); nullopt for an odd count or
// a character that is not a hex digit.
std::optional<std::string> BytesFromHex(std::string_view hex);

}  // namespace dedup::internal

#endif  // DEDUP_SRC_CORE_PRINTABLE_H_
