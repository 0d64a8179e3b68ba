"""Registers, spills and SASS of every kernel instantiation the tuned table uses, from an offline
compile (``nvcc -cubin``, ``cuobjdump -sass``; no GPU), for the working tree and a git revision:
the check, before any GPU time is spent, that a change to the kernels' sources or to how they
are organised leaves the compiled kernels as they were, or shows where it does not.

Each instantiation (the small-M mma.sync kernel per shape and row class and the rule's layouts
at every kw, the warpgroup small-M kernel's schedules, every large-M entry of every section and
its tail, the decode kernels and the image passes) is compiled from each tree's own sources, as
that tree's launchers build them, for sm_90 (sm_90a where the launcher asks for it). Reported
per instantiation: registers and spill bytes of both, whether the whole function's SASS is the
same (``same``), the same up to the offsets of kernel parameters (``same but params``: a
parameter list that changed), and for the large-M kernel the instructions of its main loop
(the innermost loop holding its warpgroup MMAs). Exit 1 where registers or spills grow or a
main loop gets longer. A revision is read by ``git archive``; one from before the kernels had
family folders is read through the former module names.

    python lab/kernel_sass.py --baseline main [--jobs 2] [--only large]
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Runs with a tree on PYTHONPATH: every instantiation's key, source and symbol as JSON.
_GENERATOR = r'''
import json, sys, os
from pathlib import Path
keys = json.loads(sys.stdin.read())
tree = Path(sys.argv[1])
new = (tree / "w12_kernels/gemm/table.py").exists()
units = {}

def put(key, source, symbol, arch, include=None):
    units[json.dumps(key)] = dict(source=source, symbol=symbol, arch=arch, include=include)

if new:
    from w12_kernels.gemm.cuda import runtime
    from w12_kernels.gemm.decode import launcher as dec
    from w12_kernels.gemm.large import launcher as large
    from w12_kernels.gemm.small import launcher as small
    from w12_kernels.gemm.wgmma import launcher as wg
    inc = str(runtime.INCLUDE_DIR)
    for key in keys:
        kind, args = key[0], key[1:]
        if kind == "small":
            nt, depth, tiles, minb, xs, groups, kw, ws, cl = args
            name = small.kernel_name(nt, depth, tiles, minb, xs, groups, kw, ws, cl)
            put(key, small.SOURCE_PATH.read_text(), name, "sm_90", inc)
        elif kind == "wg":
            n_block, depth, wgs, sets, rg = args
            put(key, wg.SOURCE_PATH.read_text(), wg.kernel_name(n_block, depth, wgs, sets, rg),
                "sm_90a", inc)
        elif kind == "x_image":
            put(key, wg.SOURCE_PATH.read_text(), f"w12_x_image<{args[0]}>", "sm_90a", inc)
        elif kind == "wgl":
            bm, wgs, xs, ws, sp, ar, ps, xo, wr, l2 = args
            cfg = large.WglConfig(bm, wgs, xs, ws, sp, ar, persist=bool(ps), xorder=bool(xo),
                                  wreuse=bool(wr), l2hint=bool(l2))
            put(key, large.source(cfg), cfg.kernel_name, "sm_90a", inc)
        elif kind == "permute_x":
            put(key, large.SOURCE_PATH.read_text(), "w12_permute_x", "sm_90a", inc)
        elif kind in ("decode", "write_escapes"):
            put(key, dec.SOURCE_PATH.read_text(), "w12_" + kind, "sm_90", inc)
else:  # the layout before the family folders
    from w12_kernels.gemm import cuda, cuda_large, wgmma
    base = cuda.SOURCE_PATH.read_text()
    for key in keys:
        kind, args = key[0], key[1:]
        if kind == "small":
            nt, depth, tiles, minb, xs, groups, kw, ws, cl = args
            name = cuda.kernel_name(nt, depth, False, tiles, minb, xs, groups, kw, ws, cl)
            put(key, base, name, "sm_90")
        elif kind == "wg":
            n_block, depth, wgs, sets, rg = args
            put(key, wgmma.source(), wgmma.kernel_name(n_block, depth, wgs, sets, rg), "sm_90a")
        elif kind == "x_image":
            put(key, wgmma.source(), f"w12_x_image<{args[0]}>", "sm_90a")
        elif kind == "wgl":
            bm, wgs, xs, ws, sp, ar, ps, xo, wr, l2 = args
            config = (bm, wgs, xs, ws, sp, ar, int(ps), 0)
            src = cuda_large.source(*config, staged=bool(ps), own=cuda_large._own_applies(config),
                                    narrow=cuda_large._narrow_applies(config, True),
                                    xorder=bool(xo), wreuse=bool(wr), l2hint=bool(l2),
                                    escnext=True)
            put(key, src, cuda_large.kernel_name(*config), "sm_90a")
        elif kind == "permute_x":
            put(key, cuda_large._base_source(), "w12_permute_x", "sm_90a")
        elif kind in ("decode", "write_escapes"):
            put(key, base, "w12_" + kind, "sm_90")
print(json.dumps(units))
'''


def table_keys(only: str | None = None) -> list[list]:
    """The instantiations the working tree's table uses, as tree-independent keys."""
    sys.path.insert(0, str(ROOT))
    from w12_kernels.gemm import table
    from w12_kernels.gemm.wgmma import launcher as wg

    sections = table.load()
    keys: list[list] = [["decode"], ["write_escapes"], ["permute_x"]]
    small_rules = [table.small_rule_of([s]) for s in sections.values() if "small_m" in s]
    for rule in small_rules:
        entries = [(table.small_config(*map(int, shape.split("x")), 132, rule), shape)
                   for shape in rule["shapes"]]
        for kw in (1, 2, 4, 8, 16):  # the rule's own layouts at every kw it may pick
            entries.append((table.SmallConfig(kw, tuple(
                (c, table.Layout.from_dict(rule["by_nt"][str(c)])) for c in table.NT_CLASSES)),
                None))
        for cfg, _ in entries:
            for nt, _ in cfg.by_nt:
                lay = cfg.layout(8 * nt)
                keys.append(["small", nt, lay.depth, lay.tiles, lay.min_blocks, lay.x_stages,
                             lay.groups, cfg.kw, lay.w_stages, lay.cluster])
                if lay.wg:
                    depth, wgs, rg, split = lay.wg
                    sets = wg.check(cfg.kw, depth, 64, wgs, rg, split)
                    low = 8 * {1: 0, 2: 1, 4: 2, 8: 4}[nt] + 1  # the class's rows: low..8 nt
                    for n_block in sorted({min(64, 16 * -(-m // 16))
                                           for m in range(low, 8 * nt + 1)}):
                        keys.append(["wg", n_block, depth, wgs, sets, rg])
                        keys.append(["x_image", n_block])
            if cfg.one_pass:
                depth, wgs, rg, split = cfg.one_pass
                sets = wg.check(cfg.kw, depth, 128, wgs, rg, split)
                keys += [["wg", 128, depth, wgs, sets, rg], ["x_image", 128]]
    for section in sections.values():
        large = section.get("large", {})
        entries = [large.get("default")] + [e for by_m in large.get("shapes", {}).values()
                                            for e in by_m.values()]
        for entry in entries:
            cfg = table.entry_config(entry)
            if cfg is None:
                continue
            for c in ([cfg, cfg.tail_config()] if cfg.tail else [cfg]):
                keys.append(["wgl", c.block_m, c.warpgroups, c.x_stages, c.w_stages, c.splits,
                             c.a_regs, int(c.persist), int(c.xorder), int(c.wreuse),
                             int(c.l2hint)])
    keys = [list(k) for k in dict.fromkeys(tuple(k) for k in keys)]
    return [k for k in keys if only is None or k[0] in only.split(",")]


def sources(keys: list[list], rev: str | None) -> dict[str, dict]:
    """{key: unit} of ``keys`` in the working tree or at git revision ``rev``."""
    with tempfile.TemporaryDirectory() as scratch:
        path = str(ROOT)
        if rev is not None:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "w12_kernels",
                                      "w12"], capture_output=True)
            if archive.returncode != 0:
                raise SystemExit(f"kernel_sass: cannot export {rev!r}: "
                                 f"{archive.stderr.decode().strip()}")
            subprocess.run(["tar", "-x", "-C", scratch], input=archive.stdout, check=True)
            path = scratch
        done = subprocess.run([sys.executable, "-c", _GENERATOR, path], input=json.dumps(keys),
                              capture_output=True, text=True, cwd=path,
                              env={**os.environ, "PYTHONPATH": path})
        if done.returncode != 0:
            raise SystemExit(f"kernel_sass: the sources of {rev or 'the tree'} failed:\n"
                             f"{done.stderr[-3000:]}")
        units = json.loads(done.stdout)
        for unit in units.values():  # (the include folder goes when the scratch does)
            if unit["include"]:
                unit["headers"] = {p.name: p.read_text()
                                   for p in Path(unit["include"]).glob("*.cuh")}
        return units


