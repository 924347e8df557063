#!/usr/bin/env bash
# Builds repro.cu and runs it bare and under compute-sanitizer memcheck (graph + control, then
# with one planted out-of-bounds read). Run on the GPU machine: bash tools/graph_memory_repro/run.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
bin=/tmp/graph_memory_repro
nvcc -O2 -arch=sm_90 -o "$bin" "$here/repro.cu" || exit 1
echo "== bare"; "$bin"
echo "== memcheck"; compute-sanitizer --tool memcheck "$bin" 2>&1 | head -60
echo "== memcheck, planted out-of-bounds read"; compute-sanitizer --tool memcheck "$bin" --plant 2>&1 \
  | grep -E 'Invalid|ERROR SUMMARY|sums|address' | head -20
echo "== memcheck, B outlives the graph (freed by the caller after each replay)"
compute-sanitizer --tool memcheck "$bin" --keep-b 2>&1 | grep -E 'Invalid|out of bounds|nearest|ERROR SUMMARY|sums|address' | head -20
