#!/usr/bin/env bash
# The GPU runs behind the speculative-decoding work, in stages that each fit one call:
#   bash lab/device_spec.sh tests     # GPU tests: tree attention, row norms, engine, speculative
#   bash lab/device_spec.sh house OLD # the GEMM of OLD (a folder holding an older tree) against
#                                     # this tree (lab/compare_revisions.sh)
#   bash lab/device_spec.sh decode OLD # the decode benchmark of both trees, one after the other
#   bash lab/device_spec.sh demo      # the demo model in W12: spec check on HumanEval (ngram
#                                     # chain, early-exit tree; greedy and sampled), bench spec
#   bash lab/device_spec.sh scale     # bench spec --forced-accept on the Qwen3-8B/32B presets,
#                                     # W12 and BF16
#   bash lab/device_spec.sh exactness # the demo model at batch 8 greedy and sampled, and sampled
#                                     # at batch 1 under CUDA_LAUNCH_BLOCKING=1
#   bash lab/device_spec.sh serve     # w12 bench serve on the demo model at 8 and 32 requests
#                                     # (DRAFT=ngram or a drafter folder; SERVE_FLAGS e.g.
#                                     # "--shared-budget 8 --widths 8,12,16" with a tree drafter)
#   bash lab/device_spec.sh forcing   # lab/forcing_bits.py: decode and verify logits bits at batch
#                                     # 8 (the synthetic model, and the demo model if converted)
#   bash lab/device_spec.sh determinism # the same inputs twice: every linear of the synthetic and
#                                     # demo models at prefill-sized M, batched prefills on fresh
#                                     # engines (graphs, compile), lab/batch_rows.py --repeat
#   bash lab/device_spec.sh hybrid    # Gated DeltaNet: GPU tests (kernels, hybrid engine), the
#                                     # kernel benchmark (path, walk, snapshots, commit, decode),
#                                     # c(N) of the hybrid-27b preset (W12, BF16), plain decode
#   bash lab/device_spec.sh int8head  # the certified INT8 head's GPU test and benchmark
#   bash lab/device_spec.sh int8head-sweep # the INT8 product's tile configurations
#   bash lab/device_spec.sh view8     # the 8-bit view GEMM: GPU tests (kernel, two-level on the
#                                     # GPU), then benchmarks/view8.py against the exact W12 GEMM
#   bash lab/device_spec.sh view8-sweep # its configuration grid at a few shapes and row counts
#   bash lab/device_spec.sh tlv       # the demo model: bench spec with and without two-level
#                                     # verification (early exit: one graph a step; ngram: eager)
#   bash lab/device_spec.sh tlv-scale # c(N) with and without two-level verification on the
#                                     # Qwen3-8B preset (and 32B where the view fits: an H200),
#                                     # forced acceptance
#   bash lab/device_spec.sh attention # the tree-attention benchmark
#   bash lab/device_spec.sh two-gpus  # (two GPUs) every kernel family on cuda:1 with cuda:0 current
#   bash lab/device_spec.sh attention-sweep # its configurations at batch 1/8/32 (decode regression)
#   bash lab/device_spec.sh divergence # batch > 1: lab/spec_divergence.py (verify rows against
#                                     # plain steps, linear by linear) and, with the demo model,
#                                     # a sampled spec check under CUDA_LAUNCH_BLOCKING=1
#   WHEELS=DIR bash lab/device_spec.sh sglang # SGLang 0.5.21's model class on W12 and BF16
#                                     # (lab/sglang_decode.py): DIR holds the SGLang wheel and,
#                                     # for this Python, the packages of
#                                     # tests/sglang_integration/requirements.txt the machine
#                                     # lacks (with their dependencies), installed --no-deps
#                                     # into a scratch folder; TP=2 (two GPUs) PRESET=qwen3-32b
#                                     # BATCHES=1,32: tensor parallel, one process a GPU, NCCL
#   bash lab/device_spec.sh drafter   # w12 draft train on the demo model into out/drafter-run
#                                     # (one call: the 10-minute limit; TRAIN_FLAGS, by default
#                                     # --minutes 6: steps fitted to 6 minutes of optimisation),
#                                     # its W12 folder, curve and log copied to $OUT
#   bash lab/device_spec.sh drafter-eval [DIR] # the drafter in DIR (default out/drafter-run/w12) on
#                                     # HumanEval: spec check (tau, exactness; chain 16 and tree
#                                     # 64, greedy and sampled: SAMPLED_LIMIT=N prompts),
#                                     # then bench spec (BENCH_PROMPTS, default 32)
# Logs and JSON go to $OUT (default ./out). W12_CACHE must hold the demo model's GGUF for
# "demo" (the cache layout of converters.demo_models). Each step has its own time limit.
set -uo pipefail
STAGE=${1:?usage: bash lab/device_spec.sh tests|house OLD|decode OLD|demo|scale|exactness|serve|forcing|determinism|hybrid|int8head|int8head-sweep|view8|view8-sweep|tlv|tlv-scale|two-gpus|attention|attention-sweep|sglang|drafter|drafter-eval [DIR]}
OUT=${OUT:-out}; mkdir -p "$OUT"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
W12="$PY -m w12_cli"
run() {  # run LIMIT NAME CMD...: the command's output into $OUT/NAME.txt, its tail shown
  local limit=$1 name=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  local rc=$?
  tail -${TAIL:-6} "$OUT/$name.txt"
  [ $rc -eq 0 ] || echo "!! $name exited $rc"
}
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
case $STAGE in
tests)
  TAIL=4 run ${TEST_LIMIT:-150} tests-tree-attention $PY -m pytest -q -p no:cacheprovider \
    tests/w12_kernels/test_tree_attention.py tests/w12_kernels/test_norm.py -k "gpu or cuda"
  TAIL=4 run ${TEST_LIMIT:-150} tests-gemm-demo-shapes $PY -m pytest -q -p no:cacheprovider \
    tests/w12_kernels/test_gemm_cuda.py -k demo_models_shapes
  TAIL=8 run ${TEST_LIMIT:-150} tests-engine $PY -m pytest -q -p no:cacheprovider \
    tests/engine/test_speculative_cuda.py tests/engine/test_engine_cuda.py
  ;;
