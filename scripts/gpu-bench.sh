#!/usr/bin/env bash
# shellcheck disable=SC2317 # the step functions are called indirectly, through run_step
# The benchmark of issue 6, in one command on the GPU machine (from the repository root): the
# torchvision models (default ResNet-50 and MobileNetV2; random weights of torch.manual_seed(0),
# dynamic batch, opset 17, fp32 ONNX) through onnx2ait (profile, compile, validate at batch 1
# and 8, bench) against PyTorch eager, PyTorch + CUDA graph and torch.compile(mode="max-autotune") on the
# same weights, all in the same run on the same GPU; then BENCHMARKS.md with every figure and the
# ratio peer ms / onnx2ait ms (above 1: onnx2ait is faster).
#
#   scripts/gpu-bench.sh [--budget S] [--models M,M] [--batches B,B] [--compile-batches B,B]
#                        [--no-torch-compile] [--tc-parallel N] [--tc-threads N] [--no-profile]
#                        [--profile-cache FILE] [--arch ARCH] [--max-batch N] [--iters N]
#                        [--warmup N] [--seeds N] [--validate-batches B,B]
#
#   --budget S            wall-clock budget of the whole run (default 560; the device tool stops a
#                         command at 600 s). No step starts that its estimate says cannot finish;
#                         what was not measured, and why, is listed in BENCHMARKS.md.
#   --models M,M          torchvision classification models (default resnet50,mobilenet_v2)
#   --batches B,B         batches of onnx2ait bench and PyTorch eager / CUDA graph (default 1,8,64,256)
#   --compile-batches B,B batches of torch.compile, one process each (default 1,256)
#   --no-torch-compile    no torch.compile peer (then nothing runs concurrently: see the schedule)
#   --tc-parallel N       torch.compile processes compiling at the same time (default: all, at most 4:
#                         on the 16-core H100 machine four at once finished in 287-354 s, six at once
#                         none within 350 s, their load near 90; 2026-12-07)
#   --tc-threads N        TORCHINDUCTOR_COMPILE_THREADS of each torch.compile process (default: torch's)
#   --no-profile          do not run `onnx2ait profile` even if onnx2ait has it
#   --pdl-off-too         also time each build with O2A_PDL=0 (programmatic dependent launch off)
#   --profile-cache FILE  seed the profile cache with FILE when this machine has none yet
#                         (default .gpu/profile_cache.json when it exists: put the profile_cache.json
#                         of an earlier run there to skip re-profiling on a fresh machine)
#   --arch ARCH           onnx2ait compile --arch (default sm_90a)
#   --max-batch N         onnx2ait compile / profile --max-batch (default 256)
#   --iters N, --warmup N timed and untimed runs per figure, for every engine (default 50, 10)
#   --seeds N             validation seeds at each validated batch (default 2). The bound on the error against
#                         ONNX Runtime is 1e-2, or 1.5x the network's own fp16 error where that is
#                         larger (scripts/gpu/fp16_error.py --weights auto, PyTorch fp16 vs fp32 on
#                         the export's weights, measured just before; BENCHMARKS.md states which)
#   --validate-batches B,B  batches validated against ONNX Runtime (default 1,8; the first is also
#                         the batch of the fp16 sensitivity measurement's bound)
#
# Schedule (the point: the 4-minute torch.compile autotuning of each shape must not serialise
# with everything else, and no timing may overlap anything):
#   1. environment, CUTLASS, which options this onnx2ait has (profile, --profile-cache, ...).
#   2. torch.compile jobs start in the background, one process per model and compile batch (up
#      to --tc-parallel at once). Each compiles and autotunes, warms up (CUDA graphs recorded),
#      writes a ready file, shuts its compile workers down and waits for a go file.
#   3. Meanwhile, CPU work only, under `nice -n 10` so the torch.compile jobs get the cores first:
#      the ONNX exports (in parallel), an onnx2ait build of each model with the profile cache as
#      it is (the fallback build, and the final one when the cache is already warm), and
#      `onnx2ait profile --build-only` when onnx2ait has that option.
#   4. Barrier: wait until every torch.compile job is ready (or failed). A job still compiling
#      when the time left is only what the timing phase needs is stopped and reported.
#   5. From here one thing at a time on the GPU, nothing else running: each torch.compile job is
#      told to time (go file) and exits; `onnx2ait profile` of each model times its candidates
#      (the GPU is free of autotuning now); then per model: a rebuild if the profile cache changed
#      since its build, validate at batch 1 and 8, onnx2ait bench (with --kernels when this onnx2ait
#      has it: the per-kernel times of BENCHMARKS.md's "Where the time goes"), PyTorch eager +
#      CUDA graph.
#   6. results.json, BENCHMARKS.md (the schedule is in it, with what overlapped what).
#   What overlaps: the torch.compile jobs' compile + autotuning with each other (their autotuning
#   benchmarks share the GPU) and with the exports and nvcc builds (the CPUs). No timing of a
#   reported figure, and no onnx2ait profiling, overlaps anything. Without torch.compile jobs
#   (--no-torch-compile) there is no background work: export, profile, build, then the timing.
#
# Expected wall time on a fresh H200: ~250-450 s, most of it the torch.compile autotuning (~4 min
# per ResNet-50 shape alone; four at once take longer). The caches live in $GPU_BENCH_WORK
# (default out/gpu-bench, git-ignored): the inductor cache (TORCHINDUCTOR_CACHE_DIR), the onnx2ait
# object cache (ONNX2AIT_CACHE_DIR) and the profile cache, so a second call on the same warm
# machine is much faster. A cold profile cache (hundreds of candidate instances to build) may not
# fit next to torch.compile in one call: run `--no-torch-compile` once to fill it, copy the
# returned profile_cache.json to .gpu/, then the full run (it reads .gpu/profile_cache.json).
#
# Prepare first on the CPU machine with scripts/gpu-prepare.sh (binary, CUTLASS, .gpu/COMMIT).
# Results go to $OUT (the device tool sets it; by hand ./gpu-out): gpu-bench.log, results.json,
# BENCHMARKS.md, profile_cache.json, logs.tar.gz. Settings from the environment: GPU_BENCH_PYTHON
# (default python3), GPU_BENCH_BIN (default .gpu/bin/onnx2ait, else target/release/onnx2ait),
# GPU_BENCH_WORK, CUTLASS_DIR, ORT_DYLIB_PATH, ONNX2AIT_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR,
# GPU_BENCH_TC_ESTIMATE (seconds one torch.compile job is expected to need: a job is launched only
# when that fits before the timing phase; default 330 cold, 120 with this machine's inductor cache).
# Exit status: 0 every planned figure was measured and validation passed; 1 a required step
# failed (export, build, validation, onnx2ait bench, PyTorch bench); 3 some figures are missing
# (time budget, a torch.compile or profiler failure): BENCHMARKS.md says which and why.
set -euo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."
ROOT=$PWD
CMDLINE="scripts/gpu-bench.sh${*:+ $*}"

