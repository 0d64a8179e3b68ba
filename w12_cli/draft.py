"""``w12 draft train``: a block drafter trained from its target
(``engine.speculative.train_drafter.train``)."""

from __future__ import annotations

from pathlib import Path

import click

from w12_cli.options import Group, device, quiet


@click.group("draft", cls=Group)
def draft_group() -> None:
    """Block drafters for speculative decoding."""


@draft_group.command("train")
@click.argument("target")
@click.option("--out", required=True, type=click.Path(path_type=Path),
              help="Output folder: w12/ (the drafter), bf16/, loss.png, train_log.json.")
@click.option("--prompts", default="stdlib", show_default=True,
              help="'stdlib' (Python's standard library functions turned into instructions) "
                   "or a JSONL file of {\"prompt\": ...} lines; HumanEval is refused.")
@click.option("--num-prompts", default=3072, show_default=True, type=click.IntRange(1),
              help="Prompts to answer; 'stdlib' gives one a documented function, then each "
                   "function's other two instruction kinds (about 12,000 in all).")
@click.option("--max-new-tokens", default=256, show_default=True, type=click.IntRange(2),
              help="Length of the target's responses.")
@click.option("--steps", default=3000, show_default=True, type=click.IntRange(1))
@click.option("--minutes", default=None, type=click.FloatRange(0, min_open=True),
              help="Fit the step count to this many minutes of optimisation (timed over "
                   "steps 50-100, at most --steps); the count is printed, and --steps with "
                   "it repeats the run.")
@click.option("--batch", default=16, show_default=True, type=click.IntRange(1),
              help="Sequences per step.")
@click.option("--anchors", default=32, show_default=True, type=click.IntRange(1),
              help="Blocks per sequence.")
@click.option("--block-size", default=16, show_default=True, type=click.IntRange(2, 64))
@click.option("--layers", default=3, show_default=True, type=click.IntRange(1))
@click.option("--taps", default=5, show_default=True, type=click.IntRange(1),
              help="Target layers whose hidden states the drafter reads.")
@click.option("--lr", default=6e-4, show_default=True, type=click.FloatRange(0, min_open=True))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0),
              help="Sampling temperature of the target's responses (0: greedy).")
@click.option("--gen-batch", default=128, show_default=True, type=click.IntRange(1),
              help="Prompts the target answers at once.")
@click.option("--seed", default=0, show_default=True)
@device
@quiet
def train_command(target, out, prompts, num_prompts, max_new_tokens, steps, minutes, batch,
                  anchors, block_size, layers, taps, lr, temperature, gen_batch, seed, device,
                  quiet):
    """Train a block drafter for TARGET (a BF16 or W12 model folder) by self-distillation.

    The target answers the prompts itself; the drafter learns its distributions over blocks
    of BLOCK_SIZE positions. The same command reproduces the run (seeded).
    """
    from engine.speculative.train_drafter import TrainOptions, train

    options = TrainOptions(layers=layers, block_size=block_size, taps=taps, steps=steps,
                           minutes=minutes, batch=batch, anchors=anchors, lr=lr, seed=seed,
                           max_new_tokens=max_new_tokens, gen_batch=gen_batch,
                           temperature=temperature)
    train(target, out, options, prompts=prompts, count=num_prompts, device=device,
          progress=not quiet, echo=click.echo)
