#!/usr/bin/env bash
# Session 15, call 4 (88ab7b4): A/B of forced launch shapes at the target cells that still
# miss 94 % in calls 2-3 and whose shapes were last tuned before the L2 prefetch (fifth
# session): H = 5120 at 8192 / 16384 rows, 4096 x 8192, 2048 x 16384 and 1024 x 32768.
# NVFP4 row-major, bf16 and f16, one binary, two rounds; G,R,C = threads per row, rows per
# CTA, CTAs per row (a shape that does not fit runs the table's).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
V=.artifacts/variants-s15
s0=$(date +%s)
mkdir -p "$OUT/h5120" "$OUT/h8192" "$OUT/long"
OUT=$OUT/h5120 AB_VARIANTS="$V/a-default.env $V/s-160x1x2.env $V/s-320x1x1.env $V/s-160x1x1.env $V/s-160x2x1.env" AB_ROUNDS=2 \
AB_SETS="--dtype bf16 --dtype f16 --m 8192,16384 --h 5120 --format nvfp4 --layout row-major" timeout 200 bash scripts/gpu-check.sh ab 2>&1 | grep -v '^round' | sed -n '/^graph-replay/,/^$/p'
echo "[t+$(( $(date +%s) - s0 ))s] h8192"
OUT=$OUT/h8192 AB_VARIANTS="$V/a-default.env $V/s-512x1x1.env $V/s-256x1x1.env $V/s-128x1x2.env" AB_ROUNDS=2 \
AB_SETS="--dtype bf16 --dtype f16 --m 4096 --h 8192 --format nvfp4 --layout row-major" timeout 120 bash scripts/gpu-check.sh ab 2>&1 | grep -v '^round' | sed -n '/^graph-replay/,/^$/p'
echo "[t+$(( $(date +%s) - s0 ))s] long rows"
OUT=$OUT/long AB_VARIANTS="$V/a-default.env $V/s-512x1x1.env $V/s-512x1x2.env $V/s-256x1x2.env $V/s-1024x1x1.env $V/s-512x1x4.env" AB_ROUNDS=2 \
AB_SETS="--dtype bf16 --dtype f16 --m 2048 --h 16384 --format nvfp4 --layout row-major
--dtype bf16 --dtype f16 --m 1024 --h 32768 --format nvfp4 --layout row-major" timeout 220 bash scripts/gpu-check.sh ab 2>&1 | grep -v '^round' | sed -n '/^graph-replay/,/^$/p'
echo "[t+$(( $(date +%s) - s0 ))s] done"
