"""The main loop of every large-M kernel configuration the tuned table uses, from an offline
compile (``nvcc -cubin``, ``cuobjdump -sass``; no GPU needed), for the working tree and
optionally a git revision: its instructions per loop trip (two 64-column steps), how many run
on the uniform datapath, the divergence checks (``BRA.DIV``) in it, registers and spills.

That loop runs at ~74% of the tensor cores' peak, so a few instructions added in front of a
column's MMAs cost directly: a persistent variant whose loop compiled to 549 instructions
against 515 ran 7-10% slower (docs/PERF_GEMM.md #58). Run this before spending GPU time on a
change to ``kernels_large.cu``: with ``--baseline REV`` it exits 1 where a configuration's loop
grows, gains divergence checks or spills.

    python benchmarks/wgl_sass.py --baseline HEAD
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.kernel_regs import parse_ptxas  # noqa: E402

# prints the sources of the given configurations as JSON, run with a checkout on PYTHONPATH
_GENERATOR = """
import json, sys
from w12_kernels.gemm import cuda_large
# (trailing persist and mcast 0 left out, for revisions from before them)
cfgs = []
for c in json.loads(sys.argv[1]):
    while len(c) > 6 and c[-1] == 0:
        c = c[:-1]
    cfgs.append(c)
out = {}
for c in cfgs:
    try:
        out[cuda_large.kernel_name(*c)] = cuda_large.source(*c)
    except TypeError:  # a configuration that revision does not have (persist, mcast)
        pass
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Loop:
    instructions: int  # in the innermost loop holding the MMAs, one trip
    uniform: int  # of those, on the uniform datapath (U... opcodes)
    divergence_checks: int  # BRA.DIV
    mmas: int


def table_configs(rule: dict | None = None) -> list[tuple]:
    """The distinct warpgroup-kernel configurations of the large-M table (default and every
    shape's entries, filled from the default as ``config.large_config`` fills them: all but
    ``persist``, ``tail`` and ``mcast``; an entry with a tail also runs its configuration with
    that many K ranges), as ``cuda_large.kernel_name``'s arguments."""
    from w12_kernels.gemm import config as cfgs
    from w12_kernels.gemm import cuda_large

    rule = rule or cfgs.large_rule()
    entries = [rule["default"]] + [{**rule["default"], "persist": 0, "tail": 0, "mcast": 0, **e}
                                   for by_m in rule["shapes"].values() for e in by_m.values()]
    out = []
    for entry in entries:
        c = cfgs.LargeConfig(**entry)
        if c.kind != "wgmma":
            continue
        key = (c.block_m, c.tiles // 4, c.num_stages, c.w_stages, c.splits, int(c.a_regs),
               int(c.persist), int(c.mcast))
        keys = [key, cuda_large.tail_config(key, c.tail)] if c.tail else [key]
        out += [k for k in dict.fromkeys(keys) if k not in out]
    return out


def main_loop(sass: str, kernel: str) -> Loop:
    """The innermost loop (a backward branch's span) of ``kernel`` in ``cuobjdump -sass`` text
    that holds at least four warpgroup MMAs."""
    body = sass.split(f"Function : {kernel}", 1)
    if len(body) != 2:
        raise ValueError(f"wgl_sass: no function {kernel} in the disassembly")
    code = body[1].split("Function :", 1)[0]
    ins = []
    for line in code.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    best = None
    for addr, text in ins:
        m = re.search(r"\bBRA (?:`\()?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            start = int(m.group(1), 16)
            span = [t for a, t in ins if start <= a <= addr]
            if sum("HGMMA" in t for t in span) >= 4 and (best is None or len(span) < len(best)):
                best = span
    if best is None:
        raise ValueError(f"wgl_sass: no loop with warpgroup MMAs in {kernel}")
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in best)
    return Loop(len(best), sum(v for op, v in ops.items() if op.startswith("U")),
                ops["BRA.DIV"], sum(v for op, v in ops.items() if op.startswith("HGMMA")))


