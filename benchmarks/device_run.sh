#!/usr/bin/env bash
# The one script a GPU run of the GEMM work executes: the GPU tests, the launch-rule sweep
# (writes w12_kernels/gemm/tuned.json), the warpgroup-kernel choices, the large-M sweep, then
# the full benchmark with that table.
#   bash benchmarks/device_run.sh [sweep|large|wg|bench|all|tests|experimental|ab|hints] [extra benchmark args...]
# TEST_K: a pytest -k expression selecting GPU tests.
# SWEEP_ARGS: more arguments of the small-M sweep (--keep-kw: only the kw of the table in use).
# large: the large-M sweep (fused block shapes vs decode + cuBLAS at SWEEP_LARGE_M, default
# 128,256,1024), written into the "large" entry of tuned.json; LARGE_CANDIDATES (label parts,
# comma-separated) and SWEEP_SHAPES (NxK,...) narrow it.
# wg: GPU tests of the warpgroup-MMA small-M kernel, then benchmarks/wgmma_probe.py
# --write-table at WG_M (default 24,32,48,64): where it beats the mma.sync kernel, per shape and
# class of M, into the table (run it after a small-M sweep that changed a kw).
# experimental: GPU tests of the warpgroup-MMA GEMM and the Triton decode attention, then
# benchmarks/wgmma_probe.py (set DECODE_MODELS and DECODE_ATTENTION=torch,triton to time the
# attention too).
# ab (first, before the GPU tests): benchmarks/gemm_ab.py --baseline AB_BASELINE (a git revision
# or a directory that `python3 benchmarks/revision.py REV DIR` wrote; default HEAD) at AB_M
# (default 1,8,16,32): the tree's small-M kernel against the baseline's in the same graphs, bits
# compared (exit 1 where they differ). With TESTS=0 that is the whole run (~40 s).
# hints: benchmarks/large_ab.py --toggle l2hint --rounds 2 --write-table --device-table at each
# of HINT_M (default 256,512,1024,2048): the large-M kernel's L2 eviction hints
# (docs/PERF_GEMM.md #91) set per entry in this GPU model's section of the table where they won
# both rounds, then benchmarks/gemm.py --m HINT_M on the table written.
# Logs and JSON go to $OUT (default ./out). Each stage has its own time limit; TESTS=0 skips the
# GPU tests.
set -uo pipefail
MODE=${1:-all}; shift || true
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
{
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c 'import torch, triton, cupy; print("torch", torch.__version__, "triton",
triton.__version__, "cupy", cupy.__version__)'
  python3 -c 'from w12_kernels.gemm import backend; print("backend", backend())'
} 2>&1 | tee "$OUT/env.txt"
if [[ $MODE == ab ]]; then
  timeout "${AB_LIMIT:-240}" python3 benchmarks/gemm_ab.py --baseline "${AB_BASELINE:-HEAD}" \
    --m "${AB_M:-1,8,16,32}" --json "$OUT/ab.json" 2>&1 | tee "$OUT/ab.txt"
fi
if [[ ${TESTS:-1} == 1 ]]; then
  timeout "${TEST_LIMIT:-180}" python3 -m pytest tests/w12_kernels/test_gemm_cuda.py -q -x \
    -p no:cacheprovider -W ignore::DeprecationWarning ${TEST_K:+-k "$TEST_K"} \
    > "$OUT/tests_full.txt" 2>&1
  rc=$?
  tail -30 "$OUT/tests_full.txt" | tee "$OUT/tests.txt"
  if [[ $rc != 0 ]]; then
    echo "GPU tests did not pass (exit $rc): nothing timed" | tee -a "$OUT/tests.txt"
    exit 1
  fi
fi
if [[ $MODE == experimental ]]; then
  timeout "${TEST_LIMIT:-180}" python3 -m pytest tests/w12_kernels/test_gemm_wgmma.py \
    tests/engine/test_attention_triton.py tests/engine/test_engine_cuda.py -q \
    -p no:cacheprovider -W ignore::DeprecationWarning 2>&1 | tail -30 | tee "$OUT/tests_exp.txt"
  timeout "${PROBE_LIMIT:-240}" python3 benchmarks/wgmma_probe.py --json "$OUT/wgmma_probe.json" \
    2>&1 | tee "$OUT/wgmma_probe.txt"
