"""The A/B of one per-entry option of the large-M kernel (``xorder``, ``wreuse``, ``l2hint``):
each shape's table entry for M rows with the option off and on, in the same CUDA graphs as
cuBLAS, for several rounds (each in new graphs); the bits compared where the option must not
change them (``l2hint``; ``wreuse`` except with stream-K, whose units are cut elsewhere), both
sides checked against float64 otherwise. A shape's entry gets the option where it won by more
than a margin in every round, and loses it where it lost so.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from gemm_tuning.timing import Layer, time_graphs
from w12_kernels.gemm.large import launcher as large
from w12_kernels.gemm.large.launcher import WglConfig

OPTIONS = ("xorder", "wreuse", "l2hint")
CALLS = 20  # calls per graph


def same_bits(option: str, cfg: WglConfig) -> bool:
    """Whether ``option`` must leave the bits of ``cfg``'s launch as they are."""
    return option == "l2hint" or (option == "wreuse" and not cfg.persist and cfg.tail != 1)


def _error_ratio(layer: Layer, x: torch.Tensor, out: torch.Tensor) -> float:
    ref = x.double() @ layer.bf16[0].double().T
    err = (out.double() - ref).norm() / ref.norm()
    err_bf16 = (torch.nn.functional.linear(x, layer.bf16[0]).double() - ref).norm() / ref.norm()
    return float(err / err_bf16)


def time_shape(n: int, k: int, m: int, cfg: WglConfig, option: str,
               rounds: int = 1) -> tuple[list[tuple[float, float, float]], bool]:
    """µs per call with ``option`` off, on and of cuBLAS, one triple a round, and whether the
    bits agree (where they must) or both sides are within the error budget."""
    layer = Layer(n, k, seed=n + k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    sides = (replace(cfg, **{option: False}), replace(cfg, **{option: True}))

    def call(pw, side):
        return large.gemm_wgl(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_val,
                              pw.esc_delta, pw.esc_entry, pw.esc_fix, None, pw.n, pw.k, side)

    outs = [call(layer.w12[0], side) for side in sides]
    if same_bits(option, cfg):
        same = torch.equal(outs[0].view(torch.int16), outs[1].view(torch.int16))
    else:
        same = all(_error_ratio(layer, x, out) <= 2.0 for out in outs)

    def calls(side):
        return [lambda pw=layer.w12[i % layer.copies]: call(pw, side) for i in range(CALLS)]

    cublas = [lambda w=layer.bf16[i % layer.copies]: torch.nn.functional.linear(x, w)
              for i in range(CALLS)]
    times = [tuple(time_graphs([calls(sides[0]), calls(sides[1]), cublas]))
             for _ in range(rounds)]
    return times, same


def table_change(entry: dict, option: str, times: list, margin: float) -> dict | None:
    """The entry with ``option`` on (on beat off by more than ``margin``, a fraction, in every
    round of ``times``: (off, on, cuBLAS) triples) or off (off beat on so, and the entry has
    it); None where neither holds or nothing would change."""
    if times and all(on < off * (1 - margin) for off, on, _ in times):
        return None if entry.get(option) else {**entry, option: True}
    if times and all(off < on * (1 - margin) for off, on, _ in times) and entry.get(option):
        return {**entry, option: False}
    return None


def table_entry(n: int, k: int, m: int, rule: dict) -> tuple[str, dict] | None:
    """The M class whose entry serves ``m`` rows of shape (N, K) in ``rule`` and that entry
    (None where the shape has no class that large)."""
    by_m = rule["shapes"].get(f"{n}x{k}", {})
    cls = next((c for c in sorted(int(c) for c in by_m) if m <= c), None)
    return None if cls is None else (str(cls), by_m[str(cls)])
