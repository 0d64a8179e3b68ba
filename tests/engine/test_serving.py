"""Continuous batching (engine/serving.py): requests arriving and leaving between steps, each
one's tokens equal to its own plain decoding at batch 1, plain and speculative, greedy and
keyed sampling; bad requests refused."""

from __future__ import annotations

import pytest
import torch

from engine.generate import Engine, generate
from engine.sampling import Sampling
from engine.serving import Server
from engine.speculative import DraftTree, best_first, make_drafter
from engine.weights import load_model
from w12.errors import W12Error

SAMPLED = Sampling(temperature=0.9, top_p=0.9, seed=11)
# (prompt, max_new_tokens, arrival step): more requests than rows, arrivals while others run,
# short and long answers so rows free up at different steps, one request of a single token
REQUESTS = [([5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], 20, 0), ([3, 4], 6, 0),
            ([100, 20, 30, 40, 50], 14, 0), ([7, 7, 7], 1, 1), ([9, 10, 11, 12, 9, 10], 17, 2),
            ([42], 9, 3), ([60, 61, 62, 60, 61, 62, 60], 12, 30)]
SEQ = 48


def plain_alone(model, prompt, new, request_id, sampling):
    return generate(Engine(model, batch=1, max_seq_len=SEQ), [prompt], max_new_tokens=new,
                    sampling=sampling, request_ids=[request_id])[0]


@pytest.fixture(scope="module")
def w12_model(tiny_llama_folder):
    return load_model(tiny_llama_folder, mode="w12").model


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("drafter,tree,budget", [(None, False, 1), ("ngram", False, 5),
                                                 ("early-exit:1", True, 6)],
                         ids=["plain", "ngram-chain", "early-exit-tree"])
def test_every_request_gets_its_own_plain_decoding(w12_model, sampling, drafter, tree, budget):
    engine = Engine(w12_model, batch=3, max_seq_len=SEQ)
    server = Server(engine, sampling=sampling, budget=budget, tree=tree,
                    drafter=make_drafter(drafter, w12_model) if drafter else None)
    ids = [server.submit(p, max_new_tokens=n, arrival=a) for p, n, a in REQUESTS]
    streamed: dict[int, list[int]] = {}
    out, stats = server.run(on_token=lambda i, t: streamed.setdefault(i, []).append(t))
    for request_id, (prompt, new, arrival) in zip(ids, REQUESTS, strict=True):
        want = plain_alone(w12_model, prompt, new, request_id, sampling)
        assert out[request_id] == want == streamed[request_id], request_id
        assert stats.admitted_at[request_id] >= arrival
    # requests joined a running batch: one admitted after step 0 shared steps with one
    # admitted before it
    spans = [(stats.admitted_at[i], stats.finished_at[i]) for i in ids]
    assert any(0 < a2 < f1 and a1 < a2 < f2 for a1, f1 in spans for a2, f2 in spans)
    assert stats.admitted_at[ids[-1]] >= 30  # the last arrives after a pause


def test_keys_follow_the_request_not_the_row(w12_model):
    """The same prompt as two requests: sampled differently (its own noise), each equal to its
    plain decoding under its own id."""
    engine = Engine(w12_model, batch=2, max_seq_len=SEQ)
    server = Server(engine, sampling=SAMPLED)
    a = server.submit([5, 6, 7], max_new_tokens=12)
    b = server.submit([5, 6, 7], max_new_tokens=12)
    out, _ = server.run()
    assert out[a] != out[b]
    assert out[b] == plain_alone(w12_model, [5, 6, 7], 12, b, SAMPLED)


def test_stop_ids_free_the_row(w12_model):
    free = plain_alone(w12_model, [3, 4], 10, 0, Sampling())
    engine = Engine(w12_model, batch=1, max_seq_len=SEQ)
    server = Server(engine, stop_ids=frozenset({free[3]}))
    first = server.submit([3, 4], max_new_tokens=10)
    second = server.submit([100, 20, 30], max_new_tokens=4)
    out, stats = server.run()
    assert out[first] == free[:free.index(free[3]) + 1]
    assert stats.admitted_at[second] == stats.finished_at[first]


def test_bad_requests_are_refused(w12_model):
    server = Server(Engine(w12_model, batch=1, max_seq_len=SEQ))
    with pytest.raises(W12Error, match="empty prompt"):
        server.submit([], max_new_tokens=4)
    with pytest.raises(W12Error, match="outside the vocabulary"):
        server.submit([10**6], max_new_tokens=4)
    with pytest.raises(W12Error, match="needs 55 cache positions"):
        server.submit(list(range(5, 55)), max_new_tokens=4)
    with pytest.raises(W12Error, match="at least 1"):
        server.submit([1], max_new_tokens=0)
    with pytest.raises(W12Error, match="cannot take a request into a running batch"):
        from engine.speculative.drafters import Drafter

        Drafter().admit(0, [1], 2)
    assert torch.equal(server.engine.cache.lengths, torch.zeros(1, dtype=torch.long))


