# shellcheck shell=bash
# Sourced by scripts/gpu-check.sh and scripts/gpu-bench.sh: finds ONNX Runtime and the CUTLASS
# headers on the GPU machine.
#
#   gpu_toolchain_env PYTHON ROOT WORK
#
# Sets and exports ORT_DYLIB_PATH (unless set: the libonnxruntime.so of PYTHON's onnxruntime) and
# CUTLASS_DIR (unless set: ROOT/.gpu/cutlass when it is a folder, else ROOT/.gpu/cutlass.tar.xz
# unpacked once into WORK/cutlass, re-unpacked when the archive changes). Either stays empty when
# nothing is found; the callers report that.
gpu_toolchain_env() {
  local py=$1 root=$2 work=$3 stamp
  if [[ -z ${ORT_DYLIB_PATH:-} ]]; then
    ORT_DYLIB_PATH=$("$py" -c 'import glob, os, onnxruntime as o
libs = sorted(glob.glob(os.path.join(os.path.dirname(o.__file__), "capi", "libonnxruntime.so*")))
print(libs[0] if libs else "")' 2>/dev/null || true)
    export ORT_DYLIB_PATH
  fi
  if [[ -z ${CUTLASS_DIR:-} ]]; then
    if [[ -d $root/.gpu/cutlass/include/cutlass ]]; then
      CUTLASS_DIR=$root/.gpu/cutlass
    elif [[ -f $root/.gpu/cutlass.tar.xz ]]; then
      CUTLASS_DIR=$work/cutlass
      stamp=$(cksum <"$root/.gpu/cutlass.tar.xz")
      if [[ ! -f $CUTLASS_DIR/.stamp || $(cat "$CUTLASS_DIR/.stamp") != "$stamp" ]]; then
        rm -rf "$CUTLASS_DIR"
        mkdir -p "$CUTLASS_DIR"
        # Python's tarfile, not tar -J: the machine may lack the xz program.
        "$py" -c 'import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    t.extractall(sys.argv[2], **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))' \
          "$root/.gpu/cutlass.tar.xz" "$CUTLASS_DIR"
        echo "$stamp" >"$CUTLASS_DIR/.stamp"
      fi
    fi
    export CUTLASS_DIR=${CUTLASS_DIR:-}
  fi
}
