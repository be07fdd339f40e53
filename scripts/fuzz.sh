#!/usr/bin/env bash
# Coverage-guided fuzzing of the ONNX importer with libFuzzer (cargo-fuzz).
# Usage: scripts/fuzz.sh [SECONDS]   (default 600)
# Installs cargo-fuzz if missing. cargo-fuzz passes nightly-only flags to rustc; on the stable
# toolchain RUSTC_BOOTSTRAP=1 allows them (this affects only this fuzz build).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-600}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
corpus=target/fuzz-corpus/import
mkdir -p "$corpus"
cp onnx_models/*.onnx "$corpus"/ 2>/dev/null || true
export RUSTC_BOOTSTRAP=1
# -s none: no sanitizer (the project has no unsafe code on this path beyond mmap); rss limit
# keeps a mutated dim from eating the machine.
cargo fuzz run --fuzz-dir tests/fuzz -s none import "$corpus" -- \
  -max_total_time="$secs" -rss_limit_mb=4096 -print_final_stats=1 2>&1 | tee target/fuzz-import.log | grep -E "^(#[0-9]+\s+(DONE|INITED)|Done|stat::|==|SUMMARY)" || true
grep -q "Done" target/fuzz-import.log && ! grep -q "panicked\|deadly signal" target/fuzz-import.log
