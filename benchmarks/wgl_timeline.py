"""Where a large-M call's fixed costs go, per block: the warpgroup-MMA kernel
(``kernels_large.cu``) and its image pass with ``%globaltimer`` stamps, at 256 rows, on the
one-wave layers and one layer of several waves, with the large-M table's configuration
(``--m``: another row count, its entry's ``wreuse``, ``xorder`` and ``l2hint`` included). An
``xorder`` entry has no image pass: its stamps count from its first block's entry. Shapes whose
entry has a tail launch, or is not the warpgroup kernel, are reported and skipped.

A patched copy of the kernel source (the shipped file is not touched) stamps, per block: its
entry (thread 0), the producer's first activation copy issued (after ``griddepcontrol.wait``
returned, i.e. once the image pass is done), thread 0's first escape batch landed (the
consumers' start: their main loop needs it for column 0), the end of the main loop (thread 0,
after its last MMAs), the partial tile stored and met (the block or cluster barrier), the K
split's inbox landed (two K ranges; otherwise the same as the barrier) and the end of the
stores (the consumer threads met at a named barrier, then thread 0). The image pass stamps
each block's entry and end. Stream-K entries (``persist``) stamp instead, per block, its first
segment's loop end and end (a piece written and flagged, or its unit stored) and its last
segment's loop end, the owner's pieces added and the stores' end (either store path), with the
block's segment count (``stream_k_durations``), and each block's µs a step over its loops with
the multiprocessor it ran on (``%smid``, stamped at entry; ``stream_k_step_rates``). The call
is replayed in a CUDA graph over rotating weight copies (as ``benchmarks/gemm.py`` times it)
and the stamps of the graph's last call are read back, in µs from the image pass's first
block entry. The stamps cost a few stores and the end's barrier; the call's time with and
without them is printed beside (same graphs, medians).

    python3 benchmarks/wgl_timeline.py                       # GPU, compute capability 9.0
    python3 benchmarks/wgl_timeline.py --shapes 4096x4096 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gemm as G  # noqa: E402
from w12_kernels.gemm import config as cfgs  # noqa: E402
from w12_kernels.gemm import cuda  # noqa: E402
from w12_kernels.gemm import cuda_large as cl  # noqa: E402

SHAPES = ((4096, 4096), (6144, 4096), (10240, 5120), (5120, 8192), (4096, 14336),
          (28672, 4096))
MAX_IMAGE_BLOCKS = 1 << 16  # the image pass's stamp slots (its grid is chunk columns x token
# blocks x 8 blocks of 32 tokens: 6400 at 512 rows of K 25600; before they had their own count,
# blocks past 4096 went unstamped, so the pass's end read ~30-45% early on the largest K)
MAX_BLOCKS = 4096  # stamp slots (blocks of the GEMM grid, of the image pass; blocks past
# them stamp nothing, so a grid of more blocks is read in part, never written out of bounds)
STAMPS = ("entry", "first_x_issued", "loop_end", "partial_met", "inbox", "stores_end",
          "escapes_ready")
# stream-K (``persist``): a block's first segment and its last (its only one where it has one);
# slot 7 holds the block's segment count
STREAM_K_STAMPS = ("entry", "seg0_loop_end", "seg0_end", "last_loop_end", "last_pieces_added",
                   "last_end")

_DEFS = (
    f"__device__ unsigned long long w12_tl[{MAX_BLOCKS} * 8];\n"
    f"__device__ unsigned long long w12_tl_img[{MAX_IMAGE_BLOCKS} * 2];\n"
    f"__device__ unsigned w12_tl_sm[{MAX_BLOCKS}];\n"
    "__device__ __forceinline__ unsigned long long w12_now() {\n"
    "  unsigned long long t;\n"
    "  asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t));\n"
    "  return t;\n}\n"
    "#define W12_BLOCK (blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z))\n"
    f"#define W12_SLOT (W12_BLOCK < {MAX_BLOCKS})\n"
    f"#define W12_IMG_SLOT (W12_BLOCK < {MAX_IMAGE_BLOCKS})\n"
    "#define W12_STAMP(k) (W12_SLOT ? (void)(w12_tl[W12_BLOCK * 8 + (k)] = w12_now()) : (void)0)\n"
)
_ENTRY = 'extern "C" __global__ void __launch_bounds__(256)\nw12_permute_x('
_IMG_START = '  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");\n'
_IMG_END = "  image[s] = make_uint4(v[0], v[1], v[2], v[3]);\n"
_FIRST_X = "      if (lane == 0) issue_x(col % SX, col);\n    }\n"
_MET = ("  if (CL) cluster_sync_all(); else __syncthreads();\n"
        "  if constexpr (PUSH) {\n")
_INBOX = "    mbar_wait(inbar, 0u);  // the other ranks' sums of this share have landed\n"
_ESC_READY = "\n  if (ebase < eend) load_escape();\n"
_END = "  // no block leaves while another reads its memory (MC: or arrives on its barriers)\n"


def _before(anchor: str, text: str) -> tuple[str, str]:
    return anchor, text + anchor


def _after(anchor: str, text: str) -> tuple[str, str]:
    return anchor, anchor + text


# (old, new): each ``old`` must occur exactly once in kernels_large.cu
PATCHES = [
    # the image pass: each block's entry and end
    _before(_ENTRY, _DEFS),
    _before(_IMG_START,
            "  if (threadIdx.x == 0 && W12_IMG_SLOT) w12_tl_img[W12_BLOCK * 2] = w12_now();\n"),
    _after(_IMG_END, "  __syncthreads();\n  if (threadIdx.x == 0 && W12_IMG_SLOT)\n"
                     "    w12_tl_img[W12_BLOCK * 2 + 1] = w12_now();\n"),
    # the GEMM: entry, first activation copy issued, loop end, partial tile met, inbox, stores
    _after("  const int tid = threadIdx.x;\n  const int wg = tid >> 7;\n",
           "  if (tid == 0) W12_STAMP(0);\n"
           "  if (tid == 0 && W12_SLOT) {\n    unsigned sm;\n"
           "    asm volatile(\"mov.u32 %0, %%smid;\" : \"=r\"(sm));\n"
           "    w12_tl_sm[W12_BLOCK] = sm;\n  }\n"),
    (_FIRST_X,
     _FIRST_X.replace("\n    }", "\n      if (col == 0 && lane == 0) W12_STAMP(1);\n    }")),
    # thread 0's first escape batch landed (the timer read waits on it): the consumers' start
    _after(_ESC_READY, "  if (tid == 0 && !producer) {\n    u32 z;\n"
                       "    asm volatile(\"and.b32 %0, %1, 0;\" : \"=r\"(z) : \"r\"(ecol));\n"
                       "    unsigned long long t;\n"
                       "    asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t) : \"r\"(z));\n"
                       "    if (W12_SLOT) w12_tl[W12_BLOCK * 8 + 6] = t + z;\n  }\n"),
    _after("  if (!producer) wgmma_wait<0>();\n", "  if (tid == 0) W12_STAMP(2);\n"),
    (_MET, _MET.replace("\n  if constexpr", "\n  if (tid == 0) W12_STAMP(3);\n  if constexpr")),
    _after(_INBOX, "    if (tid == 0) W12_STAMP(4);\n"),
    _before(_END, "  if (!producer) {\n"
                  "    asm volatile(\"bar.sync 5, %0;\" :: \"n\"(THREADS) : \"memory\");\n"
                  "    if (tid == 0) W12_STAMP(5);\n  }\n"),
]


_SK_LOOP = ("        wgmma_wait<0>();  // (the last column's stage is released by the next one's "
            "MMAs)\n")
_SK_PIECE = ("          mbar_wait(rowfull, (u32)sg & 1u);\n          arrive_if(true, rowempty);\n"
             "          continue;\n")
_SK_ADDED = "          } while (cuts[bb + 1] < uend);\n"
_SK_STORED = ("            yb[(size_t)tk * n_rows + (hi ? gr1 : gr0)] = float_to_bf16(o);\n"
              "        }\n")
_SK_STAGED = ("            if (live) *reinterpret_cast<uint4*>(yo + (size_t)tk * n_rows) = v;\n"
              "          }\n")
_SK_END = ("        if (threadIdx.x == 0) {\n          if (sg == 0) W12_STAMP(2);\n"
           "          if (sg == nseg - 1) {\n            W12_STAMP(5);\n"
           "            if (W12_SLOT) w12_tl[W12_BLOCK * 8 + 7] = (unsigned long long)nseg;\n"
           "          }\n        }\n")
# (thread 0 of the block; threadIdx.x read where needed, as the kernel keeps no thread index in
# a register through the main loop)
PATCHES += [
    _after(_SK_LOOP, "        if (threadIdx.x == 0) {\n          if (sg == 0) W12_STAMP(1);\n"
                     "          if (sg > 0 && sg == nseg - 1) W12_STAMP(3);\n        }\n"),
    (_SK_PIECE, _SK_PIECE.replace("          continue;",
                                  "          if (threadIdx.x == 0) W12_STAMP(2);\n"
                                  "          continue;")),
    _after(_SK_ADDED, "          if (threadIdx.x == 0) W12_STAMP(4);\n"),
    _after(_SK_STORED, _SK_END),
    _after(_SK_STAGED, _SK_END),  # (the last segment's staged stores: PERS_STAGE)
]


def patched(shipped: Path) -> str:
    text = shipped.read_text()
    for old, new in PATCHES:
        if text.count(old) != 1:
            raise SystemExit("wgl_timeline: a patch no longer matches kernels_large.cu: "
                             f"{old[:60]!r}...")
        text = text.replace(old, new)
    return text


class NotStamped(Exception):
    """The table's entry for a shape is one this probe does not stamp."""


