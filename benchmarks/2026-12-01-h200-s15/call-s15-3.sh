#!/usr/bin/env bash
# Session 15, call 3 (88ab7b4): what call 2's report skipped at its deadline (f16 at 16384
# rows) and the other target cells it leaves out (f16 at 1024-8192 rows, bf16 and f16
# 2048 x 16384), then the Python suite on a wheel of 88ab7b4.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
b=.artifacts/bin/fp4norm
$b bench --device cuda --copy-mib 2048 --layout row-major --dtype f16 --m 16384 --h 2048,4096,5120,7168,8192,16384 --json "$OUT/f16-16384.json" > "$OUT/extra-3.log" 2>&1
$b bench --device cuda --copy-mib 2048 --layout row-major --dtype f16 --m 4096,8192 --h 4096,5120,7168,8192,16384,32768 --json "$OUT/f16-4096-8192.json" >> "$OUT/extra-3.log" 2>&1
$b bench --device cuda --copy-mib 2048 --layout row-major --dtype f16 --dtype bf16 --m 1024,2048 --h 16384,32768 --json "$OUT/rows-1024-2048.json" >> "$OUT/extra-3.log" 2>&1
grep -E "^ +[0-9]+ +[0-9]+ |copy|FAIL|mismatch" "$OUT/extra-3.log"
echo "[t+$(( $(date +%s) - s0 ))s] python"
pip install -q --no-deps --no-index --target /tmp/pyfp .artifacts/wheel-s15/*.whl 2>&1 | tail -2
PYTHONPATH=/tmp/pyfp timeout 200 python3 -m pytest -q crates/fp4norm-py/python/tests 2>&1 | tail -4
echo "[t+$(( $(date +%s) - s0 ))s] done"
