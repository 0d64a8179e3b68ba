"""The tuning judges on the real engine.

Demo model (SmolLM2-135M-Instruct, CPU): the reference is plain decoding at batch 1; the stock
(BF16, decode step, batch 2) and the candidates are forced along it through their own steps.
A cache defect that only the decode and verify paths read is missed by the prefill path and
rejected through the decode and verify steps; a logit-bias defect is rejected; W12 speculative
decoding (verify step, chain and tree) and BF16 at another batch are accepted. Sizes are small
(4 prompts x 20 tokens, 2 calibration prompts) so this file stays fast; the notebook records
the full-size runs of ``w12 tune forcing``. Tiny synthetic preset: ``w12 tune explain`` and
``w12 tune prove``, on the CPU.
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
from spec_tuning import controller as ctl
from spec_tuning.controller import read_log
from spec_tuning.engine_adapter import (
    GenerationRunner,
    StepCosts,
    SystemSpec,
    group_profile,
    is_matmul,
    load_system,
    prompt_requests,
    step_costs,
)
from spec_tuning.engine_forcing import reference_decode
from spec_tuning.forcing import calibrate, judge
from spec_tuning.profiler import KernelTiming, StepProfile
from spec_tuning.prove import forcing_verdict
from w12_cli.tune import tune_group

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, CALIBRATION, TOKENS, DEFECT_AT, BATCH = 4, 2, 20, 4, 2


@pytest.fixture(scope="module")
def demo_bf16() -> Path:
    from converters.demo_models import demo_hf_folder

    return demo_hf_folder(progress=False)


@pytest.fixture(scope="module")
def demo_w12(demo_bf16, tmp_path_factory) -> Path:
    from converters.hf import ConvertOptions, convert_folder

    folder = tmp_path_factory.mktemp("demo") / "w12"
    convert_folder(src=demo_bf16, dst=folder, options=ConvertOptions(), progress=False)
    return folder


def _system(folder, **options):
    return load_system(SystemSpec(str(folder), **{"mode": "bf16", "batch": BATCH, **options}))


@pytest.fixture(scope="module")
def stock(demo_bf16):
    return _system(demo_bf16)


@pytest.fixture(scope="module")
def prompts(stock):
    requests, stop_ids, used = prompt_requests(stock.loaded, source="builtin")
    assert used == "builtin" and len(requests) >= PROMPTS + CALIBRATION
    return requests[:PROMPTS], requests[-CALIBRATION:], stop_ids


@pytest.fixture(scope="module")
def references(stock, prompts):
    judged, calibration, stop_ids = prompts
    return tuple(reference_decode(stock.model, [r["ids"] for r in rs], TOKENS,
                                  stop_ids=stop_ids) for rs in (judged, calibration))


@pytest.fixture(scope="module")
def reference(references):
    return references[0]


@pytest.fixture(scope="module")
def stock_judge(stock, references):
    """judge(candidate trace) against the stock, delta calibrated on the other prompts."""
    reference, cal_reference = references
    scorer = stock.scorer()
    calibration = calibrate(cal_reference, scorer.trace(cal_reference))
    stock_trace = scorer.trace(reference)
    return lambda trace: judge(reference, stock_trace, trace, calibration)


def _mismatches(trace, reference) -> int:
    return sum(int((t != r).sum()) for t, r in zip(trace.top1, reference.tokens, strict=True))


def test_reference_is_the_engines_plain_decoding(stock, prompts, reference):
    requests, _, stop_ids = prompts
    for row in (0, 1):
        engine = Engine(stock.model, batch=1, max_seq_len=len(requests[row]["ids"]) + TOKENS)
        out = generate(engine, [requests[row]["ids"]], max_new_tokens=TOKENS, stop_ids=stop_ids)
        assert out[0] == reference.tokens[row].tolist()
    assert all(len(m) == len(t) and (m >= 0).all()
               for m, t in zip(reference.margins, reference.tokens, strict=True))


@pytest.mark.parametrize("path", ["decode", "chain:4", "tree:5"])
def test_every_path_lines_up_with_the_reference(demo_bf16, reference, path):
    # at batch 1 the decode path is the reference's own; the verify step gives a node the bits
    # of a decode step, so an off-by-one in the forced positions is all that could differ
    trace = _system(demo_bf16, batch=1, path=path).scorer().trace(reference)
    assert _mismatches(trace, reference) == 0


def test_cache_defect_is_missed_by_prefill_and_rejected_through_the_steps(demo_bf16, stock,
                                                                           reference,
                                                                           stock_judge):
    slot = min(map(len, reference.prompts)) + 2  # every decode step reads a moved slot
    defect = f"kv-shift:{slot}"
    blind = _system(demo_bf16, path="prefill", defect=defect).scorer().trace(reference)
    clean = _system(demo_bf16, path="prefill").scorer().trace(reference)
    for a, b in zip(blind.top1, clean.top1, strict=True):
        assert np.array_equal(a, b)  # the prefill path never reads the cache
    for path in ("decode", "chain:4"):
        verdict = stock_judge(_system(demo_bf16, path=path, defect=defect).scorer()
                              .trace(reference))
        assert not verdict.accepted, verdict.report()


def test_logit_bias_defect_is_rejected(demo_bf16, stock, reference, stock_judge):
    defect = _system(demo_bf16, defect=f"logit-bias:{DEFECT_AT}")
    trace = defect.scorer().trace(reference)
    verdict = stock_judge(trace)
    assert not verdict.accepted, verdict.report()
    for cand, ref in zip(trace.top1, reference.tokens, strict=True):
        assert np.array_equal(cand[:DEFECT_AT], ref[:DEFECT_AT])  # untouched before P
    assert all(e.position >= DEFECT_AT for e in verdict.audit)


@pytest.mark.parametrize("path", ["chain:4", "tree:7"])
def test_w12_speculative_verify_is_accepted(demo_w12, reference, stock_judge, path):
    w12 = load_system(SystemSpec(str(demo_w12), batch=BATCH, path=path))
    assert w12.loaded.mode == "w12" and w12.model.layers[0].w13.is_w12
    verdict = stock_judge(w12.scorer().trace(reference))
    assert verdict.accepted, verdict.report()


def test_bf16_at_another_batch_is_accepted(demo_bf16, prompts, stock):
    judged, calibration, stop_ids = prompts
    other = _system(demo_bf16, batch=3)
    result = forcing_verdict(stock, other, judged, calibration, tokens=TOKENS, stop_ids=stop_ids)
    assert result.verdict.accepted, result.verdict.report()
    assert result.reference_tokens > PROMPTS * TOKENS // 2


def test_defect_that_cannot_fire_is_refused(demo_bf16):
    result = CliRunner().invoke(tune_group, [
        "forcing", str(demo_bf16), str(demo_bf16), "--defect", "logit-bias:16", "--tokens",
        "16", "--prompts", "2", "--calibration-prompts", "2", "--source", "builtin"])
    assert result.exit_code == 2 and "cannot fire" in result.output
    bad = CliRunner().invoke(tune_group, [
        "forcing", str(demo_bf16), str(demo_bf16), "--defect", "kv-shift:x", "--source",
        "builtin"])
    assert bad.exit_code == 2 and "use one of logit-bias:P" in bad.output


def test_generation_runner_counts_only_real_rows(stock, prompts):
    requests, _, _ = prompts
    runner = stock.runner(max_new=3)
    sample = runner.run(requests[:3])
    assert sample.tokens == 9 and sample.seconds > 0
    gen = GenerationRunner(stock.model, batch=2, max_new=3)
    first = gen.generate(requests[:3])
    assert [len(o) for o in first] == [3, 3, 3]


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
    assert "tau(8) not measured" in result.output
    assert all("warnings" in data["sizes"][n] for n in ("1", "4", "8"))
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
    assert "T_floor" in result.stdout and "N=1" in result.stdout


PROVE_SIZES = ["--prompts", "8", "--calibration-prompts", "2", "--tokens", "16",
               "--run-prompts", "2", "--run-tokens", "4", "--context", "32", "--device", "cpu"]


def test_prove_rejects_a_planted_defect_and_keeps_the_final_set_sealed(tmp_path):
    result = CliRunner().invoke(tune_group, [
        "prove", "synthetic:tiny-qwen3", "synthetic:tiny-qwen3", "--defect", "logit-bias:2",
        *PROVE_SIZES, "--out", str(tmp_path), "--json", str(tmp_path / "prove.json")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "prove.json").read_text())
    assert not data["tuning"]["forcing"]["verdict"]["accepted"] and "final" not in data
    assert "final set left sealed" in result.output
    assert not (tmp_path / "sealed.jsonl").exists()
    records = read_log(tmp_path / "controller.jsonl")
    decision = records[-1]
    assert decision["kind"] == "decision" and decision["outputs_differ"]
    assert decision["candidate_config"]["candidate"]["defect"] == "logit-bias:2"
    assert sum(r["kind"] == "sample" for r in records) == 2 + 4 * 20


@pytest.fixture
def decided(monkeypatch):
    """Replaces the timed paired runs by a decision on fixed log ratios (the controller has
    its own tests), so prove's branching is tested on a known outcome, not on this machine's
    timing."""

    def fix(gain: float) -> None:
        def compare(self, incumbent, candidate, requests, *, candidate_config):
            noise = 0.001 * np.random.default_rng(0).standard_normal((2, ctl.ROUNDS))
            return ctl.decide(math.log1p(gain) + noise[0], noise[1], outputs_differ=False)

        monkeypatch.setattr(ctl.Controller, "compare", compare)

    return fix


@pytest.mark.parametrize("gain", [0.0, 0.2])
def test_prove_w12_candidate_runs_every_judge(tmp_path, decided, gain):
    decided(gain)
    result = CliRunner().invoke(tune_group, [
        "prove", "synthetic:tiny-qwen3", "synthetic:tiny-qwen3", "--candidate-mode", "w12",
        "--candidate-batch", "2", "--path", "chain:3", *PROVE_SIZES, "--out", str(tmp_path),
        "--json", str(tmp_path / "prove.json")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "prove.json").read_text())
    assert data["tuning"]["forcing"]["verdict"]["accepted"]  # W12 is lossless
    assert data["cost_model"]["sizes"]["1"]["decomposition"]["tau"] == 1.0
    assert data["cost_model"]["mode"] == "w12" and data["cost_model"]["batch"] == 2
    assert data["tuning"]["decision"]["promote"] == (gain > 0)
    assert ("final" in data) == (gain > 0)
    assert (tmp_path / "sealed.jsonl").exists() == (gain > 0)
    if gain > 0:  # the held-out set was judged too, and its opening was logged once
        assert data["final"]["forcing"]["verdict"]["accepted"]
        lines = (tmp_path / "sealed.jsonl").read_text().splitlines()
        assert len(lines) == 1 and json.loads(lines[0])["kind"] == "final_access"


def test_prove_opens_the_final_set_once_for_a_passing_candidate(tmp_path, decided):
    decided(0.2)
    args = ["prove", "synthetic:tiny-qwen3", "synthetic:tiny-qwen3", "--candidate-batch", "4",
            *PROVE_SIZES, "--out", str(tmp_path), "--json", str(tmp_path / "prove.json")]
    result = CliRunner().invoke(tune_group, args)
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "prove.json").read_text())
    assert data["tuning"]["forcing"]["verdict"]["accepted"]
    assert data["final"]["forcing"]["verdict"]["accepted"] and "final (held-out)" in \
        result.output
    again = CliRunner().invoke(tune_group, args)
    assert again.exit_code == 2 and "already opened; pass --force-final" in again.output
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        forced = CliRunner().invoke(tune_group, args + ["--force-final"])
    assert forced.exit_code == 0, forced.output
    assert "final" in json.loads((tmp_path / "prove.json").read_text())
    accesses = [json.loads(line) for line in (tmp_path / "sealed.jsonl").read_text().splitlines()]
    assert [a["forced"] for a in accesses] == [False, True]
    assert any("opened again" in str(w.message) for w in caught)


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
