"""The small-M kernels' schedules on the CPU: what ``gemm_small`` and ``gemm_wg`` instantiate,
their shared memory, and the checks made before anything is launched."""

from __future__ import annotations

import pytest
import torch

from w12_kernels.gemm.small import launcher as small
from w12_kernels.gemm.wgmma import launcher as wgmma


@pytest.mark.parametrize("bad", [dict(w_stages=5), dict(w_stages=3, depth=2),
                                 dict(w_stages=4, x_stages=3), dict(kw=small.KW_MAX + 1),
                                 dict(tiles=5), dict(groups=4, kw=16)])
def test_schedules_without_an_instantiation_are_refused(bad):
    """Weight stages come with depth 1 and activation stages of the same count (one commit
    group per column) or none; a block holds at most 32 warps."""
    with pytest.raises(ValueError, match="bad configuration"):
        small.check_small(**{"kw": 4, "depth": 1, **bad})


@pytest.mark.parametrize("bad", [dict(cluster=3), dict(kw=6, cluster=4),
                                 dict(cluster=2, x_stages=3), dict(cluster=2, w_stages=3)])
def test_clusters_reject_schedules_without_an_instantiation(bad):
    """A cluster divides kw and takes no shared-memory stages."""
    with pytest.raises(ValueError, match="bad configuration"):
        small.check_small(**{"kw": 4, "depth": 1, **bad})


def test_instantiation_names_and_shared_memory():
    # the bound of 8 warps over the cluster: blocks of kw / cluster warps
    assert small.kernel_name(4, 1, 2, 4, 0, 1, 8, 0, 2) == \
        "w12_gemm_small_cl<4, 1, 2, 4, 0, 1, 4, 0, 2>"
    assert small.kernel_name(4, 1, 2, 2, 0, 1, 8, 0, 1) == "w12_gemm_small<4, 1, 2, 2, 0, 1, 8, 0>"
    assert small.kernel_name(1, 2, kw=16) == "w12_gemm_small<1, 2, 1, 1, 0, 1, 16, 0>"
    assert small.kernel_name(1, 1, groups=2, kw=4) == "w12_gemm_small<1, 1, 1, 1, 0, 2, 8, 0>"
    # one block of a cluster of 2 at kw 8, NT 4, 2 tiles: the partials of all 8 warps of the
    # cluster, 2 KiB each per tile, then 8 words per output row
    assert small.small_shared_bytes(4, 8, 0, 1, 0, 2, 2) == 2 * (8 * 2048 + 512)
    # partials 4 x 512 B, 3 activation stages x 4 n-tiles x 1 KiB, 3 weight stages x 2 tiles x
    # 1.5 KiB, per warp; then 8 words per output row of the block for the epilogue
    assert small.small_shared_bytes(4, 4, 3, 1, 3, 2) == 4 * (2048 + 12288 + 9216) + 2 * 16 * 32
    assert small.small_shared_bytes(1, 8, 0, 2, 4, 1) == 16 * (512 + 6144) + 2 * 16 * 32


def test_small_kernel_refuses_offsets_past_32_bits():
    """The kernel's streams are 32-bit offsets (a weight's 16-byte words, an activation row's
    elements, an output's elements): a weight past that is refused before anything is launched
    (the chunk tensor is a broadcast view, so nothing that large is allocated)."""
    chunks = torch.zeros(1, 1, 384, dtype=torch.int32).expand(2**16, 2**12, 384)
    x = torch.zeros(1, 2**12 * 64, dtype=torch.bfloat16)
    vec = torch.zeros(1)
    with pytest.raises(ValueError, match="32-bit offsets"):
        small.gemm_small(x, chunks, vec, vec, vec, vec, None, 2**20, 2**18, kw=8, depth=1)
    chunks = torch.zeros(1, 1, 384, dtype=torch.int32).expand(2**22, 1, 384)
    x = torch.zeros(64, 64, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="output rows"):
        small.gemm_small(x, chunks, vec, vec, vec, vec, None, 2**26, 64, kw=1, depth=1)


def test_warpgroup_schedules():
    assert wgmma.check(2, 4, 64, 1, 1, 2) == 1
    with pytest.raises(ValueError, match="bad configuration"):
        wgmma.check(2, 4, 64, 4, 1, 1)  # 4 warpgroups cannot share kw = 2 partial sums
    assert wgmma.check(2, 4, 128, 2, 2, 1) == 1  # 4 x 64 accumulator registers in 544 threads
    assert wgmma.check(8, 4, 128, 1, 1, 4) == 2
    for kw, depth, wgs, rg, split in ((8, 4, 2, 2, 2), (8, 4, 1, 1, 2), (8, 4, 4, 1, 1)):
        with pytest.raises(ValueError, match="bad configuration"):
            wgmma.check(kw, depth, 128, wgs, rg, split)  # 2 sets x 4 warpgroups; 4 sets
    assert wgmma.check(8, 4, 64, 2, 2, 2) == 2  # at 64 rows those are fine
    assert wgmma.kernel_name(64, 4, 2, 1, 2) == "w12_gemm_wg<64, 4, 2, 1, 2>"
    assert wgmma.shared_bytes(64, 2, 4, 2) == 512 + 2 * 4 * (64 * 128 + 2 * 4 * 1536)


def test_the_warpgroup_header_spells_out_every_accumulator():
    """``wgmma.cuh``: one ``WgmmaRS<N>`` per N a kernel uses, each an m64nNk16 MMA with N / 2
    float accumulators, then the four A registers, the descriptor and the scale predicate, the
    operands numbered in that order."""
    import re

    from w12_kernels.gemm.cuda import runtime

    text = (runtime.INCLUDE_DIR / "wgmma.cuh").read_text()
    lines = re.findall(r'^W12_WGMMA_RS\((\d+), "(\{[^"]*\})", "(\{[^"]*\})", "(%\d+)", "(%\d+)", '
                       r"(.*)\)$", text, re.M)
    assert sorted(int(n) for n, *_ in lines) == [16, 32, 48, 64, 128, 192, 256]
    assert set(wgmma.N_BLOCKS) <= {int(n) for n, *_ in lines}
    for n, d, a, desc, pred, outs in lines:
        r = int(n) // 2
        assert d == "{" + ", ".join(f"%{i}" for i in range(r)) + "}"
        assert a == "{" + ", ".join(f"%{r + i}" for i in range(4)) + "}"
        assert (desc, pred) == (f"%{r + 4}", f"%{r + 5}")
        assert outs == ", ".join(f'"+f"(d[{i}])' for i in range(r))
    assert 'm64n" #N "k16.f32.bf16.bf16' in text and "float (&d)[N / 2]" in text
