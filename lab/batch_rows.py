"""Which side of a batched exactness failure moves: plain decoding or speculative decoding.

    python lab/batch_rows.py MODEL --prompts FILE --limit 8 --batch 8 [--budget 16] [--no-compile]

Decodes the first ``--limit`` prompts plainly one at a time (the reference), plainly at
``--batch``, and speculatively at ``--batch`` (ngram drafter, chain of ``--budget`` nodes), all
greedy, and prints per prompt its reference length and the first new token where each batched
run leaves the reference ("=" where it never does). ``--repeat``: instead, the batched runs
twice each (speculative: on one engine, then on a fresh one) against their own first run, which
separates a batch effect from state left behind or nondeterminism.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generate import Engine, generate  # noqa: E402
from engine.speculative.api import first_difference, load_target, read_prompts  # noqa: E402
from engine.speculative.decode import SpecRunner, speculative_generate  # noqa: E402
from engine.speculative.drafters import make_drafter  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--repeat", action="store_true")
    parser.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                        help="CUDA graphs (default: on a GPU)")
    a = parser.parse_args()

    target = load_target(a.model, read_prompts(a.prompts, a.limit), mode=None, device=a.device)
    model, prompts = target.loaded.model, target.prompts
    room = max(map(len, prompts)) + a.tokens + a.budget

    def plain(batch: int, rows: list[list[int]]) -> list[list[int]]:
        engine = Engine(model, batch=batch, max_seq_len=room, compile=a.compile,
                        cuda_graph=a.graph)
        return generate(engine, rows, max_new_tokens=a.tokens, stop_ids=target.stop_ids)

    engine = Engine(model, batch=a.batch, max_seq_len=room, compile=a.compile,
                    cuda_graph=a.graph)
    drafter = make_drafter(a.drafter, model)

    def batched(run) -> list[list[int]]:
        out = []
        for start in range(0, len(prompts), a.batch):
            group = prompts[start:start + a.batch]
            out += run(group + [group[-1]] * (a.batch - len(group)))[:len(group)]
        return out

    def spec(rows, on=None):
        on = on or engine
        runner = SpecRunner(on, drafter, budget=a.budget, tree=False, cuda_graph=a.graph)
        out, _ = speculative_generate(on, drafter, rows, budget=a.budget, tree=False,
                                      max_new_tokens=a.tokens, stop_ids=target.stop_ids,
                                      runner=runner)
        return out

    if a.repeat:
        fresh = Engine(model, batch=a.batch, max_seq_len=room, compile=a.compile,
                       cuda_graph=a.graph)
        reference = batched(lambda rows: plain(a.batch, rows))
        runs = {"plain@B again": batched(lambda rows: plain(a.batch, rows)),
                "spec@B": batched(spec), "spec@B again": batched(spec),
                "spec@B fresh": batched(lambda rows: spec(rows, fresh))}
    else:
        reference = [plain(1, [p])[0] for p in prompts]
        runs = {"plain@B": batched(lambda rows: plain(a.batch, rows)), "spec@B": batched(spec)}
    print(f"{'prompt':>6} {'length':>6} {'prompt_tokens':>13} " +
          " ".join(f"{name:>14}" for name in runs))
    for i, ref in enumerate(reference):
        cells = ["=" if out[i] == ref else str(first_difference(ref, out[i])[0])
                 for out in runs.values()]
        print(f"{i:>6} {len(ref):>6} {len(prompts[i]):>13} " +
              " ".join(f"{c:>14}" for c in cells))


if __name__ == "__main__":
    main()
