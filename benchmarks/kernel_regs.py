"""Registers, spills and blocks per multiprocessor of every small-M kernel instantiation the
tuned table uses, from an offline compile (``nvcc -cubin -Xptxas -v``, no GPU needed), for the
working tree and optionally a git revision.

A kernel change that adds a few registers can move a schedule across an occupancy step (a
256-thread block at 64 registers fits 4 times on a multiprocessor, at 65-80 only 3) and turn a
one-wave launch into two (docs/PERF_GEMM.md #39). Run this before spending GPU time: it lists
each instantiation with the shapes and M classes that use it, its registers and spill bytes,
and the blocks per multiprocessor its registers, shared memory and threads allow (Hopper
limits: 64K registers, 228 KB shared memory with 1 KB reserved per block, 2048 threads, 32
blocks), and the waves of blocks each user's launch takes on an H200 (132 multiprocessors).
With ``--baseline REV`` it compares with that revision's ``kernels.cu``, compiled with that
revision's kernel signature and placed at that revision's shared-memory sizes (its own
``cuda.small_shared_bytes``), and exits 1 where a schedule gains spills or a shape's launch more
waves. ``REV`` may also be a directory holding a revision's ``kernels.cu`` and ``cuda.py``.

    python benchmarks/kernel_regs.py --baseline HEAD~1
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.revision import KERNELS, cuda_module, source_at  # noqa: E402
from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import cuda  # noqa: E402

# Hopper (sm_90) per multiprocessor
REGS_PER_SM = 65536
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED_PER_BLOCK = 1024
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32
NUM_SMS = 132  # H200; only for the table's own kw rule on unlisted shapes


@dataclass(frozen=True)
class Use:
    shape: str
    nt: int  # NT class (ceil(M / 8))
    kw: int
    grid: int  # blocks of the launch


@dataclass(frozen=True)
class Instance:
    name: str  # the template instantiation, as cuda.kernel_name gives it
    threads: int  # per block
    smem: int  # dynamic shared memory per block
    base_smem: int | None = None  # the same under the baseline's small_shared_bytes


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def table_instances(num_sms: int = NUM_SMS, base_shared=None) -> dict[Instance, list[Use]]:
    """Every (instantiation, launch geometry) the tuned table's shapes use, with its users;
    ``base_shared``: a baseline's ``small_shared_bytes``, for ``Instance.base_smem``."""
    rule = cfgs.rule()
    out: dict[Instance, list[Use]] = {}
    for shape in rule.get("shapes", {}):
        n, k = map(int, shape.split("x"))
        cfg = cfgs.small_config(n, k, num_sms)
        for nt, lay in cfg.by_nt:
            name = cuda.kernel_name(nt, lay.depth, lay.prefetch, lay.tiles, lay.min_blocks,
                                    lay.x_stages, lay.groups, cfg.kw, lay.w_stages, lay.cluster)
            sizes = (nt, cfg.kw, lay.x_stages, lay.groups, lay.w_stages, lay.tiles)
            if lay.cluster > 1:
                sizes = (*sizes, lay.cluster)
            inst = Instance(name, 32 * cfg.kw // lay.cluster * lay.groups,
                            cuda.small_shared_bytes(*sizes), _base_bytes(base_shared, sizes))
            grid = _cdiv(_cdiv(n, 16), lay.tiles * lay.groups) * lay.cluster
            out.setdefault(inst, []).append(Use(shape, nt, cfg.kw, grid))
    return out


def _base_bytes(base_shared, sizes: tuple) -> int | None:
    """The baseline's shared memory for ``sizes``, or None (no baseline, or one without the
    clustered kernel, whose ``small_shared_bytes`` takes no cluster)."""
    if base_shared is None:
        return None
    try:
        return base_shared(*sizes)
    except TypeError:
        return None


