"""Shared pieces of the GEMM tests: weights with planted escapes, and the error-budget rule."""

from __future__ import annotations

import torch

import w12

SPECIALS = (0.0, -0.0, float("inf"), float("-inf"), float("nan"), 3.0e30, -2.5e-30, 1.0e-40)


def make_weight(n: int, k: int, seed: int, *, escapes: bool = True,
                device: str = "cpu") -> torch.Tensor:
    """Random BF16 weight (never zeros) with every kind of escape planted when ``escapes``.

    Row 0 gets one of each special value; row ``n // 2`` is mostly zeros and subnormals (many
    escapes in one row). NaN and inf sit in the last row only, so most outputs stay finite.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    if escapes and k >= len(SPECIALS):
        finite = [v for v in SPECIALS if abs(v) not in (float("inf"),) and v == v]
        for j, v in enumerate(finite):
            t[0, (7 * j + 3) % k] = v
        many = n // 2
        t[many, : (3 * k) // 4] = 0.0
        t[many, 1 : (3 * k) // 4 : 5] = 1.0e-39  # subnormal
        last = n - 1
        if last not in (0, many):
            t[last, 1] = float("inf")
            t[last, 2] = float("-inf")
            t[last, k - 1] = float("nan")
    return t.to(device)


def encoded(t: torch.Tensor) -> w12.W12Tensor:
    return w12.encode(t)


def relative_rms(y: torch.Tensor, ref: torch.Tensor, where: torch.Tensor) -> float:
    """Relative RMS error over ``where``, each output column weighted by 1 / its RMS.

    Without the weights one column of huge values (a planted 3e30 weight) would hide errors
    in all the others.
    """
    ref_w = torch.where(where, ref, 0.0)
    col_rms = (ref_w.square().sum(0) / where.sum(0).clamp_min(1)).sqrt().clamp_min(1e-300)
    diff = torch.where(where, y.double() - ref, 0.0) / col_rms
    return float(diff.norm() / (ref_w / col_rms).norm().clamp_min(1e-300))


def assert_within_budget(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                         ref: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """The project's GEMM rule: error vs ``ref`` at most 2x that of torch BF16, NaN never passes.

    ``ref`` is float64 from the exact weights; positions where it is NaN or inf must be NaN or
    inf of the same kind in ``y``.
    """
    ref = ref.to(y.device)
    finite = torch.isfinite(ref)
    assert not torch.isnan(y)[finite].any(), "NaN where the reference is finite"
    assert torch.equal(torch.isnan(y), torch.isnan(ref)), "NaN positions differ"
    assert torch.equal(torch.isinf(y) & (y > 0), torch.isinf(ref) & (ref > 0)), "+inf differs"
    assert torch.equal(torch.isinf(y) & (y < 0), torch.isinf(ref) & (ref < 0)), "-inf differs"
    torch_y = torch.nn.functional.linear(x, weight.to(x.device),
                                         None if bias is None else bias.to(x.device))
    budget = 2 * max(relative_rms(torch_y, ref, finite), 1e-4)
    err = relative_rms(y, ref, finite)
    assert err <= budget, f"relative RMS error {err:.3g} over budget {budget:.3g}"
