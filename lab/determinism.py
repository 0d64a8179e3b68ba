"""Whether the same inputs give the same bits twice: each W12 linear shape alone at several M,
then a batched prefill on two fresh engines.

    python lab/determinism.py --model synthetic:smollm2-135m --batch 8

Prints, per (module, M), how many of ``--reps`` repeats differ from the first call anywhere;
then, for the prefill, whether the logits and each layer's K cache match between the engines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generate import Engine  # noqa: E402
from engine.model import Linear  # noqa: E402
from engine.speculative.api import load_target, read_prompts  # noqa: E402
from engine.weights import load_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="synthetic:smollm2-135m")
    parser.add_argument("--mode", default="w12")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rows", default="1,8,16,128,155,256,512,1240,2048")
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--engines", type=int, default=3)
    parser.add_argument("--graph", action="store_true", help="engines with their CUDA graph")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--skip-linears", action="store_true")
    parser.add_argument("--prompts", default=None,
                        help="prefill these prompts (JSONL or humaneval; the first --batch) "
                             "instead of random tokens; needs a converted model folder")
    parser.add_argument("--large", choices=["table", "nopersist", "cublas", "persist"],
                        default="table",
                        help="above 128 rows: the table's kernel, it without stream-K, decode + "
                             "cuBLAS, or it with stream-K on every entry whose configuration "
                             "allows it (more stream-K than the table has)")
    parser.add_argument("--sdpa", default=None,
                        help="pin the prefill's SDPA backend (MATH, FLASH_ATTENTION, ...)")
    parser.add_argument("--patch", action="append", default=[],
                        choices=["ldcg", "nopdl", "nostage", "rowdirect", "sleep",
                                 "noproxyfence", "refillsleep"],
                        help="experiments on the large-M kernel: stream-K pieces read past L1 "
                             "(ldcg); every launch without programmatic dependent launch (nopdl); "
                             "a block's last unit not staged (nostage)")
    parser.add_argument("--chain", action="store_true",
                        help="the linears also back to back, no synchronisation between them")
    parser.add_argument("--all-modules", action="store_true",
                        help="every linear module (their escapes differ), not one per shape")
    a = parser.parse_args()
    _pin_large(a.large)
    _patch_kernel(a.patch)
    if a.prompts:
        target = load_target(a.model, read_prompts(a.prompts, a.batch), mode=a.mode,
                             device=a.device)
        model, prompts = target.loaded.model, target.prompts
    else:
        model, prompts = load_model(a.model, mode=a.mode, device=a.device).model, None
    gen = torch.Generator().manual_seed(0)
    seen = set()
    for name, module in model.named_modules():
        if a.skip_linears or not isinstance(module, Linear):
            continue
        shape = (module.in_features, module.out_features)
        if shape in seen and not a.all_modules:
            continue
        seen.add(shape)
        cells = []
        for m in map(int, a.rows.split(",")):
            x = torch.randn(m, shape[0], generator=gen).to(a.device, torch.bfloat16)
            with torch.inference_mode():
                first = module(x)
                bad = sum(not torch.equal(module(x).view(torch.int16), first.view(torch.int16))
                          for _ in range(a.reps))
            cells.append(f"M={m}:{bad}")
        if not a.all_modules or any(not c.endswith(":0") for c in cells):
            print(f"{name:<28} K={shape[0]:<5} N={shape[1]:<6} " + " ".join(cells), flush=True)
    if a.all_modules:
        print(f"{sum(isinstance(m, Linear) for m in model.modules())} linear modules tested; "
              "those listed above differ somewhere")

    if a.chain:
        _chain(model, a)
    if a.engines < 2:
        return
    if prompts is None:
        vocab = model.args.vocab_size
        lengths = [int(torch.randint(100, 160, (1,), generator=gen)) for _ in range(a.batch)]
        prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    lengths = [len(p) for p in prompts]
    runs = []
    for _ in range(a.engines):
        engine = Engine(model, batch=a.batch, max_seq_len=max(lengths) + 8,
                        cuda_graph=a.graph, compile=a.compile)
        with _sdpa(a.sdpa):
            logits = engine.prefill(prompts).clone()
        runs.append((logits, [layer.clone() for layer in engine.cache.k]))
    l0, k0 = runs[0]
    for l1, k1 in runs[1:]:
        rows = [r for r in range(a.batch) if not torch.equal(l0[r].view(torch.int16),
                                                             l1[r].view(torch.int16))]
        print(f"prefill of {a.batch} prompts of {lengths} tokens (graph {a.graph}, compile "
              f"{a.compile}, large {a.large}, sdpa {a.sdpa}): logits differ from the first "
              f"engine's in rows {rows}")
        for i, (x, y) in enumerate(zip(k0, k1, strict=True)):
            differ = (x.view(torch.int16) != y.view(torch.int16)).transpose(1, 2).flatten(2).any(-1)
            if differ.any():  # (batch rows, positions) of this layer's K that differ
                rows, pos = differ.nonzero(as_tuple=True)
                print(f"  first K cache difference: layer {i}, rows {sorted(set(rows.tolist()))}"
                      f", first positions {pos[:8].tolist()}")
                break


def _pin_large(kind: str) -> None:
    """Rows above the small-M path: the table's choice, it with stream-K off, or cuBLAS."""
    from dataclasses import replace

    from w12_kernels.gemm import table

    if kind == "table":
        return
    chosen = table.large_config

    def pinned(*args, **kwargs):
        cfg = chosen(*args, **kwargs)
        if kind == "cublas" or cfg is None:
            return None
        if kind == "persist":
            return replace(cfg, persist=True, tail=0) if cfg.a_regs == 2 and cfg.splits == 1 \
                else cfg
        return replace(cfg, persist=False, tail=0)

    table.large_config = pinned


