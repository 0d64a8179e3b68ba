"""The block drafter: its forward against a readable float64 reference (context before the
root only, non-causal inside the block), its cache cropped to the committed length, the taps
the target keeps per slot, training that lowers the loss, folders (BF16 and W12) and bad input,
and speculative decoding with it equal to plain decoding."""

from __future__ import annotations

import json
import math

import pytest
import torch
from click.testing import CliRunner

from engine.generate import Engine, generate
from engine.model import rope_inv_freq
from engine.sampling import Sampling
from engine.speculative import make_drafter, speculative_generate
from engine.speculative.block_drafter import (
    BlockDrafter,
    BlockDrafterConfig,
    BlockDrafterModel,
    tap_layers,
)
from engine.speculative.decode import SpecRunner
from engine.speculative.train_drafter import (
    PAD_TO,
    Sequence,
    TrainLog,
    TrainOptions,
    block_loss,
    block_visibility,
    generate_responses,
    init_from_target,
    sample_batch,
    save_drafter,
    target_states,
    train_drafter,
)
from engine.speculative.two_level import TwoLevel
from engine.weights import load_model
from w12.errors import W12Error
from w12_cli import main

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [3, 4], [100, 20, 30, 40, 50]]
SAMPLED = Sampling(temperature=0.9, top_p=0.9, seed=11)
BLOCK = 5


@pytest.fixture(scope="module")
def target(tiny_llama_folder):
    return load_model(tiny_llama_folder, dtype=torch.float32).model


def random_net(target, *, seed: int = 0, layers: int = 2) -> BlockDrafterModel:
    """A drafter with the trainer's initial weights, then every tensor perturbed."""
    config = BlockDrafterConfig.for_target(target.args, n_layers=layers, block_size=BLOCK, taps=2)
    net = BlockDrafterModel(config)
    init_from_target(net, target, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05 * (p.std() if p.numel() > 1 else 1))
    return net.eval()


def test_tap_layers_are_evenly_spaced():
    assert tap_layers(30, 5) == (1, 8, 14, 20, 27)
    assert tap_layers(36, 3) == (1, 17, 33)
    assert tap_layers(2, 5) == (0, 1)
    assert tap_layers(4, 1) == (1,)


# ----------------------------------------------------------------------------- reference

