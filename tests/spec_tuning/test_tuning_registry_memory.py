"""The tuning loop's registry of mechanisms and its memory file (CPU)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from spec_tuning import memory as mem
from spec_tuning import registry
from w12.errors import W12Error
from w12_cli.main import main


def test_every_option_sets_a_real_runtime_parameter():
    assert registry.check_targets() == []
    for m in registry.REGISTRY.values():
        assert m.stock in m.domain and m.factor in registry.FACTORS, m.name


def test_configs_are_checked_against_domains_modes_and_requirements():
    assert registry.check_config({}, "single") == registry.stock_config("single")
    assert "shared_budget" not in registry.stock_config("single")
    with pytest.raises(W12Error, match="not one of"):
        registry.check_config({"budget": 5})
    with pytest.raises(W12Error, match="batch serving, not single"):
        registry.check_config({"admission": 256}, "single")
    with pytest.raises(W12Error, match="needs weights='w12'"):
        registry.check_config({"two_level": 8})
    assert registry.check_config({"two_level": 8, "weights": "w12"})["two_level"] == 8
    with pytest.raises(W12Error, match="smaller than the budget 8"):
        registry.check_config({"two_level": 8, "weights": "w12", "budget": 8})
    with pytest.raises(W12Error, match="single serving, not batch"):
        registry.check_config({"two_level": 4, "weights": "w12"}, "batch")
    with pytest.raises(W12Error, match="no option 'lm_head'"):
        registry.check_config({"lm_head": "int8"})


def test_proposals_attack_the_named_factor_and_keep_the_config_valid():
    tree = registry.proposals("acceptance", "single", {})
    assert ("tree", True) in tree and ("budget", 16) not in tree
    assert all(registry.REGISTRY[name].factor == "acceptance" for name, _ in tree)
    # two-level verification is proposed only once the weights are W12
    assert registry.proposals("kernels", "single", {}) == [("weights", "w12")]
    assert ("two_level", 8) in registry.proposals("kernels", "single", {"weights": "w12"})
    # batching policies only when serving several requests; a shared budget needs a tree
    batch = registry.proposals("acceptance", "batch", {})
    assert ("shared_budget", 64) not in batch
    assert ("shared_budget", 64) in registry.proposals("acceptance", "batch", {"tree": True})
    with pytest.raises(W12Error, match="factor"):
        registry.proposals("memory", "single", {})


def _entry(**over):
    base = dict(factor="acceptance", mode="single", gpu="NVIDIA H200", option="tree", value=True,
                verdict="promoted", reason="gain 12% >= bar 3%",
                evidence={"gain": 0.12, "gain_low": 0.08, "forcing": "pass"},
                date="2026-12-07", commit="abc1234")
    return mem.Entry(**{**base, **over})


def test_memory_round_trip_dedup_and_leads(tmp_path):
    path = tmp_path / "memory.json"
    memory = mem.Memory(path)
    assert memory.entries == []
    assert memory.add(_entry()) and not memory.add(_entry())  # the same judgement once
    memory.add(_entry(gpu="NVIDIA H100 80GB HBM3", option="budget", value=32))
    memory.add(_entry(verdict="rejected", option="budget", value=128, reason="slower"))
    memory.add(_entry(option="widths", value=(8, 12, 16), mode="batch"))
    memory.save()
    again = mem.Memory(path)
    assert [e.id for e in again.entries] == [e.id for e in memory.entries]
    assert again.entries[3].value == (8, 12, 16)  # tuples survive JSON
    leads = again.leads("acceptance", "single", gpu="NVIDIA H100 80GB HBM3")
    assert [(e.option, e.value) for e in leads] == [("budget", 32), ("tree", True)]
    assert again.find(leads[0].id[:6]) == leads[0]
    with pytest.raises(W12Error, match="no memory entries"):
        again.find("zzzz")


def test_memory_refuses_foreign_newer_and_malformed_files(tmp_path):
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"format": "something-else", "entries": []}))
    with pytest.raises(W12Error, match="not a w12-tune-memory file"):
        mem.Memory(other)
    with pytest.raises(W12Error, match="not a w12-tune-memory file"):
        mem.write_entries(other, [_entry()])  # never overwritten
    assert "something-else" in other.read_text()
    newer = tmp_path / "newer.json"
    newer.write_text(json.dumps({"format": mem.FORMAT, "version": mem.VERSION + 1}))
    with pytest.raises(W12Error, match="reads up to"):
        mem.Memory(newer)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": mem.FORMAT, "version": 1,
                               "entries": [{**json.loads(json.dumps(_entry().__dict__)),
                                            "verdict": "maybe"}]}))
    with pytest.raises(W12Error, match="verdict 'maybe'"):
        mem.Memory(bad)
    garbled = tmp_path / "garbled.json"
    garbled.write_text("{")
    with pytest.raises(W12Error, match="not a readable memory file"):
        mem.Memory(garbled)


def test_memory_commands(tmp_path):
    path = tmp_path / "m.json"
    memory = mem.Memory(path)
    memory.add(_entry())
    memory.add(_entry(verdict="rejected", option="budget", value=128, reason="slower"))
    memory.save()
    run = CliRunner().invoke
    out = run(main, ["tune", "memory", "list", "--memory", str(path)])
    assert out.exit_code == 0 and "promoted" in out.output and "budget=128" in out.output
    assert "+12.0% (>= +8.0%)" in out.output
    shown = run(main, ["tune", "memory", "show", memory.entries[0].id[:8], "--memory", str(path)])
    assert shown.exit_code == 0 and json.loads(shown.output)["reason"] == "gain 12% >= bar 3%"
    shared = tmp_path / "shared.json"
    out = run(main, ["tune", "memory", "export", str(shared), "--promoted-only",
                     "--memory", str(path)])
    assert out.exit_code == 0 and "1 of 2 entries" in out.output
    out = run(main, ["tune", "memory", "export", str(shared), "--memory", str(path)])
    assert out.exit_code == 2 and "--force" in out.output
    fresh = tmp_path / "fresh.json"
    out = run(main, ["tune", "memory", "import", str(shared), "--memory", str(fresh)])
    assert out.exit_code == 0 and "1 new entries" in out.output
    assert [e.option for e in mem.Memory(fresh).entries] == ["tree"]
    out = run(main, ["tune", "memory", "import", str(shared), "--memory", str(fresh)])
    assert "0 new entries" in out.output
    empty = run(main, ["tune", "memory", "list", "--memory", str(tmp_path / "none.json")])
    assert empty.exit_code == 0 and "no entries" in empty.output
