"""Gated DeltaNet verify, commit and decode per layer (``w12_kernels.gated_delta``).

Shapes: one GDN layer of the hybrid-27b preset (48 value heads, DK = DV = 128; ``--heads``,
``--dk``, ``--dv`` change it), batch ``--batch``, trees of N in {1, 16, 64, 128} nodes: chains
and random best-first-like trees (each node's parent drawn among the earlier nodes, shallow
ones likelier). Candidates, each a CUDA graph of ``--calls`` calls timed in one run
(``harness.time_graphs``):

- ``path``: every node's path replayed from the committed state (``gdn_path``, no scratch);
- ``walk``: each tree walked once, a scratch state per branch level (``gdn_walk``);
- ``snapshot``: the walk keeping every node's state (serving engines' per-node snapshots),
  plus the copy of one accepted node's state into the committed state, its commit;
- ``commit``: replaying an accepted path of the tree's depth into the state (``gdn_path``);
- ``decode``: one token (``gdn_walk`` of a one-node tree), the step a commit is compared with;
- ``wy``: every path solved at once in the WY form on tensor cores (``gdn_wy``, the ancestor
  mask made once per step as the engine does, outside the timing); "wy err" is its largest
  output error against path verify in units of the float32 recurrence's own error on the
  deepest path (``reference.fp32_error``).

"MB" is the recurrent state verify holds per layer: the committed state plus the walk's
scratch (``WALK_SLOTS`` states at most; "slots" is how many the tree uses, a node past them
replays its parent's path) or the N snapshots. Before timing, every node of a 16-node
tree is checked on the GPU to have the bits of decode steps along its path, with both kernels.

    python benchmarks/gated_delta.py --json results/gated_delta.json
"""

from __future__ import annotations

import argparse
import random

import torch
import torch.nn.functional as F
from harness import environment, project_on_path, time_graphs, write_json

project_on_path()

from w12_kernels.gated_delta import ancestor_mask, gdn_path, gdn_walk, gdn_wy  # noqa: E402
from w12_kernels.gated_delta import reference as ref  # noqa: E402
from w12_kernels.gated_delta.launcher import WALK_SLOTS, walk_plan  # noqa: E402


def tree_parents(n: int, kind: str, rng: random.Random) -> list[int]:
    if kind == "chain":
        return list(range(-1, n - 1))
    parents = [-1]
    for j in range(1, n):
        parents.append(min(rng.randrange(j), rng.randrange(j)))  # shallow ones likelier
    return parents


def paths_of(parents: list[int], batch: int, device) -> torch.Tensor:
    n = len(parents)
    out = torch.full((batch, n, n), -1, dtype=torch.int32)
    for j in range(n):
        path, m = [], j
        while m >= 0:
            path.append(m)
            m = parents[m]
        out[:, j, :len(path)] = torch.tensor(path[::-1], dtype=torch.int32)
    return out.to(device)


def inputs(batch, n, heads, dk, dv, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, device=device)

    q = F.normalize(rand(batch, n, heads, dk), dim=-1) * dk**-0.5
    k = F.normalize(rand(batch, n, heads, dk), dim=-1)
    v = rand(batch, n, heads, dv)
    decay = torch.exp(-torch.rand(batch, n, heads, generator=gen, device=device) * 0.1)
    beta = torch.rand(batch, n, heads, generator=gen, device=device)
    return rand(batch, heads, dk, dv), q, k, v, decay, beta


def check_bits(heads, dk, dv) -> bool:
    """Every node of a 16-node tree: the bits of one-node steps along its path, both kernels."""
    parents = tree_parents(16, "tree", random.Random(1))
    state, q, k, v, decay, beta = inputs(1, 16, heads, dk, dv, "cuda")
    nodes = paths_of(parents, 1, "cuda")
    one = torch.zeros(1, 1, 1, dtype=torch.int32, device="cuda")
    for verify in (gdn_walk, gdn_path):
        outs = verify(state, q, k, v, decay, beta, nodes)
        for j in range(16):
            path = nodes[0, j][nodes[0, j] >= 0].tolist()
            s = state.clone()
            for m in path:
                at = slice(m, m + 1)
                o = gdn_walk(s, q[:, at], k[:, at], v[:, at], decay[:, at], beta[:, at], one,
                             commit=True) if verify is gdn_walk else \
                    gdn_path(s, q[:, at], k[:, at], v[:, at], decay[:, at], beta[:, at], one,
                             store=True)
            if not torch.equal(o[0, 0], outs[0, j]):
                return False
    return True


