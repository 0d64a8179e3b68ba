"""Where a stream-K launch of the large-M kernel cuts its work between its blocks.

A stream-K launch runs one block per multiprocessor; its work is every (unit, chunk column)
step, a unit being one tile block's 64-256 weight rows for one token block. Block ``b`` takes
steps ``cuts[b] .. cuts[b + 1] - 1``. A block whose share starts inside a unit leaves its sums
as a *piece* (24-bit floats, through a float32-sized slot of a workspace); the block holding
the unit's first column *owns* it: it reads the pieces of the blocks after it in block order,
adds them (a fixed order: deterministic bits) and stores the outputs. Equal shares make an
owner wait for pieces that are still being computed, so ``stream_k_cuts`` cuts by a model of
the blocks' ends (``stream_k_model``), in main-loop steps: a piece's write, an owner's read of
each piece, a unit's stores (through the staging tile for a block's last segment, straight from
the accumulators otherwise) and a block's switch from one unit to the next. The costs were
timed on an H200 at 256 tokens, one step being ~0.6 us there.
"""

from __future__ import annotations

import functools

# costs in main-loop steps (one chunk column of one unit)
STREAM_K_COST = {"piece": 5.3, "read": 3.0, "staged_store": 3.7, "store": 8.8, "switch": 2.0}
NARROW_BYTES = 0.75  # a piece's bytes (24-bit floats), of float32's
MAX_STREAM_K_BLOCKS = 256  # StreamKCuts in kernels.cu


def _segment_ends(b: int, cuts: list[int], nchunks: int, ready: list[float],
                  cost: dict) -> tuple[float, float | None]:
    """The model's end of stream-K block ``b`` (steps ``cuts[b]`` .. ``cuts[b + 1]`` - 1, the
    kernel's segments: a piece, whole units, an owner's unit) in steps from its start, and when
    its piece is ready (None: it has none). An owner reads its unit's pieces (blocks b + 1 ..,
    whose ``ready`` is known) in block order, each once ready."""
    q0, q1 = cuts[b], cuts[b + 1]
    u0, ul = q0 // nchunks, (q1 - 1) // nchunks
    t, ready_at = 0.0, None
    for u in range(u0, ul + 1):
        lo = q0 - u * nchunks if u == u0 else 0
        hi = q1 - u * nchunks if u == ul else nchunks
        t += (cost["switch"] if u > u0 else 0.0) + (hi - lo)
        if lo > 0:  # a piece (only ever the first segment)
            t += cost["piece"]
            ready_at = t
        elif hi < nchunks:  # the owner of a unit cut after this block (the last segment)
            bb = b
            while True:
                bb += 1
                t = max(t, ready[bb]) + cost["read"]
                if cuts[bb + 1] >= (u + 1) * nchunks:
                    break
            t += cost["staged_store"]
        else:  # a whole unit
            t += cost["staged_store"] if u == ul else cost["store"]
    return t, ready_at


def stream_k_model(cuts: list[int] | tuple[int, ...], nchunks: int,
                   cost: dict | None = None) -> list[float]:
    """The modelled end, in main-loop steps from the start, of each block of a stream-K launch
    cut at ``cuts`` (``cost``: default ``STREAM_K_COST``)."""
    cost = STREAM_K_COST if cost is None else cost
    cuts = list(cuts)
    blocks = len(cuts) - 1
    ready, ends = [0.0] * (blocks + 1), [0.0] * blocks
    for b in range(blocks - 1, -1, -1):
        ends[b], r = _segment_ends(b, cuts, nchunks, ready, cost)
        ready[b] = 0.0 if r is None else r
    return ends


def _cuts_within(limit: float, steps: int, nchunks: int, blocks: int,
                 cost: dict) -> list[int] | None:
    """Cuts under which every block ends by ``limit`` in the model, or None: from the last
    block back, each takes the most steps that keep it, and the owner that will read its piece
    (its later pieces of the unit read after it), within the limit."""
    cuts = [0] * (blocks + 1)
    cuts[blocks] = steps
    ready = [0.0] * (blocks + 1)
    for b in range(blocks - 1, -1, -1):
        q1 = cuts[b + 1]
        first = 0 if b == 0 else max(b, q1 - int(limit))  # (blocks before it: a step each)
        last = 0 if b == 0 else q1 - 1
        for q0 in range(first, last + 1):
            cuts[b] = q0
            end, r = _segment_ends(b, cuts, nchunks, ready, cost)
            if r is not None:  # its unit's owner reads it, then the later pieces, then stores
                uend = (q0 // nchunks + 1) * nchunks
                later = next((j for j in range(b + 1, blocks) if cuts[j] >= uend), blocks) - b - 1
                end = max(end, r + cost["read"] * (1 + later) + cost["staged_store"])
            if end <= limit:
                ready[b] = 0.0 if r is None else r
                break
        else:
            return None
    return cuts


@functools.cache
def _stream_k_cuts(steps: int, nchunks: int, blocks: int, cost: tuple) -> tuple[int, ...]:
    equal = [steps * b // blocks for b in range(blocks + 1)]
    costs = dict(cost)
    lo, hi = steps / blocks, max(stream_k_model(equal, nchunks, costs))
    best = None
    while hi - lo > 0.05:  # the least limit that the backward pass meets
        mid = (lo + hi) / 2
        cuts = _cuts_within(mid, steps, nchunks, blocks, costs)
        if cuts is None:
            lo = mid
        else:
            hi, best = mid, cuts
    return tuple(equal if best is None else best)


def stream_k_cuts(steps: int, nchunks: int, blocks: int,
                  cost: dict | None = None) -> tuple[int, ...]:
    """Where a stream-K launch of ``blocks`` blocks cuts its ``steps`` (unit, chunk column)
    steps, units of ``nchunks``: block b takes ``cuts[b]`` .. ``cuts[b + 1]`` - 1. The cuts
    that minimise the latest block's end in ``stream_k_model``, found by bisecting on that
    end: from the last block back, each takes the most steps that keep both it and the owner
    that will read its piece (then the unit's later pieces, then its stores) within that end.
    Increasing, every block at least one step; cached. The pieces are 24-bit sums, so their
    write and read cost ``NARROW_BYTES`` of the costs' float32 ones."""
    if not 1 <= blocks <= min(steps, MAX_STREAM_K_BLOCKS):
        raise ValueError(f"stream_k_cuts: {blocks} blocks for {steps} steps (1 .. "
                         f"min(steps, {MAX_STREAM_K_BLOCKS}))")
    if steps >= 2**31:  # (the kernel counts steps in 32-bit integers)
        raise ValueError(f"stream_k_cuts: {steps} steps, more than a stream-K launch counts")
    cost = dict(STREAM_K_COST if cost is None else cost)
    cost["piece"] *= NARROW_BYTES
    cost["read"] *= NARROW_BYTES
    return _stream_k_cuts(steps, nchunks, blocks, tuple(sorted(cost.items())))
