"""Speculative decoding on a GPU: every node of a verified tree has the logits plain decoding
computes at its position, bit for bit (W12 weights, tree attention, row norms), for trees of
1-128 nodes; and the CUDA-graphed runner emits plain decoding's tokens."""

from __future__ import annotations

import pytest
import torch

from engine.attention import AttentionPlan
from engine.generate import Engine, generate
from engine.sampling import Sampling
from engine.speculative import DraftTree, make_drafter, speculative_generate
from engine.weights import load_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PRESET = "synthetic:smollm2-135m"


@pytest.fixture(scope="module")
def model():
    return load_model(PRESET, mode="w12", device="cuda").model


def random_tree(n: int, vocab: int, root: int, gen: torch.Generator) -> DraftTree:
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    tokens = torch.randint(0, vocab, (1, n), generator=gen)
    tokens[0, 0] = root
    as_row = lambda v: torch.tensor([v], device="cuda")  # noqa: E731
    return DraftTree(tokens.cuda(), as_row(parents), as_row(depth),
                     torch.ones(1, n, dtype=torch.bool, device="cuda"))


@pytest.mark.parametrize("n", [1, 2, 7, 16, 33, 64, 128])
def test_every_node_has_plain_decodings_logits(model, n):
    gen = torch.Generator().manual_seed(n)
    vocab = model.args.vocab_size
    prompt = torch.randint(0, vocab, (1, 45), generator=gen).tolist()
    engine = Engine(model, batch=1, max_seq_len=64 + n + 2)
    root = int(engine.prefill(prompt).argmax(-1))
    tree = random_tree(n, vocab, root, gen)
    lengths = engine.cache.lengths.clone()
    with torch.inference_mode():
        tree_logits = model(tree.tokens, lengths[:, None] + tree.depth, engine.cache,
                            AttentionPlan.tree(lengths, tree.paths()))[0]
    paths = tree.paths()[0].tolist()
    checked = range(n) if n <= 33 else sorted(set(torch.randint(0, n, (24,), generator=gen)
                                                  .tolist()) | {n - 1})
    for node in checked:
        path = [i for i in paths[node] if i >= 0]
        engine.prefill(prompt)
        for i in path:
            logits = engine.step(tree.tokens[0, i:i + 1])
        assert torch.equal(logits[0].view(torch.int32), tree_logits[node].view(torch.int32)), node


@pytest.mark.parametrize("n", [1, 8, 16])
def test_every_node_has_plain_decodings_logits_with_eight_requests(model, n):
    """Eight requests of different lengths: a chain of n nodes per request after a few plain
    steps; node i of each row has the logits of the plain decode step at its position."""
    gen = torch.Generator().manual_seed(100 + n)
    vocab = model.args.vocab_size
    prompts = [torch.randint(0, vocab, (int(torch.randint(10, 70, (1,), generator=gen)),),
                             generator=gen).tolist() for _ in range(8)]
    chains = torch.randint(0, vocab, (8, n), generator=gen).cuda()
    engine = Engine(model, batch=8, max_seq_len=128)
    logits = engine.prefill(prompts)
    for _ in range(3):  # rows at different lengths, each some steps past its prompt
        logits = engine.step(logits.argmax(-1))
    lengths = engine.cache.lengths.clone()
    tree = DraftTree.chain(chains[:, 0], chains[:, 1:])
    with torch.inference_mode():
        tree_logits = model(tree.tokens, lengths[:, None] + tree.depth, engine.cache,
                            AttentionPlan.tree(lengths, tree.paths())).clone()
    engine.cache.lengths.copy_(lengths)
    engine.next_slot = int(lengths.max())
    for i in range(n):
        step = engine.step(chains[:, i]).clone()
        for row in range(8):
            assert torch.equal(step[row].view(torch.int32),
                               tree_logits[row, i].view(torch.int32)), (row, i)