house)
  OLD=${2:?house needs the folder of the old tree}
  mkdir -p "$OUT/compare"
  M_LIST=${M_LIST:-1,4,16,32,64,128,256,1024} BENCH_MODELS=${BENCH_MODELS:-qwen3_32b,llama8b} \
    BENCH_M=${BENCH_M:-1,8,32,256} TEST_LIMIT=${TEST_LIMIT:-120} BITS_LIMIT=${BITS_LIMIT:-150} \
    OUT="$OUT/compare" TAIL=40 run ${COMPARE_LIMIT:-400} compare bash lab/compare_revisions.sh "$OLD"
  ;;
decode)
  OLD=${2:?decode needs the folder of the old tree}
  for side in old new; do
    tree=.; [ $side = old ] && tree=$OLD
    (cd "$tree" && PYTHONPATH=. TAIL=8 OUT="$OUT" run ${DECODE_LIMIT:-90} "decode-$side" $PY \
      benchmarks/decode.py --models synthetic:qwen3-8b --batch 1,32 --tokens 96 \
      --json "$OUT/decode-$side.json")
  done
  ;;
demo)
  $W12 demo --quiet > "$OUT/demo.txt" 2>&1 || { tail "$OUT/demo.txt"; exit 1; }
  tail -5 "$OUT/demo.txt"
  MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 | head -1)
  PROMPTS=${PROMPTS:-humaneval}
  for s in "greedy:--temperature 0" "sampled:--temperature 0.7 --top-p 0.95 --seed 1"; do
    name=${s%%:*}; flags=${s#*:}
    TAIL=2 run ${CHECK_LIMIT:-120} "check-ngram-chain-$name" $W12 spec check "$MODEL" --drafter ngram --chain \
      --budget 16 --batch 8 --prompts "$PROMPTS" --max-new-tokens 256 $flags --quiet
    TAIL=2 run ${CHECK_LIMIT:-150} "check-early-exit-tree-$name" $W12 spec check "$MODEL" \
      --drafter "${EARLY:-early-exit:4}" --budget 64 --batch 2 --prompts "$PROMPTS" \
      --max-new-tokens 256 $flags --quiet
  done
  for d in ngram "${EARLY_BENCH:-early-exit:20}"; do
    TAIL=16 run ${BENCH_LIMIT:-110} "bench-demo-${d%%:*}" $W12 bench spec "$MODEL" --drafter "$d" \
      --prompts "$PROMPTS" --limit 12 --budgets 1,4,8,16,32,64 --max-new-tokens 128 \
      --json "$OUT/bench-demo-${d%%:*}.json"
  done
  ;;
scale)
  for preset in qwen3-8b qwen3-32b; do
    for mode in w12 bf16; do
      flag=--w12; [ $mode = bf16 ] && flag=--bf16
      TAIL=12 run ${SCALE_LIMIT:-75} "bench-$preset-$mode" $W12 bench spec "synthetic:$preset" \
        $flag --drafter early-exit:4 --forced-accept 3 --budgets "${BUDGETS:-1,16,64,128}" \
        --modes chain --context 512 --max-new-tokens 8 --json "$OUT/bench-$preset-$mode.json"
    done
  done
  ;;