def _patch_kernel(patches: list[str]) -> None:
    from w12_kernels.gemm.cuda import runtime
    from w12_kernels.gemm.large import launcher

    def replace_text(old: str, new: str) -> None:  # in the large-M kernel's source, from now on
        base = launcher.source

        def source(cfg):
            text = base(cfg)
            assert old in text, old
            return text.replace(old, new)

        launcher.source = source

    if "ldcg" in patches:
        replace_text("unpack24x16(p[0], p[stride], p[2 * stride], v);",
                     "unpack24x16(__ldcg(p), __ldcg(p + stride), __ldcg(p + 2 * stride), v);")
    if "nostage" in patches:  # a block's last unit stored straight from the accumulators
        replace_text("if (sge == nseg - 1 && (n_rows & 7) == 0",
                     "if (false && sge == nseg - 1 && (n_rows & 7) == 0")
    if "rowdirect" in patches:  # stream-K's row data read from global memory, not the ring
        replace_text("const float4 d0 = rowring[rloc], d1 = rowring[rloc + 8];",
                     "auto rd = [&](int r) { const int row = min(tile0 * 16 + r, n_rows - 1); "
                     "return make_float4(scale[row], bias != nullptr ? bf16_to_float(bias[row]) "
                     ": 0.0f, __int_as_float(esc_fix[row]), __int_as_float(rowptr[row + 1])); }; "
                     "const float4 d0 = rd(rloc), d1 = rd(rloc + 8);")
    if "sleep" in patches:  # an owner waits 20 us more after each piece's flag
        replace_text("wait_flag(flags + bb);", "wait_flag(flags + bb); __nanosleep(20000);")
    if "noproxyfence" in patches:  # the weight stage released without the proxy fence (the
        # kernel before the fix of the suspected write-after-read race)
        replace_text('    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");\n'
                     '    __syncwarp();', "    __syncwarp();")
    if "refillsleep" in patches:  # the producer waits 4 us after each weight stage is released
        replace_text("if (j >= SW) mbar_wait(wempty + j % SW, (j / SW - 1) & 1u);",
                     "if (j >= SW) { mbar_wait(wempty + j % SW, (j / SW - 1) & 1u); "
                     "__nanosleep(4000); }")
    if "nopdl" in patches:
        launch = runtime.launch

        def no_pdl(*args, pdl=False, **kwargs):
            return launch(*args, pdl=False, **kwargs)

        runtime.launch = no_pdl


def _sdpa(backend: str | None):
    import contextlib

    if backend is None:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(getattr(SDPBackend, backend))


def _chain(model, a) -> None:
    """Every linear at each M of ``--rows``, all launched back to back (as a prefill launches
    them), ``--reps`` times; the runs whose outputs differ from the first's, per M."""
    mods = [(n, m) for n, m in model.named_modules() if isinstance(m, Linear)]
    gen = torch.Generator().manual_seed(1)
    for m in map(int, a.rows.split(",")):
        xs = [torch.randn(m, mod.in_features, generator=gen).to(a.device, torch.bfloat16)
              for _, mod in mods]
        with torch.inference_mode():
            runs = [[mod(x) for (_, mod), x in zip(mods, xs, strict=True)]
                    for _ in range(a.reps + 1)]
        bad, shown = {}, 0
        for run in runs[1:]:
            for (name, _), y0, y in zip(mods, runs[0], run, strict=True):
                if not torch.equal(y.view(torch.int16), y0.view(torch.int16)):
                    bad[name] = bad.get(name, 0) + 1
                    if shown < 6:  # where: the (row, column) box and the size of the change
                        shown += 1
                        rows, cols = (y.view(torch.int16) != y0.view(torch.int16)).nonzero(
                            as_tuple=True)
                        d = (y.float() - y0.float()).abs()[rows, cols]
                        print(f"  {name}: {rows.numel()} outputs ({rows.unique().numel()} tokens"
                              f" x {cols.unique().numel()} columns), rows {rows.min().item()}.."
                              f"{rows.max().item()}, columns {cols.min().item()}.."
                              f"{cols.max().item()}, largest change {d.max().item():.3g} "
                              f"(|y| up to {y0.float().abs()[rows, cols].max().item():.3g})")
        print(f"chain M={m} (large {a.large}, patches {a.patch}): {sum(bad.values())} of "
              f"{len(mods) * a.reps} outputs differ from the first run's, in {len(bad)} of "
              f"{len(mods)} linears" + (f" {sorted(bad.items())[:6]}" if bad else ""),
              flush=True)


if __name__ == "__main__":
    main()
