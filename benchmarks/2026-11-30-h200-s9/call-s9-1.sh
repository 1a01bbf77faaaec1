#!/usr/bin/env bash
# Session 9, call 1: GPU suite (main's kernel); Python suite on the GPU (wheel of e40873f);
# A/B main / __grid_constant__ redo / launch bounds at 48 registers (2 rounds).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
timeout 100 bash scripts/gpu-check.sh tests 2>&1 | tail -6
echo "[t+$(( $(date +%s) - s0 ))s] python"
pip install -q --no-deps --no-index --target /tmp/pyfp .artifacts/wheel-s9/*.whl > /dev/null 2>&1
FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache PYTHONPATH=/tmp/pyfp timeout 120 python3 -m pytest -q -rs crates/fp4norm-py/python/tests > "$OUT/python-pytest.log" 2>&1
tail -8 "$OUT/python-pytest.log"
echo "[t+$(( $(date +%s) - s0 ))s] ab"
AB_VARIANTS=".artifacts/variants-s9/a-main.env .artifacts/variants-s9/b-gridconst.cu .artifacts/variants-s9/c-lb48.cu" AB_ROUNDS=2 \
AB_SETS="--m 16384 --h 4096,8192 --layout row-major
--m 8192 --h 8192 --layout row-major
--m 4096 --h 7168 --layout row-major
--m 1024 --h 2048,4096 --layout row-major
--m 128 --h 8192 --layout row-major
--m 1,16 --h 4096,8192 --layout row-major" timeout $(( 585 - ($(date +%s) - s0) )) bash scripts/gpu-check.sh ab 2>&1 | tail -32
echo "[t+$(( $(date +%s) - s0 ))s] done"
