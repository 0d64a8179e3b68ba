"""Decode speed of W12 against BF16 weights, same model, same run, on one GPU.

    python benchmarks/decode.py --models synthetic:qwen3-8b,synthetic:qwen3-32b \
        --batch 1,8,32 --tokens 256 --json out/decode.json

For each model, BF16 is built and timed first, then W12 (a synthetic preset is redrawn from
the same seed, so both hold the same weights; a folder is read twice). Each batch size gets a
fresh static cache and a captured CUDA-graph decode step; ``--tokens`` greedy steps are timed
back to back after ``--warmup`` steps. Printed per row: tokens/s, ms per step, bytes of weights
one step streams and the bandwidth that achieves; the last lines are the W12/BF16 speed-ups
and the memory W12 frees for the KV cache. Needs only torch (and triton for the W12 kernels);
a folder model also reads its config and safetensors files.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.bench import as_dicts, bench_decode, summary  # noqa: E402


def _commit() -> str:
    try:
        root = Path(__file__).resolve().parents[1]
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                             text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True,
                               text=True, timeout=10).stdout.strip()
        return (out.stdout.strip() or "uncommitted") + (" (modified)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _environment(device: str) -> dict:
    env = {"torch": torch.__version__, "commit": _commit(), "date": time.strftime("%Y-%m-%d")}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        env["gpu"] = props.name
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return env


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
                        help="decode attention: auto (triton on CUDA), torch, triton (one kernel "
                             "per layer), or "
                             "torch,triton to time both on the same loaded model")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    batches = [int(b) for b in args.batch.split(",")]
    compile_ops = args.device.startswith("cuda") and not args.no_compile
    report = {"environment": _environment(args.device), "settings": vars(args) | {
        # the file's name only: a directory would record where the run happened
        "json": args.json.name if args.json else None, "compile": compile_ops}, "models": {}}
    print(f"# {report['environment']}  compile={compile_ops}  attention={args.attention}",
          flush=True)
    for model in args.models.split(","):
        results = bench_decode(
            model, batches=batches, tokens=args.tokens, modes=tuple(args.modes.split(",")),
            device=args.device, compile=compile_ops, prompt_len=args.prompt_len,
            warmup=args.warmup, seed=args.seed, log=lambda line: print(line, flush=True),
            attention=tuple(args.attention.split(",")),
        )
        lines = summary(results)
        report["models"][model] = {"results": as_dicts(results), "summary": lines}
        for line in lines:
            print(line, flush=True)
        if args.json is not None:  # after every model, so a later failure keeps the numbers
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