def sources(configs: list[tuple], rev: str | None) -> dict[str, str]:
    """{kernel name: full source} of ``configs`` in the working tree or at git revision
    ``rev`` (its ``w12_kernels`` exported into a scratch directory)."""
    with tempfile.TemporaryDirectory() as scratch:
        path = str(ROOT)
        if rev is not None:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "w12_kernels"],
                                     capture_output=True)
            if archive.returncode != 0:
                raise SystemExit(f"wgl_sass: cannot export w12_kernels at {rev!r}: "
                                 f"{archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", scratch], input=archive.stdout, check=True)
            path = scratch
        # (run in that directory: ``python -c`` puts the working directory first on sys.path)
        done = subprocess.run([sys.executable, "-c", _GENERATOR, json.dumps(configs)],
                              capture_output=True, text=True, cwd=path,
                              env={**os.environ, "PYTHONPATH": path})
        if done.returncode != 0:
            raise SystemExit(f"wgl_sass: generating the sources failed:\n{done.stderr[-2000:]}")
        return json.loads(done.stdout)


def measure(name: str, source: str, nvcc: str, cuobjdump: str) -> tuple[Loop, int, int]:
    """The main loop, registers and spill bytes of kernel ``name`` compiled from ``source``."""
    with tempfile.TemporaryDirectory() as scratch:
        unit, cubin = Path(scratch) / "unit.cu", Path(scratch) / "unit.cubin"
        unit.write_text(source)
        done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90a", "-cubin", "-o", str(cubin),
                               str(unit), "-Xptxas", "-v", "-diag-suppress", "177"],
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"wgl_sass: nvcc failed on {name}:\n{done.stderr[-2000:]}")
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
        if sass.returncode != 0:
            raise SystemExit(f"wgl_sass: cuobjdump failed (nvdisasm on PATH?): "
                             f"{sass.stderr.strip()[-500:]}")
    regs, spill = parse_ptxas(done.stderr).get(name, (0, -1))
    return main_loop(sass.stdout, name), regs, spill


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=None, help="git revision to compare with")
    parser.add_argument("--nvcc", default=shutil.which("nvcc"), help="nvcc (default: on PATH)")
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump"),
                        help="cuobjdump (default: on PATH; it needs nvdisasm on PATH too)")
    parser.add_argument("--configs", default=None,
                        help="block_m:warpgroups:x_stages:w_stages:splits:a_regs[:persist[:mcast]],"
                             "... "
                             "(default: every configuration of the large-M table)")
    args = parser.parse_args()
    if not args.nvcc or not args.cuobjdump:
        raise SystemExit("wgl_sass: needs nvcc and cuobjdump (the CUDA toolkit, or the "
                         "nvidia-cuda-nvcc / -cuobjdump / -nvdisasm wheels) on PATH")
    try:
        configs = ([tuple(int(v) for v in c.split(":")) for c in args.configs.split(",")]
                   if args.configs else table_configs())
    except ValueError:
        raise SystemExit(f"wgl_sass: bad --configs {args.configs!r}") from None
    tree = sources(configs, None)
    base = sources(configs, args.baseline) if args.baseline else {}
    worse = []
    print(f"{'kernel':<28} {'loop':>5} {'uniform':>7} {'BRA.DIV':>7} {'regs':>4} {'spill':>5}"
          + ("   baseline: loop uniform BRA.DIV spill" if base else ""))
    for name, text in tree.items():
        loop, regs, spill = measure(name, text, args.nvcc, args.cuobjdump)
        line = (f"{name:<28} {loop.instructions:>5} {loop.uniform:>7} "
                f"{loop.divergence_checks:>7} {regs:>4} {spill:>5}")
        if name in base:
            b, _, bspill = measure(name, base[name], args.nvcc, args.cuobjdump)
            line += f"   {b.instructions:>14} {b.uniform:>7} {b.divergence_checks:>7} {bspill:>5}"
            if (loop.instructions > b.instructions or loop.divergence_checks > b.divergence_checks
                    or spill > bspill):
                worse.append(name)
                line += "   WORSE"
        print(line, flush=True)
    if worse:
        print(f"wgl_sass: longer loops, new divergence checks or spills: {', '.join(worse)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
