#!/usr/bin/env bash
# Session 11, call 1: the GPU suite (codec self-check with the grouped E2M1 check of
# 4d83673; 2cec01e's one-formula encoder) and the forced exact path on HEAD (2cec01e);
# then A/B a (HEAD) / b (32f67a0's kernel) / c (HEAD + per-lane store pointers), 2 rounds.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
timeout 150 bash scripts/gpu-check.sh tests 2>&1 | tail -8
echo "[t+$(( $(date +%s) - s0 ))s] exactpath"
timeout 120 bash scripts/gpu-check.sh exactpath 2>&1 | tail -4
echo "[t+$(( $(date +%s) - s0 ))s] ab"
V=.artifacts/variants-s11
AB_VARIANTS="$V/a-main.env $V/b-32f67a0.cu $V/c-lanestore.cu" AB_ROUNDS=2 \
AB_SETS="--m 16384 --h 2048,4096,5120,8192 --layout row-major
--m 16384 --h 7168 --layout row-major
--m 8192 --h 8192 --layout row-major
--m 4096 --h 5120 --layout row-major
--m 1024 --h 4096,8192 --layout row-major
--m 128 --h 8192 --layout row-major
--m 1,16 --h 4096,7168 --layout row-major" timeout 300 bash scripts/gpu-check.sh ab 2>&1 | tail -32
echo "[t+$(( $(date +%s) - s0 ))s] done"
