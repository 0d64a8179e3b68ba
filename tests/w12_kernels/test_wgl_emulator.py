"""CPU checks of the large-M warpgroup-MMA kernel (large/kernels.cu): its NumPy statement
(stage_image.py: activation images, swizzled operands, descriptors, K split folded in rank
order) against float64 on the exact weights, that a wrong layout is caught, and the escape
entries computed at load time (layout.py) against the kernels' patch rule."""

from __future__ import annotations

import numpy as np
import pytest
import stage_image
import torch
from gemm_helpers import assert_within_budget, encoded, make_weight

from w12_kernels.gemm import prepare_weight
from w12_kernels.gemm.reference import reference_linear

CASES = [  # (m, n, k, block_m, warpgroups, splits)
    (1, 70, 300, 64, 1, 1),
    (70, 130, 200, 64, 2, 2),  # two token blocks, a partial row block, K split in two
    (130, 300, 700, 128, 1, 4),  # K ranges of 3, 3, 3 and 2 chunks
    (5, 20, 64, 64, 1, 4),  # one chunk: three ranks with nothing to add
    (9, 1, 128, 192, 2, 2),
    (200, 90, 640, 64, 1, 3),  # K ranges of 4, 4 and 2 chunks
]


@pytest.mark.parametrize("m,n,k,block_m,warpgroups,splits", CASES,
                         ids=[f"m{m}_n{n}_k{k}_bm{b}_g{g}_k{s}" for m, n, k, b, g, s in CASES])
