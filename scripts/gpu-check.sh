#!/usr/bin/env bash
# shellcheck disable=SC2317 # the step functions are called indirectly, through run_step
# The GPU check of issues 5 and 6, in one command on the GPU machine (from the repository root):
# environment, torchvision ResNet-50 export, a build with a cold profile cache and empty object
# caches (`onnx2ait compile --profile`: profile, then build), onnx2ait compile with the profile
# cache warm (from an empty object cache, then a no-change rebuild), validation at batch 1 and 32
# over several seeds,
# latency against PyTorch (eager and CUDA graph, same run), every bundled model compiled and
# validated, and BENCHMARKS.md. (torch.compile peers: scripts/gpu-bench.sh.)
#
#   scripts/gpu-check.sh [--quick] [--budget SECONDS] [--seeds N] [--models GLOB] [--models-only]
#                        [--model-jobs N] [--validate-jobs N] [--arch ARCH]
#
#   --quick          skip the bundled-model loop
#   --budget S       wall-clock budget of the whole run (default 560: the device tool stops a
#                    command at 600 s). The model loop starts no model after the budget minus
#                    the time kept for the report, and reports the rest "not run (time budget)".
#   --seeds N        validation seeds per batch size (default 8: seeds 0..N-1)
#   --models GLOB    the bundled models to check (default 'onnx_models/*.onnx'); quote it
#   --models-only    only the environment and the model loop (to finish a loop another run cut short)
#   --model-jobs N   models compiled and validated at the same time (default 2)
#   --validate-jobs N  validate calls at the same time (default 4)
#   --arch ARCH      onnx2ait compile --arch (default sm_90a)
#   --no-profile     compile with the heuristic kernel choice (skip the cold build)
#   --profile-cache FILE  start from this profile cache (a copy; e.g. an earlier run's
#                    profile_cache.json) instead of the cold build, which is then skipped
#
# Prepare first on the CPU machine with scripts/gpu-prepare.sh (it builds .gpu/bin/onnx2ait,
# packs the CUTLASS headers and prints the device call). Results go to $OUT (the device tool
# sets it; by hand it defaults to ./gpu-out): gpu-check.log, results.json, BENCHMARKS.md,
# models.json, validate.json. Builds and the kernel cache stay in $GPU_CHECK_WORK (default
# out/gpu-check, git-ignored), so a second call on the same warm machine reuses the cache.
# Other settings from the environment: GPU_CHECK_PYTHON (default python3, the one with torch),
# GPU_CHECK_BIN (default .gpu/bin/onnx2ait, else target/release/onnx2ait), CUTLASS_DIR,
# ORT_DYLIB_PATH and ONNX2AIT_CACHE_DIR (each found or set here when unset).
# Exit status: 0 when every required step passed, 1 otherwise (each step's result is in the
# table printed at the end and in results.json).
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."
ROOT=$PWD
CMDLINE="scripts/gpu-check.sh${*:+ $*}"

QUICK=0 BUDGET=560 SEEDS=8 MODELS_GLOB='onnx_models/*.onnx' MODELS_ONLY=0 MODEL_JOBS=2 VALIDATE_JOBS=4 ARCH=sm_90a PROFILE=1 GIVEN_PROFILE=
while (($#)); do
  case $1 in
    --quick) QUICK=1 ;;
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    --seeds) SEEDS=${2:?--seeds needs a count}; shift ;;
    --models) MODELS_GLOB=${2:?--models needs a glob}; shift ;;
    --models-only) MODELS_ONLY=1 ;;
    --model-jobs) MODEL_JOBS=${2:?--model-jobs needs a count}; shift ;;
    --validate-jobs) VALIDATE_JOBS=${2:?--validate-jobs needs a count}; shift ;;
    --arch) ARCH=${2:?--arch needs a name such as sm_90a}; shift ;;
    --no-profile) PROFILE=0 ;;
    --profile-cache) GIVEN_PROFILE=${2:?--profile-cache needs a file}; shift ;;
    -h | --help) sed -n '3,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for n in "$BUDGET" "$SEEDS" "$MODEL_JOBS" "$VALIDATE_JOBS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check.sh: error: '$n' is not a positive integer" >&2; exit 2; }
done

