#!/usr/bin/env bash
# Session 12, call 5 (ef584e2): the forced exact path (every row through the exact sum of
# squares and the redo of pass 2, whose swizzled words now take the kept store too).
set -u
cd "$(dirname "$0")/.."
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
timeout 170 bash scripts/gpu-check.sh exactpath 2>&1 | tail -3
echo "[t+$(( $(date +%s) - s0 ))s] done"
