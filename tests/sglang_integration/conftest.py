"""Fixtures for the SGLang plugin tests: SGLang on a CPU machine and a converted checkpoint.

SGLang must be installed (CI installs the pinned release): without it every test here fails
with the install command instead of being skipped. Its import needs torchvision, whose PyPI
builds need CUDA; ``cpu_site/sglang_cpu_stubs`` stands in for it when it is missing, and test
subprocesses get the same through ``cpu_site/sitecustomize.py`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

CPU_SITE = Path(__file__).parent / "cpu_site"
sys.path.insert(0, str(CPU_SITE))

import sglang_cpu_stubs  # noqa: E402

INSTALL = ("pip install --no-deps sglang==0.5.21 && pip install -r "
           "tests/sglang_integration/requirements.txt")


@pytest.fixture(autouse=True, scope="module")
def sglang_on_cpu():
    """Fail (never skip) without SGLang; stub torchvision only while these tests run."""
    if importlib.util.find_spec("sglang") is None:
        pytest.fail(f"SGLang is not installed; the SGLang plugin tests need it: {INSTALL}",
                    pytrace=False)
    sglang_cpu_stubs.install()
    yield
    sglang_cpu_stubs.uninstall()


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """(BF16 folder, W12 folder, source tensors) of the tiny Llama, written once."""
    from sglang_checkpoint import write_checkpoints

    return write_checkpoints(tmp_path_factory.mktemp("sglang-ckpt"))


@pytest.fixture
def subprocess_env() -> dict[str, str]:
    """Environment for a Python subprocess that imports SGLang on this CPU machine."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(CPU_SITE), *filter(None, [env.get("PYTHONPATH")])])
    return env