def blocks_per_sm(regs: int, threads: int, smem: int) -> int:
    """Blocks of ``threads`` threads using ``regs`` registers each and ``smem`` bytes of dynamic
    shared memory that fit on one multiprocessor (registers are allocated per warp in units of
    256, i.e. per thread in units of 8)."""
    warps = -(-threads // 32)
    regs_per_warp = -(-max(regs, 1) * 32 // 256) * 256
    by_regs = REGS_PER_SM // (regs_per_warp * warps)
    by_smem = SMEM_PER_SM // (smem + SMEM_RESERVED_PER_BLOCK)
    by_threads = THREADS_PER_SM // (warps * 32)
    return max(0, min(by_regs, by_smem, by_threads, BLOCKS_PER_SM))


def waves(grid: int, per_sm: int, num_sms: int = NUM_SMS) -> int:
    """Rounds of blocks a launch of ``grid`` blocks takes with ``per_sm`` blocks per
    multiprocessor (0 blocks per multiprocessor: it cannot launch)."""
    return -(-grid // (per_sm * num_sms)) if per_sm else 10**9


def _template_args(name: str) -> str:
    return re.search(r"<(.*)>", name).group(1)


def _mangled_args(name: str) -> str:
    """The template arguments as they appear in the Itanium-mangled symbol (``Li8E``, ``Lb0E``)."""
    parts = [p.strip() for p in _template_args(name).split(",")]
    return "".join({"true": "Lb1E", "false": "Lb0E"}.get(p, f"Li{p}E") for p in parts)


def parse_ptxas(text: str) -> dict[str, tuple[int, int]]:
    """{mangled kernel name: (registers, spill store bytes)} from ``ptxas -v`` output."""
    out, current, spill = {}, None, 0
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current, spill = m.group(1), 0
            continue
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and current:
            spill = int(m.group(1))
        m = re.search(r"Used (\d+) registers", line)
        if m and current:
            out[current] = (int(m.group(1)), spill)
            current = None
    return out


def kernel_signature(source: str) -> str:
    """The parameter types of ``w12_gemm_small`` in a ``kernels.cu`` text, as an explicit
    instantiation spells them: ``(const Words4*, const bf16_t*, ..., int)``."""
    m = re.search(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?w12_gemm_small\s*"
                  r"\(([^)]*)\)", source)
    if m is None:
        raise SystemExit("kernel_regs: no w12_gemm_small definition in the kernels source")
    types = []
    for param in m.group(1).split(","):
        words = param.replace("__restrict__", " ").replace("*", "* ").split()
        if len(words) < 2:
            raise SystemExit(f"kernel_regs: cannot read the parameter {param.strip()!r}")
        types.append(" ".join(words[:-1]).replace(" *", "*"))
    return "(" + ", ".join(types) + ")"


def compile_counts(source: Path, names: list[str], nvcc: str, arch: str = "sm_90"
                   ) -> dict[str, tuple[int, int]]:
    """{instantiation name: (registers, spill bytes)} of ``names`` compiled from ``source``."""
    signature = kernel_signature(source.read_text())
    with tempfile.TemporaryDirectory() as scratch:
        unit = Path(scratch) / "unit.cu"
        unit.write_text(f'#include "{source}"\n' + "".join(
            f"template __global__ void {name}{signature};\n" for name in names))
        done = subprocess.run([nvcc, f"-arch={arch}", "-std=c++17", "-cubin", "-o",
                               str(Path(scratch) / "unit.cubin"), str(unit), "-Xptxas", "-v",
                               "-diag-suppress", "179"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"kernel_regs: nvcc failed on {source}:\n{done.stderr[-2000:]}")
    counts = parse_ptxas(done.stderr)
    out = {}
    for name in names:
        key = _mangled_args(name)
        base = name.split("<")[0]  # w12_gemm_small or w12_gemm_small_cl
        hits = [v for symbol, v in counts.items()
                if symbol.startswith(f"_Z{len(base)}{base}I") and key in symbol]
        if len(hits) != 1:
            raise SystemExit(f"kernel_regs: no single ptxas entry for {name}")
        out[name] = hits[0]
    return out


def baseline_shared_bytes(rev: str):
    """The baseline's ``small_shared_bytes`` (its ``cuda.py`` run as a module of its own)."""
    return cuda_module(rev, "w12_regs_baseline_cuda", "kernel_regs").small_shared_bytes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=None,
                        help="git revision to compare with, or a directory holding a "
                             "revision's kernels.cu and cuda.py")
    parser.add_argument("--nvcc", default=shutil.which("nvcc"), help="nvcc (default: on PATH)")
    args = parser.parse_args()
    if not args.nvcc:
        raise SystemExit("kernel_regs: needs nvcc (the CUDA toolkit) on PATH or --nvcc")
    base_shared = baseline_shared_bytes(args.baseline) if args.baseline else None
    instances = table_instances(base_shared=base_shared)
    names = sorted({inst.name for inst in instances})
    tree = compile_counts(ROOT / KERNELS, names, args.nvcc)
    base = None
    if args.baseline:
        with tempfile.TemporaryDirectory() as scratch:
            path = Path(scratch) / "kernels.cu"
            text = source_at(args.baseline, KERNELS, "kernel_regs")
            path.write_text(text)
            # (a baseline without the clustered kernel is compared on the others only)
            base = compile_counts(path, [n for n in names if re.search(
                re.escape(n.split("<")[0]) + r"\s*\(", text)], args.nvcc)
    worse = []
    for inst, uses in sorted(instances.items(), key=lambda item: item[0].name):
        regs, spill = tree[inst.name]
        blocks = blocks_per_sm(regs, inst.threads, inst.smem)
        line = (f"{inst.name:52s} {inst.threads:5d} thr {inst.smem:7d} B  regs {regs:3d} "
                f"spill {spill:4d}  blocks/SM {blocks:2d}")
        if base is not None and inst.name in base:
            b_regs, b_spill = base[inst.name]
            b_blocks = blocks_per_sm(b_regs, inst.threads, inst.base_smem)
            more_waves = any(waves(u.grid, blocks) > waves(u.grid, b_blocks) for u in uses)
            flag = more_waves or spill > b_spill
            line += (f"  | baseline {inst.base_smem:7d} B regs {b_regs:3d} spill {b_spill:4d} "
                     f"blocks/SM {b_blocks:2d}")
            line += "  <-- more waves or more spills" if flag else ""
            if flag:
                worse.append(inst.name)
        print(line)
        print("    used by " + ", ".join(f"{u.shape} NT{u.nt} ({waves(u.grid, blocks)} wave"
                                      f"{'s' if waves(u.grid, blocks) > 1 else ''})"
                                      for u in uses))
    if worse:
        print(f"{len(worse)} instantiation(s) take more waves on some shape or gain spills")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
