#!/usr/bin/env bash
# The W12 GEMM of the working tree against the one of a git revision, in one call on a GPU:
#   bash lab/compare_revisions.sh OLD_REV
# On a machine whose checkout has no git history, export the revision first where it has one,
# into a folder inside the tree that git does not ignore, and pass the folder:
#   bash lab/compare_revisions.sh --export OLD_REV old-tree   # then, on the GPU machine:
#   bash lab/compare_revisions.sh old-tree
# 1. exports OLD_REV into a temporary directory (git archive), or takes the folder given;
# 2. computes w12_linear of both trees, each in its own processes (WORKERS a tree), on the same
#    seeded inputs over every shape of the table (SHAPES: NxK,...) at every M of M_LIST, and
#    compares the bits (65..128 rows also through the prefill path); this compiles the table's
#    kernels of both trees in parallel, which the later stages then find in CuPy's cache;
# 3. runs the GPU tests of the working tree's GEMM (TESTS: pytest files, TEST_K: -k, TEST_LIMIT);
# 4. runs both trees' benchmarks/gemm.py on BENCH_MODELS at BENCH_M, alternating old and new a
#    model at a time, and prints the ratio table (new / old time per shape and M; the last
#    lines per M).
# Each stage has its own time limit, so that one that fails does not hide the others; the exit
# status is 1 where the tests failed or any output's bits differ. OUT (default
# compare-out) keeps the JSON files and logs.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "${1:-}" = --export ]; then
  REV=${2:?usage: bash lab/compare_revisions.sh --export OLD_REV DIR}
  DIR=${3:?usage: bash lab/compare_revisions.sh --export OLD_REV DIR}
  mkdir -p "$DIR" && git -C "$ROOT" archive "$REV" w12 w12_kernels benchmarks | tar -x -C "$DIR" \
    || exit 2
  echo "exported w12, w12_kernels and benchmarks of $REV into $DIR"
  exit 0
fi
OLD_REV=${1:?usage: bash lab/compare_revisions.sh OLD_REV (a git revision, or a folder holding one)}
PYTHON=${PYTHON:-python3}
M_LIST=${M_LIST:-1,2,4,8,16,24,32,48,64,96,128,256,512,1024,2048}
SHAPES=${SHAPES:-}
WORKERS=${WORKERS:-4}
DEVICE=${DEVICE:-cuda}  # (cpu: the CPU path, to try the script without a GPU)
BENCH_MODELS=${BENCH_MODELS-llama8b,qwen3_32b}  # (empty: no benchmark)
BENCH_M=${BENCH_M:-1,8,32,256,1024}
TESTS=${TESTS-tests/w12_kernels/test_gemm_cuda.py tests/w12_kernels/test_gemm_wgmma.py}  # (empty: none)
TEST_K=${TEST_K:-}
TEST_LIMIT=${TEST_LIMIT:-180}  # seconds, the tests
BITS_LIMIT=${BITS_LIMIT:-180}  # seconds, each tree's outputs
BENCH_LIMIT=${BENCH_LIMIT:-120}  # seconds, each run of the benchmark
OUT=${OUT:-compare-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
OLD=$(mktemp -d)
trap 'rm -rf "$OLD"' EXIT
status=0
cd "$ROOT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null
echo "new: $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet 2>/dev/null || echo ' (modified)')   old: $OLD_REV"

echo "== 1. the old revision"
if [ -d "$OLD_REV" ]; then
  cp -r "$OLD_REV"/. "$OLD"/
else
  git archive "$OLD_REV" w12 w12_kernels benchmarks | tar -x -C "$OLD" \
    || { echo "cannot export $OLD_REV (no git history here? see --export)"; exit 2; }
fi

echo "== 2. bits of w12_linear, old and new"
for side in old new; do
  tree=$ROOT; [ "$side" = old ] && tree=$OLD
  timeout "$BITS_LIMIT" "$PYTHON" "$ROOT/lab/compare_revisions.py" outputs --tree "$tree" \
    --out "$OUT/bits-$side.json" --m "$M_LIST" ${SHAPES:+--shapes "$SHAPES"} \
    --workers "$WORKERS" --device "$DEVICE" > "$OUT/bits-$side.log" 2>&1 \
    || { echo "the $side outputs failed or ran past ${BITS_LIMIT} s: $OUT/bits-$side.log"
         tail -5 "$OUT/bits-$side.log"; status=1; }
done
"$PYTHON" "$ROOT/lab/compare_revisions.py" bits "$OUT/bits-old.json" "$OUT/bits-new.json" \
  || status=1

echo "== 3. GPU tests of the new tree"
if [ -n "$TESTS" ]; then
  PYTHONPATH="$ROOT" timeout "$TEST_LIMIT" "$PYTHON" -m pytest $TESTS -q -x -p no:cacheprovider \
    ${TEST_K:+-k "$TEST_K"} 2>&1 | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "TESTS FAILED (or ran past ${TEST_LIMIT} s)"; status=1; }
fi

echo "== 4. benchmarks/gemm.py, old and new"
OLD_JSON=; NEW_JSON=
for model in ${BENCH_MODELS//,/ }; do
  for side in old new; do
    tree=$ROOT; [ "$side" = old ] && tree=$OLD
    json="$OUT/bench-$side-$model.json"
    (cd "$tree" && PYTHONPATH="$tree" timeout "$BENCH_LIMIT" "$PYTHON" benchmarks/gemm.py \
      --models "$model" --m "$BENCH_M" --json "$json" > "$OUT/bench-$side-$model.log" 2>&1) \
      || { echo "the $side benchmark of $model failed or ran past ${BENCH_LIMIT} s"; continue; }
    if [ "$side" = old ]; then OLD_JSON="$OLD_JSON,$json"; else NEW_JSON="$NEW_JSON,$json"; fi
  done
done
if [ -n "$OLD_JSON" ] && [ -n "$NEW_JSON" ]; then
  "$PYTHON" "$ROOT/lab/compare_revisions.py" ratios --old "${OLD_JSON#,}" --new "${NEW_JSON#,}" \
    | tee "$OUT/ratios.txt"
fi
exit $status
