"""Readable references of the gated delta rule (Gated DeltaNet) and of its draft-tree forms.

Every function works on one tree shared by the leading dimensions ``...`` (heads, requests of
one tree) and computes in the dtype it is given: float64 for the reference, float32 for the
"FP32 sequential recurrence" whose error the kernels' tolerances are stated against
(``fp32_error``).

The recurrence, per head, with state ``S`` [K, V] and one token (q, k, v [K or V], gate g <= 0
in log space, beta in (0, 1)); q and k arrive L2-normalised (the layer does it) and q scaled::

    S <- exp(g) S                 decay
    u  = beta (v - S^T k)         the delta: what the state mispredicts for k
    S <- S + k u^T                rank-1 write
    o  = S^T q

A draft tree has nodes 0..N-1 in topological order (``parents[j] < j``; -1: a node whose
parent is the committed state). Node j's output is the recurrence run along its path, root
first, from the committed state ``S0``:

- ``path_verify`` recomputes each path from ``S0`` (no state per node: the memory of one state);
- ``snapshot_verify`` keeps the state after every node (what serving engines do: N states);
- ``wy_verify`` solves all paths at once. With G_j the sum of the gates on j's path (itself
  included) and anc(j) its path (ancestors and j), every node's state is
  ``S_j = e^{G_j} S0 + sum_{i in anc(j)} e^{G_j - G_i} k_i w_i^T`` where the ``w`` solve the
  unit lower-triangular system ``w_j + beta_j sum_{i in anc(j), i != j} e^{G_j - G_i}
  (k_j . k_i) w_i = beta_j (v_j - e^{G_j} S0^T k_j)``, and
  ``o_j = e^{G_j} S0^T q_j + sum_{i in anc(j)} e^{G_j - G_i} (q_j . k_i) w_i``: two products
  with S0, one triangular solve under the ancestor mask, one masked product;
- ``commit`` replays the accepted path into the state: the decode step over those tokens.

``split3`` cuts a float32 state into three BF16 pieces whose sum is exact (8 + 8 + 8
significand bits), so that BF16 tensor cores can multiply the state with float32 accuracy.
``tree_conv`` and ``conv_commit`` are the layer's short causal convolution over a tree (a
node's window: the committed inputs, then its path).
"""

from __future__ import annotations

import torch


def check_parents(parents: torch.Tensor | list[int]) -> list[int]:
    """``parents`` as a list, checked to be a topological order (``-1 <= parents[j] < j``)."""
    out = [int(p) for p in (parents.tolist() if isinstance(parents, torch.Tensor) else parents)]
    for j, p in enumerate(out):
        if not -1 <= p < j:
            raise ValueError(f"parents[{j}] = {p}: a node's parent must come before it (or be "
                             "-1, the committed state)")
    return out


def path_of(parents: list[int], node: int) -> list[int]:
    """Nodes from the first after the committed state down to ``node``."""
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


def step(state, q, k, v, g, beta):
    """One token: (output [..., V], new state [..., K, V])."""
    state = state * torch.exp(g)[..., None, None]
    u = beta[..., None] * (v - torch.einsum("...kv,...k->...v", state, k))
    state = state + k[..., :, None] * u[..., None, :]
    return torch.einsum("...kv,...k->...v", state, q), state


def sequential(state, q, k, v, g, beta):
    """Tokens [..., T, *] in order: (outputs [..., T, V], final state)."""
    outs = []
    for t in range(q.shape[-2]):
        o, state = step(state, q[..., t, :], k[..., t, :], v[..., t, :], g[..., t], beta[..., t])
        outs.append(o)
    return torch.stack(outs, dim=-2), state


def path_verify(state, q, k, v, g, beta, parents):
    """Each node's output from its own path replayed from ``state`` [..., K, V]: [..., N, V]."""
    parents = check_parents(parents)
    outs = []
    for j in range(len(parents)):
        path = path_of(parents, j)
        o, _ = sequential(state, q[..., path, :], k[..., path, :], v[..., path, :],
                          g[..., path], beta[..., path])
        outs.append(o[..., -1, :])
    return torch.stack(outs, dim=-2)


def snapshot_verify(state, q, k, v, g, beta, parents):
    """Outputs [..., N, V] and the state after every node [..., N, K, V], each node stepped
    from its parent's state (the per-node snapshot approach)."""
    parents = check_parents(parents)
    outs, states = [], []
    for j, p in enumerate(parents):
        o, s = step(state if p < 0 else states[p], q[..., j, :], k[..., j, :], v[..., j, :],
                    g[..., j], beta[..., j])
        outs.append(o)
        states.append(s)
    return torch.stack(outs, dim=-2), torch.stack(states, dim=-3)


def ancestors(parents: list[int]) -> torch.Tensor:
    """[N, N] bool: ``[j, i]`` when i is on j's path (j itself included)."""
    n = len(parents)
    anc = torch.zeros(n, n, dtype=torch.bool)
    for j, p in enumerate(parents):
        if p >= 0:
            anc[j] = anc[p]
        anc[j, j] = True
    return anc


def path_gates(g, parents: list[int]):
    """G [..., N]: the sum of the gates on each node's path."""
    total = []
    for j, p in enumerate(parents):
        total.append(g[..., j] if p < 0 else total[p] + g[..., j])
    return torch.stack(total, dim=-1)