def _mangled_prefix(name: str) -> str:
    """The start of the Itanium-mangled symbol of a template instantiation or a C++ function
    (``Li8E``, ``Lb0E`` per template argument); an extern "C" name as it is."""
    m = re.fullmatch(r"(\w+)<(.*)>", name)
    if m is None:
        return name
    base, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
    return f"_Z{len(base)}{base}I" + "".join(
        {"true": "Lb1E", "false": "Lb0E"}.get(a, f"Li{a}E") for a in args) + "E"


def _signature(source: str, name: str) -> str:
    """The parameter types of template kernel ``name``'s definition in ``source``, as an
    explicit instantiation spells them."""
    base = name.split("<")[0]
    m = re.search(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(?:__cluster_dims__"
                  r"\([^)]*\)\s*)?" + re.escape(base) + r"\s*\(([^)]*)\)", source)
    if m is None:
        raise SystemExit(f"kernel_sass: no definition of {base}")
    types = []
    for param in m.group(1).split(","):
        words = param.replace("__restrict__", " ").replace("*", "* ").split()
        types.append(" ".join(words[:-1]).replace(" *", "*"))
    return "(" + ", ".join(types) + ")"


def compile_unit(unit: dict, nvcc: str, cuobjdump: str) -> dict:
    """Registers, spill bytes and normalised SASS of one instantiation."""
    name = unit["symbol"]
    with tempfile.TemporaryDirectory() as scratch:
        src = unit["source"]
        for header, text in unit.get("headers", {}).items():
            (Path(scratch) / header).write_text(text)
        if "<" in name:
            src += f"\ntemplate __global__ void {name}{_signature(src, name)};\n"
        unit_path, cubin = Path(scratch) / "unit.cu", Path(scratch) / "unit.cubin"
        unit_path.write_text(src)
        done = subprocess.run([nvcc, "-std=c++17", f"-arch={unit['arch']}", "-cubin", "-o",
                               str(cubin), str(unit_path), f"-I{scratch}", "-Xptxas", "-v",
                               "-diag-suppress", "177,179"], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"kernel_sass: nvcc failed on {name}:\n{done.stderr[-2000:]}")
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True)
    prefix = _mangled_prefix(name)
    regs = spill = None
    current = None
    for line in done.stderr.splitlines():
        m = re.search(r"Compiling entry function '(\S+)'", line)
        if m:
            current = m.group(1)
        if current and (current == prefix or current.startswith(prefix if "<" in name
                                                                  else prefix + "P")
                        or current.startswith(f"_Z{len(name)}{name}")):
            m = re.search(r"(\d+) bytes spill stores", line)
            if m:
                spill = int(m.group(1))
            m = re.search(r"Used (\d+) registers", line)
            if m:
                regs = int(m.group(1))
    functions = {}
    for block in sass.stdout.split("Function : ")[1:]:
        fname, body = block.split("\n", 1)
        functions[fname.strip()] = body
    hits = [f for f in functions if f == prefix or f.startswith(prefix)
            or f.startswith(f"_Z{len(name)}{name}")]
    if len(hits) != 1:
        raise SystemExit(f"kernel_sass: no single function {name} in the disassembly: {hits}")
    ins = []
    for line in functions[hits[0]].splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2)))
    return {"regs": regs, "spill": spill, "sass": ins}


