#!/usr/bin/env bash
# Session 11, call 3 (the build of f adopted: per-lane store pointers, the swizzled word
# in two shuffles): the GPU suite and the forced exact path on it; then A/B of the split
# swizzled write: a (default: split for NVFP4 at M >= 8192) / e (split everywhere,
# FP4NORM_SWIZZLE_SPLIT=1) / g (direct everywhere, FP4NORM_SWIZZLE_SPLIT=0), 2 rounds.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
timeout 150 bash scripts/gpu-check.sh tests 2>&1 | tail -4
echo "[t+$(( $(date +%s) - s0 ))s] exactpath"
timeout 150 bash scripts/gpu-check.sh exactpath 2>&1 | tail -3
echo "[t+$(( $(date +%s) - s0 ))s] ab"
V=.artifacts/variants-s11
AB_VARIANTS="$V/a-main.env $V/e-split.env $V/g-split0.env" AB_ROUNDS=2 \
AB_SETS="--m 8192,16384 --h 4096,8192 --layout row-major,swizzled" timeout 240 bash scripts/gpu-check.sh ab 2>&1 | tail -20
echo "[t+$(( $(date +%s) - s0 ))s] done"
