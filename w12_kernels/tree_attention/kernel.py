"""Triton kernels of tree attention: the split pass, the combine pass, and the KV compaction.

Every row (one query head of one tree node) walks the absolute positions 0..p it sees in
blocks of ``BLOCK`` positions; block ``j`` belongs to split ``j % SPLITS``. A split program
runs the online softmax over its blocks in increasing order and leaves (max, sum, accumulator)
in a float32 workspace; the combine program merges the splits of each row in split order.
Which block a position lands in, which split owns the block and the order of every float
operation on a row depend on positions and compile-time constants only, so a tree node and a
decode step at the same position produce the same bits.

A block that lies wholly inside the committed prefix has the same keys for every node of the
program: one dot serves them all. A block that reaches past the prefix gathers each node's
keys through its path slots; each node's dot fills that node's rows. Both kinds of block meet
one softmax update and one guard (rows that see nothing in a block keep their state exactly),
so a row gets the same operations whichever kind its blocks are.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot_scores(q, k, ON_GPU: tl.constexpr):
    if ON_GPU:
        return tl.dot(q, tl.trans(k))
    # the interpreter multiplies bf16 as raw integers; float32 holds the products exactly
    return tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))


@triton.jit
def _dot_values(p, v, acc, ON_GPU: tl.constexpr):
    if ON_GPU:
        return tl.dot(p.to(v.dtype), v, acc)
    return tl.dot(_round_bf16(p), v.to(tl.float32), acc)


@triton.jit
def _round_bf16(x):
    """float32 -> the nearest bf16 (ties to even), kept in float32: what ``.to(tl.bfloat16)``
    does on the GPU, where the interpreter truncates (finite inputs)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _node_lanes(path_ptr, node_off, real, pos, prefix, P):
    """Cache slot of each lane (position) of a block for one node, whether the node sees it
    (the prefix below ``prefix``, then its path; nothing for a node past T or of padding), and
    whether it sees any."""
    node_ok = tl.load(path_ptr + node_off, mask=real, other=-1) >= 0
    idx = pos - prefix
    width = tl.where(real, P, 0)
    entry = tl.load(path_ptr + node_off + idx, mask=(idx >= 0) & (idx < width), other=-1)
    slot = tl.where(node_ok, tl.where(pos < prefix, pos, entry), -1)
    return slot, slot >= 0, tl.max((slot >= 0).to(tl.int32), axis=0) > 0


@triton.jit
def _rows(base, stride, slot, seen, D: tl.constexpr):
    """Cache rows (keys or values) at ``slot``, zero where not ``seen``."""
    d = tl.arange(0, D)
    return tl.load(base + slot[:, None].to(tl.int64) * stride + d[None, :], mask=seen[:, None],
                   other=0.0)


@triton.jit
def _online(s, m, l_sum, acc, c):
    """The online-softmax update of one block's scores ``s``, in log2 units of the raw scores
    (c = scale * log2 e); a hidden lane's score is -inf, a row with none visible in this block
    is not ``seen``: (p, the scaled accumulator, new max, new sum, seen)."""
    m_block = tl.max(s, axis=1)
    seen = m_block > float("-inf")
    m_new = tl.maximum(m, m_block)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2((m - m_use) * c)
    p = tl.exp2((s - m_use[:, None]) * c)
    return p, acc * alpha[:, None], m_new, l_sum * alpha + tl.sum(p, axis=1), seen


@triton.jit
def _keep(seen, m_new, l_new, acc_new, m, l_sum, acc):
    """The new state for rows that saw a lane of the block; the others keep theirs bit for
    bit."""
    return (tl.where(seen, m_new, m), tl.where(seen, l_new, l_sum),
            tl.where(seen[:, None], acc_new, acc))


