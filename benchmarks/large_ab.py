"""The large-M kernel with one launch option off and on, in the same CUDA graphs (on the GPU):
µs per call of each, cuBLAS's in the same rounds, the bits compared, and the geometric-mean
speedup over cuBLAS of both. ``--toggle pdl``: programmatic dependent launch after the image
pass (docs/PERF_GEMM.md #59); ``--toggle staged``: stream-K's last segment storing its outputs
through a BF16 staging tile (#76; the same launch for the other entries); ``--toggle own``: the
two-range epilogue keeping each block's own share of tokens in its accumulators (#80; the same
launch for the entries it does not apply to); ``--toggle narrow``: 24-bit partial sums between
blocks (#81; stream-K and the own-share entries; the bits differ by design, both checked against
float64); ``--toggle weighted``:
stream-K's blocks cut by ``cuda_large.stream_k_cuts``'s model rather than in equal shares (#78;
the sums of a unit are grouped otherwise, so the bits differ by design: both are checked against
float64 instead); ``--toggle xorder``: the activations copied straight from x, no image pass
(#83; each chunk column summed in x's K order, so the bits differ by design: both are checked
against float64); ``--toggle wreuse``: the token blocks of one tile block reading its columns at
about the same time (#84; the same bits, except stream-K's, whose units are cut elsewhere: both
checked against float64 there); ``--toggle l2hint``: the bulk copies with L2 eviction hints,
activations kept and weights evicted first (#91; the same bits); ``--toggle escnext``: each warp
keeping its next escape column, so that a column without escapes skips the escape check (#92;
the same bits). ``--cost piece=4,read=2,...`` overrides entries of ``STREAM_K_COST``.

``--write-table`` (the toggles that are table keys: ``xorder``, ``wreuse``, ``l2hint``): where
the option on was faster than off by more than ``--margin`` percent in every one of
``--rounds`` rounds (and within the error budget), the shape's entry for that M class gets the
key; where it was slower by that much in every round, an entry that has the key loses it. With
``--device-table`` the entries go into this GPU model's section of the table (as
``gemm.py --sweep-large --write-table --device-table`` writes them).

Each shape runs the large-M table's configuration for ``--m`` rows; the calls cycle through
weight copies past the L2, as in ``gemm.py``. Exit status 1 where the two launches' bits differ
(``weighted``, ``narrow``: where either is outside the error budget).

    python benchmarks/large_ab.py --toggle staged --m 256
    python benchmarks/large_ab.py --toggle l2hint --m 512 --rounds 2 --write-table --device-table
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gemm as G  # noqa: E402
from benchmarks.gemm import SWEEP_SHAPES, Layer, check, time_graphs  # noqa: E402
from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import cuda_large  # noqa: E402

CALLS = 20  # calls per graph
SAME_BITS = ("pdl", "staged", "own", "l2hint", "escnext")  # toggles that must not change the bits
TABLE_KEYS = ("xorder", "wreuse", "l2hint")  # toggles that are keys of the large-M table


def same_bits(toggle: str, cfg: cfgs.LargeConfig) -> bool:
    """Whether ``toggle`` must leave the bits of ``cfg``'s launch as they are."""
    return toggle in SAME_BITS or (toggle == "wreuse" and not cfg.persist and cfg.tail != 1)


