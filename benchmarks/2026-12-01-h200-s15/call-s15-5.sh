#!/usr/bin/env bash
# Session 15, call 5 (8c2caa7: the host passes FP4_HOLD_IN_REGS / FP4_MIN_CTAS; cubins
# byte-identical to 88ab7b4's here): the GPU suite on HEAD's binaries, with a count of the
# kernels the device had to compile (0 expected: the carried cache holds every sweep kernel
# under the new keys), then a short bench of cells timed in call 2 as a sanity check.
set -u
cd "$(dirname "$0")/.."
export FP4NORM_NVRTC_DIR=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
export FP4NORM_REQUIRE_GPU=1 FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
[ -d .artifacts/kcache ] || tar xzf .artifacts/kcache.tgz -C .artifacts
before=$(ls .artifacts/kcache/sm_90 | wc -l)
s0=$(date +%s)
timeout 150 .artifacts/bin/gpu --test-threads=3 > "$OUT/gpu-tests-5.log" 2>&1
grep -E "test result|panicked|^FAIL" "$OUT/gpu-tests-5.log" | head
echo "cache entries: $before before the tests, $(ls .artifacts/kcache/sm_90 | wc -l) after"
echo "[t+$(( $(date +%s) - s0 ))s] bench"
.artifacts/bin/fp4norm bench --device cuda --copy-mib 2048 --layout row-major --m 1,16,128,16384 --h 4096,8192 --json "$OUT/bench-5.json" > "$OUT/bench-5.log" 2>&1
.artifacts/bin/fp4norm bench --device cuda --copy-mib 2048 --layout row-major --dtype f16 --m 8192 --h 16384 >> "$OUT/bench-5.log" 2>&1
grep -E "^ +[0-9]+ +[0-9]+ |copy baseline|FAIL|mismatch" "$OUT/bench-5.log"
echo "[t+$(( $(date +%s) - s0 ))s] done"
