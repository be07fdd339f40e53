#!/usr/bin/env bash
# The transformer check of issue 14, in one command on the GPU machine (from the repository root):
# Hugging Face BertModel (bert-base shape) and torchvision vit_b_16 with random weights, exported
# by both PyTorch exporters (TorchScript-based, opset 17; torch.export-based, opset 18) with
# dynamic batch (and sequence) axes; each export compiled by onnx2ait (heuristic kernel choice,
# `--dim seq=SEQ` for the first exporter, `--dim seq=SEQ2`, a non-power-of-two length, for the
# others), validated against ONNX Runtime on the GPU at batch 1 and 8, and timed at every
# --batches next to PyTorch fp16 eager and CUDA graph (scripts/gpu/bench_transformers.py, at --seq)
# in the same run.
# Writes $OUT/BENCHMARKS.md: the repository's BENCHMARKS.md with this run's figures replacing those
# of the benchmarks it measured (scripts/gpu/bench_store.py).
#
#   scripts/gpu-transformers.sh [--seq 128] [--seq2 77] [--batches LIST] [--max-batch N]
#                               (default: each model at the batches of issue 14's benchmark, BERT
#                                                     1,8,32,128 and ViT 1,8,64, built up to its
#                                                     largest; --batches / --max-batch set them for
#                                                     every model)
#                               [--exporters torchscript,dynamo] [--models bert,vit|none] [--budget 560]
#                               [--size base|tiny]   (tiny: the small test configurations, for a dry run)
#                               [--rowwise]          (also the softmax / layernorm bandwidth sweep of
#                                                     scripts/gpu/bench_rowwise.py, K = 32..16384; with
#                                                     --models none, the sweep alone)
#                               [--unfused-attention] (also build the first exporter's BERT with
#                                                     `compile --attention unfused`, as
#                                                     bert_<exporter>, validated and timed next to
#                                                     the default fused-attention builds, which are
#                                                     named <model>_<exporter>_fusedattn)
#                               [--seq-range MAX]    (also build the first exporter's BERT once with
#                                                     `--dim seq=1..MAX`, a run-time sequence length, as
#                                                     bert_<exporter>_seqrange: validated at --seq and
#                                                     --seq2 from the one build, refused at MAX+1, timed
#                                                     at --seq)
#                               [--seq-range-attention fused|unfused]  (that build's attention;
#                                                     default unfused)
#                               [--seq-range-only]   (BERT only as that build: no fixed-length BERT
#                                                     build, to fit a short device call)
#                               [--pdl-modes 0,kernels,library]  (also time every build with each
#                                                     O2A_PDL setting: 0 = programmatic dependent launch
#                                                     off, as <build>_pdl_off; kernels / library = only
#                                                     our kernels / only the CUTLASS GEMMs with it)
#                               [--attention-warps 2,4,8]  (also time every build with each
#                                                     O2A_ATTENTION_WARPS setting, as
#                                                     <build>_attnwarps<W>: the fused attention
#                                                     kernel's block width forced to W warps)
#                               [--attention-rows 32] (also time every build with each
#                                                     O2A_ATTENTION_ROWS setting, as
#                                                     <build>_attnrows<R>, and validate it at batch 8:
#                                                     R query rows a warp of the attention kernel)
#                               [--torch-compile 1,32] (also time torch.compile(mode="max-autotune")
#                                                     at these batches next to PyTorch eager and
#                                                     CUDA graph; each batch compiles and autotunes
#                                                     for minutes, so few)
#                               [--profile]          (profile every build's kernels on this GPU first,
#                                                     `compile --profile`, into one cache shared by
#                                                     the builds; they are named <build>_profiled)
#
# Prepare first on the CPU machine with scripts/gpu-prepare.sh (it builds .gpu/bin/onnx2ait and
# packs the CUTLASS headers). Results go to $OUT (default ./gpu-out): gpu-transformers.log,
# results.json, BENCHMARKS.md (and with --profile, profile.json: the measurements behind the choices).
set -uo pipefail