fi
if [[ $MODE == sweep || $MODE == all ]]; then
  timeout "${SWEEP_LIMIT:-240}" python3 benchmarks/gemm.py --sweep --write-table \
    --m "${SWEEP_M:-1,8,16,32}" ${SWEEP_ARGS:-} --json "$OUT/sweep.json" 2>&1 \
    | tee "$OUT/sweep.txt"
  cp w12_kernels/gemm/tuned.json "$OUT/" 2>/dev/null || true
fi
if [[ $MODE == wg || $MODE == all ]]; then
  # (the pass check is pytest's exit status: with the project's -q the summary line is not
  # printed, so grepping for "passed" found nothing)
  timeout "${TEST_LIMIT:-180}" python3 -m pytest tests/w12_kernels/test_gemm_wgmma.py -x \
    -p no:cacheprovider -W ignore::DeprecationWarning > "$OUT/tests_wg_full.txt" 2>&1
  rc=$?
  tail -5 "$OUT/tests_wg_full.txt" | tee "$OUT/tests_wg.txt"
  if [[ $rc == 0 ]]; then
    timeout "${PROBE_LIMIT:-330}" python3 benchmarks/wgmma_probe.py --m "${WG_M:-24,32,48,64}" \
      --write-table --json "$OUT/wgmma_probe.json" 2>&1 | tee "$OUT/wgmma_probe.txt"
    cp w12_kernels/gemm/tuned.json "$OUT/" 2>/dev/null || true
  else
    echo "warpgroup kernel tests did not pass: table not written" | tee -a "$OUT/tests_wg.txt"
  fi
fi
if [[ $MODE == large || $MODE == all ]]; then
  timeout "${SWEEP_LARGE_LIMIT:-330}" python3 benchmarks/gemm.py --sweep-large --write-table \
    --m "${SWEEP_LARGE_M:-128,256,1024}" ${LARGE_CANDIDATES:+--candidates "$LARGE_CANDIDATES"} \
    ${SWEEP_SHAPES:+--shapes "$SWEEP_SHAPES"} --json "$OUT/sweep_large.json" 2>&1 | tee "$OUT/sweep_large.txt"
  cp w12_kernels/gemm/tuned.json "$OUT/" 2>/dev/null || true
fi
if [[ $MODE == bench || $MODE == all ]]; then
  timeout "${BENCH_LIMIT:-300}" python3 benchmarks/gemm.py --json "$OUT/bench.json" "$@" 2>&1 \
    | tee "$OUT/bench.txt"
fi
if [[ $MODE == hints ]]; then
  HINT_M=${HINT_M:-256,512,1024,2048}
  for m in ${HINT_M//,/ }; do
    timeout "${HINT_LIMIT:-150}" python3 benchmarks/large_ab.py --toggle l2hint --m "$m" \
      --rounds 2 --write-table --device-table --json "$OUT/hints_$m.json" 2>&1 \
      | tee "$OUT/hints_$m.txt"
  done
  cp w12_kernels/gemm/tuned.json "$OUT/" 2>/dev/null || true
  timeout "${BENCH_LIMIT:-300}" python3 benchmarks/gemm.py --m "$HINT_M" \
    --json "$OUT/hints_bench.json" 2>&1 | tee "$OUT/hints_bench.txt"
fi
if [[ -n ${DECODE_MODELS:-} ]]; then
  timeout "${DECODE_LIMIT:-240}" python3 benchmarks/decode.py --models "$DECODE_MODELS" \
    --batch "${DECODE_BATCH:-1,32}" --tokens "${DECODE_TOKENS:-256}" \
    --attention "${DECODE_ATTENTION:-auto}" --json "$OUT/decode.json" \
    2>&1 | tee "$OUT/decode.txt"
fi