def table_config(n: int, k: int, m: int = 256) -> dict:
    """The large-M table's configuration at ``m`` rows for this shape (``gemm_wgl``'s
    keywords)."""
    e = cfgs.large_config(n, k, m)
    if e.kind != "wgmma":
        raise NotStamped(f"the table has no warpgroup entry for {n}x{k} at {m} rows")
    if e.tail:
        raise NotStamped(f"{n}x{k} at {m} rows: tail launches are not stamped")
    return dict(block_m=e.block_m, warpgroups=e.tiles // 4, x_stages=e.num_stages,
                w_stages=e.w_stages, splits=e.splits, a_regs=e.a_regs, persist=e.persist,
                mcast=e.mcast, wreuse=bool(e.wreuse), l2hint=bool(e.l2hint),
                xorder=bool(e.xorder))


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * (len(s) - 1) + 0.5))]


def start_time(stamps, image) -> int:
    """The stamps' zero (ns): the image pass's first block entry, or without an image pass
    (no block of it stamped: xorder) the GEMM's first block entry."""
    image = image[image[:, 0] > 0]
    return int(image[:, 0].min()) if len(image) else int(stamps[stamps[:, 0] > 0, 0].min())


def summarize(stamps, image, names: tuple[str, ...] = STAMPS) -> dict:
    """The per-block stamps ([blocks, 8] and the image pass's [blocks, 2], ns; unused slots 0)
    as µs from the image pass's first block entry (without an image pass, xorder: from the
    GEMM's first block entry): each phase's min, median and max over the blocks that stamped
    it, and when the image pass's blocks ended (first, last; None without one)."""
    used = stamps[:, 0] > 0
    image = image[image[:, 0] > 0]
    t0 = start_time(stamps, image)
    rows = {name: [(int(v) - t0) / 1e3 for v in stamps[used, j] if v > 0]
            for j, name in enumerate(names)}
    ends = image[:, 1]
    return {"blocks": int(used.sum()),
            "image_first_end": (int(ends.min()) - t0) / 1e3 if len(ends) else None,
            "image_last_end": (int(ends.max()) - t0) / 1e3 if len(ends) else None,
            "phases": {name: {"min": _pct(v, 0), "median": _pct(v, 0.5), "max": _pct(v, 1)}
                       for name, v in rows.items() if v}}


