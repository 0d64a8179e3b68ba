"""The gated delta rule's references against each other: paths, snapshots, the WY form of a
tree, commit, the three-piece split and the tree convolution."""

from __future__ import annotations

import pytest
import torch

from w12_kernels.gated_delta import reference as ref


def inputs(n: int, heads: int = 3, dk: int = 8, dv: int = 6, seed: int = 0,
           dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    q = torch.nn.functional.normalize(rand(heads, n, dk), dim=-1) * dk**-0.5
    k = torch.nn.functional.normalize(rand(heads, n, dk), dim=-1)
    v = rand(heads, n, dv)
    g = -torch.rand(heads, n, generator=gen, dtype=torch.float64) * 0.5  # log gates <= 0
    beta = torch.rand(heads, n, generator=gen, dtype=torch.float64)
    state = rand(heads, dk, dv)
    return [x.to(dtype) for x in (state, q, k, v, g, beta)]


def random_tree(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return [-1] + [int(torch.randint(0, j, (1,), generator=gen)) for j in range(1, n)]


TREES = {
    "chain": [-1, 0, 1, 2, 3, 4, 5],
    "star": [-1, 0, 0, 0, 0],
    "forest": [-1, -1, 0, 1, 2, 2],
    "random-24": random_tree(24, 1),
    "random-128": random_tree(128, 2),
}


def test_step_matches_the_written_recurrence():
    state, q, k, v, g, beta = inputs(1)
    o, new = ref.step(state, q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0])
    for h in range(state.shape[0]):
        s = state[h] * torch.exp(g[h, 0])
        u = beta[h, 0] * (v[h, 0] - s.T @ k[h, 0])
        s = s + torch.outer(k[h, 0], u)
        assert torch.allclose(new[h], s, rtol=0, atol=1e-14)
        assert torch.allclose(o[h], s.T @ q[h, 0], rtol=0, atol=1e-14)


@pytest.mark.parametrize("tree", TREES)
def test_path_snapshot_and_wy_verify_agree(tree):
    parents = TREES[tree]
    state, q, k, v, g, beta = inputs(len(parents), seed=len(parents))
    path = ref.path_verify(state, q, k, v, g, beta, parents)
    snap, _ = ref.snapshot_verify(state, q, k, v, g, beta, parents)
    wy = ref.wy_verify(state, q, k, v, g, beta, parents)
    assert torch.allclose(path, snap, rtol=0, atol=1e-12)
    assert torch.allclose(path, wy, rtol=0, atol=1e-10)


def test_a_chain_is_the_sequential_recurrence():
    parents = TREES["chain"]
    state, q, k, v, g, beta = inputs(len(parents))
    seq, final = ref.sequential(state, q, k, v, g, beta)
    assert torch.allclose(ref.path_verify(state, q, k, v, g, beta, parents), seq, atol=1e-13)
    assert torch.allclose(ref.commit(state, k, v, g, beta, parents, len(parents) - 1), final,
                          atol=1e-13)


@pytest.mark.parametrize("tree", ["star", "forest", "random-24"])
def test_commit_equals_the_accepted_tokens_through_the_decode_step(tree):
    parents = TREES[tree]
    state, q, k, v, g, beta = inputs(len(parents), seed=7)
    _, snaps = ref.snapshot_verify(state, q, k, v, g, beta, parents)
    for node in range(len(parents)):
        path = ref.path_of(parents, node)
        _, stepped = ref.sequential(state, q[:, path], k[:, path], v[:, path], g[:, path],
                                    beta[:, path])
        committed = ref.commit(state, k, v, g, beta, parents, node)
        assert torch.allclose(committed, stepped, rtol=0, atol=1e-13)
        assert torch.allclose(committed, snaps[:, node], rtol=0, atol=1e-13)
        assert torch.allclose(ref.wy_state(state, k, v, g, beta, parents, node), stepped,
                              rtol=0, atol=1e-10)


def test_a_node_does_not_see_its_siblings():
    parents = TREES["star"]
    state, q, k, v, g, beta = inputs(len(parents))
    base = ref.wy_verify(state, q, k, v, g, beta, parents)
    v2 = v.clone()
    v2[:, 2] += 5.0  # node 2's value: only node 2 (a leaf under the root) may move
    moved = ref.wy_verify(state, q, k, v2, g, beta, parents)
    changed = (moved - base).abs().amax(dim=(0, 2)) > 1e-12
    assert changed.tolist() == [False, False, True, False, False]


def test_fp32_recurrence_error_is_small_and_measurable():
    state, q, k, v, g, beta = inputs(128, heads=4, dk=64, dv=64, seed=3)
    err = ref.fp32_error(state, q, k, v, g, beta)
    assert 0 < err < 1e-4  # float32 rounding is visible and bounded on unit-scale inputs


def test_split3_is_exact_and_two_pieces_are_not():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 3.0
    hi, mid, lo = ref.split3(x)
    assert all(p.dtype == torch.bfloat16 for p in (hi, mid, lo))
    assert torch.equal(hi.float() + mid.float() + lo.float(), x)
    assert not torch.equal(hi.float() + mid.float(), x)
    with pytest.raises(ValueError, match="float32"):
        ref.split3(x.double())


def test_tree_conv_is_the_causal_conv_along_each_path():
    parents = TREES["random-24"]
    gen = torch.Generator().manual_seed(5)
    channels, width = 5, 4
    tail = torch.randn(channels, width - 1, generator=gen, dtype=torch.float64)
    x = torch.randn(len(parents), channels, generator=gen, dtype=torch.float64)
    weight = torch.randn(channels, width, generator=gen, dtype=torch.float64)
    out = ref.tree_conv(tail, x, weight, parents)
    for node in (0, 5, 23):
        seq = torch.cat((tail, x[ref.path_of(parents, node)].T), dim=1)  # [C, W-1+depth]
        causal = torch.nn.functional.conv1d(seq[None], weight[:, None], groups=channels)
        assert torch.allclose(out[node], causal[0, :, -1], atol=1e-13)
        assert torch.equal(ref.conv_commit(tail, x, parents, node), seq[:, -(width - 1):])


def test_bad_parents_are_refused():
    with pytest.raises(ValueError, match="parent must come before"):
        ref.check_parents([-1, 2, 0])


def test_verify_state_bytes_of_a_64_node_tree():
    snap = ref.verify_state_bytes(64, 32, 128, 128, "snapshot")
    assert ref.verify_state_bytes(64, 32, 128, 128, "path") * 8 <= snap
    assert ref.verify_state_bytes(64, 32, 128, 128, "wy") * 8 <= snap
