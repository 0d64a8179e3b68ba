"""Command-line entry points of the engine: ``generate`` and ``bench decode``.

Both parse, call typed functions of ``engine``, and print. MODEL is a BF16 Hugging Face folder,
a W12 folder, or ``synthetic:<preset>``. A user-caused ``W12Error`` becomes one ``error: ...``
line on stderr and exit code 2 whichever click group these commands are attached to.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import click

from w12.errors import W12Error


def _one_line_errors(command):
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except W12Error as exc:
            click.echo(f"error: {' '.join(str(exc).split())}", err=True)
            sys.exit(2)

    return wrapper


def default_device(device: str | None) -> str:
    """The device a command runs on: the one asked for, else the GPU when there is one."""
    import torch

    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def positive_int_list(ctx, param, value: str) -> list[int]:
    """Click callback for options like ``--batch 1,8,32``."""
    try:
        sizes = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"{value!r} is not a list of positive integers like 1,8,32")
    return sizes


@click.command("generate")
@click.argument("model")
@click.option("--prompt", "prompts", multiple=True, required=True,
              help="Prompt text; repeat for a batch.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--bf16/--w12", "bf16", default=None,
              help="Linear layers in BF16 or W12 (default: W12 for a W12 folder, else BF16).")
@click.option("--chat/--no-chat", default=None,
              help="Wrap the prompt in the model's chat template (default: if it has one).")
@click.option("--system", default=None, help="System message for --chat.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1))
@click.option("--seed", default=0, show_default=True)
@click.option("--stop", "stops", multiple=True, help="Stop when this text appears; repeatable.")
@click.option("--max-seq-len", default=None, type=click.IntRange(1),
              help="Cache positions (default: longest prompt + max new tokens).")
@click.option("--device", default=None, help="cpu, cuda, cuda:1... (default: cuda if present).")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="torch.compile the elementwise ops (default: on for CUDA).")
@_one_line_errors
def generate_command(model, prompts, max_new_tokens, bf16, chat, system, temperature, top_p,
                     seed, stops, max_seq_len, device, compile_):
    """Generate text from MODEL, streaming it for a single prompt.

    MODEL is a BF16 Hugging Face folder or a W12 folder (with its tokenizer files).
    """
    from engine.api import GenerateOptions, generate_text

    device = default_device(device)
    options = GenerateOptions(
        mode=None if bf16 is None else ("bf16" if bf16 else "w12"), chat=chat, system=system,
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
        stop=tuple(stops), max_seq_len=max_seq_len, device=device,
        compile=device.startswith("cuda") if compile_ is None else compile_,
    )
    stream = len(prompts) == 1

    def on_text(row: int, text: str) -> None:
        click.echo(text, nl=False)
        sys.stdout.flush()

    texts = generate_text(model, list(prompts), options, on_text=on_text if stream else None)
    if stream:
        click.echo()
        return
    for i, text in enumerate(texts):
        click.echo(f"--- [{i}] {prompts[i]}")
        click.echo(text)


def _attention_kinds(ctx, param, value: str) -> tuple[str, ...]:
    from engine.attention import ATTENTION_KINDS

    kinds = tuple(k.strip() for k in value.split(",") if k.strip())
    if not kinds or any(k not in ATTENTION_KINDS for k in kinds):
        raise click.BadParameter(f"a comma-separated list of {', '.join(ATTENTION_KINDS)}, "
                                 f"got {value!r}")
    return kinds


@click.group("bench")
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
@click.option("--device", default=None, help="cpu, cuda, cuda:1... (default: cuda if present).")
@click.option("--compile/--no-compile", "compile_", default=None,
              help="torch.compile the elementwise ops (default: on for CUDA).")
@click.option("--seed", default=0, show_default=True, help="Seed of synthetic weights/prompts.")
@click.option("--attention", default="auto", show_default=True, callback=_attention_kinds,
              help="Decode attention: auto (triton on CUDA), torch, triton (one kernel per "
                   "layer, CUDA only), or "
                   "torch,triton to time both.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), default=None,
              help="Also write the results here.")
@_one_line_errors
def bench_decode_command(model, batches, tokens, prompt_len, warmup, modes, device, compile_,
                         seed, attention, json_path):
    """Time greedy decoding of MODEL with BF16 and W12 weights in the same run.

    MODEL is a BF16 or W12 folder, or synthetic:PRESET with PRESET one of qwen3-8b, qwen3-32b,
    llama-3.1-8b, smollm2-135m, tiny-qwen3 (random weights of that shape, drawn on the device).
    """
    from engine.bench import as_dicts, bench_decode, summary

    device = default_device(device)
    mode_list = tuple(m.strip() for m in modes.split(",") if m.strip())
    results = bench_decode(
        model, batches=batches, tokens=tokens, modes=mode_list, device=device,
        compile=device.startswith("cuda") if compile_ is None else compile_,
        prompt_len=prompt_len, warmup=warmup, seed=seed, log=click.echo, attention=attention,
    )
    for line in summary(results):
        click.echo(line)
    if json_path is not None:
        json_path.write_text(json.dumps({"model": model, "results": as_dicts(results)}, indent=2))


@click.group("engine")
def main() -> None:
    """The reference decode engine."""


main.add_command(generate_command)
main.add_command(bench_group)

if __name__ == "__main__":
    main()
