#!/usr/bin/env bash
# Session 14, call 1 (HEAD 18b90be): zero-code and prepared A/Bs, two rounds each, NVFP4.
#  ab-h32768: H = 32768's launch shape now that held rows get the L2 prefetch (forced shapes
#             256x8 cluster, 512x2 cluster, 1024 threads, 256x4 cluster) and reread-keep.cu
#             (pass 1's h evict-last, pass 2's re-read evict-first) at prefetch 0 / 8 MiB / wave
#  ab-h16384: H = 16384 at 4096 / 8192 rows: 1024 threads, 256x4 and 256x8 clusters
#  ab-h7168, ab-h5120: 8192 rows' shapes at those H
#  ab-smallm: 557926b's kernel source against HEAD at M = 1, 16 (3 rounds)
#  ab-swz: swizzled words kept / prefetch, off and on
#  ab-pf: the prefetch below 2^25 elements with the landed placement
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
s0=$(date +%s)
V=.artifacts/variants-s14
ab() { # name rounds "variants" "sets"
  echo "[t+$(( $(date +%s) - s0 ))s] $1"
  mkdir -p "$OUT/$1"
  OUT=$OUT/$1 AB_VARIANTS="$3" AB_ROUNDS=$2 AB_SETS="$4" timeout 200 bash scripts/gpu-check.sh ab 2>&1 | grep -v '^round' | tail -12
}
ab ab-h32768 2 "$V/s0-default.env $V/s1-c8x256.env $V/s2-c2x512.env $V/s3-t1024.env $V/s4-c4x256.env $V/s5-rk-p0.env $V/s6-rk-p8.env $V/s7-rk-pw.env" \
  "--m 4096,8192,16384 --h 32768 --format nvfp4 --layout row-major"
ab ab-h16384 2 "$V/s0-default.env $V/h1-t1024.env $V/h2-c4x256.env $V/h3-c8x256.env" \
  "--m 4096,8192 --h 16384 --format nvfp4 --layout row-major"
ab ab-h7168 2 "$V/s0-default.env $V/g1-448.env $V/g2-c2x224.env" "--m 4096,8192 --h 7168 --format nvfp4 --layout row-major"
ab ab-h5120 2 "$V/s0-default.env $V/f1-320.env $V/f2-160.env" "--m 4096,8192 --h 5120 --format nvfp4 --layout row-major"
ab ab-smallm 3 "$V/s0-default.env $V/m1-557926b.env" "--m 1,16 --h 4096,7168,8192 --format nvfp4 --layout row-major"
ab ab-swz 2 "$V/a-default.env $V/k0-keep-off.env $V/p0-prefetch-off.env $V/k0p0-both-off.env" \
  "--m 8192,16384 --h 4096,8192 --format nvfp4 --layout swizzled"
ab ab-pf 2 "$V/s0-default.env $V/p0-prefetch-off.env $V/pw-prefetch-wave.env" \
  "--m 2048,4096 --h 4096,5120,7168 --format nvfp4 --layout row-major
--m 1024 --h 16384,32768 --format nvfp4 --layout row-major"
echo "[t+$(( $(date +%s) - s0 ))s] done"
