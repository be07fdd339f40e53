#!/usr/bin/env bash
# The project's test command (CI runs exactly this, see .ci/run and README.md):
#   1. the pinned Python environment (ONNX Runtime is the oracle of the model tests),
#   2. the generated models, ResNet-50 included, when missing, and the compile-only ROCm toolchain
#      (scripts/setup-rocm.sh: clang-19 + HIP 5.2 via apt-get, CK headers into .tools/rocm; where
#      it cannot be installed the ROCm build test says why: it skips, or fails under CI),
#   3. the Python tests of scripts/gpu/ (the BENCHMARKS.md writers; CPU only, about a second),
#   4. `cargo test --release`. Release, because the model tests run whole networks through the
#      CPU reference executor and ONNX Runtime; an unoptimised build makes them minutes slower.
#   5. the Python package (scripts/test-python.sh: pip install ./src/python into .venv, a
#      release build of its extension in target/, then its tests),
#   6. the crate docs (`cargo doc --no-deps`, warnings are errors: no intra-doc link is
#      broken or points at a private item).
# Extra arguments go to `cargo test` (e.g. scripts/test.sh models -- --nocapture); a run with
# them is a focused cargo run and leaves out steps 5 and 6.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

echo "== python environment"
scripts/setup-python.sh

echo "== test models"
if [[ -f onnx_models/generated/resnet50.onnx ]]; then
  echo "onnx_models/generated/resnet50.onnx present"
else
  if [[ ! -x scripts/gen-models.sh ]]; then
    echo "test.sh: error: onnx_models/generated/resnet50.onnx is missing and scripts/gen-models.sh does not exist" >&2
    exit 1
  fi
  echo "generating models with scripts/gen-models.sh"
  scripts/gen-models.sh
fi

echo "== ROCm toolchain (scripts/setup-rocm.sh)"
ROCM_START=$SECONDS
scripts/setup-rocm.sh || echo "test.sh: the ROCm toolchain could not be installed (see above); tests/rocm.rs skips its build test, or fails it under CI"
echo "ROCm toolchain: $((SECONDS - ROCM_START)) s"

echo "== python tests of scripts/gpu"
python3 -m unittest discover -s scripts/gpu -p 'test_*.py'

echo "== cargo test --release $*"
LOG="$(mktemp)"
trap 'rm -f "$LOG"' EXIT
set +e
cargo test --release "$@" 2>&1 | tee "$LOG"
STATUS=${PIPESTATUS[0]}
set -e

# One summary line, and which tests skipped their GPU part (no GPU or no nvcc here).
scripts/test-summary.sh "$LOG"

PY_STATUS=0
DOC_STATUS=0
if [[ $# -eq 0 ]]; then
  echo "== python package (scripts/test-python.sh)"
  PY_START=$SECONDS
  scripts/test-python.sh || PY_STATUS=$?
  echo "python package: $((SECONDS - PY_START)) s"
  echo "== crate docs (cargo doc --no-deps, warnings denied)"
  RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --quiet || DOC_STATUS=$?
else
  echo "== python package and crate docs: not tested (arguments given: a focused cargo run)"
fi

if [[ $STATUS -ne 0 ]]; then
  echo "== FAILED (cargo test exit status $STATUS)"
  grep -E '^(test .* FAILED|failures:|error(\[|:))' "$LOG" | sort -u | head -n 50 || true
fi
if [[ $PY_STATUS -ne 0 ]]; then
  echo "== FAILED (scripts/test-python.sh exit status $PY_STATUS)"
fi
if [[ $DOC_STATUS -ne 0 ]]; then
  echo "== FAILED (cargo doc exit status $DOC_STATUS: a rustdoc warning above)"
fi
if [[ $STATUS -eq 0 && $PY_STATUS -eq 0 && $DOC_STATUS -eq 0 ]]; then
  echo "== OK"
  exit 0
fi
exit $((STATUS != 0 ? STATUS : PY_STATUS != 0 ? PY_STATUS : DOC_STATUS))
