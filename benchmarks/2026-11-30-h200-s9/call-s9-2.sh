#!/usr/bin/env bash
# Session 9, call 2: A/B main / __grid_constant__ redo / that + launch bounds at 48
# registers (2 rounds, more shapes, f16); GPU suite and the forced exact path (with the
# redo of pass 2) on variant d's source; the Python suite (fixed tests) on the GPU.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
AB_VARIANTS=".artifacts/variants-s9/a-main.env .artifacts/variants-s9/b-gridconst.cu .artifacts/variants-s9/d-gridconst-lb48.cu" AB_ROUNDS=2 \
AB_SETS="--m 16384 --h 2048,4096,8192 --layout row-major
--m 16384 --h 16384 --layout row-major
--m 16384 --h 4096 --layout swizzled
--m 16384 --h 4096 --dtype f16 --layout row-major
--m 8192 --h 8192 --layout row-major
--m 4096 --h 5120,7168 --layout row-major
--m 1024 --h 2048,4096,8192 --layout row-major
--m 128 --h 4096,8192 --layout row-major
--m 1,16 --h 2048,4096,8192 --layout row-major" timeout 260 bash scripts/gpu-check.sh ab 2>&1 | tail -42
echo "[t+$(( $(date +%s) - s0 ))s] exactpath on d"
FP4NORM_KERNEL_SOURCE=$PWD/.artifacts/variants-s9/d-gridconst-lb48.cu timeout 250 bash scripts/gpu-check.sh exactpath 2>&1 | tail -8
echo "[t+$(( $(date +%s) - s0 ))s] python"
pip install -q --no-deps --no-index --target /tmp/pyfp .artifacts/wheel-s9/*.whl > /dev/null 2>&1
FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache PYTHONPATH=/tmp/pyfp timeout 80 python3 -m pytest -q -rs -s crates/fp4norm-py/python/tests > "$OUT/python-pytest.log" 2>&1
grep -E "growth per|passed|failed" "$OUT/python-pytest.log" | cut -c1-400 | tail -4
echo "[t+$(( $(date +%s) - s0 ))s] done"