BUDGET=560 MODELS=resnet50,mobilenet_v2 BATCHES=1,8,64,256 TC_BATCHES=1,256 TC=1 TC_PARALLEL=0 TC_THREADS=""
PROFILE=1 PDL_OFF_TOO=0 PROFILE_SEED="" ARCH=sm_90a MAX_BATCH=256 ITERS=50 WARMUP=10 SEEDS=2 VALIDATE_BATCHES=1,8
TC_MODE=max-autotune
die() { echo "gpu-bench.sh: error: $*" >&2; exit 2; }
while (($#)); do
  case $1 in
    --budget) BUDGET=${2:?--budget needs seconds}; shift ;;
    --models) MODELS=${2:?--models needs names}; shift ;;
    --batches) BATCHES=${2:?--batches needs sizes}; shift ;;
    --compile-batches) TC_BATCHES=${2:?--compile-batches needs sizes}; shift ;;
    --no-torch-compile) TC=0 ;;
    --tc-parallel) TC_PARALLEL=${2:?--tc-parallel needs a count}; shift ;;
    --tc-threads) TC_THREADS=${2:?--tc-threads needs a count}; shift ;;
    --no-profile) PROFILE=0 ;;
    --pdl-off-too) PDL_OFF_TOO=1 ;;
    --profile-cache) PROFILE_SEED=${2:?--profile-cache needs a file}; shift ;;
    --arch) ARCH=${2:?--arch needs a name such as sm_90a}; shift ;;
    --max-batch) MAX_BATCH=${2:?--max-batch needs a size}; shift ;;
    --iters) ITERS=${2:?--iters needs a count}; shift ;;
    --warmup) WARMUP=${2:?--warmup needs a count}; shift ;;
    --seeds) SEEDS=${2:?--seeds needs a count}; shift ;;
    --validate-batches) VALIDATE_BATCHES=${2:?--validate-batches needs a list}; shift ;;
    -h | --help) sed -n '3,/^set -euo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
  shift
