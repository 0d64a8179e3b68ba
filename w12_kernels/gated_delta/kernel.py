"""Triton kernel of the gated delta rule along draft-tree paths: path verify, decode, commit.

One program per (node, request x value head, block of ``BV`` value columns): it loads the
committed state's [DK, BV] tile into registers, steps it along the node's path (root first,
up to the path's first -1) with the recurrence, and writes the node's output columns; with
``STORE`` it writes the stepped tile back as the new state. A state's value columns are
independent of each other (column j of the delta only reads column j), so the tiles split the
work exactly.

The same code serves three uses, so their bits agree: a decode step is a one-node path with
``STORE`` (in place), path verify is every node of a tree without it, and commit is the
accepted path as one node with ``STORE`` and no output. Every operation on a tile is fixed by
the compile-time shapes, never by T, B or the tree.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _advance(s, k, v, decay, beta):
    """One token on a state tile s [DK, BV]: decay, delta over the tile's columns, write."""
    s = s * decay
    u = beta * (v - tl.sum(s * k[:, None], axis=0))
    return s + k[:, None] * u[None, :]


@triton.jit
def _step(s, k_base, v_base, decay_base, beta_base, n, sq_t, sv_t, sg_t, dk, dv):
    """``s`` advanced by node ``n``'s token (``n`` >= 0), the bases being the program's
    request and head in each input."""
    k = tl.load(k_base + n * sq_t + dk)
    v = tl.load(v_base + n * sv_t + dv)
    return _advance(s, k, v, tl.load(decay_base + n * sg_t), tl.load(beta_base + n * sg_t))


@triton.jit(do_not_specialize=["T", "P", "H"])
def gdn_path_kernel(
    state_ptr, q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, nodes_ptr, out_ptr, new_ptr,
    ss_b, ss_h, sq_b, sq_t, sq_h, sv_b, sv_t, sv_h, sg_b, sg_t, sn_b, sn_t, so_b, so_t, so_h,
    T, P, H,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, OUT: tl.constexpr,
    STORE: tl.constexpr,
):
    t = tl.program_id(0)
    b = tl.program_id(1) // H
    h = tl.program_id(1) % H
    dk = tl.arange(0, DK)
    dv = tl.program_id(2) * BV + tl.arange(0, BV)
    tile = b.to(tl.int64) * ss_b + h * ss_h + dk[:, None] * DV + dv[None, :]
    s = tl.load(state_ptr + tile)
    k_base = k_ptr + b.to(tl.int64) * sq_b + h * sq_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + h * sv_h
    decay_base = decay_ptr + b.to(tl.int64) * sg_b + h
    beta_base = beta_ptr + b.to(tl.int64) * sg_b + h
    path = nodes_ptr + b.to(tl.int64) * sn_b + t * sn_t
    d = 0
    n = tl.load(path)
    while (n >= 0) & (d < P):  # the path's nodes, up to its first -1
        s = _step(s, k_base, v_base, decay_base, beta_base, n, sq_t, sv_t, sg_t, dk, dv)
        d += 1
        n = tl.load(path + d, mask=d < P, other=-1)
    if OUT:
        q = tl.load(q_ptr + b.to(tl.int64) * sq_b + t * sq_t + h * sq_h + dk)
        o = tl.sum(s * q[:, None], axis=0)
        tl.store(out_ptr + b.to(tl.int64) * so_b + t * so_t + h * so_h + dv, o)
    if STORE:
        tl.store(new_ptr + tile, s)


