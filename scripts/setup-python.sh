#!/usr/bin/env bash
# Creates the project's Python environment in .venv with pinned versions of the tools the
# tests and validation use (onnx to build test models, onnxruntime as the numerical oracle —
# its libonnxruntime is what `onnx2ait validate` loads — and numpy).
#
# Idempotent: a stamp file records the hash of the pin list; when it matches and the packages
# import at the pinned versions, nothing is done. Set PYTHON to choose the interpreter.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

# One pin per line. Later stages add the CUDA toolchain wheels (nvcc, CUTLASS) here.
PINS=(
  "onnx==1.23.2"
  "onnxruntime==1.32.0"
  "numpy==2.3.5"
)

STAMP="$VENV/.onnx2ait-pins"
pins_hash() { printf '%s\n' "${PINS[@]}" | sha256sum | cut -d' ' -f1; }
WANT="$(pins_hash)"

# True when every pinned distribution is installed at its pinned version.
pins_satisfied() {
  "$VENV/bin/python" - "${PINS[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
ok = True
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        print(f"  {name}: want {want}, have {have or 'nothing'}")
        ok = False
sys.exit(0 if ok else 1)
PY
}

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] && pins_satisfied >/dev/null; then
  echo "setup-python: $VENV is up to date (${PINS[*]})"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  if ! command -v "$PYTHON" >/dev/null; then
    echo "setup-python: error: $PYTHON not found; install Python 3 (3.10 or newer) or set PYTHON" >&2
    exit 1
  fi
  echo "setup-python: creating $VENV with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv "$VENV"
fi

if pins_satisfied >/dev/null; then
  echo "setup-python: packages already at the pinned versions"
else
  echo "setup-python: installing ${PINS[*]}"
  pins_satisfied || true
  "$VENV/bin/python" -m pip install --disable-pip-version-check --quiet "${PINS[@]}"
  if ! pins_satisfied; then
    echo "setup-python: error: the pinned versions are still not installed" >&2
    exit 1
  fi
fi
echo "$WANT" > "$STAMP"
LIB="$(ls "$VENV"/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so* 2>/dev/null | head -n1 || true)"
echo "setup-python: ready; ONNX Runtime library: ${LIB:-not found}"
