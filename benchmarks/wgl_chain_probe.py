"""Where the large-M kernel's time goes: the warpgroup-MMA kernel (``kernels_large.cu``) timed
as it is and with parts removed, all variants in one process and timed in alternation
(``benchmarks/gemm.py``'s method: CUDA graphs over rotating weight copies, 7 rounds, medians),
with cuBLAS and the image pass alone in the same rounds, at 256 rows.

The variants patch a copy of the kernel source (the shipped file is not touched); their outputs
are wrong by design, only their times mean something:

- the step's chain: ``nodecode_noesc`` (the chunk words go into the MMA's A registers without
  decode8, and the per-column escape check is skipped), ``nomma`` (no warpgroup MMAs), and
  ``nomma_nodecode_noesc`` (both: the data path and the fixed costs);
- the data path: ``floor_x_only`` / ``floor_w_only`` (that floor with only the activation or
  only the weight copies), ``floor_x_split8`` (each activation stage in 8 copies),
  ``floor_x_rotated`` (each block's columns rotated by its index), ``*_contig`` (the weight
  stage as one contiguous copy: the same bytes from other places), ``*_bulk`` (the per-tile
  weight copies, ``cuda_large.WEIGHT_MAP`` off);
- the fixed costs: ``nocopy`` (MMAs and decode, no copies), ``overhead`` (neither: launch, start,
  the loop's skeleton, the partial tile, the outputs), ``overhead_nostore`` (without the output
  stores), ``overhead_nostart`` (without the start's escape loads), ``empty`` (without both),
  ``launch_only`` (every thread returns at once: the launch and the image pass).

    python3 benchmarks/wgl_chain_probe.py                        # GPU, compute capability 9.0
    python3 benchmarks/wgl_chain_probe.py --variants full,overhead --shapes 4096x4096

docs/PERF_GEMM.md #63 has what it measured.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import gemm as G  # noqa: E402
from w12_kernels.gemm import cuda  # noqa: E402
from w12_kernels.gemm import cuda_large as cl  # noqa: E402

_DECODE = ("    decode8(w0.x, w1.x, w2.x, a[0]);\n    decode8(w0.y, w1.y, w2.y, a[1]);\n"
           "    decode8(w0.z, w1.z, w2.z, a[2]);\n    decode8(w0.w, w1.w, w2.w, a[3]);\n")
_NO_DECODE = ("    a[0][0] = w0.x; a[0][1] = w1.x; a[0][2] = w2.x; a[0][3] = w0.y;\n"
              "    a[1][0] = w1.y; a[1][1] = w2.y; a[1][2] = w0.z; a[1][3] = w1.z;\n"
              "    a[2][0] = w2.z; a[2][1] = w0.w; a[2][2] = w1.w; a[2][3] = w2.w;\n"
              "    a[3][0] = w0.x ^ w1.y; a[3][1] = w2.z; a[3][2] = w0.w ^ w1.x; a[3][3] = w2.y;\n")
_ESC = "    for (;;) {\n      u32 hits = __ballot_sync(0xffffffffu, ecol == gc && eok);"
_NO_ESC = _ESC.replace("{\n", "{\n      break;\n", 1)
_MMA = "    for (int j = 0; j < 4; ++j) WgmmaRS<BN>::mma(acc, a[j], sw128_desc(stage + 32 * j));"
_NO_MMA = "    for (int j = 0; j < 4; ++j) acc[j] += (float)(a[j][0] & 1u);"
# the data-movement probes: which of the two streams, and how it is copied, sets the floor
_W_ISSUE = ("      if (col >= SW) mbar_wait(wempty + col % SW, (u32)(col / SW - 1) & 1u);\n"
            "      if (lane == 0) issue_w(col % SW, col);\n")
_W_WAIT = "    mbar_wait(wfull + ws, PERS != 0 ? (q / SW) & 1u : (u32)(i / SW) & 1u);\n"
_X_ISSUE = ("      if (col >= SX) mbar_wait(xempty + col % SX, (u32)(col / SX - 1) & 1u);\n"
            "      if (lane == 0) issue_x(col % SX, col);\n")
_X_WAIT = "    mbar_wait(xfull + xs, PERS != 0 ? (q / SX) & 1u : (u32)(i / SX) & 1u);\n"
_X_COPY = ("    bulk_copy(smem + st * XSTAGE, ximg + (size_t)(c0 + col) * (XSTAGE / 2), XSTAGE,\n"
           "              bar);\n")
_X_COPY8 = ("    for (int pc = 0; pc < 8; ++pc)\n"
            "      bulk_copy(smem + st * XSTAGE + pc * (XSTAGE / 8),\n"
            "                ximg + (size_t)(c0 + col) * (XSTAGE / 2) + pc * (XSTAGE / 16),\n"
            "                XSTAGE / 8, bar);\n")
_X_ROT = _X_COPY.replace("(c0 + col)", "(c0 + (col + (int)blockIdx.x) % n)")
_W_COPY = ("#pragma unroll\n    for (int tt = 0; tt < 4 * WGS; ++tt) {\n"
           "      const int tile = min(tile0 + tt, ntiles - 1);  // rows past the last are not "
           "stored\n      bulk_copy(wstages + st * WSTAGE + tt * 1536,\n"
           "                chunks + ((size_t)tile * nchunks + c0 + col) * 96, 1536, bar);\n"
           "    }\n")
_W_CONTIG = ("    bulk_copy(wstages + st * WSTAGE, chunks + ((size_t)tile0 * nchunks\n"
             "              + (size_t)(c0 + col) * 4 * WGS) * 96, WSTAGE, bar);\n")
_NOCOPY = [(_W_ISSUE, ""), (_W_WAIT, ""), (_X_ISSUE, ""), (_X_WAIT, "")]
_STORE = "        if (col < last) yrow[(size_t)col * n_rows] = float_to_bf16(o);\n"
_STORE8 = ("          if (col < last)\n"
           "            *reinterpret_cast<uint4*>(yrow + (size_t)col * n_rows) =\n"
           "                make_uint4(w[0], w[1], w[2], w[3]);\n")
_NOSTART = [("\n  if (ebase < eend) load_escape();\n", "\n"),
            ("    e_first = esc_fix[row_out];", "    e_first = 0x7FFFFFFF;")]
_FLOOR = [(_MMA, _NO_MMA), (_DECODE, _NO_DECODE), (_ESC, _NO_ESC)]
PATCHES = {"full": [],
           "nodecode_noesc": [(_DECODE, _NO_DECODE), (_ESC, _NO_ESC)],
           "nomma": [(_MMA, _NO_MMA)],
           "nomma_nodecode_noesc": _FLOOR,
           # the floor without the weight copies, or without the activation copies
           "floor_x_only": _FLOOR + [(_W_ISSUE, ""), (_W_WAIT, "")],
           "floor_w_only": _FLOOR + [(_X_ISSUE, ""), (_X_WAIT, "")],
           # the floor with each activation stage in 8 copies, or each block's columns
           # rotated by its index (the blocks no longer read the same column at once)
           "floor_x_split8": _FLOOR + [(_X_COPY, _X_COPY8)],
           "floor_x_rotated": _FLOOR + [(_X_COPY, _X_ROT)],
           "full_x_rotated": [(_X_COPY, _X_ROT)],
           # the MMAs and decode alone (no copies, no waits on them), and not even those: the
           # launch, start and epilogue
           "nocopy": _NOCOPY,
           "overhead": _FLOOR + _NOCOPY,
           # the weight stage as one contiguous copy (the block's tiles' words read in order,
           # not each tile's column): the same bytes in other places
           "floor_w_only_contig": _FLOOR + [(_X_ISSUE, ""), (_X_WAIT, ""), (_W_COPY, _W_CONTIG)],
           "floor_contig": _FLOOR + [(_W_COPY, _W_CONTIG)],
           "full_contig": [(_W_COPY, _W_CONTIG)],
           # what the fixed cost is made of: without the output stores, without the start's
           # escape loads, without both
           "overhead_nostore": _FLOOR + _NOCOPY + [(_STORE, ""), (_STORE8, "")],
           "overhead_nostart": _FLOOR + _NOCOPY + _NOSTART,
           "empty": _FLOOR + _NOCOPY + [(_STORE, ""), (_STORE8, "")] + _NOSTART,
           # every thread leaves at once: the image pass and the launch of the grid alone
           "launch_only": [("  const int tid = threadIdx.x;\n",
                            "  if (M >= 0) return;\n  const int tid = threadIdx.x;\n")],
           # the per-tile weight copies (cuda_large.WEIGHT_MAP off; the others take its
           # default)
           "full_bulk": [],
           "floor_w_only_bulk": _FLOOR + [(_X_ISSUE, ""), (_X_WAIT, "")]}
BULK = ("full_bulk", "floor_w_only_bulk")
# shape -> the configurations (cuda_large.gemm_wgl's, in WGMMA_KEYS order) to probe on it
# (with ``a_regs`` 3: the two MMA warpgroups on one group of 64 rows, #65)
# (the last field, mcast 1: blocks in pairs sharing each activation stage by multicast, #66)
JOBS = {(4096, 4096): [(256, 1, 5, 8, 2, 1, 0), (256, 2, 5, 5, 3, 2, 0), (256, 1, 5, 6, 2, 3, 0),
                       (256, 1, 5, 6, 2, 3, 0, 0, 1)],
        (4096, 14336): [(256, 2, 5, 5, 3, 2, 0), (256, 1, 5, 6, 2, 3, 0),
                        (256, 1, 5, 6, 2, 3, 0, 0, 1)],
        (28672, 4096): [(256, 2, 5, 5, 1, 2, 0), (256, 2, 3, 10, 1, 2, 0)]}


def patched(variant: str, shipped: Path) -> str:
    text = shipped.read_text()
    for old, new in PATCHES[variant]:
        if text.count(old) != 1:
            raise SystemExit(f"wgl_chain_probe: the {variant} patch no longer matches "
                             "kernels_large.cu; update it")
        text = text.replace(old, new)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(PATCHES),
                        help="comma-separated variants to time (default: all)")
    parser.add_argument("--shapes", default=",".join(f"{n}x{k}" for n, k in JOBS),
                        help="comma-separated NxK shapes of JOBS to probe (default: all)")
    args = parser.parse_args()
    variants = args.variants.split(",")
    shapes = [tuple(map(int, v.split("x"))) for v in args.shapes.split(",")]
    if not set(shapes) <= set(JOBS):
        raise SystemExit(f"wgl_chain_probe: shapes must be among {list(JOBS)}")
    jobs = {shape: JOBS[shape] for shape in shapes}
    unknown = sorted(set(variants) - set(PATCHES))
    if unknown:
        raise SystemExit(f"wgl_chain_probe: unknown variants {unknown}; known: {list(PATCHES)}")
    if not cl.available():
        raise SystemExit("wgl_chain_probe: needs a compute-capability 9.0 GPU and CuPy")
    import cupy

    shipped = cl.SOURCE_PATH
    codes = {}
    with tempfile.TemporaryDirectory() as scratch:
        for variant in variants:
            path = Path(scratch) / f"{variant}.cu"
            path.write_text(patched(variant, shipped))
            cl.SOURCE_PATH = path
            for cfgs in jobs.values():
                for cfg in cfgs:
                    codes[(variant, cfg)] = cl.source(*cfg)
        cl.SOURCE_PATH = shipped
    major, minor = torch.cuda.get_device_capability()

    def build(key):
        mod = cupy.RawModule(code=codes[key], options=(
            "--std=c++17", f"--gpu-architecture=sm_{major}{minor}a"))
        return key, mod, mod.get_function(cl.kernel_name(*key[1]))

    funcs, modules = {}, []
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        for key, mod, fn in pool.map(build, list(codes)):
            cuda.allow_shared_memory(fn, cl.shared_bytes(*key[1][:4], *key[1][5:7],
                                                         splits=key[1][4]))
            funcs[key], _ = fn, modules.append(mod)
    current = ["full"]
    shipped_function, shipped_map = cl._function, cl.WEIGHT_MAP
    cl._function = lambda dev, config, *_: (shipped_function(dev, None) if config is None
                                            else funcs[(current[0], config)])
    try:
        for (n, k), cfgs in jobs.items():
            probe_shape(n, k, cfgs, variants, current)
            torch.cuda.empty_cache()
    finally:
        cl._function, cl.WEIGHT_MAP = shipped_function, shipped_map


def _call(x, w, n, k, kw, variant, current, shipped_map=cl.WEIGHT_MAP):
    def run():
        current[0] = variant  # the kernel this call launches (and a graph captures)
        cl.WEIGHT_MAP = variant not in BULK and shipped_map
        return cl.gemm_wgl(x, w.chunks, w.scale, w.esc_rowptr, w.esc_row, w.esc_col,
                           w.esc_val, w.esc_delta, w.esc_order,
                           w.esc_entry, w.esc_fix, None, n, k, **kw)
    return run


def probe_shape(n: int, k: int, cfgs: list, variants: list, current: list) -> None:
    """Every variant of every configuration on one shape at 256 rows, printed with cuBLAS and
    the image pass alone."""
    layer = G.Layer(n, k, seed=n + k)
    x = torch.randn(256, k, device="cuda").to(torch.bfloat16)
    order = [i % layer.copies for i in range(layer.copies * 4)]
    lists, labels = [], []
    for cfg in cfgs:
        kw = dict(zip(G.WGMMA_KEYS[:len(cfg)], cfg, strict=True))
        for variant in variants:
            lists.append([_call(x, layer.w12[i], n, k, kw, variant, current) for i in order])
            labels.append((cfg, variant))
    # cuBLAS on the same copies, timed in the same rounds
    lists.append([lambda w=layer.bf16[i]: torch.nn.functional.linear(x, w) for i in order])
    nchunks = int(layer.w12[0].chunks.shape[1])
    lists.append([lambda: cl.permute_x(x, nchunks, 256) for _ in order])
    *times, t_ref, t_img = G.time_graphs(lists)
    for (cfg, variant), t in zip(labels, times, strict=True):
        name = cl.kernel_name(*cfg[:7], *cfg[8:9])  # (WGMMA_KEYS order: tail before mcast)
        print(f"{n}x{k} M=256 {name:31s} {variant:22s} {t:8.2f} us",
              flush=True)
    print(f"{n}x{k} M=256 cublas {t_ref:.2f} us, image pass alone {t_img:.2f} us", flush=True)


if __name__ == "__main__":
    main()
