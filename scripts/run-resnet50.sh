#!/usr/bin/env bash
# ResNet-50 end to end on a fresh machine: Python environment, model generation, release
# build, then `onnx2ait inspect`, the main command and `onnx2ait validate` on the model.
# Extra arguments go to `onnx2ait validate` (e.g. --dim N=4 --seed 1).
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

echo "== onnx2ait validate $MODEL $*"
"$BIN" validate "$MODEL" "$@"
