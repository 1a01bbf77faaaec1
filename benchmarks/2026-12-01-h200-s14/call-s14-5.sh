#!/usr/bin/env bash
# Session 14, call 5 (47762c6): f16 at H = 16384 / 32768 runs 90.5-93.9 % at 4096 / 8192 rows
# (call 4) where bf16 runs 95-97 %: A/B of the launch shapes there (default: 256 x 4 / 256 x 8
# clusters; two CTAs of 512; one CTA of 1024), NVFP4, 2 rounds.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
V=.artifacts/variants-s14
AB_VARIANTS="$V/s0-default.env $V/s2-c2x512.env $V/s3-t1024.env" AB_ROUNDS=2 \
AB_SETS="--dtype f16 --m 4096,8192 --h 16384,32768 --format nvfp4 --layout row-major" timeout 200 bash scripts/gpu-check.sh ab 2>&1 | grep -v '^round' | tail -8
