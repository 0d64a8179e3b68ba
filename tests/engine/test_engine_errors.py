"""Bad input gives one W12Error line naming the file, tensor or value; the CLI exits with 2."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from engine.generate import Engine, generate
from engine.model import ModelArgs
from engine.weights import load_model
from w12.errors import W12Error
from w12_cli.bench import bench_group
from w12_cli.generate import generate_command


def one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def edit_config(folder, **changes) -> None:
    config = json.loads((folder / "config.json").read_text())
    config.update(changes)
    for key in [k for k, v in changes.items() if v is None]:
        del config[key]
    (folder / "config.json").write_text(json.dumps(config))


def test_unknown_architecture(tiny_folder):
    folder = tiny_folder("llama")
    edit_config(folder, architectures=["MambaForCausalLM"], model_type="mamba")
    with pytest.raises(W12Error) as exc:
        load_model(folder)
    assert "config.json" in one_line(exc) and "'MambaForCausalLM' is not supported" in str(
        exc.value)


def test_unsupported_rope_type():
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_hidden_layers": 1,
              "num_attention_heads": 2, "intermediate_size": 16, "vocab_size": 10,
              "rope_scaling": {"rope_type": "longrope", "factor": 4.0}}
    with pytest.raises(W12Error, match="rope type 'longrope' is not supported"):
        ModelArgs.from_hf_config(config)


def test_missing_config_field(tiny_folder):
    folder = tiny_folder("qwen3")
    edit_config(folder, intermediate_size=None)
    with pytest.raises(W12Error, match="required field 'intermediate_size' is missing"):
        load_model(folder)


def test_missing_weight(tiny_folder):
    bias = "model.layers.1.self_attn.k_proj.bias"
    folder = tiny_folder("qwen2", state_edit=lambda state: state.pop(bias))
    with pytest.raises(W12Error) as exc:
        load_model(folder)
    assert "tensor model.layers.1.self_attn.k_proj.bias is missing" in one_line(exc)
    assert str(folder) in str(exc.value)


def test_untied_model_without_lm_head(tiny_folder):
    folder = tiny_folder("llama", state_edit=lambda s: s.pop("lm_head.weight"))
    with pytest.raises(W12Error, match="tensor lm_head.weight is missing"):
        load_model(folder)


def test_shape_mismatch_between_config_and_tensors(tiny_folder):
    def shrink(state):
        state["model.layers.0.mlp.up_proj.weight"] = state["model.layers.0.mlp.up_proj.weight"][:90]

    with pytest.raises(W12Error) as exc:
        load_model(tiny_folder("llama", state_edit=shrink))
    assert "model.layers.0.mlp.up_proj.weight has shape (90, 64)" in one_line(exc)
    assert "(96, 64)" in str(exc.value)


def test_not_a_folder(tmp_path):
    with pytest.raises(W12Error, match="not a folder"):
        load_model(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(W12Error, match="config.json: not valid JSON"):
        load_model(tmp_path)


def test_unknown_preset():
    with pytest.raises(W12Error, match="unknown model preset 'qwen9-1t'"):
        load_model("synthetic:qwen9-1t")


def test_prompt_longer_than_cache(tiny_folder):
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    engine = Engine(model, batch=1, max_seq_len=16)
    with pytest.raises(W12Error) as exc:
        generate(engine, [list(range(3, 18))], max_new_tokens=4)
    assert "15 tokens plus 4 new tokens needs 19 cache positions; the cache holds 16" in one_line(
        exc)


def test_step_past_the_cache_is_refused(tiny_folder):
    """A decode step that would write past the cache's last slot raises one clear error and
    leaves the cache as it was; rewinding lets the steps go on."""
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    engine = Engine(model, batch=1, max_seq_len=6)
    logits = engine.prefill([[3, 4, 5, 6]])
    for _ in range(2):  # slots 4 and 5
        logits = engine.step(logits.argmax(-1))
    cache = engine.cache.k.clone()
    with pytest.raises(W12Error) as exc:
        engine.step(logits.argmax(-1))
    assert "would write cache slot 6; the cache holds 6 positions" in one_line(exc)
    assert torch.equal(engine.cache.k, cache)
    engine.rewind(4)
    engine.step(logits.argmax(-1))
    with pytest.raises(W12Error):
        engine.rewind(6)


def test_token_outside_vocabulary(tiny_folder):
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    with pytest.raises(W12Error, match="token id 999 outside the vocabulary"):
        generate(Engine(model, batch=1, max_seq_len=16), [[3, 999]], max_new_tokens=2)


def test_w12_mode_needs_bf16_activations(tiny_folder):
    with pytest.raises(W12Error, match="bfloat16 activations"):
        load_model(tiny_folder("llama"), mode="w12", dtype=torch.float32)


def test_attention_kind_is_checked(tiny_folder):
    model = load_model(tiny_folder("llama"), dtype=torch.float32).model
    with pytest.raises(W12Error, match="attention must be one of auto, tree, torch, got 'flash'"):
        Engine(model, batch=1, max_seq_len=16, attention="flash")
    assert Engine(model, batch=1, max_seq_len=16).attention == "torch"  # "auto", float32
    with pytest.raises(W12Error, match="attention 'tree' runs bfloat16 activations"):
        Engine(model, batch=1, max_seq_len=16, attention="tree")
    bf16 = load_model(tiny_folder("llama", dtype=torch.bfloat16)).model
    assert Engine(bf16, batch=1, max_seq_len=16).attention == "tree"


def test_cli_maps_errors_to_exit_2(tiny_folder, tmp_path):
    runner = CliRunner()
    result = runner.invoke(generate_command, [str(tmp_path / "missing"), "--prompt", "hi"])
    assert result.exit_code == 2
    assert result.output.startswith("error: ") and result.output.count("\n") == 1
    result = runner.invoke(generate_command, [str(tiny_folder("llama")), "--prompt", "hi"])
    assert result.exit_code == 2 and "tokenizer.json: missing" in result.output
    result = runner.invoke(bench_group, ["decode", "synthetic:nope", "--device", "cpu"])
    assert result.exit_code == 2 and "unknown model preset" in result.output
    result = runner.invoke(bench_group, ["decode", "synthetic:tiny-qwen3", "--batch", "0"])
    assert result.exit_code == 2 and "positive integers" in result.output
    result = runner.invoke(bench_group, ["decode", "synthetic:tiny-qwen3", "--attention",
                                         "torch,flash"])
    assert result.exit_code == 2 and "comma-separated list of auto, tree, torch" in result.output