START=$(date +%s)
DEADLINE=$((START + BUDGET))
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${GPU_CHECK_WORK:-out/gpu-check}
mkdir -p "$WORK"
WORK_ABS=$(cd "$WORK" && pwd)
PARTS=$WORK/parts RAW=$WORK/raw STEPS=$WORK/steps.tsv
rm -rf "$PARTS" "$RAW"
mkdir -p "$PARTS" "$RAW"
: >"$STEPS"
PY=${GPU_CHECK_PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

exec > >(tee "$OUT/gpu-check.log") 2>&1
TEE_PID=$!

# --- settings ------------------------------------------------------------------------------
NPROC=$(nproc)
if [[ -n ${GPU_CHECK_BIN:-} ]]; then
  BIN=$GPU_CHECK_BIN
elif [[ -f .gpu/bin/onnx2ait ]]; then
  BIN=.gpu/bin/onnx2ait
  [[ -x $BIN ]] || chmod +x "$BIN" # in case the carried copy lost its mode
else
  BIN=target/release/onnx2ait
fi
MODEL=$WORK/resnet50_tv.onnx
BUILD=$WORK/build/resnet50_tv
PROFILE_CACHE=$WORK_ABS/profile.json
COMPILE_ARGS=(--arch "$ARCH" --max-batch 256)
export ONNX2AIT_CACHE_DIR=${ONNX2AIT_CACHE_DIR:-$WORK_ABS/cache}
# The bundled models compile without a profile (heuristic choices); ResNet-50 uses its profile.
MODEL_COMPILE_ARGS=(--arch "$ARCH" --max-batch 256 --no-profile)

# ONNX Runtime and CUTLASS (scripts/gpu/toolchain.sh).
# shellcheck source=scripts/gpu/toolchain.sh
source scripts/gpu/toolchain.sh
gpu_toolchain_env "$PY" "$ROOT" "$WORK_ABS"

now() { date +%s.%N; }
# Seconds left before the deadline minus $1 (never below 1).
left() { local l=$((DEADLINE - $(date +%s) - ${1:-0})); ((l > 1)) && echo "$l" || echo 1; }

# --- step runner -----------------------------------------------------------------------------
# run_step NAME required|optional FUNCTION: runs FUNCTION in a subshell with `set -e` working
# (a subshell in an `if` would ignore it), times it, records the result in $STEPS. A function
# exits 77 to say "skipped"; it may write a one-line note to $WORK/note.
declare -A RESULT=()
FAILED_REQUIRED=()
run_step() {
  local name=$1 req=$2 fn=$3 t0 t1 rc status note=""
  echo
  echo "=== [$name] $(date -u +%H:%M:%S) ($(left) s of the budget left)"
  rm -f "$WORK/note"
  t0=$(now)
  set +e
  (
    set -e
    "$fn"
  )
  rc=$?
  set -e
  t1=$(now)
  if [[ -f $WORK/note ]]; then note=$(head -c 300 "$WORK/note" | tr '\t\n' '  ' | sed 's/ *$//'); fi
  case $rc in
    0) status=ok ;;
    77) status=skipped ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  RESULT[$name]=$status
  if [[ $status == FAILED* && $req == required ]]; then FAILED_REQUIRED+=("$name"); fi
  printf '%s\t%s\t%.1f\t%s\t%s\n' "$name" "$status" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$req" "$note" >>"$STEPS"
  echo "=== [$name] $status"
}
ok() { [[ ${RESULT[$1]:-} == ok ]]; }
skip() { echo "$*" >"$WORK/note"; echo "skipped: $*"; exit 77; }
note() { echo "$*" >"$WORK/note"; }
# noted RECORD.json COMMAND...: runs COMMAND, then notes the one-line summary of RECORD.json
# (whatever COMMAND's exit status), and returns that status.
noted() {
  local rec=$1 rc=0
  shift
  "$@" || rc=$?
  note "$("$PY" scripts/gpu/checks.py note "$rec" 2>/dev/null || true)"
  return "$rc"
}

# --- steps -------------------------------------------------------------------------------------
step_env() {
  echo "onnx2ait binary: $BIN; work folder: $WORK; out: $OUT; budget ${BUDGET} s"
  nvidia-smi || true
  "$PY" scripts/gpu/checks.py env --bin "$BIN" --commit-file .gpu/COMMIT --command "$CMDLINE" --out "$PARTS/env.json"
  [[ -n $ORT_DYLIB_PATH && -f $ORT_DYLIB_PATH ]] || { note "no libonnxruntime found (set ORT_DYLIB_PATH)"; exit 1; }
  [[ -n $CUTLASS_DIR && -d $CUTLASS_DIR/include/cutlass ]] ||
    { note "no CUTLASS headers (run scripts/gpu-prepare.sh and carry .gpu, or set CUTLASS_DIR)"; exit 1; }
}

step_export() {
  noted "$PARTS/export.json" timeout -k 10 "$(left 60)" "$PY" scripts/gpu/export_torchvision.py resnet50 "$MODEL" \
    --opset 17 --max-ir-version 10 --meta-out "$PARTS/export.json"
}

