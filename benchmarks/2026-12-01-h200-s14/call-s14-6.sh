#!/usr/bin/env bash
# Session 14, call 6 (7d2f775, f16 rows of 32768 in two CTAs of 512 from 16 rows per SM):
# the GPU suite, then H = 32768 f16 and bf16 at 2048 / 4096 / 8192 rows as the table now
# runs them, and f16 2048 x 32768 with the two CTAs of 512 forced (the table keeps 8 x 256).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
timeout 90 .artifacts/bin/gpu --test-threads=3 > "$OUT/gpu-tests-6.log" 2>&1
grep -E "test result|panicked|^FAIL|many-row shapes" "$OUT/gpu-tests-6.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] bench"
b=.artifacts/bin/fp4norm
$b bench --device cuda --copy-mib 2048 --layout row-major --dtype f16 --dtype bf16 --m 2048,4096,8192 --h 32768 --json "$OUT/h32768-6.json" > "$OUT/bench-6.log" 2>&1
FP4NORM_TUNE_SHAPE=512,1,2 $b bench --device cuda --copy-mib 2048 --layout row-major --dtype f16 --m 2048 --h 32768 >> "$OUT/bench-6.log" 2>&1
grep -E "^ +[0-9]+ +[0-9]+ |copy baseline|TUNE" "$OUT/bench-6.log"
echo "[t+$(( $(date +%s) - s0 ))s] done"
