#!/usr/bin/env bash
# Session 9, call 4 (c8ae35e): compute-sanitizer over the forced exact path (the redo now
# reads the __grid_constant__ parameters by address) and the normal path; the Python suite
# with a wheel of c8ae35e; M = 1 / 16 small rows again, three runs (the report's 16 x 8192).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_REQUIRE_GPU=1 FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
for knob in 1 0; do
  for tool in memcheck racecheck synccheck; do
    FP4NORM_FORCE_EXACT_SUMSQ=$knob FP4NORM_CACHE_DIR=/tmp/kcache-$knob FP4NORM_GPU_SWEEP=small timeout 60 compute-sanitizer --tool $tool --error-exitcode 9 .artifacts/bin/gpu --test-threads=1 gpu_sweep gpu_edge_cases > "$OUT/sanitize-knob$knob-$tool.log" 2>&1
    echo "knob $knob $tool exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' "$OUT/sanitize-knob$knob-$tool.log" | tr '\n' ' ') [t+$(( $(date +%s) - s0 ))s]"
  done
done
pip install -q --no-deps --no-index --target /tmp/pyfp .artifacts/wheel-s9/*.whl > /dev/null 2>&1
FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache PYTHONPATH=/tmp/pyfp timeout 80 python3 -m pytest -q -rs -s crates/fp4norm-py/python/tests > "$OUT/python-pytest.log" 2>&1
grep -E "growth per|passed|failed" "$OUT/python-pytest.log" | cut -c1-300 | tail -3
echo "[t+$(( $(date +%s) - s0 ))s] small rows"
for r in 1 2 3; do
  FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache timeout 60 .artifacts/bin/fp4norm bench --device cuda --m 1,16 --h 5120,7168,8192 --layout row-major --copy-mib 1024 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ |copy baseline" | sed "s/^/run $r | /"
done | tee "$OUT/small-rows.log"
echo "[t+$(( $(date +%s) - s0 ))s] done"
