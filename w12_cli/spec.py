"""``w12 spec check``: speculative decoding proved token for token against plain decoding
(``engine.speculative.api.spec_check``); exit 1 at the first token that differs."""

from __future__ import annotations

import sys

import click

from w12_cli.options import (
    Group,
    budget,
    compile_default,
    compile_ops,
    device,
    drafter,
    int8_head,
    quiet,
    sampling,
    tree_shape,
    two_level,
    weight_mode,
)


@click.group("spec", cls=Group)
def spec_group() -> None:
    """Speculative decoding checks."""


@spec_group.command("check")
@click.argument("model")
@drafter
@click.option("--prompts", "prompts_path", required=True,
              help="JSONL file of {\"prompt\": ...} lines, or 'humaneval'.")
@click.option("--limit", default=None, type=click.IntRange(1), help="Only the first N prompts.")
@click.option("--max-new-tokens", default=256, show_default=True, type=click.IntRange(1))
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1),
              help="Prompts decoded together (batch x budget at most 128 rows, so that every "
                   "GEMM keeps its row bits).")
@budget
@tree_shape
@two_level
@int8_head
@sampling
@weight_mode
@click.option("--chat/--no-chat", default=None,
              help="Wrap prompts in the model's chat template (default: if it has one).")
@device
@compile_ops
@quiet
def check_command(model, drafter, prompts_path, limit, max_new_tokens, batch, budget, chain,
                  two_level, int8_head, temperature, top_p, seed, bf16, chat, device, compile_,
                  quiet):
    """Decode every prompt plainly and speculatively and compare the tokens.

    Exits 1 naming the prompt and position of the first token that differs; 0 when every
    prompt matches. Exactness needs row-independent kernels: W12 weights on a GPU, or the CPU.
    With --int8-head the speculative side picks with the certified INT8 head, the plain side
    with the exact head.
    """
    from tqdm import tqdm

    from engine.sampling import Sampling
    from engine.speculative.api import load_target, read_prompts, spec_check

    if drafter is None:
        raise click.UsageError("spec check needs --drafter (ngram, early-exit:K, demo or a "
                               "drafter folder)")
    if batch * budget > 128:
        raise click.BadParameter(f"{batch} prompts x {budget} nodes = {batch * budget} rows a "
                                 "verify step; at most 128 keep every GEMM's row bits",
                                 param_hint="--batch")
    if two_level is not None and two_level >= budget:
        raise click.BadParameter(f"the Q tree's {two_level} nodes must be fewer than the "
                                 f"step's budget {budget}", param_hint="--two-level")
    texts = read_prompts(prompts_path, limit)
    target = load_target(model, texts, mode=None if bf16 is None else ("bf16" if bf16 else "w12"),
                         device=device, chat=chat)
    bar = tqdm(total=len(texts), desc="spec check", unit="prompt", disable=quiet, file=sys.stderr)
    report = spec_check(target, drafter, max_new_tokens=max_new_tokens, budget=budget,
                        tree=not chain, sampling=Sampling(temperature, top_p, seed),
                        compile=compile_default(compile_, device), batch=batch,
                        two_level=two_level, head="int8" if int8_head else "exact",
                        progress=bar.update)
    bar.close()
    shape = "chain" if chain else "tree"
    summary = (f"{report.prompts} prompts, {report.tokens} plain tokens, drafter {drafter} "
               f"({shape}, budget {budget}), tau {report.tau:.3f}")
    if two_level is not None:
        summary += f"; two-level, Q tree {two_level} nodes, Q path tau {report.q_tau:.3f}"
    if report.head is not None:
        h = report.head
        summary += (f"; INT8 head: {h.mean_candidates:.2f} candidates a token, "
                    f"{h.fallbacks} of {h.calls} calls on the exact head")
    if report.mismatch is None:
        click.echo(f"OK: speculative decoding equals plain decoding on {summary}")
        return
    m = report.mismatch
    click.echo(f"DIFFERENT: prompt {m.prompt}, new token {m.position}: plain {m.plain}, "
               f"speculative {m.speculative} ({summary})")
    sys.exit(1)
