#!/usr/bin/env bash
# Creates the project's Python environment in .venv with pinned versions of the tools the
# tests and validation use (onnx to build test models, onnxruntime as the numerical oracle —
# its libonnxruntime is what `onnx2ait validate` loads — and numpy), plus the CUDA toolchain
# the build stage compiles generated kernels with: nvcc and CUTLASS from PyPI wheels, so that
# machines without a CUDA install (CI, CPU-only hosts) can still compile and link.
#
# Idempotent: a stamp file records the hash of the pin list; when it matches and the packages
# import at the pinned versions, nothing is done. Set PYTHON to choose the interpreter.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"
VENV="$ROOT/.venv"
PYTHON="${PYTHON:-python3}"

# One pin per line.
PINS=(
  "onnx==1.23.2"
  "onnxruntime==1.32.0"
  "numpy==2.3.5"
  # CUDA 13.0 compiler: nvcc + ptxas/fatbinary/nvlink (nvidia/cu13/bin); nvcc.profile finds
  # the rest by relative path. nvvm (cicc, libdevice) and crt (host headers) are separate wheels
  # that nvcc cannot run without.
  "nvidia-cuda-nvcc==13.0.88"
  "nvidia-nvvm==13.0.88"
  "nvidia-cuda-crt==13.0.88"
  # cuda_runtime.h and libcudart_static.a, which generated libraries link statically.
  "nvidia-cuda-runtime==13.0.96"
  # libcu++ / CUB / Thrust (nvidia/cu13/include/cccl), required by CUTLASS.
  "nvidia-cuda-cccl==13.0.85"
  # CUTLASS 4.2 C++ headers (cutlass_library/source/include and .../tools/util/include).
  "nvidia-cutlass==4.2.0.0"
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
LIB="$(ls "$VENV"/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so* 2>/dev/null | head -n1 || true)"
echo "setup-python: ready; ONNX Runtime library: ${LIB:-not found}"
NVCC_BIN="$(ls "$VENV"/lib/python3*/site-packages/nvidia/cu13/bin/nvcc 2>/dev/null | head -n1 || true)"
if [[ -n "$NVCC_BIN" ]] && NVCC_VERSION="$("$NVCC_BIN" --version 2>/dev/null | grep -o 'release .*')"; then
  echo "setup-python: nvcc: $NVCC_BIN ($NVCC_VERSION)"
else
  echo "setup-python: error: nvcc from the nvidia-cuda-nvcc wheel does not run (${NVCC_BIN:-not found})" >&2
  exit 1
fi
CUTLASS="$(ls -d "$VENV"/lib/python3*/site-packages/cutlass_library/source 2>/dev/null | head -n1 || true)"
echo "setup-python: CUTLASS: ${CUTLASS:-not found}"
# Only a fully checked environment is stamped, so a broken one is re-examined next time.
echo "$WANT" > "$STAMP"
