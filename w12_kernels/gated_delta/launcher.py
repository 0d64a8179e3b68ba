"""Shape checks and launches of the gated-delta path kernel (``kernel.py``)."""

from __future__ import annotations

import torch


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


def gdn_path(state, q, k, v, decay, beta, nodes, *, out: bool = True, store: bool = False,
             new_state: torch.Tensor | None = None) -> torch.Tensor | None:
    """Each row of ``nodes`` [B, N, P] (node indices into the T nodes, root first, then -1) is
    a path stepped from ``state`` [B, H, DK, DV]; returns the path ends' outputs
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
