#!/usr/bin/env bash
# One GPU session: the CUDA tests of the codec and the engine, the decode benchmark (W12 vs BF16
# on the synthetic Qwen3 presets) and the cost-model decomposition of the Qwen3-8B decode step.
# Each stage has its own time limit so that one failure does not hide the others' numbers.
#   OUT=results bash benchmarks/gpu_session.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-results}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"

echo "== CUDA tests"
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/w12/test_codec.py \
  tests/engine/test_engine_cuda.py -k "cuda or device" 2>&1 | tail -8

echo "== decode benchmark"
timeout 300 python3 benchmarks/decode.py --models "${MODELS:-synthetic:qwen3-8b,synthetic:qwen3-32b}" \
  --batch "${BATCH:-1,32}" --tokens "${TOKENS:-128}" --json "$OUT/decode.json" 2>&1 \
  | tee "$OUT/decode.log" | tail -30

echo "== tune explain"
PROVE=0 OUT_DIR="$OUT/tune" CONTEXT=512 timeout 150 bash benchmarks/tune_explain_gpu.sh 2>&1 \
  | grep -v "profiler_st" | tee "$OUT/explain.log" | tail -45
