#!/usr/bin/env bash
# README, "Using the library": its C++ snippet, built against an installed dedup
# both ways the README names (CMake find_package(dedup) + dedup::dedup, and
# pkg-config dedup), and run on memory: and rocksdb:. The install goes to a
# temporary prefix (cmake --install --prefix), which the .pc file must follow.
#
#   tests/install_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(realpath "$1")
src=$(realpath "$2")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$src/scripts/lib/check.sh"
ok() { echo "ok   $*"; }
# cmake --install writes BUILD/install_manifest.txt, the list a user's own
# `cmake --install build` left there to uninstall with: it must end as it began.
manifest="$build/install_manifest.txt"
manifest_before=$(cat "$manifest" 2>/dev/null || echo "(none)")

[[ -e "$manifest" ]] && cp -p "$manifest" "$tmp/manifest.saved"
installed=0
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || installed=$?
if [[ -e "$tmp/manifest.saved" ]]; then cp -p "$tmp/manifest.saved" "$manifest"; else rm -f "$manifest"; fi
(( installed == 0 )) || { cat "$tmp/install.log"; fail "cmake --install"; check_done "install"; }

# The snippet: its #includes at file scope, the rest in main(), with the
# README's placeholders (msg, charge, broker) defined around it.
awk '/^## Using the library/{on=1} on&&/^```cpp/{inb=1;next} inb&&/^```/{exit} inb{print}' \
  "$src/README.md" >"$tmp/snippet.cc"
[[ -s "$tmp/snippet.cc" ]] || fail "no C++ snippet under 'Using the library' in README.md"
{
  grep '^#include' "$tmp/snippet.cc"
  cat <<'CC'
#include <cstdio>
#include <string>
struct Msg { std::string id, body; };
struct Broker {
  void ack(const Msg&) { std::puts("ack"); }
  void retry_after(const Msg&, dedup::Millis) { std::puts("retry"); }
  void dead_letter(const Msg&, const std::string&) { std::puts("dead_letter"); }
};
static void charge(const Msg&, uint64_t fence) { std::printf("charged, fence %llu\n", (unsigned long long)fence); }
int main(int argc, char** argv) {
  Msg msg{"order-42", "{}"};
  Broker broker;
CC
  grep -v '^#include' "$tmp/snippet.cc" | sed "s|\"rocksdb:/var/lib/myworker/dedup\"|argv[1]|"
  echo '  (void)argc; return 0;'
  echo '}'
} >"$tmp/app.cc"

mkdir -p "$tmp/cmake-app"
cat >"$tmp/cmake-app/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.16)
project(readme_app CXX)
set(CMAKE_CXX_STANDARD 20)
find_package(dedup REQUIRED)
add_executable(app $tmp/app.cc)
target_link_libraries(app dedup::dedup)
CM
if cmake -S "$tmp/cmake-app" -B "$tmp/cmake-app/b" -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/cm.log" 2>&1 &&
   cmake --build "$tmp/cmake-app/b" -j2 >>"$tmp/cm.log" 2>&1; then
  ok "find_package(dedup) + dedup::dedup builds the README snippet"
else
  fail "find_package(dedup): $(tail -20 "$tmp/cm.log")"
fi
if g++ -std=c++20 "$tmp/app.cc" -o "$tmp/app-pc" \
     $(PKG_CONFIG_PATH="$(dirname "$(find "$tmp/prefix" -name dedup.pc | head -1)")" pkg-config --cflags --libs dedup) >"$tmp/pc.log" 2>&1; then
  ok "pkg-config dedup builds the README snippet"
else
  fail "pkg-config dedup: $(grep -m3 -E 'error|undefined' "$tmp/pc.log")"
fi
for app in "$tmp/cmake-app/b/app" "$tmp/app-pc"; do
  [[ -x "$app" ]] || continue
  for uri in memory: "rocksdb:$tmp/db-$(basename "$app")"; do
    out=$("$app" "$uri" 2>&1) || true
    [[ "$out" == *"charged, fence"*ack* ]] && ok "$(basename "$app") on $uri: charged and acked" ||
      fail "$(basename "$app") on $uri: $out"
  done
  out=$("$app" "rocksdb:$tmp/db-$(basename "$app")" 2>&1) || true
  [[ "$out" == ack ]] && ok "$(basename "$app"): a second run is a duplicate, acked unrun" || fail "second run: $out"
done
[[ "$(cat "$manifest" 2>/dev/null || echo "(none)")" == "$manifest_before" ]] &&
  ok "the build's install_manifest.txt is as it was" ||
  fail "the build's install_manifest.txt now lists $(head -1 "$manifest")"
check_done "install"
