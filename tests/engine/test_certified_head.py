"""The certified INT8 LM head in the engine (engine/head.py): plain and speculative decoding
give the exact head's tokens, greedy and sampled; top-p falls back to the exact head; on the
real demo model the candidates are few."""

from __future__ import annotations

import pytest
import torch

from engine.generate import Engine, generate
from engine.head import CertifiedHead
from engine.sampling import Sampling
from engine.speculative import make_drafter, speculative_generate
from engine.speculative.decode import SpecRunner
from engine.weights import load_model
from w12.errors import W12Error

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 4], [100, 20, 30, 40, 50]]
SAMPLED = Sampling(temperature=0.8, seed=3)  # keyed Gumbel, no top-p: certified


@pytest.fixture(scope="module")
def tiny_w12():
    return load_model("synthetic:tiny-qwen3", mode="w12", seed=5).model


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_plain_decoding_with_the_int8_head_gives_the_exact_heads_tokens(tiny_w12, sampling):
    want = generate(Engine(tiny_w12, batch=3, max_seq_len=64), PROMPTS, max_new_tokens=20,
                    sampling=sampling)
    engine = Engine(tiny_w12, batch=3, max_seq_len=64, head="int8")
    assert generate(engine, PROMPTS, max_new_tokens=20, sampling=sampling) == want
    stats = engine.head.stats
    assert stats.rows == 3 * 20 and stats.fallbacks == 0
    assert 1 <= stats.mean_candidates < tiny_w12.args.vocab_size


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_speculative_decoding_with_the_int8_head_gives_plain_decodings_tokens(tiny_w12,
                                                                               sampling):
    want = generate(Engine(tiny_w12, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=20,
                    sampling=sampling)
    for drafter, tree, budget in (("ngram", False, 6), ("early-exit:1", True, 8)):
        engine = Engine(tiny_w12, batch=3, max_seq_len=96, head="int8")
        runner = SpecRunner(engine, make_drafter(drafter, tiny_w12), budget=budget, tree=tree,
                            sampling=sampling)
        out, _ = speculative_generate(engine, runner.drafter, PROMPTS, max_new_tokens=20,
                                      budget=budget, tree=tree, sampling=sampling,
                                      runner=runner)
        assert out == want, drafter
        assert engine.head.stats.rows > 3 * budget  # the verify steps picked with it


def test_top_p_runs_the_exact_head(tiny_w12):
    top_p = Sampling(temperature=0.8, top_p=0.9, seed=3)
    want = generate(Engine(tiny_w12, batch=3, max_seq_len=64), PROMPTS, max_new_tokens=8,
                    sampling=top_p)
    engine = Engine(tiny_w12, batch=3, max_seq_len=64, head="int8")
    assert generate(engine, PROMPTS, max_new_tokens=8, sampling=top_p) == want
    assert engine.head.stats.fallbacks == engine.head.stats.calls == 8


def test_a_wrong_token_would_be_caught(tiny_w12):
    """Not vacuous: the candidates' exact logits decide. Made to read wrong exact rows (the
    next vocabulary row's), the head picks other tokens."""
    engine = Engine(tiny_w12, batch=3, max_seq_len=64, head="int8")
    h = engine.prefill(PROMPTS)
    requests, positions = torch.arange(3), torch.tensor([len(p) for p in PROMPTS])
    right = engine.choose(h, Sampling(), requests, positions)
    exact = engine.head.exact
    engine.head.exact = lambda x: exact(x).roll(1, dims=1)
    assert engine.head.choose(h, Sampling(), requests, positions).tolist() != right.tolist()
    assert right.tolist() == tiny_w12.lm_head(h).float().argmax(1).tolist()


def test_bad_heads_are_refused(tiny_w12):
    with pytest.raises(W12Error, match="head 'int4'"):
        Engine(tiny_w12, batch=1, max_seq_len=8, head="int4")
    biased = type(tiny_w12.lm_head)(4, 3)
    biased.weight, biased.bias = torch.zeros(3, 4), torch.zeros(3)
    with pytest.raises(W12Error, match="without a bias"):
        CertifiedHead(biased)


def test_bench_spec_times_int8_head_rows_of_their_own(tiny_w12):
    """``bench spec --int8-head``: plain decoding and every budget again with the INT8 head,
    labelled apart, with their candidates per token (measured tokens/s: real picks)."""
    from engine.speculative.bench import bench_spec, summary
    from engine.weights import LoadedModel

    loaded = LoadedModel(tiny_w12, tiny_w12.args, "tiny", "w12", None, 0)
    rows = bench_spec(loaded, PROMPTS[:2], drafter="ngram", budgets=[2, 6], modes=("chain",),
                      max_new_tokens=8, int8_head=True, log=lambda line: None)
    assert [(r.label, r.budget) for r in rows] == [
        ("plain", 1), ("chain", 2), ("chain", 6), ("plain+int8", 1), ("chain+int8", 2),
        ("chain+int8", 6)]
    assert all(r.candidates is None for r in rows[:3])
    assert all(r.candidates >= 1 and r.tokens_per_s > 0 and r.c > 0 for r in rows[3:])
    assert any(line.startswith("plain+int8: ") for line in summary(rows))


def test_the_demo_model_needs_few_candidates(demo_w12):
    """HumanEval-like code prompts on the real demo model: the certified tokens are the exact
    head's, and a handful of the 49,152 vocabulary rows are recomputed per token."""
    from engine.tokenizer import Tokenizer

    model = load_model(demo_w12, mode="w12").model
    tok = Tokenizer(demo_w12)
    prompts = [tok.encode(t) for t in ("def fibonacci(n):\n    \"\"\"Return the n-th",
                                       "import numpy as np\n\ndef normalize(x):\n")]
    for sampling in (Sampling(), SAMPLED):
        want = generate(Engine(model, batch=2, max_seq_len=64), prompts, max_new_tokens=10,
                        sampling=sampling)
        engine = Engine(model, batch=2, max_seq_len=64, head="int8")
        assert generate(engine, prompts, max_new_tokens=10, sampling=sampling) == want
        assert engine.head.stats.mean_candidates < 64, engine.head.stats


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_cuda_int8_head_recomputes_the_exact_heads_tokens(sampling):
    """On the GPU the candidates' rows are recomputed from the W12 head's tiles: plain decoding
    (batch 4) and speculative decoding (a 16-node tree, 64 rows a verify; the step as two CUDA
    graphs around the head) give the exact head's tokens. (Random weights crowd the top
    logits: every candidate set is recomputed.)"""
    model = load_model("synthetic:smollm2-135m", mode="w12", device="cuda", seed=3).model
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 4], [100, 20, 30, 40, 50], [7] * 9]
    want = generate(Engine(model, batch=4, max_seq_len=128), prompts, max_new_tokens=24,
                    sampling=sampling)
    engine = Engine(model, batch=4, max_seq_len=128, head="int8")
    engine.head.max_tiles = model.args.vocab_size // 16 + 1
    assert generate(engine, prompts, max_new_tokens=24, sampling=sampling) == want
    assert engine.head.stats.fallbacks == 0 and engine.head.stats.recomputed > 0
    engine = Engine(model, batch=4, max_seq_len=128, head="int8")
    engine.head.max_tiles = model.args.vocab_size // 16 + 1
    runner = SpecRunner(engine, make_drafter("early-exit:2", model), budget=16, tree=True,
                        sampling=sampling)
    assert runner.graph is not None and runner.finish_graph is not None  # two graphs a step
    out, _ = speculative_generate(engine, runner.drafter, prompts, max_new_tokens=24,
                                  budget=16, tree=True, sampling=sampling, runner=runner)
    assert out == want
    assert engine.head.stats.fallbacks == 0


