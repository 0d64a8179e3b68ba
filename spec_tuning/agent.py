"""External agents: any command that proposes a mechanism as a patch, judged like any proposal.

``propose`` makes a scratch git worktree of the source tree's HEAD, writes the brief into it
(``.w12-tune-brief.json``: the deployment, the round's ceiling factors, the factor to attack,
the current configuration, the option contract, the paths it may and may not touch) and runs
the command there with ``W12_TUNE_BRIEF`` naming the brief. What the command leaves changed in
the worktree is the patch. It is refused when it touches a protected path (the judges, the
loop, the memory and their tests), a path outside the allowed ones, or adds no registry option;
otherwise the project's tests (``test_command``) must pass in the worktree, and then the
worktree's own ``w12 tune trial`` judges the new option against the current configuration
with the unchanged controller and token forcing (``judge``). Both sides of that trial run the
patched code, so a patch that slows the current configuration would inflate its own gain: a
promoted patch must also show that the current configuration runs as fast in its tree as in the
source tree (``stock_path_check``: processes of both trees in turn, refused when the patched
one is slower by more than the controller's bar). The patch and its verdict go to the memory
like any judgement; a promoted patch is saved for the user to apply (this process does not run
the worktree's code).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from w12.errors import W12Error

PROTECTED = (
    "spec_tuning/controller.py", "spec_tuning/forcing.py", "spec_tuning/stats.py",
    "spec_tuning/sealed.py", "spec_tuning/prove.py", "spec_tuning/engine_forcing.py",
    "spec_tuning/cost_model.py", "spec_tuning/profiler.py", "spec_tuning/loop.py",
    "spec_tuning/agent.py", "spec_tuning/memory.py", "tests/spec_tuning/",
)
ALLOWED = ("engine/", "w12_kernels/", "spec_tuning/registry.py", "tests/engine/",
           "tests/w12_kernels/")
BRIEF = ".w12-tune-brief.json"
OPTION_CONTRACT = (
    "Add one mechanism behind a new option: a Mechanism entry in spec_tuning/registry.py whose "
    "stock value keeps today's behaviour and whose target names the runtime parameter it sets "
    "(an engine.generate.Engine or engine.serving.Server argument, which the tuning loop passes "
    "through), plus that parameter in the runtime. Outputs must stay those of plain decoding: "
    "token forcing judges them, and the paired-run controller judges speed."
)


class Refused(W12Error):
    """A patch the loop will not judge."""


@dataclass
class Proposal:
    worktree: Path
    patch: str
    files: list[str]
    options: list[str]  # registry options the patch adds
    output: str  # the command's last output lines
    saved: Path | None = None
    notes: dict = field(default_factory=dict)

    @property
    def sha(self) -> str:
        return hashlib.sha256(self.patch.encode()).hexdigest()[:16]


def _git(args: list[str], cwd: Path, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, **kwargs)


def source_root() -> Path:
    """The git checkout this package runs from (the agent path needs one)."""
    here = Path(__file__).resolve().parent
    out = _git(["rev-parse", "--show-toplevel"], here)
    if out.returncode != 0:
        raise W12Error("external agents need w12 run from a git checkout (its worktree is the "
                       "agent's sandbox)")
    return Path(out.stdout.strip())


def check_paths(files: list[str]) -> None:
    if not files:
        raise Refused("the agent changed nothing")
    protected = [f for f in files if f.startswith(PROTECTED)]
    if protected:
        raise Refused(f"the patch touches the judges or the loop: {', '.join(protected)}")
    outside = [f for f in files if not f.startswith(ALLOWED)]
    if outside:
        raise Refused(f"the patch touches paths outside {', '.join(ALLOWED)}: "
                      f"{', '.join(outside)}")


def _registry_names(tree: Path) -> set[str]:
    code = "import json, spec_tuning.registry as r; print(json.dumps(sorted(r.REGISTRY)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=tree, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tree)}, timeout=300)
    if out.returncode != 0:
        raise Refused(f"the patched registry does not import: {out.stderr.strip()[-400:]}")
    return set(json.loads(out.stdout))


def propose(command: str, brief: dict, *, timeout: float = 3600.0, log=print) -> Proposal:
    """Run ``command`` in a scratch worktree with ``brief``; the patch it leaves, checked
    (``Refused`` otherwise). The worktree stays until ``discard``."""
    root = source_root()
    base = _git(["rev-parse", "HEAD"], root).stdout.strip()
    tree = Path(tempfile.mkdtemp(prefix="w12-agent-")) / "tree"
    made = _git(["worktree", "add", "--detach", str(tree), base], root)
    if made.returncode != 0:
        raise W12Error(f"git worktree add failed: {made.stderr.strip()}")
    try:
        brief = {**brief, "contract": OPTION_CONTRACT, "may_touch": list(ALLOWED),
                 "must_not_touch": list(PROTECTED)}
        (tree / BRIEF).write_text(json.dumps(brief, indent=1, default=str) + "\n")
        log(f"agent: running {command!r} in {tree} ...")
        try:
            ran = subprocess.run(command, shell=True, cwd=tree, capture_output=True, text=True,
                                 timeout=timeout, env={**os.environ,
                                                       "W12_TUNE_BRIEF": str(tree / BRIEF)})
        except subprocess.TimeoutExpired:
            raise Refused(f"the agent ran past {timeout:.0f} s") from None
        output = (ran.stdout + ran.stderr)[-2000:]
        if ran.returncode != 0:
            raise Refused(f"the agent exited {ran.returncode}: {output[-400:]}")
        (tree / BRIEF).unlink(missing_ok=True)
        _git(["add", "-A"], tree)  # (against the base: an agent may have committed)
        files = _git(["diff", "--cached", "--name-only", base], tree).stdout.split()
        patch = _git(["diff", "--cached", base], tree).stdout
        check_paths(files)
        added = sorted(_registry_names(tree) - _registry_names(root))
        if not added:
            raise Refused("the patch adds no option to spec_tuning/registry.py")
        return Proposal(tree, patch, files, added, output)
    except BaseException:
        discard(tree)
        raise


def discard(tree: Path) -> None:
    """Remove a scratch worktree (and its git bookkeeping)."""
    root = source_root()
    _git(["worktree", "remove", "--force", str(tree)], root)
    _git(["worktree", "prune"], root)
    shutil.rmtree(tree.parent, ignore_errors=True)


def run_tests(proposal: Proposal, test_command: str, *, timeout: float = 3600.0) -> None:
    """The project's tests in the patched worktree; ``Refused`` when they fail."""
    try:
        ran = subprocess.run(test_command, shell=True, cwd=proposal.worktree,
                             capture_output=True, text=True, timeout=timeout,
                             env={**os.environ, "PYTHONPATH": str(proposal.worktree)})
    except subprocess.TimeoutExpired:
        raise Refused(f"the tests ran past {timeout:.0f} s") from None
    if ran.returncode != 0:
        raise Refused(f"the tests fail with the patch: {(ran.stdout + ran.stderr)[-600:]}")


