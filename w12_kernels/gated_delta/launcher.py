"""Shape checks and launches of the gated-delta kernels (``kernel.py``): ``gdn_path`` (each
node's path replayed, no scratch), ``gdn_walk`` (the tree walked once in depth-first order,
a scratch state per branch level), with ``walk_plan`` (the walk's order and slots, on the
device), and ``gdn_wy`` (every path at once in the WY form, on tensor cores), with
``ancestor_mask``."""

from __future__ import annotations

import torch

from w12_kernels.device import launches_on_its_tensors


def _fail(msg: str) -> None:
    raise ValueError(f"gdn_path: {msg}")


def check_inputs(state, q, k, v, decay, beta, nodes) -> tuple[int, int, int, int, int, int]:
    """(B, T, H, DK, DV, P) after checking shapes, dtypes and layouts; ValueError naming them."""
    if state.dim() != 4 or not state.is_contiguous() or state.dtype != torch.float32:
        _fail(f"state {tuple(state.shape)} {state.dtype} must be a contiguous float32 "
              "[B, H, DK, DV]")
    b, h, dk, dv = state.shape
    if q.dim() != 4 or q.shape[0] != b or q.shape[2] != h or q.shape[3] != dk:
        _fail(f"q {tuple(q.shape)} must be [{b}, T, {h}, {dk}]")
    t = q.shape[1]
    for name, x, last in (("k", k, dk), ("v", v, dv)):
        if tuple(x.shape) != (b, t, h, last):
            _fail(f"{name} {tuple(x.shape)} must be [{b}, {t}, {h}, {last}]")
    for name, x in (("decay", decay), ("beta", beta)):
        if tuple(x.shape) != (b, t, h):
            _fail(f"{name} {tuple(x.shape)} must be [{b}, {t}, {h}]")
    if nodes.dim() != 3 or nodes.shape[0] != b or nodes.shape[2] < 1:
        _fail(f"nodes {tuple(nodes.shape)} must be [{b}, N, P >= 1]")
    for name, x in (("q", q), ("k", k), ("v", v), ("decay", decay), ("beta", beta)):
        if x.dtype != torch.float32 or x.stride(-1) != 1:
            _fail(f"{name} must be float32 with a contiguous last dim")
    if decay.stride() != beta.stride() or q.stride() != k.stride():
        _fail("decay and beta, and q and k, must share strides")
    if nodes.dtype not in (torch.int32, torch.int64):
        _fail(f"nodes is {nodes.dtype}, needs int32 or int64")
    for name, n in (("DK", dk), ("DV", dv)):
        if n & (n - 1) or not 16 <= n <= 256:
            _fail(f"{name} = {n}: needs a power of two in 16..256")
    return b, t, h, dk, dv, nodes.shape[2]


