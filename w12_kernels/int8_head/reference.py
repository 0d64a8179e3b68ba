"""The certified INT8 LM head, stated plainly (the package docstring has the idea).

Bounds, for one hidden state ``h`` (BF16 values, K of them) and one vocabulary row ``w``:

* quantisation: ``w = s q + d`` (per-row symmetric INT8, ``s`` = max |w| / 127), so with
  ``A = s (h.q)``, by Cauchy-Schwarz ``|h.w - A| = |h.d| <= ||h|| ||d||`` (the hidden state
  stays BF16: every INT8 value is exact in BF16, so a BF16 MMA computes ``h.q``);
* ``A`` computed with float32 sums and one float32 product is off by at most
  ``gamma ||h|| ||s q|| + u |A|``;
* the exact head computes ``h.w`` with float32 sums of BF16 products (exact), off by at most
  ``gamma sum |h_i w_i| <= gamma ||h|| ||w||`` in any order of summation, then rounds to BF16
  (relative ``2^-8``).

``gamma = n u / (1 - n u)`` with ``n`` = K plus a margin for escape corrections and ``u`` =
2^-23, twice float32's unit roundoff: tensor cores may truncate rather than round their sums.

Every norm is computed in float64 and rounded up; the result is a closed interval [lo, hi] per
(row, vocabulary entry) that holds the exact head's computed logit. Slack factor ``SAFETY``
keeps it safe against the bound's own float64 arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from w12.errors import W12Error

U_SUM = 2.0**-23  # a float32 sum's relative error, truncation allowed
EXTRA_TERMS = 64  # sums a row may add beyond K (escape corrections)
U_BF16 = 2.0**-8  # BF16 unit roundoff (8 significant bits)
SAFETY = 1.0 + 2.0**-20  # widens every bound a little past float64's own rounding


@dataclass(frozen=True)
class Int8Head:
    q: torch.Tensor  # int8 [V, K]
    scale: torch.Tensor  # float32 [V]: w ~ scale * q
    err: torch.Tensor  # float64 [V]: ||w - scale * q||_2, rounded up
    norm: torch.Tensor  # float64 [V]: ||w||_2, rounded up
    qnorm: torch.Tensor  # float64 [V]: ||scale * q||_2, rounded up

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)


def _quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row symmetric INT8 of ``x`` [R, K]: (q int8, scale float32, error norm float64)."""
    x64 = x.double()
    peak = x64.abs().amax(dim=1)
    scale = (peak / 127.0).float()  # the scale the kernel multiplies by
    s64 = scale.double()
    safe = torch.where(s64 > 0, s64, 1.0)
    q = torch.where(s64[:, None] > 0, torch.round(x64 / safe[:, None]), 0.0).clamp(-127, 127)
    err = (x64 - s64[:, None] * q).norm(dim=1) * SAFETY
    return q.to(torch.int8), scale, err


ROWS_AT_ONCE = 8192  # float64 work is done this many vocabulary rows at a time


def quantize(weight: torch.Tensor) -> Int8Head:
    """The INT8 head of a BF16 (or float) weight [V, K]; every value must be finite. The
    float64 arithmetic runs ``ROWS_AT_ONCE`` rows at a time (a 152k x 5120 head would need
    ~6 GB for one float64 copy)."""
    if weight.dim() != 2:
        raise W12Error(f"INT8 head: weight of shape {tuple(weight.shape)}, expected [V, K]")
    if not torch.isfinite(weight).all():
        raise W12Error("INT8 head: the weight has non-finite values")
    if weight.shape[0] == 0:
        raise W12Error("INT8 head: the weight has no rows")
    parts = []
    for start in range(0, weight.shape[0], ROWS_AT_ONCE):
        rows = weight[start:start + ROWS_AT_ONCE]
        q, scale, err = _quantize_rows(rows)
        qnorm = scale.double() * q.double().norm(dim=1) * SAFETY
        parts.append((q, scale, err, rows.double().norm(dim=1) * SAFETY, qnorm))
    return Int8Head(*(torch.cat(p) for p in zip(*parts, strict=True)))


def logit_bounds(head: Int8Head, h: torch.Tensor, approx: torch.Tensor | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(approx, lo, hi) [R, V] float64 for hidden states ``h`` [R, K] (the exact head's BF16
    input): the INT8 weights' product (computed here in float64, or ``approx`` as a kernel
    computed it with float32 sums: either is inside the bound) and an interval that holds the
    exact head's computed (BF16-rounded, then float32) logit."""
    v, k = head.shape
    if h.dim() != 2 or h.shape[1] != k:
        raise W12Error(f"INT8 head: hidden states {tuple(h.shape)} for a head of K = {k}")
    if approx is None:
        approx = (h.double() @ head.q.double().T) * head.scale.double()[None, :]
    else:
        approx = approx.double()
    hn = (h.double().norm(dim=1) * SAFETY)[:, None]
    n = k + EXTRA_TERMS
    gamma = n * U_SUM / (1 - n * U_SUM)
    radius = (hn * head.err[None, :] + gamma * hn * (head.qnorm + head.norm)[None, :]
              + U_SUM * approx.abs()) * SAFETY
    lo, hi = approx - radius, approx + radius
    # the BF16 rounding of the exact head's float32 sum (monotone: widen by u |x|)
    lo = lo - U_BF16 * lo.abs()
    hi = hi + U_BF16 * hi.abs()
    return approx, lo, hi


def _score(logits: torch.Tensor, temperature: float, noise: torch.Tensor | None) -> torch.Tensor:
    """The engine's token score, float32 as ``engine.sampling.choose`` computes it (monotone
    in each logit)."""
    x = logits.float()
    if temperature == 0:
        return x
    return x / temperature + noise


def candidates(lo: torch.Tensor, hi: torch.Tensor, *, temperature: float = 0.0,
               noise: torch.Tensor | None = None) -> torch.Tensor:
    """[R, V] bool: the entries that may be chosen, given bounds of the exact computed logits.
    ``lo``/``hi`` go through the same float32 score as the logits (rounded outward to float32
    first), so monotonicity carries the bounds over."""
    if temperature < 0 or (temperature > 0 and noise is None):
        raise W12Error("INT8 head: sampling needs a temperature > 0 and its noise")
    lo32, hi32 = lo.float(), hi.float()
    lo32 = torch.nextafter(lo32, torch.full_like(lo32, -float("inf")))
    hi32 = torch.nextafter(hi32, torch.full_like(hi32, float("inf")))
    low = _score(lo32, temperature, noise)
    high = _score(hi32, temperature, noise)
    return high >= low.amax(dim=1, keepdim=True)


def certified_choice(exact_rows, lo: torch.Tensor, hi: torch.Tensor, *,
                     temperature: float = 0.0, noise: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens [R], candidate counts [R]): the engine's token rule over the candidates, their
    logits from ``exact_rows(row, ids) -> float32 [len(ids)]`` (the exact head's computed
    logits of those vocabulary entries). Equal to the rule over the whole exact head."""
    cand = candidates(lo, hi, temperature=temperature, noise=noise)
    tokens = torch.empty(cand.shape[0], dtype=torch.long)
    for r in range(cand.shape[0]):
        ids = cand[r].nonzero()[:, 0]
        exact = exact_rows(r, ids).float()
        score = exact if temperature == 0 else exact / temperature + noise[r, ids]
        tokens[r] = ids[int(score.argmax())]  # ids ascend: the first maximal, as argmax
    return tokens, cand.sum(dim=1)
