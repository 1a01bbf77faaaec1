#!/usr/bin/env bash
# Runs on the GPU machine over a working tree carrying .artifacts/ (see gpu-build.sh).
# Usage: bash scripts/gpu-check.sh [selftest] [tests] [cli] [exactpath] [concurrency] [sanitize] [bench] [layouts] [python] [example] [peers] [all]
#        bash scripts/gpu-check.sh tune | nanexp | ab | ncu   (measurements, not in `all`)
#        bash scripts/gpu-check.sh report   (every table of BENCHMARKS.md in one run: tests, main
#        table, layouts, y_out, f16, PDL chain, Triton peer -> $OUT/report.tgz + report.md)
#        bash scripts/gpu-check.sh fp8report   (the FP8 section: the FP8 suite, decode rows, two
#        rounds of large rows (the first checked), the Inductor peer -> $OUT/fp8report.tgz)
# Logs go to $OUT (default /tmp/fp4norm-out); a short summary prints last.
set -u
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/fp4norm-out}
mkdir -p "$out"
export FP4NORM_REQUIRE_GPU=1
export FP4NORM_CACHE_DIR=$PWD/.artifacts/kcache
# gpu-build.sh packs the cache; unpack it once.
if [ ! -d .artifacts/kcache ] && [ -f .artifacts/kcache.tgz ]; then tar xzf .artifacts/kcache.tgz -C .artifacts; fi
export PYTHONUNBUFFERED=1
# NVRTC of the torch wheel, for specialisations not in the carried cache (tuning runs).
export FP4NORM_NVRTC_DIR=${FP4NORM_NVRTC_DIR:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib}
bin=${GPU_CHECK_BIN:-.artifacts/bin}   # GPU_CHECK_BIN: binaries of another build (an experiment)
modes=${*:-all}
has() { [[ " $modes " == *" $1 "* || " $modes " == *" all "* ]]; }
summary=()

nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"

if has selftest; then
  # The conversion self-test, run afresh (FP4NORM_SELFTEST=rerun) and timed by `fp4norm
  # info`, whose CUDA line says which path runs and why; its verdict lands in the cache the
  # later steps read. Where it does not pass, the later steps run with the fast path forced
  # (FP4NORM_SELFTEST=hardware), so that they still test what they test, and say so.
  echo "== conversion self-test (fp4norm info)"
  start=$(date +%s%N)
  FP4NORM_SELFTEST=rerun "$bin/fp4norm" info 2>&1 | tee "$out/selftest.log" | grep -E "cuda|fp4norm:"
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  if grep -q "fast conversions: self-test passed" "$out/selftest.log"; then
    summary+=("self-test: passed, fp4norm info in ${ms} ms (incl. opening the device and compiling its kernels)")
  else
    export FP4NORM_SELFTEST=hardware
    summary+=("self-test: DID NOT PASS (see selftest.log); later steps forced FP4NORM_SELFTEST=hardware")
  fi
fi

if has tests; then
  echo "== GPU tests (byte-exact against the CPU reference)"
  start=$(date +%s)
  "$bin/gpu" --test-threads=3 --nocapture 2>&1 | tee "$out/gpu-tests.log" | grep -E "^(FAIL|GPU:|FP4NORM_SEED|test |graph|[0-9]+ cases)|test result|panicked" | head -80
  summary+=("tests: $(grep 'test result' "$out/gpu-tests.log" | tail -1) ($(( $(date +%s) - start ))s)")
  echo "== FP8 GPU tests (byte-exact against the reference)"
  start=$(date +%s)
  "$bin/gpu_fp8" --test-threads=2 --nocapture 2>&1 | tee "$out/gpu-fp8-tests.log" | grep -E "^(FAIL|GPU:|FP4NORM_SEED|test |FP8)|test result|panicked" | head -60
  summary+=("FP8 tests: $(grep 'test result' "$out/gpu-fp8-tests.log" | tail -1) ($(( $(date +%s) - start ))s)")
  echo "== fused all-reduce, simulated ranks (byte-exact against the reference)"
  start=$(date +%s)
  "$bin/gpu_allreduce" --nocapture 2>&1 | tee "$out/gpu-allreduce-tests.log" | grep -E "^(FAIL|FP4NORM_SEED|all-reduce)|test result|panicked" | head -40
  summary+=("all-reduce tests: $(grep 'test result' "$out/gpu-allreduce-tests.log" | tail -1) ($(( $(date +%s) - start ))s)")
  echo "== tensor parallel over NCCL (byte-exact against the reference)"
  # NCCL of the torch wheel where the system has none on the loader's path.
  if [ -z "${FP4NORM_NCCL_LIB:-}" ]; then
    FP4NORM_NCCL_LIB=$(ls /opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so* 2>/dev/null | head -1)
    export FP4NORM_NCCL_LIB
  fi
  start=$(date +%s)
  FP4NORM_REQUIRE_NCCL=1 "$bin/gpu_nccl" --nocapture 2>&1 | tee "$out/gpu-nccl-tests.log" | grep -E "^(FAIL|FP4NORM_SEED|NCCL|SKIPPED)|test result|panicked" | head -40
  summary+=("NCCL tests: $(grep 'test result' "$out/gpu-nccl-tests.log" | tail -1) ($(( $(date +%s) - start ))s)")
