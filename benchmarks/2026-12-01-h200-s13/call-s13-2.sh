#!/usr/bin/env bash
# Session 13, call 2 (build of 5a44ba8: store pointers pinned): the GPU suite, then the A/B
# of the L2 prefetch's distance at many rows, 2 rounds: m (5a44ba8) / pw (one resident wave
# ahead, as call 1's f) / pb8, pb4 (at most 8 / 4 MiB of x and r ahead), kernel-source variants.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
timeout 120 .artifacts/bin/gpu --test-threads=3 > "$OUT/gpu-tests-2.log" 2>&1
grep -E "test result|panicked|^FAIL" "$OUT/gpu-tests-2.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] ab"
V=.artifacts/variants-s13
AB_VARIANTS="$V/m-main.env $V/pw.cu $V/pb8.cu $V/pb4.cu" AB_ROUNDS=2 \
AB_SETS="--m 16384 --h 2048,4096,5120,7168,8192,16384,32768 --format nvfp4
--m 8192 --h 4096,8192 --format nvfp4
--m 4096 --h 4096,7168,16384 --format nvfp4
--m 2048 --h 8192,32768 --format nvfp4
--m 16384 --h 4096 --layout swizzled --format nvfp4" timeout 450 bash scripts/gpu-check.sh ab 2>&1 | tail -22
echo "[t+$(( $(date +%s) - s0 ))s] done"
