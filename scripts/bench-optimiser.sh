#!/usr/bin/env bash
# Optimisation-time benchmark of the e-graph optimiser (issue 4), release build: prints the time
# `egraph::optimize` takes (best of 3) on the generated ResNet-50 and 12-layer BERT-base graphs,
# with per-phase statistics and kernel counts. Targets: ResNet-50 <= 1 s, BERT-12 <= 3 s.
#
# Generates onnx_models/generated/{resnet50,bert12}.onnx first when they are missing.
# Usage: scripts/bench-optimiser.sh
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="$root/.venv/bin/python"
if [[ ! -x "$python" ]]; then
    scripts/setup-python.sh
fi
[[ -f onnx_models/generated/resnet50.onnx ]] || "$python" onnx_models/resnet50.py
[[ -f onnx_models/generated/bert12.onnx ]] || "$python" onnx_models/bert_encoder.py
exec cargo test --release --test optimiser_bench -- --ignored --nocapture
