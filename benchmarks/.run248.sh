#!/bin/bash
set -x
python3 benchmarks/gemm.py --sweep-large --m 256,512,1024 --write-table > $OUT/sweep.txt 2>&1
cp w12_kernels/gemm/tuned.json $OUT/tuned.json
grep "default\|wrote" $OUT/sweep.txt | cut -c1-300
python3 benchmarks/gemm.py --m 256,512,1024 --json $OUT/large.json > $OUT/large.txt 2>&1
tail -4 $OUT/large.txt