@triton.jit(do_not_specialize=["T", "P", "B", "sq_b", "sp_b", "sp_t"])
def tree_attention_split_kernel(
    q_ptr, k_ptr, v_ptr, prefix_ptr, path_ptr, m_ptr, l_ptr, acc_ptr,
    sq_b, sq_t, sq_h, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sp_b, sp_t,
    B, T, P, HKV, c,
    G: tl.constexpr, D: tl.constexpr, NODES: tl.constexpr, BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr, SPLITS: tl.constexpr, ON_GPU: tl.constexpr,
):
    """One program per (node group, split, request x KV head); rows are node-major."""
    group = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2) // HKV
    h = tl.program_id(2) % HKV
    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, D)
    lanes = tl.arange(0, BLOCK)
    row_node = r // G
    t = group * NODES + row_node
    row_in = (row_node < NODES) & (t < T)
    head = h * G + r % G
    group_off = b.to(tl.int64) * sp_b + group * NODES * sp_t
    first = tl.load(path_ptr + group_off + row_node * sp_t, mask=row_in, other=-1)
    row_ok = row_in & (first >= 0)  # a node whose path is all -1 is padding: it sees nothing
    q = tl.load(q_ptr + b.to(tl.int64) * sq_b + t[:, None] * sq_t + head[:, None] * sq_h
                + d[None, :], mask=row_ok[:, None], other=0.0)
    prefix = tl.load(prefix_ptr + b).to(tl.int32)
    k_base = k_ptr + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h
    v_base = v_ptr + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h

    m = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    l_sum = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, D), tl.float32)
    # the split's blocks in increasing order: first those wholly inside the committed prefix
    # (the same keys for every node: one dot serves them all; a loop without branches, which
    # the compiler can pipeline), then those reaching past it (each node's keys through its
    # path). Every block of either loop meets the same update (``_online``).
    shared_end = prefix // BLOCK
    for j in range(split, shared_end, SPLITS):
        pos = j * BLOCK + lanes
        k = tl.load(k_base + pos[:, None].to(tl.int64) * sk_s + d[None, :])
        v = tl.load(v_base + pos[:, None].to(tl.int64) * sv_s + d[None, :])
        s = tl.where(row_ok[:, None], _dot_scores(q, k, ON_GPU), float("-inf"))
        p, scaled, m_new, l_new, seen = _online(s, m, l_sum, acc, c)
        m, l_sum, acc = _keep(seen, m_new, l_new, _dot_values(p, v, scaled, ON_GPU), m, l_sum,
                              acc)
    tail = split + tl.maximum(shared_end - split + SPLITS - 1, 0) // SPLITS * SPLITS
    for j in range(tail, tl.cdiv(prefix + P, BLOCK), SPLITS):
        pos = j * BLOCK + lanes
        s = tl.full((BLOCK_R, BLOCK), float("-inf"), tl.float32)
        for n in range(NODES):
            slot, seen_n, some = _node_lanes(path_ptr, group_off + n * sp_t,
                                             group * NODES + n < T, pos, prefix, P)
            if some:
                scores = _dot_scores(q, _rows(k_base, sk_s, slot, seen_n, D), ON_GPU)
                s = tl.where((row_node == n)[:, None] & seen_n[None, :], scores, s)
        p, scaled, m_new, l_new, seen = _online(s, m, l_sum, acc, c)
        acc_new = scaled
        for n in range(NODES):
            slot, seen_n, some = _node_lanes(path_ptr, group_off + n * sp_t,
                                             group * NODES + n < T, pos, prefix, P)
            if some:
                summed = _dot_values(p, _rows(v_base, sv_s, slot, seen_n, D), scaled, ON_GPU)
                acc_new = tl.where((row_node == n)[:, None], summed, acc_new)
        m, l_sum, acc = _keep(seen, m_new, l_new, acc_new, m, l_sum, acc)

    row = ((split * B + b).to(tl.int64) * T + t) * (HKV * G) + head
    tl.store(m_ptr + row, m, mask=row_in)
    live = row_in & (m > float("-inf"))  # a row that saw nothing here is skipped by combine
    tl.store(l_ptr + row, l_sum, mask=live)
    tl.store(acc_ptr + row[:, None] * D + d[None, :], acc, mask=live[:, None])