# The build with a cold profile cache, as a user runs it: one `onnx2ait compile --profile` from
# an empty profile cache and empty object caches, with the default object caches (the profiler's
# beside the profile cache, the build's in its output folder: the build takes the instances it
# chose from the profiler's). It compiles every candidate instance (~80 for ResNet-50), times
# them, and builds the library with the measured choices.
step_cold_build() {
  ok export || skip "no exported model"
  ((PROFILE)) || skip "--no-profile"
  if [[ -n $GIVEN_PROFILE ]]; then
    cp "$GIVEN_PROFILE" "$PROFILE_CACHE"
    skip "profile cache given ($GIVEN_PROFILE)"
  fi
  rm -rf "$ONNX2AIT_CACHE_DIR" "$PROFILE_CACHE" "$(dirname "$PROFILE_CACHE")/profiler" "$BUILD-cold"
  local rc=0
  env -u ONNX2AIT_CACHE_DIR "$PY" scripts/gpu/checks.py compile --bin "$BIN" --model "$MODEL" --out-dir "$BUILD-cold" \
    --label "cold profile cache" --timeout "$(left 200)" --deadline "$((DEADLINE - 200))" \
    --json "$PARTS/build_cold.json" -- "${COMPILE_ARGS[@]}" --profile --profile-cache "$PROFILE_CACHE" \
    --jobs "$NPROC" || rc=$?
  note "$("$PY" scripts/gpu/checks.py note "$PARTS/build_cold.json" 2>/dev/null || true)"
  if ((rc != 0)) && "$PY" -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1])).get("timed_out") else 1)' \
    "$PARTS/build_cold.json" 2>/dev/null; then
    # Not a compiler failure: the run's --budget left too little for a cold profile (ResNet-50's
    # profiler compiles ~80 candidate instances, about 220 s on 16 cores, before timing them).
    note "stopped by the time budget: give the run a larger --budget"
  fi
  rm -rf "$BUILD-cold"
  return "$rc"
}

# Profiled choices when the cold build ran or a profile cache was given.
profiled() { ((PROFILE)) && { ok "build cold" || [[ -n $GIVEN_PROFILE ]]; }; }

# With the profile cache warm and every object cache empty (the profiler's too: compile would
# take the instances it chose from there), as on a machine that was given the profile cache.
step_build_scratch() {
  ok export || skip "no exported model"
  rm -rf "$BUILD" "$ONNX2AIT_CACHE_DIR" "$(dirname "$PROFILE_CACHE")/profiler"
  if profiled; then COMPILE_ARGS+=(--profile-cache "$PROFILE_CACHE"); else COMPILE_ARGS+=(--no-profile); fi
  noted "$PARTS/build_scratch.json" \
    "$PY" scripts/gpu/checks.py compile --bin "$BIN" --model "$MODEL" --out-dir "$BUILD" --label scratch \
    --timeout 480 --deadline "$((DEADLINE - 60))" --json "$PARTS/build_scratch.json" -- \
    "${COMPILE_ARGS[@]}" --jobs "$NPROC"
}

step_build_rebuild() {
  ok "build scratch" || skip "the scratch build failed"
  if profiled; then COMPILE_ARGS+=(--profile-cache "$PROFILE_CACHE"); else COMPILE_ARGS+=(--no-profile); fi
  noted "$PARTS/build_rebuild.json" \
    "$PY" scripts/gpu/checks.py compile --bin "$BIN" --model "$MODEL" --out-dir "$BUILD" --label rebuild \
    --timeout 300 --deadline "$((DEADLINE - 30))" --json "$PARTS/build_rebuild.json" -- \
    "${COMPILE_ARGS[@]}" --jobs "$NPROC"
}

validate_batch() {
  ok "build scratch" || skip "no build"
  noted "$PARTS/validate_b$1.json" \
    "$PY" scripts/gpu/checks.py validate --bin "$BIN" --model "$MODEL" --build "$BUILD" --batch "$1" \
    --seeds "0-$((SEEDS - 1))" --jobs "$VALIDATE_JOBS" --timeout 300 --deadline "$((DEADLINE - 30))" \
    --max-err 1e-2 --min-top1 1.0 --json "$PARTS/validate_b$1.json" --raw-out "$RAW/validate_b$1.json"
}
step_validate_b1() { validate_batch 1; }
step_validate_b32() { validate_batch 32; }

step_bench_onnx2ait() {
  ok "build scratch" || skip "no build"
  noted "$PARTS/bench_onnx2ait.json" \
    "$PY" scripts/gpu/checks.py bench --bin "$BIN" --build "$BUILD" --batch 1,8,64,256 --iters 50 --warmup 10 \
    --timeout 300 --deadline "$((DEADLINE - 30))" --json "$PARTS/bench_onnx2ait.json"
}

step_bench_torch() {
  ok "build scratch" || skip "no onnx2ait build to compare with"
  noted "$PARTS/bench_torch.json" timeout -k 10 "$(left 30)" "$PY" scripts/gpu/bench_torch.py --model resnet50 --batch 1,8,64,256 \
    --warmup 10 --iters 50 --json-out "$PARTS/bench_torch.json"
}

