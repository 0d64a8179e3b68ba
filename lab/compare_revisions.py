"""The pieces of ``compare_revisions.sh``: the W12 GEMM of one source tree against another's on
the same GPU, by the bits of their outputs and by ``benchmarks/gemm.py``'s times.

    python lab/compare_revisions.py outputs --tree DIR --out new.json [--shapes ...] [--m ...]
    python lab/compare_revisions.py bits old.json new.json
    python lab/compare_revisions.py ratios --old a.json,b.json --new c.json,d.json
    python lab/compare_revisions.py shapes

``outputs`` runs ``w12_linear`` of the tree ``--tree`` (its packages first on the import path,
only the public API used, so that any revision's tree works) on seeded inputs that are the same
for every tree: per weight shape a random BF16 weight with escapes planted (zeros, subnormals,
values out of the row's window; an inf and a NaN in the last row) and a bias, per M the first M
rows of one seeded activation matrix; 65..128 rows also inside ``invariant_rows(64)`` (the
prefill path). Each output is kept as a digest of its bits. Shapes are split over ``--workers``
processes. ``bits`` compares two such files; ``ratios`` two sets of the benchmark's JSON files,
the last lines the geometric means of new over old time per M.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

DEFAULT_M = "1,2,4,8,16,24,32,48,64,96,128,256,512,1024,2048"
ROOT = Path(__file__).resolve().parents[1]


def parse_list(text: str, what: str) -> list:
    try:
        if what == "m":
            values = [int(v) for v in text.split(",")]
            if not values or min(values) < 1:
                raise ValueError
            return values
        shapes = [tuple(int(v) for v in item.split("x")) for item in text.split(",")]
        if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
            raise ValueError
        return shapes
    except ValueError:
        raise SystemExit(f"compare_revisions: bad --{what} {text!r}") from None


def table_shapes() -> list[tuple[int, int]]:
    """Every weight shape the working tree's table names, in any section."""
    table = json.loads((ROOT / "w12_kernels/gemm/tuned.json").read_text())
    shapes = set()
    for section in table["sections"].values():
        shapes |= set(section.get("small_m", {}).get("shapes", {}))
        shapes |= set(section.get("large", {}).get("shapes", {}))
    return sorted(tuple(map(int, s.split("x"))) for s in shapes)


def weight(n: int, k: int, device: str):
    """The seeded BF16 weight of shape (N, K), with escapes planted; the same bits on every
    tree and device kind (drawn on the CPU)."""
    import torch

    gen = torch.Generator().manual_seed(n * 1_000_003 + k)
    w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    flat = w.view(-1)
    flat[::997] = 0.0
    flat[5::1009] = 1.0e-39  # subnormal
    flat[11::4099] = 3.0e30  # out of the row's window
    if n > 1:
        w[n - 1, 1] = float("inf")
        w[n - 1, k - 1] = float("nan")
    return w.to(device)


def activations(m: int, k: int, device: str):
    import torch

    gen = torch.Generator().manual_seed(7 * k + 1)
    return torch.randn(m, k, generator=gen).to(torch.bfloat16).to(device)


def digest(t) -> str:
    """The sha256 of a BF16 tensor's bits."""
    import torch

    return hashlib.sha256(t.contiguous().view(torch.int16).cpu().numpy().tobytes()).hexdigest()


def output_keys(shape: tuple[int, int], ms: list[int]) -> list[tuple[str, int, bool]]:
    """(key, M, prefill) of every output computed for a shape: each M, and 65..128 rows again
    inside ``invariant_rows(64)``."""
    n, k = shape
    out = [(f"{n}x{k}@{m}", m, False) for m in ms]
    out += [(f"{n}x{k}@{m}/prefill", m, True) for m in ms if 64 < m <= 128]
    return out


