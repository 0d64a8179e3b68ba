"""Where one decode step's time goes, per kernel, BF16 against W12 (on the GPU).

For each mode the model is built, an ``Engine`` prefills random prompts exactly as
``benchmarks/decode.py`` does (CUDA graph and compiled elementwise ops), and one decode step
is profiled (``spec_tuning.profiler.profile_step``: wall time of the step, then the kernels'
device time per step). Kernels are grouped into the W12 GEMM, cuBLAS GEMMs and the rest; the
step's wall time minus the kernels' sum is the time no kernel ran (launch gaps, tails).

    python benchmarks/step_kernels.py --model synthetic:qwen3-32b --batch 32
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generate import Engine  # noqa: E402
from engine.weights import load_model  # noqa: E402
from spec_tuning.profiler import profile_step  # noqa: E402

GROUPS = (("w12 gemm", ("w12_gemm", "w12_wg", "w12_large")),
          ("cublas gemm", ("gemm", "nvjet", "xmma", "cutlass", "sm90_")),
          ("attention", ("attention", "attn")))


def group_of(name: str) -> str:
    low = name.lower()
    for label, parts in GROUPS:
        if any(p in low for p in parts):
            return label
    return "other"


@torch.inference_mode()
def profile_mode(spec: str, mode: str, batch: int, prompt_len: int, repeats: int) -> dict:
    loaded = load_model(spec, mode=mode, device=torch.device("cuda"), seed=0)
    engine = Engine(loaded.model, batch=batch, max_seq_len=prompt_len + 64, cuda_graph=True,
                    compile=True)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, loaded.args.vocab_size, (batch, prompt_len),
                            generator=gen).tolist()
    tokens = engine.prefill(prompts).argmax(-1)
    for _ in range(4):
        tokens = engine.step(tokens).argmax(-1)
    prof = profile_step(functools.partial(engine.step, tokens), device="cuda", warmup=2,
                        repeats=repeats)
    groups: dict[str, float] = {}
    for k in prof.kernels:
        groups[group_of(k.name)] = groups.get(group_of(k.name), 0.0) + k.seconds
    out = dict(mode=mode, batch=batch, step_ms=1e3 * prof.step_seconds,
               kernel_ms=1e3 * prof.kernel_seconds,
               groups_ms={g: 1e3 * s for g, s in sorted(groups.items())},
               kernels=[dict(name=k.name[:120], ms=1e3 * k.seconds, calls=k.calls)
                        for k in prof.kernels[:30]])
    del engine
    loaded.model.setup_caches(1, 1)
    del loaded
    gc.collect()
    torch.cuda.empty_cache()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="synthetic:qwen3-32b")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--modes", default="bf16,w12")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = []
    for mode in args.modes.split(","):
        r = profile_mode(args.model, mode, args.batch, args.prompt_len, args.repeats)
        results.append(r)
        print(f"== {args.model} {mode} batch {args.batch}: step {r['step_ms']:.3f} ms, kernels "
              f"{r['kernel_ms']:.3f} ms, no kernel running {r['step_ms'] - r['kernel_ms']:.3f} ms")
        print("   " + ", ".join(f"{g} {ms:.3f}" for g, ms in r["groups_ms"].items()))
        for k in r["kernels"][:18]:
            print(f"   {k['ms']:8.3f} ms  {k['calls']:4d} calls  {k['name']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