@triton.jit(do_not_specialize=["N", "H", "P", "CAP"])
def gdn_walk_kernel(
    state_ptr, q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, order_ptr, parent_ptr, slot_ptr,
    nodes_ptr, scratch_ptr, out_ptr,
    ss_b, ss_h, sq_b, sq_t, sq_h, sv_b, sv_t, sv_h, sg_b, sg_t, si_b, sn_b, sn_t, sc_b, sc_h,
    sc_s, so_b, so_t, so_h, N, H, P, CAP,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, OUT: tl.constexpr,
    COMMIT: tl.constexpr,
):
    """One program per (request x value head, block of value columns) walks the request's
    tree in depth-first preorder (``order``): each node's state is its parent's (the committed
    state for a node without one), stepped once by its own token, and kept in scratch slot
    ``slot[n]`` for its children while that slot is below ``CAP``; a node whose parent's slot
    is not kept replays the parent's path from the committed state (the same steps, so the same
    bits). Its output columns are written. ``COMMIT``: the last live node's state goes to the
    state (a decode step, or the accepted path given as the tree's rows of its nodes)."""
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    dk = tl.arange(0, DK)
    dv = tl.program_id(1) * BV + tl.arange(0, BV)
    inner = dk[:, None] * DV + dv[None, :]
    state_tile = state_ptr + b.to(tl.int64) * ss_b + h * ss_h + inner
    scratch = scratch_ptr + b.to(tl.int64) * sc_b + h * sc_h + inner
    s0 = tl.load(state_tile)
    last = s0
    index = b.to(tl.int64) * si_b
    k_base = k_ptr + b.to(tl.int64) * sq_b + h * sq_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + h * sv_h
    decay_base = decay_ptr + b.to(tl.int64) * sg_b + h
    beta_base = beta_ptr + b.to(tl.int64) * sg_b + h
    for i in range(N):
        n = tl.load(order_ptr + index + i)
        live = n >= 0
        at = tl.maximum(n, 0)
        p = tl.load(parent_ptr + index + at)
        here = tl.load(slot_ptr + index + at)
        there = tl.load(slot_ptr + index + tl.maximum(p, 0))
        wanted = (live & (p >= 0) & (there < CAP)).to(tl.int32)
        s = tl.load(scratch + tl.minimum(there, CAP - 1) * sc_s, mask=inner * 0 + wanted > 0,
                    other=0.0)
        s = tl.where(wanted > 0, s, s0)
        if live & (p >= 0) & (there >= CAP):  # the parent's state was not kept: replay it
            path = nodes_ptr + b.to(tl.int64) * sn_b + p * sn_t
            d = 0
            m = tl.load(path)
            while (m >= 0) & (d < P):
                s = _step(s, k_base, v_base, decay_base, beta_base, m, sq_t, sv_t, sg_t, dk, dv)
                d += 1
                m = tl.load(path + d, mask=d < P, other=-1)
        s = _step(s, k_base, v_base, decay_base, beta_base, at, sq_t, sv_t, sg_t, dk, dv)
        if OUT:
            q = tl.load(q_ptr + b.to(tl.int64) * sq_b + at * sq_t + h * sq_h + dk)
            tl.store(out_ptr + b.to(tl.int64) * so_b + at * so_t + h * so_h + dv,
                     tl.sum(s * q[:, None], axis=0), mask=dv * 0 + live.to(tl.int32) > 0)
        keep = (live & (here < CAP)).to(tl.int32)
        tl.store(scratch + tl.minimum(here, CAP - 1) * sc_s, s, mask=inner * 0 + keep > 0)
        tl.debug_barrier()  # the next node may read this slot
        last = tl.where(live, s, last)
    if COMMIT:
        tl.store(state_tile, last)


