#!/usr/bin/env bash
# Builds, on a machine without a GPU or CUDA toolkit, everything a GPU machine without a
# Rust toolchain runs, into .artifacts/ (git-ignored; copy it along with the tree):
#   .artifacts/bin/        release test binaries (gpu, gpu_fp8, gpu_allreduce, gpu_nccl) and the fp4norm CLI
#   .artifacts/kcache.tgz  sm_90 cubins of every sweep kernel (so the GPU machine compiles nothing)
#   .artifacts/wheel/      the Python module's wheel (pip wheel .)
#   .artifacts/peers/      the Triton/torch.compile speed peer of the FP4 op (scripts/triton_peer.py)
#   .artifacts/flashinfer/ FlashInfer's fp4 norm test files, when FLASHINFER_SRC names a checkout
# Then, there: `bash scripts/gpu-check.sh [tests|sanitize|bench|python|peers|all]`.
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

# Only the GPU tests travel, stripped (what a remote run may carry can be limited in size).
strip -o .artifacts/bin/gpu .dev/testbin/gpu
strip -o .artifacts/bin/gpu_fp8 .dev/testbin/gpu_fp8
strip -o .artifacts/bin/gpu_allreduce .dev/testbin/gpu_allreduce
strip -o .artifacts/bin/gpu_nccl .dev/testbin/gpu_nccl

echo "== precompiling the sweep kernels for sm_90 into .artifacts/kcache"
rm -rf .artifacts/kcache
FP4NORM_CACHE_DIR=$root/.artifacts/kcache FP4NORM_REQUIRE_NVRTC=1 FP4NORM_COMPILE_ARCHS=sm_90 .dev/testbin/kernels_compile every_sweep_kernel_compiles_without_spills --nocapture 2>&1 | grep -E "kernel compile check|test result"
rm -rf .artifacts/kcache/sm_100a   # the H200 needs only sm_90
# Packed: the cubins compress to a third (gpu-check.sh unpacks them there).
tar czf .artifacts/kcache.tgz -C .artifacts kcache && rm -rf .artifacts/kcache

echo "== the Python module's wheel"
rm -rf .artifacts/wheel
python3 -m pip wheel -q --no-deps . -w .artifacts/wheel

cp scripts/triton_peer.py .artifacts/peers/
rm -rf .artifacts/flashinfer
if [ -n "${FLASHINFER_SRC:-}" ]; then
  mkdir -p .artifacts/flashinfer/tests/norm
  cp -r "$FLASHINFER_SRC/tests/test_helpers" .artifacts/flashinfer/tests/
  cp "$FLASHINFER_SRC"/tests/norm/test_*rmsnorm_fp4_quant_cute_dsl.py .artifacts/flashinfer/tests/norm/
fi
du -sh .artifacts