def _tune(tree: Path, command: str, deployment: dict, current: dict, extra: list[str],
          timeout: float) -> subprocess.CompletedProcess:
    """``w12 tune COMMAND`` for the deployment and ``current``, run with ``tree``'s code."""
    args = [sys.executable, "-m", "w12_cli", "tune", command, deployment["model"],
            "--drafter", deployment["drafter"], "--mode", deployment["mode"],
            "--device", deployment["device"], "--source", deployment["source"],
            "--prompts", str(deployment["prompts"]), "--tokens", str(deployment["tokens"]),
            "--context", str(deployment["context"]), "--seed", str(deployment["seed"]),
            "--config", json.dumps(current, default=str), *extra]
    return subprocess.run(args, cwd=tree, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "PYTHONPATH": str(tree)})


def judge(proposal: Proposal, option: str, *, deployment: dict, current: dict, out_dir: Path,
          timeout: float = 7200.0) -> dict:
    """The worktree's own ``w12 tune trial`` of ``option`` on top of ``current``: the Trial as
    a dict (its verdict from the unchanged controller and token forcing)."""
    out = out_dir / f"trial-{proposal.sha}-{option}.json"
    ran = _tune(proposal.worktree, "trial", deployment, current,
                ["--option", option, "--out", str(out_dir / f"trial-{proposal.sha}"),
                 "--result", str(out)], timeout)
    if ran.returncode != 0 or not out.exists():
        raise Refused(f"the patched tree's trial failed: {(ran.stdout + ran.stderr)[-600:]}")
    return json.loads(out.read_text())


def stock_path_check(proposal: Proposal, *, deployment: dict, current: dict, out_dir: Path,
                     bar: float, rounds: int = 2, repeats: int = 3,
                     timeout: float = 3600.0) -> dict:
    """Refuse a patch under which ``current`` (the configuration the trial compared against)
    runs slower than in the source tree: ``rounds`` processes of each tree in turn (source
    first), each timing ``repeats`` runs over the tuning prompts (``w12 tune time``); the
    patched tree's median seconds a token over the source tree's may exceed 1 by ``bar`` (the
    controller's promotion bar: a slowdown below it cannot make a trial pass alone). Returns
    the evidence (both medians, the ratio)."""
    per_token: dict[str, list[float]] = {"source": [], "patched": []}
    for index in range(rounds):
        for side, tree in (("source", source_root()), ("patched", proposal.worktree)):
            out = out_dir / f"time-{proposal.sha}-{side}-{index}.json"
            ran = _tune(tree, "time", deployment, current,
                        ["--repeats", str(repeats), "--result", str(out)], timeout)
            if ran.returncode != 0 or not out.exists():
                raise Refused(f"timing the current configuration in the {side} tree failed: "
                              f"{(ran.stdout + ran.stderr)[-600:]}")
            got = json.loads(out.read_text())
            per_token[side] += [s / got["tokens"] for s in got["seconds"]]
    source, patched = (sorted(v)[len(v) // 2] for v in per_token.values())
    evidence = {"source_s_per_token": source, "patched_s_per_token": patched,
                "ratio": patched / source, "bar": bar}
    if patched > source * (1 + bar):
        raise Refused(f"the patch slows the current configuration: {patched / source:.3f}x "
                      f"the source tree's time a token (more than the bar {bar:.3f}), which "
                      "would count as the option's gain")
    return evidence
