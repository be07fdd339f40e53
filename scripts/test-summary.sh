#!/usr/bin/env bash
# Summarises a `cargo test` log (scripts/test.sh runs it on its own log):
#   == summary: P passed, F failed, I ignored in N test binaries
# and, when tests ran without a GPU, a line saying which tests skipped their GPU part and why.
# Such tests print `GPU-SKIPPED: <test> (<why>)` on stderr (past the test harness's output
# capture, see src/runtime/tests.rs), so a green run without a GPU does not pass for a GPU run.
#
# Usage: scripts/test-summary.sh LOG
set -euo pipefail

if [[ $# -ne 1 || ! -f "$1" ]]; then
  echo "usage: scripts/test-summary.sh LOG (a cargo test log)" >&2
  exit 2
fi
log="$1"

# Sum the per-binary "test result:" lines into one line.
awk '
  /^test result:/ {
    for (i = 1; i <= NF; i++) {
      if ($(i) ~ /^passed;?$/)  passed  += $(i-1)
      if ($(i) ~ /^failed;?$/)  failed  += $(i-1)
      if ($(i) ~ /^ignored;?$/) ignored += $(i-1)
    }
    suites++
  }
  END { printf "\n== summary: %d passed, %d failed, %d ignored in %d test binaries\n", passed, failed, ignored, suites }
' "$log"

# The marker may share a line with the harness's own output: match it anywhere. One entry per
# test (a test retried or printed twice counts once).
skipped="$(grep -o 'GPU-SKIPPED: .*' "$log" | sed 's/^GPU-SKIPPED: //' | sort -u -t' ' -k1,1 || true)"
if [[ -n "$skipped" ]]; then
  n="$(printf '%s\n' "$skipped" | wc -l | tr -d ' ')"
  if [[ "$n" == 1 ]]; then what="1 test skipped its GPU part"; else what="$n tests skipped their GPU part"; fi
  echo "== GPU: $what (no GPU here, or no nvcc to build for one; run the tests where both are):"
  printf '%s\n' "$skipped" | sed 's/^/   /'
else
  echo "== GPU: no test skipped its GPU part"
fi