def stream_k_durations(stamps) -> dict:
    """Stream-K's per-block phases in µs (STREAM_K_STAMPS, slot 7 the segment count): the first
    segment's start and main loop (entry to its loop's end), its epilogue (a piece's sums
    written and flagged, or its unit stored), and for blocks of more than one segment the last
    one's main loop, the owner's wait for and adding of its unit's pieces, and its stores; each
    as min, median and max over the blocks that have it, with how many do."""
    used = stamps[:, 0] > 0
    st = stamps[used].astype("int64")
    multi = st[:, 7] > 1
    owner = multi & (st[:, 4] > 0)

    def span(rows, a, b):
        return [(int(r[b]) - int(r[a])) / 1e3 for r in rows]

    phases = {
        "seg0_start_and_loop": span(st, 0, 1),
        "seg0_epilogue": span(st, 1, 2),
        "last_loop": span(st[multi], 2, 3),
        "owner_wait_and_add": span(st[owner], 3, 4),
        "owner_stores": span(st[owner], 4, 5),
        "last_stores_unowned": span(st[multi & ~owner], 3, 5),
    }
    out = {"segments": {int(v): int((st[:, 7] == v).sum()) for v in sorted(set(st[:, 7]))}}
    for name, v in phases.items():
        if v:
            out[name] = {"blocks": len(v), "min": _pct(v, 0), "median": _pct(v, 0.5),
                         "max": _pct(v, 1)}
    return out