@triton.jit
def _split3(x):
    """float32 ``x`` as three pieces of 8 significand bits each, kept in float32, whose sum is
    ``x`` exactly (each piece the truncation of what the ones before it left)."""
    hi = (x.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
    rest = x - hi
    mid = (rest.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
    return hi, mid, rest - mid


@triton.jit
def _mma(a, b, acc, ON_GPU: tl.constexpr):
    """``acc + a @ b`` of float32 values that BF16 holds exactly: BF16 tensor cores on the GPU,
    float32 under the interpreter (which multiplies BF16 as raw integers)."""
    if ON_GPU:
        return tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    return tl.dot(a, b, acc)


@triton.jit
def _dot3(a, b, acc, ON_GPU: tl.constexpr):
    """``acc + a @ b`` of float32 operands on BF16 tensor cores to about float32 accuracy:
    each operand in three BF16 pieces (``_split3``), the six products of pieces whose weight
    reaches 2^-24 of the leading one, smallest first, in a float32 accumulator."""
    ah, am, al = _split3(a)
    bh, bm, bl = _split3(b)
    acc = _mma(al, bh, acc, ON_GPU)
    acc = _mma(ah, bl, acc, ON_GPU)
    acc = _mma(am, bm, acc, ON_GPU)
    acc = _mma(am, bh, acc, ON_GPU)
    acc = _mma(ah, bm, acc, ON_GPU)
    return _mma(ah, bh, acc, ON_GPU)


@triton.jit(do_not_specialize=["N", "H"])
def gdn_wy_kernel(
    state_ptr, q_ptr, k_ptr, v_ptr, decay_ptr, beta_ptr, anc_ptr, out_ptr,
    ss_b, ss_h, sq_b, sq_t, sq_h, sv_b, sv_t, sv_h, sg_b, sg_t, sa_b, sa_j, so_b, so_t, so_h,
    N, H,
    DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr, BK: tl.constexpr, NP: tl.constexpr,
    ON_GPU: tl.constexpr,
):
    """Every node's output of a request's tree at once, in the WY form
    (``reference.wy_verify``). One program per (request x value head, block of ``BV`` value
    columns); ``NP`` >= N rows, the padding rows inert. With ``anc[j, i]`` (i on j's path, j
    included), the path gate sums G, the decays ``D = e^{G_j - G_i}`` on the mask and
    ``A = beta_j D (k_j . k_i)`` strictly below it, ``w`` solves ``(I + A) w = beta (v -
    e^G S0^T k)`` one tree level at a time (a node's ancestors are all shallower), and
    ``o = e^G S0^T q + (D * (q k^T)) w``. Every product runs on BF16 tensor cores with its
    float32 operands, the state among them, cut in three pieces (``_dot3``)."""
    b = tl.program_id(0) // H
    h = tl.program_id(0) % H
    r = tl.arange(0, NP)
    live = r < N
    dv = tl.program_id(1) * BV + tl.arange(0, BV)
    rows = b.to(tl.int64) * sq_b + r[:, None] * sq_t + h * sq_h
    gate = b.to(tl.int64) * sg_b + r * sg_t + h
    # a decay that underflowed to 0 would make G -inf and its differences NaN; e^-80 is 0 to
    # float32 accuracy against any term it multiplies
    log_decay = tl.maximum(tl.log(tl.load(decay_ptr + gate, mask=live, other=1.0)), -80.0)
    beta = tl.load(beta_ptr + gate, mask=live, other=0.0)
    anc = tl.load(anc_ptr + b.to(tl.int64) * sa_b + r[:, None] * sa_j + r[None, :],
                  mask=live[:, None] & live[None, :], other=0) != 0
    big_g = tl.sum(tl.where(anc, log_decay[None, :], 0.0), axis=1)
    decays = tl.where(anc, tl.exp(big_g[:, None] - big_g[None, :]), 0.0)
    kk = tl.zeros((NP, NP), dtype=tl.float32)
    qk = tl.zeros((NP, NP), dtype=tl.float32)
    ks = tl.zeros((NP, BV), dtype=tl.float32)
    qs = tl.zeros((NP, BV), dtype=tl.float32)
    state = state_ptr + b.to(tl.int64) * ss_b + h * ss_h
    for k0 in range(0, DK, BK):  # the products with k over DK, a block of BK at a time
        dk = k0 + tl.arange(0, BK)
        kb = tl.load(k_ptr + rows + dk[None, :], mask=live[:, None], other=0.0)
        qb = tl.load(q_ptr + rows + dk[None, :], mask=live[:, None], other=0.0)
        s0 = tl.load(state + dk[:, None] * DV + dv[None, :])
        kt = tl.trans(kb)
        kk = _dot3(kb, kt, kk, ON_GPU)
        qk = _dot3(qb, kt, qk, ON_GPU)
        ks = _dot3(kb, s0, ks, ON_GPU)
        qs = _dot3(qb, s0, qs, ON_GPU)
    v = tl.load(v_ptr + b.to(tl.int64) * sv_b + r[:, None] * sv_t + h * sv_h + dv[None, :],
                mask=live[:, None], other=0.0)
    scale = tl.exp(big_g)
    w = beta[:, None] * (v - scale[:, None] * ks)
    strict = anc & (r[:, None] != r[None, :])
    a = tl.where(strict, beta[:, None] * decays * kk, 0.0)
    depth = tl.sum(anc.to(tl.int32), axis=1) - 1
    for d in range(1, tl.max(depth, axis=0) + 1):  # level d reads levels < d, all solved
        solved = w - _dot3(a, w, tl.zeros((NP, BV), dtype=tl.float32), ON_GPU)
        w = tl.where((depth == d)[:, None], solved, w)
    o = _dot3(decays * qk, w, scale[:, None] * qs, ON_GPU)
    tl.store(out_ptr + b.to(tl.int64) * so_b + r[:, None] * so_t + h * so_h + dv[None, :], o,
             mask=live[:, None])
