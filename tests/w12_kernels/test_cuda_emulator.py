"""The CUDA small-M and decode kernels, emulated lane by lane in NumPy (cuda_emulator.py),
against the float64 reference: this checks the chunk layout, the MMA fragment mapping, the
decode bit tricks, the warp split and the epilogue on a machine without a GPU."""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest
import torch
from gemm_helpers import assert_within_budget, encoded, make_weight

import w12
from w12_kernels.gemm import prepare_weight
from w12_kernels.gemm.layout import PackedW12
from w12_kernels.gemm.reference import reference_linear

CASES = [  # (m, n, k, kw, depth)
    (1, 1, 100, 1, 2),
    (3, 37, 250, 3, 3),
    (17, 70, 500, 4, 4),
    (8, 130, 300, 4, 6),
    (64, 33, 129, 3, 2),
    (5, 20, 64, 3, 2),  # one chunk, kw > chunks: warps with nothing to do
    (16, 40, 2100, 16, 2),  # kw 16: 33 columns, two or three a warp
]


def _inputs(m, n, k, seed):
    t = make_weight(n, k, seed=seed)
    w = encoded(t)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    return t, w, x, bias


@pytest.mark.parametrize("m,n,k,kw,depth", CASES,
                         ids=[f"m{m}_n{n}_k{k}_kw{kw}_p{p}" for m, n, k, kw, p in CASES])
def test_emulated_gemm_within_budget(m, n, k, kw, depth):
    t, w, x, bias = _inputs(m, n, k, seed=m + n + k)
    y = emu.gemm_small(x, prepare_weight(w), bias, kw=kw, depth=depth)
    assert_within_budget(y, x, t, reference_linear(x, w, bias), bias)


def test_emulated_gemm_is_batch_invariant():
    _, w, x, bias = _inputs(64, 40, 333, seed=5)
    pw = prepare_weight(w)
    full = emu.gemm_small(x, pw, bias, kw=3).view(torch.int16)
    for rows in (slice(0, 1), slice(7, 8), slice(0, 17), slice(40, 43)):
        part = emu.gemm_small(x[rows], pw, bias, kw=3).view(torch.int16)
        assert torch.equal(part, full[rows]), f"rows {rows} differ from the M=64 run"


