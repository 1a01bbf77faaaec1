#!/usr/bin/env bash
# Session 12, call 3 (the direct swizzled write's words kept in L2 from 8192 rows; split
# only from 8 MiB of scales): GPU suite (+ the bf16 sweep with the split forced),
# compute-sanitizer (memcheck with the L2-kept words forced on every swizzled case,
# racecheck, synccheck), then the A/B of the two thresholds: a (the new default) / k (kept
# words, direct everywhere: FP4NORM_SWIZZLE_KEEP=1 FP4NORM_SWIZZLE_SPLIT=0), 2 rounds.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
timeout 120 bash scripts/gpu-check.sh tests 2>&1 | tail -4
for tool in memcheck racecheck synccheck; do
  knob=""; [ $tool = memcheck ] && knob="FP4NORM_SWIZZLE_KEEP=1"
  env $knob FP4NORM_GPU_SWEEP=small timeout 95 compute-sanitizer --tool $tool --error-exitcode 9 .artifacts/bin/gpu --test-threads=1 gpu_sweep gpu_edge_cases > "$OUT/sanitize-$tool.log" 2>&1
  echo "$tool ($knob) exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/sanitize-$tool.log" | tr '\n' ' ') [t+$(( $(date +%s) - s0 ))s]"
done
V=.artifacts/variants-s12
AB_VARIANTS="$V/a-main.env $V/k-keep-direct.env" AB_ROUNDS=2 \
AB_SETS="--m 2048,4096 --h 2048,4096,8192 --layout row-major,swizzled
--m 16384 --h 8192,16384 --layout swizzled
--m 8192 --h 16384 --layout swizzled" timeout 240 bash scripts/gpu-check.sh ab 2>&1 | tail -24
echo "[t+$(( $(date +%s) - s0 ))s] done"
