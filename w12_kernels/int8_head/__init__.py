"""A certified INT8 LM head: the next token of the exact head, from an INT8 product plus an
exact recompute of the few vocabulary rows the INT8 product cannot rule out.

The head's weight is quantised per vocabulary row to INT8 (``quantize``), each row keeping its
scale and the norms of its quantisation error, its exact weight and its INT8 weight. The
hidden states stay BF16 (every INT8 value is exact in BF16, so the product is a BF16 GEMM over
one byte a weight), the row scale approximates every logit, and Cauchy-Schwarz bounds how far
the exact head's *computed* logit can lie from it (``logit_bounds``): the weight's INT8 error,
the float32 sums of both products and the exact head's BF16 output rounding. The token rule
of the engine (greedy: the first maximal logit; sampling: the first maximal ``logit / T + g``
with keyed Gumbel noise ``g``) is monotone in each logit, so a row whose upper bound falls
below the best lower bound cannot be chosen; the remaining rows are the candidates, whose exact
logits decide (``certified_choice``). The choice equals the exact head's on every row by
construction, ties included. Top-p sampling needs every probability, so it is left to the
exact head. Cauchy-Schwarz assumes the worst alignment of the error with the hidden state, so
the bound is ~sqrt(K) times the typical error: what pays is a model whose best logit stands
clear of the rest.

``picks.certified_picks`` makes the choice on the device with fixed shapes (the candidates'
16-row tiles, a fixed number of them, recomputed from the W12 head), for CUDA graphs.

``reference.py`` holds the readable statement (float64 where it matters) that a kernel will be
tested against.
"""

from w12_kernels.int8_head.certify import DeviceHead, bounds32
from w12_kernels.int8_head.launcher import approx_logits, greedy_candidates
from w12_kernels.int8_head.picks import candidate_tiles, certified_picks
from w12_kernels.int8_head.reference import (
    Int8Head,
    candidates,
    certified_choice,
    logit_bounds,
    quantize,
)

__all__ = ["DeviceHead", "Int8Head", "approx_logits", "bounds32", "candidate_tiles",
           "candidates", "certified_choice", "certified_picks", "greedy_candidates",
           "logit_bounds", "quantize"]
