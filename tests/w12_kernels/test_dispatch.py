"""The dispatch from ``w12_linear`` to a launch (``dispatch.py``), on the CPU with the GPU parts
stubbed: batch invariance's row scope, the small-kernel passes and the one-pass schedule, and
the large-M table's configuration handed to the warpgroup kernel."""

from __future__ import annotations

import pytest
import torch
from gemm_helpers import encoded, make_weight

from w12_kernels.gemm import dispatch, invariant_rows, table
from w12_kernels.gemm.large import launcher as large
from w12_kernels.gemm.small import launcher as small
from w12_kernels.gemm.wgmma import launcher as wgmma

NONE12 = [None] * 12


def test_invariant_rows_scopes_the_small_kernel_passes():
    """Batch invariance to 128 rows by default; ``invariant_rows(64)`` (prefill) sends 65..128
    rows to the large-M table for its block only, nesting and restoring on errors."""
    assert dispatch.small_rows_limit() == 128
    with invariant_rows(64):
        assert dispatch.small_rows_limit() == 64
        with invariant_rows(128):
            assert dispatch.small_rows_limit() == 128
        assert dispatch.small_rows_limit() == 64
    with pytest.raises(RuntimeError), invariant_rows(64):
        raise RuntimeError("inside")
    assert dispatch.small_rows_limit() == 128
    with pytest.raises(ValueError, match="kept up to 64 or 128 rows"), invariant_rows(100):
        pass


def test_invariant_rows_of_one_call_override_the_scope(monkeypatch):
    """``rows_kept`` (``w12_linear(..., invariant_rows=...)``) decides for its call alone which
    of 65..128 rows take the small-kernel passes, whatever the scope says."""
    weight = torch.randn(8, 64).to(torch.bfloat16)
    monkeypatch.setattr(dispatch, "backend", lambda: "cuda")
    monkeypatch.setattr(dispatch, "small_config", lambda n, k, device: None)
    monkeypatch.setattr(dispatch, "_small_passes", lambda x, *rest: "small passes")
    monkeypatch.setattr(dispatch, "_has_wgl", lambda: False)
    monkeypatch.setattr(dispatch, "decode", lambda *args: weight)
    x = torch.randn(100, 64).to(torch.bfloat16)

    def run(rows_kept):
        out = dispatch.linear(x, *NONE12, 8, 64, rows_kept)
        return out if isinstance(out, str) else "large path"

    assert run(0) == "small passes" and run(128) == "small passes"
    assert run(64) == "large path"
    with invariant_rows(64):
        assert run(0) == "large path" and run(128) == "small passes"
    assert dispatch.linear(x[:64], *NONE12, 8, 64, 64) == "small passes"


def test_w12_linear_checks_invariant_rows():
    from w12.errors import W12Error
    from w12_kernels.gemm import prepare_weight, w12_linear

    w = make_weight(24, 70, seed=1)
    pw = prepare_weight(encoded(w))
    x = torch.randn(3, 70).to(torch.bfloat16)
    same = w12_linear(x, pw, invariant_rows=64)
    assert torch.equal(same.view(torch.int16), w12_linear(x, pw).view(torch.int16))
    with pytest.raises(W12Error, match="w12_linear: 100 rows; batch invariance is kept up to"):
        w12_linear(x, pw, invariant_rows=100)


