"""Speculative decoding on the engine: trees, acceptance, cache compaction, and outputs equal to
plain decoding's (greedy and keyed sampling) with every drafter, chain and tree, on the CPU."""

from __future__ import annotations

import pytest
import torch

from engine.cache import KVCache
from engine.generate import Engine, generate
from engine.sampling import Sampling
from engine.speculative import Drafter, DraftTree, best_first, make_drafter, speculative_generate
from engine.speculative import verify as verify_module
from engine.speculative.drafters import _graft
from engine.speculative.tree import best_first_reference
from engine.speculative.verify import accept
from engine.weights import load_model
from w12.errors import W12Error

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 4], [100, 20, 30, 40, 50]]
SAMPLED = Sampling(temperature=0.9, top_p=0.9, seed=11)


def hand_tree() -> DraftTree:
    """root(0) -> a(1) -> c(3) -> d(4);  root -> b(2)."""
    tokens = torch.tensor([[10, 11, 12, 13, 14]])
    parents = torch.tensor([[-1, 0, 0, 1, 3]])
    depth = torch.tensor([[0, 1, 1, 2, 3]])
    return DraftTree(tokens, parents, depth, torch.ones(1, 5, dtype=torch.bool))


def test_a_chain_bounds_its_paths_by_its_length():
    chain = DraftTree.chain(torch.tensor([1, 2]), torch.zeros(2, 6, dtype=torch.long))
    assert chain.levels == 7 and int((chain.paths() >= 0).sum(-1).max()) == 7
    assert hand_tree().levels is None  # built by hand: no bound known


def test_paths_and_ancestor_mask():
    tree = hand_tree()
    assert tree.paths()[0].tolist() == [[0, -1, -1, -1, -1], [0, 1, -1, -1, -1],
                                        [0, 2, -1, -1, -1], [0, 1, 3, -1, -1],
                                        [0, 1, 3, 4, -1]]
    assert tree.ancestor_mask()[0, 4].tolist() == [True, True, False, True, True]


@pytest.mark.parametrize("seed", range(40))
def test_best_first_is_the_heap_search(seed):
    gen = torch.Generator().manual_seed(seed)
    depth, k = int(torch.randint(1, 6, (1,), generator=gen)), int(torch.randint(1, 5, (1,),
                                                                                 generator=gen))
    budget = int(torch.randint(1, 40, (1,), generator=gen))
    logp = (torch.randn(2, depth, 60, generator=gen) * 3).log_softmax(-1)
    top_logp, top_tokens = logp.topk(k, dim=-1)
    tree = best_first(torch.tensor([1, 2]), top_tokens, top_logp, budget)
    assert tree.size == budget
    assert (tree.parents[:, 1:] < torch.arange(1, budget)).all()
    paths = tree.paths()
    for row in range(2):
        got = [tuple(tree.tokens[row, i].item() for i in paths[row, n].tolist() if i >= 0)[1:]
               for n in range(1, budget) if tree.valid[row, n]]
        want = best_first_reference(top_tokens[row].tolist(), top_logp[row].tolist(), budget)
        assert sorted(got) == sorted(want)
    # the host bound on a path's nodes holds, and is no looser than the drafter's depth
    assert int(tree.depth.max()) + 1 <= tree.levels <= depth + 1
    assert int((paths >= 0).sum(-1).max()) <= tree.levels


def test_graft_puts_the_lookup_chain_first_then_the_best_nodes_once():
    # tree: root -> 7 (-0.1) -> 8 (-0.3) ; root -> 9 (-0.2) ; 7 -> 5 (-2.0); one padding node
    tokens = torch.tensor([1, 7, 9, 8, 5, 0])
    parents = torch.tensor([-1, 0, 0, 1, 1, 0])
    depth = torch.tensor([0, 1, 1, 2, 2, 1])
    valid = torch.tensor([True, True, True, True, True, False])
    scores = torch.tensor([0.0, -0.1, -0.2, -0.3, -2.0, 0.0])
    # the lookup's chain 7 -> 4 shares node 7; then 9 (-0.2), 8 (-0.3), 5 (-2.0) by score
    assert _graft([7, 4], tokens, parents, valid, depth, scores, 9) == [
        (7, 0), (4, 1), (9, 0), (8, 1), (5, 1)]
    # the budget cuts the worst nodes
    assert _graft([3, 4], tokens, parents, valid, depth, scores, 5) == [
        (3, 0), (4, 1), (7, 0), (9, 0)]
    assert _graft([], tokens, parents, valid, depth, None, 3) == [(7, 0), (9, 0)]


