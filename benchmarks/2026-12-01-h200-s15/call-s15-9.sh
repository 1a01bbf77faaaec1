#!/usr/bin/env bash
# Session 15, call 9 (5d7b203's code, HEAD 77a411f): the Python suite on a wheel of HEAD.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
pip install -q --no-deps --no-index --target /tmp/pyfp .artifacts/wheel-s15/*.whl 2>&1 | grep -v WARNING | tail -2
PYTHONPATH=/tmp/pyfp timeout 200 python3 -m pytest -q crates/fp4norm-py/python/tests > "$OUT/python-9.log" 2>&1
tail -3 "$OUT/python-9.log"