def compute_outputs(shapes, ms, device: str) -> dict[str, str]:
    """{key: digest} of ``w12_linear`` of the tree on the import path."""
    import torch

    import w12
    from w12_kernels.gemm import invariant_rows, prepare_weight, w12_linear

    out = {}
    for n, k in shapes:
        w = weight(n, k, device)
        pw = prepare_weight(w12.encode(w))
        bias_gen = torch.Generator().manual_seed(n + 13)
        bias = torch.randn(n, generator=bias_gen).to(torch.bfloat16).to(device)
        x = activations(max(ms), k, device)
        for key, m, prefill in output_keys((n, k), ms):
            if prefill:
                with invariant_rows(64):
                    y = w12_linear(x[:m], pw, bias)
            else:
                y = w12_linear(x[:m], pw, bias)
            out[key] = digest(y)
        print(f"{n}x{k}: {len(ms)} row counts", flush=True)
        del w, pw, x
        if device == "cuda":
            torch.cuda.empty_cache()
    return out


def split(shapes: list, workers: int) -> list[list]:
    """The shapes dealt to ``workers`` processes, the largest first, each to the lightest."""
    parts = [[] for _ in range(max(1, min(workers, len(shapes))))]
    load = [0] * len(parts)
    for s in sorted(shapes, key=lambda s: -s[0] * s[1]):
        i = load.index(min(load))
        parts[i].append(s)
        load[i] += s[0] * s[1]
    return parts


