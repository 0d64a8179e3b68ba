"""The engine's model against transformers, its cache against full forwards, batching, sampling."""

from __future__ import annotations

import math

import pytest
import torch

from engine.attention import AttentionPlan
from engine.generate import Engine, generate
from engine.model import ModelArgs, rope_inv_freq
from engine.sampling import Sampling, choose
from engine.weights import expected_shapes, load_model

KINDS = ["llama", "llama-tied", "qwen2", "qwen3"]  # the tiny checkpoints of conftest.py
PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [3, 4], [100, 20, 30, 40, 50]]


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    """Logits of one sequence in a single prefill pass (no cache reuse), [T, V]."""
    return model.score(torch.tensor([tokens]))[0]


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers(tiny_folder, kind):
    transformers = pytest.importorskip("transformers")
    folder = tiny_folder(kind)
    ours = load_model(folder, dtype=torch.float32).model
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokens = torch.randint(0, 160, (2, 48), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(48).expand(2, 48)
    with torch.no_grad():
        expected = theirs(tokens).logits
    lengths = torch.zeros(2, dtype=torch.long)
    # causal self-attention, and attention over the cache (a chain of 48 rows)
    for plan in (AttentionPlan.prefill(pos), AttentionPlan.chain(lengths, 48)):
        got = ours(tokens, pos, ours.new_cache(2, 48), plan)
        assert (got - expected).abs().max().item() < 1e-4 * expected.abs().max().item()
        assert torch.equal(got.argmax(-1), expected.argmax(-1))


def test_llama3_rope_frequencies_match_transformers(tiny_folder):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.AutoConfig.from_pretrained(tiny_folder("llama"))
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    args = ModelArgs.from_hf_config(config.to_dict())
    assert args.rope_scaling["rope_type"] == "llama3"
    assert torch.equal(rope_inv_freq(args), expected)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_cached_decode_equals_full_forward(tiny_folder, kind):
    model = load_model(tiny_folder(kind), dtype=torch.float32).model
    prompt = PROMPTS[0]
    out = generate(Engine(model, batch=1, max_seq_len=40), [prompt], max_new_tokens=16)[0]
    logits = full_logits(model, prompt + out)
    assert logits[len(prompt) - 1 : -1].argmax(-1).tolist() == out
    # the last step's logits themselves, not just their argmax
    engine = Engine(model, batch=1, max_seq_len=40)
    step_logits = engine.prefill([prompt])
    for token in out[:-1]:
        step_logits = engine.step(torch.tensor([token]))
    assert torch.allclose(step_logits[0], logits[-2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["qwen2", "llama-tied"])
def test_batch_with_different_lengths_equals_single_runs(tiny_folder, kind):
    model = load_model(tiny_folder(kind), dtype=torch.float32).model
    batched = generate(Engine(model, batch=3, max_seq_len=48), PROMPTS, max_new_tokens=20)
    for prompt, out in zip(PROMPTS, batched, strict=True):
        single = generate(Engine(model, batch=1, max_seq_len=48), [prompt], max_new_tokens=20)
        assert single[0] == out


def test_bf16_batch_equals_single_runs(tiny_folder):
    model = load_model(tiny_folder("qwen3", dtype=torch.bfloat16)).model
    batched = generate(Engine(model, batch=3, max_seq_len=48), PROMPTS, max_new_tokens=12)
    singles = [generate(Engine(model, batch=1, max_seq_len=48), [p], max_new_tokens=12)[0]
               for p in PROMPTS]
    assert batched == singles


def test_sampling_reproducible_with_seed(tiny_folder):
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    engine = Engine(model, batch=3, max_seq_len=48)

    def run(seed):
        sampling = Sampling(temperature=1.0, top_p=0.95, seed=seed)
        return generate(engine, PROMPTS, max_new_tokens=24, sampling=sampling)

    first = run(7)
    assert run(7) == first
    assert run(8) != first
    assert first != generate(engine, PROMPTS, max_new_tokens=24)  # not greedy in disguise


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).expand(300, 4)
    rows = torch.arange(300)
    draws = set(choose(logits, Sampling(temperature=1.0, top_p=0.7), rows, rows).tolist())
    assert draws == {0, 1}
    assert choose(logits[:1], Sampling(), rows[:1], rows[:1]).item() == 0


def test_stop_ids_end_a_row_early(tiny_folder):
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    engine = Engine(model, batch=3, max_seq_len=48)
    free = generate(engine, PROMPTS, max_new_tokens=12)
    stop = free[1][3]
    stopped = generate(engine, PROMPTS, max_new_tokens=12, stop_ids=frozenset({stop}))
    for full, cut in zip(free, stopped, strict=True):
        end = full.index(stop) + 1 if stop in full else len(full)
        assert cut == full[:end]


def test_presets_have_the_real_shapes():
    q8, q32, l8 = (ModelArgs.from_name(n) for n in ("qwen3-8b", "qwen3-32b", "llama-3.1-8b"))
    assert (q8.dim, q8.n_layers, q8.intermediate_size, q8.qk_norm) == (4096, 36, 12288, True)
    assert (q32.dim, q32.n_layers, q32.n_heads, q32.intermediate_size) == (5120, 64, 64, 25600)
    assert (l8.vocab_size, l8.intermediate_size, l8.rope_scaling["rope_type"]) == (
        128256, 14336, "llama3")


@pytest.mark.parametrize("name,params", [
    ("qwen3-8b", 8_190_735_360), ("qwen3-32b", 32_762_123_264),
    ("llama-3.1-8b", 8_030_261_248), ("smollm2-135m", 134_515_008),
])
def test_preset_parameter_counts_match_the_published_models(name, params):
    shapes = expected_shapes(ModelArgs.from_name(name))
    assert sum(math.prod(s) for s in shapes.values()) == params
