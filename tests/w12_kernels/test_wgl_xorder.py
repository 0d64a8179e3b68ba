"""CPU checks of the large-M kernel's activations-from-x form (``WglConfig.xorder``,
large/kernels.cu ``XORDER``): a NumPy statement of what its lanes load from a swizzled weight
stage (``xoff``), of ``decode_x`` and of ``xorder_place``, against the chunk layout
(``layout.py``) decoded by ``decode.cpu``. The tensor copy's 128-byte swizzle is stated here
with the same formula the kernel's addresses use (the hardware's rule for a 1024-byte aligned
stage); what these tests check is the choice of lanes, words and rotations, and where escapes
go. The GPU tests check the kernel itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gemm_helpers import encoded, make_weight

from w12_kernels.gemm import prepare_weight
from w12_kernels.gemm.decode import cpu as cpu_decode
from w12_kernels.gemm.large import launcher as cuda_large
from w12_kernels.gemm.layout import DECODE_BIAS, escape_slot


def _swizzled(stage: np.ndarray) -> np.ndarray:
    """A stage's bytes as the tensor copy with the 128-byte swizzle leaves them: byte ``o`` at
    ``o ^ (((o >> 7) & 7) << 4)``."""
    o = np.arange(stage.size)
    out = np.empty_like(stage)
    out[o ^ (((o >> 7) & 7) << 4)] = stage
    return out


def _xoff(tt: int, lane: int, j: int) -> int:
    """large/kernels.cu's ``xoff[j]`` (j < 4: plane t & 1; j >= 4: plane 2) of a lane of the
    warp that decodes tile ``tt`` of the stage."""
    g, t = lane >> 2, lane & 3
    lin = tt * 1536 + ((t & 1) * 512 if j < 4 else 1024) + (4 * g + (j & 3)) * 16 + 4 * (t >> 1)
    return lin ^ (((lin >> 7) & 7) << 4)


def _rotl(v: int, s: int) -> int:
    return ((v << s) | (v >> (32 - s))) & 0xFFFFFFFF if s else v


def _decode_x(la: int, lb: int, ta: int, tb: int, s1: int, s2: int) -> list[int]:
    def low_pair(w: int, hi: bool) -> int:  # prmt 0x4140 / 0x4342 with 0x38 in bytes 1 and 3
        b0, b1 = (w >> (16 if hi else 0)) & 0xFF, (w >> (24 if hi else 8)) & 0xFF
        return 0x38000000 | b1 << 16 | 0x3800 | b0

    def lop(top: int, p: int) -> int:  # lop3 0xEA: (top & 0x87008700) | p
        return (top & 0x87008700) | p

    return [lop(_rotl(ta, s1), low_pair(la, False)), lop(_rotl(ta, s2), low_pair(la, True)),
            lop(_rotl(tb, s1), low_pair(lb, False)), lop(_rotl(tb, s2), low_pair(lb, True))]


def _emulate(chunks: np.ndarray, tiles: int, n: int, k: int) -> np.ndarray:
    """The decoded weights (before the row scale) that the kernel's A fragments hold, placed
    by x's K order: element (row, 16 j + kk) from register r of MMA step j of lane (g, t),
    kk = 2 t + 8 (r >> 1) + half, row g + 8 (r & 1) of the warp's tile."""
    ntiles, nchunks, _ = chunks.shape
    out = np.zeros((ntiles * 16, nchunks * 64), np.uint16)
    for t0 in range(0, ntiles, tiles):
        for c in range(nchunks):
            stage = np.zeros(tiles * 1536, np.uint8)
            for tt in range(tiles):
                if t0 + tt < ntiles:
                    stage[tt * 1536:(tt + 1) * 1536] = chunks[t0 + tt, c].view(np.uint8)
            sw = _swizzled(stage)

            def word(o: int, sw=sw) -> int:
                return int(sw[o:o + 4].view(np.uint32)[0])

            for tt in range(min(tiles, ntiles - t0)):
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    s1, s2 = 8 * (t & 1), 4 + 24 * (t & 1)
                    for j in range(4):
                        lo, top = _xoff(tt, lane, j), _xoff(tt, lane, 4 + j)
                        regs = _decode_x(word(lo), word(lo + 8), word(top), word(top + 8),
                                         s1, s2)
                        for r, v in enumerate(regs):
                            for half in (0, 1):
                                row = (t0 + tt) * 16 + g + 8 * (r & 1)
                                col = c * 64 + 16 * j + 2 * t + 8 * (r >> 1) + half
                                out[row, col] = (v >> (16 * half)) & 0xFFFF
    return out[:n, :k]


