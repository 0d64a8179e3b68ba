"""``w12 bench serve``: continuous batching, plain against speculative, in the same run.

For each concurrency C (the engine's rows), the same requests (every prompt of the set, all
queued at once, ``max_new_tokens`` each) are served twice on one model: plain decode steps,
then speculative steps with the drafter. Reported per C and mode: tokens/s over the whole run,
request latency percentiles (queueing included: from the start of the run to the request's
last token), engine steps, tau (tokens per active row and step) and the speculative run's
speed-up over the plain one. Each run is preceded by an untimed one of the same shapes (CUDA
graphs captured and kernels compiled before the clock starts). Both runs return the same tokens
per request (each request's own plain decoding), which is checked.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import torch

from engine.generate import GREEDY, Engine
from engine.sampling import Sampling
from engine.serving import Server
from engine.speculative.drafters import make_drafter
from engine.weights import LoadedModel
from w12.errors import W12Error


@dataclass
class ServeRow:
    concurrency: int
    mode: str  # "plain", "spec", or a policy: "shared", "widths", "admit"
    requests: int
    tokens: int
    seconds: float
    tokens_per_s: float
    latency_p50_s: float
    latency_p90_s: float
    latency_max_s: float
    ttft_p50_s: float  # time to first token (the prefill's pick), from the start of the run
    ttft_p90_s: float
    steps: int
    tau: float
    speedup: float | None  # spec: tokens/s over the plain run at the same concurrency


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _serve(model, prompts, *, concurrency: int, seq: int, max_new_tokens: int,
           sampling: Sampling, stop_ids, drafter: str | None, budget: int, tree: bool,
           compile: bool, policy: dict):
    engine = Engine(model, batch=concurrency, max_seq_len=seq, compile=compile)
    server = Server(engine, sampling=sampling, stop_ids=stop_ids, budget=budget, tree=tree,
                    drafter=make_drafter(drafter, model) if drafter else None, **policy)
    for prompt in prompts:
        server.submit(prompt, max_new_tokens=max_new_tokens)
    if model.device.type == "cuda":
        torch.cuda.synchronize(model.device)
    began = time.perf_counter()
    out, stats = server.run()
    return out, stats, time.perf_counter() - began


def bench_serve(loaded: LoadedModel, prompts: list[list[int]], *, drafter: str,
                concurrency: list[int], max_new_tokens: int = 128, budget: int = 16,
                tree: bool = True, sampling: Sampling = GREEDY,
                stop_ids: frozenset[int] = frozenset(), compile: bool = False,
                shared_per_row: int | None = None, widths: tuple[int, ...] | None = None,
                admission: int | None = None, log=print) -> list[ServeRow]:
    """Per concurrency: plain serving, speculative serving, then the batching policies asked
    for as rows of their own: ``shared_per_row`` (a node budget of that many nodes per active
    row, shared by all: mode "shared"), ``widths`` (per-request draft sizes: "widths") and
    ``admission`` (at most that many prompt tokens admitted between two steps: "admit")."""
    if not prompts:
        raise W12Error("bench serve: no prompts")
    if min(concurrency) < 1:
        raise W12Error(f"concurrency {concurrency}: each must be at least 1")
    model = loaded.model
    seq = max(map(len, prompts)) + max_new_tokens + budget
    rows: list[ServeRow] = []
    for c in concurrency:
        outputs = {}
        modes = [("plain", None, {}), ("spec", drafter, {})]
        if shared_per_row is not None:
            modes.append(("shared", drafter, {"shared_total": shared_per_row * c}))
        if widths is not None:
            modes.append(("widths", drafter, {"widths": widths}))
        if admission is not None:
            modes.append(("admit", drafter, {"admission": admission}))
        for mode, name, policy in modes:
            options = dict(concurrency=c, seq=seq, max_new_tokens=max_new_tokens,
                           sampling=sampling, stop_ids=stop_ids, drafter=name, budget=budget,
                           tree=tree, compile=compile, policy=policy)
            _serve(model, prompts[:c], **{**options, "max_new_tokens": 2})  # warm-up
            out, stats, seconds = _serve(model, prompts, **options)
            outputs[mode] = out
            tokens = sum(map(len, out.values()))
            latency = list(stats.seconds.values())
            ttft = list(stats.first_token_s.values())
            plain = next((r.tokens_per_s for r in rows
                          if r.concurrency == c and r.mode == "plain"), None)
            rows.append(ServeRow(c, mode, len(prompts), tokens, seconds, tokens / seconds,
                                 _percentile(latency, 0.5), _percentile(latency, 0.9),
                                 max(latency), _percentile(ttft, 0.5), _percentile(ttft, 0.9),
                                 stats.steps, stats.tau,
                                 tokens / seconds / plain if plain else None))
            log(format_row(rows[-1]))
        for mode, out in outputs.items():
            if out != outputs["plain"]:
                bad = next(i for i in out if out[i] != outputs["plain"][i])
                raise W12Error(f"concurrency {c}: request {bad}'s tokens ({mode}) differ from "
                               "its plain ones (the kernels are not row-exact here: BF16 on a "
                               "GPU?)")
    return rows


def format_row(r: ServeRow) -> str:
    gain = "" if r.speedup is None else f"  x{r.speedup:.3f} plain"
    return (f"C={r.concurrency:<4} {r.mode:<6} {r.requests} requests  {r.tokens_per_s:9.1f} tok/s"
            f"  latency p50 {r.latency_p50_s:7.3f} s  p90 {r.latency_p90_s:7.3f} s  "
            f"max {r.latency_max_s:7.3f} s  ttft p50 {r.ttft_p50_s:7.3f} s  p90 "
            f"{r.ttft_p90_s:7.3f} s  steps {r.steps:6d}  tau {r.tau:6.3f}{gain}")


def as_dicts(rows: list[ServeRow]) -> list[dict]:
    return [asdict(r) for r in rows]