def _rms64(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _rope64(x, pos, c):
    """x [H, D] at position ``pos``, half-split pairs."""
    inv = rope_inv_freq(c.rope_args()).double()  # with the target's RoPE scaling
    angle = torch.cat([pos * inv, pos * inv])
    x1, x2 = x.chunk(2, dim=-1)
    return x * angle.cos() + torch.cat([-x2, x1], dim=-1) * angle.sin()


def reference_block(net, target, taps, root, length):
    """Log-probabilities [block - 1, V] of one request, in float64 and loops: the block's
    rows see the ``length`` context positions and every row of the block, nothing else."""
    c = net.config
    w = {n: p.detach().double() for n, p in net.named_parameters()}
    states = _rms64(taps.double() @ w["fc.weight"].T, w["context_norm"], c.norm_eps)
    x = torch.cat([target.embed[root].double()[None],
                   w["mask_embedding"][None].expand(c.block_size - 1, -1)])
    for i in range(c.n_layers):
        wq, wkv = w[f"layers.{i}.wq.weight"], w[f"layers.{i}.wkv.weight"]
        h = _rms64(x, w[f"layers.{i}.attn_norm"], c.norm_eps)
        rows = torch.cat([states, h])  # context positions 0..L-1, then the block at L..
        kv = (rows @ wkv.T).view(len(rows), 2, c.n_kv_heads, c.head_dim)
        keys = torch.stack([_rope64(kv[j, 0], j, c) for j in range(len(rows))])
        values = kv[:, 1]
        out = torch.zeros(c.block_size, c.q_size, dtype=torch.float64)
        group = c.n_heads // c.n_kv_heads
        for t in range(c.block_size):
            q = _rope64((h[t] @ wq.T).view(c.n_heads, c.head_dim), length + t, c)
            for head in range(c.n_heads):
                g = head // group
                scores = torch.stack([q[head] @ keys[j, g] for j in range(len(rows))])
                p = torch.softmax(scores / math.sqrt(c.head_dim), dim=0)
                out[t, head * c.head_dim:(head + 1) * c.head_dim] = p @ values[:, g]
        x = x + out @ w[f"layers.{i}.wo.weight"].T
        gate, up = (_rms64(x, w[f"layers.{i}.mlp_norm"], c.norm_eps)
                    @ w[f"layers.{i}.w13.weight"].T).chunk(2, dim=-1)
        x = x + (torch.nn.functional.silu(gate) * up) @ w[f"layers.{i}.w2.weight"].T
    h = _rms64(x, w["norm"], c.norm_eps)
    return (h[1:] @ target.lm_head.weight.double().T).log_softmax(-1)


def _drafter_after_prefill(target, net, prompts):
    engine = Engine(target, batch=len(prompts), max_seq_len=64)
    drafter = BlockDrafter(target, net)
    drafter.bind(engine.cache)
    first = engine.prefill(prompts).argmax(-1)
    drafter.start(prompts, first.tolist())
    return engine, drafter, first


def test_forward_matches_the_reference_and_sees_only_the_context(target):
    net = random_net(target)
    engine, drafter, first = _drafter_after_prefill(target, net, PROMPTS)
    with torch.inference_mode():
        got = drafter.block_logprobs(first)
    assert got.shape == (3, BLOCK - 1, target.args.vocab_size)
    for row, prompt in enumerate(PROMPTS):
        taps, _ = target_states(target, torch.tensor([prompt]), net.config.target_layers)
        want = reference_block(net, target, taps[0], first[row].item(), len(prompt))
        torch.testing.assert_close(got[row].double(), want, atol=2e-4, rtol=0)
    # scratch past the committed length, in the drafter's cache and the target's taps, is
    # never read
    for row, prompt in enumerate(PROMPTS):
        drafter.context.k[:, row, :, len(prompt):] = 1e3
        drafter.context.v[:, row, :, len(prompt):] = -1e3
        engine.cache.hidden.states[row, len(prompt):] = 7.0
    with torch.inference_mode():
        assert torch.equal(drafter.block_logprobs(first), got)


def test_a_causal_block_would_differ_from_the_reference(target):
    """The reference can tell a non-causal block from a causal one."""
    net = random_net(target)
    _, drafter, first = _drafter_after_prefill(target, net, PROMPTS[:1])
    with torch.inference_mode():
        full = drafter.block_logprobs(first)
        drafter.net.config.block_size = 2  # the first mask row alone: it no longer sees the rest
        short = drafter.block_logprobs(first)
        drafter.net.config.block_size = BLOCK
    assert not torch.allclose(full[:, :1], short, atol=1e-3)


def test_training_masks_match_a_loop():
    anchors = torch.tensor([[2, 5], [0, 3]])
    got = block_visibility(anchors, context=6, block=3)
    for b in range(2):
        for q in range(6):
            owner = q // 3
            for k in range(6 + 6):
                want = (k < anchors[b, owner]) if k < 6 else ((k - 6) // 3 == owner)
                assert got[b, q, k].item() == bool(want), (b, q, k)


def test_padding_a_batch_changes_no_loss(target):
    """Batches are padded to a multiple of PAD_TO: the padding is never seen, so the loss and
    agreement of a batch do not depend on how far it is padded."""
    net = random_net(target, layers=1)
    head = target.lm_head.weight if target.lm_head.weight is not None else target.embed
    seqs = [Sequence(list(range(3, 17)), 4), Sequence([9, 8, 7, 6, 5, 4, 3, 30, 31], 3)]
    tokens, lengths, anchors = sample_batch(seqs, [0, 1], 3, torch.Generator().manual_seed(2),
                                            torch.device("cpu"))
    assert tokens.shape[1] % PAD_TO == 0 and lengths.tolist() == [14, 9]
    wider = torch.cat([tokens, torch.zeros(2, PAD_TO, dtype=tokens.dtype)], dim=1)
    narrow = tokens[:, :14]
    got = [block_loss(net, target, head.float(), t, lengths, anchors, 7.0)
           for t in (narrow, tokens, wider)]
    for loss, stats in got[1:]:
        torch.testing.assert_close(loss, got[0][0], rtol=1e-5, atol=1e-6)
        assert stats["accuracy"] == got[0][1]["accuracy"]


def test_taps_and_context_follow_the_committed_length(target):
    """After speculative steps the target's taps at slots < L are the committed positions'
    hidden states, and the drafter's cache holds exactly their context entries, cropped to L."""
    net = random_net(target)
    long = generate(Engine(target, batch=3, max_seq_len=96), PROMPTS, max_new_tokens=30)
    engine = Engine(target, batch=3, max_seq_len=96)
    drafter = BlockDrafter(target, net)
    out, _ = speculative_generate(engine, drafter, PROMPTS, max_new_tokens=12, budget=6,
                                  tree=True)
    roots = torch.tensor([o[-1] for o in out])
    with torch.inference_mode():
        chain = drafter.propose(roots, engine.cache, 9, False)  # budget past the block: padded
        assert chain.size == 9 and chain.valid.sum(1).tolist() == [BLOCK] * 3
        assert drafter.propose(roots, engine.cache, 6, True).size == 6
    lengths = engine.cache.lengths.tolist()
    assert drafter.context.lengths.tolist() == lengths
    c = net.config
    for row, length in enumerate(lengths):
        seq = (PROMPTS[row] + long[row])[:length]
        taps, _ = target_states(target, torch.tensor([seq]), c.target_layers)
        kept = engine.cache.hidden.states[row, :length].flatten(1)
        torch.testing.assert_close(kept, taps[0], atol=1e-4, rtol=1e-4)
        with torch.no_grad():
            states = net.context(taps)
            cos, sin = drafter.cos[:length, None], drafter.sin[:length, None]
            for i, layer in enumerate(net.layers):
                k, v = layer.keys_values(states, cos, sin)
                torch.testing.assert_close(drafter.context.k[i, row, :, :length],
                                           k[0].transpose(0, 1), atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(drafter.context.v[i, row, :, :length],
                                           v[0].transpose(0, 1), atol=1e-4, rtol=1e-4)


# ----------------------------------------------------------------------------- training

@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """A drafter trained for a few steps on the tiny target's own answers, saved."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 160, (int(n),), generator=gen).tolist()
               for n in torch.randint(3, 10, (8,), generator=gen)]
    options = TrainOptions(layers=1, block_size=BLOCK, taps=2, steps=80, batch=8, anchors=8,
                           lr=5e-3, warmup=5, max_new_tokens=24, gen_batch=8)
    data = generate_responses(target, prompts, options=options, stop_ids=frozenset())
    log = TrainLog(options={}, target="tiny")
    net = train_drafter(target, data, options, log=log)
    out = tmp_path_factory.mktemp("drafter")
    save_drafter(net, out, shard_bytes=60_000)  # W12 in several shards
    return net, log, out, prompts


def test_training_lowers_the_loss(trained):
    _, log, _, _ = trained
    assert log.steps_run == 80 and all(math.isfinite(v) for v in log.loss)
    first, last = sum(log.loss[:5]) / 5, sum(log.loss[-5:]) / 5
    assert last < 0.3 * first, (first, last)


def test_what_training_learned_is_accepted(target, trained):
    """Training and drafting agree on positions, anchors and masks: the trained drafter's
    blocks are accepted on the sequences it learned (an untrained one's are not)."""
    net, _, _, prompts = trained
    for drafter, low, high in ((BlockDrafter(target, random_net(target)), 1.0, 1.3),
                               (BlockDrafter(target, net), 2.0, BLOCK)):
        for tree, budget in ((False, BLOCK), (True, 12)):
            engine = Engine(target, batch=len(prompts), max_seq_len=48)
            _, stats = speculative_generate(engine, drafter, prompts, max_new_tokens=24,
                                            budget=budget, tree=tree)
            assert low <= stats.tau <= high, (tree, stats.tau)


def test_training_refuses_nothing_to_learn(target):
    with pytest.raises(W12Error, match="prompt set is empty"):
        generate_responses(target, [], options=TrainOptions(), stop_ids=frozenset())
    with pytest.raises(W12Error, match="no sequence"):
        train_drafter(target, [], TrainOptions(), log=TrainLog(options={}, target="t"))
    assert Sequence([1, 2], 1).prompt_len == 1


def test_w12_folder_drafts_the_bits_of_the_bf16_folder(tiny_folder, trained):
    """The W12 copy is lossless: decoded into a BF16 target it gives the BF16 folder's bits."""
    _, _, out, _ = trained
    model = load_model(tiny_folder("llama"), dtype=torch.bfloat16).model
    results = []
    for folder in (out / "bf16", out / "w12"):
        _, drafter, first = _drafter_after_prefill(model, BlockDrafter.load(folder, model).net,
                                                   PROMPTS)
        with torch.inference_mode():
            results.append(drafter.block_logprobs(first))
    assert torch.equal(results[0], results[1])
    assert len(list((out / "w12").glob("model-*.safetensors"))) > 1
    config = json.loads((out / "w12" / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "w12"


# ----------------------------------------------------------------------------- exactness

MODELS = {"llama-f32": ("llama", "bf16", torch.float32),
          "qwen3-w12": ("qwen3", "w12", torch.bfloat16)}


@pytest.mark.parametrize(("model_id", "sampling"), [("llama-f32", Sampling()),
                                                    ("llama-f32", SAMPLED),
                                                    ("qwen3-w12", SAMPLED)],
                         ids=["llama-f32-greedy", "llama-f32-sampled", "qwen3-w12-sampled"])
def test_speculative_with_a_block_drafter_equals_plain(tiny_folder, tmp_path, model_id,
                                                       sampling):
    kind, mode, dtype = MODELS[model_id]
    model = load_model(tiny_folder(kind), mode=mode, dtype=dtype).model
    folder = tmp_path / "drafter"
    save_drafter(random_net(load_model(tiny_folder(kind), dtype=torch.float32).model), folder)
    plain = generate(Engine(model, batch=3, max_seq_len=64), PROMPTS, max_new_tokens=16,
                     sampling=sampling)
    for tree, budget in ((False, 8), (True, 9)):
        drafter = make_drafter(str(folder / "w12"), model)
        out, _ = speculative_generate(Engine(model, batch=3, max_seq_len=64), drafter, PROMPTS,
                                      max_new_tokens=16, budget=budget, tree=tree,
                                      sampling=sampling)
        assert out == plain, (tree, budget)


@pytest.mark.parametrize("sampling", [Sampling(), SAMPLED], ids=["greedy", "sampled"])
def test_two_level_with_the_block_drafter(target, trained, sampling):
    """Two-level verification re-drafts with the block drafter after the Q path (its hidden
    states moved into place): the output stays plain decoding's, and with the target itself
    as the Q model the re-drafted block is accepted on top of the Q path, so tau beats a
    one-level step over the Q tree's budget alone."""
    net, _, _, prompts = trained
    plain = generate(Engine(target, batch=len(prompts), max_seq_len=64), prompts,
                     max_new_tokens=24, sampling=sampling)
    taus = {}
    for name, setting, budget in (("one level", None, 8), ("two level", TwoLevel(target, 8), 16)):
        engine = Engine(target, batch=len(prompts), max_seq_len=64)
        drafter = BlockDrafter(target, net)
        # trees: the Q path runs through siblings, so its states must move into place
        runner = SpecRunner(engine, drafter, budget=budget, tree=True, sampling=sampling,
                            two_level=setting)
        out, stats = speculative_generate(engine, drafter, prompts, max_new_tokens=24,
                                          budget=budget, tree=True, sampling=sampling,
                                          runner=runner)
        assert out == plain, name
        taus[name] = stats.tau
    assert taus["two level"] > taus["one level"] + 0.5, taus


def test_redraft_after_the_q_path_is_the_draft_after_committing_it(target, trained):
    """With the target itself as the Q model, the block drafted after the Q path (its states
    moved from the tree's slots into place) is the block drafted once that path is committed
    by a real verify step, node for node."""
    from engine.speculative.two_level import q_pass
    from engine.speculative.verify import verify

    net, _, _, prompts = trained
    engine = Engine(target, batch=len(prompts), max_seq_len=64, cuda_graph=False)
    drafter = BlockDrafter(target, net)
    drafter.bind(engine.cache)
    roots = engine.prefill(prompts).argmax(-1)
    drafter.start(prompts, roots.tolist())
    requests = torch.arange(len(prompts))
    with torch.inference_mode():
        t1 = drafter.propose(roots, engine.cache, 8, True)
        q = q_pass(target, engine.cache, t1, Sampling(), requests)
        counts = q.accepted + 1
        assert (q.path[:, 2:] > 2).any()  # some Q path runs through a sibling's slot
        after = drafter.propose_after(roots, q.emitted, counts, engine.cache, 8, True, q.path)
        verdict = verify(target, engine.cache, t1, Sampling(), requests)
        assert torch.equal(verdict.accepted, q.accepted)
        bonus = verdict.emitted.gather(1, verdict.accepted[:, None])[:, 0]
        committed = drafter.propose(bonus, engine.cache, 8, True)
    for name in ("tokens", "parents", "depth", "valid", "scores"):
        assert torch.equal(getattr(after, name), getattr(committed, name)), name


# ----------------------------------------------------------------------------- bad input

def test_a_drafter_for_another_target_is_refused(tiny_folder, trained):
    _, _, out, _ = trained
    other = load_model(tiny_folder("llama", vocab_size=200), dtype=torch.float32).model
    with pytest.raises(W12Error, match="vocabulary 160, width 64, 2 layers; the model has "
                                       "vocabulary 200"):
        make_drafter(str(out / "w12"), other)
    with pytest.raises(W12Error, match="not a block drafter"):
        make_drafter(str(tiny_folder("llama")), other)


def test_demo_drafter_missing_is_one_clear_error(target, monkeypatch, tmp_path):
    from engine.speculative import block_drafter

    monkeypatch.setattr(block_drafter, "DEMO_DRAFTER", tmp_path / "absent")
    with pytest.raises(W12Error, match="demo block drafter is not shipped"):
        make_drafter("demo", target)


@pytest.mark.parametrize("case", ["humaneval", "empty", "untappable", "synthetic"])
def test_cli_draft_train_bad_input(tmp_path, tiny_folder, case):
    prompts, model = "stdlib", str(tiny_folder("llama"))
    if case == "humaneval":
        prompts = "humaneval"
    elif case == "empty":
        prompts = str(tmp_path / "empty.jsonl")
        (tmp_path / "empty.jsonl").write_text("\n")
    elif case == "untappable":
        folder = tmp_path / "gpt2"
        folder.mkdir()
        config = {"architectures": ["GPT2LMHeadModel"], "n_embd": 64}
        (folder / "config.json").write_text(json.dumps(config))
        model = str(folder)
    else:
        model = "synthetic:tiny-qwen3"
    result = CliRunner().invoke(main, ["draft", "train", model, "--out", str(tmp_path / "o"),
                                       "--prompts", prompts, "--num-prompts", "4",
                                       "--device", "cpu", "--quiet"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    want = {"humaneval": "evaluation set", "empty": "no prompts",
            "untappable": "'GPT2LMHeadModel' is not supported", "synthetic": "no tokenizer"}
    assert want[case] in lines[0]


def test_cli_drafter_option_takes_demo_and_folders(tmp_path):
    """``--drafter`` takes a folder or ``demo``; anything else is a usage error (exit 2)."""
    from w12_cli.options import _drafter_name

    assert _drafter_name(None, None, "demo") == "demo"
    assert _drafter_name(None, None, str(tmp_path)) == str(tmp_path)
    assert _drafter_name(None, None, "early-exit:2+ngram") == "early-exit:2+ngram"
    assert _drafter_name(None, None, f"{tmp_path}+ngram") == f"{tmp_path}+ngram"
    for bad in ("ngram+ngram", "early-exit:x+ngram"):
        result = CliRunner().invoke(main, ["spec", "check", str(tmp_path), "--prompts",
                                           "humaneval", "--drafter", bad])
        assert result.exit_code == 2 and "a drafter is ngram, early-exit:K" in result.output
    result = CliRunner().invoke(main, ["spec", "check", str(tmp_path), "--prompts", "humaneval",
                                       "--drafter", str(tmp_path / "absent")])
    assert result.exit_code == 2 and "a drafter is ngram, early-exit:K" in result.output


def test_minutes_fits_the_steps_and_steps_repeat_the_run(target):
    """--minutes fits the step count inside the warm-up and decays over it; --steps with the
    fitted count (no --minutes) repeats the run loss for loss."""
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, 160, (6,), generator=gen).tolist() for _ in range(4)]
    base = dict(layers=1, block_size=BLOCK, taps=2, batch=4, anchors=4, warmup=8,
                max_new_tokens=12, gen_batch=4)
    data = generate_responses(target, prompts, options=TrainOptions(**base),
                              stop_ids=frozenset())
    fitted = TrainLog(options={}, target="tiny")
    train_drafter(target, data, TrainOptions(**base, steps=100_000, minutes=0.02), log=fitted)
    assert fitted.fitted_steps is not None and 8 <= fitted.fitted_steps < 100_000
    # all fitted steps ran, unless a step stalled past the 5% room (a loaded machine)
    assert fitted.steps_run == fitted.fitted_steps or fitted.stopped_by_time
    again = TrainLog(options={}, target="tiny")
    train_drafter(target, data, TrainOptions(**base, steps=fitted.fitted_steps), log=again)
    assert again.fitted_steps is None and again.steps_run == fitted.fitted_steps
    assert again.loss[:fitted.steps_run] == fitted.loss
