#!/usr/bin/env bash
# `make test-under-load`: the whole test suite with one CPU-bound busy loop per core beside it, as on a
# shared CI runner or a laptop that is compiling. Tests must wait on conditions with deadlines, never on
# a worker being fast; this is how that is checked. LOAD_PROCS overrides the number of loops.
set -euo pipefail
cd "$(dirname "$0")/.."
procs=${LOAD_PROCS:-$(nproc)}
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
for _ in $(seq 1 "$procs"); do
    python3 -c 'while 1: pass' &
    pids+=($!)
done
echo "test-under-load: ${#pids[@]} busy loops running beside the suite" >&2
.venv/bin/python -m pytest -q "$@"
