#!/usr/bin/env bash
# Installs the compile-only ROCm toolchain that `onnx2ait compile --target rocm` builds with
# (no ROCm install and no AMD GPU needed; the objects hold real gfx90a / gfx942 device code):
#
#   1. Debian 12's clang-19 in HIP mode (clang-19, clang-tools-19 for clang-offload-bundler,
#      lld-19, llvm-19 for the object tools), HIP 5.2 headers and runtime (libamdhip64-dev) and
#      device bitcode (rocm-device-libs), through apt-get (needs root; system packages);
#   2. into .tools/rocm/ (ignored by git; ROCM_TOOLS overrides the folder):
#      - ck/include: Composable Kernel's headers, from the amd-aiter wheel on PyPI (pinned below;
#        it carries CK at aiter_meta/3rdparty/composable_kernel/, only include/ is kept, 23 MB),
#      - cfg/ck/config.h: normally made by CK's CMake from config.h.in: fp16/fp32/bf16/int8/fp8/
#        bf8/fp64 and XDL on, plus two things current CK expects from HIP >= 6 headers,
#      - devlibs/: the device bitcode, with the gfx942 ISA-version file derived from Debian's gfx940
#        one (Debian's 5.2 bitcode stops at gfx940),
#      - env: the paths `onnx2ait` reads (src/build/hipcc.rs finds .tools/rocm by itself).
#
# Idempotent: a stamp records the pins; when it matches and the files are there, nothing is done.
# Without root or apt-get, step 1 fails with the list of packages to install.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
DEST="${ROCM_TOOLS:-$PWD/.tools/rocm}"
APT_PACKAGES=(clang-19 clang-tools-19 lld-19 llvm-19 libamdhip64-dev rocm-device-libs)
CK_WHEEL="amd-aiter==0.1.7.post2.dev18"
STAMP_TEXT="$CK_WHEEL ${APT_PACKAGES[*]} config-v1"

have_system_tools() {
  command -v clang++-19 >/dev/null && command -v clang-offload-bundler-19 >/dev/null &&
    command -v llvm-objdump-19 >/dev/null && command -v llvm-as-19 >/dev/null &&
    [[ -f /usr/include/hip/hip_runtime.h ]] && [[ -n "$(bitcode_dir)" ]]
}

# Debian's rocm-device-libs puts the bitcode under the multiarch lib folder.
bitcode_dir() {
  local d
  for d in /usr/lib/*/amdgcn/bitcode /usr/lib/amdgcn/bitcode; do
    [[ -f "$d/oclc_isa_version_940.bc" ]] && { echo "$d"; return; }
  done
}

if [[ -f "$DEST/.stamp" && "$(cat "$DEST/.stamp")" == "$STAMP_TEXT" && -f "$DEST/ck/include/ck/ck.hpp" &&
      -f "$DEST/devlibs/oclc_isa_version_942.bc" ]] && have_system_tools; then
  echo "setup-rocm: $DEST is up to date (clang-19 $(clang++-19 --version | sed -n 's/.*version \([0-9.]*\).*/\1/p;q'), $CK_WHEEL)"
  exit 0
fi

if ! have_system_tools; then
  if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null; then
    echo "setup-rocm: error: needs the Debian 12 packages ${APT_PACKAGES[*]}" >&2
    echo "  (install them as root: apt-get install --no-install-recommends ${APT_PACKAGES[*]}; then run this script again)" >&2
    exit 1
  fi
  echo "setup-rocm: apt-get install ${APT_PACKAGES[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${APT_PACKAGES[@]}" >/dev/null
  have_system_tools || { echo "setup-rocm: error: the packages installed but clang++-19 / HIP headers / bitcode are still missing" >&2; exit 1; }
fi

mkdir -p "$DEST"
if [[ ! -f "$DEST/ck/include/ck/ck.hpp" ]]; then
  PY=python3
  [[ -x .venv/bin/python ]] && PY=.venv/bin/python
  TMP="$(mktemp -d)"
  trap 'rm -rf "$TMP"' EXIT
  echo "setup-rocm: downloading $CK_WHEEL (Composable Kernel headers)"
  "$PY" -m pip download -q --no-deps -d "$TMP/wheel" "$CK_WHEEL"
  "$PY" - "$TMP" <<'PY'
import sys, zipfile, glob, os
tmp = sys.argv[1]
whl = glob.glob(os.path.join(tmp, "wheel", "*.whl"))[0]
prefix = "aiter_meta/3rdparty/composable_kernel/include/"
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = os.path.join(tmp, "include", name[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(name) as src, open(target, "wb") as dst:
                dst.write(src.read())
PY
  [[ -f "$TMP/include/ck/ck.hpp" ]] || { echo "setup-rocm: error: $CK_WHEEL has no composable_kernel/include/ck/ck.hpp" >&2; exit 1; }
  rm -rf "$DEST/ck"
  mkdir -p "$DEST/ck"
  mv "$TMP/include" "$DEST/ck/include"
fi

# ck/config.h: the data types and XDL on, every other CMake option off; then what CK expects
# from HIP >= 6 headers and HIP 5.2 lacks.
mkdir -p "$DEST/cfg/ck"
sed -E -e 's|#cmakedefine (CK_ENABLE_(FP16\|FP32\|BF16\|INT8\|FP8\|BF8\|FP64)) @[A-Z0-9_]+@|#define \1 ON|' \
       -e 's|#cmakedefine (CK_USE_XDL) @[A-Z0-9_]+@|#define \1 ON|' \
       -e 's|#cmakedefine ([A-Za-z0-9_]+) .*|/* #undef \1 */|' \
       -e '/^#endif \/\/ CK_CONFIG_H_IN/d' "$DEST/ck/include/ck/config.h.in" > "$DEST/cfg/ck/config.h.tmp"
cat >> "$DEST/cfg/ck/config.h.tmp" <<'EOH'

/* Added by scripts/setup-rocm.sh for HIP 5.2 (Debian 12). */
#if __has_include(<hip/hip_version.h>)
#include <hip/hip_version.h>
#endif
#if defined(HIP_VERSION_MAJOR) && HIP_VERSION_MAJOR < 6
#include <type_traits>
namespace __hip_internal { using std::is_same; }
#ifndef __hip_assert
#define __hip_assert(c) do { if(!(c)) __builtin_trap(); } while(0)
#endif
#endif

#endif // CK_CONFIG_H_IN
EOH
mv "$DEST/cfg/ck/config.h.tmp" "$DEST/cfg/ck/config.h"

# Device bitcode; gfx942's ISA-version file derived from gfx940's (the version constant only).
BC="$(bitcode_dir)"
rm -rf "$DEST/devlibs"
mkdir -p "$DEST/devlibs"
ln -sf "$BC"/*.bc "$DEST/devlibs/"
llvm-dis-19 "$BC/oclc_isa_version_940.bc" -o - | sed 's/i32 9400/i32 9402/' | llvm-as-19 -o "$DEST/devlibs/oclc_isa_version_942.bc"

cat > "$DEST/env" <<EOF
# written by scripts/setup-rocm.sh
ROCM_CLANG=$(command -v clang++-19)
ROCM_CK_INCLUDE=$DEST/ck/include
ROCM_CK_CONFIG=$DEST/cfg
ROCM_DEVICE_LIBS=$DEST/devlibs
EOF
echo "$STAMP_TEXT" > "$DEST/.stamp"
echo "setup-rocm: toolchain ready in $DEST (clang++-19 -x hip --offload-arch=gfx90a|gfx942 --rocm-device-lib-path=$DEST/devlibs -I $DEST/cfg -I $DEST/ck/include)"
