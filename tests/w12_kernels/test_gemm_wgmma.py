"""GPU tests of the warpgroup-MMA small-M kernel (``w12_kernels/gemm/wgmma/``; skipped
without a compute-capability 9.0 GPU and CuPy): error budget at awkward shapes with escapes and
bias, the bits of the mma.sync kernel with the same K split (so batch invariance carries over),
row independence, determinism."""

from __future__ import annotations

import pytest
import torch
from gemm_helpers import assert_within_budget, encoded, make_weight

from w12_kernels.gemm import dispatch, prepare_weight, table
from w12_kernels.gemm.small import launcher as small
from w12_kernels.gemm.wgmma import launcher as wgmma

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and wgmma.available()),
                                reason="needs a compute-capability 9.0 GPU and CuPy")


def _run(x, pw, bias=None, **kw):
    return wgmma.gemm_wg(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta, bias,
                         pw.n, pw.k, **kw)


def _small(x, pw, bias, kw):
    return small.gemm_small(x, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_col, pw.esc_delta,
                            bias, pw.n, pw.k, kw=kw, depth=2)


@pytest.mark.parametrize("n,k", [(1000, 3000), (130, 72), (37, 640), (4096, 4096)])
@pytest.mark.parametrize("kw,depth,wgs,rg,split", [(1, 4, 1, 1, 1), (2, 6, 1, 2, 1),
                                                  (4, 4, 2, 1, 2), (8, 4, 2, 2, 2),
                                                  (8, 8, 1, 1, 4), (16, 4, 4, 1, 4),
                                                  (2, 4, 1, 1, 2)])
def test_within_budget_and_the_small_kernels_bits(n, k, kw, depth, wgs, rg, split):
    t = make_weight(n, k, seed=n + k, device="cuda")
    pw = prepare_weight(encoded(t))
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    for m in (1, 9, 17, 32, 33, 64, 100):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = x.double() @ t.double().T + bias.double()
        y = _run(x, pw, bias, kw=kw, depth=depth, warpgroups=wgs, row_groups=rg, split=split)
        assert_within_budget(y, x, t, ref, bias)
        if m <= 64:
            assert torch.equal(y.view(torch.int16), _small(x, pw, bias, kw).view(torch.int16))


def test_deterministic_and_rows_independent():
    t = make_weight(1000, 3000, seed=5, device="cuda")
    pw = prepare_weight(encoded(t))
    x = torch.randn(40, 3000, device="cuda").to(torch.bfloat16)
    first = _run(x, pw, kw=4, warpgroups=2).view(torch.int16)
    for _ in range(5):
        assert torch.equal(_run(x, pw, kw=4, warpgroups=2).view(torch.int16), first)
        assert torch.equal(_run(x, pw, kw=4, warpgroups=1, split=4).view(torch.int16), first)
    for r in (0, 7, 39):
        alone = _run(x[r : r + 1], pw, kw=4, warpgroups=4).view(torch.int16)
        assert torch.equal(alone, first[r : r + 1])
        alone = _run(x[r : r + 1], pw, kw=4, warpgroups=2, row_groups=2, split=2)
        assert torch.equal(alone.view(torch.int16), first[r : r + 1])


def test_split_fold_under_graph_replay():
    """The K-split fold's arrival counters are put back by the last block, so replays of a
    captured call keep giving the same bits."""
    t = make_weight(640, 2048, seed=3, device="cuda")
    pw = prepare_weight(encoded(t))
    x = torch.randn(24, 2048, device="cuda").to(torch.bfloat16)
    want = _small(x, pw, None, 8)
    out = torch.empty_like(want)
    _run(x, pw, kw=8, warpgroups=1, split=8, out=out)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _run(x, pw, kw=8, warpgroups=1, split=8, out=out)
    for _ in range(4):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), want.view(torch.int16))


def test_nan_and_inf_escapes_reach_the_output():
    t = make_weight(200, 640, seed=9, device="cuda")
    t[3, 5] = float("nan")
    t[7, 100] = float("inf")
    pw = prepare_weight(encoded(t))
    x = torch.randn(20, 640, device="cuda").to(torch.bfloat16)
    y = _run(x, pw, kw=2, warpgroups=2)
    assert torch.isnan(y[:, 3]).all()
    assert not torch.isfinite(y[:, 7]).any()
    assert torch.isfinite(y[:, [0, 1, 2, 4, 5, 6, 8]]).all()
    assert torch.equal(y.view(torch.int16), _small(x, pw, None, 2).view(torch.int16))


