#!/usr/bin/env bash
# Runs FlashInfer's add_rmsnorm_fp4quant / rmsnorm_fp4quant test files against fp4norm.
# Usage: bash scripts/flashinfer-parity/run.sh FLASHINFER_CHECKOUT [pytest args...]
# Needs a CUDA GPU, torch and fp4norm importable. Writes the pytest log to ${OUT:-.}/flashinfer-tests.log.
set -u
here=$(cd "$(dirname "$0")" && pwd)
src=${1:?usage: run.sh FLASHINFER_CHECKOUT [pytest args]}
shift
work=$(mktemp -d)
mkdir -p "$work/tests/norm"
cp -r "$src/tests/test_helpers" "$work/tests/"
touch "$work/tests/__init__.py" "$work/tests/norm/__init__.py"
for f in test_add_rmsnorm_fp4_quant_cute_dsl.py test_rmsnorm_fp4_quant_cute_dsl.py; do
  cp "$src/tests/norm/$f" "$work/tests/norm/"
done
cp "$here/conftest.py" "$work/conftest.py"
log=${OUT:-.}/flashinfer-tests.log
(cd "$work" && PYTHONPATH="$here/shim:$work:${PYTHONPATH:-}" python3 -m pytest -q -p no:cacheprovider \
  -rfs tests/norm "$@" > "$log" 2>&1)
rc=$?
grep -E "^(FAILED|ERROR)" "$log" | head -40
tail -3 "$log"
rm -rf "$work"
exit $rc
