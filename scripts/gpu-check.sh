#!/usr/bin/env bash
# Runs on the GPU machine over a working tree carrying .artifacts/ (see gpu-build.sh).
# Usage: bash scripts/gpu-check.sh [tests] [concurrency] [sanitize] [bench] [layouts] [peers] [all]
#        bash scripts/gpu-check.sh tune | nanexp     (measurements, not in `all`)
# Logs go to $OUT (the device tool brings them back); a short summary prints last.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/fp4norm-out}
mkdir -p "$out"
export FP4NORM_REQUIRE_GPU=1
export FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
export PYTHONUNBUFFERED=1
# NVRTC of the torch wheel, for specialisations not in the carried cache (tuning runs).
export FP4NORM_NVRTC_DIR=${FP4NORM_NVRTC_DIR:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
bin=.artifacts/bin
modes=${*:-all}
has() { [[ " $modes " == *" $1 "* || " $modes " == *" all "* ]]; }
summary=()

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

if has tests; then
  echo "== GPU tests (byte-exact against the CPU reference)"
  start=$(date +%s)
  "$bin/gpu" --test-threads=3 --nocapture 2>&1 | tee "$out/gpu-tests.log" | grep -E "^(FAIL|GPU:|FP4NORM_SEED|test |graph|[0-9]+ cases)|test result|panicked" | head -80
  summary+=("tests: $(grep 'test result' "$out/gpu-tests.log" | tail -1) ($(( $(date +%s) - start ))s)")
fi

if has concurrency; then
  echo "== concurrency: 12 threads x many specialisations, empty disk cache, two processes at once"
  cdir=$(mktemp -d)
  FP4NORM_CACHE_DIR=$cdir "$bin/gpu" gpu_many_threads_many_specialisations --nocapture > "$out/concurrency-a.log" 2>&1 &
  FP4NORM_CACHE_DIR=$cdir "$bin/gpu" gpu_many_threads_many_specialisations --nocapture > "$out/concurrency-b.log" 2>&1
  wait
  cat "$out/concurrency-a.log" "$out/concurrency-b.log" > "$out/concurrency.log"; rm -f "$out"/concurrency-[ab].log
  grep -E "threads x|test result|panicked" "$out/concurrency.log"
  summary+=("concurrency (2 processes, fresh cache $(ls $cdir/sm_90 | grep -c cubin) cubins): $(grep -c 'test result: ok' "$out/concurrency.log")/2 ok")
  # each process saw an empty cache
  if [ "$(ls $cdir/sm_90 | grep -c tmp)" != 0 ]; then summary+=("concurrency: temporary files left in the cache"); fi
fi

if [[ " $modes " == *" tune "* ]]; then
  # Launch shapes against the default, one bench row each (nvfp4, row-major unless
  # TUNE_FORMAT / TUNE_LAYOUT say otherwise, or a line's fourth field). Each line:
  # M H LAYOUT SHAPE... where a shape is G,R,C (FP4NORM_TUNE_SHAPE); "default" comes first.
  echo "== launch-shape tuning"
  : > "$out/tune.log"
  while read -r m h layout shapes; do
    [ -z "$m" ] && continue
    for sh in default $shapes; do
      unset FP4NORM_TUNE_SHAPE
      [ "$sh" != default ] && export FP4NORM_TUNE_SHAPE=$sh
      line=$("$bin/fp4norm" bench --device cuda --m "$m" --h "$h" --format ${TUNE_FORMAT:-nvfp4} --layout "$layout" --copy-mib 1024 2>&1 | grep -E "^ +$m +$h |does not fit" | tr -s ' ' | tr '\n' ' ')
      echo "TUNE $m $h $layout $sh | $line" | tee -a "$out/tune.log"
    done
    unset FP4NORM_TUNE_SHAPE
  done <<< "${TUNE_SHAPES:-$(cat scripts/tune-shapes.txt)}"
fi

if [[ " $modes " == *" nanexp "* ]]; then
  echo "== experiment: kernels without the NaN fix-up (do the packed add/cvt give 0x7FFF?)"
  FP4NORM_ASSUME_HW_CANONICAL_NAN=1 FP4NORM_CACHE_DIR=/tmp/kcache-nan "$bin/gpu" --test-threads=3 gpu_edge_cases gpu_sweep 2>&1 | tee "$out/nanexp.log" | grep -E "^FAIL|test result" | head -20
  summary+=("no-NaN-fix-up experiment: $(grep 'test result' "$out/nanexp.log" | tail -1)")
fi

if has sanitize; then
  for tool in memcheck racecheck synccheck; do
    # SANITIZE_SWEEP=full: the whole sweep (bf16, f16, edge cases) and the graph test.
    sweep=${SANITIZE_SWEEP:-small}
    tests="gpu_sweep_bf16 gpu_graph"
    if [ "$sweep" = full ]; then tests="gpu_sweep gpu_edge_cases gpu_graph"; fi
    echo "== compute-sanitizer $tool ($sweep sweep: $tests)"
    FP4NORM_GPU_SWEEP=$sweep timeout ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool $tool --error-exitcode 9 "$bin/gpu" --test-threads=1 $tests > "$out/sanitize-$tool.log" 2>&1
    rc=$?
    tail -3 "$out/sanitize-$tool.log"
    summary+=("sanitizer $tool: exit $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-$tool.log" | tail -1)")
  done
fi

if has bench; then
  echo "== fp4norm bench --device cuda"
  "$bin/fp4norm" bench --device cuda ${BENCH_ARGS:-} --json "$out/bench.json" 2>&1 | tee "$out/bench.log" | tail -60
  summary+=("bench: see bench.log")
fi

if has layouts; then
  echo "== layouts and y_out: cost next to row-major"
  "$bin/fp4norm" bench --device cuda --m ${LAYOUT_M:-1024,16384} --h ${LAYOUT_H:-4096,8192} --layout row-major,swizzled,both --json "$out/layouts.json" 2>&1 | tee "$out/layouts.log" | grep -v "^\[" | tail -30
  "$bin/fp4norm" bench --device cuda --m ${LAYOUT_M:-1024,16384} --h ${LAYOUT_H:-4096,8192} --layout row-major --y-out --json "$out/yout.json" 2>&1 | tee "$out/yout.log" | grep -v "^\[" | tail -12
fi

if has peers; then
  echo "== Triton / torch.compile peers"
  python3 .artifacts/peers/triton_peer.py ${PEER_SHAPES:-} 2>&1 | grep -v agreement | tee "$out/peers.log" | tail -40
fi

echo
echo "== summary"
for s in "${summary[@]}"; do echo "$s"; done