def cmd_outputs(args) -> int:
    tree = Path(args.tree).resolve()
    shapes = parse_list(args.shapes, "shapes") if args.shapes else table_shapes()
    parse_list(args.m, "m")  # (checked before the workers start)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(tree), os.environ.get("PYTHONPATH")) if p)}
    procs = []

    def stop(signum, frame):  # (a time limit's TERM: the workers go too)
        for proc, _ in procs:
            proc.kill()
        raise SystemExit(f"compare_revisions: stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    for i, part in enumerate(split(shapes, args.workers)):
        part_file = f"{args.out}.part{i}"
        cmd = [sys.executable, __file__, "worker", "--tree", str(tree), "--out", part_file,
               "--shapes", ",".join(f"{n}x{k}" for n, k in part), "--m", args.m,
               "--device", args.device]
        procs.append((subprocess.Popen(cmd, env=env, cwd=str(tree)), part_file))
    merged, failed = {}, 0
    for proc, part_file in procs:
        if proc.wait() != 0:
            failed += 1
            continue
        merged.update(json.loads(Path(part_file).read_text()))
        Path(part_file).unlink()
    Path(args.out).write_text(json.dumps({"tree": str(tree), "outputs": merged}, indent=0))
    print(f"{len(merged)} outputs of {tree} in {args.out}" + (f"; {failed} worker(s) failed"
                                                               if failed else ""))
    return 1 if failed else 0


def cmd_worker(args) -> int:
    import w12_kernels

    tree = Path(args.tree).resolve()
    if not Path(w12_kernels.__file__).resolve().is_relative_to(tree):
        raise SystemExit(f"compare_revisions: imported {w12_kernels.__file__}, not {tree}'s")
    outs = compute_outputs(parse_list(args.shapes, "shapes"), parse_list(args.m, "m"),
                           args.device)
    Path(args.out).write_text(json.dumps(outs))
    return 0


def compare_bits(old: dict, new: dict) -> tuple[list[str], list[str], list[str]]:
    """(keys whose digests differ, keys only in the old file, keys only in the new one)."""
    differ = sorted(k for k in old.keys() & new.keys() if old[k] != new[k])
    return differ, sorted(old.keys() - new.keys()), sorted(new.keys() - old.keys())


def cmd_bits(args) -> int:
    old = json.loads(Path(args.old).read_text())["outputs"]
    new = json.loads(Path(args.new).read_text())["outputs"]
    differ, only_old, only_new = compare_bits(old, new)
    same = len(old.keys() & new.keys()) - len(differ)
    print(f"bits: {same} outputs the same, {len(differ)} differ"
          + (f", {len(only_old) + len(only_new)} computed on one side only"
             if only_old or only_new else ""))
    for key in differ:
        print(f"  DIFFER {key}")
    for key in only_old + only_new:
        print(f"  MISSING {key} ({'old' if key in only_old else 'new'} only)")
    return 1 if differ or only_old or only_new or not same else 0


def ratio_rows(old_rows: list[dict], new_rows: list[dict]) -> list[dict]:
    """Per (shape, M) measured by both: the old and new W12 and cuBLAS times and new / old."""
    old = {(r["n"], r["k"], r["m"]): r for r in old_rows}
    out = []
    for r in new_rows:
        o = old.get((r["n"], r["k"], r["m"]))
        if o is None:
            continue
        out.append(dict(n=r["n"], k=r["k"], m=r["m"], old_us=o["w12_us"], new_us=r["w12_us"],
                        ratio=r["w12_us"] / o["w12_us"], old_cublas_us=o["cublas_us"],
                        new_cublas_us=r["cublas_us"], old_speedup=o["cublas_us"] / o["w12_us"],
                        new_speedup=r["cublas_us"] / r["w12_us"]))
    return sorted(out, key=lambda r: (r["m"], r["n"], r["k"]))


def _geo(values) -> float:
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def ratio_table(rows: list[dict]) -> list[str]:
    """The report: a line per (shape, M), then per M the geometric mean of new / old time and
    of each side's speedup over cuBLAS, then all of them."""
    lines = [f"{'shape':>13} {'M':>5} {'old us':>9} {'new us':>9} {'new/old':>8} "
             f"{'old x':>6} {'new x':>6}"]
    for r in rows:
        lines.append(f"{r['n']:>6}x{r['k']:<6} {r['m']:>5} {r['old_us']:9.2f} {r['new_us']:9.2f} "
                     f"{r['ratio']:8.3f} {r['old_speedup']:6.3f} {r['new_speedup']:6.3f}")
    lines.append("")
    for m in sorted({r["m"] for r in rows}):
        sel = [r for r in rows if r["m"] == m]
        lines.append(f"M={m:<5} new/old time x{_geo(r['ratio'] for r in sel):.3f} "
                     f"(worst x{max(r['ratio'] for r in sel):.3f}); speedup over cuBLAS old "
                     f"x{_geo(r['old_speedup'] for r in sel):.3f} new "
                     f"x{_geo(r['new_speedup'] for r in sel):.3f}")
    if rows:
        lines.append(f"all {len(rows)} points: new/old time x{_geo(r['ratio'] for r in rows):.3f}")
    return lines


def _rows(files: str) -> list[dict]:
    out = []
    for name in filter(None, files.split(",")):
        data = json.loads(Path(name).read_text())
        out += data["rows"]
    return out


def cmd_ratios(args) -> int:
    rows = ratio_rows(_rows(args.old), _rows(args.new))
    for line in ratio_table(rows):
        print(line)
    return 0 if rows else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    for name in ("outputs", "worker"):
        p = sub.add_parser(name)
        p.add_argument("--tree", required=True)
        p.add_argument("--out", required=True)
        p.add_argument("--shapes", default=None, help="NxK,... (default: the table's shapes)")
        p.add_argument("--m", default=DEFAULT_M)
        p.add_argument("--device", default="cuda")
        p.add_argument("--workers", type=int, default=4)
    p = sub.add_parser("bits")
    p.add_argument("old")
    p.add_argument("new")
    p = sub.add_parser("ratios")
    p.add_argument("--old", required=True)
    p.add_argument("--new", required=True)
    sub.add_parser("shapes")
    args = parser.parse_args()
    if args.cmd == "shapes":
        print(",".join(f"{n}x{k}" for n, k in table_shapes()))
        return 0
    return {"outputs": cmd_outputs, "worker": cmd_worker, "bits": cmd_bits,
            "ratios": cmd_ratios}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
