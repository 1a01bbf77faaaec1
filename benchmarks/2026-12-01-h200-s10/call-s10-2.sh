#!/usr/bin/env bash
# Session 10, call 2: A/B of a (main, 0c2577a) / c (the byte-gathered E2M1 codes without
# the clamp, call 1's winner) / g (c + the row's warp partials added as a tree), two
# rounds; the forced exact path (every row redone) on g's source.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
V=.artifacts/variants-s10
AB_VARIANTS="$V/a-main.env $V/c-pack.cu $V/g-tree.cu" AB_ROUNDS=2 \
AB_SETS="--m 16384 --h 4096,8192 --layout row-major
--m 16384 --h 4096 --layout swizzled
--m 4096 --h 5120 --layout row-major
--m 1024 --h 4096,8192 --layout row-major
--m 128 --h 4096,8192 --layout row-major
--m 1,16 --h 4096,7168,8192 --layout row-major" timeout 300 bash scripts/gpu-check.sh ab 2>&1 | tail -30
echo "[t+$(( $(date +%s) - s0 ))s] exactpath on g"
FP4NORM_KERNEL_SOURCE=$PWD/$V/g-tree.cu timeout 200 bash scripts/gpu-check.sh exactpath 2>&1 | tail -6
echo "[t+$(( $(date +%s) - s0 ))s] done"
