#!/usr/bin/env bash
# Session 10, call 4 (32f67a0): the 2^31-element test (FP4NORM_GPU_HUGE=1) and
# compute-sanitizer memcheck / racecheck / synccheck over the small sweep and the edge
# cases, with the carried kernel cache (the ninth session's cold-cache attempt timed out).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_REQUIRE_GPU=1 FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
s0=$(date +%s)
FP4NORM_GPU_HUGE=1 timeout 100 .artifacts/bin/gpu --test-threads=1 --nocapture gpu_huge_tensor_spot_rows > "$OUT/huge.log" 2>&1
echo "huge rc $? $(grep -E 'test result|elements|rows' "$OUT/huge.log" | tail -3 | tr '\n' ' ') [t+$(( $(date +%s) - s0 ))s]"
for tool in memcheck racecheck synccheck; do
  FP4NORM_GPU_SWEEP=small timeout 95 compute-sanitizer --tool $tool --error-exitcode 9 .artifacts/bin/gpu --test-threads=1 gpu_sweep gpu_edge_cases > "$OUT/sanitize-$tool.log" 2>&1
  echo "$tool exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/sanitize-$tool.log" | tr '\n' ' ') [t+$(( $(date +%s) - s0 ))s]"
done
echo "[t+$(( $(date +%s) - s0 ))s] done"
