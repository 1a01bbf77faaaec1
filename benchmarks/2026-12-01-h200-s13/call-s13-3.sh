#!/usr/bin/env bash
# Session 13, call 3 (build of the L2 prefetch: kernel pf_rows, host knobs, default off):
# the GPU suite with FP4NORM_L2_PREFETCH_ROWS=1 (every row but the last prefetches the
# next: the prefetch addresses of every sweep kernel), then the A/B of the prefetch budget
# in row-major (and two swizzled cells), 2 rounds: mib0 (off) / mib4 / mib8 / mib1048576
# (one resident wave ahead).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
FP4NORM_L2_PREFETCH_ROWS=1 timeout 120 .artifacts/bin/gpu --test-threads=3 > "$OUT/gpu-tests-prefetch1-3.log" 2>&1
grep -E "test result|panicked|^FAIL" "$OUT/gpu-tests-prefetch1-3.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] ab"
V=.artifacts/variants-s13
AB_VARIANTS="$V/mib0.env $V/mib4.env $V/mib8.env $V/mib1048576.env" AB_ROUNDS=2 \
AB_SETS="--m 16384 --h 2048,4096,5120,7168,8192,16384,32768 --format nvfp4 --layout row-major
--m 8192 --h 4096,8192 --format nvfp4 --layout row-major
--m 4096 --h 16384 --format nvfp4 --layout row-major
--m 2048 --h 32768 --format nvfp4 --layout row-major
--m 16384 --h 4096,8192 --format nvfp4 --layout swizzled" timeout 420 bash scripts/gpu-check.sh ab 2>&1 | tail -22
echo "[t+$(( $(date +%s) - s0 ))s] done"
