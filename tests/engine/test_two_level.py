"""Two-level verification (engine/speculative/two_level.py): the graft, and outputs equal to
plain decoding's whatever the Q pass's model picks, greedy and sampled, chain and tree."""

from __future__ import annotations

import pytest
import torch

from engine.generate import Engine, generate
from engine.sampling import Sampling
from engine.speculative import make_drafter, speculative_generate
from engine.speculative.decode import SpecRunner
from engine.speculative.tree import DraftTree
from engine.speculative.two_level import TwoLevel, graft
from engine.weights import load_model
from w12.errors import W12Error

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 4], [100, 20, 30, 40, 50]]
SAMPLED = Sampling(temperature=0.9, top_p=0.9, seed=11)


def test_graft_hangs_the_second_tree_under_the_chosen_node():
    # T1: root(0) -> a(1) -> c(3);  root -> b(2).  T2: r(0) -> x(1), r -> y(2), under c
    t1 = DraftTree(torch.tensor([[10, 11, 12, 13]]), torch.tensor([[-1, 0, 0, 1]]),
                   torch.tensor([[0, 1, 1, 2]]), torch.ones(1, 4, dtype=torch.bool))
    t2 = DraftTree(torch.tensor([[20, 21, 22]]), torch.tensor([[-1, 0, 0]]),
                   torch.tensor([[0, 1, 1]]), torch.tensor([[True, True, False]]))
    tree = graft(t1, torch.tensor([3]), t2)
    assert tree.tokens[0].tolist() == [10, 11, 12, 13, 20, 21, 22]
    assert tree.parents[0].tolist() == [-1, 0, 0, 1, 3, 4, 4]
    assert tree.depth[0].tolist() == [0, 1, 1, 2, 3, 4, 4]
    assert tree.valid[0].tolist() == [True] * 6 + [False]
    assert tree.paths()[0, 5].tolist() == [0, 1, 3, 4, 5, -1, -1]


