#!/usr/bin/env bash
# Session 14, call 3 (47762c6): compute-sanitizer (memcheck, racecheck, synccheck) over the
# small bf16 sweep, the graph test and the new many-row shapes (two CTAs of 512 holding
# four vectors, 224-thread pairs, ...); the exact-sum path forced on every row of the edge
# cases and the many-row shapes; then the Python suite on a wheel of 47762c6.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
mkdir -p "$OUT/san"
OUT=$OUT/san SANITIZE_TESTS="gpu_sweep_bf16 gpu_graph gpu_many_row_shapes" SANITIZE_TIMEOUT=115 bash scripts/gpu-check.sh sanitize 2>&1 | grep -E 'SUMMARY|test result|sanitizer|FAIL' | tail -12
echo "[t+$(( $(date +%s) - s0 ))s] exact path forced"
FP4NORM_FORCE_EXACT_SUMSQ=1 FP4NORM_CACHE_DIR=/tmp/kcache-exact timeout 120 .artifacts/bin/gpu --test-threads=4 gpu_edge_cases gpu_many_row_shapes --nocapture > "$OUT/exactpath-3.log" 2>&1
grep -E "^FAIL|test result|panicked|cases" "$OUT/exactpath-3.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] python"
pip install -q --no-deps --no-index --target /tmp/pyfp .artifacts/wheel-s14/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/pyfp timeout 70 python3 -m pytest -q -rs -s crates/fp4norm-py/python/tests > "$OUT/python-3.log" 2>&1
grep -E "passed|failed" "$OUT/python-3.log" | cut -c1-300 | tail -3
echo "[t+$(( $(date +%s) - s0 ))s] done"
