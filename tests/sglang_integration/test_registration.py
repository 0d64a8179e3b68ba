"""Registration without patching SGLang: the plugin entry point and the ``w12 serve`` launcher."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from w12.errors import W12Error

PLUGIN = "sglang_integration.plugin:register"


@pytest.fixture
def unregistered(monkeypatch):
    """SGLang's registry and ``--quantization`` choices without W12, restored afterwards."""
    from sglang.srt.layers import quantization
    from sglang.srt.server_args import QUANTIZATION_CHOICES

    saved = list(QUANTIZATION_CHOICES)
    monkeypatch.delitem(quantization.QUANTIZATION_METHODS, "w12", raising=False)
    QUANTIZATION_CHOICES[:] = [c for c in QUANTIZATION_CHOICES if c != "w12"]
    yield quantization.QUANTIZATION_METHODS, QUANTIZATION_CHOICES
    QUANTIZATION_CHOICES[:] = saved


def test_register_adds_w12_once(unregistered):
    from sglang.srt.server_args import ServerArgs

    from sglang_integration.method import W12Config
    from sglang_integration.plugin import register

    methods, choices = unregistered
    register()
    register()
    assert methods["w12"] is W12Config
    assert choices.count("w12") == 1
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    assert parser.parse_args(["--model-path", "m", "--quantization", "w12"]).quantization == "w12"


def test_sglang_loads_the_plugin_through_its_entry_point(unregistered):
    from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group

    ours = [ep for ep in entry_points(group=GENERAL_PLUGINS_GROUP) if ep.value == PLUGIN]
    assert ours, (f"no '{GENERAL_PLUGINS_GROUP}' entry point '{PLUGIN}': pyproject.toml must "
                  f"declare it and the package must be (re)installed")
    function, _ = load_plugins_by_group(GENERAL_PLUGINS_GROUP)[ours[0].name]
    function()
    methods, choices = unregistered
    assert "w12" in methods and "w12" in choices


def test_register_checks_the_sglang_release():
    from sglang_integration.plugin import check_version

    check_version("0.5.21")
    check_version("0.5.21.post1")
    with pytest.raises(W12Error, match="needs SGLang 0.5.21, found 0.5.22"):
        check_version("0.5.22")


def test_serve_refuses_an_unknown_entry():
    from sglang_integration.serve import serve

    with pytest.raises(W12Error, match="unknown SGLang entry 'launch'"):
        serve(entry="launch", sglang_args=[])


def test_serve_says_when_sglang_is_missing(monkeypatch):
    from sglang_integration import serve as module

    monkeypatch.setattr(module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(W12Error, match="SGLang is not installed"):
        module.serve(sglang_args=[])


def _run(code: str, env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


@pytest.mark.parametrize("entry", ["serve", "bench_one_batch"])
def test_w12_serve_offers_w12_to_sglang(entry, subprocess_env):
    code = ("from sglang_integration.serve import serve; "
            f"serve(entry={entry!r}, sglang_args=['--help'])")
    usage = _run(code, subprocess_env)
    quantization = usage[usage.index("--quantization {"):]
    assert "w12" in quantization[: quantization.index("}")].split(",")


def test_spawned_workers_register_w12(subprocess_env):
    subprocess_env["PYTHONPATH"] += os.pathsep + str(Path(__file__).parent)
    # what 'python -m sglang_integration.launch probe' does, with a probe as SGLang's entry
    code = ("import runpy, sys; import sglang_integration.serve as s; "
            "s.ENTRIES['probe'] = ('spawn_probe', 'main', ()); sys.argv = ['launch', 'probe']; "
            "runpy.run_module('sglang_integration.launch', run_name='__main__', alter_sys=True)")
    assert "worker registered w12: True" in _run(code, subprocess_env)