def stream_k_step_rates(stamps, sms, cuts) -> list[dict]:
    """Per stream-K block (stamps [blocks, 8] in ns, STREAM_K_STAMPS with the consumers' start
    in slot 6 and the segment count in slot 7; ``sms`` its multiprocessor; ``cuts`` its steps):
    the time its loops took (consumers' start to the last loop's end, less the first segment's
    epilogue where it has two) over its steps, in µs, with its block and SM index."""
    out = []
    for b, row in enumerate(stamps[: len(cuts) - 1]):
        if row[0] <= 0 or row[6] <= 0:
            continue
        steps = int(cuts[b + 1]) - int(cuts[b])
        if row[7] > 1 and row[3] > 0:
            loops = (int(row[3]) - int(row[6])) - (int(row[2]) - int(row[1]))
        else:
            loops = int(row[1]) - int(row[6])
        out.append({"block": b, "sm": int(sms[b]), "steps": steps,
                    "us_per_step": loops / 1e3 / max(1, steps)})
    return out


def probe(n: int, k: int, scratch: Path, raw: bool = False,
          weighted: bool | None = None, m: int = 256) -> dict:
    import cupy

    kw = table_config(n, k, m)
    if kw["persist"]:
        kw["weighted"] = weighted
    config = (kw["block_m"], kw["warpgroups"], kw["x_stages"], kw["w_stages"], kw["splits"],
              kw["a_regs"], kw["persist"], kw["mcast"])
    shipped = cl.SOURCE_PATH
    path = scratch / "kernels_large_timeline.cu"
    path.write_text(patched(shipped))
    cl.SOURCE_PATH = path
    try:
        code = cl.source(*config, wreuse=kw["wreuse"], l2hint=kw["l2hint"],
                         xorder=kw["xorder"])
    finally:
        cl.SOURCE_PATH = shipped
    major, minor = torch.cuda.get_device_capability()
    mod = cupy.RawModule(code=code, options=("--std=c++17",
                                             f"--gpu-architecture=sm_{major}{minor}a"))
    gemm_fn = mod.get_function(cl.kernel_name(*config))
    cuda.allow_shared_memory(gemm_fn, cl.shared_bytes(*config[:4], *config[5:7],
                                                      splits=config[4]))
    image_fn = mod.get_function("w12_permute_x")
    layer = G.Layer(n, k, seed=n + k)
    x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    stamped = [False]
    shipped_function = cl._function

    def function(dev, conf, *args):
        if not stamped[0]:
            return shipped_function(dev, conf, *args)
        return image_fn if conf is None else gemm_fn

    def call(i, stamp):
        def run():
            stamped[0] = stamp
            w = layer.w12[i]
            return cl.gemm_wgl(x, w.chunks, w.scale, w.esc_rowptr, w.esc_row, w.esc_col,
                               w.esc_val, w.esc_delta, w.esc_order,
                               w.esc_entry, w.esc_fix, None, n, k, **kw)
        return run

    cl._function = function
    try:
        t_plain, t_stamped, t_ref = G.time_graphs(
            [[call(i, False) for i in order], [call(i, True) for i in order],
             [lambda w=layer.bf16[i]: torch.nn.functional.linear(x, w) for i in order]])
        tl = cupy.ndarray((MAX_BLOCKS * 8,), dtype=cupy.uint64,
                          memptr=mod.get_global("w12_tl"))
        img = cupy.ndarray((MAX_IMAGE_BLOCKS * 2,), dtype=cupy.uint64,
                           memptr=mod.get_global("w12_tl_img"))
        tl.fill(0)
        img.fill(0)
        graph = G._capture([call(i, True) for i in order])
        tl.fill(0)
        img.fill(0)
        graph.replay()
        torch.cuda.synchronize()
        stamps = tl.get().reshape(MAX_BLOCKS, 8).astype("int64")
        image = img.get().reshape(MAX_IMAGE_BLOCKS, 2).astype("int64")
        sms = cupy.ndarray((MAX_BLOCKS,), dtype=cupy.uint32,
                           memptr=mod.get_global("w12_tl_sm")).get().astype("int64")
    finally:
        cl._function = shipped_function
    out = {"shape": f"{n}x{k}", "config": cl.kernel_name(*config), "us_plain": t_plain,
           "us_stamped": t_stamped, "us_cublas": t_ref,
           **summarize(stamps, image, STREAM_K_STAMPS if kw["persist"] else STAMPS)}
    if kw["persist"]:
        out["stream_k"] = stream_k_durations(stamps)
        tiles = -(-n // 16)
        steps = (-(-tiles // (4 * kw["warpgroups"])) * -(-m // kw["block_m"])
                 * -(-k // 64))  # (units: tile blocks x token blocks)
        out["cuts"] = list(cl.stream_k_cuts(steps, -(-k // 64), out["blocks"], weighted))
        out["step_rates"] = stream_k_step_rates(stamps, sms, out["cuts"])
    if raw:  # every block's stamps, µs from the image pass's first block entry (0: none)
        t0 = start_time(stamps, image)
        out["per_block"] = [[round((int(v) - t0) / 1e3, 3) if v > 0 and j < 7 else int(v)
                             for j, v in enumerate(row)]
                            for row in stamps[stamps[:, 0] > 0]]
        out["per_block_sm"] = [int(v) for v in sms[stamps[:, 0] > 0]]
    image_grid = -(-k // 64) * -(-m // kw["block_m"]) * (kw["block_m"] // 32)
    if out["image_last_end"] is not None and image_grid > MAX_IMAGE_BLOCKS:
        print(f"    (the image pass's first {MAX_IMAGE_BLOCKS} of {image_grid} blocks stamped: "
              "its end reads early)")
    print(f"{n}x{k} M={m} {out['config']}: {out['blocks']} blocks; call {t_plain:.2f} us "
          f"(stamped {t_stamped:.2f}), cuBLAS {t_ref:.2f} us; "
          + ("no image pass (xorder: µs from the first block's entry)"
             if out["image_last_end"] is None else
             f"image pass ends {out['image_first_end']:.2f}..{out['image_last_end']:.2f}"),
          flush=True)
    for name, p in out["phases"].items():
        print(f"    {name:15s} min {p['min']:7.2f}  median {p['median']:7.2f}  "
              f"max {p['max']:7.2f} us", flush=True)
    if "step_rates" in out:
        rates = out["step_rates"]
        print("    us a step, block by block (its loops over its steps): "
              + ", ".join(f"{q} {_pct([r['us_per_step'] for r in rates], v):.3f}"
                          for q, v in (("min", 0), ("median", 0.5), ("max", 1)))
              + "; slowest (block/SM): "
              + ", ".join(f"{r['block']}/{r['sm']} {r['us_per_step']:.3f}"
                          for r in sorted(rates, key=lambda r: -r["us_per_step"])[:8]),
              flush=True)
    if "stream_k" in out:
        print(f"    stream-K segments a block: {out['stream_k']['segments']}; durations:")
        for name, p in out["stream_k"].items():
            if name != "segments":
                print(f"    {name:22s} ({p['blocks']:3d} blocks) min {p['min']:7.2f}  "
                      f"median {p['median']:7.2f}  max {p['max']:7.2f} us", flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in SHAPES))
    parser.add_argument("--m", type=int, default=256, help="activation rows (> 64)")
    parser.add_argument("--json", help="write the stamps' summary here")
    parser.add_argument("--raw", action="store_true",
                        help="with --json: also every block's stamps")
    parser.add_argument("--equal", action="store_true",
                        help="stream-K entries: equal shares (not the model's cuts)")
    args = parser.parse_args(argv)
    if not cl.available():
        print("wgl_timeline: needs a compute-capability 9.0 GPU and CuPy", file=sys.stderr)
        return 2
    shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        for n, k in shapes:
            try:
                results.append(probe(n, k, Path(scratch), args.raw,
                                     False if args.equal else None, args.m))
            except NotStamped as why:
                print(f"wgl_timeline: skipped: {why}", flush=True)
            torch.cuda.empty_cache()
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
