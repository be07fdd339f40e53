#!/usr/bin/env bash
# Prepares the GPU check (scripts/gpu-check.sh) on this CPU machine, before the device call:
#   1. cargo build --release, and a stripped copy of the binary in .gpu/bin/onnx2ait
#      (the release binary carries ~55 MB of debug line tables; the device call carries 64 MiB);
#   2. the CUTLASS 4.2 headers (include/ and tools/util/include/ only) packed into
#      .gpu/cutlass.tar.xz (~1 MB instead of ~28 MB; gpu-check.sh unpacks it there);
#   3. .gpu/COMMIT (git rev-parse HEAD, "-dirty" when the working tree differs) and .gpu/CARRY;
#   4. makes sure .gpu/ and gpu-out/ are git-ignored (.git/info/exclude), checks the size of
#      what the device call will carry, and prints the call.
#
#   scripts/gpu-prepare.sh [--no-build]
#
#   --no-build   skip cargo and take the existing target/release/onnx2ait (to re-pack quickly)
#
# CUTLASS comes from $CUTLASS_DIR (a folder holding include/cutlass, or cutlass_library/source),
# else from the nvidia-cutlass wheel in the project .venv (scripts/setup-python.sh installs it;
# this script runs it when the headers are missing).
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."
ROOT=$PWD
G=.gpu
MAX_MIB=64 WARN_MIB=48
BUILD=1
while (($#)); do
  case $1 in
    --no-build) BUILD=0 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-prepare.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
die() { echo "gpu-prepare.sh: error: $*" >&2; exit 1; }

# --- ignore rules first, so nothing below shows up as untracked --------------------------------
mkdir -p "$G/bin"
EXCLUDE=$(git rev-parse --git-path info/exclude)
for p in /.gpu/ /gpu-out/; do
  probe=${p#/}x
  if ! git check-ignore -q --no-index "$probe"; then
    mkdir -p "$(dirname "$EXCLUDE")"
    echo "$p" >>"$EXCLUDE"
    echo "added $p to $EXCLUDE"
  fi
done

# --- 1. binary ---------------------------------------------------------------------------------
if ((BUILD)); then
  echo "== cargo build --release"
  cargo build --release
fi
SRC_BIN=target/release/onnx2ait
[[ -x $SRC_BIN ]] || die "$SRC_BIN does not exist (run without --no-build)"
if command -v strip >/dev/null; then
  strip --strip-debug -o "$G/bin/onnx2ait.tmp" "$SRC_BIN"
else
  echo "warning: no 'strip' program: copying the binary with its debug info"
  cp "$SRC_BIN" "$G/bin/onnx2ait.tmp"
fi
chmod +x "$G/bin/onnx2ait.tmp"
mv -f "$G/bin/onnx2ait.tmp" "$G/bin/onnx2ait"
VERSION=$("$G/bin/onnx2ait" --version) || die "$G/bin/onnx2ait does not run"
echo "binary: $G/bin/onnx2ait ($VERSION, $(du -h "$G/bin/onnx2ait" | cut -f1))"
# The CLI is being extended in parallel: say early which commands the check needs are missing.
for sub in compile validate bench; do
  "$G/bin/onnx2ait" "$sub" --help >/dev/null 2>&1 || echo "warning: onnx2ait has no '$sub' command yet: that step of gpu-check.sh will fail"
done
for flag in --arch --max-batch --jobs; do
  "$G/bin/onnx2ait" compile --help 2>/dev/null | grep -q -- "$flag" ||
    echo "warning: 'onnx2ait compile' has no $flag option yet"
done
"$G/bin/onnx2ait" validate --help 2>/dev/null | grep -q -- --build ||
  echo "warning: 'onnx2ait validate' has no --build option yet"

# --- 2. CUTLASS headers --------------------------------------------------------------------------
find_cutlass() {
  local d
  for d in "${CUTLASS_DIR:-}" "${CUTLASS_DIR:-}/cutlass_library/source" "$ROOT"/.venv/lib/python3*/site-packages/cutlass_library/source; do
    if [[ -n $d && -f $d/include/cutlass/cutlass.h && -d $d/tools/util/include/cutlass ]]; then
      echo "$d"
      return 0
    fi
  done
  return 1
}
if ! CUT=$(find_cutlass); then
  echo "== CUTLASS headers not found: running scripts/setup-python.sh (installs nvidia-cutlass into .venv)"
  scripts/setup-python.sh
  CUT=$(find_cutlass) || die "no CUTLASS headers: set CUTLASS_DIR to a folder with include/cutlass and tools/util/include"
fi
CUT_VERSION=$(sed -n 's/^#define CUTLASS_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$CUT/include/cutlass/version.h" | paste -sd. -)
ARCHIVE=$G/cutlass.tar.xz
STAMP="$CUT $CUT_VERSION $(find "$CUT/include" "$CUT/tools/util/include" -type f | wc -l)"
if [[ -f $ARCHIVE && -f $G/cutlass.stamp && $(cat "$G/cutlass.stamp") == "$STAMP" ]]; then
  echo "CUTLASS $CUT_VERSION: $ARCHIVE is up to date"
else
  echo "== packing CUTLASS $CUT_VERSION headers from $CUT"
  tar -C "$CUT" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner \
    -cf - include tools/util/include | xz -T0 -6 >"$ARCHIVE.tmp"
  mv -f "$ARCHIVE.tmp" "$ARCHIVE"
  echo "$STAMP" >"$G/cutlass.stamp"
fi
for f in include/cutlass/cutlass.h include/cute/tensor.hpp tools/util/include/cutlass/util/packed_stride.hpp; do
  xz -dc "$ARCHIVE" | tar -tf - "$f" >/dev/null 2>&1 || die "$ARCHIVE lacks $f"
done
# An unpacked copy would travel too and cost ~28 MB: gpu-check.sh prefers the folder, so remove it.
rm -rf "$G/cutlass"
echo "CUTLASS: $ARCHIVE ($(du -h "$ARCHIVE" | cut -f1); headers $(xz -dc "$ARCHIVE" | wc -c | awk '{printf "%.0f MB", $1/1e6}') unpacked)"

# --- 3. commit and carry list ---------------------------------------------------------------------
COMMIT=$(git rev-parse HEAD)
if [[ -n $(git status --porcelain --untracked-files=normal) ]]; then
  COMMIT="$COMMIT-dirty"
fi
echo "$COMMIT" >"$G/COMMIT"
echo "$G" >"$G/CARRY"
echo "commit: $COMMIT"

# --- 4. size of what the device call carries -------------------------------------------------------
# Tracked files and untracked files git does not ignore, plus the carried .gpu folder.
TOTAL=$(
  {
    git ls-files -z --cached --others --exclude-standard
    find "$G" -type f -print0
  } | python3 -c '
import os, sys
paths = set(p for p in sys.stdin.buffer.read().split(b"\0") if p)
print(sum(os.lstat(p).st_size for p in paths if os.path.lexists(p)))'
)
MIB=$(awk -v b="$TOTAL" 'BEGIN { printf "%.1f", b / 1048576 }')
GPU_MIB=$(du -sm "$G" | cut -f1)
echo "the device call carries ${MIB} MiB (of which .gpu ${GPU_MIB} MiB); the limit is ${MAX_MIB} MiB"
if awk -v m="$MIB" -v l="$MAX_MIB" 'BEGIN { exit !(m >= l) }'; then
  die "over the ${MAX_MIB} MiB limit: the call would be refused"
elif awk -v m="$MIB" -v l="$WARN_MIB" 'BEGIN { exit !(m >= l) }'; then
  echo "warning: over ${WARN_MIB} MiB: close to the limit"
fi

cat <<EOF

Ready. Device call (one H200; 10-minute limit per command):
  carry:     [$(sed 's/.*/"&"/' "$G/CARRY" | paste -sd, -)]
  command:   bash scripts/gpu-check.sh
  timeout_s: 600
Variants: 'bash scripts/gpu-check.sh --quick' (no bundled-model loop);
'bash scripts/gpu-check.sh --models-only' (finish the model loop: a warm machine reuses the kernel cache).
What comes back: gpu-check.log, results.json, BENCHMARKS.md, models.json, validate.json.
Copy BENCHMARKS.md from the returned files to the repository root to record the run: it is the
repository's BENCHMARKS.md with this run's figures replacing those of the benchmarks it measured.
EOF
