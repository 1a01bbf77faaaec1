#!/usr/bin/env bash
# Session 12, call 4 (the L2-kept direct swizzled words from 2^24 elements, split from 8 MiB
# of scales): the whole issue-4 report (GPU suite, main table, Triton peer, layouts, y_out,
# PDL, H = 32768, f16), then the Python suite with a wheel of this tree.
set -u
cd "$(dirname "$0")/.."
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
REPORT_DEADLINE=420 bash scripts/gpu-check.sh report 2>&1 | tail -25
echo "[t+$(( $(date +%s) - s0 ))s] python"
pip install -q --no-deps --no-index --target /tmp/pyfp .artifacts/wheel-s12/*.whl > /dev/null 2>&1
FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib PYTHONPATH=/tmp/pyfp timeout 90 python3 -m pytest -q -rs -s crates/fp4norm-py/python/tests > "$OUT/python-pytest.log" 2>&1
grep -E "growth per|passed|failed" "$OUT/python-pytest.log" | cut -c1-300 | tail -3
echo "[t+$(( $(date +%s) - s0 ))s] done"
