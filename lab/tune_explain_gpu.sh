#!/usr/bin/env bash
# Cost-model decomposition of the reference engine's decode step on a GPU, BF16 and W12
# weights, then (PROVE=1) all three tuning judges on W12 against BF16.
#   bash lab/tune_explain_gpu.sh
# Settings (environment): MODEL (synthetic:qwen3-8b), DEVICE (cuda), BATCH (1), CONTEXT (512),
# TREE_SIZES (1,4,16), PROVE (1), PROMPTS (64), TOKENS (128), OUT_DIR (w12-tune-gpu), PYTHON.
# Needs only torch and triton; the PNG charts are written when matplotlib is installed.
# Works on the CPU too: MODEL=synthetic:tiny-qwen3 DEVICE=cpu CONTEXT=32 bash ...
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
MODEL=${MODEL:-synthetic:qwen3-8b}
DEVICE=${DEVICE:-cuda}
BATCH=${BATCH:-1}
CONTEXT=${CONTEXT:-512}
TREE_SIZES=${TREE_SIZES:-1,4,16}
PROVE=${PROVE:-1}
PROMPTS=${PROMPTS:-64}
TOKENS=${TOKENS:-128}
OUT_DIR=${OUT_DIR:-w12-tune-gpu}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export ROOT PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$PYTHON" - <<'EOF'
import os, platform, subprocess, time, torch
print(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), platform.node())
print("torch", torch.__version__, "cuda", torch.version.cuda,
      torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU")
try:
    import triton
    print("triton", triton.__version__)
except ImportError:
    print("triton not installed")
commit = subprocess.run(["git", "-C", os.environ["ROOT"], "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
print("commit", commit.stdout.strip() or "unknown")
EOF

PNG_BF16=() PNG_W12=()
if "$PYTHON" -c "import matplotlib" 2>/dev/null; then
  PNG_BF16=(--png "$OUT_DIR/explain-bf16.png") PNG_W12=(--png "$OUT_DIR/explain-w12.png")
fi

for MODE in bf16 w12; do
  echo "== tune explain $MODEL --mode $MODE --batch $BATCH (context $CONTEXT, tree sizes $TREE_SIZES)"
  if [[ $MODE == bf16 ]]; then PNG=("${PNG_BF16[@]}"); else PNG=("${PNG_W12[@]}"); fi
  "$PYTHON" -m w12_cli tune explain "$MODEL" --mode "$MODE" --batch "$BATCH" \
    --device "$DEVICE" --context "$CONTEXT" --tree-sizes "$TREE_SIZES" \
    --json "$OUT_DIR/explain-$MODE.json" ${PNG[@]+"${PNG[@]}"}
done

if [[ $PROVE == 1 ]]; then
  echo "== tune prove: W12 candidate against BF16 stock on $MODEL"
  "$PYTHON" -m w12_cli tune prove "$MODEL" "$MODEL" --candidate-mode w12 \
    --prompts "$PROMPTS" --tokens "$TOKENS" --batch "$BATCH" --context "$CONTEXT" \
    --device "$DEVICE" --out "$OUT_DIR/prove" --force-final --json "$OUT_DIR/prove.json"
fi
