#!/usr/bin/env bash
# ResNet-50 end to end on a fresh machine: Python environment (with the pinned nvcc + CUTLASS
# wheels), model generation, release build, then `onnx2ait inspect`, the main command (CUDA
# sources + OUT/libmodel.so, no GPU needed) and `onnx2ait validate`. With a GPU present the
# library is validated as a third column and benchmarked. Extra arguments go to
# `onnx2ait validate` (e.g. --seed 1).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL=onnx_models/generated/resnet50.onnx
OUT=out/resnet50

echo "== python environment"
scripts/setup-python.sh

if [[ ! -f "$MODEL" ]]; then
  echo "== generating $MODEL"
  if [[ ! -x scripts/gen-models.sh ]]; then
    echo "run-resnet50.sh: error: $MODEL is missing and scripts/gen-models.sh does not exist" >&2
    exit 1
  fi
  scripts/gen-models.sh
fi

echo "== cargo build --release"
cargo build --release
BIN=target/release/onnx2ait

echo "== onnx2ait inspect $MODEL"
"$BIN" inspect "$MODEL"

echo "== onnx2ait $MODEL -o $OUT"
"$BIN" "$MODEL" -o "$OUT"

if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  echo "== onnx2ait validate $MODEL --build $OUT --batch 8 $*"
  "$BIN" validate "$MODEL" --build "$OUT" --batch 8 "$@"
  echo "== onnx2ait bench $OUT --batch 1,8,64"
  "$BIN" bench "$OUT" --batch 1,8,64
else
  echo "== onnx2ait validate $MODEL $* (no GPU here: reference executor vs ONNX Runtime; the library in $OUT runs on a GPU)"
  "$BIN" validate "$MODEL" "$@"
fi
