#!/usr/bin/env bash
# Session 12, call 1 (21d1cc1 + next/swizzle-cluster.diff, knob FP4NORM_SWIZZLE_CLUSTER off
# by default): the GPU suite's sweep and edge cases with the clustered swizzled write forced
# (FP4NORM_SWIZZLE_CLUSTER=1, split off), the forced exact path with it, then the A/B
# a (default) / h (clustered, split off) / e (split everywhere), 2 rounds.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
echo "== suite with the clustered write forced"
FP4NORM_SWIZZLE_CLUSTER=1 FP4NORM_SWIZZLE_SPLIT=0 timeout 120 .artifacts/bin/gpu --test-threads=3 gpu_sweep gpu_edge_cases > "$OUT/gpu-tests-cluster-1.log" 2>&1
grep -E "^FAIL|test result|panicked" "$OUT/gpu-tests-cluster-1.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] exactpath with the knob"
FP4NORM_SWIZZLE_CLUSTER=1 FP4NORM_SWIZZLE_SPLIT=0 timeout 150 bash scripts/gpu-check.sh exactpath 2>&1 | tail -3
cp "$OUT/exactpath.log" "$OUT/exactpath-cluster-1.log" 2>/dev/null
echo "[t+$(( $(date +%s) - s0 ))s] ab"
V=.artifacts/variants-s12
AB_VARIANTS="$V/a-main.env $V/h-cluster.env $V/e-split.env" AB_ROUNDS=2 \
AB_SETS="--m 1024,8192,16384 --h 2048,4096 --layout row-major,swizzled,both" timeout 300 bash scripts/gpu-check.sh ab 2>&1 | tail -42
echo "[t+$(( $(date +%s) - s0 ))s] done"
