#!/usr/bin/env bash
# Session 14, call 4 (47762c6): the target cells the report's tables leave out (bf16 2048 x
# 16384, 1024 x 32768 ; f16 at 4096 and 8192 rows, every H of the target), then the exact-sum
# path forced on every row of the sweep and edge cases with every row prefetching the next.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
b=.artifacts/bin/fp4norm
$b bench --device cuda --copy-mib 2048 --layout row-major --m 2048 --h 16384 --json "$OUT/extra-bf16.json" > "$OUT/extra-4.log" 2>&1
$b bench --device cuda --copy-mib 2048 --layout row-major --dtype f16 --m 4096,8192 --h 4096,5120,7168,8192,16384,32768 --json "$OUT/extra-f16.json" >> "$OUT/extra-4.log" 2>&1
grep -E "^ +[0-9]+ +[0-9]+ |copy" "$OUT/extra-4.log"
echo "[t+$(( $(date +%s) - s0 ))s] exact path forced, prefetch of the next row forced"
FP4NORM_FORCE_EXACT_SUMSQ=1 FP4NORM_L2_PREFETCH_ROWS=1 FP4NORM_CACHE_DIR=/tmp/kcache-exact timeout 250 .artifacts/bin/gpu --test-threads=4 gpu_edge_cases gpu_sweep > "$OUT/exactpath-4.log" 2>&1
grep -E "^FAIL|test result|panicked" "$OUT/exactpath-4.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] done"
