#!/usr/bin/env bash
# Checks for shell tests. Source it, then:
#
#   check "first claim acquires" "0 1 1" "$(claim ...)"   # prints ok / FAIL, counts
#   fail "what went wrong"                                 # counts a failure
#   lines                                                  # a reply's lines as one line
#   check_done NAME                                        # exits 1 if anything failed
failures=0
check() {  # check NAME EXPECTED ACTUAL
  if [[ "$2" == "$3" ]]; then
    echo "ok   $1"
  else
    echo "FAIL $1"; echo "  expected: $(printf %q "$2")"; echo "  actual:   $(printf %q "$3")"
    failures=$((failures + 1))
  fi
}
fail() { echo "FAIL $*"; failures=$((failures + 1)); }
lines() { tr '\n' ' ' | sed 's/ *$//'; }
check_done() {
  if ((failures)); then
    echo "$failures check(s) failed"
    exit 1
  fi
  echo "all $1 checks passed"
}