def test_one_pass_dispatch(monkeypatch):
    """65..128 rows: one call of the warpgroup kernel with 128-row blocks where the shape has a
    ``one_pass`` schedule (and the GPU has the kernel), else passes of at most 64 rows; a row
    class whose layout names a warpgroup schedule runs it where the GPU has the kernel."""
    calls = []
    monkeypatch.setattr(dispatch, "backend", lambda: "cuda")
    monkeypatch.setattr(dispatch, "_wg_fits", lambda kw, wg, rows: rows == 128 or wg[0] == 8)
    monkeypatch.setattr(wgmma, "gemm_wg", lambda x, *a, **kw: calls.append(
        ("wg", x.shape[0], kw.get("n_block"), kw["kw"])))
    monkeypatch.setattr(small, "gemm_small", lambda x, *a, **kw: calls.append(
        ("pass", x.shape[0], kw["depth"])))
    x = torch.randn(100, 64).to(torch.bfloat16)
    plain = tuple((c, table.Layout()) for c in table.NT_CLASSES)
    for one_pass, want in (((4, 2, 1, 1), [("wg", 100, 128, 8)]),
                           (None, [("pass", 64, 2), ("pass", 36, 2)])):
        cfg = table.SmallConfig(kw=8, by_nt=plain, one_pass=one_pass)
        monkeypatch.setattr(dispatch, "small_config", lambda n, k, device, c=cfg: c)
        calls.clear()
        dispatch.linear(x, *NONE12, 8, 64)
        assert calls == want
    calls.clear()
    dispatch.linear(x[:64], *NONE12, 8, 64)
    assert calls == [("pass", 64, 2)]
    by_nt = tuple((c, table.Layout(depth=3, wg=(8, 1, 1, 1) if c == 8 else None))
                  for c in table.NT_CLASSES)
    monkeypatch.setattr(dispatch, "small_config",
                        lambda n, k, device: table.SmallConfig(kw=8, by_nt=by_nt))
    calls.clear()
    dispatch.linear(x[:40], *NONE12, 8, 64)
    dispatch.linear(x[:20], *NONE12, 8, 64)
    assert calls == [("wg", 40, None, 8), ("pass", 20, 3)]


def test_large_dispatch_hands_the_entry_to_the_kernel(monkeypatch):
    """The table's configuration goes to ``gemm_wgl`` as it is; a GPU without the kernel, or an
    entry of decode + cuBLAS, decodes the weight and multiplies."""
    calls = []
    weight = torch.randn(8, 64).to(torch.bfloat16)
    monkeypatch.setattr(dispatch, "backend", lambda: "cuda")
    monkeypatch.setattr(large, "gemm_wgl", lambda x, *a: calls.append(a[-1]) or "wgl")
    monkeypatch.setattr(dispatch, "decode", lambda *args: weight)
    x = torch.randn(512, 64).to(torch.bfloat16)
    entry = large.WglConfig(persist=True, wreuse=True)
    monkeypatch.setattr(table, "large_config", lambda n, k, m, **kw: entry)
    monkeypatch.setattr(dispatch, "_has_wgl", lambda: True)
    assert dispatch.linear(x, *NONE12, 8, 64) == "wgl" and calls == [entry]
    monkeypatch.setattr(dispatch, "_has_wgl", lambda: False)
    assert dispatch.linear(x, *NONE12, 8, 64).shape == (512, 8)
    monkeypatch.setattr(dispatch, "_has_wgl", lambda: True)
    monkeypatch.setattr(table, "large_config", lambda n, k, m, **kw: None)
    assert dispatch.linear(x, *NONE12, 8, 64).shape == (512, 8) and len(calls) == 1


def test_the_triton_backend_runs_the_small_kernel_then_decode(monkeypatch):
    from w12_kernels.gemm.triton import launcher as triton_launcher

    weight = torch.randn(8, 64).to(torch.bfloat16)
    monkeypatch.setattr(dispatch, "backend", lambda: "triton")
    monkeypatch.setattr(dispatch, "small_config",
                        lambda n, k, device: table.SmallConfig(kw=2, by_nt=()))
    monkeypatch.setattr(triton_launcher, "gemm", lambda *a, kw: f"triton kw={kw}")
    monkeypatch.setattr(dispatch, "decode", lambda *args: weight)
    assert dispatch.linear(torch.randn(64, 64).to(torch.bfloat16), *NONE12, 8, 64) == \
        "triton kw=2"
    monkeypatch.setattr(table, "large_config", lambda n, k, m, **kw: large.WglConfig())
    assert dispatch.linear(torch.randn(65, 64).to(torch.bfloat16), *NONE12, 8, 64).shape == \
        (65, 8)