def test_loads_in_flight_change_no_bits():
    """The ring depth only moves loads earlier."""
    _, w, x, _ = _inputs(9, 20, 700, seed=6)
    pw = prepare_weight(w)
    outs = [emu.gemm_small(x, pw, kw=3, depth=p).view(torch.int16) for p in (2, 3, 4, 6)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_swapped_word_planes_are_caught():
    """The check can fail: words q = 0 and q = 1 exchanged put the low bytes of weights 0..3
    where 4..7 belong."""
    t, w, x, _ = _inputs(3, 37, 250, seed=7)
    pw = prepare_weight(w)
    planes = pw.chunks.view(*pw.chunks.shape[:2], 3, 128)
    swapped = planes[:, :, [1, 0, 2]].reshape(pw.chunks.shape).contiguous()
    bad = PackedW12(**{**pw.__dict__, "chunks": swapped})
    with pytest.raises(AssertionError, match="relative RMS"):
        assert_within_budget(emu.gemm_small(x, bad, kw=3), x, t, reference_linear(x, w))


def test_wrong_fragment_rule_is_caught(monkeypatch):
    """The check can fail: an A fragment whose registers 1 and 2 were exchanged (row g + 8 at
    k 2t read as row g at k 2t + 8) gives wrong products."""
    t, w, x, _ = _inputs(3, 37, 250, seed=8)
    order = [0, 1, 4, 5, 2, 3, 6, 7]
    monkeypatch.setattr(emu, "_A_ROW", emu._A_ROW[:, order])
    monkeypatch.setattr(emu, "_A_COL", emu._A_COL[:, order])
    with pytest.raises(AssertionError, match="relative RMS"):
        assert_within_budget(emu.gemm_small(x, prepare_weight(w), kw=1), x, t,
                             reference_linear(x, w))


@pytest.mark.parametrize("shape", [(1, 1), (3, 257), (45, 333), (130, 64)])
def test_emulated_decode_is_exact(shape):
    rng = np.random.default_rng(sum(shape))
    bits = rng.integers(0, 65536, shape).astype(np.uint16)  # every kind of escape, any window
    half = shape[0] // 2
    bits[:half] = torch.randn(half, shape[1]).mul(0.02).bfloat16().view(torch.int16).numpy()
    t = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
    out = emu.decode(prepare_weight(w12.encode(t)))
    assert torch.equal(out.view(torch.int16), t.view(torch.int16))


def test_ptx_integer_ops():
    a = np.array([0x89ABCDEF], np.uint32)
    # bytes {b, a}: a = EF CD AB 89 (0..3), b = 67 45 23 01 (4..7)
    assert emu.prmt(a, 0x01234567, 0x7654)[0] == 0x01234567
    assert emu.prmt(a, 0x01234567, 0x0123)[0] == 0xEFCDAB89
    assert emu.prmt(a, 0, 0x8888)[0] == 0xFFFFFFFF  # sign of byte 0 (0xEF) replicated
    assert emu.shf_r_wrap(a, a, 4)[0] == 0xF89ABCDE
    x, y, z = (np.array([v], np.uint32) for v in (0xF0, 0xCC, 0xAA))
    for lut in (0x00, 0xEA, 0x96, 0xFE, 0x80):
        assert emu.lop3(x, y, z, lut)[0] == lut


@pytest.mark.parametrize("m,n,k,kw,n_block,wgs", [(1, 70, 300, 1, 16, 1),
                                                  (17, 37, 200, 2, 32, 2),
                                                  (40, 100, 640, 2, 16, 1),
                                                  (5, 20, 64, 1, 48, 1),
                                                  (33, 70, 1300, 8, 64, 2),
                                                  (100, 20, 200, 2, 128, 1)])
def test_wgmma_emulator_within_budget(m, n, k, kw, n_block, wgs):
    """The warpgroup-MMA kernel's staging, descriptor and split over warpgroups and
    accumulator sets, emulated (wgmma_emulator.py), against float64 on the exact weights,
    escapes and bias included."""
    import wgmma_emulator

    w = make_weight(n, k, seed=m + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    y = wgmma_emulator.gemm_wg(x, prepare_weight(encoded(w)), bias, kw=kw, n_block=n_block,
                               warpgroups=wgs)
    assert_within_budget(y, x, w, reference_linear(x, encoded(w), bias), bias)


def test_wgmma_emulator_catches_a_wrong_stage_order():
    """The check above fails when the staged K order does not match the A fragments."""
    import wgmma_emulator

    w = make_weight(40, 256, seed=1)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    good = wgmma_emulator.gemm_wg(x, prepare_weight(encoded(w)), kw=1, n_block=16)
    ref = reference_linear(x, encoded(w))
    assert_within_budget(good, x, w, ref)
    original = wgmma_emulator.LBO
    try:
        wgmma_emulator.LBO = 0  # both K halves of a step read the same core matrix
        bad = wgmma_emulator.gemm_wg(x, prepare_weight(encoded(w)), kw=1, n_block=16)
    finally:
        wgmma_emulator.LBO = original
    with pytest.raises(AssertionError):
        assert_within_budget(bad, x, w, ref)


@pytest.mark.parametrize("kw,wgs,split", [(2, 1, 1), (4, 2, 1), (8, 4, 1), (8, 2, 1), (8, 1, 4),
                                          (4, 1, 2)])
def test_wgmma_emulator_gives_the_small_kernels_bits(kw, wgs, split):
    """The warpgroup kernel's split (``split`` blocks of KB warpgroups, kw / (KB split)
    accumulator sets each) and fold add the same products in the same order as the mma.sync
    kernel's kw warps: with both MMAs emulated alike the bits are equal, and row 0 of a 40-row
    call is row 0 alone."""
    import wgmma_emulator

    _, w, x, bias = _inputs(40, 70, 1300, seed=11)
    pw = prepare_weight(w)
    small = emu.gemm_small(x, pw, bias, kw=kw).view(torch.int16)
    wg = wgmma_emulator.gemm_wg(x, pw, bias, kw=kw, n_block=48, warpgroups=wgs, split=split)
    assert torch.equal(wg.view(torch.int16), small)
    alone = wgmma_emulator.gemm_wg(x[:1], pw, bias, kw=kw, n_block=16, warpgroups=wgs,
                                   split=split)
    assert torch.equal(alone.view(torch.int16), small[:1])
