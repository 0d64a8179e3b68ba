"""``w12 generate``: text from a BF16 or W12 folder (``engine.api.generate_text``)."""

from __future__ import annotations

import sys

import click

from w12_cli.options import (
    Command,
    budget,
    compile_default,
    compile_ops,
    device,
    drafter,
    int8_head,
    tree_shape,
    weight_mode,
)


@click.command("generate", cls=Command)
@click.argument("model")
@click.option("--prompt", "prompts", multiple=True, required=True,
              help="Prompt text; repeat for a batch.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1))
@weight_mode
@click.option("--chat/--no-chat", default=None,
              help="Wrap the prompt in the model's chat template (default: if it has one).")
@click.option("--system", default=None, help="System message for --chat.")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0))
@click.option("--top-p", default=1.0, show_default=True, type=click.FloatRange(0, 1))
@click.option("--seed", default=0, show_default=True)
@click.option("--stop", "stops", multiple=True, help="Stop when this text appears; repeatable.")
@click.option("--max-seq-len", default=None, type=click.IntRange(1),
              help="Cache positions (default: longest prompt + max new tokens).")
@drafter
@budget
@tree_shape
@int8_head
@device
@compile_ops
def generate_command(model, prompts, max_new_tokens, bf16, chat, system, temperature, top_p,
                     seed, stops, max_seq_len, drafter, budget, chain, int8_head, device,
                     compile_):
    """Generate text from MODEL, streaming it for a single prompt.

    MODEL is a BF16 Hugging Face folder or a W12 folder (with its tokenizer files). With
    --drafter the text comes from speculative decoding: the same tokens, fewer target passes.
    """
    from engine.api import GenerateOptions, generate_text

    options = GenerateOptions(
        mode=None if bf16 is None else ("bf16" if bf16 else "w12"), chat=chat, system=system,
        max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed,
        stop=tuple(stops), max_seq_len=max_seq_len, device=device,
        compile=compile_default(compile_, device), drafter=drafter, budget=budget,
        tree=not chain, head="int8" if int8_head else "exact",
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
