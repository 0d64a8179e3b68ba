"""The real demo model (SmolLM2-135M-Instruct): W12 text equals BF16 text, tokenizer, CLI, HF."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from engine.api import GenerateOptions, complete
from engine.tokenizer import Tokenizer
from engine.weights import load_model
from w12_cli.bench import bench_group
from w12_cli.generate import generate_command

PROMPT = "What is the capital of France?"


def test_w12_folder_generates_the_bf16_text(demo_bf16, demo_w12):
    # few tokens: on the CPU every W12 matmul decodes its whole weight first
    tokenizer = Tokenizer(demo_w12)
    options = GenerateOptions(max_new_tokens=4)
    bf16 = complete(load_model(demo_bf16), tokenizer, [PROMPT], options)
    w12_model = load_model(demo_w12)
    assert w12_model.mode == "w12" and w12_model.model.layers[0].w13.is_w12
    w12 = complete(w12_model, tokenizer, [PROMPT], options)
    assert w12 == bf16
    assert bf16[0].strip()


def test_tokenizer_matches_transformers(demo_bf16):
    transformers = pytest.importorskip("transformers")
    ours = Tokenizer(demo_bf16)
    theirs = transformers.AutoTokenizer.from_pretrained(demo_bf16)
    messages = [{"role": "user", "content": PROMPT}]
    expected = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert ours.render_chat(messages) == expected
    assert ours.encode_prompt(PROMPT, chat=True) == theirs(expected, add_special_tokens=False)[
        "input_ids"]
    text = "def add(a, b):\n    return a + b  # ünïcode ✓"
    assert ours.encode(text) == theirs(text)["input_ids"]
    assert ours.decode(ours.encode(text)) == text
    assert theirs.convert_tokens_to_ids("<|im_end|>") in ours.stop_ids


def test_cli_generate_streams_the_text(demo_bf16):
    options = GenerateOptions(max_new_tokens=12)
    expected = complete(load_model(demo_bf16), Tokenizer(demo_bf16), [PROMPT], options)[0]
    result = CliRunner().invoke(generate_command, [
        str(demo_bf16), "--prompt", PROMPT, "--max-new-tokens", "12", "--device", "cpu"])
    assert result.exit_code == 0, result.output
    assert result.output == expected + "\n"
    stop = expected.split()[2]
    result = CliRunner().invoke(generate_command, [
        str(demo_bf16), "--prompt", PROMPT, "--max-new-tokens", "12", "--stop", stop,
        "--device", "cpu"])
    assert result.exit_code == 0 and result.output == expected[: expected.index(stop)] + "\n"


def test_cli_bench_decode_times_both_modes(tmp_path):
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(bench_group, [
        "decode", "synthetic:tiny-qwen3", "--batch", "1,2", "--tokens", "4", "--warmup", "1",
        "--device", "cpu", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["results"]
    assert [(r["mode"], r["batch"]) for r in rows] == [
        ("bf16", 1), ("bf16", 2), ("w12", 1), ("w12", 2)]
    assert all(r["tokens_per_s"] > 0 and r["steps"] == 4 for r in rows)
    assert result.output.count("speedup") == 2 and "W12 frees" in result.output


def test_transformers_model_runs_w12_linears(demo_bf16, demo_w12):
    transformers = pytest.importorskip("transformers")
    from engine.hf_interop import load_w12_for_transformers, swap_in_w12_linears

    model = transformers.AutoModelForCausalLM.from_pretrained(demo_bf16, dtype=torch.bfloat16)
    tokens = torch.tensor([Tokenizer(demo_bf16).encode_prompt(PROMPT, chat=True)])
    with torch.no_grad():
        expected = model(tokens).logits
        reference = model.generate(tokens, max_new_tokens=2, do_sample=False)
    swapped = swap_in_w12_linears(model, demo_w12)
    assert len(swapped) == 30 * 7 and "model.layers.0.self_attn.q_proj" in swapped
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, expected)
        assert torch.equal(model.generate(tokens, max_new_tokens=2, do_sample=False), reference)
        assert torch.equal(load_w12_for_transformers(demo_w12)(tokens).logits, expected)


def test_summary_pairs_modes_and_attention_kinds():
    from engine.bench import DecodeTiming, summary

    def row(mode, attention, ms):
        return DecodeTiming(model="m", mode=mode, batch=1, steps=10, seconds=ms / 100,
                            ms_per_step=ms, tokens_per_s=1e3 / ms, weight_bytes=100,
                            streamed_bytes=100, weight_gbps=1.0, gpu_weight_bytes=None,
                            kv_bytes_per_token=10, cuda_graph=True, compiled=True,
                            attention=attention)

    lines = summary([row("bf16", "torch", 5.0), row("bf16", "tree", 4.0),
                     row("w12", "torch", 4.0), row("w12", "tree", 3.0)])
    assert "m batch 1: W12 250.0 tok/s vs BF16 200.0 tok/s -> speedup 1.250x" in lines
    assert ("m batch 1 [tree attention]: W12 333.3 tok/s vs BF16 250.0 tok/s -> "
            "speedup 1.333x") in lines
    assert "m bf16 batch 1: tree attention 4.000 ms/step vs torch 5.000 -> x1.250" in lines
    assert "m w12 batch 1: tree attention 3.000 ms/step vs torch 4.000 -> x1.333" in lines
    assert not any("prefill" in line for line in lines)  # not timed: no prefill line
    timed = [DecodeTiming(**{**vars(row(mode, "torch", ms)), "prefill_ms": pre})
             for mode, ms, pre in (("bf16", 5.0, 30.0), ("w12", 4.0, 20.0))]
    assert "m batch 1: prefill W12 20.00 ms vs BF16 30.00 ms -> x1.500" in summary(timed)
