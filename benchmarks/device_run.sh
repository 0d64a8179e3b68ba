#!/usr/bin/env bash
# The one script a GPU run executes: GPU tests, the GEMM configuration sweep (writes
# w12_kernels/gemm/tuned.json), then the full benchmark with that table.
#   bash benchmarks/device_run.sh [sweep|bench|all] [extra benchmark args...]
# Logs and JSON go to $OUT (default ./out). The benchmark's table is printed last.
set -uo pipefail
MODE=${1:-all}; shift || true
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee "$OUT/env.txt"
python3 -m pytest tests/w12_kernels -q -p no:cacheprovider 2>&1 | tail -30 | tee "$OUT/tests.txt"
if ls tests/w12/*.py >/dev/null 2>&1; then
  python3 -m pytest tests/w12 -q -k torch -p no:cacheprovider 2>&1 | tail -5 | tee -a "$OUT/tests.txt"
fi
if [[ $MODE == sweep || $MODE == all ]]; then
  python3 benchmarks/gemm.py --sweep --write-table --m 1,16,256 --json "$OUT/sweep.json" 2>&1 \
    | tee "$OUT/sweep.txt"
  cp w12_kernels/gemm/tuned.json "$OUT/" 2>/dev/null || true
fi
if [[ $MODE == bench || $MODE == all ]]; then
  python3 benchmarks/gemm.py --json "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/bench.txt"
fi
