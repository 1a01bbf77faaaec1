#!/usr/bin/env bash
# Session 15, call 2 (88ab7b4, f16 rows of 16384 in one CTA of 512 from 32 rows per SM): the
# whole report of HEAD in one run (tests, main table, peers, layouts, y_out, PDL, H = 32768,
# f16), for issue 4's closing table.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
REPORT_DEADLINE=430 timeout 570 bash scripts/gpu-check.sh report 2>&1 | tail -70
echo "[t+$(( $(date +%s) - s0 ))s] done"
