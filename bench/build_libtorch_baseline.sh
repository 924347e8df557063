#!/usr/bin/env bash
# build_libtorch_baseline.sh - builds bench/libtorch_baseline.cc against the
# libtorch that ships inside the installed PyTorch package (no separate
# libtorch download needed).
#
# Usage (on the GPU machine):
#   bash bench/build_libtorch_baseline.sh [OUTPUT_BINARY]   # default /tmp/libtorch_baseline
#   /tmp/libtorch_baseline --json /tmp/libtorch_baseline.json
#
# Environment overrides: PYTHON (default python3), CXX (default g++),
# CXXSTD (default c++17; the build retries with c++20 by itself when the
# torch headers demand it), CUDA_HOME (default /usr/local/cuda).
#
# It finds the torch package folder T, takes the C++ ABI from
# torch._C._GLIBCXX_USE_CXX11_ABI, compiles with -I$T/include
# -I$T/include/torch/csrc/api/include -I$CUDA_HOME/include, links torch, torch_cuda,
# torch_cpu, c10, c10_cuda and the CUDA runtime of the package's nvidia
# wheels (site-packages/nvidia/cu13/lib/libcudart.so.13; falls back to
# $CUDA_HOME/lib64 -lcudart), with an rpath for each library folder.
set -euo pipefail

die() { echo "build_libtorch_baseline: error: $*" >&2; exit 1; }

OUT_BIN=${1:-/tmp/libtorch_baseline}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC="$HERE/libtorch_baseline.cc"
PY=${PYTHON:-python3}
CXX=${CXX:-g++}
CXXSTD=${CXXSTD:-c++17}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

[ -f "$SRC" ] || die "source not found: $SRC"
command -v "$CXX" >/dev/null || die "C++ compiler '$CXX' not found"
command -v "$PY" >/dev/null || die "python '$PY' not found"

T=$("$PY" -c 'import torch,os;print(os.path.dirname(torch.__file__))') \
  || die "could not import torch with $PY"
if [ ! -d "$T/include" ] || [ ! -d "$T/lib" ]; then
  die "torch package at $T has no include/ or lib/ folder"
fi
ABI=$("$PY" -c 'import torch;print(int(torch._C._GLIBCXX_USE_CXX11_ABI))') \
  || die "could not read torch._C._GLIBCXX_USE_CXX11_ABI"
TORCH_VERSION=$("$PY" -c 'import torch;print(torch.__version__)')
SITE=$(dirname "$T")

for lib in torch torch_cuda torch_cpu c10 c10_cuda; do
  [ -e "$T/lib/lib$lib.so" ] || die "missing $T/lib/lib$lib.so (is this a CUDA build of torch?)"
done

# CUDA runtime: prefer the one torch itself loads (nvidia wheel), so only one
# libcudart is in the process.
CUDART=""
if [ -f "$SITE/nvidia/cu13/lib/libcudart.so.13" ]; then
  CUDART="$SITE/nvidia/cu13/lib/libcudart.so.13"
elif [ -d "$SITE/nvidia" ]; then
  CUDART=$(find "$SITE/nvidia" -name 'libcudart.so.*' -type f 2>/dev/null | sort | tail -n 1 || true)
fi
if [ -n "$CUDART" ]; then
  CUDART_DIR=$(dirname "$CUDART")
  CUDART_LINK=("$CUDART" "-Wl,-rpath,$CUDART_DIR")
  echo "cudart: $CUDART"
elif [ -e "$CUDA_HOME/lib64/libcudart.so" ]; then
  CUDART_LINK=("-L$CUDA_HOME/lib64" -lcudart "-Wl,-rpath,$CUDA_HOME/lib64")
  echo "cudart: $CUDA_HOME/lib64/libcudart.so (no libcudart in $SITE/nvidia)"
else
  die "no libcudart found under $SITE/nvidia or $CUDA_HOME/lib64"
fi

# CUDA headers: the toolkit's, else the nvidia wheel's.
CUDA_INC=""
for d in "$CUDA_HOME/include" "$SITE/nvidia/cu13/include" "$SITE/nvidia/cuda_runtime/include"; do
  if [ -f "$d/cuda_runtime_api.h" ]; then CUDA_INC=$d; break; fi
done
[ -n "$CUDA_INC" ] || die "cuda_runtime_api.h not found (tried $CUDA_HOME/include and $SITE/nvidia)"

echo "torch $TORCH_VERSION at $T (CXX11 ABI=$ABI), CUDA headers $CUDA_INC"

# libtorch_cuda needs cuBLAS, cuDNN, NCCL... from the nvidia wheels; it finds
# them at run time through its own RUNPATH, but the linker also has to see
# them now: point -rpath-link at every nvidia library folder.
RPATH_LINK=("-Wl,-rpath-link,$T/lib")
if [ -d "$SITE/nvidia" ]; then
  while IFS= read -r d; do
    RPATH_LINK+=("-Wl,-rpath-link,$d")
  done < <(find "$SITE/nvidia" -name '*.so*' \( -type f -o -type l \) -printf '%h\n' 2>/dev/null | sort -u)
fi

build() {  # $1 = C++ standard, then extra flags
  "$CXX" -O2 -std="$1" "${@:2}" -pthread -D_GLIBCXX_USE_CXX11_ABI="$ABI" \
    -I"$T/include" -I"$T/include/torch/csrc/api/include" -I"$CUDA_INC" \
    "$SRC" -o "$OUT_BIN" \
    -L"$T/lib" -Wl,-rpath,"$T/lib" \
    -Wl,--no-as-needed -ltorch -ltorch_cuda -ltorch_cpu -lc10 -lc10_cuda -Wl,--as-needed \
    "${CUDART_LINK[@]}" "${RPATH_LINK[@]}" -Wl,--allow-shlib-undefined
}

LOG=$(mktemp)
trap 'rm -f "$LOG"' EXIT
echo "compiling $SRC -> $OUT_BIN (-std=$CXXSTD) ..."
if ! build "$CXXSTD" 2>"$LOG"; then
  if [ "$CXXSTD" != "c++20" ] && grep -qiE 'c\+\+ ?20' "$LOG"; then
    echo "the torch headers ask for C++20; retrying with -std=c++20 ..."
    CXXSTD=c++20
  fi
  if ! build "$CXXSTD" 2>"$LOG"; then
    # The kernel count uses Kineto's C++ API (torch/csrc/autograd/profiler_kineto.h), which is
    # not a stable interface: without it the rows are still timed, their kernels not counted.
    echo "compilation failed; retrying without the Kineto kernel count. First errors:" >&2
    grep -m 10 -E 'error' "$LOG" >&2 || true
    build "$CXXSTD" -DKILN_NO_KINETO 2>"$LOG" || { cat "$LOG" >&2; die "compilation failed"; }
  fi
fi
# show warnings, if any, without failing
if [ -s "$LOG" ]; then head -n 40 "$LOG" >&2; fi
[ -x "$OUT_BIN" ] || die "no binary at $OUT_BIN after compiling"
echo "built $OUT_BIN"