def test_bench_serve_reports_both_modes_and_checks_their_tokens(tiny_folder):
    """``bench serve`` on a tiny folder: a plain and a speculative row per concurrency, the
    speed-up on the speculative row, every request served (the same tokens both ways)."""
    from engine.serving_bench import bench_serve

    loaded = load_model(tiny_folder("llama"), mode="w12")
    prompts = [p for p, _, _ in REQUESTS]
    rows = bench_serve(loaded, prompts, drafter="ngram", concurrency=[1, 3], max_new_tokens=8,
                       budget=4, tree=False, widths=(2, 4), admission=6, log=lambda line: None)
    assert [(r.concurrency, r.mode) for r in rows] == [
        (1, "plain"), (1, "spec"), (1, "widths"), (1, "admit"),
        (3, "plain"), (3, "spec"), (3, "widths"), (3, "admit")]
    for r in rows:
        assert r.requests == len(prompts) and r.tokens == 8 * len(prompts)
        assert r.latency_p50_s <= r.latency_p90_s <= r.latency_max_s <= r.seconds
        assert r.ttft_p50_s <= r.ttft_p90_s <= r.latency_max_s
        assert (r.speedup is None) == (r.mode == "plain") and r.tau >= 1.0
    assert rows[0].steps == 8 * len(prompts) - len(prompts)  # one row: a step per later token
    assert rows[4].steps < rows[0].steps  # three rows share steps


def test_a_shared_node_budget_serves_exactly(w12_model, monkeypatch):
    """Three rows, at most 8 nodes each, 12 shared: every step verifies at most 12 nodes and
    every request still gets its own plain decoding; a drafter without scores is refused."""
    from engine.speculative import decode

    sizes = []

    def counted(tree, total, active=None):
        out = share(tree, total, active)
        sizes.append(int(out.valid.sum()))
        return out

    share = decode.share_budget
    monkeypatch.setattr(decode, "share_budget", counted)
    engine = Engine(w12_model, batch=3, max_seq_len=SEQ)
    server = Server(engine, drafter=make_drafter("early-exit:1", w12_model), budget=8,
                    tree=True, shared_total=12)
    ids = [server.submit(p, max_new_tokens=n, arrival=a) for p, n, a in REQUESTS]
    out, stats = server.run()
    for request_id, (prompt, new, _) in zip(ids, REQUESTS, strict=True):
        assert out[request_id] == plain_alone(w12_model, prompt, new, request_id, Sampling())
    assert len(sizes) == stats.steps and max(sizes) == 12  # 24 drafted, 12 verified
    ngram = Server(Engine(w12_model, batch=2, max_seq_len=SEQ),
                   drafter=make_drafter("ngram", w12_model), budget=4, shared_total=6)
    ngram.submit([1, 2, 3], max_new_tokens=4)
    with pytest.raises(W12Error, match="ranks nodes by their drafter scores"):
        ngram.run()


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_the_block_drafter_takes_requests_into_a_running_batch(tiny_llama_folder, w12_model,
                                                               sampling):
    """``BlockDrafter.admit`` builds a new row's context from the taps its prefill left;
    every request still gets its own plain decoding."""
    from engine.speculative.block_drafter import (
        BlockDrafter,
        BlockDrafterConfig,
        BlockDrafterModel,
    )
    from engine.speculative.train_drafter import init_from_target

    dense = load_model(tiny_llama_folder, dtype=torch.float32).model
    net = BlockDrafterModel(BlockDrafterConfig.for_target(dense.args, n_layers=1, block_size=5,
                                                          taps=2))
    init_from_target(net, dense, 0)
    engine = Engine(w12_model, batch=3, max_seq_len=SEQ)
    server = Server(engine, sampling=sampling, drafter=BlockDrafter(w12_model, net.eval()),
                    budget=6, tree=True)
    ids = [server.submit(p, max_new_tokens=n, arrival=a) for p, n, a in REQUESTS]
    out, _ = server.run()
    for request_id, (prompt, new, _) in zip(ids, REQUESTS, strict=True):
        assert out[request_id] == plain_alone(w12_model, prompt, new, request_id, sampling)
    # a row admitted into a running batch has the context a batch-1 start gives its prompt
    prompt = REQUESTS[2][0]
    drafter = server.drafter
    row_logits = engine.prefill_row(1, prompt)
    drafter.admit(1, prompt, int(row_logits.argmax()))
    alone = Engine(w12_model, batch=1, max_seq_len=SEQ)
    solo = BlockDrafter(w12_model, net.eval())
    solo.bind(alone.cache)
    solo.start([prompt], alone.prefill([prompt]).argmax(-1).tolist())
    n = len(prompt)
    assert torch.equal(drafter.context.k[:, 1, :, :n], solo.context.k[:, 0, :, :n])
    assert torch.equal(drafter.context.v[:, 1, :, :n], solo.context.v[:, 0, :, :n])
    assert int(drafter.context.lengths[1]) == n


