#!/usr/bin/env bash
# (Re)generates every test model with the project's pinned Python environment:
#   onnx_models/*.onnx          bundled small models (generate.py, generate_extra.py; committed)
#   onnx_models/rules/*.onnx    one model per optimiser rule file (rule_models.py; committed)
#   onnx_models/generated/      full-size networks, git-ignored: resnet50.onnx (resnet50.py, ~100 MB)
#                               and bert12.onnx (bert_encoder.py, ~340 MB)
# Generators other than generate.py and resnet50.py are run when present.
#
# Deterministic: running it twice gives byte-identical files (pinned onnx/numpy, fixed seeds).
# `--verify` regenerates into a scratch directory and compares with the files in place
# (full-size networks only when they exist in place).
#
# Usage: scripts/gen-models.sh [--no-large] [--verify]
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models="$root/onnx_models"
python="$root/.venv/bin/python"
large=1
verify=0
for arg in "$@"; do
    case "$arg" in
        --no-large) large=0 ;;
        --verify) verify=1 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "gen-models.sh: unknown argument '$arg'" >&2; exit 2 ;;
    esac
done

# The environment (pinned onnx / onnxruntime / numpy) is owned by setup-python.sh, which is a
# no-op when .venv is already up to date.
if [[ -x "$root/scripts/setup-python.sh" ]]; then
    "$root/scripts/setup-python.sh"
elif [[ ! -x "$python" ]]; then
    echo "gen-models.sh: $python not found and scripts/setup-python.sh is missing" >&2
    exit 1
fi

# Runs generator $1 (relative to onnx_models/) with the remaining arguments, if it exists.
gen() {
    local script="$models/$1"
    shift
    if [[ -f "$script" ]]; then
        "$python" "$script" "$@"
    fi
}

# Writes everything under $1 (onnx_models/ itself, or a scratch directory with its layout when
# $2 is 1, verifying: quiet, and full-size networks only where they exist in place).
generate_all() {
    local out="$1" verifying="$2"
    # Generators print to the caller's stdout as it is: never reopen /dev/stdout, which truncates
    # a log the caller redirected into a file (its start became NUL bytes).
    run_gen() {
        if [[ "$verifying" == 1 ]]; then gen "$@" >/dev/null; else gen "$@"; fi
    }
    mkdir -p "$out/rules" "$out/generated"
    run_gen generate.py --out "$out"
    run_gen generate_extra.py --out "$out"
    run_gen rule_models.py --out "$out/rules"
    if [[ "$large" == 1 ]]; then
        if [[ "$verifying" == 0 || -f "$models/generated/resnet50.onnx" ]]; then
            run_gen resnet50.py --out "$out/generated/resnet50.onnx"
        fi
        if [[ "$verifying" == 0 || -f "$models/generated/bert12.onnx" ]]; then
            run_gen bert_encoder.py --out "$out/generated/bert12.onnx"
        fi
    fi
}

if [[ "$verify" == 0 ]]; then
    generate_all "$models" 0
    exit 0
fi

scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
# generate.py removes its own stale files using the MODELS.md index it finds in the output folder.
cp "$models/MODELS.md" "$scratch/" 2>/dev/null || true
generate_all "$scratch" 1
status=0
while IFS= read -r -d '' f; do
    rel="${f#"$scratch"/}"
    if [[ ! -f "$models/$rel" ]]; then
        echo "onnx_models/$rel is missing (run scripts/gen-models.sh)" >&2
        status=1
    elif ! cmp -s "$f" "$models/$rel"; then
        echo "onnx_models/$rel differs from a fresh generation" >&2
        status=1
    fi
done < <(find "$scratch" -type f -print0 | sort -z)
if [[ "$status" == 0 ]]; then
    echo "gen-models.sh: models are up to date and reproducible"
fi
exit "$status"
