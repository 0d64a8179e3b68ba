"""Hybrid targets on the CPU: the GDN layer against the float64 reference, plain decoding, and
speculative decoding (chains and trees: path verify, then commit) equal to plain decoding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_speculative import assert_drafters_equal_plain

from engine.attention import AttentionPlan
from engine.gated_delta import GDN_KERNELS, PATH_VERIFY_DEPTH, walks
from engine.generate import Engine, generate
from engine.model import Step
from engine.sampling import Sampling
from engine.speculative import make_drafter
from engine.weights import load_model
from w12.errors import W12Error
from w12_kernels.gated_delta import reference as ref

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 4], [100, 20, 30, 40, 50]]


@pytest.fixture(scope="module")
def hybrid():
    return {mode: load_model("synthetic:tiny-hybrid", mode=mode, device="cpu").model
            for mode in ("bf16", "w12")}


def layer_reference(layer, x):
    """The GDN layer over a fresh state in float64 (conv1d, the reference recurrence)."""
    hk, hv, dk, dv = layer.args.gdn_shape
    c = layer.channels
    dense = lambda linear: (linear.weight if linear.weight is not None  # noqa: E731
                            else None).double()
    qkvz = x.double() @ dense(layer.wqkvz).T
    mixed, z = qkvz[..., :c], qkvz[..., c:]
    b_pre, a_pre = (x.double() @ dense(layer.wba).T).split(hv, dim=-1)
    t = x.shape[1]
    conv = F.conv1d(F.pad(mixed.transpose(1, 2), (layer.conv.shape[1] - 1, 0)),
                    layer.conv.double()[:, None], groups=c).transpose(1, 2)
    q, k, v = F.silu(conv).split([hk * dk, hk * dk, hv * dv], dim=-1)
    q = F.normalize(q.view(1, t, hk, dk), dim=-1).repeat_interleave(hv // hk, 2) * dk**-0.5
    k = F.normalize(k.view(1, t, hk, dk), dim=-1).repeat_interleave(hv // hk, 2)
    v = v.view(1, t, hv, dv)
    beta = torch.sigmoid(b_pre)
    g = -torch.exp(layer.a_log.double()) * F.softplus(a_pre + layer.dt_bias.double())
    heads = lambda y: y[0].transpose(0, 1)  # noqa: E731  [H, T, d]
    o, _ = ref.sequential(torch.zeros(hv, dk, dv, dtype=torch.float64), heads(q), heads(k),
                          heads(v), g[0].T, beta[0].T)
    o = o.transpose(0, 1)[None]  # [1, T, H, dv]
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + layer.args.norm_eps)
    o = o * layer.norm.double() * F.silu(z.view(1, t, hv, dv))
    return o.reshape(1, t, hv * dv) @ dense(layer.wo).T


def test_gdn_layer_matches_the_float64_reference(hybrid):
    model = hybrid["bf16"]
    layer = model.layers[0].attn
    x = torch.randn(1, 20, model.args.dim, generator=torch.Generator().manual_seed(0))
    x = x.to(torch.bfloat16)
    cache = model.new_cache(1, 32)
    pos = torch.arange(20)[None]
    cos, sin = model.rope_tables(32)
    step = Step(cache, AttentionPlan.prefill(pos), cos[pos].unsqueeze(2), sin[pos].unsqueeze(2),
                model.ops, model.attention)
    got = layer(x, step).double()
    want = layer_reference(layer, x)
    assert ((got - want).norm() / want.norm()).item() < 2e-2


def test_decode_steps_continue_a_prefill(hybrid):
    model = hybrid["bf16"]
    tokens = torch.tensor([[9, 8, 7, 6, 5, 4, 3, 2, 1, 11]])
    whole = model.score(tokens)[0, -1]
    engine = Engine(model, batch=1, max_seq_len=16)
    engine.prefill([tokens[0, :6].tolist()])
    for token in tokens[0, 6:].tolist():
        stepped = engine.step(torch.tensor([token]))[0]
    assert ((stepped - whole).norm() / whole.norm()).item() < 2e-2
    assert stepped.argmax() == whole.argmax()


def test_padding_in_a_batched_prefill_leaves_the_state_alone(hybrid):
    model = hybrid["w12"]
    alone = Engine(model, batch=1, max_seq_len=32)
    alone.prefill([PROMPTS[1]])
    together = Engine(model, batch=3, max_seq_len=32)
    together.prefill(PROMPTS)
    a, b = alone.cache.recurrent, together.cache.recurrent
    assert ((a.state[:, 0] - b.state[:, 1]).abs().max() < 1e-3)
    assert torch.equal(a.tail[:, 0], b.tail[:, 1])


SAMPLED = Sampling(temperature=0.9, top_p=0.9, seed=3)


@pytest.mark.parametrize("mode", ["bf16", "w12"])
@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_speculative_equals_plain_decoding_on_a_hybrid(hybrid, mode, sampling):
    assert_drafters_equal_plain(hybrid[mode], sampling, ("ngram",))


def test_commit_replays_only_the_accepted_path(hybrid):
    """After a verify of a tree whose accepted path is known, every GDN layer's state equals
    plain decode steps over those tokens (bit for bit: the same operations)."""
    model = hybrid["w12"]
    prompt, drafted = [5, 6, 7, 8], [40, 41, 42]
    plain = Engine(model, batch=1, max_seq_len=32)
    plain.prefill([prompt])
    for token in [9] + drafted[:2]:  # root 9, then two accepted drafts
        plain.step(torch.tensor([token]))
    spec = Engine(model, batch=1, max_seq_len=32)
    spec.prefill([prompt])
    from engine.speculative.tree import DraftTree
    from engine.speculative.verify import accept, target_logits

    # root -> 40 -> 41 -> 42 and root -> 77 (a decoy sibling)
    tree = DraftTree(torch.tensor([[9, 40, 77, 41, 42]]), torch.tensor([[-1, 0, 0, 1, 3]]),
                     torch.tensor([[0, 1, 1, 2, 3]]), torch.ones(1, 5, dtype=torch.bool))
    paths = tree.paths()
    target_logits(model, spec.cache, tree, paths, Sampling(), torch.tensor([0]))
    picks = torch.tensor([[40, 41, 0, 99, 0]])  # accept 40, 41; 42 refused
    verdict = accept(tree, picks, paths)
    assert verdict.accepted.tolist() == [2]
    lengths = spec.cache.lengths
    spec.cache.keep(torch.where(verdict.path >= 0, verdict.path + lengths[:, None], -1),
                    verdict.accepted + 1)
    assert torch.equal(spec.cache.recurrent.state, plain.cache.recurrent.state)
    assert torch.equal(spec.cache.recurrent.tail, plain.cache.recurrent.tail)


def test_early_exit_is_refused_on_a_hybrid(hybrid):
    with pytest.raises(W12Error, match="GDN"):
        make_drafter("early-exit:1", hybrid["bf16"])


def test_hybrid_presets_describe_their_layers():
    from engine.model import ModelArgs

    args = ModelArgs.from_name("hybrid-27b")
    assert (args.n_layers, len(args.gdn_layers), len(args.attention_layers), args.dim) == \
        (64, 48, 16, 5120)
    bad = dict(__import__("engine.presets", fromlist=["x"]).preset_config("tiny-hybrid"))
    bad["layer_types"] = ["linear_attention"] * 3
    with pytest.raises(W12Error, match="layer_types"):
        ModelArgs.from_hf_config(bad)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kernel", [k for k in GDN_KERNELS if k != "wy"])
@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_speculative_equals_plain_decoding_on_a_hybrid_on_gpu(kernel, sampling):
    """The GPU path: the path kernel for decode and commit, each verify kernel with decode's
    bits; CUDA graphs both sides."""
    model = load_model("synthetic:tiny-hybrid", mode="w12", device="cuda").model
    model.gdn = kernel
    assert_drafters_equal_plain(model, sampling, ())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_wy_verify_is_close_to_the_walk_and_commits_the_same_state():
    """WY verify of a tree on the GPU: logits within float32 error's reach of the walk's (not
    their bits), and the commit that follows (a replay of the kept inputs) leaves every GDN
    layer's state as the walk's verify does."""
    from engine.speculative.tree import DraftTree
    from engine.speculative.verify import target_logits

    model = load_model("synthetic:tiny-hybrid", mode="w12", device="cuda").model
    cuda = lambda rows, **kw: torch.tensor(rows, device="cuda", **kw)  # noqa: E731
    tree = DraftTree(cuda([[9, 40, 77, 41, 42, 43, 78]]), cuda([[-1, 0, 0, 1, 3, 4, 2]]),
                     cuda([[0, 1, 1, 2, 3, 4, 2]]), cuda([[True] * 7]))
    paths = tree.paths()
    out = {}
    for kernel in ("walk", "wy"):
        model.gdn = kernel
        engine = Engine(model, batch=1, max_seq_len=32)
        engine.prefill([PROMPTS[0]])
        logits, _ = target_logits(model, engine.cache, tree, paths, Sampling(),
                                  cuda([0]))
        lengths = engine.cache.lengths
        path = cuda([[0, 1, 3, 4, -1, -1, -1]])  # root, 40, 41, 42 accepted
        engine.cache.keep(torch.where(path >= 0, path + lengths[:, None], -1), cuda([4]))
        out[kernel] = (logits.float(), engine.cache.recurrent.state.clone())
    model.gdn = "auto"
    walk, wy = out["walk"], out["wy"]
    assert ((wy[0] - walk[0]).norm() / walk[0].norm()).item() < 1e-2
    assert torch.equal(wy[1], walk[1])


def test_gdn_verify_kernel_choice():
    """``auto`` replays paths while no path is longer than ``PATH_VERIFY_DEPTH`` nodes (the
    tree's bound where known, else its node count) and walks beyond; the two forced choices
    hold at every size; an unknown name is refused."""
    assert not walks("auto", PATH_VERIFY_DEPTH) and walks("auto", PATH_VERIFY_DEPTH + 1)
    assert not walks("auto", 64, levels=8)  # a shallow 64-node tree
    assert walks("auto", 64, levels=PATH_VERIFY_DEPTH + 1) and walks("auto", 64, levels=None)
    assert all(walks("walk", n) and not walks("path", n) for n in (2, 128))
    with pytest.raises(W12Error, match="GDN kernel 'chunked'"):
        walks("chunked", 4)


def test_continuous_batching_on_a_hybrid(hybrid):
    """Requests joining a running batch of a hybrid: each prompt prefilled alone into its row
    (the row's recurrent state through a row view), each request's tokens its own plain
    decoding's, plain and speculative."""
    from engine.serving import Server

    model = hybrid["w12"]
    requests = [(PROMPTS[0], 12, 0), (PROMPTS[1], 5, 0), (PROMPTS[2], 9, 0), ([7, 7, 7, 8], 8, 2)]
    for drafter in (None, "ngram"):
        server = Server(Engine(model, batch=2, max_seq_len=48), budget=5 if drafter else 1,
                        tree=False, drafter=make_drafter(drafter, model) if drafter else None)
        ids = [server.submit(p, max_new_tokens=n, arrival=a) for p, n, a in requests]
        out, stats = server.run()
        for request_id, (prompt, new, _) in zip(ids, requests, strict=True):
            alone = generate(Engine(model, batch=1, max_seq_len=48), [prompt],
                             max_new_tokens=new, request_ids=[request_id])[0]
            assert out[request_id] == alone, (drafter, request_id)
        assert max(stats.admitted_at.values()) > 0  # someone joined a running batch