divergence)
  TAIL=40 run ${DIVERGENCE_LIMIT:-120} divergence-w12 $PY lab/spec_divergence.py --batch 8 --nodes 16
  MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 2>/dev/null | head -1)
  if [ -n "$MODEL" ]; then
    CUDA_LAUNCH_BLOCKING=1 TAIL=30 run ${CHECK_LIMIT:-150} check-sampled-blocking $W12 spec check \
      "$MODEL" --drafter ngram --chain --budget 16 --prompts "${PROMPTS:-humaneval}" \
      --max-new-tokens 256 --temperature 0.7 --top-p 0.95 --seed 1 --quiet
  fi
  ;;
exactness)  # the demo model: batch 8 greedy and sampled, sampled at batch 1 (all prompts)
  $W12 demo --quiet > "$OUT/demo.txt" 2>&1 || { tail "$OUT/demo.txt"; exit 1; }
  MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 | head -1)
  for s in "greedy:--temperature 0" "sampled:--temperature 0.7 --top-p 0.95 --seed 1"; do
    name=${s%%:*}; flags=${s#*:}
    TAIL=3 run ${CHECK_LIMIT:-100} "check-b8-$name" $W12 spec check "$MODEL" --drafter ngram \
      --chain --budget 16 --batch 8 --prompts "${PROMPTS:-humaneval}" --limit ${LIMIT:-48} \
      --max-new-tokens 256 $flags --quiet
  done
  CUDA_LAUNCH_BLOCKING=1 TAIL=30 run ${B1_LIMIT:-150} check-b1-sampled-blocking $W12 spec check \
    "$MODEL" --drafter ngram --chain --budget 16 --prompts "${PROMPTS:-humaneval}" \
    --max-new-tokens 256 --temperature 0.7 --top-p 0.95 --seed 1 --quiet
  ;;
serve)  # continuous batching on the demo model: plain against speculative, and the policies
  $W12 demo --quiet > "$OUT/demo.txt" 2>&1 || { tail "$OUT/demo.txt"; exit 1; }
  MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 | head -1)
  DRAFT=${DRAFT:-ngram}
  TAIL=16 run ${SERVE_LIMIT:-400} "serve-${DRAFT##*/}" $W12 bench serve "$MODEL" --drafter "$DRAFT" \
    --prompts "${PROMPTS:-humaneval}" --limit ${REQUESTS:-64} --concurrency 8,32 \
    --max-new-tokens 128 --budget 16 ${SERVE_FLAGS:-} --json "$OUT/serve-${DRAFT##*/}.json"
  ;;
forcing)  # logits bits of decode and verify at one batch, forced along one continuation
  MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 2>/dev/null | head -1)
  for m in synthetic:smollm2-135m $MODEL; do
    TAIL=24 run ${FORCING_LIMIT:-200} "forcing-${m##*/}" $PY lab/forcing_bits.py --model "$m" \
      --paths ${PATHS:-decode:8,chain:8,tree:8} --steps ${STEPS:-300}
  done
  ;;
determinism)  # batch-8 plain decoding gave other tokens on a second fresh engine (H100)
  if [ -z "${CHAIN_MODEL:-}" ]; then  # (CHAIN_MODEL=synthetic:...: no demo model needed)
    $W12 demo --quiet > "$OUT/demo.txt" 2>&1 || { tail "$OUT/demo.txt"; exit 1; }
    MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 | head -1)
  fi
  # (H100: every linear repeats its bits alone; back to back, a few outputs of the stream-K
  # kernel differed, a write-after-read race on the weight stages that the proxy fence closes:
  # --large persist puts stream-K on every eligible entry, noproxyfence takes the fence out and
  # brings the race back, refillsleep hides it without the fence)
  for v in "" "--large persist" "--large persist --patch noproxyfence" \
           "--large persist --patch noproxyfence --patch refillsleep"; do
    TAIL=${CHAIN_TAIL:-2} run 90 "chain${v// /-}" $PY lab/determinism.py --model "${CHAIN_MODEL:-$MODEL}" \
      --skip-linears --chain --rows 1240,2048 --reps ${REPS:-30} --engines 0 $v
  done
  ;;
