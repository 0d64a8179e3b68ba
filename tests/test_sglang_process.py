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
    command = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-rs", "-p",
               "no:cacheprovider", str(SGLANG_TESTS)]
    done = subprocess.run(command, capture_output=True, text=True, env=env,
                          cwd=SGLANG_TESTS.parent.parent)
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-40:])
    summaries = [line for line in done.stdout.splitlines()
                 if re.search(r"\d+ (passed|failed|errors?)\b", line)]
    counts = {word: int(n) for n, word in
              re.findall(r"(\d+) (passed|failed|errors?|skipped)", summaries[-1] if summaries
                         else "")}
    assert done.returncode == 0, f"SGLang's tests failed (exit {done.returncode}):\n{tail}"
    assert counts.get("passed", 0) > 0, f"SGLang's tests ran nothing:\n{tail}"
    assert not counts.get("skipped"), f"SGLang's tests skipped some (they must run):\n{tail}"
    print(summaries[-1])