def test_per_request_widths_follow_acceptance_and_stay_exact(w12_model):
    """Widths (3, 5, 8) chosen per request from its recent acceptance: several are used, every
    request still gets its own plain decoding, and a bad set of widths is refused."""
    engine = Engine(w12_model, batch=3, max_seq_len=SEQ)
    server = Server(engine, drafter=make_drafter("early-exit:1", w12_model), budget=8,
                    tree=True, widths=(8, 3, 5))
    ids = [server.submit(p, max_new_tokens=n, arrival=a) for p, n, a in REQUESTS]
    out, stats = server.run()
    for request_id, (prompt, new, _) in zip(ids, REQUESTS, strict=True):
        assert out[request_id] == plain_alone(w12_model, prompt, new, request_id, Sampling())
    assert len(stats.width_steps) >= 2 and set(stats.width_steps) <= {3, 5, 8}
    with pytest.raises(W12Error, match="largest equal to the budget 8"):
        Server(Engine(w12_model, batch=1, max_seq_len=SEQ),
               drafter=make_drafter("ngram", w12_model), budget=8, widths=(4, 6))


def test_admission_caps_prefill_between_steps_and_stays_exact(w12_model):
    """With at most 12 prompt tokens admitted between two steps while others run: the cap
    holds, the first batch still fills eagerly, a newcomer waits a step that eager admission
    does not make it wait, and every request gets its own tokens."""
    runs = {}
    for admission in (None, 12):
        engine = Engine(w12_model, batch=3, max_seq_len=SEQ)
        server = Server(engine, admission=admission)
        # a long request and two that end after one step; two 10-token prompts wait for the
        # two rows that free up together while the long one runs
        burst = [REQUESTS[0], ([3, 4], 2, 0), ([100, 20, 30], 2, 0), ([9] * 10, 8, 0),
                 ([8] * 10, 8, 0)]
        ids = [server.submit(p, max_new_tokens=n, arrival=a) for p, n, a in burst]
        out, stats = server.run()
        for request_id, (prompt, new, _) in zip(ids, burst, strict=True):
            assert out[request_id] == plain_alone(w12_model, prompt, new, request_id,
                                                  Sampling())
        runs[admission] = (ids, stats)
    ids, capped = runs[12]
    assert capped.admitted_at[ids[0]] == capped.admitted_at[ids[2]] == 0  # nobody ran yet
    assert all(tokens <= 12 or step == 0 for step, tokens in capped.prefill_tokens.items())
    eager = runs[None][1]
    assert max(eager.prefill_tokens.values()) > 12  # the cap had something to cap
    assert sum(capped.admitted_at.values()) > sum(eager.admitted_at.values())
    with pytest.raises(W12Error, match="admission 0"):
        Server(Engine(w12_model, batch=1, max_seq_len=SEQ), admission=0)


@pytest.mark.parametrize("drafter", ["ngram", "early-exit:1"])
def test_two_level_verification_serves_exactly(tiny_llama_folder, w12_model, drafter):
    """Continuous batching with two-level verification (the Q pass on the 8-bit view): every
    request still gets its own plain decoding, sampled; a shared budget or per-request widths
    beside it are refused."""
    from engine.speculative.two_level import TwoLevel

    view = load_model(tiny_llama_folder, mode="view8").model
    engine = Engine(w12_model, batch=3, max_seq_len=SEQ)
    server = Server(engine, sampling=SAMPLED, drafter=make_drafter(drafter, w12_model),
                    budget=6, tree=True, two_level=TwoLevel(view, 3))
    ids = [server.submit(p, max_new_tokens=n, arrival=a) for p, n, a in REQUESTS]
    out, stats = server.run()
    for request_id, (prompt, new, _) in zip(ids, REQUESTS, strict=True):
        assert out[request_id] == plain_alone(w12_model, prompt, new, request_id, SAMPLED)
    assert server.runner.two_level is not None and stats.steps > 0
    for extra in ({"shared_total": 12}, {"widths": (3, 6)}):
        with pytest.raises(W12Error, match="two-level verification needs"):
            Server(Engine(w12_model, batch=3, max_seq_len=SEQ), budget=6,
                   drafter=make_drafter("ngram", w12_model), two_level=TwoLevel(view, 3),
                   **extra)


def test_limit_rows_keeps_each_requests_best_nodes():
    from engine.speculative.tree import limit_rows

    gen = torch.Generator().manual_seed(5)
    logp = torch.randn(2, 3, 3, generator=gen).log_softmax(-1).sort(-1, descending=True).values
    tree = best_first(torch.tensor([1, 2]), torch.arange(18).view(2, 3, 3), logp, 7)
    cut = limit_rows(tree, torch.tensor([3, 7]))
    assert cut.valid.sum(1).tolist() == [3, 7]
    key = torch.where(tree.parents >= 0, tree.scores - 1e-6 * tree.depth, float("inf"))
    assert set(key[0].topk(3).indices.tolist()) == set(cut.valid[0].nonzero()[:, 0].tolist())
    parents_kept = cut.valid.gather(1, cut.parents.clamp(min=0))
    assert (parents_kept | ~cut.valid).all()
    chain = limit_rows(DraftTree.chain(torch.tensor([1]), torch.tensor([[2, 3, 4]])),
                       torch.tensor([2]))
    assert chain.valid[0].tolist() == [True, True, False, False]