hybrid)
  # (the interpreter cases are the CI's: the GPU machine's older Triton interpreter fails them)
  TAIL=6 run ${TEST_LIMIT:-200} tests-gated-delta $PY -m pytest -q -p no:cacheprovider \
    -k "not interpreted" tests/w12_kernels/test_gated_delta_kernel.py tests/engine/test_gated_delta.py
  TAIL=12 run ${GDN_LIMIT:-150} gated-delta $PY benchmarks/gated_delta.py --json "$OUT/gated-delta.json"
  for mode in w12 bf16; do
    TAIL=8 run ${SCALE_LIMIT:-150} "bench-hybrid-27b-$mode" $W12 bench spec synthetic:hybrid-27b \
      --$mode --drafter random --forced-accept 3 --budgets "${BUDGETS:-1,16,64}" --modes chain,tree \
      --context 512 --max-new-tokens 8 --json "$OUT/bench-hybrid-27b-$mode.json"
  done
  TAIL=8 run ${DECODE_LIMIT:-150} decode-hybrid $PY benchmarks/decode.py \
    --models synthetic:hybrid-27b --batch 1,8 --tokens 48 --json "$OUT/decode-hybrid.json"
  ;;
int8head)  # the certified INT8 head: its GPU test, then its product against the W12 head
  TAIL=4 run 200 tests-int8-head $PY -m pytest -q -p no:cacheprovider -k "not interpreted and not demo" \
    tests/w12_kernels/test_int8_head.py tests/engine/test_certified_head.py
  TAIL=30 run ${BENCH_LIMIT:-300} int8-head $PY benchmarks/int8_head.py --m ${M_LIST:-1,8,32,64} \
    --margins ${MARGINS:-0,6} --json "$OUT/int8-head.json"
  ;;
int8head-sweep)  # the INT8 product's tiles (lab/int8_head_sweep.py) against the W12 head
  TAIL=12 run ${SWEEP_LIMIT:-300} int8-head-sweep $PY lab/int8_head_sweep.py --m ${M_LIST:-1,16,64}
  ;;
view8)  # the 8-bit view GEMM: GPU tests, then its benchmark against the exact W12 GEMM
  TAIL=4 run 200 tests-view8 $PY -m pytest -q -p no:cacheprovider -k "gpu" \
    tests/w12_kernels/test_view8.py tests/engine/test_two_level.py
  TAIL=14 run ${BENCH_LIMIT:-300} view8 $PY benchmarks/view8.py --models ${MODELS:-qwen3_8b,qwen3_32b} \
    --m ${M_LIST:-1,4,16,32,64,128} --json "$OUT/view8.json"
  ;;
view8-sweep)  # the view GEMM's configuration grid (benchmarks/view8.py --sweep)
  TAIL=12 run ${SWEEP_LIMIT:-400} view8-sweep $PY benchmarks/view8.py \
    --shapes ${SHAPES:-4096x4096,24576x4096} --m ${M_LIST:-1,16,32} --sweep \
    --json "$OUT/view8-sweep.json"
  ;;
tlv)  # two-level verification against one exact pass, same run (issue: TLV and the INT8 head)
  $W12 demo --quiet > "$OUT/demo.txt" 2>&1 || { tail "$OUT/demo.txt"; exit 1; }
  MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 | head -1)
  for d in "${EARLY_BENCH:-early-exit:20}" ngram; do
    TAIL=16 run ${BENCH_LIMIT:-200} "bench-tlv-${d%%:*}" $W12 bench spec "$MODEL" --drafter "$d" \
      --prompts "${PROMPTS:-humaneval}" --limit 12 --budgets 1,16,32 --two-level ${Q:-8} \
      --max-new-tokens 128 --json "$OUT/bench-tlv-${d%%:*}.json"
  done
  ;;
tlv-scale)  # two-level verification's c(N) at scale: both passes forced to accept K
  for preset in ${PRESETS:-qwen3-8b qwen3-32b}; do
    TAIL=14 run ${SCALE_LIMIT:-200} "bench-tlv-$preset" $W12 bench spec "synthetic:$preset" --w12 \
      --drafter early-exit:4 --forced-accept ${K:-3} --budgets 1,16,32 --modes chain,tree \
      --two-level ${Q:-8} --context 512 --max-new-tokens 8 --json "$OUT/bench-tlv-$preset.json"
  done
  ;;
two-gpus)  # kernels on the GPU of their tensors, not the current one
  TAIL=4 run 300 tests-two-gpus $PY -m pytest -q -p no:cacheprovider \
    tests/w12_kernels/test_other_device.py tests/w12_kernels/test_gemm_cuda.py -k "other"
  ;;
