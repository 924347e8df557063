#!/bin/bash
# The flash attention kernel on a GPU, without building kiln: compiles the harness (nvcc) and
# libkf.so, then runs the steps asked for (default: all but racecheck) and prints a summary.
#
#   bash tools/flash_attention/run.sh [steps]     # from a kiln checkout on the GPU machine
#   steps: build harness bench memcheck racecheck
#
# Logs go to $OUT (default /tmp/out), binaries to $BUILD (default /tmp/kiln-flash-harness).
# Needs the CUDA toolkit (nvcc, NVRTC, compute-sanitizer) and, for `bench`, PyTorch with CUDA.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT=${OUT:-/tmp/out}
BUILD=${BUILD:-/tmp/kiln-flash-harness}
mkdir -p "$OUT" "$BUILD"
export PATH=/usr/local/cuda/bin:$PATH
STEPS=${1:-"build harness bench memcheck"}
has() { [[ " $STEPS " == *" $1 "* ]]; }
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
if has build; then
  NVCC=(nvcc -O3 -std=c++17 -arch=sm_90 -I"$ROOT" -I"$HERE")
  "${NVCC[@]}" -o "$BUILD/harness" "$HERE/harness.cu" -lnvrtc > "$OUT/build_harness.log" 2>&1 &
  "${NVCC[@]}" -shared -Xcompiler -fPIC -o "$BUILD/libkf.so" "$HERE/lib.cu" -lnvrtc \
    > "$OUT/build_lib.log" 2>&1 &
  wait
  ls -la "$BUILD/harness" "$BUILD/libkf.so" || tail -30 "$OUT"/build_*.log
  stamp built
fi
if has harness; then
  timeout 150 "$BUILD/harness" > "$OUT/harness.log" 2>&1
  echo "harness rc=$?"
  grep -E "FAIL|error|ERROR|SUMMARY|correctness:" "$OUT/harness.log" | head -40
  stamp harness
fi
if has bench; then
  timeout 150 python3 "$HERE/bench.py" "$OUT" "$BUILD/libkf.so" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?"
  grep -E "FAIL|Error|error" "$OUT/bench.log" | head -20
  stamp bench
fi
if has memcheck; then
  timeout 90 compute-sanitizer --tool memcheck "$BUILD/harness" --sanitize > "$OUT/memcheck.log" 2>&1
  echo "memcheck rc=$?"
  grep -E "ERROR SUMMARY|SUMMARY:|Invalid|FAIL" "$OUT/memcheck.log" | head -10
  stamp memcheck
fi
if has racecheck; then
  timeout 90 compute-sanitizer --tool racecheck --racecheck-report hazard "$BUILD/harness" --sanitize \
    > "$OUT/racecheck.log" 2>&1
  echo "racecheck rc=$?"
  grep -E "RACECHECK SUMMARY|SUMMARY:" "$OUT/racecheck.log" | head -10
  stamp racecheck
fi
echo "=== timing (harness) ==="
grep -E "^  \[" "$OUT/harness.log" 2>/dev/null | head -80
echo "=== bench table ==="
sed -n '/== table/,$p' "$OUT/bench.log" 2>/dev/null
grep -E "row ->|keys attended|: [A-Za-z]*Error" "$OUT/bench.log" 2>/dev/null | head -20