def main_loop(ins: list[tuple[int, str]]) -> list[tuple[int, str]] | None:
    """The innermost loop (a backward branch's span) holding at least four warpgroup MMAs;
    None where there is none."""
    best = None
    for addr, text in ins:
        m = re.search(r"\bBRA (?:`\()?(0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            span = [(a, t) for a, t in ins if int(m.group(1), 16) <= a <= addr]
            if sum("HGMMA" in t for _, t in span) >= 4 and (best is None or len(span) < len(best)):
                best = span
    return best


def _without_params(ins) -> list[str]:
    """The instructions with kernel-parameter offsets (constant bank 0) and branch targets
    left out."""
    out = []
    for _, text in ins:
        text = re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[0x0][P]", text)
        if re.search(r"\bBRA|\bCALL|\bBSSY|\bBSYNC|\bWARPSYNC", text):
            text = re.sub(r"0x[0-9a-f]+", "#", text)
        out.append(text)
    return out


def compare(key: str, tree: dict, base: dict | None) -> tuple[str, bool]:
    """One line of the report, and whether it is worse than the baseline."""
    line = f"{key:<64} regs {tree['regs']:>3} spill {tree['spill']:>4}"
    loop = main_loop(tree["sass"])
    if loop is not None:
        line += f" loop {len(loop):>4}"
    if base is None:
        return line, False
    b_loop = main_loop(base["sass"])
    line += (f" | baseline regs {base['regs']:>3} spill {base['spill']:>4}"
             + (f" loop {len(b_loop):>4}" if b_loop is not None else "")
             + f" | {_verdict(tree['sass'], base['sass'])}")
    if loop is not None and b_loop is not None:
        line += f"; main loop {_verdict(loop, b_loop)}"
    worse = (tree["regs"] > base["regs"] or tree["spill"] > base["spill"]
             or len(loop or ()) > len(b_loop or ()))
    return line + ("  <-- WORSE" if worse else ""), worse


def _verdict(ins, base) -> str:
    """``same``, ``same but params`` or how two instruction lists differ."""
    a_text, b_text = [t for _, t in ins], [t for _, t in base]
    if a_text == b_text:
        return "same"
    if _without_params(ins) == _without_params(base):
        return "same but params"
    a, b = collections.Counter(a_text), collections.Counter(b_text)
    return (f"differs: {len(a_text)} vs {len(b_text)} instructions, "
            f"+{sum((a - b).values())} -{sum((b - a).values())}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=None, help="git revision to compare with")
    parser.add_argument("--only", default=None,
                        help="kinds: small,wg,x_image,wgl,permute_x,decode,write_escapes")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    parser.add_argument("--nvcc", default=shutil.which("nvcc"))
    parser.add_argument("--cuobjdump", default=shutil.which("cuobjdump"))
    args = parser.parse_args()
    if not args.nvcc or not args.cuobjdump:
        raise SystemExit("kernel_sass: needs nvcc and cuobjdump (with nvdisasm) on PATH")
    keys = table_keys(args.only)
    tree = sources(keys, None)
    base = sources(keys, args.baseline) if args.baseline else {}
    jobs = [(k, u) for k, u in tree.items()] + [(("base", k), u) for k, u in base.items()]
    with ThreadPoolExecutor(args.jobs) as pool:
        done = dict(zip([k for k, _ in jobs],
                        pool.map(lambda job: compile_unit(job[1], args.nvcc, args.cuobjdump),
                                 jobs), strict=True))
    worse, report = [], []
    for key in tree:
        line, bad = compare(key, done[key], done.get(("base", key)))
        print(line, flush=True)
        report.append(line)
        if bad:
            worse.append(key)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    if worse:
        print(f"kernel_sass: {len(worse)} instantiation(s) use more registers, spill more or "
              "have a longer main loop")
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