fi
# TESTS_EXTRA=0 leaves out the reruns with knobs forced (for runs after host-side changes
# only, where the kernels' machine code is unchanged).
if has tests && [ "${TESTS_EXTRA:-1}" != 0 ]; then
  # The split swizzled write is the default only from 8 MiB of scales, past every sweep
  # case: run the bf16 sweep again with it forced.
  start=$(date +%s)
  FP4NORM_SWIZZLE_SPLIT=1 "$bin/gpu" --test-threads=3 gpu_sweep_bf16 > "$out/gpu-tests-split.log" 2>&1
  grep -E "^FAIL|panicked" "$out/gpu-tests-split.log" | head -20
  summary+=("tests, split swizzled write forced: $(grep 'test result' "$out/gpu-tests-split.log" | tail -1) ($(( $(date +%s) - start ))s)")
  # The layouts' padding rows zeroed by CTAs of their own (the default spreads it over the
  # call's threads): the bf16 sweep, the edge cases and the FP8 suite with it forced.
  start=$(date +%s)
  FP4NORM_PAD_SPREAD=0 "$bin/gpu" --test-threads=3 gpu_sweep_bf16 gpu_edge_cases > "$out/gpu-tests-padctas.log" 2>&1
  grep -E "^FAIL|panicked" "$out/gpu-tests-padctas.log" | head -20
  FP4NORM_PAD_SPREAD=0 "$bin/gpu_fp8" --test-threads=3 > "$out/gpu-fp8-tests-padctas.log" 2>&1
  grep -E "^FAIL|panicked" "$out/gpu-fp8-tests-padctas.log" | head -20
  summary+=("tests, padding rows' own CTAs forced: $(grep 'test result' "$out/gpu-tests-padctas.log" | tail -1), FP8 $(grep 'test result' "$out/gpu-fp8-tests-padctas.log" | tail -1) ($(( $(date +%s) - start ))s)")
  # The split column-major FP8 write is the default only from 2^25 elements on fast DRAM, past the FP8
  # sweep: the FP8 suite again with it forced wherever the layout allows it.
  start=$(date +%s)
  FP4NORM_FP8_SCALES_SPLIT=1 "$bin/gpu_fp8" --test-threads=3 > "$out/gpu-fp8-tests-colsplit.log" 2>&1
  grep -E "^FAIL|panicked" "$out/gpu-fp8-tests-colsplit.log" | head -20
  summary+=("FP8 tests, split column-major write forced: $(grep 'test result' "$out/gpu-fp8-tests-colsplit.log" | tail -1) ($(( $(date +%s) - start ))s)")
  # The demotion of kept swizzled words runs only past a resident wave of rows, past every
  # sweep case: checked bench rows of 2048 rows with it forced (every row against the
  # reference).
  start=$(date +%s)
  FP4NORM_SWIZZLE_DEMOTE=1 "$bin/fp4norm" bench --device cuda --m 2048 --h 8192,16384 --layout swizzled,both --format nvfp4,mxfp4 --copy-mib 64 > "$out/demote-check.log" 2>&1
  summary+=("bench rows with the kept words' demotion forced, checked: $(tail -1 "$out/demote-check.log") ($(( $(date +%s) - start ))s)")
  # Likewise the kept FP8 column-major scales' demotion (from an eighth of the L2): the FP8
  # sweep with it forced (it runs in the sweep's column-major cases of 502 and 1027 rows)
  # and checked rows of f32 and UE8M0 scales at 2050 and 4101 rows.
  start=$(date +%s)
  FP4NORM_FP8_SCALES_DEMOTE=1 "$bin/gpu_fp8" --test-threads=3 gpu_fp8_sweep > "$out/gpu-fp8-tests-demote.log" 2>&1
  grep -E "^FAIL|panicked" "$out/gpu-fp8-tests-demote.log" | head -20
  FP4NORM_FP8_SCALES_DEMOTE=1 "$bin/fp4norm" bench --device cuda --m 2050,4101 --h 8192,16384 --format fp8-group128,fp8-g32-ue8m0-column-major --copy-mib 64 > "$out/fp8-demote-check.log" 2>&1
  summary+=("FP8 sweep and checked rows with the column-major demotion forced: $(grep 'test result' "$out/gpu-fp8-tests-demote.log" | tail -1); $(tail -1 "$out/fp8-demote-check.log") ($(( $(date +%s) - start ))s)")
  # Column-major FP8 scales are written as reductions only from 16 rows to one row per SM:
  # the FP8 suite with them forced wherever the fused kernel writes them (every row count,
  # several rows per CTA, the exact-sum redo's rewrite with FP4NORM_FORCE_EXACT_SUMSQ).
  start=$(date +%s)
  FP4NORM_FP8_SCALES_REDUCE=1 "$bin/gpu_fp8" --test-threads=3 > "$out/gpu-fp8-tests-reduce.log" 2>&1
  grep -E "^FAIL|panicked" "$out/gpu-fp8-tests-reduce.log" | head -20
  FP4NORM_FP8_SCALES_REDUCE=1 FP4NORM_FORCE_EXACT_SUMSQ=1 FP4NORM_CACHE_DIR=/tmp/kcache-exact "$bin/gpu_fp8" --test-threads=3 gpu_fp8_sweep > "$out/gpu-fp8-tests-reduce-exact.log" 2>&1
  grep -E "^FAIL|panicked" "$out/gpu-fp8-tests-reduce-exact.log" | head -20
  summary+=("FP8 tests with column-major reductions forced: $(grep 'test result' "$out/gpu-fp8-tests-reduce.log" | tail -1); with every row's exact sum too: $(grep 'test result' "$out/gpu-fp8-tests-reduce-exact.log" | tail -1) ($(( $(date +%s) - start ))s)")
  # The L2 prefetch runs only from 2^25 elements, past every sweep case: the sweeps, edge
  # cases and many-row shapes again with every row prefetching the next one (its addresses
  # in every kernel).
  start=$(date +%s)
  FP4NORM_L2_PREFETCH_ROWS=1 "$bin/gpu" --test-threads=3 gpu_sweep gpu_edge_cases gpu_many_row_shapes > "$out/gpu-tests-prefetch.log" 2>&1
  grep -E "^FAIL|panicked" "$out/gpu-tests-prefetch.log" | head -20
  summary+=("tests, L2 prefetch of the next row forced: $(grep 'test result' "$out/gpu-tests-prefetch.log" | tail -1) ($(( $(date +%s) - start ))s)")
