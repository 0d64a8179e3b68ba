"""``w12 bench decode``: W12 against BF16 decode speed in one run (``engine.bench``)."""

from __future__ import annotations

import json

import click

from w12_cli.options import Group, compile_default, compile_ops, device, json_out, positive_int_list


def _attention_kinds(ctx, param, value: str) -> tuple[str, ...]:
    from engine.generate import ATTENTION_KINDS

    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    if not kinds or any(k not in ATTENTION_KINDS for k in kinds):
        raise click.BadParameter(f"a comma-separated list of {', '.join(ATTENTION_KINDS)}, "
                                 f"got {value!r}")
    return kinds


@click.group("bench", cls=Group)
def bench_group() -> None:
    """Timing commands."""


@bench_group.command("decode")
@click.argument("model")
@click.option("--batch", "batches", default="1,8,32", show_default=True, callback=positive_int_list,
              help="Batch sizes, comma-separated.")
@click.option("--tokens", default=256, show_default=True, type=click.IntRange(1))
@click.option("--prompt-len", default=32, show_default=True, type=click.IntRange(1))
@click.option("--warmup", default=8, show_default=True, type=click.IntRange(0))
@click.option("--modes", default="bf16,w12", show_default=True,
              help="Weight modes to time, in order.")
@device
@compile_ops
@click.option("--seed", default=0, show_default=True, help="Seed of synthetic weights/prompts.")
@click.option("--attention", default="auto", show_default=True, callback=_attention_kinds,
              help="Decode attention: auto (triton on CUDA), torch, triton (one kernel per "
                   "layer, CUDA only), or "
                   "torch,triton to time both.")
@json_out
def bench_decode_command(model, batches, tokens, prompt_len, warmup, modes, device, compile_,
                         seed, attention, json_path):
    """Time greedy decoding of MODEL with BF16 and W12 weights in the same run.

    MODEL is a BF16 or W12 folder, or synthetic:PRESET with PRESET one of qwen3-8b, qwen3-32b,
    llama-3.1-8b, smollm2-135m, tiny-qwen3 (random weights of that shape, drawn on the device).
    """
    from engine.bench import as_dicts, bench_decode, summary

    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip())
    results = bench_decode(
        model, batches=batches, tokens=tokens, modes=mode_list, device=device,
        compile=compile_default(compile_, device), prompt_len=prompt_len, warmup=warmup,
        seed=seed, log=click.echo, attention=attention,
    )
    for line in summary(results):
        click.echo(line)
    if json_path is not None:
        json_path.write_text(json.dumps({"model": model, "results": as_dicts(results)}, indent=2))
