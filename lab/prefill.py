"""Prefill time of one prompt, BF16 against W12, with W12's 65..128-row GEMMs both ways.

    python lab/prefill.py --models synthetic:qwen3-8b --lengths 32,65,100,128

For each model and weight mode, one causal forward over a random prompt of each length (the
engine's prefill, eager), timed as the median of ``--runs`` after a first, untimed one, each
bracketed by device synchronisation. W12 runs twice: with batch invariance kept to 128 rows
(two passes of the small-M kernel, the default) and inside ``invariant_rows(64)`` (the large-M
table, what ``Engine.prefill`` uses). Compare each W12 time with BF16's from the same run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.attention import AttentionPlan  # noqa: E402
from engine.weights import load_model  # noqa: E402
from w12_kernels.gemm import invariant_rows  # noqa: E402


def median_ms(fn, runs: int) -> float:
    fn()
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[runs // 2]


@torch.inference_mode()
def time_prefills(spec: str, lengths: list[int], runs: int) -> list[dict]:
    rows = []
    for mode in ("bf16", "w12"):
        model = load_model(spec, mode=mode, device="cuda").model
        for length in lengths:
            cache = model.new_cache(1, length)
            gen = torch.Generator().manual_seed(length)
            tokens = torch.randint(0, model.args.vocab_size, (1, length), generator=gen).cuda()
            pos = torch.arange(length, device="cuda").expand(1, length)
            last = torch.tensor([length - 1], device="cuda")

            def run(model=model, tokens=tokens, pos=pos, last=last, cache=cache):
                model(tokens, pos, cache, AttentionPlan.prefill(pos), last=last)

            for rows_kept in (128, 64) if mode == "w12" else (128,):
                with invariant_rows(rows_kept):
                    ms = median_ms(run, runs)
                rows.append(dict(model=spec, mode=mode, length=length,
                                 invariant_rows=rows_kept, ms=ms))
                print(f"{spec:<22} {mode:<5} invariant_rows {rows_kept:<4} prompt {length:>5}: "
                      f"{ms:9.3f} ms", flush=True)
        del model
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="synthetic:qwen3-8b")
    parser.add_argument("--lengths", default="32,65,100,128")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("lab/prefill.py needs a CUDA GPU")
    lengths = [int(v) for v in args.lengths.split(",")]
    rows = [r for spec in args.models.split(",") for r in time_prefills(spec, lengths, args.runs)]
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