done
for n in "$BUDGET" "$MAX_BATCH" "$ITERS" "$SEEDS"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || die "'$n' is not a positive integer"
done
[[ $WARMUP =~ ^[0-9]+$ ]] || die "--warmup '$WARMUP' is not a count"
[[ $TC_PARALLEL =~ ^[0-9]+$ ]] || die "--tc-parallel '$TC_PARALLEL' is not a count"
[[ -z $TC_THREADS || $TC_THREADS =~ ^[1-9][0-9]*$ ]] || die "--tc-threads '$TC_THREADS' is not a count"
[[ $MODELS =~ ^[a-z0-9_]+(,[a-z0-9_]+)*$ ]] || die "--models '$MODELS': names separated by commas"
for list in "$BATCHES" "$TC_BATCHES" "$VALIDATE_BATCHES"; do
  [[ $list =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "'$list' is not a list of batch sizes such as 1,8,64"
  for b in ${list//,/ }; do ((b <= MAX_BATCH)) || die "batch $b is above --max-batch $MAX_BATCH"; done
done
IFS=, read -r -a MODEL_LIST <<<"$MODELS"
IFS=, read -r -a TC_BATCH_LIST <<<"$TC_BATCHES"
IFS=, read -r -a VALIDATE_BATCH_LIST <<<"$VALIDATE_BATCHES"
((SEEDS <= 8)) || die "--seeds: at most 8 (a quick gate; scripts/gpu-check.sh does the thorough validation)"

START=$(date +%s)
DEADLINE=$((START + BUDGET))
MAIN_PID=$$
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${GPU_BENCH_WORK:-out/gpu-bench}
mkdir -p "$WORK"
WORK=$(cd "$WORK" && pwd)
PARTS=$WORK/parts LOGS=$WORK/logs SYNC=$WORK/sync STATE=$WORK/state
STEPS=$WORK/steps.tsv TIMELINE=$WORK/timeline.tsv MISSING=$WORK/not_measured.tsv
rm -rf "$PARTS" "$LOGS" "$SYNC" "$STATE"
mkdir -p "$PARTS" "$LOGS" "$SYNC" "$STATE" "$WORK/models" "$WORK/build"
: >"$STEPS"
: >"$TIMELINE"
: >"$MISSING"
PY=${GPU_BENCH_PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

exec > >(tee "$OUT/gpu-bench.log") 2>&1
TEE_PID=$!

# --- settings ------------------------------------------------------------------------------
NPROC=$(nproc)
if [[ -n ${GPU_BENCH_BIN:-} ]]; then
  BIN=$GPU_BENCH_BIN
elif [[ -f .gpu/bin/onnx2ait ]]; then
  BIN=.gpu/bin/onnx2ait
  [[ -x $BIN ]] || chmod +x "$BIN" # in case the carried copy lost its mode
else
  BIN=target/release/onnx2ait
fi
export ONNX2AIT_CACHE_DIR=${ONNX2AIT_CACHE_DIR:-$WORK/cache}
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$WORK/inductor}
mkdir -p "$TORCHINDUCTOR_CACHE_DIR"
[[ -z $TC_THREADS ]] || export TORCHINDUCTOR_COMPILE_THREADS=$TC_THREADS
PCACHE=$WORK/profile_cache.json

# ONNX Runtime and CUTLASS (scripts/gpu/toolchain.sh).
# shellcheck source=scripts/gpu/toolchain.sh
source scripts/gpu/toolchain.sh
gpu_toolchain_env "$PY" "$ROOT" "$WORK"

# Seconds each later piece of work is expected to take (H200, the defaults above; measured in
# the issue-5 run: validate bs 1 ~4 s, onnx2ait bench ~3 s, PyTorch eager + graph ~15 s). They
# decide what still fits in the budget, never how anything is measured.
EST_TC_COLD=${GPU_BENCH_TC_ESTIMATE:-330} # torch.compile max-autotune of one shape, cold inductor cache, 4 at once
EST_TC_WARM=${GPU_BENCH_TC_ESTIMATE:-120} # the same with this machine's inductor cache from an earlier call
EST_TC_TIME=8      # timing one torch.compile process once it is ready
EST_VALIDATE=10    # onnx2ait validate at one batch, per model
EST_SENSITIVITY=45 # fp16_error.py on one model (PyTorch fp16 vs fp32, the validation bound)
EST_BENCH=10       # onnx2ait bench (--kernels: --iters more plain runs per batch), per model
EST_TORCH=20       # PyTorch eager + CUDA graph, per model
EST_COMPILE=45     # rebuild after profiling (the instances come from the object cache)
EST_PROFILE_MIN=30 # the least time worth giving `onnx2ait profile`
REPORT_RESERVE=15  # results.json, BENCHMARKS.md, archives
VBT=$((EST_VALIDATE * ${#VALIDATE_BATCH_LIST[@]} + EST_BENCH + EST_TORCH))
NMODELS=${#MODEL_LIST[@]}

# --- helpers -----------------------------------------------------------------------------------
now() { date +%s.%N; }
elapsed() { echo $(($(date +%s) - START)); }
say() { printf '[%s +%3ss] %s\n' "$(date -u +%H:%M:%S)" "$(elapsed)" "$*"; }
# Seconds left before the deadline minus $1 (never below 1).
left() { local l=$((DEADLINE - $(date +%s) - ${1:-0})); ((l > 1)) && echo "$l" || echo 1; }
# Seconds left before the deadline minus $1, possibly negative.
spare() { echo $((DEADLINE - $(date +%s) - ${1:-0})); }
offset() { awk -v a="$1" -v s="$START" 'BEGIN { printf "%.1f", a - s }'; }
# timeline START_EPOCH END_EPOCH LANE GPU WHAT: one interval of the schedule table.
timeline() { printf '%s\t%s\t%s\t%s\t%s\n' "$(offset "$1")" "$(offset "$2")" "$3" "$4" "$5" >>"$TIMELINE"; }
# missing WHAT WHY: a figure that was planned and not measured.
missing() { printf '%s\t%s\n' "$1" "$2" >>"$MISSING"; say "not measured: $1 ($2)"; }
# json_get FILE PYTHON-EXPRESSION-IN-d: prints the value ('' when the file or key is absent).
json_get() {
  "$PY" - "$1" "$2" <<'EOF' 2>/dev/null || true
import json, sys
try:
    with open(sys.argv[1]) as f:
        d = json.load(f)
    v = eval(sys.argv[2], {"d": d})
except Exception:
    v = None
print("" if v is None else (json.dumps(v) if isinstance(v, (dict, list)) else v))
EOF
}

# --- step runner -----------------------------------------------------------------------------
# run_step NAME required|optional GPU FUNCTION [ARGS]: runs FUNCTION in a subshell with `set -e`
# working, times it, records it in $STEPS and the timeline (GPU says how it used the GPU). A
# function exits 77 to say "skipped"; it may write a one-line note to $STATE/note.
declare -A RESULT=()
FAILED_REQUIRED=()
FAILED_OPTIONAL=()
run_step() {
  local name=$1 req=$2 gpu=$3 fn=$4 t0 t1 rc status note=""
  shift 4
  echo
  say "=== [$name] ($(left) s of the budget left)"
  rm -f "$STATE/note"
  t0=$(now)
  set +e
  (
    set -e
    "$fn" "$@"
  )
  rc=$?
  set -e
  t1=$(now)
  if [[ -f $STATE/note ]]; then note=$(head -c 300 "$STATE/note" | tr '\t\n' '  ' | sed 's/ *$//'); fi
  case $rc in
    0) status=ok ;;
    77) status=skipped ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  RESULT[$name]=$status
  if [[ $status == FAILED* ]]; then
    if [[ $req == required ]]; then FAILED_REQUIRED+=("$name"); else FAILED_OPTIONAL+=("$name"); fi
  fi
  printf '%s\t%s\t%.1f\t%s\t%s\n' "$name" "$status" "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" "$req" "$note" >>"$STEPS"
  [[ $status == skipped ]] || timeline "$t0" "$t1" main "$gpu" "$name"
  say "=== [$name] $status${note:+: ${note:0:160}}"
}
ok() { [[ ${RESULT[$1]:-} == ok ]]; }
skip() { echo "$*" >"$STATE/note"; echo "skipped: $*"; exit 77; }
note() { echo "$*" >"$STATE/note"; }
# noted RECORD.json COMMAND...: runs COMMAND, then notes the one-line summary of RECORD.json.
noted() {
  local rec=$1 rc=0
  shift
  "$@" || rc=$?
  note "$("$PY" scripts/gpu/checks.py note "$rec" 2>/dev/null || true)"
  return "$rc"
}
# watched LABEL LOG TIMEOUT COMMAND...: runs COMMAND (stdout and stderr to LOG) under `timeout`,
# printing the last line of LOG every 20 s; returns its exit status (124 on timeout).
watched() {
  local label=$1 log=$2 limit=$3 pid rc=0 t0 last
  shift 3
  t0=$(date +%s)
  timeout -k 10 "$limit" "$@" >"$log" 2>&1 &
  pid=$!
  last=$t0
  while kill -0 "$pid" 2>/dev/null; do
    sleep 1
    if (($(date +%s) - last >= 20)); then
      last=$(date +%s)
      say "$label: running $((last - t0)) s: $(tail -c 600 "$log" 2>/dev/null | tr '\r' '\n' | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c1-160)"
    fi
  done
  wait "$pid" || rc=$?
  return "$rc"
}
model_path() { echo "$WORK/models/$1.onnx"; }
pcache_sum() { if [[ -f $PCACHE ]]; then cksum <"$PCACHE"; else echo none; fi; }

# --- what this onnx2ait can do (probed once, in the main shell) --------------------------------
HAVE_PROFILE=0 PROFILE_SPLIT=0 PROFILE_JSON=0 PROFILE_ARCH=0 COMPILE_PCACHE=0 PROFILE_NOTE="" BENCH_KERNELS=0
probe_cli() {
  local help
  if help=$("$BIN" bench --help 2>&1) && [[ $help == *"Usage: onnx2ait bench"* && $help == *--kernels* ]]; then
    BENCH_KERNELS=1
  fi
  say "per-kernel times: $( ((BENCH_KERNELS)) && echo "onnx2ait bench --kernels" || echo "none (this onnx2ait's bench has no --kernels)")"
  if ((!PROFILE)); then
    PROFILE_NOTE="--no-profile"
  elif help=$("$BIN" profile --help 2>&1) && [[ $help == *"Usage: onnx2ait profile"* ]]; then
    # (The usage line, not the exit status: without a profile command, clap takes "profile" for
    # the MODEL argument and prints the top-level help with exit status 0.)
    HAVE_PROFILE=1
    [[ $help == *--build-only* ]] && PROFILE_SPLIT=1
    [[ $help == *--json* ]] && PROFILE_JSON=1
    [[ $help == *--arch* ]] && PROFILE_ARCH=1
    PROFILE_NOTE="onnx2ait profile$( ((PROFILE_SPLIT)) && echo ' with --build-only' || echo ' without --build-only (its build cannot overlap torch.compile)')"
  else
    PROFILE_NOTE="this onnx2ait has no 'profile' command: kernels chosen by its heuristic"
  fi
  if help=$("$BIN" compile --help 2>&1) && [[ $help == *"Usage: onnx2ait compile"* && $help == *--profile-cache* ]]; then
    COMPILE_PCACHE=1
  elif ((HAVE_PROFILE)); then
    PROFILE_NOTE="$PROFILE_NOTE; 'onnx2ait compile' has no --profile-cache option, so the builds cannot use the profile"
  fi
  say "profiling: $PROFILE_NOTE"
}

# The compile arguments: the profile cache only when compile takes it and it exists.
compile_args() {
  local args=(--arch "$ARCH" --max-batch "$MAX_BATCH")
  if ((COMPILE_PCACHE)) && [[ -f $PCACHE ]]; then args+=(--profile-cache "$PCACHE"); fi
  printf '%s\n' "${args[@]}"
}

# --- torch.compile jobs ------------------------------------------------------------------------
# Files in $SYNC per job ID (model_bB): ID.pid, ID.started, ID.ready (by the job), ID.go (by the
# timing step), ID.killed / ID.skipped (why, by this script); `stop` ends every waiting job;
# `no-more` stops the launcher.
TC_IDS=()
declare -A TC_MODEL=() TC_BATCH=()
if ((TC)); then
  for m in "${MODEL_LIST[@]}"; do
    for b in "${TC_BATCH_LIST[@]}"; do
      id="${m}_b${b}"
      TC_IDS+=("$id")
      TC_MODEL[$id]=$m
      TC_BATCH[$id]=$b
    done
  done
fi
if ((TC_PARALLEL == 0)); then
  TC_PARALLEL=${#TC_IDS[@]}
  ((TC_PARALLEL <= 4)) || TC_PARALLEL=4
fi

tc_pid() { cat "$SYNC/$1.pid" 2>/dev/null || true; }
tc_alive() {
  local pid
  pid=$(tc_pid "$1")
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null
}
# queued | compiling | ready | done | failed | killed | skipped
tc_state() {
  local id=$1
  if [[ -f $SYNC/$id.skipped ]]; then
    echo skipped
  elif [[ ! -f $SYNC/$id.pid ]]; then
    echo queued
  elif tc_alive "$id"; then
    if [[ -f $SYNC/$id.ready ]]; then echo ready; else echo compiling; fi
  elif [[ -f $SYNC/$id.killed ]]; then
    echo killed
  elif [[ -n $(json_get "$PARTS/torch_compile_$id.json" 'd["results"] or None') ]]; then
    echo "done"
  else
    echo failed
  fi
}
tc_count() { # tc_count STATE...: how many jobs are in one of these states
  local id s n=0
  for id in "${TC_IDS[@]}"; do
    s=$(tc_state "$id")
    for want in "$@"; do [[ $s == "$want" ]] && n=$((n + 1)); done
  done
  echo "$n"
}
tc_estimate() { if [[ -f $TORCHINDUCTOR_CACHE_DIR/.o2a-warm-$1 ]]; then echo "$EST_TC_WARM"; else echo "$EST_TC_COLD"; fi; }
# Seconds the timing phase needs after the barrier (every figure but the profile's).
timing_reserve() {
  local n
  n=$(tc_count queued compiling ready)
  echo $((n * EST_TC_TIME + NMODELS * VBT + REPORT_RESERVE))
}
tc_kill() { # tc_kill ID WHY
  local pid
  pid=$(tc_pid "$1")
  echo "$2" >"$SYNC/$1.killed"
  [[ -n $pid ]] || return 0
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in 1 2 3 4 5; do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
}
tc_start() {
  local id=$1 m=${TC_MODEL[$1]} b=${TC_BATCH[$1]} pid
  "$PY" scripts/gpu/bench_torch.py --model "$m" --batch "$b" --compile "$TC_MODE" \
    --warmup "$WARMUP" --iters "$ITERS" \
    --ready-file "$SYNC/$id.ready" --go-file "$SYNC/$id.go" --stop-file "$SYNC/stop" \
    --parent-pid "$MAIN_PID" --wait-timeout "$((DEADLINE - $(date +%s) + 30))" \
    --log "$LOGS/torch_compile_$id.log" --tag "torch.compile $m bs $b" \
    --json-out "$PARTS/torch_compile_$id.json" </dev/null &
  pid=$!
  echo "$pid" >"$SYNC/$id.pid"
  now >"$SYNC/$id.started"
  say "launched torch.compile(mode=\"$TC_MODE\") of $m at batch $b (pid $pid, log $LOGS/torch_compile_$id.log)"
}
# Runs in the background: starts the jobs, at most TC_PARALLEL compiling at a time, while the
# budget says a compile can still finish before the timing phase must begin.
tc_launcher() {
  set +e
  local id need avail
  for id in "${TC_IDS[@]}"; do
    while [[ ! -f $SYNC/no-more ]] && (($(tc_count compiling) >= TC_PARALLEL)); do sleep 2; done
    if [[ -f $SYNC/no-more ]]; then
      echo "time budget: the timing phase had begun" >"$SYNC/$id.skipped"
      continue
    fi
    need=$(tc_estimate "$id")
    avail=$(spare "$(timing_reserve)")
    if ((avail < need)); then
      echo "time budget: ~$need s of compile needed, $avail s left before the timing phase" >"$SYNC/$id.skipped"
      say "not launching torch.compile $id: $(cat "$SYNC/$id.skipped")"
      continue
    fi
    tc_start "$id"
  done
  wait
}

cleanup() {
  touch "$SYNC/stop" "$SYNC/no-more" 2>/dev/null || true
  local id
  for id in "${TC_IDS[@]}"; do
    if tc_alive "$id"; then tc_kill "$id" "the script ended"; fi
  done
  if [[ -n ${LAUNCHER_PID:-} ]]; then kill "$LAUNCHER_PID" 2>/dev/null || true; fi
}
trap cleanup EXIT

# --- steps -------------------------------------------------------------------------------------
step_env() {
  echo "onnx2ait binary: $BIN; work folder: $WORK; out: $OUT; budget ${BUDGET} s; $NPROC CPUs"
  nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,temperature.gpu,power.draw \
    --format=csv || true
  "$PY" scripts/gpu/checks.py env --bin "$BIN" --commit-file .gpu/COMMIT --command "$CMDLINE" --out "$PARTS/env.json"
  [[ -n $ORT_DYLIB_PATH && -f $ORT_DYLIB_PATH ]] || { note "no libonnxruntime found (set ORT_DYLIB_PATH)"; exit 1; }
  [[ -n $CUTLASS_DIR && -d $CUTLASS_DIR/include/cutlass ]] ||
    { note "no CUTLASS headers (run scripts/gpu-prepare.sh and carry .gpu, or set CUTLASS_DIR)"; exit 1; }
}

step_export() {
  local m pids=() rc=0 failed=() notes=()
  for m in "${MODEL_LIST[@]}"; do
    nice -n 10 timeout -k 10 "$(left 60)" "$PY" scripts/gpu/export_torchvision.py "$m" "$(model_path "$m")" \
      --opset 17 --max-ir-version 10 --meta-out "$PARTS/export_$m.json" >"$LOGS/export_$m.log" 2>&1 &
    pids+=("$!")
  done
  local i=0
  for m in "${MODEL_LIST[@]}"; do
    wait "${pids[$i]}" || { rc=1; failed+=("$m"); }
    i=$((i + 1))
    tail -n 3 "$LOGS/export_$m.log" | sed "s/^/    [$m] /"
    notes+=("$m: $("$PY" scripts/gpu/checks.py note "$PARTS/export_$m.json" 2>/dev/null || echo 'no record')")
  done
  note "$(IFS=';'; echo "${notes[*]}")"
  ((rc == 0)) || { echo "export failed: ${failed[*]}"; exit 1; }
}
exported() { [[ $(json_get "$PARTS/export_$1.json" 'd.get("ok")') == True ]]; }

# The build made while torch.compile autotunes: the profile cache as it is (heuristic where empty).
step_build_pre() {
  local m=$1 args
  exported "$m" || skip "no export of $m"
  mapfile -t args < <(compile_args)
  local limit
  limit=$(spare "$(timing_reserve)")
  ((limit > 30)) || skip "time budget (the timing phase needs the rest)"
  pcache_sum >"$STATE/pre_$m.cache"
  noted "$PARTS/compile_pre_$m.json" nice -n 10 \
    "$PY" scripts/gpu/checks.py compile --bin "$BIN" --model "$(model_path "$m")" --out-dir "$WORK/build/$m-pre" \
    --label "pre $m" --timeout "$limit" --json "$PARTS/compile_pre_$m.json" -- "${args[@]}"
}

# profile_run MODE MODEL LIMIT: `onnx2ait profile` (MODE build-only: niced, no GPU; or full) and
# its record in $PARTS/profile[_build]_MODEL.json.
profile_run() {
  local mode=$1 m=$2 limit=$3 cmd before after rc=0 t0 t1 tag=profile
  cmd=()
  [[ $mode == build-only ]] && cmd=(nice -n 10)
  cmd+=("$BIN" profile "$(model_path "$m")" --max-batch "$MAX_BATCH" --cache "$PCACHE")
  ((PROFILE_ARCH)) && cmd+=(--arch "$ARCH")
  if [[ $mode == build-only ]]; then
    cmd+=(--build-only)
    tag=profile_build
  fi
  before=$(pcache_sum)
  t0=$(now)
  if [[ $mode == full ]] && ((PROFILE_JSON)); then
    cmd+=(--json)
    # stdout is the JSON report, stderr the progress.
    # shellcheck disable=SC2016 # $@ and $0 belong to the inner shell
    watched "profile $m" "$LOGS/${tag}_$m.log" "$limit" bash -c '"$@" >"$0"' "$LOGS/${tag}_$m.stdout" "${cmd[@]}" || rc=$?
  else
    watched "profile $m" "$LOGS/${tag}_$m.log" "$limit" "${cmd[@]}" || rc=$?
  fi
  t1=$(now)
  after=$(pcache_sum)
  tail -n 5 "$LOGS/${tag}_$m.log" | sed 's/^/    /'
  "$PY" - "$PARTS/${tag}_$m.json" "$mode" "$rc" "$t0" "$t1" "$before" "$after" "$LOGS/${tag}_$m.log" \
    "$LOGS/${tag}_$m.stdout" "$m" "${cmd[@]}" <<'EOF'
import json, os, sys
out, mode, rc, t0, t1, before, after, log, stdout, model = sys.argv[1:11]
cmd = sys.argv[11:]
rc = int(rc)
def tail(path, n):
    try:
        with open(path, errors="replace") as f:
            lines = [l.rstrip() for l in f.read().replace("\r", "\n").splitlines() if l.strip()]
    except OSError:
        return []
    return lines[-n:]
report = None
if os.path.isfile(stdout):
    with open(stdout, errors="replace") as f:
        text = f.read().strip()
    try:
        report = json.loads(text) if text else None
    except ValueError:
        i, j = text.find("{"), text.rfind("}")
        try:
            report = json.loads(text[i:j + 1]) if 0 <= i < j else None
        except ValueError:
            report = None
lines = tail(log, 25)
errs = [l for l in lines if l.startswith("error")]
doc = {"model": model, "mode": mode, "command": cmd, "rc": rc, "seconds": round(float(t1) - float(t0), 2),
       "timed_out": rc in (124, 137), "cache_before": before, "cache_after": after,
       "cache_changed": before != after, "report": report, "log_tail": lines}
if rc != 0:
    doc["error"] = ("timed out (time budget)" if rc in (124, 137) else (errs[-1] if errs else (lines[-1] if lines else f"exit {rc}")))
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
EOF
  local msg
  msg="$mode: exit $rc, $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.0f", b - a }') s, profile cache $([[ $before == "$after" ]] && echo unchanged || echo updated)"
  note "$msg"
  return "$rc"
}

step_profile_build() {
  local m=$1 limit
  exported "$m" || skip "no export of $m"
  limit=$(spare "$(timing_reserve)")
  ((limit > EST_PROFILE_MIN)) || skip "time budget"
  profile_run build-only "$m" "$limit"
}

# profile_reserve I: seconds the work after the profile of model I needs.
profile_reserve() { echo $((NMODELS * (VBT + EST_COMPILE) + REPORT_RESERVE)); }

step_profile() {
  local m=$1 limit
  ((HAVE_PROFILE)) || skip "$PROFILE_NOTE"
  exported "$m" || skip "no export of $m"
  limit=$(spare "$(profile_reserve)")
  ((limit >= EST_PROFILE_MIN)) || {
    missing "onnx2ait profile of $m" "time budget: $((limit > 0 ? limit : 0)) s were left for it, $EST_PROFILE_MIN s at least are needed"
    skip "time budget"
  }
  profile_run full "$m" "$limit"
}

# profiled_kind LOG WHAT: the kind of a build compiled with a profile cache, from its compile log
# (LOG): compile's summary says how many node choices had profiled times, and a profile the time
# budget stopped leaves the rest to the heuristic: such a build is "partly profiled".
profiled_kind() {
  local measured
  measured=$(grep -o '[0-9]* of [0-9]* node choices measured' "$1" 2>/dev/null | tail -n 1)
  if [[ -n $measured ]] && [[ ${measured%% of *} != "$(awk '{print $3}' <<<"$measured")" ]]; then
    echo "partly profiled kernels ($2: $measured, the heuristic chose the rest)"
  else
    echo "profiled kernels ($2${measured:+; $measured})"
  fi
}

# The build that is benchmarked: the pre build when the profile cache did not change since it,
# else a build with the (new) profile cache; the pre build again when that fails or does not fit.
step_build_final() {
  local m=$1 args pre_ok=0 limit
  exported "$m" || skip "no export of $m"
  [[ -f $WORK/build/$m-pre/libmodel.so ]] && ok "build $m (during torch.compile)" && pre_ok=1
  if ((pre_ok)) && [[ $(pcache_sum) == $(cat "$STATE/pre_$m.cache" 2>/dev/null) ]]; then
    echo "$WORK/build/$m-pre" >"$STATE/final_$m"
    if ((COMPILE_PCACHE)) && [[ -f $PCACHE ]]; then
      profiled_kind "$WORK/build/$m-pre.compile.log" "profile cache, unchanged during this run" >"$STATE/final_kind_$m"
    else
      echo "heuristic kernels (no profile cache)" >"$STATE/final_kind_$m"
    fi
    note "reusing the build made during torch.compile (no change of the profile cache since)"
    exit 0
  fi
  # Every figure of the model needs a build: it may take all the time but its own validation and
  # bench (later models and the PyTorch peers come after it).
  limit=$(spare $((EST_VALIDATE + EST_BENCH + REPORT_RESERVE)))
  if ((limit < EST_COMPILE)); then
    if ((pre_ok)); then
      echo "$WORK/build/$m-pre" >"$STATE/final_$m"
      echo "the build made during torch.compile (no time to rebuild with the new profile)" >"$STATE/final_kind_$m"
      missing "onnx2ait $m build with the updated profile cache" "time budget: the earlier build is benchmarked"
      note "no time to rebuild: the build made during torch.compile is benchmarked"
      exit 0
    fi
    ((limit > 20)) || skip "time budget"
  fi
  mapfile -t args < <(compile_args)
  local rc=0
  noted "$PARTS/compile_$m.json" \
    "$PY" scripts/gpu/checks.py compile --bin "$BIN" --model "$(model_path "$m")" --out-dir "$WORK/build/$m" \
    --label "$m" --timeout "$limit" --json "$PARTS/compile_$m.json" -- "${args[@]}" || rc=$?
  if ((rc == 0)); then
    echo "$WORK/build/$m" >"$STATE/final_$m"
    if ((COMPILE_PCACHE)) && [[ -f $PCACHE ]]; then
      profiled_kind "$WORK/build/$m.compile.log" "profile cache of this run" >"$STATE/final_kind_$m"
    else
      echo "heuristic kernels (no profile cache)" >"$STATE/final_kind_$m"
    fi
  elif ((pre_ok)); then
    echo "$WORK/build/$m-pre" >"$STATE/final_$m"
    echo "the build made during torch.compile (the rebuild with the new profile failed)" >"$STATE/final_kind_$m"
    note "rebuild failed: $(json_get "$PARTS/compile_$m.json" 'd.get("error")'); the earlier build is benchmarked"
    rc=0
  fi
  return "$rc"
}
final_dir() { cat "$STATE/final_$1" 2>/dev/null || true; }

step_wait_tc() {
  ((${#TC_IDS[@]})) || skip "no torch.compile jobs"
  local id st last=0 active parts until_cut t
  while :; do
    active=0
    parts=()
    for id in "${TC_IDS[@]}"; do
      st=$(tc_state "$id")
      case $st in
        queued) active=$((active + 1)); parts+=("$id queued") ;;
        compiling) active=$((active + 1)); parts+=("$id compiling $(awk -v s="$(cat "$SYNC/$id.started")" -v n="$(now)" 'BEGIN { printf "%.0f", n - s }') s") ;;
        *) parts+=("$id $st") ;;
      esac
    done
    ((active == 0)) && break
    until_cut=$(spare "$(timing_reserve)")
    if ((until_cut <= 0)); then
      touch "$SYNC/no-more"
      for id in "${TC_IDS[@]}"; do
        st=$(tc_state "$id")
        if [[ $st == compiling ]]; then
          say "stopping torch.compile $id: still compiling when the timing phase must begin"
          tc_kill "$id" "time budget: compile + autotune did not finish within $(awk -v s="$(cat "$SYNC/$id.started")" -v n="$(now)" 'BEGIN { printf "%.0f", n - s }') s"
        elif [[ $st == queued ]]; then
          echo "time budget: not started" >"$SYNC/$id.skipped"
        fi
      done
      break
    fi
    if (($(date +%s) - last >= 30)); then
      last=$(date +%s)
      say "waiting for torch.compile: $(IFS=';'; echo "${parts[*]}"); load $(cut -d' ' -f1 /proc/loadavg); the timing phase begins in at most $until_cut s"
    fi
    sleep 2
  done
  touch "$SYNC/no-more"
  # The compile intervals of the schedule table, and the warm-cache markers.
  local summary=()
  for id in "${TC_IDS[@]}"; do
    st=$(tc_state "$id")
    summary+=("$id $st")
    [[ -f $SYNC/$id.started ]] || continue
    if [[ $st == ready ]]; then
      t=$(json_get "$SYNC/$id.ready" 'd["ready_at"]')
      touch "$TORCHINDUCTOR_CACHE_DIR/.o2a-warm-$id"
    else
      t=$(now)
    fi
    timeline "$(cat "$SYNC/$id.started")" "${t:-$(now)}" "torch.compile ${TC_MODEL[$id]} bs ${TC_BATCH[$id]}" autotune "compile + autotune + warm-up ($st)"
  done
  note "$(IFS=';'; echo "${summary[*]}")"
}

step_time_tc() {
  local id=$1 st pid t0 why
  st=$(tc_state "$id")
  if [[ $st != ready ]]; then
    case $st in
      skipped) why=$(cat "$SYNC/$id.skipped") ;;
      killed) why=$(cat "$SYNC/$id.killed") ;;
      *) why="torch.compile $st: $(json_get "$PARTS/torch_compile_$id.json" 'd.get("error")')" ;;
    esac
    missing "torch.compile ${TC_MODEL[$id]} bs ${TC_BATCH[$id]}" "$why"
    skip "$why"
  fi
  (($(spare "$REPORT_RESERVE") >= EST_TC_TIME)) || {
    tc_kill "$id" "time budget: no time left to time it"
    missing "torch.compile ${TC_MODEL[$id]} bs ${TC_BATCH[$id]}" "time budget (compiled, not timed)"
    skip "time budget"
  }
  pid=$(tc_pid "$id")
  t0=$(date +%s)
  touch "$SYNC/$id.go"
  while kill -0 "$pid" 2>/dev/null; do
    sleep 0.2
    if (($(date +%s) - t0 > 120 || $(spare 5) <= 0)); then
      tc_kill "$id" "timing did not finish"
      note "timing did not finish in $(($(date +%s) - t0)) s"
      exit 1
    fi
  done
  note "$(json_get "$PARTS/torch_compile_$id.json" 'd.get("note")')"
  [[ -n $(json_get "$PARTS/torch_compile_$id.json" 'd["results"] or None') ]]
}

step_validate() {
  local m=$1 build b part rc=0
  build=$(final_dir "$m")
  [[ -n $build ]] || { missing "onnx2ait $m validation" "no build"; skip "no build"; }
  (($(spare "$REPORT_RESERVE") >= EST_VALIDATE)) || { missing "onnx2ait $m validation" "time budget"; skip "time budget"; }
  # The network's own fp16 error (PyTorch fp16 vs fp32 on the export's weights) widens the bound
  # where it exceeds 1e-2 / 1.5: a calibrated random network amplifies rounding far beyond a
  # trained one, and no fp16 engine can beat that. Without the measurement the bound is 1e-2.
  local sens=$WORK/fp16_error_$m.json sens_args=()
  rm -f "$sens"
  if (($(spare "$REPORT_RESERVE") >= EST_VALIDATE + EST_SENSITIVITY)) &&
    timeout -k 5 "$EST_SENSITIVITY" "$PY" scripts/gpu/fp16_error.py --models "$m" --weights auto --seeds "$SEEDS" \
      --json-out "$sens" >"$LOGS/fp16_error_$m.log" 2>&1; then
    sens_args=(--sensitivity "$sens")
  else
    say "validate $m: no fp16 sensitivity measurement (see logs/fp16_error_$m.log); bound 1e-2"
  fi
  # One record per batch: validate_<model> for the first batch, validate_<model>_b<B> for the others.
  for b in "${VALIDATE_BATCH_LIST[@]}"; do
    part=$PARTS/validate_$m.json
    [[ $b == "${VALIDATE_BATCH_LIST[0]}" ]] || part=$PARTS/validate_${m}_b$b.json
    if (($(spare "$REPORT_RESERVE") < EST_VALIDATE)); then
      missing "onnx2ait $m validation at batch $b" "time budget"
      continue
    fi
    noted "$part" \
      "$PY" scripts/gpu/checks.py validate --bin "$BIN" --model "$(model_path "$m")" --build "$build" --batch "$b" \
      --seeds "0-$((SEEDS - 1))" --jobs "$SEEDS" --timeout 120 --deadline "$((DEADLINE - REPORT_RESERVE))" \
      --max-err 1e-2 "${sens_args[@]}" --min-top1 1.0 --json "$part" || rc=1
  done
  return "$rc"
}

step_bench_onnx2ait() {
  local m=$1 build rc=0 extra=()
  build=$(final_dir "$m")
  [[ -n $build ]] || { missing "onnx2ait $m latency" "no build"; skip "no build"; }
  (($(spare "$REPORT_RESERVE") >= EST_BENCH)) || { missing "onnx2ait $m latency" "time budget"; skip "time budget"; }
  # Per-kernel times (each batch's row keeps its "kernels" list) when this onnx2ait has them.
  if ((BENCH_KERNELS)); then extra=(-- --kernels); fi
  noted "$PARTS/bench_onnx2ait_$m.json" \
    "$PY" scripts/gpu/checks.py bench --bin "$BIN" --build "$build" --batch "$BATCHES" --iters "$ITERS" \
    --warmup "$WARMUP" --timeout 180 --deadline "$((DEADLINE - REPORT_RESERVE))" --json "$PARTS/bench_onnx2ait_$m.json" \
    "${extra[@]}" || rc=$?
  # The same library with programmatic dependent launch off (templates/cuda/library.cuh.hbs).
  if ((PDL_OFF_TOO)); then
    O2A_PDL=0 "$PY" scripts/gpu/checks.py bench --bin "$BIN" --build "$build" --batch "$BATCHES" --iters "$ITERS" \
      --warmup "$WARMUP" --timeout 180 --deadline "$((DEADLINE - REPORT_RESERVE))" \
      --json "$PARTS/bench_onnx2ait_pdl_off_$m.json" || rc=$?
  fi
  return "$rc"
}

step_bench_torch() {
  local m=$1 i=$2 extra=() rc=0
  (($(spare "$REPORT_RESERVE") >= EST_TORCH)) || { missing "PyTorch eager / CUDA graph $m" "time budget"; skip "time budget"; }
  # The first model's run also measures the ceilings BENCHMARKS.md compares kernels with: the
  # fp16 GEMM rate (kernel sweep, per-kernel TFLOP/s) and the device copy rate (per-kernel GB/s).
  ((i == 0)) && extra=(--gemm-ceiling --copy-ceiling)
  timeout -k 10 "$(left "$REPORT_RESERVE")" "$PY" scripts/gpu/bench_torch.py --model "$m" --batch "$BATCHES" \
    --warmup "$WARMUP" --iters "$ITERS" "${extra[@]}" --json-out "$PARTS/bench_torch_$m.json" || rc=$?
  note "$(json_get "$PARTS/bench_torch_$m.json" 'd.get("note")')"
  return "$rc"
}

write_plan() {
  P_CMDLINE=$CMDLINE P_START=$START P_BUDGET=$BUDGET P_MODELS=$MODELS P_BATCHES=$BATCHES \
    P_TC_BATCHES=$TC_BATCHES P_TC=$TC P_TC_MODE=$TC_MODE P_TC_PARALLEL=$TC_PARALLEL P_TC_THREADS=${TC_THREADS:-} \
    P_TC_IDS="${TC_IDS[*]}" P_ARCH=$ARCH P_MAX_BATCH=$MAX_BATCH P_ITERS=$ITERS P_WARMUP=$WARMUP P_SEEDS=$SEEDS \
    P_NPROC=$NPROC P_HAVE_PROFILE=$HAVE_PROFILE P_PROFILE_SPLIT=$PROFILE_SPLIT P_PROFILE_JSON=$PROFILE_JSON \
    P_COMPILE_PCACHE=$COMPILE_PCACHE P_PROFILE_NOTE=$PROFILE_NOTE P_PCACHE_SEEDED=${PCACHE_SEEDED:-} \
    "$PY" - "$PARTS/plan.json" <<'EOF'
import json, os, sys
e = os.environ
ints = lambda k: [int(x) for x in e[k].split(",") if x]
doc = {
    "script": "gpu-bench",
    "command": e["P_CMDLINE"],
    "started_epoch": int(e["P_START"]),
    "budget_s": int(e["P_BUDGET"]),
    "models": e["P_MODELS"].split(","),
    "batches": ints("P_BATCHES"),
    "compile_batches": ints("P_TC_BATCHES") if e["P_TC"] == "1" else [],
    "torch_compile": {"enabled": e["P_TC"] == "1", "mode": e["P_TC_MODE"], "parallel": int(e["P_TC_PARALLEL"]),
                      "compile_threads": e["P_TC_THREADS"] or "torch's default", "jobs": e["P_TC_IDS"].split()},
    "arch": e["P_ARCH"], "max_batch": int(e["P_MAX_BATCH"]), "iters": int(e["P_ITERS"]),
    "warmup": int(e["P_WARMUP"]), "seeds": int(e["P_SEEDS"]), "cpus": int(e["P_NPROC"]),
    "profile": {"available": e["P_HAVE_PROFILE"] == "1", "build_only": e["P_PROFILE_SPLIT"] == "1",
                "json": e["P_PROFILE_JSON"] == "1", "compile_takes_cache": e["P_COMPILE_PCACHE"] == "1",
                "note": e["P_PROFILE_NOTE"], "seeded_from": e["P_PCACHE_SEEDED"] or None},
    "inductor_cache_dir": e.get("TORCHINDUCTOR_CACHE_DIR"),
    "onnx2ait_cache_dir": e.get("ONNX2AIT_CACHE_DIR"),
}
with open(sys.argv[1], "w") as f:
    json.dump(doc, f, indent=2)
EOF
}

report() {
  local overall=$1 prev=()
  "$PY" - "$TIMELINE" "$MISSING" "$PARTS" "$PCACHE" <<'EOF' || return 1
import json, os, sys
timeline, missing, parts, pcache = sys.argv[1:5]
rows = []
for line in open(timeline):
    f = line.rstrip("\n").split("\t")
    if len(f) == 5:
        rows.append({"start": float(f[0]), "end": float(f[1]), "lane": f[2], "gpu": f[3], "what": f[4]})
rows.sort(key=lambda r: (r["start"], r["lane"]))
with open(os.path.join(parts, "timeline.json"), "w") as f:
    json.dump({"events": rows}, f, indent=2)
items = []
for line in open(missing):
    f = line.rstrip("\n").split("\t")
    if len(f) == 2:
        items.append({"what": f[0], "why": f[1]})
with open(os.path.join(parts, "not_measured.json"), "w") as f:
    json.dump({"items": items}, f, indent=2)
# The profile cache rides along when it is readable and not huge (the sweep table reads it).
if os.path.isfile(pcache) and os.path.getsize(pcache) < 8 << 20:
    try:
        with open(pcache) as f:
            cache = json.load(f)
        with open(os.path.join(parts, "profile_cache.json"), "w") as f:
            json.dump(cache, f)
    except (OSError, ValueError) as e:
        print(f"note: the profile cache {pcache} is not readable JSON ({e})")
EOF
  "$PY" scripts/gpu/checks.py collect --parts "$PARTS" --steps "$STEPS" --overall "$overall" \
    --out "$OUT/results.json" || return 1
  if [[ -f BENCHMARKS.md ]]; then prev=(--previous BENCHMARKS.md); fi
  "$PY" scripts/gpu/write_benchmarks.py --results "$OUT/results.json" --out "$OUT/BENCHMARKS.md" "${prev[@]}" \
    --print-section || return 1
  if [[ -f $PCACHE ]]; then cp "$PCACHE" "$OUT/profile_cache.json"; fi
  # Every log in one archive (the device tool returns at most 8 files); each file's last 4 MB.
  "$PY" - "$OUT/logs.tar.gz" "$LOGS" "$WORK/build" <<'EOF' || true
import io, os, sys, tarfile
out, logs, builds = sys.argv[1:4]
files = []
for root in (logs, builds):
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith((".log", ".stdout")) and d.count(os.sep) - root.count(os.sep) <= 1:
                files.append(os.path.join(d, n))
with tarfile.open(out, "w:gz") as t:
    for p in sorted(files):
        with open(p, "rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - (4 << 20)))
            data = f.read()
        info = tarfile.TarInfo(os.path.relpath(p, os.path.dirname(logs)))
        info.size = len(data)
        t.addfile(info, io.BytesIO(data))
EOF
}

# --- run ---------------------------------------------------------------------------------------
say "gpu-bench: $CMDLINE; started $(date -u '+%Y-%m-%d %H:%M:%S UTC'), budget ${BUDGET} s"
write_plan # (again below, once the probes ran; this one marks the results as gpu-bench's if the environment fails)
run_step environment required none step_env
if ! ok environment; then
  say "the environment is not usable: nothing else runs"
else
  probe_cli
  if [[ ! -f $PCACHE ]]; then
    seed=${PROFILE_SEED:-.gpu/profile_cache.json}
    if [[ -f $seed ]]; then
      cp "$seed" "$PCACHE"
      PCACHE_SEEDED=$seed
      say "profile cache seeded from $seed"
    elif [[ -n $PROFILE_SEED ]]; then
      say "warning: --profile-cache $PROFILE_SEED does not exist"
    fi
  fi
  write_plan

  # 2. torch.compile jobs in the background.
  if ((${#TC_IDS[@]})); then
    say "torch.compile jobs: ${TC_IDS[*]} (at most $TC_PARALLEL compiling at once; inductor cache $TORCHINDUCTOR_CACHE_DIR)"
    tc_launcher &
    LAUNCHER_PID=$!
    sleep 1
  else
    say "no torch.compile jobs (--no-torch-compile)"
  fi

  # 3. CPU work while they compile.
  run_step export required none step_export
  if ((${#TC_IDS[@]})); then
    for m in "${MODEL_LIST[@]}"; do
      run_step "build $m (during torch.compile)" optional none step_build_pre "$m"
    done
    if ((HAVE_PROFILE && PROFILE_SPLIT)); then
      for m in "${MODEL_LIST[@]}"; do
        run_step "profile build $m" optional none step_profile_build "$m"
      done
    fi
  fi

  # 4. Barrier.
  run_step "wait for torch.compile" optional none step_wait_tc

  # 5. One thing at a time on the GPU.
  for id in "${TC_IDS[@]}"; do
    run_step "time torch.compile ${TC_MODEL[$id]} bs ${TC_BATCH[$id]}" optional timing step_time_tc "$id"
  done
  for m in "${MODEL_LIST[@]}"; do
    run_step "profile $m" optional "profile timing" step_profile "$m"
  done
  # Per model, so that the first model's figures come first when time is short.
  i=0
  for m in "${MODEL_LIST[@]}"; do
    run_step "build $m" required none step_build_final "$m"
    run_step "validate $m" required brief step_validate "$m"
    run_step "bench onnx2ait $m" required timing step_bench_onnx2ait "$m"
    run_step "bench PyTorch $m" required timing step_bench_torch "$m" "$i"
    i=$((i + 1))
  done
fi
cleanup
for m in "${MODEL_LIST[@]}"; do
  kind=$(cat "$STATE/final_kind_$m" 2>/dev/null || echo none)
  printf '{"model": "%s", "kind": "%s", "dir": "%s"}\n' "$m" "$kind" "$(final_dir "$m")" >"$PARTS/final_$m.json"
done

echo
say "=== [report]"
if ((${#FAILED_REQUIRED[@]})); then
  overall=failed
elif ((${#FAILED_OPTIONAL[@]})) || [[ -s $MISSING ]]; then
  overall=incomplete
else
  overall=complete
fi
if ! report "$overall"; then
  FAILED_REQUIRED+=(report)
  overall=failed
  echo "error: writing results.json / BENCHMARKS.md failed"
fi

echo
say "=== steps (total $(elapsed) s of a ${BUDGET} s budget)"
printf '%-40s %-18s %8s  %-9s %s\n' step result seconds required note
while IFS=$'\t' read -r s st sec rq nt; do
  printf '%-40s %-18s %8s  %-9s %s\n' "${s:0:40}" "$st" "$sec" "$rq" "${nt:0:90}"
done <"$STEPS"
if [[ -s $MISSING ]]; then
  echo
  echo "not measured:"
  sed 's/\t/: /; s/^/  /' "$MISSING"
fi
echo
echo "files in $OUT: $(cd "$OUT" && find . -maxdepth 1 -type f -printf '%f ' | sort)"
case $overall in
  complete) echo "gpu-bench: every planned figure measured"; status=0 ;;
  incomplete) echo "gpu-bench: INCOMPLETE: some figures are missing (see above)"; status=3 ;;
  *) echo "gpu-bench: FAILED: ${FAILED_REQUIRED[*]}"; status=1 ;;
esac
trap - EXIT
# Let tee write the end of the log before the command returns.
exec >&- 2>&-
wait "$TEE_PID" 2>/dev/null || true
exit "$status"