def wy_solve(state, k, v, g, beta, parents):
    """The WY form of a tree: ``w`` [..., N, V], ``G`` [..., N] and the decay matrix
    ``D[..., j, i] = e^{G_j - G_i}`` on the ancestor mask (0 elsewhere)."""
    parents = check_parents(parents)
    anc = ancestors(parents).to(k.device)
    big_g = path_gates(g, parents)
    decay = torch.where(anc, torch.exp(big_g[..., :, None] - big_g[..., None, :]),
                        torch.zeros((), dtype=k.dtype, device=k.device))
    strict = anc & ~torch.eye(len(parents), dtype=torch.bool, device=k.device)
    a = torch.where(strict, beta[..., :, None] * decay * (k @ k.transpose(-1, -2)),
                    torch.zeros((), dtype=k.dtype, device=k.device))
    eye = torch.eye(len(parents), dtype=k.dtype, device=k.device)
    rhs = beta[..., None] * (v - torch.exp(big_g)[..., None] * (k @ state))
    w = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)
    return w, big_g, decay


def wy_verify(state, q, k, v, g, beta, parents):
    """Every node's output [..., N, V] through the WY form (module docstring)."""
    w, big_g, decay = wy_solve(state, k, v, g, beta, parents)
    return torch.exp(big_g)[..., None] * (q @ state) + (decay * (q @ k.transpose(-1, -2))) @ w


def wy_state(state, k, v, g, beta, parents, node: int):
    """The state after ``node`` [..., K, V] from the WY form: what committing its path gives."""
    w, big_g, decay = wy_solve(state, k, v, g, beta, parents)
    path = path_of(check_parents(parents), node)
    weights = decay[..., node, path]  # e^{G_node - G_i} on the path
    return torch.exp(big_g[..., node])[..., None, None] * state + torch.einsum(
        "...n,...nk,...nv->...kv", weights, k[..., path, :], w[..., path, :])


def commit(state, k, v, g, beta, parents, node: int):
    """The state after the accepted path ending at ``node``: each of its tokens through the
    recurrence in order (outputs are not needed, so q is not either)."""
    path = path_of(check_parents(parents), node)
    for j in path:
        state = state * torch.exp(g[..., j])[..., None, None]
        u = beta[..., j, None] * (v[..., j, :] - torch.einsum("...kv,...k->...v", state,
                                                              k[..., j, :]))
        state = state + k[..., j, :, None] * u[..., None, :]
    return state


def split3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float32 ``x`` as three bfloat16 pieces, ``hi + mid + lo == x`` exactly in float32 for
    normal values (each piece rounds what the ones before it left: 8 significand bits each)."""
    if x.dtype != torch.float32:
        raise ValueError(f"split3 takes float32, got {x.dtype}")
    hi = x.to(torch.bfloat16)
    rest = x - hi.float()
    mid = rest.to(torch.bfloat16)
    lo = (rest - mid.float()).to(torch.bfloat16)
    return hi, mid, lo


def fp32_error(state, q, k, v, g, beta):
    """Largest |output| error of the float32 sequential recurrence against float64 on these
    inputs (any dtype in): the error scale a kernel's tolerance is stated in."""
    args64 = [x.double() for x in (state, q, k, v, g, beta)]
    args32 = [x.float() for x in (state, q, k, v, g, beta)]
    exact, _ = sequential(*args64)
    approx, _ = sequential(*args32)
    return (approx.double() - exact).abs().max().item()


def tree_conv(tail, x, weight, parents):
    """The short causal convolution of every node: ``tail`` [..., C, W-1] the committed
    inputs (oldest first), ``x`` [..., N, C] the nodes' inputs, ``weight`` [C, W]; node j's
    window is the last W inputs of the tail followed by its path. Output [..., N, C] (before
    the activation)."""
    parents = check_parents(parents)
    width = weight.shape[-1]
    outs = []
    for j in range(len(parents)):
        path = path_of(parents, j)
        window = torch.cat((tail, x[..., path, :].transpose(-1, -2)), dim=-1)[..., -width:]
        outs.append((window * weight).sum(-1))
    return torch.stack(outs, dim=-2)


def conv_commit(tail, x, parents, node: int):
    """The committed inputs after accepting the path to ``node``: [..., C, W-1]."""
    path = path_of(check_parents(parents), node)
    width = tail.shape[-1]
    return torch.cat((tail, x[..., path, :].transpose(-1, -2)), dim=-1)[..., -width:]


def verify_state_bytes(nodes: int, heads: int, dk: int, dv: int, method: str,
                       state_bytes: int = 4) -> int:
    """Bytes of recurrent state (and of the state-sized work) one request's GDN layer holds to
    verify a tree of ``nodes``: ``snapshot`` one state per node; ``path`` only the committed
    state (each path recomputed); ``wy`` the committed state plus the solve's w [N, V] and its
    N x N matrix, per head."""
    state = heads * dk * dv * state_bytes
    if method == "snapshot":
        return nodes * state + state
    if method == "path":
        return state
    if method == "wy":
        return state + heads * (nodes * dv + nodes * nodes) * state_bytes
    raise ValueError(f"method {method!r}: snapshot, path or wy")
