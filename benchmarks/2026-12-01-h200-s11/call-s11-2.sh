#!/usr/bin/env bash
# Session 11, call 2: scale layouts. A/B a (HEAD) / d (HEAD + the swizzled word gathered
# with two shuffles instead of three) / e (HEAD with every swizzled write split, MXFP4
# included: FP4NORM_SWIZZLE_SPLIT=1) / f (c-lanestore + d + the swizzled word address per lane),
# row-major, swizzled and both, 2 rounds.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
V=.artifacts/variants-s11
AB_VARIANTS="$V/a-main.env $V/d-swz2.cu $V/e-split.env $V/f-lane-swz.cu" AB_ROUNDS=2 \
AB_SETS="--m 1024,8192,16384 --h 4096,8192 --layout row-major,swizzled,both" timeout 450 bash scripts/gpu-check.sh ab 2>&1 | tail -40
echo "[t+$(( $(date +%s) - s0 ))s] done"
