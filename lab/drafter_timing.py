"""Times the two phases of ``w12 draft train`` at a model's real shapes, to choose its
``--num-prompts`` and ``--steps`` inside a time limit, and runs the block drafter once through
the CUDA-graphed speculative runner.

A synthetic preset stands in for the model (random weights of its shapes, random prompts of
realistic lengths): the time of a generation step and of a training step depend on the shapes,
not on the weights. Prints seconds per prompt answered, per training step (after a warm-up),
a projection for the given counts, and the step time of speculative decoding with the drafter.

    python lab/drafter_timing.py --preset smollm2-135m --prompts 256 --steps 60
"""

from __future__ import annotations

import argparse
import time

import torch

from engine.generate import Engine
from engine.speculative import BlockDrafter, speculative_generate
from engine.speculative.train_drafter import (
    TrainLog,
    TrainOptions,
    generate_responses,
    train_drafter,
)
from engine.weights import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=256, help="prompts answered (timed)")
    parser.add_argument("--steps", type=int, default=60, help="training steps (timed)")
    parser.add_argument("--plan-prompts", type=int, default=3072)
    parser.add_argument("--plan-steps", type=int, default=3000)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--layers", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--max-prompt", type=int, default=300)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    target = load_model(f"synthetic:{args.preset}", mode="bf16", device=device).model
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(60, args.max_prompt, (args.prompts,), generator=gen)
    prompts = [torch.randint(3, target.args.vocab_size, (int(n),), generator=gen).tolist()
               for n in lengths]
    options = TrainOptions(layers=args.layers, steps=args.steps, batch=args.batch,
                           anchors=args.anchors, max_new_tokens=args.max_new_tokens,
                           warmup=5)
    began = time.perf_counter()
    data = generate_responses(target, prompts, options=options, stop_ids=frozenset())
    if device.type == "cuda":
        torch.cuda.synchronize()
    per_prompt = (time.perf_counter() - began) / len(prompts)
    stamps: list[float] = []

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def tick(stats: dict) -> None:
        sync()
        stamps.append(time.perf_counter())

    log = TrainLog(options={}, target=args.preset)
    net = train_drafter(target, data, options, log=log, progress=tick)
    warm = 5
    per_step = (stamps[-1] - stamps[warm]) / (len(stamps) - 1 - warm)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else 0.0
    print(f"generation: {per_prompt * 1e3:.1f} ms per prompt ({args.max_new_tokens} tokens, "
          f"batch {options.gen_batch})")
    print(f"training: {per_step * 1e3:.1f} ms per step (batch {args.batch} x {args.anchors} "
          f"blocks of {options.block_size}); peak memory {peak:.1f} GiB")
    print(f"projection: {args.plan_prompts} prompts {args.plan_prompts * per_prompt:.0f} s + "
          f"{args.plan_steps} steps {args.plan_steps * per_step:.0f} s")

    engine = Engine(target, batch=1, max_seq_len=800)
    for tree, budget in ((False, 16), (True, 64)):
        drafter = BlockDrafter(target, net)
        t0 = time.perf_counter()
        out, stats = speculative_generate(engine, drafter, [prompts[0]], max_new_tokens=128,
                                          budget=budget, tree=tree)
        sync()
        seconds = time.perf_counter() - t0
        print(f"speculative ({'tree' if tree else 'chain'} {budget}): {stats.steps} steps, "
              f"{len(out[0])} tokens, {seconds * 1e3 / max(stats.steps, 1):.2f} ms per step "
              f"(first call: capture included), tau {stats.tau:.2f} (random weights)")


if __name__ == "__main__":
    main()
