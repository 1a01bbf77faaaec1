#!/usr/bin/env bash
# Session 10, call 1: A/B of a (main, 0c2577a) / b (encoder without the clamp where the
# block's largest product is below 7) / c (b + codes gathered by byte selects) / d (c + h, w
# unpacked and sign bits before the row reduction in latency-bound kernels), two rounds;
# then the GPU suite (codec self-check included) on d's source.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
V=.artifacts/variants-s10
AB_VARIANTS="$V/a-main.env $V/b-noclamp.cu $V/c-pack.cu $V/d-early.cu" AB_ROUNDS=2 \
AB_SETS="--m 16384 --h 2048,4096,5120,8192 --layout row-major
--m 16384 --h 7168,16384 --layout row-major
--m 16384 --h 4096 --dtype f16 --layout row-major
--m 8192 --h 8192 --layout row-major
--m 4096 --h 5120 --layout row-major
--m 1024 --h 4096 --layout row-major
--m 128 --h 4096,8192 --layout row-major
--m 1,16 --h 4096,7168,8192 --layout row-major" timeout 340 bash scripts/gpu-check.sh ab 2>&1 | tail -40
echo "[t+$(( $(date +%s) - s0 ))s] GPU suite on d"
FP4NORM_REQUIRE_GPU=1 FP4NORM_KERNEL_SOURCE=$PWD/$V/d-early.cu FP4NORM_CACHE_DIR=/tmp/kcache-d timeout 200 .artifacts/bin/gpu --test-threads=4 > "$OUT/gpu-tests-d.log" 2>&1
echo "rc $?"; grep -E "^FAIL|test result|panicked|codec" "$OUT/gpu-tests-d.log" | head -12
echo "[t+$(( $(date +%s) - s0 ))s] done"
