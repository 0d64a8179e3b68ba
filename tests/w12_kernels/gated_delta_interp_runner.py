"""Runs the gated-delta kernels under ``TRITON_INTERPRET=1`` (a fresh process) and prints
one JSON line: case id -> "ok" or the failure. ``test_gated_delta_kernel.py`` starts it."""

from __future__ import annotations

import random


def random_parents(n: int, seed: int) -> list[int]:
    """A tree of ``n`` nodes, each node's parent drawn among the earlier ones (shallow likelier)."""
    rng = random.Random(seed)
    return [-1] + [min(rng.randrange(j), rng.randrange(j)) for j in range(1, n)]


# id: (what, batch, heads, DK, DV, tree)
CASES = {
    "verify_chain": ("verify", 2, 2, 16, 32, [-1, 0, 1, 2, 3, 4, 5, 6]),
    "verify_tree": ("verify", 1, 3, 32, 16, [-1, 0, 0, 1, 1, 2, 5, 6, 3, 0]),
    "verify_forest_dv64": ("verify", 2, 1, 16, 64, [-1, -1, 0, 1, 3]),
    "decode_bits_equal_verify": ("bits", 2, 2, 16, 32, [-1, 0, 1, 1, 3, 0]),
    "commit": ("commit", 2, 2, 16, 32, [-1, 0, 0, 2, 3, 1]),
    "walk_verify_tree": ("walk-verify", 1, 3, 32, 16, [-1, 0, 0, 1, 1, 2, 5, 6, 3, 0]),
    "walk_verify_forest": ("walk-verify", 2, 1, 16, 64, [-1, -1, 0, 1, 3]),
    "walk_bits": ("walk-bits", 2, 2, 16, 32, [-1, 0, 1, 1, 3, 0, 2]),
    # a caterpillar: each spine node's last child is a leaf, so the walk needs a slot per
    # level; with 2 slots the deeper nodes replay their parents' paths
    "walk_few_slots_replays": ("walk-replay", 1, 2, 16, 16, [-1, 0, 0, 1, 1, 3, 3, 5, 5, 7]),
    "chain_prefill": ("chain", 2, 2, 16, 32, [-1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]),
    # the WY form: every path solved at once (rows padded to 16; two value blocks at DV 64)
    "wy_chain": ("wy", 2, 2, 16, 32, [-1, 0, 1, 2, 3, 4, 5, 6]),
    "wy_tree": ("wy", 1, 3, 32, 16, [-1, 0, 0, 1, 1, 2, 5, 6, 3, 0]),
    "wy_forest_dv64": ("wy", 2, 1, 16, 64, [-1, -1, 0, 1, 3]),
    "wy_tree_40": ("wy", 1, 2, 64, 32, random_parents(40, 5)),
    "wy_zero_decay": ("wy-zero", 1, 2, 16, 32, [-1, 0, 1, 1, 3, 2]),  # a decay of exactly 0
}


def inputs(b, h, dk, dv, n, seed=0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, n, h, dk, generator=gen), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(torch.randn(b, n, h, dk, generator=gen), dim=-1)
    v = torch.randn(b, n, h, dv, generator=gen)
    decay = torch.exp(-torch.rand(b, n, h, generator=gen) * 0.3)
    beta = torch.rand(b, n, h, generator=gen)
    state = torch.randn(b, h, dk, dv, generator=gen)
    return state, q, k, v, decay, beta


def paths(parents, rows):
    """[rows, N, P] node indices of every node's path, root first, then -1."""
    import torch

    from w12_kernels.gated_delta.reference import path_of

    n = len(parents)
    out = torch.full((rows, n, n), -1, dtype=torch.int32)
    for j in range(n):
        p = path_of(parents, j)
        out[:, j, :len(p)] = torch.tensor(p, dtype=torch.int32)
    return out


def reference_outputs(state, q, k, v, decay, beta, parents):
    """float64 [B, N, H, DV] from ``reference.path_verify`` (heads and requests as ``...``)."""
    from w12_kernels.gated_delta import reference as ref

    per_head = lambda x: x.double().transpose(1, 2)  # noqa: E731  [B, H, N, ...]
    o = ref.path_verify(state.double(), per_head(q), per_head(k), per_head(v),
                        per_head(decay).log(), per_head(beta), parents)
    return o.transpose(1, 2)


def fp32_scale(state, q, k, v, decay, beta, parents):
    """The float32 sequential recurrence's error along the tree's deepest path (the unit of the
    tolerance: the kernel is a float32 recurrence too)."""
    from w12_kernels.gated_delta import reference as ref

    deepest = max(range(len(parents)), key=lambda j: len(ref.path_of(parents, j)))
    path = ref.path_of(parents, deepest)
    per_head = lambda x: x[:, path].transpose(1, 2)  # noqa: E731
    return ref.fp32_error(state, per_head(q), per_head(k), per_head(v),
                          per_head(decay).log(), per_head(beta))


