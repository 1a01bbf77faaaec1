#!/usr/bin/env bash
# Session 13, call 1 (build of 61df049): the GPU suite on HEAD (its kernel source differs
# from ef584e2's only by the l2_evict_last_policy() helper), then an A/B, 2 rounds:
# a (HEAD) / f (x and r of the row one resident wave ahead prefetched into L2 by
# cp.async.bulk.prefetch.L2 at each CTA's start) / p (-s12/next/pinned-store-pointers.diff:
# pass 2's store pointers pinned in registers by empty asm), both as kernel-source variants.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
timeout 120 .artifacts/bin/gpu --test-threads=3 > "$OUT/gpu-tests-1.log" 2>&1
grep -E "test result|panicked|^FAIL" "$OUT/gpu-tests-1.log" | head
echo "[t+$(( $(date +%s) - s0 ))s] ab"
V=.artifacts/variants-s13
AB_VARIANTS="$V/a-main.env $V/f-l2-prefetch.cu $V/p-pinned.cu" AB_ROUNDS=2 \
AB_SETS="--m 1,16 --h 4096,7168 --layout row-major
--m 128 --h 8192 --layout row-major,swizzled,both
--m 1024 --h 4096 --layout row-major,swizzled,both
--m 1024 --h 8192 --layout row-major
--m 16384 --h 4096 --layout row-major,swizzled
--m 16384 --h 5120,7168,8192,16384 --layout row-major" timeout 420 bash scripts/gpu-check.sh ab 2>&1 | tail -46
echo "[t+$(( $(date +%s) - s0 ))s] done"