@launches_on_its_tensors
def gdn_path(state, q, k, v, decay, beta, nodes, *, out: bool = True, store: bool = False,
             new_state: torch.Tensor | None = None) -> torch.Tensor | None:
    """Each row of ``nodes`` [B, N, P] (indices into the T nodes' inputs, root first, then -1)
    is a path stepped from ``state`` [B, H, DK, DV]; returns the path ends' outputs
    [B, N, H, DV] (``q`` at node index n = the row's own index) when ``out``. ``store``: the
    stepped state goes to ``new_state`` (default: ``state``, in place), which needs N == 1."""
    from w12_kernels.gated_delta import kernel

    b, t, h, dk, dv, p = check_inputs(state, q, k, v, decay, beta, nodes)
    n = nodes.shape[1]
    if store and n != 1:
        _fail(f"store needs one path a request, got {n}")
    if out and n > t:
        _fail(f"{n} paths but {t} nodes to read q from")
    target = state if new_state is None else new_state
    if store and (target.shape != state.shape or not target.is_contiguous()):
        _fail("new_state must be a contiguous tensor shaped like state")
    result = torch.empty((b, n, h, dv), dtype=torch.float32, device=q.device) if out else None
    o = result if out else state  # a placeholder pointer where nothing is written
    nodes = nodes.contiguous()
    bv = min(dv, 32)
    kernel.gdn_path_kernel[(n, b * h, dv // bv)](
        state, q, k, v, decay, beta, nodes, o, target,
        state.stride(0), state.stride(1), q.stride(0), q.stride(1), q.stride(2),
        v.stride(0), v.stride(1), v.stride(2), decay.stride(0), decay.stride(1),
        nodes.stride(0), nodes.stride(1), o.stride(0), o.stride(1), o.stride(2),
        t, p, h, DK=dk, DV=dv, BV=bv, OUT=out, STORE=store,
    )
    return result


def walk_plan(nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(order, parent, slot), each [B, N] int32, for trees given as paths ``nodes`` [B, N, P]
    (node indices root first, then -1; a row of -1 is padding): the live nodes in depth-first
    preorder (children in index order) then -1 for padding; each node's parent (-1: the
    committed state); and its scratch slot: its parent's, when it is its parent's last child
    (the parent's state is not needed again), else one more. Device ops, fixed shapes."""
    b, n, _ = nodes.shape
    dev = nodes.device
    nodes = nodes.long()
    depth = (nodes >= 0).sum(-1) - 1
    live = depth >= 0
    parent = torch.where(depth > 0, nodes.gather(2, (depth - 1).clamp(min=0)[..., None])[..., 0],
                         -1)
    anc = torch.zeros(b, n, n + 1, device=dev).scatter_(2, torch.where(nodes >= 0, nodes, n),
                                                         1.0)[..., :n]  # [b, node, ancestor]
    size = anc.sum(1)  # nodes in each node's subtree
    idx = torch.arange(n, device=dev)
    siblings = (parent[:, :, None] == parent[:, None, :]) & live[:, None, :] & live[:, :, None]
    earlier = (siblings & (idx[None, None, :] < idx[None, :, None])).float()
    later = (siblings & (idx[None, None, :] > idx[None, :, None])).any(-1)
    offset = (parent >= 0).float() + (earlier @ size[..., None])[..., 0]
    pre = (anc @ offset[..., None])[..., 0]  # small integers: exact in float32
    pre = torch.where(live, pre, n + idx.float())
    order = torch.where(torch.sort(pre, dim=1).values < n, torch.argsort(pre, dim=1), -1)
    # a node that is not its parent's last child leaves that parent's slot alone
    bump = ((parent >= 0) & later).float()
    slot = (anc @ bump[..., None])[..., 0].long()
    return order.int(), parent.int(), torch.where(live, slot, 0).int()


WALK_SLOTS = 8  # scratch states a request and head keeps by default (``gdn_walk``)


@launches_on_its_tensors
def gdn_walk(state, q, k, v, decay, beta, nodes, *, out: bool = True, commit: bool = False,
             slots: int = WALK_SLOTS, snapshots: torch.Tensor | None = None,
             plan: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
             ) -> torch.Tensor | None:
    """Every node's output [B, N, H, DV] of the trees ``nodes`` [B, N, P], walking each tree
    once. Here row n of ``nodes`` is node n's own path (root first, ending at n; -1 rows are
    padding), and node n reads q, k, v, decay and beta at index n. ``commit``: the last node
    of the walk leaves its state in ``state``: a decode step's only node, or the accepted path
    given as the tree's rows of its nodes (every other row -1). At most ``slots`` scratch
    states a request and head: a node whose parent's state did not get one replays the
    parent's path instead (deep branching trees only; chains need one). ``snapshots`` [B, H, N, DK,
    DV] float32: keep every node's state there (slot = node), the per-node snapshot approach
    of serving engines (a baseline; its commit is a copy of the accepted node's state).
    ``plan``: ``walk_plan(nodes)`` computed once for layers that walk the same trees (its dozen
    small launches are most of a small tree's walk)."""
    from w12_kernels.gated_delta import kernel

    b, t, h, dk, dv, p = check_inputs(state, q, k, v, decay, beta, nodes)
    n = nodes.shape[1]
    if n > t:
        _fail(f"{n} nodes in the paths but {t} nodes of inputs")
    order, parent, slot = walk_plan(nodes) if plan is None else plan
    if slots < 1:
        _fail(f"slots {slots}: at least one")
    if snapshots is None:
        cap = min(p, n, slots)
        scratch = torch.empty((b, h, cap, dk, dv), dtype=torch.float32, device=q.device)
    else:
        if tuple(snapshots.shape) != (b, h, n, dk, dv) or snapshots.dtype != torch.float32 or \
                snapshots.stride(-1) != 1 or snapshots.stride(-2) != dv:
            _fail(f"snapshots {tuple(snapshots.shape)} must be float32 [{b}, {h}, {n}, {dk}, "
                  f"{dv}] with contiguous states")
        scratch, cap = snapshots, n
        slot = torch.arange(n, dtype=torch.int32, device=q.device).expand(b, n).contiguous()
    result = torch.empty((b, n, h, dv), dtype=torch.float32, device=q.device) if out else None
    o = result if out else scratch
    bv = min(dv, 32)
    nodes = nodes.contiguous()
    kernel.gdn_walk_kernel[(b * h, dv // bv)](
        state, q, k, v, decay, beta, order, parent, slot, nodes, scratch, o,
        state.stride(0), state.stride(1), q.stride(0), q.stride(1), q.stride(2),
        v.stride(0), v.stride(1), v.stride(2), decay.stride(0), decay.stride(1),
        order.stride(0), nodes.stride(0), nodes.stride(1), scratch.stride(0), scratch.stride(1),
        scratch.stride(2), o.stride(0), o.stride(1), o.stride(2), n, h, p, cap,
        DK=dk, DV=dv, BV=bv, OUT=out, COMMIT=commit,
    )
    return result


def gdn_chain(state, q, k, v, decay, beta, *, out: bool = True) -> torch.Tensor | None:
    """Every token of a chunk in order from ``state``, which ends holding the state after the
    last token (a prefill chunk, in place): the walk of one chain, whose plan needs no work
    (node i's parent is i - 1, one scratch slot, no replay). Outputs [B, T, H, DV] as
    ``gdn_walk`` of that chain gives them, bit for bit."""
    b, t = q.shape[0], q.shape[1]
    order = torch.arange(t, dtype=torch.int32, device=q.device).expand(b, t).contiguous()
    plan = (order, (order - 1).contiguous(), torch.zeros_like(order))
    nodes = torch.zeros((b, t, 1), dtype=torch.int32, device=q.device)  # (never replayed)
    return gdn_walk(state, q, k, v, decay, beta, nodes, out=out, commit=True, plan=plan)


def ancestor_mask(nodes: torch.Tensor) -> torch.Tensor:
    """[B, N, N] int8 of the trees ``nodes`` [B, N, P] (node n's path in row n, root first,
    then -1): ``[b, j, i]`` is 1 when node i is on node j's path (j included). Device ops."""
    b, n, _ = nodes.shape
    index = torch.where(nodes >= 0, nodes.long(), n)
    return torch.zeros(b, n, n + 1, dtype=torch.int8, device=nodes.device).scatter_(
        2, index, 1)[..., :n].contiguous()


WY_MAX_NODES = 128  # the largest tree ``gdn_wy`` solves (its N x N matrices live in registers)


@launches_on_its_tensors
def gdn_wy(state, q, k, v, decay, beta, nodes, *, anc: torch.Tensor | None = None,
           block_v: int | None = None) -> torch.Tensor:
    """Every node's output [B, N, H, DV] of the trees ``nodes`` [B, N, P] (row n node n's own
    path, as ``gdn_walk`` takes it) from ``state``, solved at once in the WY form: within the
    error of a float32 recurrence, not the bits of decode steps (``gdn_path`` / ``gdn_walk``
    give those). ``anc``: ``ancestor_mask(nodes)``, computed once for the layers that verify
    the same trees. ``block_v``: value columns a program (default min(DV, 32))."""
    from w12_kernels.gated_delta import kernel

    b, t, h, dk, dv, _ = check_inputs(state, q, k, v, decay, beta, nodes)
    n = nodes.shape[1]
    if n > t:
        _fail(f"{n} nodes in the paths but {t} nodes of inputs")
    if n > WY_MAX_NODES:
        _fail(f"{n} nodes: the WY kernel solves trees of at most {WY_MAX_NODES}")
    anc = ancestor_mask(nodes) if anc is None else anc
    if tuple(anc.shape) != (b, n, n) or anc.stride(-1) != 1:
        _fail(f"anc {tuple(anc.shape)} must be [{b}, {n}, {n}] with a contiguous last dim")
    bv = block_v or min(dv, 32)
    if bv & (bv - 1) or not 16 <= bv <= dv:
        _fail(f"block_v {bv}: a power of two in 16..{dv}")
    result = torch.empty((b, n, h, dv), dtype=torch.float32, device=q.device)
    kernel.gdn_wy_kernel[(b * h, dv // bv)](
        state, q, k, v, decay, beta, anc, result,
        state.stride(0), state.stride(1), q.stride(0), q.stride(1), q.stride(2),
        v.stride(0), v.stride(1), v.stride(2), decay.stride(0), decay.stride(1),
        anc.stride(0), anc.stride(1), result.stride(0), result.stride(1), result.stride(2),
        n, h, DK=dk, DV=dv, BV=bv, BK=min(dk, 32), NP=max(16, next_pow2(n)),
        ON_GPU=q.is_cuda, num_warps=4 if n <= 32 else 8,
    )
    return result


def next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
