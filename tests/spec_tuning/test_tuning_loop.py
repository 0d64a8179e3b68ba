"""The tuning loop on the CPU: real judges on a tiny synthetic target."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from spec_tuning import registry
from spec_tuning.controller import Decision
from spec_tuning.loop import Deployment, Tuner
from spec_tuning.memory import Entry, Memory
from spec_tuning.stats import RatioBound
from w12.errors import W12Error
from w12_cli.main import main

MODEL = "synthetic:tiny-qwen3"


def _tuner(tmp_path, **over):
    deployment = Deployment(MODEL, "ngram", prompts=16, tokens=6, context=32)
    return Tuner(deployment, out_dir=tmp_path / "out", memory=Memory(tmp_path / "memory.json"),
                 **over)


def _faster(*_args, **_kwargs) -> Decision:
    """A controller verdict of +20% (lower bound +15%): what a faster mechanism would get."""
    bound = RatioBound(gain=0.2, lower=0.15, log_mean=0.18, log_std_error=0.02, pairs=20)
    return Decision(True, "gain +20.00% (stand-in)", bound, bound, 0.01, 0.03, True)


def test_token_forcing_rejects_a_faster_mechanism_that_changes_outputs(tmp_path):
    """A planted logit bias (a test fixture mechanism) that the controller would promote is
    rejected by token forcing, and the memory records why."""
    tuner = _tuner(tmp_path, compare=_faster, forcing_prompts=6)
    stock = registry.stock_config("single")
    trial = tuner.judge(stock, "defect", "logit-bias:1")
    assert trial.verdict == "rejected" and trial.judge == "forcing", trial.reason
    assert not trial.evidence["forcing"]["accepted"]
    clean = tuner.judge(stock, "budget", 8)  # lossless: forcing passes it
    assert clean.verdict == "promoted", clean.reason
    assert clean.evidence["forcing"]["accepted"]


def test_two_level_verification_is_a_loop_option(tmp_path):
    """The loop applies two-level verification (its Q pass on the view of the deployment's
    model) and judges it: lossless, so token forcing passes it and a faster verdict promotes
    it."""
    from spec_tuning.loop import supported

    assert "two_level" in supported()
    tuner = _tuner(tmp_path, compare=_faster, forcing_prompts=6)
    current = registry.check_config({"weights": "w12"})
    trial = tuner.judge(current, "two_level", 4)
    assert trial.verdict == "promoted", trial.reason
    assert trial.evidence["forcing"]["accepted"]
    server = tuner.systems._server({**current, "two_level": 4})
    assert server.runner.two_level.q_budget == 4


def test_the_controller_rejects_a_lossless_but_slower_mechanism(tmp_path):
    """128 chain nodes a step where 16 accept as much: every step reads 8x the rows; the
    paired runs (the real controller) see it slower and keep the current configuration."""
    tuner = _tuner(tmp_path)
    trial = tuner.judge(registry.stock_config("single"), "budget", 128)
    assert trial.verdict == "rejected" and trial.judge == "controller", trial.reason
    assert trial.evidence["gain"] < 0
    log = (tmp_path / "out" / "controller.jsonl").read_text().splitlines()
    assert json.loads(log[-1])["kind"] == "decision"


def test_memory_leads_come_first_and_bad_ones_are_skipped(tmp_path):
    tuner = _tuner(tmp_path, trials=3)
    for option, value in (("budget", 32), ("budget", 999), ("compile", True), ("patch", "ab")):
        tuner.memory.add(Entry("acceptance" if option != "compile" else "overhead", "single",
                               "cpu", option, value, "promoted", "earlier deployment"))
    got = tuner._candidates("acceptance", registry.stock_config("single"))
    assert got[0] == ("budget", 32, "memory")  # the lead, then the registry's
    assert all(source == "registry" for _, _, source in got[1:]) and len(got) == 3
    assert ("budget", 999) not in [(o, v) for o, v, _ in got]  # outside the domain
    # compile does nothing useful on a CPU: neither the lead nor the registry proposes it
    assert tuner._candidates("overhead", registry.stock_config("single")) == []


def test_tune_run_end_to_end(tmp_path):
    """One round through the command line: measured, a factor picked, proposals judged by the
    real controller and token forcing, each judgement in the memory, the report and chart."""
    out, memory = tmp_path / "run", tmp_path / "memory.json"
    result = CliRunner().invoke(main, [
        "tune", "run", MODEL, "--drafter", "ngram", "--rounds", "1", "--trials", "1",
        "--prompts", "16", "--tokens", "6", "--context", "32", "--out", str(out),
        "--memory", str(memory)])
    assert result.exit_code == 0, result.output
    assert "round 1: stock:" in result.output and "best:" in result.output
    data = json.loads((out / "tune.json").read_text())
    trials = data["rounds"][0]["trials"]
    assert len(trials) == 1 and trials[0]["judge"] in ("controller", "forcing")
    assert set(data["rounds"][0]["factors"]) == set(registry.FACTORS)
    entries = Memory(memory).entries
    assert len(entries) == 1 and entries[0].option == trials[0]["option"]
    assert entries[0].evidence["deployment"]["model"] == MODEL
    assert (out / "rounds.png").stat().st_size > 0
    if data["best"] != data["stock"]:  # a promotion opened the sealed final, once
        assert "sealed final (" in result.output
        assert len((out / "sealed.jsonl").read_text().splitlines()) == 1


def test_deployment_modes_are_checked():
    assert Deployment(MODEL, "ngram", mode="batch:4").serving == ("batch", 4)
    for bad in ("batch", "batch:1", "pairs:2"):
        with pytest.raises(W12Error, match="serving mode"):
            _ = Deployment(MODEL, "ngram", mode=bad).serving
