"""Where one decode step's time goes, per kernel, BF16 against W12 (on the GPU).

For each mode the model is built, an ``Engine`` prefills random prompts exactly as
``benchmarks/decode.py`` does (CUDA graph and compiled elementwise ops), and one decode step
is profiled (``spec_tuning.profiler.profile_step``: wall time of the step, then the kernels'
device time per step). Kernels are grouped into the W12 GEMM, cuBLAS GEMMs and the rest; the
step's wall time minus the kernels' sum is the time no kernel ran (launch gaps, tails).

``--steps N`` profiles N steps run back to back (no synchronisation between them, as
``benchmarks/decode.py`` runs them) and reports the per-step means; ``--advance P`` first runs
P steps so that the profiled ones sit at the cache positions of the middle of a long run. The
SM clock, power and temperature are sampled during the profiled steps where ``nvidia-smi``
exists.

    python lab/step_kernels.py --model synthetic:qwen3-32b --batch 32
    python lab/step_kernels.py --model synthetic:qwen3-32b --advance 128 --steps 32
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
from engine.gpu_clocks import ClockSampler  # noqa: E402
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


def _run_steps(step, tokens: torch.Tensor, steps: int) -> None:
    for _ in range(steps):
        step(tokens)


@torch.inference_mode()
def profile_mode(spec: str, mode: str, batch: int, prompt_len: int, repeats: int,
                 steps: int = 1, advance: int = 0) -> dict:
    loaded = load_model(spec, mode=mode, device=torch.device("cuda"), seed=0)
    # room for the warmup steps, the advance and every profiled call (wall-clock and profiler)
    engine = Engine(loaded.model, batch=batch,
                    max_seq_len=prompt_len + 16 + advance + steps * (2 * repeats + 2),
                    cuda_graph=True, compile=True)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, loaded.args.vocab_size, (batch, prompt_len),
                            generator=gen).tolist()
    tokens = engine.prefill(prompts).argmax(-1)
    for _ in range(4 + advance):
        tokens = engine.step(tokens).argmax(-1)

    with ClockSampler(torch.device("cuda")) as clocks:
        prof = profile_step(functools.partial(_run_steps, engine.step, tokens, steps),
                            device="cuda", warmup=2, repeats=repeats)
    groups: dict[str, float] = {}
    for k in prof.kernels:
        groups[group_of(k.name)] = groups.get(group_of(k.name), 0.0) + k.seconds / steps
    st = clocks.stats
    out = dict(mode=mode, batch=batch, steps=steps, advance=advance,
               step_ms=1e3 * prof.step_seconds / steps,
               kernel_ms=1e3 * prof.kernel_seconds / steps,
               clocks=None if st is None else st.describe(),
               groups_ms={g: 1e3 * s for g, s in sorted(groups.items())},
               kernels=[dict(name=k.name[:120], ms=1e3 * k.seconds / steps,
                             calls=k.calls / steps)
                        for k in prof.kernels[:30]])
    del engine  # and with it the cache
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
    parser.add_argument("--steps", type=int, default=1,
                        help="steps per profiled call, run back to back (default 1)")
    parser.add_argument("--advance", type=int, default=0,
                        help="steps run before profiling, to reach later cache positions")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.steps < 1 or args.advance < 0:
        parser.error("--steps must be >= 1 and --advance >= 0")
    results = []
    for mode in args.modes.split(","):
        r = profile_mode(args.model, mode, args.batch, args.prompt_len, args.repeats,
                         steps=args.steps, advance=args.advance)
        results.append(r)
        print(f"== {args.model} {mode} batch {args.batch} ({args.steps} steps a call, after "
              f"{args.advance}): step {r['step_ms']:.3f} ms, kernels "
              f"{r['kernel_ms']:.3f} ms, no kernel running {r['step_ms'] - r['kernel_ms']:.3f} ms")
        if r["clocks"]:
            print(f"   {r['clocks']}")
        print("   " + ", ".join(f"{g} {ms:.3f}" for g, ms in r["groups_ms"].items()))
        for k in r["kernels"][:18]:
            print(f"   {k['ms']:8.3f} ms  {k['calls']:6.1f} calls  {k['name']}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
