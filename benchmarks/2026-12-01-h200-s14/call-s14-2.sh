#!/usr/bin/env bash
# Session 14, call 2 (the launch table's new many-row splits): the sweeps, edge cases and
# the new many-row-shape test with the L2 prefetch of the next row forced, then the whole
# report (tests, main table, peers, layouts, y_out, PDL, H = 32768, f16).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
FP4NORM_L2_PREFETCH_ROWS=1 timeout 100 .artifacts/bin/gpu --test-threads=3 gpu_sweep gpu_edge_cases gpu_many_row_shapes --nocapture > "$OUT/gpu-tests-prefetch1-2.log" 2>&1
grep -E "test result|panicked|^FAIL|many-row shapes" "$OUT/gpu-tests-prefetch1-2.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] report"
REPORT_DEADLINE=420 timeout 520 bash scripts/gpu-check.sh report 2>&1 | tail -60
echo "[t+$(( $(date +%s) - s0 ))s] done"
