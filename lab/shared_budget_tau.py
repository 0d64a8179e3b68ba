"""Tokens per verify step: per-request trees against one node budget shared by all requests.

    python lab/shared_budget_tau.py MODEL --drafter early-exit:4 --concurrency 8 --nodes 8 \
        --width 16 --prompts humaneval --limit 16 --max-new-tokens 64

Serves the same requests twice with continuous batching (``engine.serving.Server``): trees of
``--nodes`` nodes per request, then trees of up to ``--width`` nodes per request cut to
``--nodes`` x ``--concurrency`` nodes over all rows by path score (``tree.share_budget``).
Both verify the same number of drafted nodes per step when every row is busy; prints tau
(tokens committed per active row and step) of each and the ratio, and checks that both
returned the same tokens. tau does not depend on the device where the kernels are row-exact,
so a CPU run measures it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generate import Engine  # noqa: E402
from engine.serving import Server  # noqa: E402
from engine.speculative import make_drafter  # noqa: E402
from engine.speculative.api import load_target, read_prompts  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--drafter", default="early-exit:4")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=8, help="nodes per request (root included)")
    parser.add_argument("--width", type=int, default=16, help="most nodes one request may get")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    target = load_target(args.model, read_prompts(args.prompts, args.limit), mode=None,
                         device=args.device)
    model, c = target.loaded.model, args.concurrency
    seq = max(map(len, target.prompts)) + args.max_new_tokens + args.width
    results = {}
    for name, budget, shared in (("per request", args.nodes, None),
                                 ("shared", args.width, args.nodes * c)):
        server = Server(Engine(model, batch=c, max_seq_len=seq), budget=budget, tree=True,
                        drafter=make_drafter(args.drafter, model), shared_total=shared,
                        stop_ids=target.stop_ids)
        for prompt in target.prompts:
            server.submit(prompt, max_new_tokens=args.max_new_tokens)
        out, stats = server.run()
        results[name] = (out, stats)
        print(f"{name:<12} budget {budget:>3} shared {shared}: tau {stats.tau:.4f} over "
              f"{len(stats.committed)} row-steps, {stats.steps} steps", flush=True)
    same = results["per request"][0] == results["shared"][0]
    ratio = results["shared"][1].tau / results["per request"][1].tau
    print(f"{target.loaded.name} {args.drafter}, {len(target.prompts)} prompts x "
          f"{args.max_new_tokens} tokens, concurrency {c}, {args.nodes} nodes a request vs "
          f"{args.nodes * c} shared (width {args.width}): tau x{ratio:.4f}; "
          f"tokens {'equal' if same else 'DIFFERENT'}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