def _launcher_with(monkeypatch, cfg, seed):
    """``dispatch.linear`` on a 700x2048 weight with the small-M configuration ``cfg``, and the
    keyword arguments of every warpgroup-kernel call it makes."""
    t = make_weight(700, 2048, seed=seed, device="cuda")
    pw = prepare_weight(encoded(t))
    monkeypatch.setattr(dispatch, "small_config", lambda n, k, device: cfg)
    calls = []
    real = wgmma.gemm_wg
    monkeypatch.setattr(wgmma, "gemm_wg", lambda *a, **kw: calls.append(kw) or real(*a, **kw))

    def linear(x):
        return dispatch.linear(x, pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row,
                               pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                               pw.esc_entry, pw.esc_fix, None, pw.n, pw.k)

    return linear, calls


def test_launcher_runs_the_tables_warpgroup_schedule(monkeypatch):
    """A layout with a warpgroup schedule (``Layout.wg``) sends its rows to the warpgroup
    kernel, whose bits are the mma.sync kernel's: so every row still gets the bits it gets
    alone (batch invariance)."""
    plain = table.Layout(depth=1)
    cfg = table.SmallConfig(kw=4, by_nt=((1, plain), (2, plain),
                                         (4, table.Layout(wg=(4, 1, 1, 4))),
                                         (8, table.Layout(wg=(4, 2, 1, 1)))))
    linear, calls = _launcher_with(monkeypatch, cfg, seed=4)
    x = torch.randn(100, 2048, device="cuda").to(torch.bfloat16)
    alone = torch.cat([linear(x[r : r + 1]) for r in range(100)]).view(torch.int16)
    assert not calls  # one row: the mma.sync kernel
    for m in (20, 32, 64, 100):  # 100: passes of 64 and 36 rows
        assert torch.equal(linear(x[:m]).view(torch.int16), alone[:m])
    assert [(c["split"], c["warpgroups"]) for c in calls] == [(4, 1), (4, 1), (1, 2), (1, 2),
                                                              (1, 2)]


@pytest.mark.parametrize("n,k", [(1000, 3000), (130, 72), (4096, 4096)])
@pytest.mark.parametrize("kw,depth,wgs,rg,split", [(1, 4, 1, 1, 1), (2, 4, 2, 1, 1),
                                                  (4, 4, 2, 1, 2), (2, 4, 2, 2, 1),
                                                  (8, 4, 2, 2, 4), (8, 8, 1, 1, 4),
                                                  (16, 4, 2, 1, 4), (2, 4, 1, 1, 2)])
def test_one_pass_of_128_rows_gives_the_two_passes_bits(n, k, kw, depth, wgs, rg, split):
    """128-row blocks (65..128 rows in one pass over the weight): within budget, and each row
    the bits of the mma.sync kernel's 64-row passes with the same K split."""
    t = make_weight(n, k, seed=n + k + kw, device="cuda")
    pw = prepare_weight(encoded(t))
    bias = torch.randn(n, device="cuda").to(torch.bfloat16)
    for m in (65, 100, 128):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        y = _run(x, pw, bias, kw=kw, depth=depth, n_block=128, warpgroups=wgs, row_groups=rg,
                 split=split)
        assert_within_budget(y, x, t, x.double() @ t.double().T + bias.double(), bias)
        two = torch.cat([_small(x[s : s + 64], pw, bias, kw) for s in (0, 64)])
        assert torch.equal(y.view(torch.int16), two.view(torch.int16)), f"M={m}"
        again = _run(x, pw, bias, kw=kw, depth=depth, n_block=128, warpgroups=wgs,
                     row_groups=rg, split=split)
        assert torch.equal(again.view(torch.int16), y.view(torch.int16))


def test_launcher_runs_65_to_128_rows_in_one_pass(monkeypatch):
    """With a ``one_pass`` schedule 65..128 rows take one call of the warpgroup kernel with
    128-row blocks, and every row still gets the bits it gets alone; inside
    ``invariant_rows(64)`` they leave the small-M path as before."""
    from w12_kernels.gemm import invariant_rows

    plain = table.Layout(depth=1)
    cfg = table.SmallConfig(kw=4, by_nt=tuple((c, plain) for c in table.NT_CLASSES),
                            one_pass=(4, 2, 1, 1))
    linear, calls = _launcher_with(monkeypatch, cfg, seed=6)
    x = torch.randn(128, 2048, device="cuda").to(torch.bfloat16)
    alone = torch.cat([linear(x[r : r + 1]) for r in range(128)]).view(torch.int16)
    assert not calls
    for m in (64, 65, 100, 128):
        assert torch.equal(linear(x[:m]).view(torch.int16), alone[:m]), f"M={m}"
    assert [(c["n_block"], c["warpgroups"]) for c in calls] == [(128, 2)] * 3
    with invariant_rows(64):
        linear(x[:100])
    assert len(calls) == 3
