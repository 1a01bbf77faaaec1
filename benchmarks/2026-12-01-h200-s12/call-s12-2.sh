#!/usr/bin/env bash
# Session 12, call 2 (same build as call 1; the cluster knob stays off): the 2^31-element
# test, then the A/B of the swizzled write: a (default: split for NVFP4 from 8192 rows,
# MXFP4 from 4 MiB of scales) / g (direct everywhere, FP4NORM_SWIZZLE_SPLIT=0) / ks (direct
# everywhere, each 4-byte swizzled word stored with an L2 evict-last policy), 2 rounds.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
FP4NORM_GPU_HUGE=1 timeout 100 .artifacts/bin/gpu --test-threads=1 --nocapture gpu_huge_tensor_spot_rows > "$OUT/huge-2.log" 2>&1
grep -E "huge tensor|test result|panicked" "$OUT/huge-2.log"
echo "[t+$(( $(date +%s) - s0 ))s] ab"
V=.artifacts/variants-s12
AB_VARIANTS="$V/a-main.env $V/g-split0.env $V/ks-keep-split0.env" AB_ROUNDS=2 \
AB_SETS="--m 1024,8192,16384 --h 2048,4096,8192 --layout row-major,swizzled" timeout 400 bash scripts/gpu-check.sh ab 2>&1 | tail -40
echo "[t+$(( $(date +%s) - s0 ))s] done"
