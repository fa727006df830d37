#!/usr/bin/env bash
# The end of `make test`: what was skipped in each build tree's last ctest run, and why, so a
# run without ../shared (or on a CPU that cannot run a variant) never reads as a full pass.
#   scripts/test-summary.sh <build dir>...
# Reads <dir>/ctest-junit.xml (ctest --output-junit, as the Makefile runs it): the ctest entries
# that ended skipped (every test in them skipped: exit code 77; a variant this CPU cannot run)
# and the tests skipped inside entries that passed (the "npullm-skipped: Suite.Test: reason"
# lines of tests/gtest_main.cpp).
set -uo pipefail

unescape() { sed -e 's/&lt;/</g' -e 's/&gt;/>/g' -e 's/&quot;/"/g' -e "s/&apos;/'/g" -e 's/&amp;/\&/g'; }

total_entries=0
total_tests=0
for dir in "$@"; do
  junit="$dir/ctest-junit.xml"
  if [[ ! -f "$junit" ]]; then
    echo "test summary: no $junit (ctest did not run in $dir)"
    continue
  fi
  mapfile -t entries < <(grep -o '<testcase name="[^"]*" [^>]*status="notrun"' "$junit" |
    sed 's/<testcase name="\([^"]*\)".*/\1/' | unescape | sort -u)
  mapfile -t tests < <(grep -a '^npullm-skipped: ' "$junit" | sed 's/^npullm-skipped: //' | unescape |
    sort | uniq -c | sed 's/^ *\([0-9]*\) /\1x /')
  entries_n=${#entries[@]}
  tests_n=$(grep -ac '^npullm-skipped: ' "$junit")
  total_entries=$((total_entries + entries_n))
  total_tests=$((total_tests + tests_n))
  echo "test summary, $dir: $entries_n ctest entries skipped, $tests_n gtest tests skipped"
  for e in "${entries[@]}"; do echo "  skipped entry: $e"; done
  for t in "${tests[@]}"; do echo "  skipped test:  $t"; done
done
echo "test summary: $total_entries ctest entries and $total_tests tests skipped in all"
