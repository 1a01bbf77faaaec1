#!/usr/bin/env bash
# Session 15, call 7 (same build as call 6): compute-sanitizer memcheck / racecheck /
# synccheck over the many-row-shape test (it forces the new (320, 1, 1) at H = 5120), and
# the exact-sum path forced on it.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
OUT=$OUT/san SANITIZE_TESTS="gpu_many_row_shapes" SANITIZE_TIMEOUT=90 bash scripts/gpu-check.sh sanitize 2>&1 | grep -E 'SUMMARY|test result|sanitizer|FAIL' | tail -12
echo "[t+$(( $(date +%s) - s0 ))s] exact path forced"
FP4NORM_FORCE_EXACT_SUMSQ=1 FP4NORM_CACHE_DIR=/tmp/kcache-exact timeout 100 .artifacts/bin/gpu --test-threads=4 gpu_many_row_shapes > "$OUT/exactpath-7.log" 2>&1
grep -E "^FAIL|test result|panicked" "$OUT/exactpath-7.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] done"