def test_the_two_graph_step_equals_the_eager_step(tiny_w12):
    """What a GPU captures as two graphs around the head (``_forward``, ``_picks``,
    ``_finish``), run by hand here, commits what the eager step commits."""
    from engine.generate import GREEDY

    verdicts, lengths = [], []
    for split in (False, True):
        engine = Engine(tiny_w12, batch=3, max_seq_len=96, head="int8")
        runner = SpecRunner(engine, make_drafter("early-exit:1", tiny_w12), budget=6,
                            tree=True, sampling=GREEDY)
        first = engine.choose(engine.prefill(PROMPTS), GREEDY, runner.requests,
                              torch.tensor([len(p) for p in PROMPTS]))
        runner.drafter.start(PROMPTS, first.tolist())
        roots, got = first, []
        for _ in range(4):
            if split:  # (a drafter on the device drafts inside the first graph)
                runner.roots.copy_(roots)
                runner.pending = runner._forward()
                runner._picks()
                verdict = runner._finish()
            else:
                verdict = runner.step(roots)
            got.append((verdict.accepted.tolist(), verdict.emitted.tolist()))
            roots = verdict.emitted.gather(1, verdict.accepted[:, None])[:, 0]
        verdicts.append(got)
        lengths.append(engine.cache.lengths.tolist())
    assert verdicts[0] == verdicts[1] and lengths[0] == lengths[1]
    assert sum(sum(a) for a, _ in verdicts[0]) > 0  # some drafts were accepted
