"""A/B of programmatic dependent launch for the small-M W12 kernel (``cuda.PDL``), on the GPU.

``gemm``: for each distinct layer shape of ``benchmarks/gemm.py`` and each M, ``w12_linear``
launched with and without the attribute and cuBLAS, their CUDA graphs of back-to-back calls
(cycling through weight copies, as ``gemm.py`` times them) replayed in alternation; then the
geometric-mean speedup over cuBLAS per M for both and the bits compared. The kernel before
each W12 call in these graphs is the previous W12 call, which does not let its dependents
start early (no ``griddepcontrol.launch_dependents``), as no kernel of the engine does: what
overlaps is the launch and this kernel's weight loads with the end of the one before.

``decode``: the engine's decode step (``engine.bench.time_decode``) on one W12 model with the
attribute off and on, alternating, and the BF16 model once per batch for the ratio.

    python benchmarks/pdl_ab.py gemm --m 1,8,16,32
    python benchmarks/pdl_ab.py decode --model synthetic:qwen3-8b --batch 1,32
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from w12_kernels.gemm import cuda  # noqa: E402


def _with_pdl(flag: bool, fn):
    def run(*args, **kwargs):
        old = cuda.PDL
        cuda.PDL = flag
        try:
            return fn(*args, **kwargs)
        finally:
            cuda.PDL = old
    return run


def run_gemm(m_values, shapes=None) -> list[dict]:
    import gemm as bench  # benchmarks/gemm.py

    rows = []
    for n, k in shapes or bench.SWEEP_SHAPES:
        layer = bench.Layer(n, k, seed=n + k)
        for m in m_values:
            runs = {"pdl": _with_pdl(True, bench.default_run),
                    "plain": _with_pdl(False, bench.default_run)}
            t_ref, res = bench._measure(layer, m, runs)
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            same = torch.equal(runs["pdl"](x, layer.w12[0]).view(torch.int16),
                               runs["plain"](x, layer.w12[0]).view(torch.int16))
            rows.append(dict(n=n, k=k, m=m, cublas_us=t_ref, pdl_us=res["pdl"][0],
                             plain_us=res["plain"][0], same_bits=same))
        del layer
        torch.cuda.empty_cache()
    print()
    for m in m_values:
        mine = [r for r in rows if r["m"] == m]
        g = {key: math.exp(sum(math.log(r["cublas_us"] / r[f"{key}_us"]) for r in mine)
                           / len(mine))
             for key in ("plain", "pdl")}
        gain = math.exp(sum(math.log(r["plain_us"] / r["pdl_us"]) for r in mine) / len(mine))
        print(f"M={m:<3} geomean over cuBLAS: plain x{g['plain']:.3f}  pdl x{g['pdl']:.3f}  "
              f"(pdl time gain x{gain:.3f}; bits equal on {sum(r['same_bits'] for r in mine)}"
              f" of {len(mine)})")
    return rows


def run_decode(spec: str, batches, tokens: int, repeats: int) -> list[dict]:
    import gc

    from engine.bench import time_decode
    from engine.weights import load_model

    out = []
    for mode in ("w12", "bf16"):
        loaded = load_model(spec, mode=mode, device=torch.device("cuda"), seed=0)
        for batch in batches:
            flags = (False, True) * repeats if mode == "w12" else (None,)
            for flag in flags:
                seconds, engine, _ = _with_pdl(bool(flag), time_decode)(
                    loaded.model, batch=batch, tokens=tokens, compile=True, seed=0)
                del engine
                label = mode if flag is None else f"w12 pdl={'on' if flag else 'off'}"
                ms = 1e3 * seconds / tokens
                print(f"{spec} batch {batch:>3} {label:<12} {ms:8.3f} ms/step", flush=True)
                out.append(dict(model=spec, batch=batch, mode=mode, pdl=flag, ms_per_step=ms))
        loaded.model.setup_caches(1, 1)
        del loaded
        gc.collect()
        torch.cuda.empty_cache()
    print()
    for batch in batches:
        bf16 = [r["ms_per_step"] for r in out if r["batch"] == batch and r["mode"] == "bf16"]
        for flag in (False, True):
            ms = sorted(r["ms_per_step"] for r in out
                        if r["batch"] == batch and r["mode"] == "w12" and r["pdl"] is flag)
            print(f"{spec} batch {batch}: W12 pdl={'on' if flag else 'off'} median "
                  f"{ms[len(ms) // 2]:.3f} ms/step, x{bf16[0] / ms[len(ms) // 2]:.3f} over BF16 "
                  f"({bf16[0]:.3f})")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--m", default="1,8,16,32")
    g.add_argument("--shapes", default=None, help="NxK,... (default: every distinct shape)")
    d = sub.add_parser("decode")
    d.add_argument("--model", default="synthetic:qwen3-8b")
    d.add_argument("--batch", default="1,32")
    d.add_argument("--tokens", type=int, default=256)
    d.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("pdl_ab.py needs a CUDA GPU")
    if args.what == "gemm":
        shapes = ([tuple(map(int, v.split("x"))) for v in args.shapes.split(",")]
                  if args.shapes else None)
        run_gemm([int(v) for v in args.m.split(",")], shapes)
    else:
        run_decode(args.model, [int(v) for v in args.batch.split(",")], args.tokens,
                   args.repeats)


if __name__ == "__main__":
    main()
