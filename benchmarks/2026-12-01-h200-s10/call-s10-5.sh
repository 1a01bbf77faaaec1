#!/usr/bin/env bash
# Session 10, call 5 (32f67a0): the two Triton-peer shapes below 1.2x in call 3's report,
# twice each, fp4norm and the peer alternating in one run (their spread).
set -u
cd "$(dirname "$0")/.."
export FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
s0=$(date +%s)
for r in 1 2; do
  timeout 60 .artifacts/bin/fp4norm bench --device cuda --m 8192,16384 --h 4096,8192 --layout row-major --copy-mib 1024 2>&1 | grep -E "^ +[0-9]+ +[0-9]+ |copy baseline" | sed "s/^/fp4norm $r | /"
  timeout 90 python3 .artifacts/peers/triton_peer.py 8192x8192 16384x4096 2>&1 | grep -v agreement | sed "s/^/triton $r | /"
  echo "[t+$(( $(date +%s) - s0 ))s]"
done | tee "$OUT/peer-spread.log" | grep -E "nvfp4|mxfp4|copy|t\+" | cut -c1-160
