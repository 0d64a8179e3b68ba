"""What every user-facing benchmark shares: how it times, what it records, how it reports.

Timing method. On a GPU each candidate is a list of thunks captured as one CUDA graph; the
graphs of the baseline and the candidates are replayed in turn, round after round, and each
reports its median per-call time, so that every candidate is timed under the same conditions
(timing one graph back to back right after heavy work reads slower than the same kernel a
moment later). On the CPU ``time_host`` does the same with ``time.perf_counter`` around eager
calls. Every benchmark times its baseline in the same run and prints its ratios last.

Records. ``environment()`` names the commit (with "(modified)" for a dirty tree), date, torch,
Triton and the GPU; ``write_json`` stores ``{"environment": ..., "rows": [...], ...}`` so that
a table in docs/PERF.md can name the command, card, date and commit its numbers came from.

Benchmark scripts import this module by name (their folder is on ``sys.path`` when run as
``python benchmarks/<name>.py``); ``project_on_path()`` puts the repository root there too.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def project_on_path() -> None:
    """Let a script run from a checkout import the project without installing it."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def commit() -> str:
    """The checkout's HEAD, with " (modified)" when the tree has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=ROOT, capture_output=True,
                               text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "uncommitted") + (" (modified)" if dirty else "")


def environment(device: str = "cuda") -> dict:
    """Commit, date, library versions and (for a CUDA device) the GPU's name and memory."""
    import torch

    env = {"commit": commit(), "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    if str(device).startswith("cuda") and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.device(device))
        env["gpu"] = props.name
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["sms"] = props.multi_processor_count
    return env


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def capture(calls: Sequence[Callable[[], object]]):
    """A CUDA graph of ``calls`` in order, after running two of them eagerly on a side stream
    (compilation, allocation) and replaying the graph once."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls[:2]:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):  # the warm-up's stream (w12_kernels)
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_graphs(call_lists: Sequence[Sequence[Callable[[], object]]], rounds: int = 7
                ) -> list[float]:
    """Median µs per call of each list of thunks, each captured as one CUDA graph and the
    graphs replayed in turn, round after round."""
    import torch

    graphs = [capture(calls) for calls in call_lists]
    times: list[list[float]] = [[] for _ in graphs]
    for _ in range(rounds):
        for graph, calls, out in zip(graphs, call_lists, times, strict=True):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            out.append(start.elapsed_time(end) * 1e3 / len(calls))
    del graphs
    return [median(t) for t in times]


def time_host(candidates: Sequence[Callable[[], object]], rounds: int = 5,
              sync: Callable[[], None] | None = None) -> list[float]:
    """Median seconds of each callable, the candidates run in turn, round after round.

    ``sync`` (e.g. ``torch.cuda.synchronize``) is called before each clock read when the
    calls launch asynchronous work."""
    times: list[list[float]] = [[] for _ in candidates]
    for _ in range(rounds):
        for fn, out in zip(candidates, times, strict=True):
            if sync:
                sync()
            start = time.perf_counter()
            fn()
            if sync:
                sync()
            out.append(time.perf_counter() - start)
    return [median(t) for t in times]


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Device-to-device copy on the current GPU, bytes read + written per second (TB/s): the
    practical ceiling a memory-bound kernel is measured against."""
    import torch

    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize()
    times = []
    for _ in range(10):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * nbytes / median(times) / 1e12


def write_json(path: str | Path | None, rows: list[dict], environment: dict, **extra) -> None:
    """``{"environment": ..., "rows": rows, **extra}`` into ``path`` (nothing when None)."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment, "rows": rows, **extra}, indent=1)
                    + "\n")