step_models() {
  local models=() missing=() light
  light=$("$PY" -c 'import os, onnx.backend.test as t
p = os.path.join(os.path.dirname(t.__file__), "data", "light", "light_resnet50.onnx")
print(p if os.path.isfile(p) else "")' 2>/dev/null || true)
  if [[ -n $light ]]; then
    models+=("$light")
  else
    missing=(--missing "light_resnet50=not in this machine's onnx package ($("$PY" -c 'import onnx; print("onnx", onnx.__version__)' 2>/dev/null || echo 'onnx not importable'))")
    echo "light_resnet50: not found in the onnx package of $PY"
  fi
  # shellcheck disable=SC2206 # the glob is meant to expand here
  local bundled=($MODELS_GLOB)
  for f in "${bundled[@]}"; do [[ -f $f ]] && models+=("$f"); done
  ((${#models[@]})) || skip "no models match '$MODELS_GLOB'"
  local carg=() a
  for a in "${MODEL_COMPILE_ARGS[@]}"; do carg+=(--compile-arg="$a"); done
  local jobs_each=$(((NPROC + MODEL_JOBS - 1) / MODEL_JOBS))
  # light_resnet50's activations reach 9.7e18 (its weights are constant fills): fp16 cannot hold
  # them, so it is compiled with fp32 activations (see /README.md, --precision).
  noted "$PARTS/models.json" \
    "$PY" scripts/gpu/checks.py models --bin "$BIN" --work "$WORK/models" --jobs "$MODEL_JOBS" \
    --compile-jobs "$jobs_each" "${carg[@]}" --model-arg light_resnet50=--precision \
    --model-arg light_resnet50=fp32 --timeout 300 \
    --deadline "$((DEADLINE - 40))" --hard-deadline "$((DEADLINE - 10))" "${missing[@]}" \
    --json "$PARTS/models.json" -- "${models[@]}"
}

report() {
  local overall=passed
  ((${#FAILED_REQUIRED[@]} == 0)) || overall=failed
  "$PY" scripts/gpu/checks.py collect --parts "$PARTS" --steps "$STEPS" --overall "$overall" \
    --out "$OUT/results.json" --raw "$RAW" --raw-out "$OUT/validate.json" || return 1
  if [[ -f $PARTS/models.json ]]; then cp "$PARTS/models.json" "$OUT/models.json" || return 1; fi
  if [[ -f $PROFILE_CACHE ]]; then cp "$PROFILE_CACHE" "$OUT/profile_cache.json" || return 1; fi
  local prev=()
  if [[ -f BENCHMARKS.md ]]; then prev=(--previous BENCHMARKS.md); fi
  "$PY" scripts/gpu/write_benchmarks.py --results "$OUT/results.json" --out "$OUT/BENCHMARKS.md" "${prev[@]}" \
    --print-section
}

# --- run ---------------------------------------------------------------------------------------
echo "gpu-check: $CMDLINE; started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), budget ${BUDGET} s"
run_step environment required step_env
if ((MODELS_ONLY)); then
  run_step models required step_models
else
  run_step export required step_export
  run_step "build cold" required step_cold_build
  run_step "build scratch" required step_build_scratch
  run_step "build rebuild" required step_build_rebuild
  run_step "validate bs1" required step_validate_b1
  run_step "validate bs32" required step_validate_b32
  # The benchmark runs before the model loop: the loop takes whatever time is left.
  run_step "bench onnx2ait" required step_bench_onnx2ait
  run_step "bench PyTorch" required step_bench_torch
  if ((QUICK)); then
    printf 'models\tskipped\t0\trequired\t--quick\n' >>"$STEPS"
  else
    run_step models required step_models
  fi
fi

echo
echo "=== [report]"
if ! report; then
  FAILED_REQUIRED+=(report)
  echo "error: writing results.json / BENCHMARKS.md failed"
fi

echo
echo "=== steps (total $(($(date +%s) - START)) s of a ${BUDGET} s budget)"
printf '%-16s %-20s %9s  %-9s %s\n' step result seconds required note
while IFS=$'\t' read -r s st sec rq nt; do
  printf '%-16s %-20s %9s  %-9s %s\n' "$s" "$st" "$sec" "$rq" "${nt:0:100}"
done <"$STEPS"
echo
echo "files in $OUT: $(cd "$OUT" && find . -maxdepth 1 -type f -printf '%f ' | sort)"
if ((${#FAILED_REQUIRED[@]})); then
  echo "gpu-check: FAILED: ${FAILED_REQUIRED[*]}"
  status=1
else
  echo "gpu-check: all required checks passed"
  status=0
fi
# Let tee write the end of the log before the command returns.
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null || true
exit "$status"
