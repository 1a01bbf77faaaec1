#!/usr/bin/env bash
# Builds, on this (GPU-less) machine, everything the GPU machine runs, into .artifacts/
# (git-ignored; name it in the device tool's `carry`):
#   .artifacts/bin/      release test binaries (gpu, ...) and the fp4norm CLI
#   .artifacts/kcache.tgz  sm_90 cubins of every sweep kernel (so the device compiles nothing)
#   .artifacts/peers/    the Triton/torch.compile speed peer from ../shared/peers
# Then, on the device: `bash scripts/gpu-check.sh [tests|sanitize|bench|peers|all]`.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
rm -rf .artifacts/bin
mkdir -p .artifacts/bin .artifacts/peers .dev/testbin

# NVRTC for the compile step: the PyPI wheel (no GPU needed).
# (Also when FP4NORM_NVRTC_DIR names a folder without NVRTC, e.g. an env file written for a
# checkout whose .dev/ has not been filled yet.)
if [ -z "${FP4NORM_NVRTC_DIR:-}" ] || ! ls "$FP4NORM_NVRTC_DIR"/libnvrtc.so.* > /dev/null 2>&1; then
  if [ ! -e .dev/nvrtc/nvidia/cu13/lib/libnvrtc.so.13 ]; then
    python3 -m pip install -q --no-deps --target .dev/nvrtc nvidia-cuda-nvrtc==13.0.88
  fi
  export FP4NORM_NVRTC_DIR=$root/.dev/nvrtc/nvidia/cu13/lib
fi

echo "== building release test binaries and the CLI"
cargo build --release -p fp4norm-cli
strip -o .artifacts/bin/fp4norm target/release/fp4norm
cargo test --release -p fp4norm --no-run 2>&1 | grep -E '^(error|warning: unused)' -A5 || true
cargo test --release -p fp4norm --no-run --message-format=json 2>/dev/null \
  | python3 -c '
import json, shutil, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        shutil.copy(m["executable"], ".dev/testbin/" + m["target"]["name"])

'

# Only the GPU tests travel (stripped: the 64 MiB limit on what the device tool carries).
strip -o .artifacts/bin/gpu .dev/testbin/gpu

echo "== precompiling the sweep kernels for sm_90 into .artifacts/kcache"
rm -rf .artifacts/kcache
FP4NORM_CACHE_DIR=$root/.artifacts/kcache FP4NORM_REQUIRE_NVRTC=1 FP4NORM_COMPILE_ARCHS=sm_90 .dev/testbin/kernels_compile --nocapture 2>&1 | grep -E "kernel compile check|test result"
rm -rf .artifacts/kcache/sm_100a   # the H200 needs only sm_90
# Packed: the cubins compress to a third, and the device tool carries at most 64 MiB
# (gpu-check.sh unpacks it on the device).
tar czf .artifacts/kcache.tgz -C .artifacts kcache && rm -rf .artifacts/kcache

if [ -d ../shared/peers ]; then cp ../shared/peers/*.py .artifacts/peers/; fi
du -sh .artifacts
