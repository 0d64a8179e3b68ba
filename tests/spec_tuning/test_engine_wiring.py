"""The tuning judges on the real engine.

Demo model (SmolLM2-135M-Instruct, CPU): greedy reference decoding through the engine, the
stock system teacher-forced along it, and three candidates: a planted defect from position
P = 4 (rejected), a W12 folder made by the converter (accepted), and a second load of the same
BF16 model (accepted). Sizes are small (16 prompts x 32 tokens) so this file stays fast;
``lab/tune_demo.py`` runs the full-size version. Tiny synthetic preset: ``w12 tune explain``
and ``w12 tune prove``, on the CPU.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from engine.generate import Engine, generate
from spec_tuning.controller import read_log
from spec_tuning.engine_adapter import (
    EngineGreedy,
    GenerationRunner,
    StepCosts,
    SystemSpec,
    forced_logits,
    greedy_reference,
    group_profile,
    is_matmul,
    load_system,
    prompt_requests,
    step_costs,
)
from spec_tuning.forcing import build_reference, judge
from spec_tuning.profiler import KernelTiming, StepProfile
from spec_tuning.prove import forcing_verdict
from w12_cli.tune import tune_group

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, TOKENS, DEFECT_AT = 16, 32, 4


@pytest.fixture(scope="module")
def demo_bf16() -> Path:
    from converters.demo_models import demo_hf_folder

    return demo_hf_folder(progress=False)


@pytest.fixture(scope="module")
def stock(demo_bf16):
    return load_system(SystemSpec(str(demo_bf16), mode="bf16"))


@pytest.fixture(scope="module")
def prompts(stock):
    requests, stop_ids, used = prompt_requests(stock.loaded, source="builtin")
    assert used == "builtin" and len(requests) >= PROMPTS
    return requests[:PROMPTS], stop_ids


@pytest.fixture(scope="module")
def reference(stock, prompts):
    requests, stop_ids = prompts
    return greedy_reference(stock.model, [r["ids"] for r in requests], TOKENS, stop_ids=stop_ids)


@pytest.fixture(scope="module")
def stock_trace(stock, reference):
    return stock.scorer().trace(reference)


def _mismatch_rate(trace, reference) -> float:
    wrong = sum(int((t != r).sum()) for t, r in zip(trace.top1, reference.tokens, strict=True))
    return wrong / sum(len(r) for r in reference.tokens)


def test_reference_is_the_engines_greedy_generation(stock, prompts, reference):
    requests, stop_ids = prompts
    decoder = EngineGreedy(stock.model, stop_ids)  # the GreedyDecoder Protocol, batch 1
    for row in (0, 1):
        engine = Engine(stock.model, batch=1, max_seq_len=len(requests[row]["ids"]) + TOKENS)
        out = generate(engine, [requests[row]["ids"]], max_new_tokens=TOKENS, stop_ids=stop_ids)
        assert out[0] == decoder.greedy(requests[row]["ids"], TOKENS)[0].tolist()
    # Batched rows may leave the batch-1 path only where the batch's numerics flip a near-tie.
    single = build_reference(decoder, reference.prompts[:6], TOKENS)
    for ids, margins, ref_ids, ref_margins in zip(single.tokens, single.margins,
                                                  reference.tokens, reference.margins,
                                                  strict=False):  # 6 of 16 rows
        n = min(len(ids), len(ref_ids))
        diverged = np.flatnonzero(ids[:n] != ref_ids[:n])
        if diverged.size:
            first = diverged[0]
            assert max(margins[first], ref_margins[first]) <= 0.25
        else:
            assert len(ids) == len(ref_ids)
    assert all(len(m) == len(t) and (m >= 0).all()
               for m, t in zip(reference.margins, reference.tokens, strict=True))


def test_forced_scoring_lines_up_with_the_reference(stock, reference, stock_trace):
    # an off-by-one in the forced positions would give a mismatch rate near 100%
    assert _mismatch_rate(stock_trace, reference) < 0.05
    steps = stock.scorer(method="steps").trace(reference)
    assert _mismatch_rate(steps, reference) < 0.01  # the decode path reproduces its own tokens


def test_planted_defect_is_rejected(demo_bf16, stock, reference, stock_trace):
    defect = load_system(SystemSpec(str(demo_bf16), mode="bf16", planted_defect=DEFECT_AT))
    trace = defect.scorer().trace(reference)
    verdict = judge(reference, stock_trace, trace)
    assert not verdict.accepted, verdict.report()
    assert verdict.excess_lower > 0.005 and verdict.margin_p < 0.05
    for cand, base in zip(trace.top1, stock_trace.top1, strict=True):
        assert np.array_equal(cand[:DEFECT_AT], base[:DEFECT_AT])  # untouched before P
    assert any(not np.array_equal(c, b) for c, b in zip(trace.top1, stock_trace.top1,
                                                         strict=True))
    assert all(e.position >= DEFECT_AT for e in verdict.audit)


def test_identical_system_is_accepted(demo_bf16, stock, prompts):
    requests, stop_ids = prompts
    again = load_system(SystemSpec(str(demo_bf16), mode="bf16"))
    result = forcing_verdict(stock, again, requests, tokens=TOKENS, stop_ids=stop_ids)
    assert result.verdict.accepted, result.verdict.report()
    assert result.verdict.excess == 0.0 and result.reference_tokens > PROMPTS * TOKENS // 2


def test_w12_folder_is_accepted_against_bf16(demo_bf16, stock, reference, stock_trace,
                                             tmp_path_factory):
    from converters.hf import ConvertOptions, convert_folder

    folder = tmp_path_factory.mktemp("demo") / "w12"
    convert_folder(src=demo_bf16, dst=folder, options=ConvertOptions(), progress=False)
    w12 = load_system(SystemSpec(str(folder)))
    assert w12.loaded.mode == "w12" and w12.model.layers[0].w13.is_w12
    trace = w12.scorer().trace(reference)
    verdict = judge(reference, stock_trace, trace)
    assert verdict.accepted, verdict.report()
    # On the CPU the W12 op decodes the exact BF16 weights and runs the same matmul.
    for cand, base in zip(trace.top1, stock_trace.top1, strict=True):
        assert np.array_equal(cand, base)


def test_generation_runner_counts_only_real_rows(stock, prompts):
    requests, _ = prompts
    runner = stock.runner(max_new=3)
    sample = runner.run(requests[:3])
    assert sample.tokens == 9 and sample.seconds > 0
    gen = GenerationRunner(stock.model, batch=2, max_new=3)
    first = gen.generate(requests[:3])
    assert [len(o) for o in first] == [3, 3, 3]
    forced_logits(stock.model, [requests[0]["ids"]], [[1, 2]])  # replaces the model's cache
    assert gen.generate(requests[:3]) == first  # the runner rebuilt its engine


def test_step_costs_count_the_models_linears():
    from engine.weights import load_model

    model = load_model("synthetic:tiny-qwen3").model
    params = sum(m.weight.numel() for m in model.modules()
                 if hasattr(m, "in_features") and m.weight is not None)
    costs = step_costs(model, batch=2, n_tokens=3, kv_tokens=40)
    assert costs.linear_flops == 2 * 2 * 3 * params
    a = model.args
    assert costs.kv_bytes == 2 * a.n_layers * 2 * a.kv_size * 40 * 2
    assert costs.weight_bytes >= 2 * params  # BF16 weights, plus the norms


def test_group_profile_assigns_costs_to_matmuls_and_the_rest():
    costs = StepCosts(1000, 100, 10, 5, 2000, 200)
    kernels = [KernelTiming("nvjet_sm90_tst_64x16", 3e-6, 4), KernelTiming("aten::bmm", 1e-6, 2),
               KernelTiming("triton_poi_fused_add_0", 2e-6, 8), KernelTiming("w12_gemm_kernel",
                                                                             5e-6, 1)]
    grouped = group_profile(StepProfile(2e-5, kernels, "test"), costs)
    mm, rest = grouped.kernels
    assert mm.seconds == pytest.approx(9e-6) and mm.cost.bytes == 1110 and mm.cost.flops == 2200
    assert rest.seconds == pytest.approx(2e-6) and rest.cost.bytes == 5
    assert not is_matmul("triton_red_fused_rms_norm_1") and is_matmul("void gemv2T_kernel")
    only = group_profile(StepProfile(1e-5, kernels[2:3], "test"), costs)
    assert len(only.kernels) == 1 and only.kernels[0].cost.bytes == 1115


def test_explain_cli_on_a_tiny_preset(tmp_path):
    out, png = tmp_path / "explain.json", tmp_path / "chart.png"
    args = ["explain", "synthetic:tiny-qwen3", "--batch", "1", "--device", "cpu", "--context",
            "48", "--tree-sizes", "1,4,8", "--tau", "4=2.5", "--rank-accept", "0.7,0.2",
            "--json", str(out)]
    has_plot = _has_matplotlib()
    result = CliRunner().invoke(tune_group, args + (["--png", str(png)] if has_plot else []))
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["peaks"]["bandwidth"] > 0 and data["t_ar"] == data["sizes"]["1"]["t_step"]
    for n in ("1", "4"):
        d = data["sizes"][n]["decomposition"]
        assert math.prod(d["factors"].values()) == pytest.approx(d["ceiling"] / d["speedup"])
        assert d["t_floor"] > 0 and d["t_prof"] > 0
    assert data["sizes"]["1"]["decomposition"]["tau"] == 1.0
    assert "decomposition" not in data["sizes"]["8"]  # tau(8) was not given
    assert "tau(8) not measured" in result.output and result.output.count("check:") == 2
    if has_plot:
        assert (tmp_path / "chart-N1.png").stat().st_size > 0
        assert (tmp_path / "chart-N4.png").stat().st_size > 0


def test_explain_errors_are_one_line():
    result = CliRunner().invoke(tune_group, ["explain", "synthetic:tiny-qwen3", "--device",
                                             "cpu", "--tau", "4=2"])
    assert result.exit_code == 2 and "error: --tau given for tree sizes [4]" in result.output
    result = CliRunner().invoke(tune_group, ["forcing", "synthetic:tiny-qwen3",
                                             "synthetic:tiny-qwen3", "--source", "humaneval",
                                             "--device", "cpu"])
    assert result.exit_code == 2 and "has no tokenizer.json" in result.output


def test_module_entry_point_explains_on_cpu():
    result = subprocess.run(
        [sys.executable, "-m", "w12_cli", "tune", "explain", "synthetic:tiny-qwen3", "--batch",
         "1", "--device", "cpu", "--context", "32"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "T_floor" in result.stdout and "check: acceptance x kernels x overhead" in \
        result.stdout


def test_prove_rejects_a_planted_defect_and_keeps_the_final_set_sealed(tmp_path):
    result = CliRunner().invoke(tune_group, [
        "prove", "synthetic:tiny-qwen3", "synthetic:tiny-qwen3", "--planted-defect", "2",
        "--prompts", "12", "--tokens", "24", "--run-prompts", "2", "--run-tokens", "4",
        "--context", "32", "--device", "cpu", "--out", str(tmp_path), "--json",
        str(tmp_path / "prove.json")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "prove.json").read_text())
    assert not data["tuning"]["forcing"]["verdict"]["accepted"] and "final" not in data
    assert "final set left sealed" in result.output
    assert not (tmp_path / "sealed.jsonl").exists()
    records = read_log(tmp_path / "controller.jsonl")
    decision = records[-1]
    assert decision["kind"] == "decision" and decision["outputs_differ"]
    assert decision["candidate_config"]["candidate"]["planted_defect"] == 2
    assert sum(r["kind"] == "sample" for r in records) == 2 + 4 * 20


def test_prove_w12_candidate_runs_every_judge(tmp_path):
    result = CliRunner().invoke(tune_group, [
        "prove", "synthetic:tiny-qwen3", "synthetic:tiny-qwen3", "--candidate-mode", "w12",
        "--candidate-batch", "2", "--prompts", "12", "--tokens", "24", "--run-prompts", "2",
        "--run-tokens", "4", "--context", "32", "--device", "cpu", "--out", str(tmp_path),
        "--json", str(tmp_path / "prove.json")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "prove.json").read_text())
    assert data["tuning"]["forcing"]["verdict"]["accepted"]  # W12 is lossless
    assert data["cost_model"]["sizes"]["1"]["decomposition"]["tau"] == 1.0
    assert data["cost_model"]["mode"] == "w12" and data["cost_model"]["batch"] == 2
    promoted = data["tuning"]["decision"]["promote"]  # a timing outcome: either is valid
    assert ("final" in data) == promoted
    assert (tmp_path / "sealed.jsonl").exists() == promoted
    if promoted:  # the held-out set was judged too, and its opening was logged once
        assert data["final"]["forcing"]["verdict"]["accepted"]
        lines = (tmp_path / "sealed.jsonl").read_text().splitlines()
        assert len(lines) == 1 and json.loads(lines[0])["kind"] == "final_access"


def test_prove_opens_the_final_set_once_for_a_passing_candidate(tmp_path):
    # Four requests per engine batch against one: far faster on any machine, same tokens.
    args = ["prove", "synthetic:tiny-qwen3", "synthetic:tiny-qwen3", "--candidate-batch", "4",
            "--prompts", "8", "--tokens", "16", "--run-prompts", "4", "--run-tokens", "4",
            "--context", "32", "--device", "cpu", "--out", str(tmp_path), "--json",
            str(tmp_path / "prove.json")]
    result = CliRunner().invoke(tune_group, args)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "prove.json").read_text())
    assert data["tuning"]["forcing"]["verdict"]["accepted"]
    if not data["tuning"]["decision"]["promote"]:
        pytest.skip(f"not promoted on this machine: {data['tuning']['decision']['reason']}")
    assert data["final"]["forcing"]["verdict"]["accepted"] and "final (held-out)" in \
        result.output
    again = CliRunner().invoke(tune_group, args)
    assert again.exit_code == 2 and "already opened; pass --force-final" in again.output
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forced = CliRunner().invoke(tune_group, args + ["--force-final"])
    assert forced.exit_code == 0, forced.output
    looked_again = "final" in json.loads((tmp_path / "prove.json").read_text())
    accesses = [json.loads(line) for line in (tmp_path / "sealed.jsonl").read_text().splitlines()]
    assert [a["forced"] for a in accesses] == ([False, True] if looked_again else [False])
    assert any("opened again" in str(w.message) for w in caught) == looked_again


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_forced_logits_match_single_row_forwards(stock, reference):
    # right padding in a batch must not change a row's logits beyond rounding of other shapes
    rows = forced_logits(stock.model, reference.prompts[:2], reference.tokens[:2])
    alone = forced_logits(stock.model, reference.prompts[:1], reference.tokens[:1])[0]
    assert rows[0].shape == (len(reference.tokens[0]), stock.model.args.vocab_size)
    agree = (rows[0].argmax(-1) == alone.argmax(-1)).float().mean().item()
    assert agree >= 0.95
