"""Decode timing: the same model built BF16 and W12 in one run, compared step for step.

For each weight mode the model is built once (a synthetic preset is redrawn from the same
seed, so both modes hold the same weights), then for each batch size an ``Engine`` prefills
random prompts and runs ``warmup`` + ``tokens`` greedy steps back to back without reading
anything back to the host; the timed part is bracketed by device synchronisation. A step reads
every weight once, so weight bytes / step time is the achieved weight-streaming bandwidth.
The prefill of the ``batch x prompt_len`` prompt tokens is timed too (the median of
``PREFILL_RUNS`` prefills after the first, each bracketed by synchronisation): the time to the
first token. On a GPU the SM clock, power draw and temperature are sampled during the warmup
and timed steps (``engine.gpu_clocks``; nothing where ``nvidia-smi`` is missing).
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass

import torch

from engine.generate import Engine
from engine.gpu_clocks import ClockSampler, ClockStats
from engine.model import ModelArgs, Transformer
from engine.weights import load_model, weight_bytes


@dataclass
class DecodeTiming:
    model: str
    mode: str
    batch: int
    steps: int
    seconds: float
    ms_per_step: float
    tokens_per_s: float
    weight_bytes: int  # everything the model holds
    streamed_bytes: int  # what one decode step reads: weights minus the embedding table
    weight_gbps: float  # streamed_bytes per step time, GB/s
    gpu_weight_bytes: int | None  # device memory the load took (CUDA only)
    kv_bytes_per_token: int  # of a BF16 cache, all layers
    cuda_graph: bool  # the decode step ran as a captured graph
    compiled: bool  # the elementwise ops ran through torch.compile
    attention: str = "tree"  # decode attention: the tree-attention kernels or torch ops
    prefill_ms: float | None = None  # one prefill of batch x prompt_len tokens
    # during the warmup and timed steps, where nvidia-smi could sample them
    sm_mhz_mean: float | None = None
    sm_mhz_min: float | None = None
    power_w_mean: float | None = None
    temp_c_max: float | None = None
    power_capped: float | None = None  # fraction of samples held down by the power cap


def streamed_bytes(model: Transformer) -> int:
    """Bytes of weights one decode step reads (a lookup reads only B rows of the embedding)."""
    total = weight_bytes(model)
    if model.lm_head.weight is not model.embed:
        total -= model.embed.numel() * model.embed.element_size()
    return total


def kv_bytes_per_token(args: ModelArgs, dtype: torch.dtype = torch.bfloat16) -> int:
    """Keys and values of one token in every attention layer (a hybrid's GDN layers keep a
    fixed-size state instead)."""
    return 2 * len(args.attention_layers) * args.kv_size * dtype.itemsize


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


PREFILL_RUNS = 3


@torch.inference_mode()
def time_decode(
    model: Transformer, *, batch: int, tokens: int, prompt_len: int = 32, warmup: int = 8,
    compile: bool = False, cuda_graph: bool | None = None, seed: int = 0,
    attention: str = "auto",
) -> tuple[float, Engine, float, ClockStats | None]:
    """Seconds for ``tokens`` greedy steps of ``batch`` rows after prefill and warmup, the
    engine, the seconds of one prefill (the median of ``PREFILL_RUNS`` after the first), and the
    clocks sampled during the warmup and timed steps (None where none could be)."""
    engine = Engine(model, batch=batch, max_seq_len=prompt_len + warmup + tokens + 1,
                    cuda_graph=cuda_graph, compile=compile, attention=attention)
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, model.args.vocab_size, (batch, prompt_len), generator=gen).tolist()
    next_tokens = engine.prefill(prompts).argmax(-1)
    prefill_s = []
    for _ in range(PREFILL_RUNS):
        _sync(model.device)
        start = time.perf_counter()
        engine.prefill(prompts)
        _sync(model.device)
        prefill_s.append(time.perf_counter() - start)
    # (the sampler starts before the warmup, so that its process starts while the warmup runs)
    with ClockSampler(model.device) as clocks:
        for _ in range(warmup):
            next_tokens = engine.step(next_tokens).argmax(-1)
        _sync(model.device)
        start = time.perf_counter()
        for _ in range(tokens):
            next_tokens = engine.step(next_tokens).argmax(-1)
        _sync(model.device)
        seconds = time.perf_counter() - start
    return seconds, engine, sorted(prefill_s)[len(prefill_s) // 2], clocks.stats


def bench_decode(
    spec: str, *, batches: list[int], tokens: int, modes: tuple[str, ...] = ("bf16", "w12"),
    device: str = "cuda", compile: bool = False, prompt_len: int = 32, warmup: int = 8,
    seed: int = 0, log=print, attention: str | tuple[str, ...] = "auto",
) -> list[DecodeTiming]:
    """Time every mode x batch x attention kind (``attention``: one kind or several, timed
    back to back on the same loaded model)."""
    device = torch.device(device)
    kinds = (attention,) if isinstance(attention, str) else tuple(attention)
    results = []
    for mode in modes:
        gpu_before = _allocated(device)
        loaded = load_model(spec, mode=mode, device=device, seed=seed)
        gpu_bytes = None if gpu_before is None else _allocated(device) - gpu_before
        streamed = streamed_bytes(loaded.model)
        for batch, kind in ((b, k) for b in batches for k in kinds):
            seconds, engine, prefill_s, clocks = time_decode(
                loaded.model, batch=batch, tokens=tokens, prompt_len=prompt_len, warmup=warmup,
                compile=compile, seed=seed, attention=kind,
            )
            steps, step_s = tokens, seconds / tokens
            timing = DecodeTiming(
                model=loaded.name, mode=mode, batch=batch, steps=steps, seconds=seconds,
                ms_per_step=1e3 * step_s, tokens_per_s=batch * steps / seconds,
                weight_bytes=loaded.weight_bytes, streamed_bytes=streamed,
                weight_gbps=streamed / step_s / 1e9, gpu_weight_bytes=gpu_bytes,
                kv_bytes_per_token=kv_bytes_per_token(loaded.args),
                cuda_graph=engine.graph is not None, compiled=engine.compiled,
                attention=engine.attention, prefill_ms=1e3 * prefill_s,
                sm_mhz_mean=clocks and clocks.sm_mhz_mean,
                sm_mhz_min=clocks and clocks.sm_mhz_min,
                power_w_mean=clocks and clocks.power_w_mean,
                power_capped=clocks and clocks.power_capped,
                temp_c_max=clocks and clocks.temp_c_max,
            )
            del engine
            log(format_row(timing))
            results.append(timing)
        del loaded
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def _allocated(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    return torch.cuda.memory_allocated(device)


def format_row(t: DecodeTiming) -> str:
    return (f"{t.model:<24} {t.mode:<5} batch {t.batch:>3}  {t.tokens_per_s:>10.1f} tok/s  "
            f"{t.ms_per_step:>8.3f} ms/step  {t.streamed_bytes / 1e9:>7.3f} GB/step  "
            f"{t.weight_gbps:>8.1f} GB/s"
            + ("" if t.prefill_ms is None else f"  prefill {t.prefill_ms:>8.2f} ms")
            + ("" if t.attention == "torch" else
                                            f"  [{t.attention} attention]")
            + ("" if t.sm_mhz_mean is None else
               f"  SM {t.sm_mhz_mean:.0f} MHz (min {t.sm_mhz_min:.0f})"
               + ("" if t.power_w_mean is None else f" {t.power_w_mean:.0f} W")
               + ("" if not t.power_capped else f" power-capped {100 * t.power_capped:.0f}%")))


def summary(results: list[DecodeTiming]) -> list[str]:
    """Last lines of a report: W12 over BF16 speed-up per batch (and attention kind), the
    tree attention over the torch one where both ran, and the memory W12 frees."""
    by_key = {(r.model, r.mode, r.batch, r.attention): r for r in results}
    lines = []
    for r in results:
        base = by_key.get((r.model, "bf16", r.batch, r.attention))
        tag = "" if r.attention == "torch" else f" [{r.attention} attention]"
        if r.mode == "w12" and base is not None:
            speedup = r.tokens_per_s / base.tokens_per_s
            lines.append(f"{r.model} batch {r.batch}{tag}: W12 {r.tokens_per_s:.1f} tok/s vs "
                         f"BF16 {base.tokens_per_s:.1f} tok/s -> speedup {speedup:.3f}x")
            if r.prefill_ms and base.prefill_ms:
                lines.append(f"{r.model} batch {r.batch}{tag}: prefill W12 {r.prefill_ms:.2f} ms "
                             f"vs BF16 {base.prefill_ms:.2f} ms -> "
                             f"x{base.prefill_ms / r.prefill_ms:.3f}")
    for r in results:
        plain = by_key.get((r.model, r.mode, r.batch, "torch"))
        if r.attention != "torch" and plain is not None:
            lines.append(f"{r.model} {r.mode} batch {r.batch}: {r.attention} attention "
                         f"{r.ms_per_step:.3f} ms/step vs torch {plain.ms_per_step:.3f} -> "
                         f"x{plain.ms_per_step / r.ms_per_step:.3f}")
    memory = {r.mode: r for r in results}
    if "bf16" in memory and "w12" in memory:
        bf16, w12 = memory["bf16"], memory["w12"]
        freed, per_token = bf16.weight_bytes - w12.weight_bytes, w12.kv_bytes_per_token
        lines.append(
            f"weights: BF16 {_size(bf16.weight_bytes)}, W12 {_size(w12.weight_bytes)}; W12 frees "
            f"{_size(freed)} = {freed // per_token:,} more KV-cache tokens "
            f"(BF16 cache, {per_token / 1024:.0f} KiB/token)"
        )
        if bf16.gpu_weight_bytes is not None:
            lines.append(f"GPU memory taken by the load: BF16 {_size(bf16.gpu_weight_bytes)}, "
                         f"W12 {_size(w12.gpu_weight_bytes)}")
    return lines


def _size(nbytes: int) -> str:
    if abs(nbytes) >= 2**30:
        return f"{nbytes / 2**30:.2f} GiB"
    return f"{nbytes / 2**20:.2f} MiB"


def as_dicts(results: list[DecodeTiming]) -> list[dict]:
    return [asdict(r) for r in results]
