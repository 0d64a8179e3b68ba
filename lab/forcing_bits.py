"""Which decoding path gives a row other logits bits than plain decoding at batch 1.

    python lab/forcing_bits.py --model synthetic:smollm2-135m --paths decode:8,chain:8 --steps 300

Forces the same random continuation of random prompts (lengths in ``--lengths``) through
each of ``--paths``: plain decode steps, or the speculative verify step (chain and tree of
``--budget`` nodes, acceptance forced along the continuation), each at its batch, with the
engine's own paths (``spec_tuning.engine_forcing``: CUDA graphs on a GPU). Every row's logits
at every position are reduced to a 64-bit fingerprint of their bits; prints, per path, how
many (row, position) logits differ from the first path's and the first few, with the position
and the top-2 margin there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.weights import load_model  # noqa: E402
from spec_tuning import engine_forcing as ef  # noqa: E402


class BitsRecorder:
    """``engine_forcing``'s recorder interface, keeping a fingerprint of each row's logits."""

    def __init__(self, group, weights: torch.Tensor) -> None:
        self.group, self.weights = group, weights
        steps = group.forced.shape[1]
        self.prints = np.zeros((len(group.prompts), steps), dtype=np.int64)
        self.margin = np.zeros((len(group.prompts), steps))

    def record(self, logits: torch.Tensor, offset: int):
        if offset < self.prints.shape[1]:
            bits = logits.float().contiguous().view(torch.int32).long()
            self.prints[:, offset] = (bits * self.weights).sum(-1).cpu().numpy()
            top = logits.float().topk(2, dim=-1).values
            self.margin[:, offset] = (top[:, 0] - top[:, 1]).cpu().numpy()
        return None


def run_path(model, prompts, forced, batch, kind, budget, weights):
    """[prompts, steps] fingerprints of ``kind`` ("decode", "chain", "tree") at ``batch``."""
    out = np.zeros(forced.shape, dtype=np.int64)
    margin = np.zeros(forced.shape)
    for group in ef._groups(prompts, list(forced), batch):
        rec = BitsRecorder(group, weights)
        if kind == "decode":
            ef._force_decode(model, group, rec)
        else:
            ef._force_verify(model, group, rec, ef.ForcingPath(kind, budget))
        for row, i in enumerate(group.index):
            out[i], margin[i] = rec.prints[row], rec.margin[row]
    return out, margin


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="synthetic:smollm2-135m")
    parser.add_argument("--mode", default="w12")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--lengths", default="100,500", help="prompt lengths, low,high")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--paths", default="decode:8,chain:8,tree:8",
                        help="KIND:BATCH,...: the reference first (a prefill's bits depend on "
                        "the batch, so compare at one batch); KIND decode, chain or tree")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    model = load_model(args.model, mode=args.mode, device=args.device).model
    vocab = model.args.vocab_size
    gen = torch.Generator().manual_seed(args.seed)
    lo, hi = map(int, args.lengths.split(","))
    prompts = [torch.randint(0, vocab, (int(torch.randint(lo, hi + 1, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in range(args.prompts)]
    forced = torch.randint(0, vocab, (args.prompts, args.steps), generator=gen).numpy()
    weights = torch.randint(1, 1 << 20, (vocab,), generator=gen).to(args.device)
    paths = [(kind, int(batch)) for kind, batch in (x.split(":") for x in args.paths.split(","))]
    ref, margin = run_path(model, prompts, forced, paths[0][1], paths[0][0], args.budget, weights)
    print(f"{args.model} {args.mode}: {args.prompts} prompts of {[len(p) for p in prompts]} "
          f"tokens, {args.steps} forced tokens; reference: {paths[0][0]} at batch {paths[0][1]}")
    for kind, batch in paths[1:]:
        got, _ = run_path(model, prompts, forced, batch, kind, args.budget, weights)
        rows, cols = np.nonzero(got != ref)
        print(f"{kind:>6} batch {batch:>3}: {len(rows)} of {ref.size} logits differ")
        order = np.argsort(cols, kind="stable")[:6]
        for r, c in zip(rows[order], cols[order], strict=True):
            print(f"         prompt {r} step {c} (position {len(prompts[r]) + c}), "
                  f"top-2 margin {margin[r, c]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