fi

if has python; then
  # The wheel of gpu-build.sh in a private site folder (the machine's torch is used as is).
  echo "== Python module: its tests with CUDA, the torch operator's call cost, FlashInfer's tests"
  site=/tmp/fp4norm-site
  rm -rf "$site"
  python3 -m pip install -q --no-deps --no-index --target "$site" .artifacts/wheel/*.whl 2>&1 | grep -v WARNING | tail -2
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
  start=$(date +%s)
  # PYTEST_PATHS: test files (default: all); PYTEST_ARGS: more pytest arguments;
  # PYTEST_PROCS: pytest processes sharing the GPU (default 4), the files dealt out by size,
  # largest first, so that one serial run's time is not the step's limit.
  procs=${PYTEST_PROCS:-4}
  parts=$(cd crates/fp4norm-py && python3 - "$procs" ${PYTEST_PATHS:-python/tests} <<'PY'
import os, sys
n, paths = int(sys.argv[1]), sys.argv[2:]
files = []
for p in paths:
    if os.path.isdir(p):
        files += [os.path.join(p, f) for f in sorted(os.listdir(p)) if f.startswith("test_") and f.endswith(".py")]
    else:
        files.append(p)
load, parts = [0] * n, [[] for _ in range(n)]
for f in sorted(files, key=os.path.getsize, reverse=True):
    k = load.index(min(load))
    load[k] += os.path.getsize(f)
    parts[k].append(f)
print("\n".join(" ".join(p) for p in parts if p))
PY
)
  rm -f "$out"/python-tests-*.log
  k=0
  while read -r part; do
    (cd crates/fp4norm-py && timeout ${PYTEST_TIMEOUT:-420} python3 -m pytest -q -rs -p no:cacheprovider $part ${PYTEST_ARGS:-} > "$out/python-tests-$k.log" 2>&1) &
    k=$((k + 1))
  done <<< "$parts"
  wait
  cat "$out"/python-tests-*.log > "$out/python-tests.log"
  grep -E "^(FAILED|ERROR)" "$out/python-tests.log" | head -25
  results=$(for f in "$out"/python-tests-*.log; do tail -1 "$f"; done | tr '\n' ';')
  summary+=("python tests, $k processes: $results ($(( $(date +%s) - start ))s)")
  for d in cuda cpu; do
    python3 scripts/torch-op-cost.py --device $d --json "$out/torch-op-cost-$d.json" 2>&1 | tee "$out/torch-op-cost-$d.txt"
  done
  if [ -d .artifacts/flashinfer ]; then
    start=$(date +%s)
    # Its two files in two processes (each about half of a serial run's time).
    mkdir -p "$out/flashinfer-add" "$out/flashinfer-rms"
    OUT=$out/flashinfer-add timeout ${FLASHINFER_TIMEOUT:-300} bash scripts/flashinfer-parity/run.sh .artifacts/flashinfer -k "add_rmsnorm" ${FLASHINFER_ARGS:-} &
    OUT=$out/flashinfer-rms timeout ${FLASHINFER_TIMEOUT:-300} bash scripts/flashinfer-parity/run.sh .artifacts/flashinfer -k "not add_rmsnorm" ${FLASHINFER_ARGS:-}
    wait
    summary+=("FlashInfer's tests: $(tail -1 "$out/flashinfer-add/flashinfer-tests.log"); $(tail -1 "$out/flashinfer-rms/flashinfer-tests.log") ($(( $(date +%s) - start ))s)")
    # The bytes of the one case fp4norm's exact numerics fail, with the test's own data.
    python3 scripts/flashinfer-parity/numerics_case.py 4 64 cuda 2>&1 | tee "$out/flashinfer-numerics-case.txt"
  fi
fi

if has cli; then
  # The CLI's CUDA paths end to end: every subcommand on the GPU, then the device rules,
  # each of which must end in a clear error (exit status 1 or 2, no panic).
  echo "== the CLI on CUDA: info, verify, bench, tune, bad devices"
  start=$(date +%s)
  cli_ok=0 cli_bad=0
  cli() {  # cli EXPECT NAME ARGS...: EXPECT is ok (status 0) or error (status 1 or 2, no panic)
    local expect=$1 name=$2; shift 2
    "$@" > "$out/cli-$name.log" 2>&1; local rc=$?
    if [ "$expect" = ok ] && [ $rc = 0 ] || { [ "$expect" = error ] && { [ $rc = 1 ] || [ $rc = 2 ]; } && ! grep -q panicked "$out/cli-$name.log"; }; then
      cli_ok=$((cli_ok + 1)); echo "cli $name: as expected (status $rc)"
    else
      cli_bad=$((cli_bad + 1)); echo "cli $name: UNEXPECTED (status $rc, wanted $expect)"; tail -5 "$out/cli-$name.log"
    fi
    [ "$expect" = error ] && tail -1 "$out/cli-$name.log"
    return 0
  }
  cli ok info "$bin/fp4norm" info
  cli ok verify "$bin/fp4norm" verify --device cuda ${CLI_VERIFY_ARGS:---cases 200}   # e.g. "--group fp8 --cases 50"
  cli ok bench "$bin/fp4norm" bench --device cuda --m 1,4096 --h 4096 --format nvfp4,mxfp4,fp8-token,mxfp8 --copy-mib 256
  cli ok tune "$bin/fp4norm" tune --h 4096 --dtype bf16 --format nvfp4,fp8-token,mxfp8 --dry-run
  cli error bench-device-9 env FP4NORM_DEVICE=9 "$bin/fp4norm" bench --device cuda --m 1 --h 4096
  cli error auto-device-x env FP4NORM_DEVICE=x "$bin/fp4norm" bench --m 1 --h 4096
  cli error verify-device-9 env FP4NORM_DEVICE=9 "$bin/fp4norm" verify --device cuda --group fp8-random
  cli error tune-device-9 "$bin/fp4norm" tune --device 9 --h 4096 --dry-run
  cli error bench-h-odd "$bin/fp4norm" bench --device cuda --m 1 --h 4097
  # No disk cache: tune stops before it measures (the message says so).
  cli error tune-no-cache env FP4NORM_CACHE_DIR=off "$bin/fp4norm" tune --h 4096 --dtype bf16 --format nvfp4
  grep -q "nowhere to write" "$out/cli-tune-no-cache.log" || { cli_bad=$((cli_bad + 1)); echo "cli tune-no-cache: UNEXPECTED message"; }
  # Two tunes of one table at once: exactly one stops, naming the lock; the other runs.
  tdir=$(mktemp -d)
  FP4NORM_CACHE_DIR=$tdir "$bin/fp4norm" tune --h 4096 --dtype bf16 --format nvfp4 --dry-run > "$out/cli-tune-a.log" 2>&1 &
  sleep 4
  FP4NORM_CACHE_DIR=$tdir "$bin/fp4norm" tune --h 4096 --dtype bf16 --format nvfp4 --dry-run > "$out/cli-tune-b.log" 2>&1; rc_b=$?
  wait $!; rc_a=$?
  busy=$(grep -l "holds .*\.lock" "$out/cli-tune-a.log" "$out/cli-tune-b.log" | wc -l)
  if [ $(( rc_a + rc_b )) = 1 ] && [ "$busy" = 1 ]; then
    cli_ok=$((cli_ok + 1)); echo "cli two tunes at once: one ran, one stopped naming the lock (status $rc_a, $rc_b)"
  else
    cli_bad=$((cli_bad + 1)); echo "cli two tunes at once: UNEXPECTED (status $rc_a, $rc_b; $busy named the lock)"
  fi
  rm -rf "$tdir"
  summary+=("cli: $cli_ok as expected, $cli_bad not ($(( $(date +%s) - start ))s)")
fi

if has example; then
  # The Llama example on the GPU: decode under torch.compile + CUDA graphs, its latency and
  # its agreement with the unquantised model.
  echo "== examples/llama_fp4_decode.py"
  site=/tmp/fp4norm-site
  [ -d "$site" ] || python3 -m pip install -q --no-deps --no-index --target "$site" .artifacts/wheel/*.whl 2>&1 | grep -v WARNING | tail -2
  start=$(date +%s)
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} timeout ${EXAMPLE_TIMEOUT:-240} python3 examples/llama_fp4_decode.py ${EXAMPLE_ARGS:-} > "$out/example.log" 2>&1
  rc=$?
  tail -15 "$out/example.log"
  summary+=("example: exit $rc ($(( $(date +%s) - start ))s)")
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

if has exactpath; then
  # The exact sum of squares (kernel: rstd_checked / exact_sum_redo) is taken by fewer than
  # one row in 10^6; FP4NORM_FORCE_EXACT_SUMSQ=1 sends every row through it and through the
  # redo of pass 2 (pass 2 first writes from a wrong rstd), so the sweep checks that path
  # byte for byte in every launch shape (kernels compiled here by NVRTC).
  echo "== exact-sum path forced on every row (sweep + edge cases)"
  start=$(date +%s)
  FP4NORM_FORCE_EXACT_SUMSQ=1 FP4NORM_CACHE_DIR=/tmp/kcache-exact "$bin/gpu" --test-threads=4 gpu_edge_cases gpu_sweep 2>&1 | tee "$out/exactpath.log" | grep -E "^FAIL|test result|panicked" | head -20
  summary+=("exact-sum path forced: $(grep 'test result' "$out/exactpath.log" | tail -1) ($(( $(date +%s) - start ))s)")
  # The FP8 suite's pass 2 (group and per-token scales, kept column-major scales) redone too.
  start=$(date +%s)
  FP4NORM_FORCE_EXACT_SUMSQ=1 FP4NORM_CACHE_DIR=/tmp/kcache-exact "$bin/gpu_fp8" --test-threads=2 2>&1 | tee "$out/exactpath-fp8.log" | grep -E "^FAIL|test result|panicked" | head -20
  summary+=("exact-sum path forced, FP8: $(grep 'test result' "$out/exactpath-fp8.log" | tail -1) ($(( $(date +%s) - start ))s)")
fi

if [[ " $modes " == *" nanexp "* ]]; then
  echo "== experiment: kernels without the NaN fix-up (do the packed add/cvt give 0x7FFF?)"
  FP4NORM_ASSUME_HW_CANONICAL_NAN=1 FP4NORM_CACHE_DIR=/tmp/kcache-nan "$bin/gpu" --test-threads=3 gpu_edge_cases gpu_sweep 2>&1 | tee "$out/nanexp.log" | grep -E "^FAIL|test result" | head -20
  summary+=("no-NaN-fix-up experiment: $(grep 'test result' "$out/nanexp.log" | tail -1)")
fi

if [[ " $modes " == *" ab "* ]]; then
  # A/B of variants, timed by one binary in one run: every file of AB_DIR (default
  # .artifacts/variants; scripts/ab/ holds committed sets) or AB_VARIANTS: NAME.cu is a
  # kernel source (FP4NORM_KERNEL_SOURCE), NAME.env a line of VAR=value settings
  # (measurement knobs, empty for the default); AB_ROUNDS rounds, round-robin so that drift
  # hits every variant alike; the first variant (sorted) is the baseline of the ratios.
  # AB_SETS, else AB_DIR/sets: bench argument sets, one per line.
  echo "== A/B of kernel variants"
  : > "$out/ab.log"
  ab_dir=${AB_DIR:-.artifacts/variants}
  variants=${AB_VARIANTS:-$(ls "$ab_dir"/*.cu "$ab_dir"/*.env 2>/dev/null | sort)}
  [ -z "${AB_SETS:-}" ] && [ -f "$ab_dir/sets" ] && AB_SETS=$(cat "$ab_dir/sets")
  sets=${AB_SETS:-"--m 1,16 --h 2048,4096,5120,8192 --layout row-major
--m 128 --h 8192 --layout row-major
--m 1024 --h 4096 --layout row-major
--m 16384 --h 4096 --layout row-major,swizzled
--m 16384 --h 8192,16384 --layout row-major"}
  for round in $(seq "${AB_ROUNDS:-2}"); do
    for v in $variants; do
      name=$(basename "${v%.*}")
      if [[ $v == *.cu ]]; then settings="FP4NORM_KERNEL_SOURCE=$v"; else settings=$(cat "$v"); fi
      while read -r set; do
        [ -z "$set" ] && continue
        env $settings "$bin/fp4norm" bench --device cuda $set --copy-mib 1024 2>&1 \
          | grep -E "^ +[0-9]+ +[0-9]+ |copy baseline|FAIL|mismatch|error" | sed "s/^/AB $name $round | /" >> "$out/ab.log"
      done <<< "$sets"
      echo "round $round: $name done ($(grep -c "AB $name $round | .* ok *$" "$out/ab.log") rows ok, $(grep -c "AB $name $round | .* - *$" "$out/ab.log") unchecked)"
    done
  done
  python3 - "$out/ab.log" <<'PY' | tee "$out/ab-summary.txt"
import collections, statistics, sys
rows = collections.defaultdict(lambda: collections.defaultdict(list))
order, names = [], []
for line in open(sys.argv[1]):
    head, _, rest = line.partition(" | ")
    _, name, _ = head.split()
    if name not in names:
        names.append(name)
    f = rest.split()
    if len(f) < 14 or not f[0].isdigit():
        continue
    key = " ".join(f[:5])
    if key not in order:
        order.append(key)
    rows[key][name].append((float(f[10]), f[12], f[14]))
base = names[0]
print("graph-replay median µs per call (median over rounds; % of copy of that run); ratio = variant / " + base)
print(f"{'M H format dtype layout':34}" + "".join(f"{n:>24}" for n in names))
for key in order:
    cells = []
    b = statistics.median(t for t, _, _ in rows[key][base]) if rows[key][base] else None
    for n in names:
        v = rows[key][n]
        if not v:
            cells.append(f"{'-':>24}")
            continue
        t = statistics.median(x for x, _, _ in v)
        # BAD: a checked row that did not match; "-" is a row timed with --no-check.
        ok = all(c in ("ok", "-") for _, _, c in v)
        r = f" {t / b:.3f}" if b else ""
        cells.append(f"{t:9.2f} {v[-1][1]:>6}{r:>6}{'' if ok else ' BAD':>3}")
    print(f"{key:34}" + "".join(cells))
PY
  summary+=("ab: see ab-summary.txt")
fi

if [[ " $modes " == *" ncu "* ]]; then
  # Hardware counters of one fused-kernel launch per line of NCU_SHAPES ("M H LAYOUT FORMAT
  # [VARIANT.cu]"): DRAM bytes, L2 requests and sectors, instructions, time.
  echo "== Nsight Compute counters"
  ncu_bin=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$ncu_bin" ]; then
    echo "ncu: not found"; summary+=("ncu: not found")
  else
    metrics=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_requests_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_write.sum,lts__t_sectors_srcunit_tex_op_write.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active
    : > "$out/ncu.log"
    while read -r m h layout fmt variant; do
      [ -z "$m" ] && continue
      echo "NCU $m $h $layout $fmt ${variant:-default}" | tee -a "$out/ncu.log"
      ( [ -n "$variant" ] && export FP4NORM_KERNEL_SOURCE=$variant
        timeout 120 "$ncu_bin" --clock-control none --kernel-name "${NCU_KERNEL:-fp4norm_fused}" --launch-skip 5 --launch-count "${NCU_COUNT:-1}" --metrics "$metrics" \
          "$bin/fp4norm" bench --device cuda --m "$m" --h "$h" --layout "$layout" --format "$fmt" --reps 5 --warmup 3 --no-check --copy-mib 64 2>&1 ) \
        | grep -E "^ +[a-z_]+__|ERR|rror" | tee -a "$out/ncu.log"
    done <<< "${NCU_SHAPES:-16384 4096 row-major nvfp4
16384 4096 swizzled nvfp4}"
    summary+=("ncu: see ncu.log")
  fi
fi

if [[ " $modes " == *" report "* ]]; then
  # Everything BENCHMARKS.md's tables need, from one machine in one run, kept in one
  # tarball (few files to copy back). About 290 s on an H200 with REPORT_CHECK=0.
  # REPORT_DEADLINE (seconds, default 500): sections not started by then are skipped (and
  # say so), so that the tarball is always written within a run's time limit.
  echo "== report: tests, main table, Triton peer, layouts, y_out, PDL, H = 32768, f16"
  rep=$out/report; mkdir -p "$rep"
  t0=$(date +%s)
  section() {  # section NAME: whether there is time left for it
    if (( $(date +%s) - t0 < ${REPORT_DEADLINE:-500} )); then
      echo "[report t+$(( $(date +%s) - t0 ))s] $1"; return 0
    fi
    echo "[report] $1 skipped: deadline" | tee -a "$rep/skipped.txt"; return 1
  }
  # REPORT_CHECK=0 times every section with --no-check: checking each row costs host time
  # that grows with its size, which a run under a time limit may not have.
  check=(); [ "${REPORT_CHECK:-1}" = 0 ] && check=(--no-check)
  b() { "$bin/fp4norm" bench --device cuda --copy-mib 2048 "${check[@]}" "$@"; }
  unchecked() { "$bin/fp4norm" bench --device cuda --copy-mib 2048 --no-check "$@"; }
  if section tests; then
    "$bin/gpu" --test-threads=3 > "$rep/gpu-tests.log" 2>&1
    summary+=("report tests: $(grep 'test result' "$rep/gpu-tests.log" | tail -1)")
  fi
  section main && b --layout row-major --m 1,16,128,1024,4096,8192,16384 --h 2048,4096,5120,7168,8192,16384,32768 \
    --json "$rep/main.json" > "$rep/main.log" 2>&1
  if section peers; then
    timeout 240 python3 .artifacts/peers/triton_peer.py 1x4096 16x4096 128x8192 1024x4096 4096x7168 8192x8192 16384x4096 2048x32768 \
      > "$rep/peers.log" 2>&1
    [ -f peer_bench.json ] && mv peer_bench.json "$rep/"
    [ -f "$out/peer_bench.json" ] && mv "$out/peer_bench.json" "$rep/"
  fi
  section layouts && b --layout row-major,swizzled,both --m 1024,8192,16384 --h 4096,8192 --json "$rep/layouts.json" > "$rep/layouts.log" 2>&1
  section y_out && b --layout row-major --y-out --m 1024,8192,16384 --h 4096,8192 --json "$rep/yout.json" > "$rep/yout.log" 2>&1
  section pdl && unchecked --layout row-major --m 1,16 --h 4096,8192 --pdl > "$rep/pdl.log" 2>&1
  section h32768 && b --layout row-major --dtype f16 --dtype bf16 --m 2048,16384 --h 32768 --json "$rep/h32768.json" > "$rep/h32768.log" 2>&1
  section f16 && b --layout row-major --dtype f16 --m 16384 --h 2048,4096,5120,7168,8192,16384 --json "$rep/f16.json" > "$rep/f16.log" 2>&1
  args=()
  for f in peers:peer_bench layouts:layouts yout:yout extra:h32768 extra:f16; do
    [ -f "$rep/${f#*:}.json" ] && args+=(--"${f%%:*}" "$rep/${f#*:}.json")
  done
  [ -f "$rep/main.json" ] && python3 scripts/bench-tables.py --main "$rep/main.json" "${args[@]}" > "$rep/report.md" 2> "$rep/report.err"
  [ -f "$rep/pdl.log" ] && grep -A12 "^programmatic dependent launch" "$rep/pdl.log" >> "$rep/report.md"
  [ -f "$rep/report.md" ] && cp "$rep/report.md" "$out/report.md"
  tar czf "$out/report.tgz" -C "$out" report && rm -rf "$rep"
  [ -f "$out/report.md" ] && tail -40 "$out/report.md"
  summary+=("report: report.md, everything in report.tgz ($(( $(date +%s) - t0 ))s)")
fi

if [[ " $modes " == *" fp8report "* ]]; then
  # BENCHMARKS.md's FP8 section (`bench-tables.py --fp8 fp8-decode.json --fp8 fp8-big-1.json
  # --fp8 fp8-big-2.json --fp8-peers fp8_peers.json`): the FP8 suite, every format at decode
  # sizes checked row by row, two rounds of the large rows (the table takes the best), the
  # first checked, then the Inductor peer. The tarball is rewritten after each step, and
  # steps not started by FP8REPORT_DEADLINE seconds (default 480) are skipped and say so,
  # so that a run under a time limit keeps what it measured.
  echo "== fp8report: FP8 suite, decode rows, two rounds of large rows, Inductor peer"
  rep=$out/fp8report; mkdir -p "$rep"
  cp "$out/gpu.txt" "$rep/"
  t0=$(date +%s)
  step() {  # step NAME: whether there is time left for it (the tarball so far written first)
    tar czf "$out/fp8report.tgz" -C "$out" fp8report
    if (( $(date +%s) - t0 < ${FP8REPORT_DEADLINE:-480} )); then
      echo "[fp8report t+$(( $(date +%s) - t0 ))s] $1"; return 0
    fi
    echo "[fp8report] $1 skipped: deadline" | tee -a "$rep/skipped.txt"; return 1
  }
  f8=nvfp4,fp8-tensor,fp8-tensor-e5m2,fp8-token,fp8-token-e5m2,fp8-token-ue8m0-row-major
  f8=$f8,fp8-g32-f32-row-major,fp8-group32,fp8-g64-f32-row-major,fp8-group64,fp8-g128-f32-row-major
  f8=$f8,fp8-group128,fp8-g128-ue8m0-row-major,fp8-g128-ue8m0-column-major,fp8-g32-ue8m0-row-major,mxfp8
  f8=$f8,fp8-g32-ue8m0-column-major-packed,fp8-g128-ue8m0-column-major-packed
  if step tests; then
    "$bin/gpu_fp8" --test-threads=3 > "$rep/gpu_fp8.log" 2>&1
    summary+=("fp8report tests: $(grep 'test result' "$rep/gpu_fp8.log" | tail -1)")
  fi
  step decode && "$bin/fp4norm" bench --device cuda --m 1,16,128 --h 4096,8192 --format "$f8" --layout swizzled \
    --copy-mib 2048 --json "$rep/fp8-decode.json" > "$rep/fp8-decode.log" 2>&1
  for round in 1 2; do
    check=(); [ "$round" = 2 ] && check=(--no-check)
    step "large rows, round $round" && "$bin/fp4norm" bench --device cuda --m 4096,16384 --h 4096,8192,16384 \
      --format "$f8" --layout swizzled --copy-mib 2048 "${check[@]}" --json "$rep/fp8-big-$round.json" \
      > "$rep/fp8-big-$round.log" 2>&1
  done
  if step peers; then
    # Through this build's wheel, installed afresh.
    site=/tmp/fp4norm-site
    rm -rf "$site"
    python3 -m pip install -q --no-deps --no-index --target "$site" .artifacts/wheel/*.whl 2>&1 | grep -v WARNING | tail -2
    PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} timeout ${FP8_PEERS_TIMEOUT:-240} python3 scripts/fp8-peers.py \
      --json "$rep/fp8_peers.json" 1x4096 16x8192 128x8192 4096x8192 16384x8192 > "$rep/fp8-peers.log" 2>&1
    [ -f "$rep/fp8_peers.json" ] || echo "[fp8report] peers: no fp8_peers.json (see fp8-peers.log)" | tee -a "$rep/skipped.txt"
  fi
  tar czf "$out/fp8report.tgz" -C "$out" fp8report && rm -rf "$rep"
  summary+=("fp8report: fp8report.tgz ($(( $(date +%s) - t0 ))s)")
fi

if has sanitize; then
  # One compute-sanitizer run: the tool, a label (the log's name), then the test binary and
  # its test name filters.
  sanitize_run() {
    local tool=$1 label=$2; shift 2
    echo "== compute-sanitizer $tool ($label)"
    timeout ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool "$tool" --error-exitcode 9 "$@" > "$out/sanitize-$label-$tool.log" 2>&1
    local rc=$?
    tail -3 "$out/sanitize-$label-$tool.log"
    summary+=("sanitizer $tool, $label: exit $rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitize-$label-$tool.log" | tail -1)")
  }
  # SANITIZE_SWEEP=full: the whole sweep (bf16, f16, edge cases) and the graph test.
  sweep=${SANITIZE_SWEEP:-small}
  tests="gpu_sweep_bf16 gpu_graph"
  if [ "$sweep" = full ]; then tests="gpu_sweep gpu_edge_cases gpu_graph"; fi
  tests=${SANITIZE_TESTS:-$tests}   # test name filters, e.g. "gpu_sweep_bf16 gpu_edge_cases"
  export FP4NORM_GPU_SWEEP=$sweep
  for tool in memcheck racecheck synccheck; do
    sanitize_run $tool "fp4-$sweep" "$bin/gpu" --test-threads=1 $tests
    # The FP8 sweep (its cases are few and small): every FP8 kernel path.
    sanitize_run $tool fp8 "$bin/gpu_fp8" --test-threads=1 gpu_fp8_sweep
  done
  unset FP4NORM_GPU_SWEEP
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
