set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 OUT=${OUT:-out}
mkdir -p $OUT
nvidia-smi --query-gpu=name --format=csv,noheader
t0=$(date +%s)
timeout 120 python3 -m pytest -q -p no:cacheprovider -x tests/w12_kernels/test_tree_attention.py tests/w12_kernels/test_norm.py -k "gpu or cuda" > $OUT/t-attn.txt 2>&1; tail -3 $OUT/t-attn.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider -k "not interpreted" tests/w12_kernels/test_gated_delta_kernel.py > $OUT/t-gdn.txt 2>&1; tail -3 $OUT/t-gdn.txt
echo "t $(( $(date +%s) - t0 ))"
timeout 90 python3 benchmarks/gated_delta.py --nodes 1,16,64 --json $OUT/gdn-a.json > $OUT/gdn-a.txt 2>&1; tail -8 $OUT/gdn-a.txt
timeout 60 python3 benchmarks/gated_delta.py --nodes 128 --json $OUT/gdn-b.json > $OUT/gdn-b.txt 2>&1; tail -4 $OUT/gdn-b.txt
echo "t $(( $(date +%s) - t0 ))"
for c in "" "--chunk 4" "--chunk 8"; do n=$(echo "x$c" | tr -d ' -')
 timeout 50 python3 benchmarks/tree_attention.py --models qwen3-8b --contexts 512 2048 --nodes 1 16 --batches 1 32 --calls 10 $c --json $OUT/attention-$n.json > $OUT/attention-$n.txt 2>&1; tail -9 $OUT/attention-$n.txt
done
echo "t $(( $(date +%s) - t0 ))"
timeout $(( 560 - ($(date +%s) - t0) )) python3 -m pytest -q -p no:cacheprovider tests/engine/test_speculative_cuda.py tests/engine/test_engine_cuda.py > $OUT/t-engine.txt 2>&1; tail -8 $OUT/t-engine.txt
echo "t $(( $(date +%s) - t0 ))"
