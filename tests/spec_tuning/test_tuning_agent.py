"""External agents in the tuning loop (CPU): a scripted agent's patch tested and judged in its
own worktree; patches that touch the judges or add no option refused."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from spec_tuning import agent
from spec_tuning.controller import Decision
from spec_tuning.loop import Deployment, Tuner
from spec_tuning.memory import Memory
from spec_tuning.stats import RatioBound

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
SCRIPTS = Path(__file__).with_name("agents")


def _checkout() -> bool:
    try:
        agent.source_root()
    except Exception:
        return False
    return True


needs_checkout = pytest.mark.skipif(not _checkout(), reason="needs a git checkout of w12")


@needs_checkout
@pytest.mark.parametrize("command,match", [
    (f"{sys.executable} -c \"open('spec_tuning/controller.py', 'a').write('#')\"",
     "touches the judges"),
    (f"{sys.executable} -c \"open('README.md', 'a').write('#')\"", "outside"),
    (f"{sys.executable} -c \"open('engine/serving.py', 'a').write('#')\"", "adds no option"),
    ("true", "changed nothing"),
    ("exit 3", "exited 3"),
])
def test_patches_are_refused_before_anything_runs(command, match):
    with pytest.raises(agent.Refused, match=match):
        agent.propose(command, {"factor": "acceptance"}, log=lambda _m: None)


def _reject(*_args, **_kwargs) -> Decision:
    bound = RatioBound(gain=-0.01, lower=-0.03, log_mean=-0.01, log_std_error=0.01, pairs=20)
    return Decision(False, "gain -1.00% (stand-in)", bound, bound, 0.01, 0.03, False)


@needs_checkout
def test_an_agents_mechanism_is_tested_and_judged_in_its_worktree(tmp_path):
    """The registry's proposals are turned down (a stand-in controller), so the round asks the
    agent; its patch adds an option, passes the tests named, and the worktree's own loop
    judges it with the real controller; the memory keeps the verdict with the patch's digest."""
    tests = f"{sys.executable} -m pytest -q -x -p no:cacheprovider " \
            "tests/spec_tuning/test_tuning_registry_memory.py"
    deployment = Deployment("synthetic:tiny-qwen3", "ngram", prompts=16, tokens=4, context=16)
    memory = Memory(tmp_path / "memory.json")
    tuner = Tuner(deployment, out_dir=tmp_path / "out", memory=memory, trials=1,
                  compare=_reject, agent=f"{sys.executable} {SCRIPTS / 'noop_option.py'}",
                  agent_tests=tests)
    result = tuner.run(1)
    trials = result.rounds[0].trials
    assert [t.source for t in trials] == ["registry", "agent"]
    judged = trials[1]
    assert judged.option == "test_noop" and judged.value == 1, judged.reason
    assert judged.judge in ("controller", "forcing") and judged.evidence["patch"]
    assert judged.evidence["files"] == ["engine/serving.py", "spec_tuning/registry.py"]
    entry = Memory(tmp_path / "memory.json").entries[-1]
    assert entry.option == "test_noop" and entry.evidence["source"] == "agent"


@needs_checkout
def test_a_committed_patch_is_seen_against_the_base():
    """An agent that commits its change in the worktree is judged on the same diff."""
    commit = (f"{sys.executable} -c \"open('spec_tuning/controller.py', 'a').write('#')\" && "
              "git -c user.email=a@b -c user.name=agent commit -qam x")
    with pytest.raises(agent.Refused, match="touches the judges"):
        agent.propose(commit, {"factor": "acceptance"}, log=lambda _m: None)


@needs_checkout
def test_a_patch_that_slows_the_current_configuration_is_refused(tmp_path):
    """The agent's option wins its trial only because the patch slows the path it is compared
    against (a sleep in every step while the option is off): both sides of the trial run the
    patched code, so the controller and token forcing promote it; timing the current
    configuration in both trees refuses it."""
    tests = f"{sys.executable} -m pytest -q -x -p no:cacheprovider " \
            "tests/spec_tuning/test_tuning_registry_memory.py"
    deployment = Deployment("synthetic:tiny-qwen3", "ngram", prompts=16, tokens=4, context=16)
    tuner = Tuner(deployment, out_dir=tmp_path / "out", memory=Memory(tmp_path / "memory.json"),
                  trials=1, compare=_reject,
                  agent=f"{sys.executable} {SCRIPTS / 'slow_stock.py'}", agent_tests=tests)
    judged = tuner.run(1).rounds[0].trials[1]
    assert judged.option == "test_noop" and judged.verdict == "rejected", judged.reason
    assert judged.judge == "stock-path" and "slows the current configuration" in judged.reason
    assert judged.evidence["gain"] > judged.evidence["bar"]  # the trial itself promoted it