def test_emulated_large_kernel_within_budget(m, n, k, block_m, warpgroups, splits):
    w = make_weight(n, k, seed=m + n + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(torch.bfloat16)
    y = stage_image.gemm_wgl(x, prepare_weight(encoded(w)), bias, block_m=block_m,
                             warpgroups=warpgroups, splits=splits)
    assert_within_budget(y, x, w, reference_linear(x, encoded(w), bias), bias)


def test_every_split_within_budget_on_the_same_inputs():
    """A K split changes only the order of the float32 adds of the partial tiles."""
    w = make_weight(64, 640, seed=3)
    x = torch.randn(16, 640, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16)
    pw = prepare_weight(encoded(w))
    ref = reference_linear(x, encoded(w))
    for splits in (1, 2, 3, 4):
        y = stage_image.gemm_wgl(x, pw, block_m=64, warpgroups=1, splits=splits)
        assert_within_budget(y, x, w, ref)


def test_stage_images_hold_every_column_once_and_zeros_past_the_ends():
    x = torch.arange(1, 1 + 3 * 150, dtype=torch.float32).reshape(3, 150).to(torch.bfloat16)
    img = stage_image.stage_images(x, 3, 64).float().reshape(3, 64, 64)  # [chunk, token, 64]
    for c in range(3):
        for n in range(3):
            got = sorted(v for v in img[c, n].tolist() if v != 0)
            want = sorted(x[n, c * 64 : c * 64 + 64].float().tolist())
            assert got == want
    assert not img[:, 3:].any()  # tokens past M


def test_a_wrong_swizzle_is_caught(monkeypatch):
    """The within-budget check fails when the activation images are written without the
    swizzle the descriptor reads with."""
    w = make_weight(40, 256, seed=1)
    x = torch.randn(8, 256, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    pw = prepare_weight(encoded(w))
    ref = reference_linear(x, encoded(w))
    assert_within_budget(stage_image.gemm_wgl(x, pw, block_m=64, warpgroups=1, splits=1),
                         x, w, ref)
    def unswizzled(image, start, rows):  # reads rows as if stored without the XOR
        r = np.arange(rows)[:, None]
        kk = np.arange(16)[None, :]
        linear = start + (r // 8) * stage_image.SBO + (r % 8) * 128 + 2 * kk
        bits = image[linear // 2].astype(np.uint32) << np.uint32(16)
        return bits.view(np.float32).astype(np.float64)

    monkeypatch.setattr(stage_image, "_read", unswizzled)
    bad = stage_image.gemm_wgl(x, pw, block_m=64, warpgroups=1, splits=1)
    with pytest.raises(AssertionError):
        assert_within_budget(bad, x, w, ref)


def test_escape_order_walks_each_tile_by_chunk():
    """``esc_order`` is, within each 16-row tile's range of the escape list, a stable reorder by
    64-column chunk: every escape once, chunks non-decreasing, list order kept within a chunk."""
    w = make_weight(50, 300, seed=5)
    pw = prepare_weight(encoded(w))
    order = pw.esc_order.numpy()
    rows, cols = pw.esc_row.numpy(), pw.esc_col.numpy()
    rowptr = pw.esc_rowptr.numpy()
    assert pw.num_escapes > 100 and sorted(order.tolist()) == list(range(pw.num_escapes))
    for tile in range(int(pw.chunks.shape[0])):
        a, b = rowptr[16 * tile], rowptr[16 * tile + 16]
        part = order[a:b]
        assert ((a <= part) & (part < b)).all() and (rows[part] // 16 == tile).all()
        key = (cols[part] // 64) * 10**6 + part  # chunk, then list position
        assert (np.diff(key) > 0).all()


def test_patched_escapes_are_the_exact_finite_ones():
    """The kernel writes zeros and most escapes into its tiles; inf and NaN stay in the
    epilogue, and every patched value times the row's scale gives the escape back."""
    w = make_weight(40, 256, seed=6)
    pw = prepare_weight(encoded(w))
    ok, bits = stage_image.patchable(pw)
    vals = pw.esc_val.view(torch.bfloat16).float().numpy()
    assert ok[vals == 0].all() and not ok[~np.isfinite(vals)].any()
    back = stage_image._bits_f32(bits[ok]) * pw.scale.numpy()[pw.esc_row.numpy()[ok]]
    assert np.array_equal(back, vals[ok])


def test_escape_slot_follows_the_chunk_layout():
    """``layout.escape_slot``: the lane, register and half that hold weight (row, col) of a
    16-row tile, from the layout's own statement (lane 4 g + t holds, for step j, weight i at
    row g + 8 ((i >> 1) & 1), column 16 t + 4 j + 2 (i >> 2) + (i & 1); register r of a step is
    weights 2 r and 2 r + 1)."""
    from w12_kernels.gemm.layout import escape_slot

    rows, cols, want = [], [], []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for j in range(4):
            for i in range(8):
                rows.append(16 * 3 + g + 8 * ((i >> 1) & 1))  # (any tile: only row % 16 counts)
                cols.append(64 * 5 + 16 * t + 4 * j + 2 * (i >> 2) + (i & 1))
                want.append(lane << 8 | (4 * j + (i >> 1)) << 1 | (i & 1))
    got = escape_slot(torch.tensor(rows), torch.tensor(cols))
    assert got.tolist() == want
    assert len(set(want)) == 32 * 32  # each of a tile column's 1024 weights has its own slot


def test_escape_entries_are_what_the_kernel_used_to_compute():
    """``esc_entry`` (per place of ``esc_order``: chunk column, patch flag, register slot,
    patched value) and ``esc_fix`` (each row's first escape the tiles cannot hold) against the
    NumPy reference of the kernels' patch rule, on a weight with every kind of escape."""
    from w12_kernels.gemm.layout import escape_slot

    w = make_weight(50, 300, seed=5)
    pw = prepare_weight(encoded(w))
    ok, bits = stage_image.patchable(pw)
    order = pw.esc_order.numpy()
    cols = pw.esc_col.numpy()
    slots = escape_slot(pw.esc_row, pw.esc_col).numpy()
    entry = pw.esc_entry.numpy().view(np.uint32)
    assert entry.shape == (pw.num_escapes, 2) and pw.num_escapes > 100
    assert not ok.all() and ok.any()  # both kinds present
    for i, o in enumerate(order):
        assert entry[i, 0] == cols[o] >> 6
        value = int(bits[o]) & 0xFFFF if ok[o] else 0
        assert entry[i, 1] == (int(ok[o]) << 31 | int(slots[o]) << 16 | value)
    rowptr = pw.esc_rowptr.numpy()
    np_ = int(pw.chunks.shape[0]) * 16
    assert pw.esc_fix.shape == (np_,)
    for r in range(np_):
        a, b = rowptr[r], rowptr[r + 1]
        bad = [e for e in range(a, b) if not ok[e]]
        assert pw.esc_fix[r] == (bad[0] if bad else b)


def test_escape_entries_of_a_weight_without_escapes():
    pw = prepare_weight(encoded(make_weight(20, 70, seed=2, escapes=False)))
    if pw.num_escapes == 0:
        assert pw.esc_entry.shape == (0, 2)
    assert (pw.esc_fix == pw.esc_rowptr[1:]).all() or pw.num_escapes > 0


def test_patch_rule_in_integers_is_the_float32_rule_on_every_bf16_value():
    """``layout.patchable`` (integer arithmetic) against the kernels' float32 rule without
    flushing subnormals (NumPy's IEEE float32: ``v * (1 / 2^k)`` rounded to BF16, a zero or
    normal, times ``2^k`` equal to ``v``), for all 65,536 BF16 values and scales 2^k from
    2^-112 to 2^127 (every ``e0``)."""
    from w12_kernels.gemm.layout import patchable

    v = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    vf = stage_image._bits_f32(v)
    for k in range(-112, 128, 3):
        sc = np.float32(2.0) ** np.float32(k)
        with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
            a = stage_image.f32_to_bf16_bits(vf * (np.float32(1.0) / sc))
            back = stage_image._bits_f32(a) * sc
        mag, expo = a & 0x7FFF, a & 0x7F80
        want = ((mag == 0) | ((expo != 0) & (expo != 0x7F80))) & (back == vf)
        ok, bits = patchable(torch.from_numpy(v.view(np.int16).copy()), torch.full((65536,), k))
        assert np.array_equal(ok.numpy(), want), k
        assert np.array_equal(bits.numpy()[want], a[want].astype(np.int32)), k
        assert (bits.numpy()[~want] == 0).all()
