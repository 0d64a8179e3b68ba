#!/usr/bin/env bash
# The token-forcing judge on the demo model, every case through `w12 tune forcing`:
#   OUT=out bash lab/judges_demo.sh [DEVICE]
# One reference (plain BF16 decoding at batch 1) and one stock trace (BF16, decode step, batch
# 8) serve every case (--baseline). Lossless cases must be accepted: the W12 folder through its
# decode step, BF16 at batch 4, W12 speculative decoding through its verify step (chain and
# tree of 16 nodes). Defects must be rejected: a cache write one slot early from slot 64, the
# top-2 swap on near-ties, the logit bias from generated position 8. Each case's report goes to
# $OUT/judge-CASE.txt and its JSON beside it; the last lines printed are the verdicts.
set -uo pipefail
DEVICE=${1:-cpu}
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
MODELS=${W12_CACHE:-$HOME/.cache/w12}/models
$PY -m w12_cli demo --quiet > "$OUT/demo.txt" 2>&1 || { tail "$OUT/demo.txt"; exit 1; }
BF16=$(ls -d "$MODELS"/*-bf16 | head -1)
W12=$(ls -d "$MODELS"/*-w12 | head -1)
COMMON=(--prompts ${PROMPTS:-32} --tokens ${TOKENS:-128} --batch 8 --device "$DEVICE"
        --baseline "$OUT/judge-baseline.pt")
cases=(
  "w12-decode|$W12|"
  "bf16-batch4|$BF16|--candidate-batch 4"
  "w12-chain16|$W12|--path chain:16"
  "w12-tree16|$W12|--path tree:16"
  "kv-shift-64|$BF16|--defect kv-shift:64"
  "near-tie|$BF16|--defect near-tie:${GAP:-0.25}"
  "logit-bias-8|$BF16|--defect logit-bias:8"
)
for c in "${cases[@]}"; do
  IFS='|' read -r name folder flags <<< "$c"
  began=$(date +%s)
  # shellcheck disable=SC2086
  $PY -m w12_cli tune forcing "$BF16" "$folder" "${COMMON[@]}" $flags \
    --json "$OUT/judge-$name.json" > "$OUT/judge-$name.txt" 2>&1
  rc=$?
  echo "$name: exit $rc after $(( $(date +%s) - began )) s: $(grep -E 'ACCEPT|REJECT' \
    "$OUT/judge-$name.txt" | head -1)"
done
