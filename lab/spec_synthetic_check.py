"""`w12 spec check` for a model without a tokenizer: random prompts, plain against speculative.

    python lab/spec_synthetic_check.py --model synthetic:smollm2-135m --batch 8 --budget 16

Decodes ``--prompts`` random token prompts (lengths in ``--lengths``) plainly and
speculatively (prompt lookup, chain of ``--budget`` nodes) on one engine of ``--batch`` rows
whose cache is the smallest the length check allows, greedy and sampled, and prints whether the
tokens are equal, the first difference, tau, and how many rows ran to ``--max-new-tokens``
(a row that finishes there in a step accepting past it, while others go on, is the case a
finished row's later steps must survive). Random weights loop often enough for prompt lookup
to accept runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generate import Engine, generate  # noqa: E402
from engine.sampling import Sampling  # noqa: E402
from engine.speculative import make_drafter, speculative_generate  # noqa: E402
from engine.speculative.api import first_difference  # noqa: E402
from engine.weights import load_model  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="synthetic:smollm2-135m")
    parser.add_argument("--mode", default="w12")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--lengths", default="40,160")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    model = load_model(args.model, mode=args.mode, device=args.device).model
    gen = torch.Generator().manual_seed(args.seed)
    lo, hi = map(int, args.lengths.split(","))
    prompts = [torch.randint(0, model.args.vocab_size,
                             (int(torch.randint(lo, hi + 1, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in range(args.prompts)]
    longest, new = max(map(len, prompts)), args.max_new_tokens
    engine = Engine(model, batch=args.batch, max_seq_len=longest + new + args.budget)
    failed = 0
    for name, sampling in (("greedy", Sampling()), ("sampled", Sampling(0.7, 0.95, 1))):
        steps, committed, full, verdict = 0, 0, 0, "equal"
        for start in range(0, len(prompts), args.batch):
            group = prompts[start:start + args.batch]
            group = group + [group[-1]] * (args.batch - len(group))
            plain = generate(engine, group, max_new_tokens=new, sampling=sampling)
            drafter = make_drafter("ngram", model)
            spec, stats = speculative_generate(engine, drafter, group, max_new_tokens=new,
                                               budget=args.budget, tree=False,
                                               sampling=sampling)
            steps += len(stats.committed)
            committed += sum(stats.committed)
            full += sum(1 for row in range(len(group)) if len(spec[row]) == new)
            for row in range(len(group)):
                if spec[row] != plain[row] and verdict == "equal":
                    pos, a, b = first_difference(plain[row], spec[row])
                    verdict = f"DIFFERENT: prompt {start + row}, new token {pos}: plain {a}, " \
                              f"speculative {b}"
        failed += verdict != "equal"
        print(f"{args.model} {args.mode} {name}: {len(prompts)} prompts x {new} tokens at batch "
              f"{args.batch}, chain {args.budget}: {verdict}; tau {committed / steps:.3f}; "
              f"rows that reached max_new_tokens: {full}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