def test_graft_onto_a_host_drafter_is_refused(tiny_folder):
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    with pytest.raises(W12Error, match="grafts onto a device drafter"):
        make_drafter("ngram+ngram", model)
    assert make_drafter("early-exit:1+ngram", model).name == "early-exit:1+ngram"


def test_accept_follows_the_matching_child():
    tree = hand_tree()
    paths = tree.paths()
    # target picks: at root 11 (node a), at a 13 (node c), at c 99 (no child 14): bonus 99
    picks = torch.tensor([[11, 13, 0, 99, 0]])
    verdict = accept(tree, picks, paths)
    assert verdict.accepted.tolist() == [2]
    assert verdict.path[0].tolist() == [0, 1, 3, -1, -1]
    assert verdict.emitted[0].tolist() == [11, 13, 99, -1, -1]
    # nothing matches: the root's pick alone
    none = accept(tree, torch.tensor([[50, 0, 0, 0, 0]]), paths)
    assert none.accepted.tolist() == [0] and none.emitted[0].tolist() == [50, -1, -1, -1, -1]
    # a padding node is never accepted, whatever its token
    padded = DraftTree(tree.tokens, tree.parents, tree.depth,
                       torch.tensor([[True, False, True, True, True]]))
    assert accept(padded, picks, paths).accepted.tolist() == [0]


def test_keep_moves_overlapping_paths_in_every_layer():
    cache = KVCache(3, 2, 2, 16, 16, dtype=torch.float32, device=torch.device("cpu"))
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    before_k, before_v = cache.k.clone(), cache.v.clone()
    cache.rollback([4, 7])
    src = torch.tensor([[4, 6, 7, -1], [7, 9, -1, -1]])  # request 0 moves 6->5 and 7->6
    cache.keep(src, torch.tensor([3, 1]))
    for side, before in ((cache.k, before_k), (cache.v, before_v)):
        assert torch.equal(side[:, 0, :, 4:7], before[:, 0, :, [4, 6, 7]])
        assert torch.equal(side[:, 1], before[:, 1])  # count 1: the root stays where it is
        assert torch.equal(side[:, 0, :, :4], before[:, 0, :, :4])
        assert torch.equal(side[:, 0, :, 7:], before[:, 0, :, 7:])
    assert cache.lengths.tolist() == [4, 7]


class OracleDrafter(Drafter):
    """Proposes the known continuation (a chain), or in tree mode the continuation with a decoy
    sibling at every level: acceptance runs deep, so the walk and the compaction are used."""

    def __init__(self, answers: list[list[int]], vocab: int) -> None:
        self.answers, self.vocab = answers, vocab
        self.done = [0] * len(answers)

    def start(self, prompts, first):
        self.done = [1] * len(prompts)

    def observe(self, committed):
        self.done = [d + len(c) for d, c in zip(self.done, committed, strict=True)]

    def propose(self, roots, cache, budget, tree):
        rows = []
        for row, answer in enumerate(self.answers):
            future = answer[self.done[row]:]
            nodes, parent = [], 0
            for token in future:
                if len(nodes) + (2 if tree else 1) > budget - 1:
                    break
                if tree:
                    nodes.append(((token + 1) % self.vocab, parent))
                nodes.append((token, parent))
                parent = len(nodes)
            rows.append(nodes)
        from engine.speculative.drafters import _tree_from_rows

        return _tree_from_rows(roots, rows, budget)


# float32 through the torch attention path; W12 and bfloat16 through the tree-attention kernels'
# CPU path (the engine's default for bfloat16)
MODELS = {"llama-f32": ("llama", "bf16", torch.float32),
          "qwen3-f32": ("qwen3", "bf16", torch.float32),
          "qwen3-w12": ("qwen3", "w12", torch.bfloat16),
          "llama-bf16": ("llama", "bf16", torch.bfloat16)}


