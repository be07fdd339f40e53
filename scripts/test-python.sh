#!/usr/bin/env bash
# Builds the Python package (src/python: PyO3 + maturin) into the project's .venv and runs its
# tests (src/python/tests; CPU only where no GPU is present, the GPU tests then say they skipped).
# scripts/test.sh runs it after the cargo tests.
#
# CARGO_TARGET_DIR defaults to the repository's target/, so later runs are incremental and the
# crates `cargo test --release` built with the same features are shared. Most are not: PyO3 and
# rust-numpy turn on features of common dependencies (syn's visit-mut, num-complex's std), which
# gives them, and onnx2ait above them, other hashes; the first run builds onnx2ait in release
# again (about 5 minutes on 2 cores).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"

scripts/setup-python.sh >/dev/null
PY="$ROOT/.venv/bin/python"

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
echo "test-python: pip install ./src/python (CARGO_TARGET_DIR=$CARGO_TARGET_DIR)"
START=$SECONDS
# pip fetches the build backend (maturin, as src/python/pyproject.toml asks) into an isolated
# build environment; cargo's output goes to the log only if the build fails.
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
if ! "$PY" -m pip install --disable-pip-version-check --no-input --force-reinstall --no-deps ./src/python >"$LOG" 2>&1; then
  cat "$LOG" >&2
  echo "test-python: error: pip install ./src/python failed" >&2
  exit 1
fi
echo "test-python: installed in $((SECONDS - START)) s"

# From outside the source tree, so `import onnx2ait` is the installed package.
cd "$ROOT/src/python/tests"
"$PY" -m unittest discover -v -s . -p 'test_*.py' "$@"
