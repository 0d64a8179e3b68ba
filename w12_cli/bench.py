"""``w12 bench decode``: W12 against BF16 decode speed in one run (``engine.bench``);
``w12 bench spec``: speculative against plain decoding in one run (``engine.speculative.bench``)."""

from __future__ import annotations

import json

import click

from w12_cli.options import (
    Group,
    budget,
    compile_default,
    compile_ops,
    device,
    drafter,
    int8_head,
    json_out,
    positive_int_list,
    sampling,
    tree_shape,
    two_level,
    weight_mode,
)


def _attention_kinds(ctx, param, value: str) -> tuple[str, ...]:
    from engine.attention import ATTENTION_KINDS

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
              help="Decode attention: auto (= tree), tree (the tree-attention kernels, a "
                   "row's bits independent of the batch), torch (masked matmuls), or "
                   "tree,torch to time both.")
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


def _modes(ctx, param, value: str) -> tuple[str, ...]:
    modes = tuple(m.strip() for m in value.split(",") if m.strip())
    if not modes or any(m not in ("chain", "tree") for m in modes):
        raise click.BadParameter(f"a comma-separated list of chain, tree; got {value!r}")
    return modes


@bench_group.command("spec")
@click.argument("model")
@drafter
@click.option("--prompts", "prompts_path", default=None,
              help="JSONL file of {\"prompt\": ...} lines, or 'humaneval' (not for synthetic "
                   "models, which take random prompts and --forced-accept).")
@click.option("--limit", default=None, type=click.IntRange(1), help="Only the first N prompts.")
@click.option("--budgets", default="1,8,16,32,64", show_default=True,
              callback=positive_int_list, help="Node budgets, comma-separated (each <= 128).")
@click.option("--modes", default="chain,tree", show_default=True, callback=_modes,
              help="chain (the drafter's top-1 chain), tree (best-first), or both.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--forced-accept", default=None, type=click.IntRange(0),
              help="Accept this many drafted tokens per step whatever the target picks: c(N) "
                   "at scale on random weights (tau forced; the speed-up is a projection).")
@click.option("--context", default=512, show_default=True, type=click.IntRange(1),
              help="Prompt length of the random prompts of a synthetic model.")
@click.option("--gdn", default="auto", show_default=True,
              type=click.Choice(["auto", "walk", "path", "wy"]),
              help="A hybrid's GDN verify kernel on a GPU: walk, path (both with decode's bits; "
                   "auto picks by tree size) or wy (all paths at once on tensor cores, float32 "
                   "accuracy but not decode's bits).")
@two_level
@int8_head
@sampling
@weight_mode
@device
@compile_ops
@json_out
def bench_spec_command(model, drafter, prompts_path, limit, budgets, modes, max_new_tokens,
                       forced_accept, context, gdn, two_level, int8_head, temperature, top_p,
                       seed, bf16, device, compile_, json_path):
    """Time speculative decoding of MODEL against plain decoding in the same run.

    Per budget: tau (tokens per verify step, bonus included), c = T_step / T_AR, tokens/s and
    the speed-up over plain decoding. MODEL is a folder, or synthetic:PRESET with
    --forced-accept (c(N) at real sizes; tau / c is then a projection). With --two-level Q
    every budget above Q is also timed with two-level verification, as rows of its own (with
    --forced-accept K both of its passes accept K); with --int8-head plain decoding and every
    budget again with the certified INT8 LM head (rows "+int8", with their candidates per
    token).
    """
    from engine.sampling import Sampling
    from engine.speculative.bench import as_dicts, bench_spec, load_for_bench, summary

    if drafter is None:
        raise click.UsageError("bench spec needs --drafter (ngram, early-exit:K, demo or a "
                               "drafter folder)")
    if max(budgets) > 128:
        raise click.BadParameter(f"{max(budgets)} nodes: at most 128", param_hint="--budgets")
    mode = None if bf16 is None else ("bf16" if bf16 else "w12")
    loaded, prompts, stop_ids = load_for_bench(model, prompts_path, limit=limit, mode=mode,
                                               device=device, forced_accept=forced_accept,
                                               context=context, seed=seed)
    loaded.model.gdn = gdn
    rows = bench_spec(loaded, prompts, drafter=drafter, budgets=budgets, modes=modes,
                      max_new_tokens=max_new_tokens, forced_accept=forced_accept,
                      sampling=Sampling(temperature, top_p, seed), stop_ids=stop_ids,
                      compile=compile_default(compile_, device), two_level=two_level,
                      int8_head=int8_head, log=click.echo, seed=seed)
    for line in summary(rows):
        click.echo(line)
    if json_path is not None:
        json_path.write_text(json.dumps({"model": model, "drafter": drafter, "mode": loaded.mode,
                                         "rows": as_dicts(rows)}, indent=2))


@bench_group.command("serve")
@click.argument("model")
@drafter
@click.option("--prompts", "prompts_path", required=True,
              help="JSONL file of {\"prompt\": ...} lines, or 'humaneval': one request each.")
@click.option("--limit", default=None, type=click.IntRange(1), help="Only the first N prompts.")
@click.option("--concurrency", default="1,8,32", show_default=True, callback=positive_int_list,
              help="Rows served at once (the engine's batch), comma-separated.")
@click.option("--max-new-tokens", default=128, show_default=True, type=click.IntRange(1))
@budget
@tree_shape
@click.option("--shared-budget", "shared", default=None, type=click.IntRange(1),
              help="Also serve with one node budget of this many nodes per row shared by all "
                   "rows (best nodes across requests; a best-first tree drafter).")
@click.option("--widths", default=None, callback=positive_int_list,
              help="Also serve with per-request draft sizes from these (e.g. 8,12,16; the "
                   "largest is --budget), chosen from each request's recent acceptance.")
@click.option("--admission", default=None, type=click.IntRange(1),
              help="Also serve speculatively admitting at most this many prompt tokens between "
                   "two steps while requests run (eager admission otherwise).")
@sampling
@weight_mode
@device
@compile_ops
@json_out
def bench_serve_command(model, drafter, prompts_path, limit, concurrency, max_new_tokens, budget,
                        chain, shared, widths, admission, temperature, top_p, seed, bf16, device,
                        compile_, json_path):
    """Serve every prompt of a set with continuous batching, plain and speculative, same run.

    Per concurrency: tokens/s, request latency and time-to-first-token percentiles (from the
    start of the run), engine steps, tau and the speculative speed-up over plain serving.
    Every run must return the same tokens per request (checked).
    """
    from engine.sampling import Sampling
    from engine.serving_bench import as_dicts, bench_serve
    from engine.speculative.api import load_target, read_prompts

    if drafter is None:
        raise click.UsageError("bench serve needs --drafter (ngram or early-exit:K)")
    mode = None if bf16 is None else ("bf16" if bf16 else "w12")
    target = load_target(model, read_prompts(prompts_path, limit), mode=mode, device=device)
    rows = bench_serve(target.loaded, target.prompts, drafter=drafter, concurrency=concurrency,
                       max_new_tokens=max_new_tokens, budget=budget, tree=not chain,
                       sampling=Sampling(temperature, top_p, seed), stop_ids=target.stop_ids,
                       compile=compile_default(compile_, device), shared_per_row=shared,
                       widths=tuple(widths) if widths else None, admission=admission,
                       log=click.echo)
    if json_path is not None:
        json_path.write_text(json.dumps({"model": model, "drafter": drafter,
                                         "rows": as_dicts(rows)}, indent=2))