@pytest.mark.parametrize("model_id", list(MODELS))
@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_speculative_equals_plain_decoding(tiny_folder, model_id, sampling):
    kind, mode, dtype = MODELS[model_id]
    model = load_model(tiny_folder(kind), mode=mode, dtype=dtype).model
    assert_drafters_equal_plain(model, sampling, ("ngram", "early-exit:1", "early-exit:1+ngram"))


def assert_drafters_equal_plain(model, sampling, names) -> None:
    """With each named drafter and the oracle, chain, tree and budget 1, speculative decoding
    of PROMPTS returns plain decoding's tokens; the oracle accepts deep."""
    plain = generate(Engine(model, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=24,
                     sampling=sampling)
    drafters = {name: (lambda name=name: make_drafter(name, model)) for name in names}
    drafters["oracle"] = lambda: OracleDrafter(plain, model.args.vocab_size)
    for name, drafter in drafters.items():
        for tree, budget in ((False, 5), (True, 9), (True, 1)):
            engine = Engine(model, batch=3, max_seq_len=96)
            out, stats = speculative_generate(engine, drafter(), PROMPTS, max_new_tokens=24,
                                              budget=budget, tree=tree, sampling=sampling)
            assert out == plain, (name, tree, budget)
            if name == "oracle" and budget > 1:
                assert stats.tau > 2.5, (tree, stats.tau)


def test_stop_ids_cut_rows_as_plain_decoding_does(tiny_folder):
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    free = generate(Engine(model, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=20)
    stop = frozenset({free[0][5], free[2][2]})
    plain = generate(Engine(model, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=20,
                     stop_ids=stop)
    spec, _ = speculative_generate(Engine(model, batch=3, max_seq_len=96),
                                   OracleDrafter(free, 160), PROMPTS, max_new_tokens=20,
                                   budget=6, tree=False, stop_ids=stop)
    assert spec == plain and len(spec[0]) == 6


def test_a_finished_row_never_writes_past_the_cache(tiny_folder):
    """Row 0 (the longest prompt) finishes in a step that accepts past ``max_new_tokens``
    while the others go on accepting nothing; in the smallest cache the length check allows,
    its later steps must not write past the last slot (nor corrupt the other rows)."""
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    vocab, new, budget = model.args.vocab_size, 21, 6
    seq = max(map(len, PROMPTS)) + new + budget
    plain = generate(Engine(model, batch=3, max_seq_len=seq), PROMPTS, max_new_tokens=new)
    longer = generate(Engine(model, batch=3, max_seq_len=seq + budget), PROMPTS,
                      max_new_tokens=new + budget)  # row 0's drafts run past max_new_tokens
    answers = [longer[0]] + [[(t + 1) % vocab for t in row] for row in plain[1:]]
    spec, stats = speculative_generate(Engine(model, batch=3, max_seq_len=seq),
                                       OracleDrafter(answers, vocab), PROMPTS,
                                       max_new_tokens=new, budget=budget, tree=False)
    assert spec == plain
    assert stats.committed[:3] == [budget, 1, 1]  # row 0 accepts all, the others nothing


def test_a_verify_that_keys_noise_wrongly_is_caught(tiny_folder, monkeypatch):
    """The equality above can fail: picks keyed by the wrong position change sampled text."""
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    plain = generate(Engine(model, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=24,
                     sampling=SAMPLED)
    real = verify_module.choose
    monkeypatch.setattr(verify_module, "choose",
                        lambda logits, s, req, pos: real(logits, s, req, pos + 1))
    spec, _ = speculative_generate(Engine(model, batch=3, max_seq_len=96),
                                   make_drafter("ngram", model), PROMPTS, max_new_tokens=24,
                                   budget=4, tree=False, sampling=SAMPLED)
    assert spec != plain


def test_bad_drafter_and_budget_are_refused(tiny_folder):
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    with pytest.raises(W12Error, match="unknown drafter"):
        make_drafter("medusa", model)
    with pytest.raises(W12Error, match="K must be 1..1"):
        make_drafter("early-exit:2", model)
    with pytest.raises(W12Error, match="must be at least 1"):
        speculative_generate(Engine(model, batch=1, max_seq_len=64), make_drafter("ngram", model),
                             [[1, 2]], max_new_tokens=4, budget=0)


def test_cli_spec_check_on_the_demo_model(demo_bf16, tmp_path):
    """``w12 spec check`` on real weights and HumanEval-style prompts: exit 0, one OK line; a
    prompt file with a bad line is one error line, exit 2."""
    from click.testing import CliRunner

    from w12_cli.spec import spec_group

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "def add(a, b):\\n    \\"\\"\\"Add two numbers.\\"\\"\\"\\n"}\n'
                       '{"prompt": "Write a haiku about the sea."}\n')
    runner = CliRunner()
    for flags in (["--drafter", "ngram", "--chain", "--budget", "8"],
                  ["--drafter", "early-exit:4", "--budget", "16", "--temperature", "0.7",
                   "--top-p", "0.95"]):
        result = runner.invoke(spec_group, ["check", str(demo_bf16), "--prompts", str(prompts),
                                            "--max-new-tokens", "24", "--device", "cpu",
                                            "--quiet", *flags])
        assert result.exit_code == 0, result.output
        assert result.output.startswith("OK: speculative decoding equals plain decoding on 2 "
                                        "prompts"), result.output
    prompts.write_text('{"prompt": "fine"}\nnot json\n')
    result = runner.invoke(spec_group, ["check", str(demo_bf16), "--prompts", str(prompts),
                                        "--drafter", "ngram", "--device", "cpu"])
    assert result.exit_code == 2
    assert "prompts.jsonl:2: not JSON" in result.output and result.output.count("\n") == 1


def test_a_shared_budget_keeps_the_best_nodes_across_requests():
    """Two requests' best-first trees of 5 nodes, 6 nodes shared: both roots, then the four
    best drafted nodes of either, closed under parents; an inactive row keeps its root only."""
    from engine.speculative.tree import share_budget

    gen = torch.Generator().manual_seed(3)
    top_logp = torch.randn(2, 4, 3, generator=gen).sort(dim=-1, descending=True).values
    top_logp = top_logp.log_softmax(-1)
    top_logp[0] += 1.5  # request 0 is predicted more confidently: it should get more nodes
    top_logp[0] = top_logp[0].clamp(max=-1e-3)
    tokens = torch.arange(24).view(2, 4, 3)
    tree = best_first(torch.tensor([100, 200]), tokens, top_logp, 5)
    shared = share_budget(tree, 6)
    assert shared.valid.sum() == 6 and shared.valid[:, 0].all()
    kept = shared.valid & (shared.parents >= 0)
    best = torch.where(tree.parents >= 0, tree.scores - 1e-6 * tree.depth, float("-inf"))
    assert set(best.flatten().topk(4).indices.tolist()) == set(kept.flatten().nonzero()[:, 0]
                                                             .tolist())
    assert kept[0].sum() > kept[1].sum()
    parents_kept = shared.valid.gather(1, shared.parents.clamp(min=0))
    assert (parents_kept | ~shared.valid).all()  # every kept node's parent is kept
    alone = share_budget(tree, 6, active=torch.tensor([True, False]))
    assert alone.valid[1].tolist() == [True, False, False, False, False]
    with pytest.raises(ValueError, match="no"):
        share_budget(DraftTree.chain(torch.tensor([1]), torch.tensor([[2, 3]])), 2)


def test_the_random_drafter_fills_every_budget_and_stays_exact(tiny_folder):
    """``random`` (timing with forced acceptance): every node of its chains and trees is a
    real draft, its trees are best-first trees, its proposals differ from step to step, and
    speculative decoding with it still returns plain decoding's tokens."""
    model = load_model(tiny_folder("qwen3"), mode="w12").model
    drafter = make_drafter("random", model)
    roots = torch.tensor([5, 9, 100])
    for tree, budget in ((False, 6), (True, 9), (True, 2)):
        first = drafter.propose(roots, None, budget, tree)
        second = drafter.propose(roots, None, budget, tree)
        assert first.tokens.shape == (3, budget) and bool(first.valid.all())
        assert int(first.tokens.max()) < model.args.vocab_size
        assert not torch.equal(first.tokens, second.tokens)
        if tree and budget > 2:
            assert int(first.depth.max()) < budget - 1  # branches, not a chain
    plain = generate(Engine(model, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=16)
    out, _ = speculative_generate(Engine(model, batch=3, max_seq_len=96),
                                  make_drafter("random", model), PROMPTS, max_new_tokens=16,
                                  budget=9, tree=True)
    assert out == plain