attention)
  TAIL=30 run 200 tree-attention $PY benchmarks/tree_attention.py --json "$OUT/tree-attention.json"
  ;;
attention-sweep)  # the T = 1 decode regression: tree-attention configurations (splits, warps)
  # at batch 1, 8 and 32 against the former decode kernel, trees of 16 alongside (a
  # configuration changes decode and verify bits alike; each run checks they still agree)
  for c in "" "--splits 8" "--splits 4" "--splits 8 --warps 4"; do
    n=$(echo "x$c" | tr -d ' -')
    TAIL=6 run ${SWEEP_LIMIT:-70} "attention-$n" $PY benchmarks/tree_attention.py \
      --models qwen3-8b qwen3-32b --contexts 512 2048 --nodes 1 16 --batches 1 8 32 --calls 10 \
      $c --json "$OUT/attention-$n.json"
  done
  ;;
sglang)  # decode steps inside SGLang's Qwen3 class, W12 against BF16 (issue: SGLang end to end)
  SITE=${SITE:-/tmp/sglang-site}
  $PY -m pip install -q --no-index --no-deps --target "$SITE" "${WHEELS:?WHEELS=DIR of wheels}"/*.whl \
    > "$OUT/sglang-install.txt" 2>&1 || { tail "$OUT/sglang-install.txt"; exit 1; }
  PYTHONPATH="$SITE:$PYTHONPATH" TAIL=8 run ${SGLANG_LIMIT:-400} sglang-decode $PY lab/sglang_decode.py \
    --preset ${PRESET:-qwen3-8b} --batch ${BATCHES:-1,8,32} --context ${CONTEXT:-512} \
    --tp ${TP:-1} --json "$OUT/sglang-decode.json"
  ;;
drafter)
  $W12 demo --quiet > "$OUT/demo.txt" 2>&1 || { tail "$OUT/demo.txt"; exit 1; }
  MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 | head -1)
  RUN=${DRAFT_RUN:-out/drafter-run}  # in the tree, where drafter-eval looks for it
  rm -rf "$RUN" "$OUT/drafter"
  # the whole command, data generation included, is what the 10-minute limit is about
  began=$(date +%s)
  timeout ${TRAIN_LIMIT:-590} $W12 draft train "$MODEL" --out "$RUN" --device cuda \
    ${TRAIN_FLAGS:---minutes 6} > "$OUT/draft-train.txt" 2>&1
  rc=$?
  echo "draft train exited $rc after $(( $(date +%s) - began )) s" | tee -a "$OUT/draft-train.txt"
  tr '\r' '\n' < "$OUT/draft-train.txt" | grep -v '^$' | tail -${TAIL:-6}
  # into $OUT: the W12 drafter (shards of at most 10 MB), the loss curve, the log
  mkdir -p "$OUT/drafter" && cp -r "$RUN"/w12/. "$OUT/drafter/" && \
    cp "$RUN"/loss.png "$RUN"/train_log.json "$OUT/" 2>/dev/null
  rm -f "$OUT/demo.txt"
  ;;
drafter-eval)
  DRAFT=${2:-${DRAFT_RUN:-out/drafter-run}/w12}
  MODEL=$(ls -d "${W12_CACHE:-$HOME/.cache/w12}"/models/*-w12 | head -1)
  PROMPTS=${PROMPTS:-humaneval}
  for s in "greedy:--temperature 0" \
           "sampled:--temperature 0.7 --top-p 0.95 --seed 1 ${SAMPLED_LIMIT:+--limit $SAMPLED_LIMIT}"; do
    name=${s%%:*}; flags=${s#*:}
    TAIL=2 run ${CHECK_LIMIT:-150} "check-block-chain-$name" $W12 spec check "$MODEL" --drafter "$DRAFT" \
      --chain --budget 16 --batch 8 --prompts "$PROMPTS" --max-new-tokens 256 $flags --quiet
    TAIL=2 run ${CHECK_LIMIT:-150} "check-block-tree-$name" $W12 spec check "$MODEL" --drafter "$DRAFT" \
      --budget 64 --batch 2 --prompts "$PROMPTS" --max-new-tokens 256 $flags --quiet
  done
  TAIL=8 run ${BENCH_LIMIT:-240} bench-block $W12 bench spec "$MODEL" --drafter "$DRAFT" \
    --prompts "$PROMPTS" --limit ${BENCH_PROMPTS:-32} --budgets 16,64 --max-new-tokens 256 \
    --json "$OUT/bench-block.json"
  ;;
*) echo "unknown stage $STAGE"; exit 2 ;;
esac