@pytest.mark.parametrize("drafter,tree,budget", [("ngram", False, 8), ("early-exit:6", True, 32),
                                                 ("early-exit:6", False, 5)])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(0.7, 0.95, 3)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_graphed_runner_emits_plain_decodings_tokens(model, drafter, tree, budget, sampling,
                                                     compile):
    gen = torch.Generator().manual_seed(budget)
    prompts = [torch.randint(0, 200, (60,), generator=gen).tolist() * 2]
    engine = Engine(model, batch=1, max_seq_len=300, compile=compile)
    plain = generate(engine, prompts, max_new_tokens=96, sampling=sampling)
    spec, _ = speculative_generate(engine, make_drafter(drafter, model), prompts,
                                   max_new_tokens=96, budget=budget, tree=tree,
                                   sampling=sampling)
    assert spec == plain


@pytest.mark.parametrize("drafter,tree,budget", [("ngram", False, 16), ("ngram", False, 8),
                                                 ("early-exit:4", True, 16)])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(0.7, 0.95, 1)],
                         ids=["greedy", "sampled"])
def test_batched_graphed_runner_emits_plain_decodings_tokens(model, drafter, tree, budget,
                                                             sampling):
    """Eight requests of different lengths at once (verify steps of 64-128 rows against
    plain decoding's 8-row steps), long enough for rows to drift apart in length."""
    gen = torch.Generator().manual_seed(budget + 8)
    prompts = [torch.randint(0, 300, (int(torch.randint(20, 90, (1,), generator=gen)),),
                             generator=gen).tolist() * 2 for _ in range(8)]
    engine = Engine(model, batch=8, max_seq_len=500)
    plain = generate(engine, prompts, max_new_tokens=200, sampling=sampling)
    spec, _ = speculative_generate(engine, make_drafter(drafter, model), prompts,
                                   max_new_tokens=200, budget=budget, tree=tree,
                                   sampling=sampling)
    for row in range(8):
        assert spec[row] == plain[row], row


def test_forced_acceptance_commits_what_it_forces(model):
    engine = Engine(model, batch=1, max_seq_len=200)
    prompt = [list(range(3, 60))]
    _, stats = speculative_generate(engine, make_drafter("early-exit:4", model), prompt,
                                    max_new_tokens=40, budget=8, tree=False)
    assert stats.steps > 0
    from engine.speculative.decode import SpecRunner

    runner = SpecRunner(engine, make_drafter("early-exit:4", model), budget=8, tree=False,
                        forced_accept=5)
    root = engine.prefill(prompt).argmax(-1)
    before = int(engine.cache.lengths[0])
    verdict = runner.step(root)
    assert verdict.accepted.tolist() == [5]
    assert int(engine.cache.lengths[0]) == before + 6


@pytest.mark.parametrize("tree,budget", [(False, 16), (True, 64)], ids=["chain", "tree"])
@pytest.mark.parametrize("sampling", [Sampling(), Sampling(0.7, 0.95, 3)],
                         ids=["greedy", "sampled"])
def test_graphed_runner_with_a_block_drafter(model, tmp_path_factory, tree, budget, sampling):
    """A block drafter (the trainer's initial weights, in W12) captured with the verify step:
    plain decoding's tokens, and its cache cropped to the committed length."""
    from engine.speculative.block_drafter import BlockDrafterConfig, BlockDrafterModel
    from engine.speculative.train_drafter import init_from_target, save_drafter

    folder = tmp_path_factory.getbasetemp() / "block-drafter"
    if not folder.exists():
        bf16 = load_model(PRESET, mode="bf16", device="cuda").model
        net = BlockDrafterModel(BlockDrafterConfig.for_target(bf16.args))
        init_from_target(net, bf16, 0)
        save_drafter(net, folder)
        del bf16
    gen = torch.Generator().manual_seed(budget)
    prompts = [torch.randint(0, 200, (60,), generator=gen).tolist() * 2]
    engine = Engine(model, batch=1, max_seq_len=400)
    plain = generate(engine, prompts, max_new_tokens=96, sampling=sampling)
    drafter = make_drafter(str(folder / "w12"), model)
    spec, _ = speculative_generate(engine, drafter, prompts, max_new_tokens=96, budget=budget,
                                   tree=tree, sampling=sampling)
    assert spec == plain
    assert drafter.on_device and drafter.context.lengths.tolist() != [0]
