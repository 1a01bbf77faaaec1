#!/usr/bin/env bash
# Session 15, call 8 (same build as calls 6-7): H = 5120 as the table now runs it, bf16 and
# f16, 8192 / 16384 rows, every layout (the swizzled write on the new (320, 1, 1) shape).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
.artifacts/bin/fp4norm bench --device cuda --copy-mib 2048 --dtype bf16 --dtype f16 --m 8192,16384 --h 5120 --layout row-major,swizzled,both --json "$OUT/h5120-8.json" > "$OUT/h5120-8.log" 2>&1
grep -E "^ +[0-9]+ +[0-9]+ |copy baseline|FAIL|mismatch" "$OUT/h5120-8.log"
