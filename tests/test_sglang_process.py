"""SGLang's plugin tests (``tests/sglang_integration``) in a fresh interpreter.

In a run with other tests the root ``conftest.py`` leaves that folder out (why: its
``pytest_ignore_collect``); this test runs it as its own pytest process and fails with that
process's report when any of its tests fails or none ran. Named alone
(``python -m pytest tests/sglang_integration``) the folder runs in the usual way.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SGLANG_TESTS = Path(__file__).resolve().parent / "sglang_integration"


def test_sglang_plugin_tests_in_their_own_process():
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rs", "-p",
                           "no:cacheprovider", str(SGLANG_TESTS)], capture_output=True, text=True, env=env,
                          cwd=SGLANG_TESTS.parent.parent)
    report = done.stdout + done.stderr
    tail = "\n".join(report.strip().splitlines()[-40:])
    summary = re.findall(r"(\d+) (passed|failed|error|errors|skipped)", report.splitlines()[-1]
                         if report.strip() else "")
    counts = {word: int(n) for n, word in summary}
    assert done.returncode == 0, f"SGLang's tests failed (exit {done.returncode}):\n{tail}"
    assert counts.get("passed", 0) > 0, f"SGLang's tests ran nothing:\n{tail}"
    assert not counts.get("skipped"), f"SGLang's tests skipped some (they must run):\n{tail}"
    print(report.strip().splitlines()[-1])