def candidates(state, q, k, v, decay, beta, nodes, snaps, accepted, deepest, calls):
    """The six candidates' call lists (module docstring), in the order of the table."""
    work = state.clone()
    anc = ancestor_mask(nodes)
    one = torch.zeros(state.shape[0], 1, 1, dtype=torch.int32, device=state.device)
    first = [x[:, :1] for x in (q, k, v, decay, beta)]
    return [
        [lambda: gdn_path(state, q, k, v, decay, beta, nodes)] * calls,
        [lambda: gdn_walk(state, q, k, v, decay, beta, nodes)] * calls,
        [lambda: (gdn_walk(state, q, k, v, decay, beta, nodes, snapshots=snaps),
                  work.copy_(snaps[:, :, deepest]))] * calls,
        [lambda: gdn_path(work, q, k, v, decay, beta, accepted, out=False, store=True)] * calls,
        [lambda: gdn_walk(work, *first, one, commit=True)] * calls,
        [lambda: gdn_wy(state, q, k, v, decay, beta, nodes, anc=anc)] * calls,
    ]


def wy_error(state, q, k, v, decay, beta, nodes, deepest) -> float:
    """WY's largest error against path verify, in units of the float32 recurrence's error on
    the deepest path (request 0)."""
    err = (gdn_wy(state, q, k, v, decay, beta, nodes) -
           gdn_path(state, q, k, v, decay, beta, nodes)).abs().max().item()
    path = nodes[0, deepest][nodes[0, deepest] >= 0].long()
    per_head = lambda x: x[0, path].transpose(0, 1).cpu()  # noqa: E731  [H, depth, ...]
    scale = ref.fp32_error(state[0].cpu(), per_head(q), per_head(k), per_head(v),
                           per_head(decay).log(), per_head(beta))
    return err / max(scale, 1e-30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", type=int, default=48)
    parser.add_argument("--dk", type=int, default=128)
    parser.add_argument("--dv", type=int, default=128)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--nodes", default="1,16,64,128")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json")
    a = parser.parse_args()
    env = environment()
    exact = check_bits(a.heads, a.dk, a.dv)
    print(f"# {env.get('gpu')}  H {a.heads} DK {a.dk} DV {a.dv} B {a.batch}  bit-identical to "
          f"decode steps: {exact}")
    state_mb = a.batch * a.heads * a.dk * a.dv * 4 / 2**20
    print(f"{'tree':<6} {'N':>4} {'depth':>5} {'slots':>5} {'path us':>9} {'walk us':>9} "
          f"{'snap us':>9} {'commit us':>9} {'decode us':>9} {'wy us':>8} {'path/wy':>7} "
          f"{'wy err':>6} {'walk MB':>8} {'snap MB':>8}")
    rows = []
    for n in map(int, a.nodes.split(",")):
        for kind in ("chain", "tree") if n > 1 else ("chain",):
            parents = tree_parents(n, kind, random.Random(n))
            nodes = paths_of(parents, a.batch, "cuda")
            state, q, k, v, decay, beta = inputs(a.batch, n, a.heads, a.dk, a.dv, "cuda")
            depth = int((nodes >= 0).sum(-1).max())
            slots = int(walk_plan(nodes)[2].max()) + 1
            snaps = torch.empty(a.batch, a.heads, n, a.dk, a.dv, device="cuda")
            deepest = int((nodes >= 0).sum(-1)[0].argmax())
            accepted = nodes[:, deepest:deepest + 1]  # the deepest path, as one path
            times = time_graphs(candidates(state, q, k, v, decay, beta, nodes, snaps,
                                           accepted, deepest, a.calls))
            row = {"tree": kind, "n": n, "depth": depth, "slots": slots,
                   "path_us": times[0], "walk_us": times[1], "snapshot_us": times[2],
                   "commit_us": times[3], "decode_us": times[4], "wy_us": times[5],
                   "wy_error_units": wy_error(state, q, k, v, decay, beta, nodes, deepest),
                   "walk_state_mb": state_mb * (1 + min(n, WALK_SLOTS)),
                   "snapshot_state_mb": state_mb * (1 + n)}
            rows.append(row)
            print(f"{kind:<6} {n:>4} {depth:>5} {slots:>5} {times[0]:>9.1f} {times[1]:>9.1f} "
                  f"{times[2]:>9.1f} {times[3]:>9.1f} {times[4]:>9.1f} {times[5]:>8.1f} "
                  f"{times[0] / times[5]:>7.2f} {row['wy_error_units']:>6.1f} "
                  f"{row['walk_state_mb']:>8.1f} {row['snapshot_state_mb']:>8.1f}")
    write_json(a.json, rows, env, bit_identical=exact, heads=a.heads, dk=a.dk, dv=a.dv,
               batch=a.batch)


if __name__ == "__main__":
    main()
