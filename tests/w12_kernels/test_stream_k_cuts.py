"""Stream-K's schedule (``large/stream_k.py``: the cuts and their model): CPU only."""

from __future__ import annotations

import struct

import pytest

from w12_kernels.gemm.large import launcher as large
from w12_kernels.gemm.large import stream_k as cl

SIMPLE = {"piece": 1.0, "read": 2.0, "staged_store": 3.0, "store": 4.0, "switch": 5.0}


def test_model_of_a_piece_and_its_owner():
    # one unit of 4 columns: block 0 owns columns 0-1, block 1 leaves columns 2-3 as a piece
    # (ready after 2 steps + 1); the owner reads it once ready (2 + 2) and stores (+ 3)
    assert cl.stream_k_model((0, 2, 4), 4, SIMPLE) == [8.0, 3.0]
    # block 0: unit 0 whole (4 steps, stores from the accumulators: 4), the switch (5), unit 1's
    # columns 0-1 (2 steps), then it waits for block 1's piece (ready at 3: already), reads it
    # (2) and stores through the staging tile (3)
    assert cl.stream_k_model((0, 6, 8), 4, SIMPLE) == [20.0, 3.0]
    # an owner with two pieces waits for the later one: block 2's piece is ready at 9 + 1
    assert cl.stream_k_model((0, 1, 3, 12), 12, SIMPLE) == [10.0 + 2 + 3, 3.0, 10.0]


def _equal(steps: int, blocks: int) -> tuple[int, ...]:
    return tuple(steps * b // blocks for b in range(blocks + 1))


@pytest.mark.parametrize("units,nchunks,blocks", [(80, 80, 132), (80, 128, 132), (40, 400, 132),
                                                  (400, 80, 132), (32, 64, 132), (3, 5, 7),
                                                  (1, 64, 1), (2, 3, 6)])
def test_weighted_cuts_cut_every_step_and_beat_equal_shares_in_the_model(units, nchunks,
                                                                         blocks):
    steps = units * nchunks
    cuts = cl.stream_k_cuts(steps, nchunks, blocks)
    assert len(cuts) == blocks + 1 and cuts[0] == 0 and cuts[-1] == steps
    assert all(b > a for a, b in zip(cuts[:-1], cuts[1:], strict=True))
    equal = _equal(steps, blocks)
    assert max(cl.stream_k_model(cuts, nchunks)) <= max(cl.stream_k_model(equal, nchunks))


def test_weighted_cuts_end_earlier_where_equal_shares_wait():
    # 10240x5120 and 5120x25600 at 256 rows on 132 blocks: under equal shares an owner that
    # also leaves a piece waits for a piece as long as its own share; the model's cuts end
    # earlier, and no block of them ends past their latest
    for units, n in ((80, 80), (40, 400)):
        cuts = cl.stream_k_cuts(units * n, n, 132)
        equal = _equal(units * n, 132)
        assert max(cl.stream_k_model(cuts, n)) < max(cl.stream_k_model(equal, n)) - 1.0
    # a cost of zero for everything but the steps: equal shares are already the best
    free = dict.fromkeys(cl.STREAM_K_COST, 0.0)
    cuts = cl.stream_k_cuts(6400, 80, 132, cost=free)
    assert max(cl.stream_k_model(cuts, 80, free)) == 49


def test_bad_schedules_raise_and_the_kernel_parameter():
    with pytest.raises(ValueError, match="blocks"):
        cl.stream_k_cuts(10, 5, 11)
    with pytest.raises(ValueError, match="blocks"):
        cl.stream_k_cuts(10_000, 5, cl.MAX_STREAM_K_BLOCKS + 1)
    with pytest.raises(ValueError, match="blocks"):
        cl.stream_k_cuts(10, 5, 0)
    with pytest.raises(ValueError, match="more than"):
        cl.stream_k_cuts(2**31, 64, 132)
    cuts = cl.stream_k_cuts(6400, 80, 132)
    raw = large._cuts_param(cuts)
    assert len(raw) == 4 * (cl.MAX_STREAM_K_BLOCKS + 1)
    values = struct.unpack(f"<{cl.MAX_STREAM_K_BLOCKS + 1}i", raw)
    assert values[:133] == cuts and not any(values[133:])


def test_only_stream_k_entries_take_the_cuts():
    persist = large.WglConfig(persist=True)
    assert "StreamKCuts cuts" in large._entry(persist) and "cuts.q" in large._entry(persist)
    plain = large._entry(large.WglConfig(splits=2))
    assert "StreamKCuts" not in plain and "tile_base, nullptr" in plain