def models(tiny_folder):
    folder = tiny_folder("qwen3")
    target = load_model(folder, mode="bf16", dtype=torch.float32).model
    return target, folder


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_two_level_equals_plain_decoding(tiny_folder, sampling):
    target, folder = models(tiny_folder)
    views = {"view8": load_model(folder, mode="view8", dtype=torch.float32).model,
             # a model with other weights: its Q picks are noise, the output must not change
             "unrelated": load_model(tiny_folder("qwen3", seed=7), mode="bf16",
                                     dtype=torch.float32).model}
    plain = generate(Engine(target, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=24,
                     sampling=sampling)
    for view_name, view in views.items():
        for drafter in ("ngram", "early-exit:1"):
            for tree, q_budget, budget in ((False, 3, 8), (True, 4, 9), (True, 1, 2)):
                engine = Engine(target, batch=3, max_seq_len=96)
                runner = SpecRunner(engine, make_drafter(drafter, target), budget=budget,
                                    tree=tree, sampling=sampling,
                                    two_level=TwoLevel(view, q_budget))
                out, stats = speculative_generate(
                    engine, runner.drafter, PROMPTS, max_new_tokens=24, budget=budget,
                    tree=tree, sampling=sampling, runner=runner)
                assert out == plain, (view_name, drafter, tree, q_budget)
                assert len(stats.q_committed) == len(stats.committed)


def test_the_view_pass_steers_toward_what_the_exact_pass_accepts(tiny_folder):
    """With the view model as the Q pass, the exact pass accepts at least as many tokens as
    with an unrelated Q model (same drafter, same budgets)."""
    target, folder = models(tiny_folder)
    taus = {}
    for name, view in (("view8", load_model(folder, mode="view8", dtype=torch.float32).model),
                       ("unrelated", load_model(tiny_folder("qwen3", seed=7),
                                                dtype=torch.float32).model)):
        engine = Engine(target, batch=3, max_seq_len=96)
        drafter = make_drafter("early-exit:1", target)
        _, stats = speculative_generate(
            engine, drafter, PROMPTS, max_new_tokens=24, budget=9, tree=True,
            runner=SpecRunner(engine, drafter, budget=9, tree=True,
                              two_level=TwoLevel(view, 4)))
        taus[name] = stats.tau
    assert taus["view8"] > taus["unrelated"], taus


def test_bad_two_level_settings_are_refused(tiny_folder):
    target, folder = models(tiny_folder)
    engine = Engine(target, batch=1, max_seq_len=64)
    drafter = make_drafter("ngram", target)
    runner = SpecRunner(engine, drafter, budget=4, tree=False, two_level=TwoLevel(target, 4))
    with pytest.raises(W12Error, match="Q tree's budget 4 must be at least 1 and below"):
        speculative_generate(engine, drafter, [[1, 2, 3]], max_new_tokens=4, budget=4,
                             runner=runner)


def test_bench_spec_times_two_level_rows_of_their_own(tiny_folder):
    """``bench spec --two-level Q``: every budget above Q again with two-level verification,
    labelled apart, with the Q path's tau."""
    from engine.speculative.bench import bench_spec, summary

    loaded = load_model(tiny_folder("qwen3"), mode="bf16", dtype=torch.float32)
    rows = bench_spec(loaded, PROMPTS[:2], drafter="ngram", budgets=[2, 6], modes=("chain",),
                      max_new_tokens=12, two_level=3, log=lambda line: None)
    assert [(r.label, r.budget) for r in rows] == [("plain", 1), ("chain", 2), ("chain", 6),
                                                   ("chain+Q3", 6)]
    tlv = rows[-1]
    assert tlv.two_level == 3 and tlv.q_tau >= 1.0 and tlv.tau >= 1.0 and tlv.c > 0
    assert all(r.q_tau is None for r in rows[:-1])
    assert any(line.startswith("chain+Q3: ") for line in summary(rows))


@pytest.mark.parametrize("mode", ["chain", "tree"])
def test_forced_two_level_steps_commit_what_they_are_told(tiny_folder, mode):
    """With forced acceptance K (timing on random weights) the Q path takes K nodes where the
    Q tree is that deep, and the exact pass commits K + 1 tokens a step."""
    target, folder = models(tiny_folder)
    view = load_model(folder, mode="view8", dtype=torch.float32).model
    engine = Engine(target, batch=1, max_seq_len=96)
    drafter = make_drafter("early-exit:1", target)
    prompt = PROMPTS[0]
    root = engine.prefill([prompt]).argmax(-1)
    drafter.start([prompt], root.tolist())
    runner = SpecRunner(engine, drafter, budget=9, tree=mode == "tree", forced_accept=2,
                        two_level=TwoLevel(view, 4))
    for _ in range(3):  # timed steps, each from the same committed state
        engine.cache.rollback([len(prompt)])
        verdict = runner.step(root)
        assert verdict.accepted.tolist() == [2] and runner.q_verdict.accepted.tolist() == [2]
        assert int(engine.cache.lengths[0]) == len(prompt) + 3


def test_cli_times_two_level_on_a_synthetic_preset_with_forced_acceptance():
    from click.testing import CliRunner

    from w12_cli import main

    result = CliRunner().invoke(main, ["bench", "spec", "synthetic:tiny-qwen3", "--drafter",
                                       "early-exit:1", "--forced-accept", "2", "--two-level",
                                       "3", "--budgets", "1,6", "--modes", "chain", "--w12",
                                       "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert any(line.startswith("chain+Q3 ") and "tau  3.000" in line
               for line in result.output.splitlines()), result.output


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("drafter", ["ngram", "early-exit:1"])
@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_two_level_on_the_gpu_runs_the_view_gemm(tiny_folder, sampling, drafter):
    """On a GPU the view model's linears are packed views (one byte a weight, the view GEMM),
    and two-level verification over a W12 target still gives plain decoding's tokens: eagerly
    with a host drafter (ngram), as one CUDA graph a step with a device drafter (early exit)."""
    from engine.model import Linear
    from w12_kernels.view8 import PackedView8

    folder = tiny_folder("qwen3")
    target = load_model(folder, mode="w12", device="cuda").model
    view = load_model(folder, mode="view8", device="cuda").model
    linears = [m for m in view.modules() if isinstance(m, Linear)]
    assert linears and all(isinstance(m.packed, PackedView8) for m in linears)
    plain = generate(Engine(target, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=24,
                     sampling=sampling)
    engine = Engine(target, batch=3, max_seq_len=96)
    runner = SpecRunner(engine, make_drafter(drafter, target), budget=9, tree=True,
                        sampling=sampling, two_level=TwoLevel(view, 4))
    assert (runner.graph is not None) == runner.drafter.on_device
    out, stats = speculative_generate(engine, runner.drafter, PROMPTS, max_new_tokens=24,
                                      budget=9, tree=True, sampling=sampling, runner=runner)
    assert out == plain
    assert len(stats.q_committed) == len(stats.committed)
