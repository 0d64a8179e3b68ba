"""The certified INT8 head against the exact head on many positions: real hidden states of a
model (every position it decodes, greedy and sampled, over prompt sets) and random ones at a
large head's scale. For each position the certified choice (``w12_kernels.int8_head``
reference: per-row INT8 weights, float64 bounds, the exact logits of the candidates only) must
equal the exact head's greedy token and its keyed-noise sample at ``--temperature``.

    python lab/int8_head_exactness.py MODEL_FOLDER --prompts humaneval,stdlib:1000 \
        --tokens 256 --synthetic 151936x5120:2048
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generate import Engine, generate  # noqa: E402
from engine.sampling import Sampling, gumbel_noise, row_keys  # noqa: E402
from engine.speculative.api import load_target, read_prompts  # noqa: E402
from engine.speculative.stdlib_prompts import stdlib_prompts  # noqa: E402
from w12_kernels.int8_head import certified_choice, logit_bounds, quantize  # noqa: E402

CHUNK = 512  # positions checked at once (the float64 bounds are [CHUNK, V])


def prompt_texts(spec: str) -> list[str]:
    """``humaneval``, ``stdlib:N`` or a JSONL file, each optionally ``:N`` (the first N)."""
    texts: list[str] = []
    for part in spec.split(","):
        name, _, n = part.partition(":")
        limit = int(n) if n else None
        texts += stdlib_prompts(limit or 3072) if name == "stdlib" else read_prompts(name, limit)
    return texts


def decoded_states(model, prompts: list[list[int]], *, tokens: int, batch: int,
                   sampling: Sampling, stop_ids: frozenset[int]) -> torch.Tensor:
    """The LM head's input at every position the model decodes [N, dim], ``batch`` prompts a
    time (each head call holds one row a prompt; a row's calls past its end are dropped)."""
    kept: list[torch.Tensor] = []
    hook = model.lm_head.register_forward_hook(lambda _m, i, _o: calls.append(i[0][:, -1]))
    try:
        for start in range(0, len(prompts), batch):
            rows = prompts[start:start + batch]
            calls: list[torch.Tensor] = []
            engine = Engine(model, batch=len(rows), cuda_graph=False,
                            max_seq_len=max(map(len, rows)) + tokens + 1)
            outs = generate(engine, rows, max_new_tokens=tokens, sampling=sampling,
                            stop_ids=stop_ids)
            for r, out in enumerate(outs):
                kept += [calls[k][r] for k in range(len(out))]
            print(f"  {start + len(rows)}/{len(prompts)} prompts, {len(kept)} positions",
                  flush=True)
    finally:
        hook.remove()
    return torch.stack(kept)


def check(h: torch.Tensor, weight: torch.Tensor, temperature: float, label: str) -> int:
    """Certified against exact on every row of ``h``; prints one line per rule; the number of
    positions whose certified token differs (0 when the bounds hold)."""
    head = quantize(weight.float())
    v = weight.shape[0]
    wrong = {0.0: 0, temperature: 0}
    counts: dict[float, list[torch.Tensor]] = {0.0: [], temperature: []}
    began = time.perf_counter()
    for s in range(0, h.shape[0], CHUNK):
        x = h[s:s + CHUNK]
        exact = F.linear(x, weight).float()
        _, lo, hi = logit_bounds(head, x)
        keys = row_keys(1, torch.zeros(x.shape[0], dtype=torch.long),
                        torch.arange(s, s + x.shape[0]))
        noise = gumbel_noise(keys, v)
        for t, nz in ((0.0, None), (temperature, noise)):
            got, c = certified_choice(lambda r, ids, e=exact: e[r, ids], lo, hi,
                                      temperature=t, noise=nz)
            want = exact.argmax(1) if t == 0 else (exact / t + noise).argmax(1)
            wrong[t] += int((got != want).sum())
            counts[t].append(c)
    for t in (0.0, temperature):
        c = torch.cat(counts[t]).float()
        print(f"{label}: T={t:g}: certified = exact on {h.shape[0] - wrong[t]} of {h.shape[0]}; "
              f"candidates mean {c.mean():.1f}, median {c.median():.0f}, p90 "
              f"{c.quantile(0.9):.0f}, max {c.max():.0f} ({time.perf_counter() - began:.0f} s)",
              flush=True)
    return wrong[0.0] + wrong[temperature]


def synthetic_states(weight: torch.Tensor, m: int, margin: float, gen: torch.Generator
                     ) -> torch.Tensor:
    """Random BF16 hidden states with one outlier channel, each pushed along a random
    vocabulary row so that its logit stands ``margin`` standard deviations clear (0: the
    crowded top of random logits)."""
    v, k = weight.shape
    x = torch.randn(m, k, generator=gen)
    x[:, 7] = 30.0
    if margin:
        w = weight.float()
        spread = torch.cat([(x[i:i + CHUNK].to(torch.bfloat16).float() @ w.T).std(dim=1)
                            for i in range(0, m, CHUNK)])[:, None]
        rows = w[torch.randint(v, (m,), generator=gen)]
        x = x + margin * spread * rows / rows.norm(dim=1, keepdim=True) ** 2
    return x.to(torch.bfloat16)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="a model folder (real hidden states)")
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--decodings", default="greedy,sampled",
                        help="which decodings give the real positions (sampled: at "
                             "--temperature, top-p 0.95)")
    parser.add_argument("--synthetic", default="",
                        help="VxK:M[,...]: M random positions on a random V x K head, half at "
                             "margin 0 and half at margin 6")
    parser.add_argument("--threads", type=int, default=None)
    a = parser.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    total = wrong = 0
    if a.model:
        target = load_target(a.model, prompt_texts(a.prompts), mode="bf16", device="cpu")
        model = target.loaded.model
        weight = model.lm_head.weight
        print(f"{target.loaded.name}: {len(target.prompts)} prompts ({a.prompts}), "
              f"{a.tokens} tokens, vocabulary {weight.shape[0]}, K {weight.shape[1]}")
        decodings = {"greedy": ("greedy", Sampling()),
                     "sampled": (f"T {a.temperature:g} top-p 0.95",
                                 Sampling(a.temperature, 0.95, 1))}
        for name, sampling in (decodings[d] for d in a.decodings.split(",")):
            print(f"decoding ({name})", flush=True)
            with torch.inference_mode():
                h = decoded_states(model, target.prompts, tokens=a.tokens, batch=a.batch,
                                   sampling=sampling, stop_ids=target.stop_ids)
                wrong += check(h, weight, a.temperature, f"decoded {name}, {h.shape[0]} positions")
            total += h.shape[0]
    gen = torch.Generator().manual_seed(0)
    for spec in filter(None, a.synthetic.split(",")):
        shape, _, m = spec.partition(":")
        v, k = map(int, shape.split("x"))
        weight = (torch.randn(v, k, generator=gen) * 0.02).to(torch.bfloat16)
        for margin in (0.0, 6.0):
            with torch.inference_mode():
                h = synthetic_states(weight, int(m) // 2, margin, gen)
                wrong += check(h, weight, a.temperature,
                               f"random {v} x {k}, margin {margin:g}, {h.shape[0]} positions")
            total += h.shape[0]
    print(f"all: {total} positions, two rules each: {wrong} certified tokens differ")
    sys.exit(1 if wrong else 0)


if __name__ == "__main__":
    main()