SELF="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SELF")/.."
ROOT=$PWD
SEQ=128 SEQ2=77 BATCHES= MAX_BATCH= EXPORTERS=torchscript,dynamo MODELS=bert,vit BUDGET=560 SIZE=base ROWWISE=0 UNFUSED_ATTENTION=0 PROFILE=0 SEQ_RANGE=0 SEQ_RANGE_ATTENTION=unfused SEQ_RANGE_ONLY=0 PDL_MODES= ATTENTION_WARPS= ATTENTION_ROWS= TORCH_COMPILE=
while (($#)); do
  case $1 in
    --seq) SEQ=$2; shift ;;
    --seq2) SEQ2=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    --max-batch) MAX_BATCH=$2; shift ;;
    --exporters) EXPORTERS=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    --size) SIZE=$2; shift ;;
    --rowwise) ROWWISE=1 ;;
    --unfused-attention) UNFUSED_ATTENTION=1 ;;
    --profile) PROFILE=1 ;;
    --pdl-modes) PDL_MODES=$2; shift ;;
    --attention-warps) ATTENTION_WARPS=$2; shift ;;
    --attention-rows) ATTENTION_ROWS=$2; shift ;;
    --torch-compile) TORCH_COMPILE=$2; shift ;;
    --seq-range) SEQ_RANGE=$2; shift ;;
    --seq-range-attention) SEQ_RANGE_ATTENTION=$2; shift ;;
    --seq-range-only) SEQ_RANGE_ONLY=1 ;;
    -h | --help) sed -n '2,/^set -uo/p' "$SELF" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-transformers.sh: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
W=$ROOT/out/gpu-transformers
mkdir -p "$W"
LOG=$OUT/gpu-transformers.log
exec > >(tee -a "$LOG") 2>&1
START=$(date +%s)
elapsed() { echo $(($(date +%s) - START)); }
say() { echo "[$(date -u +%H:%M:%S) +$(elapsed)s] $*"; }
PY=${PYTHON:-python3}
BIN=$ROOT/.gpu/bin/onnx2ait
[[ -x $BIN ]] || { say "error: $BIN is missing: run scripts/gpu-prepare.sh on the CPU machine first"; exit 1; }
# shellcheck source=scripts/gpu/toolchain.sh
source scripts/gpu/toolchain.sh
gpu_toolchain_env "$PY" "$ROOT" "$W"
say "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null); CUTLASS_DIR=$CUTLASS_DIR; ORT=$ORT_DYLIB_PATH"
say "commit: $(cat .gpu/COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)"
JOBS=$(nproc)
RESULTS=$W/results.jsonl
: >"$RESULTS"
record() { echo "$1" >>"$RESULTS"; }
# A JSON file as one line (json.dump escapes newlines inside strings, so raw ones are layout).
json_of() { if [[ -s $1 ]]; then tr -d '\n' <"$1"; else echo null; fi; }
within_budget() { (($(elapsed) + $1 < BUDGET)); }
# The batches a model is timed at and the largest batch it is built for (--batches and
# --max-batch, else the model's own: BERT-base 1, 8, 32, 128; ViT-B/16 1, 8, 64).
batches_of() { # model (the build name's prefix)
  if [[ -n $BATCHES ]]; then echo "$BATCHES"; elif [[ $1 == bert ]]; then echo 1,8,32,128; else echo 1,8,64; fi
}
max_batch_of() { # model
  if [[ -n $MAX_BATCH ]]; then echo "$MAX_BATCH"; else local b; b=$(batches_of "$1"); echo "${b##*,}"; fi
}

