"""The tuning judges on the real engine.

Tiny synthetic preset (``synthetic:tiny-qwen3``, random prompts, BF16 and W12, CPU): the
reference is the engine's plain decoding at batch 1; forcing through the decode, chain and tree
paths lines up with it; a cache defect (every write from slot 1 on lands one slot early, so
every decode and verify step reads a moved key) is missed by the prefill path and rejected
through the decode and verify steps; a logit-bias defect is rejected; W12 speculative decoding
(verify step, chain and tree) is accepted. One reference and one stock trace (BF16, batch 2)
serve every judgement of a model.

Demo model (SmolLM2-135M-Instruct, chat prompts), where real numerics matter: the same cache
defect is rejected through the decode step, and BF16 at another batch is accepted. Sizes are
small (4 prompts x 20 tokens, 2 calibration prompts); the notebook records the full-size runs
of ``w12 tune forcing``. ``w12 tune explain`` and ``w12 tune prove`` run on the tiny preset.
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
from spec_tuning.profiler import KernelTiming, StepProfile
from spec_tuning.prove import forcing_verdict, stock_baseline
from w12_cli.tune import tune_group

ROOT = Path(__file__).resolve().parents[2]
TINY = "synthetic:tiny-qwen3"
BATCH = 2  # the stock's serving batch
CACHE_DEFECT = "kv-shift:1"  # inside every prompt: every decode / verify step reads it
DEFECT_AT = 4  # logit-bias start position


class Bench:
    """A stock system and its baseline: the reference on judged and calibration prompts, the
    stock forced along both (``prove.stock_baseline``); candidates are judged against it."""

    def __init__(self, model: str, *, source: str, prompts: int, calibration: int,
                 tokens: int) -> None:
        self.model, self.tokens = model, tokens
        self.stock = self.system()
        requests, self.stop_ids, used = prompt_requests(self.stock.loaded, source=source,
                                                        count=prompts + calibration)
        assert used == source and len(requests) >= prompts + calibration
        self.judged, self.calibration = requests[:prompts], requests[-calibration:]
        self.baseline = stock_baseline(self.stock, self.judged, self.calibration,
                                       tokens=tokens, stop_ids=self.stop_ids)
        self.reference = self.baseline.reference

    def system(self, **options):
        return load_system(SystemSpec(self.model, **{"mode": "bf16", "batch": BATCH,
                                                     **options}))

    def trace(self, **options):
        return self.system(**options).scorer().trace(self.reference)

    def verdict(self, candidate):
        return forcing_verdict(self.stock, candidate, self.judged, self.calibration,
                               tokens=self.tokens, stop_ids=self.stop_ids,
                               baseline=self.baseline).verdict

    def mismatches(self, trace) -> int:
        return sum(int((t != r).sum()) for t, r in zip(trace.top1, self.reference.tokens,
                                                         strict=True))


@pytest.fixture(scope="module")
def tiny() -> Bench:
    return Bench(TINY, source="random", prompts=8, calibration=4, tokens=32)


@pytest.fixture(scope="module")
def demo() -> Bench:
    from converters.demo_models import demo_hf_folder

    folder = demo_hf_folder(progress=False)
    return Bench(str(folder), source="builtin", prompts=4, calibration=2, tokens=20)


def test_reference_is_the_engines_plain_decoding(tiny):
    ref = tiny.reference
    assert all(len(t) == tiny.tokens for t in ref.tokens)  # random prompts: no stop id
    for row in (0, 3):
        prompt = tiny.judged[row]["ids"]
        engine = Engine(tiny.stock.model, batch=1, max_seq_len=len(prompt) + tiny.tokens)
        out = generate(engine, [prompt], max_new_tokens=tiny.tokens, stop_ids=tiny.stop_ids)
        assert out[0] == ref.tokens[row].tolist()
    assert all(len(m) == len(t) and (m >= 0).all()
               for m, t in zip(ref.margins, ref.tokens, strict=True))


@pytest.mark.parametrize("path", ["decode", "chain:4", "tree:5"])
def test_every_path_lines_up_with_the_reference(tiny, path):
    # at batch 1 the decode path is the reference's own; the verify step gives a node the bits
    # of a decode step, so an off-by-one in the forced positions is all that could differ
    assert tiny.mismatches(tiny.trace(batch=1, path=path)) == 0


def test_cache_defect_is_missed_by_prefill_and_rejected_through_the_steps(tiny):
    blind = tiny.trace(path="prefill", defect=CACHE_DEFECT)
    clean = tiny.trace(path="prefill")
    for a, b in zip(blind.top1, clean.top1, strict=True):
        assert np.array_equal(a, b)  # the prefill path never reads the cache
    for path in ("decode", "chain:4"):
        verdict = tiny.verdict(tiny.system(path=path, defect=CACHE_DEFECT))
        assert not verdict.accepted, verdict.report()


def test_logit_bias_defect_is_rejected(tiny):
    defect = tiny.system(defect=f"logit-bias:{DEFECT_AT}")
    trace = defect.scorer().trace(tiny.reference)
    verdict = tiny.verdict(defect)
    assert not verdict.accepted, verdict.report()
    for cand, ref in zip(trace.top1, tiny.reference.tokens, strict=True):
        assert np.array_equal(cand[:DEFECT_AT], ref[:DEFECT_AT])  # untouched before P
    assert all(e.position >= DEFECT_AT for e in verdict.audit)


@pytest.mark.parametrize("path", ["chain:4", "tree:7"])
def test_w12_speculative_verify_is_accepted(tiny, path):
    w12 = tiny.system(mode="w12", path=path)
    assert w12.loaded.mode == "w12" and w12.model.layers[0].w13.is_w12
    verdict = tiny.verdict(w12)
    assert verdict.accepted, verdict.report()


def test_real_model_cache_defect_is_rejected_through_the_decode_step(demo):
    verdict = demo.verdict(demo.system(defect=CACHE_DEFECT))
    assert not verdict.accepted, verdict.report()


def test_real_model_bf16_at_another_batch_is_accepted(demo):
    verdict = demo.verdict(demo.system(batch=3))
    assert verdict.accepted, verdict.report()
    assert sum(map(len, demo.reference.tokens)) > len(demo.judged) * demo.tokens // 2


def test_defect_that_cannot_fire_is_refused():
    common = ["forcing", TINY, TINY, "--tokens", "16", "--prompts", "2",
              "--calibration-prompts", "2", "--source", "random", "--device", "cpu"]
    result = CliRunner().invoke(tune_group, common + ["--defect", "logit-bias:16"])
    assert result.exit_code == 2 and "cannot fire" in result.output
    far = CliRunner().invoke(tune_group, common + ["--defect", "kv-shift:4096"])
    assert far.exit_code == 2 and "cannot fire" in far.output
    bad = CliRunner().invoke(tune_group, common + ["--defect", "kv-shift:x"])
    assert bad.exit_code == 2 and "use one of logit-bias:P" in bad.output


def test_generation_runner_counts_only_real_rows(tiny):
    runner = tiny.stock.runner(max_new=3)
    sample = runner.run(tiny.judged[:3])
    assert sample.tokens == 9 and sample.seconds > 0
    gen = GenerationRunner(tiny.stock.model, batch=2, max_new=3)
    first = gen.generate(tiny.judged[:3])
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
