"""Where a verify step's row stops matching the plain decode step at its position, op by op.

    python lab/spec_divergence.py --model synthetic:smollm2-135m --batch 8 --nodes 16

Prefills ``--batch`` random prompts of different lengths, runs a few plain steps, then runs a
chain of ``--nodes`` tokens per request through one verify forward and the same tokens through
plain decode steps, recording every linear layer's input and output (forward hooks) on both
sides. Prints, per module in execution order, how many (request, node) rows differ bit for bit:
the first module with a difference is where the two paths part (its input equal and its output
not: that module; its input already different: something before it that has no hook, such as
attention, a norm or RoPE).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.attention import AttentionPlan  # noqa: E402
from engine.generate import Engine  # noqa: E402
from engine.model import Linear  # noqa: E402
from engine.speculative import DraftTree  # noqa: E402
from engine.weights import load_model  # noqa: E402


def record(model) -> tuple[dict[str, list], list]:
    seen: dict[str, list] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            def hook(mod, args, out, name=name):
                seen.setdefault(name, []).append((args[0].detach().clone(), out.detach().clone()))
            handles.append(module.register_forward_hook(hook))
    return seen, handles


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="synthetic:smollm2-135m")
    parser.add_argument("--mode", default="w12")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile", action="store_true", help="torch.compile the elementwise ops")
    args = parser.parse_args(argv)
    model = load_model(args.model, mode=args.mode, device=args.device).model
    gen = torch.Generator().manual_seed(args.seed)
    vocab, b, n = model.args.vocab_size, args.batch, args.nodes
    prompts = [torch.randint(0, vocab, (int(torch.randint(10, 90, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in range(b)]
    chains = torch.randint(0, vocab, (b, n), generator=gen).to(args.device)
    engine = Engine(model, batch=b, max_seq_len=256, cuda_graph=False, compile=args.compile)
    logits = engine.prefill(prompts)
    for _ in range(3):
        logits = engine.step(logits.argmax(-1))
    lengths = engine.cache.lengths.clone()
    seen, handles = record(model)
    tree = DraftTree.chain(chains[:, 0], chains[:, 1:])
    with torch.inference_mode():
        model(tree.tokens, lengths[:, None] + tree.depth, engine.cache,
              AttentionPlan.tree(lengths, tree.paths()))
    tree_seen = {k: v[0] for k, v in seen.items()}
    seen.clear()
    engine.cache.lengths.copy_(lengths)
    engine.next_slot = int(lengths.max())
    for i in range(n):
        engine.step(chains[:, i])
    for h in handles:
        h.remove()
    print(f"{args.model} {args.mode}{' compiled' if args.compile else ''}: batch {b}, "
          f"chain of {n} nodes, lengths {lengths.tolist()}")
    print(f"{'module':<28} {'inputs differ':>14} {'outputs differ':>15}  (of {b * n} rows;"
          " modules with no difference left out)")
    shown = 0
    for name, (t_in, t_out) in tree_seen.items():
        steps = seen[name]
        rows_in = rows_out = 0
        for i, (s_in, s_out) in enumerate(steps):
            a_in = t_in.reshape(b, n, -1)[:, i]
            a_out = t_out.reshape(b, n, -1)[:, i]
            rows_in += int((a_in.view(torch.int16) != s_in.reshape(b, -1).view(torch.int16))
                           .any(-1).sum())
            rows_out += int((a_out.view(torch.int16) != s_out.reshape(b, -1).view(torch.int16))
                            .any(-1).sum())
        if rows_in or rows_out:
            shown += 1
            if shown <= 12:
                print(f"{name:<28} {rows_in:>14} {rows_out:>15}")
    print(f"{shown} of {len(tree_seen)} linear modules differ somewhere")
    sampling_probe(vocab, args.device)
    return 0


def sampling_probe(vocab: int, device: str) -> None:
    """Whether the sampling ops give a row the same bits alone, among 8 rows and among 128."""
    from engine.sampling import Sampling, choose, row_cumsum

    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(128, vocab, generator=gen) * 4).to(device)
    scaled = logits / 0.7
    ops = {
        "softmax": lambda x: torch.softmax(x, dim=-1),
        "sort": lambda x: torch.softmax(x, dim=-1).sort(dim=-1, descending=True, stable=True)[0],
        "cumsum": lambda x: torch.softmax(x, dim=-1).sort(dim=-1, descending=True,
                                                          stable=True)[0].cumsum(dim=-1),
        "row_cumsum": lambda x: row_cumsum(torch.softmax(x, dim=-1).sort(
            dim=-1, descending=True, stable=True)[0]),
        "argmax": lambda x: (x * 0.7 * 2).round().argmax(dim=-1).float()[:, None],  # ties
        "choose": lambda x: choose(x * 0.7, Sampling(0.7, 0.95, 1),
                                   torch.zeros(x.shape[0], dtype=torch.long, device=device),
                                   torch.arange(x.shape[0], device=device)).float()[:, None],
    }
    print(f"sampling ops, rows that differ from the 128-row call (of 128): vocab {vocab}")
    for name, op in ops.items():
        full = op(scaled)
        for rows in (1, 8):
            part = torch.cat([op(scaled[i:i + rows]) for i in range(0, 128, rows)])
            if name == "choose":  # positions are keys: recompute with each slice's positions
                part = torch.cat([choose(scaled[i:i + rows] * 0.7, Sampling(0.7, 0.95, 1),
                                         torch.zeros(rows, dtype=torch.long, device=device),
                                         torch.arange(i, i + rows, device=device)).float()[:, None]
                                  for i in range(0, 128, rows)])
            differ = int((full != part).any(-1).sum())
            print(f"  {name:<10} alone in calls of {rows:>3} rows: {differ}")


if __name__ == "__main__":
    sys.exit(main())
