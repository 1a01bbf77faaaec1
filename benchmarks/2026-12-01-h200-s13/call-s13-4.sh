#!/usr/bin/env bash
# Session 13, call 4 (store pointers pinned; L2 prefetch one resident wave ahead from 2^25
# elements where rows stay in registers; the capture test serialised against fresh
# contexts): the whole issue-4 report (GPU suite, main table, Triton peer, layouts, y_out,
# PDL, H = 32768, f16), the GPU suite with FP4NORM_L2_PREFETCH_ROWS=1, then the Python suite.
set -u
cd "$(dirname "$0")/.."
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
REPORT_DEADLINE=370 bash scripts/gpu-check.sh report 2>&1 | tail -25
echo "[t+$(( $(date +%s) - s0 ))s] suite with every row prefetching the next"
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
FP4NORM_L2_PREFETCH_ROWS=1 timeout 70 .artifacts/bin/gpu --test-threads=3 > "$OUT/gpu-tests-prefetch1-4.log" 2>&1
grep -E "test result|panicked|^FAIL" "$OUT/gpu-tests-prefetch1-4.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] python"
pip install -q --no-deps --no-index --target /tmp/pyfp .artifacts/wheel-s13/*.whl > /dev/null 2>&1
PYTHONPATH=/tmp/pyfp timeout 60 python3 -m pytest -q -rs -s crates/fp4norm-py/python/tests > "$OUT/python-pytest.log" 2>&1
grep -E "growth per|passed|failed" "$OUT/python-pytest.log" | cut -c1-300 | tail -3
echo "[t+$(( $(date +%s) - s0 ))s] done"
