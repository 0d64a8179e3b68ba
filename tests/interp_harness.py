"""Running Triton kernels under ``TRITON_INTERPRET=1`` from the CPU tests.

Triton reads the variable when it is imported, so the interpreted cases run in one fresh
process: a runner script calls ``report`` with its cases, and the test module's fixture calls
``verdicts`` on that script and checks each case's verdict on its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback

TESTS = os.path.dirname(os.path.abspath(__file__))


def report(jobs: dict) -> None:
    """In the runner: run every job (id -> callable), print one JSON line id -> "ok" or the
    failure (every case is reported, not just the first failure)."""
    import warnings

    # inf * 0 and exp(-inf) in rows and columns that are masked out afterwards
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    results = {}
    for cid, job in jobs.items():
        try:
            job()
            results[cid] = "ok"
        except Exception:
            results[cid] = traceback.format_exc(limit=3)[-1500:]
    print(json.dumps(results))


def verdicts(runner: str) -> dict:
    """In the test: run the runner script under the interpreter and return its verdicts."""
    here = os.path.dirname(os.path.abspath(runner))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(
        [os.path.dirname(TESTS), here, TESTS, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, runner], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def verdicts_fixture(test_file: str, runner: str):
    """A module-scoped fixture of the verdicts of ``runner`` (a script beside ``test_file``),
    skipped where Triton is missing. In a test module::

        interpreter_verdicts = interp_harness.verdicts_fixture(__file__, "x_interp_runner.py")
    """
    import pytest

    @pytest.fixture(scope="module")
    def interpreter_verdicts():
        pytest.importorskip("triton")
        return verdicts(os.path.join(os.path.dirname(os.path.abspath(test_file)), runner))

    return interpreter_verdicts