@triton.jit(do_not_specialize=["T", "B", "so_b"])
def tree_attention_combine_kernel(
    m_ptr, l_ptr, acc_ptr, out_ptr, so_b, so_t, B, T, HQ, c,
    D: tl.constexpr, ROWS: tl.constexpr, SPLITS: tl.constexpr, SPLITS_POW2: tl.constexpr,
    ON_GPU: tl.constexpr,
):
    """One program per (block of ``ROWS`` (node, head) rows, request): each row's splits
    weighted by 2^(c (m_s - max m)) and summed in split order, then normalised. A split that
    saw nothing of a row (m = -inf; its sum and accumulator were never written) leaves the
    sums exactly as they were; a row no split saw (padding) is written as 0."""
    b = tl.program_id(1)
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, D)
    ok = r < T * HQ
    base = b.to(tl.int64) * T * HQ + r
    stride = B.to(tl.int64) * T * HQ  # from one split to the next
    splits = tl.arange(0, SPLITS_POW2)
    m_all = tl.load(m_ptr + splits[:, None] * stride + base[None, :],
                    mask=(splits < SPLITS)[:, None] & ok[None, :], other=float("-inf"))
    m_max = tl.max(m_all, axis=0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)
    l_sum = tl.zeros((ROWS,), tl.float32)
    acc = tl.zeros((ROWS, D), tl.float32)
    for s in tl.static_range(SPLITS):  # unrolled: every split's loads can be in flight at once
        row = s * stride + base
        m_s = tl.load(m_ptr + row, mask=ok, other=float("-inf"))
        l_s = tl.load(l_ptr + row, mask=ok, other=0.0)
        a_s = tl.load(acc_ptr + row[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
        w_s = tl.exp2((m_s - m_use) * c)
        live = m_s > float("-inf")
        l_sum = tl.where(live, l_sum + l_s * w_s, l_sum)
        acc = tl.where(live[:, None], acc + a_s * w_s[:, None], acc)
    out = acc / tl.where(l_sum == 0.0, 1.0, l_sum)[:, None]
    if not ON_GPU:
        out = _round_bf16(out)
    t = r // HQ
    head = r % HQ
    tl.store(out_ptr + b.to(tl.int64) * so_b + t[:, None] * so_t + head[:, None] * D + d[None, :],
             out.to(out_ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit(do_not_specialize=["P"])
def compact_kv_kernel(
    k_ptr, v_ptr, src_ptr, dst_ptr, count_ptr,
    sk_l, sk_b, sk_h, sk_s, sv_l, sv_b, sv_h, sv_s, ss_b, P, HKV,
    D: tl.constexpr, ROWS: tl.constexpr,
):
    """One program per (request x KV head, layer): rows ``src[b, i]`` -> ``dst[b] + i`` for
    ``i < count[b]``, ``ROWS`` at a time in increasing ``i``.

    Sources increase and ``src[i] >= dst + i``, so a row's destination is below every later
    row's source: a store can only overwrite a source of the same or an earlier chunk. The
    barrier keeps every load of a chunk ahead of its stores (threads of one program)."""
    b = tl.program_id(0) // HKV
    h = tl.program_id(0) % HKV
    layer = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, D)
    count = tl.load(count_ptr + b)
    start = tl.load(dst_ptr + b).to(tl.int64)
    k_base = k_ptr + layer * sk_l + b.to(tl.int64) * sk_b + h.to(tl.int64) * sk_h
    v_base = v_ptr + layer * sv_l + b.to(tl.int64) * sv_b + h.to(tl.int64) * sv_h
    for c0 in range(0, P, ROWS):
        i = c0 + tl.arange(0, ROWS)
        live = (i < count) & (i < P)
        src = tl.load(src_ptr + b.to(tl.int64) * ss_b + i, mask=live, other=0).to(tl.int64)
        dst = start + i
        k = tl.load(k_base + src[:, None] * sk_s + d[None, :], mask=live[:, None])
        v = tl.load(v_base + src[:, None] * sv_s + d[None, :], mask=live[:, None])
        tl.debug_barrier()
        tl.store(k_base + dst[:, None] * sk_s + d[None, :], k, mask=live[:, None])
        tl.store(v_base + dst[:, None] * sv_s + d[None, :], v, mask=live[:, None])
        tl.debug_barrier()