# 1. Exports, in parallel (CPU only).
IFS=, read -ra MODEL_LIST <<<"$MODELS"
# --models none: no model at all (with --rowwise, the bandwidth sweep alone).
[[ $MODELS == none ]] && MODEL_LIST=()
IFS=, read -ra EXPORTER_LIST <<<"$EXPORTERS"
PIDS=()
for m in "${MODEL_LIST[@]}"; do
  for e in "${EXPORTER_LIST[@]}"; do
    "$PY" scripts/gpu/export_transformers.py "$m" "$W/${m}_$e.onnx" --size "$SIZE" --exporter "$e" \
      --meta-out "$W/${m}_$e.export.json" >"$W/${m}_$e.export.log" 2>&1 &
    PIDS+=($!)
  done
done
# By pid: a bare `wait` would also wait for the log's `tee` process substitution, forever.
((${#PIDS[@]} == 0)) || wait "${PIDS[@]}"
for m in "${MODEL_LIST[@]}"; do for e in "${EXPORTER_LIST[@]}"; do
  say "export $m/$e: $(grep export_transformers "$W/${m}_$e.export.log" | tail -1)"
  record "{\"kind\":\"export\",\"model\":\"$m\",\"exporter\":\"$e\",\"meta\":$(json_of "$W/${m}_$e.export.json")}"
done; done

# 2. Builds (the object cache is shared: the exporters' variants reuse each other's instances).
build() { # name onnx seq [extra compile options...]
  local name=$1 onnx=$2 seq=$3 t0
  shift 3
  local dims=()
  [[ $name == bert* ]] && dims=(--dim "seq=$seq")
  [[ $name == *_seqrange* ]] && dims=(--dim "seq=1..$SEQ_RANGE")
  local choice=(--no-profile)
  ((PROFILE)) && choice=(--profile --profile-cache "$W/profile.json")
  t0=$(date +%s.%N)
  "$BIN" compile "$onnx" -o "$W/build_$name" "${dims[@]}" --max-batch "$(max_batch_of "${name%%_*}")" "${choice[@]}" \
    --jobs "$JOBS" "$@" >"$W/build_$name.log" 2>&1
  local rc=$?
  local secs
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  local kernels
  kernels=$(grep -m1 '^generated:' "$W/build_$name/summary.txt" 2>/dev/null | sed 's/"/\\"/g')
  # A rebuild on a warm machine takes its objects from the cache: say so next to the wall time.
  local objects
  objects=$(grep -m1 -oE '[0-9]+ compiled, [0-9]+ cached' "$W/build_$name.log" 2>/dev/null)
  [[ -z $objects ]] || kernels="$kernels; objects: $objects"
  say "build $name (seq $seq): rc $rc, ${secs}s; $kernels"
  ((rc == 0)) || tail -20 "$W/build_$name.log"
  record "{\"kind\":\"build\",\"name\":\"$name\",\"seq\":$seq,\"rc\":$rc,\"seconds\":$secs,\"generated\":\"$kernels\"}"
  return $rc
}
validate() { # name onnx seq batch
  local name=$1 onnx=$2 seq=$3 batch=$4
  local dims=(--dim "batch=$batch")
  [[ $name == bert* ]] && dims+=(--dim "seq=$seq")
  "$BIN" validate "$onnx" --build "$W/build_$name" --batch "$batch" "${dims[@]}" --gpu-rtol 2e-2 --json \
    >"$W/validate_${name}_b$batch.json" 2>"$W/validate_${name}_b$batch.err"
  local rc=$?
  say "validate $name batch $batch seq $seq: rc $rc"
  ((rc == 0)) || tail -5 "$W/validate_${name}_b$batch.err"
  record "{\"kind\":\"validate\",\"name\":\"$name\",\"seq\":$seq,\"batch\":$batch,\"rc\":$rc,\"report\":$(json_of "$W/validate_${name}_b$batch.json")}"
}
# BERT's first exporter is built at --seq, the others at --seq2 (a non-power-of-two length), so
# one run covers both exporters and both kinds of sequence length without a third build.
declare -A BUILT SEQ_OF
SUF=; ((PROFILE)) && SUF=_profiled
for m in "${MODEL_LIST[@]}"; do
  first=1
  ((SEQ_RANGE_ONLY)) && [[ $m == bert ]] && continue
  for e in "${EXPORTER_LIST[@]}"; do
    [[ -f $W/${m}_$e.onnx ]] || continue
    seq=$SEQ; ((first)) || seq=$SEQ2
    first=0
    name=${m}_${e}_fusedattn$SUF
    within_budget 120 || { say "build $name: not run (time budget)"; continue; }
    # Validation reads the model by build name: a link in the same folder (external data resolves alike).
    ln -sfn "${m}_$e.onnx" "$W/$name.onnx"
    build "$name" "$W/$name.onnx" "$seq" --attention fused && { BUILT[$name]=1; SEQ_OF[$name]=$seq; }
  done
done
# The unfused attention kernels next to the default fused build: BERT, first exporter, --seq.
e=${EXPORTER_LIST[0]}
if ((UNFUSED_ATTENTION)) && [[ ,$MODELS, == *,bert,* && -f $W/bert_$e.onnx ]]; then
  name=bert_${e}$SUF
  if within_budget 120; then
    [[ -z $SUF ]] || ln -sfn "bert_$e.onnx" "$W/$name.onnx"
    build "$name" "$W/$name.onnx" "$SEQ" --attention unfused && { BUILT[$name]=1; SEQ_OF[$name]=$SEQ; }
  else
    say "build $name: not run (time budget)"
  fi
fi

# The first exporter's BERT once more with a run-time sequence length (--seq-range MAX).
if ((SEQ_RANGE > 0)) && [[ ,$MODELS, == *,bert,* && -f $W/bert_$e.onnx ]]; then
  name=bert_${e}_seqrange${SEQ_RANGE}$SUF
  [[ $SEQ_RANGE_ATTENTION == fused ]] && name=bert_${e}_seqrange${SEQ_RANGE}_fusedattn$SUF
  if within_budget 120; then
    ln -sfn "bert_$e.onnx" "$W/$name.onnx"
    build "$name" "$W/$name.onnx" "$SEQ" --attention "$SEQ_RANGE_ATTENTION" && { BUILT[$name]=1; SEQ_OF[$name]=$SEQ; }
  else
    say "build $name: not run (time budget)"
  fi
fi

# The measurements behind the profiled builds' choices come back with the run (a fixture for the
# heuristic's tests, tests/fixtures/).
if ((PROFILE)) && [[ -f $W/profile.json ]]; then cp "$W/profile.json" "$OUT/profile.json"; fi

# 3. Timing, one thing at a time on the GPU: onnx2ait (the PyTorch peers after the validation).
bench_setting() { # name batches tag VAR=VALUE: build <name> timed under one run-time setting, as <name>_<tag>
  local name=$1 batches=$2 tag=$3 setting=$4
  env "$setting" "$BIN" bench "$W/build_$name" --batch "$batches" "${bench_dims[@]}" --json \
    >"$W/bench_${name}_$tag.json" 2>"$W/bench_${name}_$tag.err"
  say "bench $name with $setting: rc $? $(tr -d '\n ' <"$W/bench_${name}_$tag.json" | head -c 400)"
  record "{\"kind\":\"bench\",\"name\":\"${name}_$tag\",\"seq\":${SEQ_OF[$name]},\"result\":$(json_of "$W/bench_${name}_$tag.json")}"
}
for name in $(printf '%s\n' "${!BUILT[@]}" | sort); do
  within_budget 40 || { say "bench $name: not run (time budget)"; continue; }
  bench_dims=()
  [[ $name == *_seqrange* ]] && bench_dims=(--dim "seq=${SEQ_OF[$name]}")
  batches=$(batches_of "${name%%_*}")
  "$BIN" bench "$W/build_$name" --batch "$batches" "${bench_dims[@]}" --json >"$W/bench_$name.json" 2>"$W/bench_$name.err"
  say "bench $name: rc $? $(tr -d '\n ' <"$W/bench_$name.json" | head -c 400)"
  record "{\"kind\":\"bench\",\"name\":\"$name\",\"seq\":${SEQ_OF[$name]},\"result\":$(json_of "$W/bench_$name.json")}"
  # The same library under other run-time settings, each timed as its own row: programmatic
  # dependent launch (templates/cuda/library.cuh.hbs; O2A_PDL=0 as <build>_pdl_off, O2A_PDL=MODE
  # as <build>_pdl_MODE), the fused attention kernel's block width and query rows a warp
  # (templates/cuda/kernels/attention.cu.hbs).
  for mode in ${PDL_MODES//,/ }; do
    tag=pdl_$mode
    [[ $mode == 0 ]] && tag=pdl_off
    bench_setting "$name" "$batches" "$tag" "O2A_PDL=$mode"
  done
  for warps in ${ATTENTION_WARPS//,/ }; do bench_setting "$name" "$batches" "attnwarps$warps" "O2A_ATTENTION_WARPS=$warps"; done
  for rows in ${ATTENTION_ROWS//,/ }; do bench_setting "$name" "$batches" "attnrows$rows" "O2A_ATTENTION_ROWS=$rows"; done
done
# 4. Validation on the GPU (batch 1 and 8), before the per-kernel times and the PyTorch peers, so a
# short time budget drops those rather than the correctness checks.
for name in $(printf '%s\n' "${!BUILT[@]}" | sort); do
  onnx=$W/$name.onnx
  seq=${SEQ_OF[$name]}
  for b in 1 8; do
    within_budget 40 && validate "$name" "$onnx" "$seq" "$b" || say "validate $name batch $b: not run (time budget)"
  done
  # The same library under each --attention-rows setting, at batch 8, as <build>_attnrows<R>.
  for rows in ${ATTENTION_ROWS//,/ }; do
    [[ $name == *fusedattn* ]] || continue
    ln -sfn "build_$name" "$W/build_${name}_attnrows$rows"
    within_budget 40 && O2A_ATTENTION_ROWS=$rows validate "${name}_attnrows$rows" "$onnx" "$seq" 8 ||
      say "validate ${name}_attnrows$rows batch 8: not run (time budget)"
  done
  # One build, several lengths: the second length, and one past the range (must be refused).
  if [[ $name == *_seqrange* ]]; then
    within_budget 40 && validate "$name" "$onnx" "$SEQ2" 8
    "$BIN" validate "$onnx" --build "$W/build_$name" --batch 1 --dim "seq=$((SEQ_RANGE + 1))" \
      >"$W/validate_${name}_outside.out" 2>&1
    rc=$?
    say "validate $name at seq $((SEQ_RANGE + 1)), outside the range: rc $rc (must fail): $(grep -m1 -o "dim 'seq'.*" "$W/validate_${name}_outside.out")"
    record "{\"kind\":\"outside_range\",\"name\":\"$name\",\"seq\":$((SEQ_RANGE + 1)),\"rc\":$rc}"
  fi
done
# 5. Where the time goes: per-kernel times of the first exporter's builds (and of the unfused
# build) at the smallest and largest batch, with each kernel's work and achieved rate (GFLOP,
# TFLOP/s, MB, GB/s: `bench --kernels` prints them; this script measures no ceilings, so no
# --peak-tflops / --peak-gbps and no %peak columns).
for name in $(for m in "${MODEL_LIST[@]}"; do echo "${m}_${EXPORTER_LIST[0]}_fusedattn$SUF"; done) "bert_${EXPORTER_LIST[0]}$SUF" \
  $(printf '%s\n' "${!BUILT[@]}" | grep _seqrange); do
  [[ -n ${BUILT[$name]:-} ]] || continue
  within_budget 90 || { say "kernel times $name: not run (time budget)"; continue; }
  batches=$(batches_of "${name%%_*}")
  "$BIN" bench "$W/build_$name" --batch "${batches%%,*},${batches##*,}" --kernels --kernel-top 15 \
    >"$OUT/kernels_$name.txt" 2>&1
  say "kernel times $name: rc $? ($OUT/kernels_$name.txt)"
done
# torch.compile (--torch-compile): a few minutes of compilation and autotuning per batch.
tc_args=() tc_need=60
if [[ -n $TORCH_COMPILE ]]; then
  tc_args=(--compile max-autotune --compile-batch "$TORCH_COMPILE")
  tc_need=$((60 + 180 * $(tr ',' '\n' <<<"$TORCH_COMPILE" | grep -c .)))
fi
for m in "${MODEL_LIST[@]}"; do
  within_budget 60 || { say "PyTorch $m: not run (time budget)"; continue; }
  m_tc=("${tc_args[@]}")
  if ((${#m_tc[@]})) && ! within_budget "$tc_need"; then
    say "torch.compile $m: not run (time budget)"
    m_tc=()
  fi
  "$PY" scripts/gpu/bench_transformers.py "$m" --size "$SIZE" --batch "$(batches_of "$m")" --seq "$SEQ" "${m_tc[@]}" \
    --json-out "$W/torch_$m.json" >"$W/torch_$m.log" 2>&1
  grep bench_transformers "$W/torch_$m.log" || tail -5 "$W/torch_$m.log"
  record "{\"kind\":\"torch\",\"model\":\"$m\",\"result\":$(json_of "$W/torch_$m.json")}"
done

# 6. Softmax and layernorm bandwidth (optional).
if ((ROWWISE)); then
  if within_budget 200; then
    "$PY" scripts/gpu/bench_rowwise.py --bin "$BIN" --work "$W/rowwise" --json-out "$W/rowwise.json" \
      >"$OUT/rowwise.txt" 2>&1
    say "rowwise sweep: rc $? ($OUT/rowwise.txt)"
    record "{\"kind\":\"rowwise\",\"result\":$(json_of "$W/rowwise.json")}"
  else
    say "rowwise sweep: not run (time budget)"
  fi
fi

# 7. The report.
"$PY" scripts/gpu/write_transformer_benchmarks.py "$RESULTS" --previous "$ROOT/BENCHMARKS.md" --out "$OUT/BENCHMARKS.md" \
  --commit "$(cat .gpu/COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null)" \
  --kernel-times "$OUT"/kernels_*.txt --rowwise "$OUT/rowwise.txt" --command "scripts/gpu-transformers.sh --seq $SEQ --seq2 $SEQ2$([[ -z $BATCHES ]] || echo " --batches $BATCHES")$([[ -z $MAX_BATCH ]] || echo " --max-batch $MAX_BATCH") --exporters $EXPORTERS --models $MODELS$( ((ROWWISE)) && echo ' --rowwise')$( ((UNFUSED_ATTENTION)) && echo ' --unfused-attention')$( ((PROFILE)) && echo ' --profile')$( ((SEQ_RANGE)) && echo " --seq-range $SEQ_RANGE --seq-range-attention $SEQ_RANGE_ATTENTION")$( ((SEQ_RANGE_ONLY)) && echo ' --seq-range-only')$([[ -z $PDL_MODES ]] || echo " --pdl-modes $PDL_MODES")$([[ -z $ATTENTION_WARPS ]] || echo " --attention-warps $ATTENTION_WARPS")$([[ -z $ATTENTION_ROWS ]] || echo " --attention-rows $ATTENTION_ROWS")$([[ -z $TORCH_COMPILE ]] || echo " --torch-compile $TORCH_COMPILE")"
cp "$RESULTS" "$OUT/results.jsonl"
say "done in $(elapsed)s"
