#!/usr/bin/env bash
# Session 9, call 3: the whole issue-4 report of the committed kernel (GPU suite first).
set -u
cd "$(dirname "$0")/.."
git_head=$(cat .artifacts/HEAD 2>/dev/null); echo "code: $git_head"
REPORT_DEADLINE=470 timeout 590 bash scripts/gpu-check.sh report 2>&1 | tail -60
