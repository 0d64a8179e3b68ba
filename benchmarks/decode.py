"""Decode speed of W12 against BF16 weights, same model, same run, on one GPU.

    python benchmarks/decode.py --models synthetic:qwen3-8b,synthetic:qwen3-32b \
        --batch 1,8,32 --tokens 256 --json out/decode.json

For each model, BF16 is built and timed first, then W12 (a synthetic preset is redrawn from
the same seed, so both hold the same weights; a folder is read twice). Each batch size gets a
fresh static cache and a captured CUDA-graph decode step; ``--tokens`` greedy steps are timed
back to back after ``--warmup`` steps. Printed per row: tokens/s, ms per step, bytes of weights
one step streams and the bandwidth that achieves; the last lines are the W12/BF16 speed-ups
and the memory W12 frees for the KV cache. Needs only torch (and triton for the W12 kernels);
a folder model also reads its config and safetensors files. ``--json`` writes the harness's
record: the environment, one row per model, mode and batch, the settings and the summaries.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from harness import environment, project_on_path, write_json

project_on_path()

from engine.bench import as_dicts, bench_decode, summary  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="synthetic:qwen3-8b,synthetic:qwen3-32b")
    parser.add_argument("--batch", default="1,8,32")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=8)
    parser.add_argument("--modes", default="bf16,w12")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-compile", action="store_true",
                        help="Eager elementwise ops (default: torch.compile on CUDA).")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--attention", default="auto",
                        help="decode attention: auto (= tree), tree (the tree-attention kernels), "
                             "torch (masked matmuls), or tree,torch to time both on the same "
                             "loaded model")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    batches = [int(b) for b in args.batch.split(",")]
    compile_ops = args.device.startswith("cuda") and not args.no_compile
    env = environment(args.device)
    # the file's name only: a directory would record where the run happened
    settings = vars(args) | {"json": args.json.name if args.json else None,
                             "compile": compile_ops}
    rows, summaries = [], {}
    print(f"# {env}  compile={compile_ops}  attention={args.attention}", flush=True)
    for model in args.models.split(","):
        results = bench_decode(
            model, batches=batches, tokens=args.tokens, modes=tuple(args.modes.split(",")),
            device=args.device, compile=compile_ops, prompt_len=args.prompt_len,
            warmup=args.warmup, seed=args.seed, log=lambda line: print(line, flush=True),
            attention=tuple(args.attention.split(",")),
        )
        rows += as_dicts(results)
        summaries[model] = summary(results)
        for line in summaries[model]:
            print(line, flush=True)
        # after every model, so that a later failure keeps the numbers
        write_json(args.json, rows, env, settings=settings, summary=summaries)
    return 0


if __name__ == "__main__":
    sys.exit(main())
