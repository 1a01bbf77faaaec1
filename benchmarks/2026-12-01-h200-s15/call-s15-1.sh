#!/usr/bin/env bash
# Session 15, call 1 (binaries of 7d2f775; kernels identical to 481823b): the two A/Bs the
# fourteenth session prepared (-s14/next/README.md), two rounds each:
#  1. f16 (and bf16 as the control) at H = 16384, 4096 / 8192 rows: the table's four CTAs of
#     256 vs one CTA of 512 holding four vectors (FP4NORM_TUNE_SHAPE=512,1,1);
#  2. f16 2048 x 32768: eight CTAs of 256 vs one CTA of 1024 holding four vectors.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
V=.artifacts/variants-s15
s0=$(date +%s)
mkdir -p "$OUT/ab1" "$OUT/ab2"
OUT=$OUT/ab1 AB_VARIANTS="$V/a-default.env $V/b-one-cta-512.env" AB_ROUNDS=2 \
AB_SETS="--dtype f16 --m 4096,8192 --h 16384 --layout row-major
--dtype bf16 --m 4096,8192 --h 16384 --layout row-major" timeout 250 bash scripts/gpu-check.sh ab 2>&1 | grep -v '^round' | tail -14
echo "[t+$(( $(date +%s) - s0 ))s] ab2"
OUT=$OUT/ab2 AB_VARIANTS="$V/a-default.env $V/c-one-cta-1024.env" AB_ROUNDS=2 \
AB_SETS="--dtype f16 --m 2048 --h 32768 --layout row-major
--dtype bf16 --m 2048 --h 32768 --layout row-major" timeout 200 bash scripts/gpu-check.sh ab 2>&1 | grep -v '^round' | tail -10
echo "[t+$(( $(date +%s) - s0 ))s] done"