def check(what, b, h, dk, dv, parents, device="cpu"):
    import torch

    from w12_kernels.gated_delta import reference as ref
    from w12_kernels.gated_delta.launcher import (
        ancestor_mask,
        gdn_chain,
        gdn_path,
        gdn_walk,
        gdn_wy,
        walk_plan,
    )

    n = len(parents)
    cpu = inputs(b, h, dk, dv, n)
    if what == "wy-zero":  # node 1's gate wipes the state (a decay that underflowed)
        cpu[4][:, 1] = 0.0
        what = "wy"
    state, q, k, v, decay, beta = (x.to(device) for x in cpu)
    nodes = paths(parents, b).to(device)

    def one(path):  # one path a request, as a [B, 1, P] index tensor
        row = torch.full((b, 1, max(len(path), 1)), -1, dtype=torch.int32)
        row[:, 0, :len(path)] = torch.tensor(path, dtype=torch.int32)
        return row.to(device)

    if what == "chain":  # a prefill chunk: the chain's walk with its trivial plan, in place
        walked = gdn_walk(state, q, k, v, decay, beta, nodes)
        final = state.clone()
        gdn_walk(final, q, k, v, decay, beta, nodes, out=False, commit=True)  # the last node
        chained_state = state.clone()
        got = gdn_chain(chained_state, q, k, v, decay, beta)
        assert torch.equal(got, walked), "the chain's outputs differ from the walk's"
        assert torch.equal(chained_state, final), "the chain's final state differs"
        return
    if what == "walk-replay":  # the same bits with every slot kept and with two
        full = gdn_walk(state, q, k, v, decay, beta, nodes, slots=n)
        planned = gdn_walk(state, q, k, v, decay, beta, nodes, slots=n, plan=walk_plan(nodes))
        assert torch.equal(planned, full), "a precomputed plan changed the walk's outputs"
        few = gdn_walk(state, q, k, v, decay, beta, nodes, slots=2)
        assert int(walk_plan(nodes)[2].max()) + 1 > 2, "the tree should need more than 2 slots"
        assert torch.equal(full, few), "replayed parents changed the bits"
        what = "walk-verify"
    if what in ("verify", "walk-verify", "wy"):
        verify = {"walk-verify": gdn_walk, "wy": gdn_wy}.get(what, gdn_path)
        got = verify(state, q, k, v, decay, beta, nodes).cpu()
        want = reference_outputs(*cpu, parents)
        err = (got.double() - want).abs().max().item()
        bound = 8 * fp32_scale(*cpu, parents) + 1e-6
        assert err <= bound, f"error {err:.2e} > {bound:.2e}"
        assert torch.equal(state.cpu(), cpu[0]), "verify changed the state"
        if what == "wy":  # against path verify too, with the mask given once for all layers
            again = gdn_wy(state, q, k, v, decay, beta, nodes, anc=ancestor_mask(nodes))
            assert torch.equal(again, got.to(device)), "a given mask changed the outputs"
            paths_err = (got - gdn_path(state, q, k, v, decay, beta, nodes).cpu()).abs().max()
            assert paths_err <= 2 * bound, f"WY against path verify {paths_err:.2e}"
    elif what == "bits":  # each node = decode steps along its path, bit for bit
        verified = gdn_path(state, q, k, v, decay, beta, nodes)
        for j in range(n):
            path = ref.path_of(parents, j)
            s = state.clone()
            for m in path[:-1]:  # decode steps (outputs unused) up to the node's parent
                assert gdn_path(s, q, k, v, decay, beta, one([m]), out=False, store=True) is None
            pick = slice(j, j + 1)
            stepped = gdn_path(s, q[:, pick], k[:, pick], v[:, pick], decay[:, pick],
                               beta[:, pick], one([0]), store=True)  # the node's own step
            assert torch.equal(stepped[:, 0], verified[:, j]), f"node {j} output bits"
            committed = torch.empty_like(state)
            gdn_path(state, q, k, v, decay, beta, one(path), out=False, store=True,
                     new_state=committed)
            assert torch.equal(committed, s), f"node {j}: commit and decode steps differ"
    elif what == "walk-bits":  # the walk's nodes = its own decode steps, its commit = them
        verified = gdn_walk(state, q, k, v, decay, beta, nodes)
        for j in range(n):
            path = ref.path_of(parents, j)
            s = state.clone()
            for m in path[:-1]:  # a decode step: one node, its own inputs
                at = slice(m, m + 1)
                assert gdn_walk(s, q[:, at], k[:, at], v[:, at], decay[:, at], beta[:, at],
                                one([0]), out=False, commit=True) is None
            pick = slice(j, j + 1)
            stepped = gdn_walk(s, q[:, pick], k[:, pick], v[:, pick], decay[:, pick],
                               beta[:, pick], one([0]), commit=True)
            assert torch.equal(stepped[:, 0], verified[:, j]), f"node {j} output bits"
            committed = state.clone()
            # the accepted path: the tree's own rows for its nodes, padding elsewhere
            rows = torch.full((b, n, n), -1, dtype=torch.int32)
            for i, m in enumerate(path):
                rows[:, m, :i + 1] = torch.tensor(path[:i + 1], dtype=torch.int32)
            gdn_walk(committed, q, k, v, decay, beta, rows.to(device), out=False, commit=True)
            assert torch.equal(committed, s), f"node {j}: walk commit and decode steps differ"
    else:  # commit of every node's path: the state the reference's commit gives
        per_head = lambda x: x.double().transpose(1, 2)  # noqa: E731
        for j in range(n):
            new = torch.empty_like(state)
            gdn_path(state, q, k, v, decay, beta, one(ref.path_of(parents, j)), out=False,
                     store=True, new_state=new)
            want = ref.commit(cpu[0].double(), per_head(cpu[2]), per_head(cpu[3]),
                              per_head(cpu[4]).log(), per_head(cpu[5]), parents, j)
            err = (new.cpu().double() - want).abs().max().item()
            assert err < 1e-5, f"node {j}: state error {err:.2e}"


def main() -> None:
    from interp_harness import report

    report({cid: (lambda c=c: check(*c)) for cid, c in CASES.items()})


if __name__ == "__main__":
    main()