def time_shape(n: int, k: int, m: int, cfg: cfgs.LargeConfig, toggle: str = "pdl",
               rounds: int = 1) -> tuple[list[tuple[float, float, float]], bool]:
    """µs per call with ``toggle`` off, on and of cuBLAS, one triple a round (each round its
    own graphs), and whether the bits agree (toggles not in SAME_BITS, and ``wreuse`` with
    stream-K: whether both are within the error budget, ``gemm.check`` at most 2)."""
    layer = Layer(n, k, seed=n + k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    kw = dict(block_m=cfg.block_m, warpgroups=cfg.tiles // 4, x_stages=cfg.num_stages,
              w_stages=cfg.w_stages, splits=cfg.splits, a_regs=cfg.a_regs,
              persist=cfg.persist, tail=cfg.tail, mcast=cfg.mcast)
    for own in TABLE_KEYS:  # (the entry's own choice, where not the toggle)
        if toggle != own:
            kw[own] = bool(getattr(cfg, own))

    def call(pw, on, xx=x):
        return cuda_large.gemm_wgl(xx, pw.chunks, pw.scale, pw.esc_rowptr, pw.esc_row,
                                   pw.esc_col, pw.esc_val, pw.esc_delta, pw.esc_order,
                                   pw.esc_entry, pw.esc_fix, None,
                                   pw.n, pw.k, **{toggle: on}, **kw)

    def calls(on):
        return [lambda pw=layer.w12[i % layer.copies]: call(pw, on) for i in range(CALLS)]

    if same_bits(toggle, cfg):
        same = torch.equal(call(layer.w12[0], False).view(torch.int16),
                           call(layer.w12[0], True).view(torch.int16))
    else:  # each within the error budget: at most 2x cuBLAS's error against float64
        same = all(check(layer, m, lambda xx, pw, on=on: call(pw, on, xx)) <= 2.0
                   for on in (False, True))
    cublas = [lambda w=layer.bf16[i % layer.copies]: torch.nn.functional.linear(x, w)
              for i in range(CALLS)]
    times = [tuple(time_graphs([calls(False), calls(True), cublas])) for _ in range(rounds)]
    return times, same


def table_change(entry: dict, toggle: str, times: list, margin: float) -> dict | None:
    """The entry with ``toggle`` set (the option on beat off by more than ``margin``, a
    fraction, in every round of ``times``: (off, on, cuBLAS) triples) or removed (off beat on
    so, and the entry has it); None where neither holds or nothing would change."""
    if times and all(on < off * (1 - margin) for off, on, _ in times):
        return None if entry.get(toggle) else {**entry, toggle: 1}
    if times and all(off < on * (1 - margin) for off, on, _ in times) and entry.get(toggle):
        return {key: v for key, v in entry.items() if key != toggle}
    return None


def table_entry(n: int, k: int, m: int, rule: dict) -> tuple[str, dict] | None:
    """The M class whose entry serves ``m`` rows of shape (N, K) in ``rule`` and that entry
    (None where the shape has no class that large)."""
    by_m = rule["shapes"].get(f"{n}x{k}", {})
    cls = next((c for c in sorted(int(c) for c in by_m) if m <= c), None)
    return None if cls is None else (str(cls), by_m[str(cls)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, default=256, help="activation rows (> 64)")
    parser.add_argument("--shapes", default=None, help="NxK,... (default: the benchmark's)")
    parser.add_argument("--toggle", default="pdl",
                        choices=("pdl", "staged", "own", "narrow", "weighted", "xorder",
                                 "wreuse", "l2hint", "escnext"),
                        help="the gemm_wgl option timed off and on")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times each shape is timed, each in new graphs")
    parser.add_argument("--write-table", action="store_true",
                        help="set or clear the toggle's key in the large-M table where it won "
                             "or lost in every round (xorder, wreuse, l2hint)")
    parser.add_argument("--device-table", action="store_true",
                        help="with --write-table: into this GPU model's section of the table")
    parser.add_argument("--margin", type=float, default=1.0,
                        help="with --write-table: percent by which one side must win each "
                             "round (default 1)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    parser.add_argument("--cost", default="",
                        help="name=value,... overriding cuda_large.STREAM_K_COST's entries")
    args = parser.parse_args()
    if args.write_table and args.toggle not in TABLE_KEYS:
        parser.error(f"--write-table takes the toggles that are table keys: {TABLE_KEYS}")
    if args.device_table and not args.write_table:
        parser.error("--device-table goes with --write-table")
    if args.rounds < 1:
        parser.error("--rounds takes 1 or more")
    for item in filter(None, args.cost.split(",")):
        name, value = item.split("=")
        if name not in cuda_large.STREAM_K_COST:
            raise SystemExit(f"large_ab: --cost {name}: not one of "
                             f"{', '.join(cuda_large.STREAM_K_COST)}")
        cuda_large.STREAM_K_COST[name] = float(value)
    if not cuda_large.available():
        raise SystemExit("large_ab: needs a compute-capability 9.0 GPU and CuPy")
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else SWEEP_SHAPES)
    rows, differ, out, writes = [], [], [], {}
    t = args.toggle
    rule = cfgs.large_rule(cfgs.current_gpu())
    print(f"shape | {t} off us | {t} on us | on/off | cublas us | bits"
          + (" (a round a line)" if args.rounds > 1 else ""), flush=True)
    for n, k in shapes:
        cfg = cfgs.large_config(n, k, args.m)
        if cfg.kind != "wgmma":
            print(f"{n}x{k} | the table's choice at {args.m} rows is {cfg.kind}: skipped")
            continue
        times, same = time_shape(n, k, args.m, cfg, args.toggle, args.rounds)
        torch.cuda.empty_cache()  # (the shape's weights went with time_shape's frame)
        rows.extend(times)
        if not same:
            differ.append(f"{n}x{k}")
        verdict = (("same" if same else "DIFFER") if same_bits(t, cfg)
                   else ("in budget" if same else "OVER BUDGET"))
        for off, on, ref in times:
            print(f"{n}x{k} | {off:.2f} | {on:.2f} | {on / off:.3f} | {ref:.2f} | {verdict}",
                  flush=True)
        row = dict(n=n, k=k, m=args.m, times=times, same=same)
        found = table_entry(n, k, args.m, rule)
        if args.write_table and same and found is not None:
            change = table_change(found[1], t, times, args.margin / 100)
            if change is not None:
                writes.setdefault(f"{n}x{k}", {})[found[0]] = change
                row["written"] = change
                print(f"{n}x{k} | class {found[0]}: {t} "
                      + ("set" if change.get(t) else "cleared"), flush=True)
        out.append(row)
    if args.json:
        args.json.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), toggle=t,
                                             rows=out), indent=1))
    if args.write_table:
        G.write_large_table({"max_m": 0, "shapes": writes},
                            torch.cuda.get_device_name() if args.device_table else None)
        print(f"wrote w12_kernels/gemm/{cfgs.TUNED_PATH.name}: {len(writes)} shapes changed"
              + (f" in the {torch.cuda.get_device_name()} section" if args.device_table else ""))
    if rows:
        g_off = math.exp(sum(math.log(r / p) for p, _, r in rows) / len(rows))
        g_on = math.exp(sum(math.log(r / q) for _, q, r in rows) / len(rows))
        print(f"geomean vs cuBLAS at M={args.m} ({len(out)} shapes x {args.rounds} rounds): "
              f"{t} off x{g_off:.3f}, "
              f"{t} on x{g_on:.3f}")
    if differ:
        raise SystemExit(f"large_ab: the bits differ or are over budget on {', '.join(differ)}")


if __name__ == "__main__":
    main()
