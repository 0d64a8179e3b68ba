"""The 8-bit view (w12_kernels/view8): the vectorised view against the element-by-element
reference, its error bound, and the per-row error norms."""

from __future__ import annotations

import math

import torch

from w12.tensor import encode
from w12_kernels.view8 import row_error_norms, view_bf16
from w12_kernels.view8.reference import reference_view


def weights_with_escapes(n: int, k: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    w[0, :5] = 0.0
    w[1, 3] = -0.0
    w[2, 7] = 3e-41  # a subnormal
    w[3, 1] = 1e4  # far outside the row's window
    w[4, 2] = float("inf")
    return w


def test_view_matches_the_reference_at_awkward_shapes():
    for n, k in ((7, 13), (16, 64), (5, 129)):
        w = encode(weights_with_escapes(n, k, seed=n))
        got = view_bf16(w).double()
        ref = reference_view(w)
        assert torch.equal(got.isinf(), ref.isinf())
        finite = ~ref.isinf()
        assert torch.equal(got[finite], ref[finite])


def test_escapes_keep_their_exact_bits():
    exact = weights_with_escapes(8, 40)
    view = view_bf16(encode(exact))
    for r, c in ((0, 0), (1, 3), (2, 7), (3, 1), (4, 2)):
        assert view[r, c].view(torch.int16) == exact[r, c].view(torch.int16)


def test_every_in_window_weight_is_within_a_sixteenth_of_its_binade():
    exact = weights_with_escapes(12, 96)
    view = view_bf16(encode(exact)).double()
    x = exact.double()
    finite = x.isfinite() & (x != 0)
    binade = torch.exp2(torch.floor(torch.log2(x[finite].abs())))
    err = (x[finite] - view[finite]).abs()
    assert bool((err <= binade / 16).all())
    assert float(err.max()) > 0  # the view really drops the low nibble


def test_row_error_norms_bound_every_dot_product():
    exact = weights_with_escapes(32, 256, seed=3)
    w = encode(exact)
    norms = row_error_norms(w)
    assert bool(norms.isfinite().all())  # the infinity is an escape, kept exactly
    exact[4, 2] = 1.0  # finite, so every dot product below is finite
    w = encode(exact)
    norms = row_error_norms(w)
    g = torch.Generator().manual_seed(1)
    h = torch.randn(64, 256, generator=g, dtype=torch.float64)
    gap = (h @ exact.double().T - h @ view_bf16(w).double().T).abs()
    bound = h.norm(dim=1, keepdim=True) * norms.double()[None, :]
    assert bool((gap <= bound).all())
    diff = exact.double() - view_bf16(w).double()
    assert math.isclose(float(norms[9]), float(diff[9].norm()), rel_tol=1e-6)
