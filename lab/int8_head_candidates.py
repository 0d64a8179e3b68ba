"""How many vocabulary rows the certified INT8 head must recompute exactly, on real hidden
states: greedy decoding of a model over prompts, every position's head input kept, then the
INT8 bounds (``w12_kernels.int8_head``), the candidates for greedy and for sampling at
``--temperature``, and the check that the certified choice equals the exact head's.

    python lab/int8_head_candidates.py MODEL_FOLDER --prompts humaneval --limit 16 --tokens 64
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generate import Engine, generate  # noqa: E402
from engine.sampling import gumbel_noise, row_keys  # noqa: E402
from engine.speculative.api import load_target, read_prompts  # noqa: E402
from w12_kernels.int8_head import certified_choice, logit_bounds, quantize  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--limit", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--device", default="cpu")
    a = parser.parse_args()
    target = load_target(a.model, read_prompts(a.prompts, a.limit), mode="bf16",
                         device=a.device)
    model = target.loaded.model
    kept: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(
        lambda _m, inputs, _out: kept.append(inputs[0].reshape(-1, inputs[0].shape[-1])))
    for prompt in target.prompts:  # one at a time: every head call is a generated position
        engine = Engine(model, batch=1, max_seq_len=len(prompt) + a.tokens + 1,
                        cuda_graph=False)
        generate(engine, [prompt], max_new_tokens=a.tokens, stop_ids=target.stop_ids)
    hook.remove()
    h = torch.cat([x[-1:] for x in kept])  # each call's last row: the position decoded
    weight = model.lm_head.weight
    with torch.inference_mode():
        exact = model.lm_head(h).float()
    head = quantize(weight.float().cpu())
    _, lo, hi = logit_bounds(head, h.cpu())
    exact = exact.cpu()
    keys = row_keys(1, torch.zeros(h.shape[0], dtype=torch.long), torch.arange(h.shape[0]))
    noise = gumbel_noise(keys, weight.shape[0])
    print(f"{target.loaded.name}: {h.shape[0]} positions, vocabulary {weight.shape[0]}, "
          f"K {weight.shape[1]}")
    for t, nz in ((0.0, None), (a.temperature, noise)):
        tokens, counts = certified_choice(lambda r, ids: exact[r, ids], lo, hi, temperature=t,
                                          noise=nz)
        want = exact.argmax(1) if t == 0 else (exact / t + noise).argmax(1)
        c = counts.float()
        print(f"T={t}: certified = exact on {int((tokens == want).sum())} of {len(want)}; "
              f"candidates mean {c.mean():.1f}, median {c.median():.0f}, p90 "
              f"{c.quantile(0.9):.0f}, max {c.max():.0f} ({100 * c.mean() / weight.shape[0]:.2f}%"
              " of the vocabulary)")


if __name__ == "__main__":
    main()