@pytest.mark.parametrize("n,k,tiles", [(40, 200, 8), (70, 130, 4)])
def test_xorder_fragments_hold_the_decoded_weights_in_x_order(n, k, tiles):
    pw = prepare_weight(encoded(make_weight(n, k, seed=n + k, escapes=True)))
    got = _emulate(pw.chunks.numpy(), tiles, n, k)
    # the record-0 decode with the fixed bias for every row, no escapes written in
    want = cpu_decode.decode_packed_cpu(pw.chunks, torch.full((n,), DECODE_BIAS, dtype=torch.uint8),
                                        torch.zeros(n + 1, dtype=torch.int32),
                                        torch.zeros(0, dtype=torch.int32),
                                        torch.zeros(0, dtype=torch.int16), n, k)
    np.testing.assert_array_equal(got, want.view(torch.int16).numpy().view(np.uint16))


def test_a_wrong_rotation_is_caught():
    pw = prepare_weight(encoded(make_weight(16, 64, seed=5)))
    words = pw.chunks.numpy()[0, 0].view(np.uint32)
    lane = 5  # t = 1: rotations 8 and 28
    lo, top = words[32 * 1 + 4 * 4 + 0 :], words[64 + 4 * 4:]  # plane 1 / plane 2 of lane 4 g
    right = _decode_x(int(lo[0]), int(lo[2]), int(top[0]), int(top[2]), 8, 28)
    wrong = _decode_x(int(lo[0]), int(lo[2]), int(top[0]), int(top[2]), 0, 4)
    assert lane & 3 == 1 and right != wrong


def _xorder_place(pk: int) -> int:
    """``xorder_place`` of large/kernels.cu."""
    lane, q, half = pk >> 8, (pk >> 1) & 15, pk & 1
    g, t, j, r = lane >> 2, lane & 3, q >> 2, q & 3
    kk = 4 * j + 2 * (r >> 1) + half
    return ((4 * g + ((kk & 7) >> 1)) << 8) | ((4 * t + (r & 1) + 2 * (kk >> 3)) << 1) | half


def test_xorder_place_is_where_the_x_order_fragments_hold_an_element():
    rows = torch.arange(16).repeat_interleave(64)
    cols = torch.arange(64).repeat(16)
    for row, col, pk in zip(rows.tolist(), cols.tolist(), escape_slot(rows, cols).tolist(),
                            strict=True):
        p = _xorder_place(pk)
        lane, q, half = p >> 8, (p >> 1) & 15, p & 1
        g, t, j, r = lane >> 2, lane & 3, q >> 2, q & 3
        assert (g + 8 * (r & 1), 16 * j + 2 * t + 8 * (r >> 1) + half) == (row, col)


def test_xorder_applies_only_where_the_tensor_copy_can_read_x():
    x = torch.zeros(300, 1024, dtype=torch.bfloat16)
    assert cuda_large.xorder_applies(x)
    assert cuda_large.xorder_applies(torch.zeros(300, 1008, dtype=torch.bfloat16)[:, :1001])
    assert not cuda_large.xorder_applies(torch.zeros(300, 1001, dtype=torch.bfloat16))
    assert not cuda_large.xorder_applies(x.view(-1)[1:1 + 300 * 1000].view(300, 1000))
    assert not cuda_large.xorder_applies(x.t())  # columns not contiguous
    cfg = cuda_large.WglConfig(splits=2, xorder=True)
    src = cuda_large.source(cfg)
    assert "2, 2, 0, true, false, false>(" in src and "&xmap" in src
    assert cfg.kernel_name.endswith("_xo") and cfg.kernel_name + "(" in src
    assert "2, 2, 0, false, false, false>(" in cuda_large.source(cuda_large.WglConfig(splits=2))
