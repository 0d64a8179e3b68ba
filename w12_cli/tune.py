"""``w12 tune``: the tuning judges on the reference engine, as three commands.

* ``explain MODEL``: the cost-model decomposition of one decode step
  (``spec_tuning.explain.explain_model``), as a table and a PNG.
* ``forcing MODEL_BF16 CANDIDATE``: the token-forcing verdict of a candidate against the stock
  BF16 system, both forced through their own decode or verify steps along plain BF16 decoding
  (``spec_tuning.prove.forcing_run``).
* ``prove MODEL_BF16 CANDIDATE``: all three judges in one run on a sealed split of the prompt
  set (``spec_tuning.prove.prove``).

Progress messages go to stderr, results to stdout and, with ``--json``, to a file.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from w12_cli.options import Group, compile_default, compile_ops, device, json_out, positive_int_list


def _taus(ctx, param, values: tuple[str, ...]) -> dict[int, float]:
    taus = {}
    for value in values:
        n, _, tau = value.partition("=")
        try:
            taus[int(n)] = float(tau)
        except ValueError:
            raise click.BadParameter(f"{value!r} is not N=VALUE, like 4=2.3") from None
        if int(n) < 1 or not float(tau) > 0:
            raise click.BadParameter(f"{value!r}: N must be >= 1 and tau > 0")
    return taus


def _floats(ctx, param, value: str | None) -> tuple[float, ...]:
    if not value:
        return ()
    try:
        return tuple(float(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a list of probabilities") from None


def _progress(message: str) -> None:
    click.echo(message, err=True)


def _write_json(path: Path | None, data: dict) -> None:
    if path is not None:
        path.write_text(json.dumps(data, indent=2, default=str))


_seed = click.option("--seed", default=0, show_default=True,
                     help="Seed of synthetic weights, random prompts and the sealed split.")
_candidate_mode = click.option("--candidate-mode", type=click.Choice(["bf16", "w12"]),
                               default=None,
                               help="Candidate weights (default: W12 for a W12 folder, else "
                                    "BF16).")
_defect = click.option("--defect", default=None, metavar="NAME",
                       help="Plant a defect in the candidate (the judge must reject it): "
                            "logit-bias:P (+2 on every 7th vocabulary id from generated "
                            "position P on), near-tie:GAP (the two best logits swapped where "
                            "within GAP), kv-shift:SLOT[:EVERY] (the cache write at slot SLOT, "
                            "and every EVERY-th after it, lands one slot early).")
_source = click.option("--source", type=click.Choice(["auto", "humaneval", "builtin", "random"]),
                       default="auto", show_default=True,
                       help="Prompts: HumanEval if installed, else built-in instructions; "
                            "random token prompts for models without a tokenizer.")
_path = click.option("--path", default="decode", show_default=True, metavar="PATH",
                     help="What the candidate generates through, and is forced through: "
                          "decode (Engine.step), chain:N or tree:N (the speculative verify "
                          "step with N nodes, the reference as the draft), prefill (one causal "
                          "forward: blind to the cache and the decode kernels).")
_calibration = click.option("--calibration-prompts", default=8, show_default=True,
                            type=click.IntRange(2),
                            help="Prompts from the end of the set that calibrate delta (never "
                                 "judged).")


@click.group("tune", cls=Group)
def tune_group() -> None:
    """Prove speed-ups: token forcing, paired runs, cost model."""


@tune_group.command("explain")
@click.argument("model")
@click.option("--mode", type=click.Choice(["bf16", "w12"]), default=None,
              help="Weights (default: W12 for a W12 folder, else BF16).")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1))
@click.option("--tree-sizes", default="1", show_default=True, callback=positive_int_list,
              help="Tokens per row of the verify step, comma-separated (1 = plain decoding).")
@click.option("--tau", "taus", multiple=True, callback=_taus, metavar="N=VALUE",
              help="Measured accepted tokens per step for tree size N; repeatable.")
@click.option("--rank-accept", default=None, callback=_floats, metavar="P1,P2,...",
              help="Drafter's per-rank acceptance probabilities: tau_best from the best tree.")
@click.option("--context", default=512, show_default=True, type=click.IntRange(1),
              help="Tokens already in the cache at the profiled step.")
@click.option("--png", type=click.Path(path_type=Path), default=None,
              help="Write the chart here (needs matplotlib).")
@device
@compile_ops
@_seed
@json_out
def explain_command(model, mode, batch, tree_sizes, taus, rank_accept, context, png, device,
                    compile_, seed, json_path):
    """Decompose the speed-up headroom of MODEL's decode step: acceptance x kernels x overhead.

    MODEL is a BF16 or W12 folder, or synthetic:PRESET (qwen3-8b, qwen3-32b, llama-3.1-8b,
    smollm2-135m, tiny-qwen3).
    """
    from spec_tuning.explain import explain_model

    result = explain_model(model, mode=mode, device=device, seed=seed, batch=batch,
                           tree_sizes=tree_sizes, taus=taus, rank_accept=rank_accept,
                           context=context, compile=compile_default(compile_, device), png=png,
                           log=_progress)
    click.echo(result.text)
    _write_json(json_path, result.data)


@tune_group.command("forcing")
@click.argument("model_bf16")
@click.argument("candidate")
@_candidate_mode
@_defect
@_path
@click.option("--prompts", default=32, show_default=True, type=click.IntRange(2))
@_calibration
@click.option("--tokens", default=128, show_default=True, type=click.IntRange(1),
              help="Reference tokens per prompt (fewer when it stops).")
@click.option("--batch", default=8, show_default=True, type=click.IntRange(1),
              help="Rows per step of the stock (the reference decodes at batch 1).")
@click.option("--candidate-batch", default=None, type=click.IntRange(1),
              help="Rows per step of the candidate (default: --batch).")
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(0.0),
              help="0: greedy picks; above: keyed Gumbel samples (seed --seed), as generation "
                   "draws them.")
@click.option("--baseline", "baseline_path", type=click.Path(path_type=Path), default=None,
              help="Store the reference, the stock's trace and delta here, and reuse them "
                   "when a later call has the same stock, prompts and settings.")
@_source
@device
@_seed
@json_out
def forcing_command(model_bf16, candidate, candidate_mode, defect, path, prompts,
                    calibration_prompts, tokens, batch, candidate_batch, temperature,
                    baseline_path, source, device, seed, json_path):
    """Is CANDIDATE lossless against MODEL_BF16? Token-forcing verdict on the prompt set.

    The reference is plain decoding of MODEL_BF16 at batch 1; the stock (MODEL_BF16 through
    its decode step at --batch) and CANDIDATE (through --path at its batch) are both forced
    along it. delta comes from the stock on the calibration prompts.
    """
    from engine.sampling import Sampling
    from spec_tuning.prove import forcing_run

    sampling = Sampling(temperature=temperature, seed=seed) if temperature > 0 else None
    result = forcing_run(model_bf16, candidate, candidate_mode=candidate_mode, defect=defect,
                         prompts=prompts, tokens=tokens, calibration_prompts=calibration_prompts,
                         source=source, batch=batch, candidate_batch=candidate_batch, path=path,
                         sampling=sampling, device=device, seed=seed,
                         baseline_path=baseline_path, log=_progress)
    click.echo(result.verdict.report())
    _write_json(json_path, result.to_dict())


@tune_group.command("prove")
@click.argument("model_bf16")
@click.argument("candidate")
@_candidate_mode
@_defect
@_path
@click.option("--prompts", default=64, show_default=True, type=click.IntRange(2),
              help="Prompts for token forcing.")
@_calibration
@click.option("--tokens", default=128, show_default=True, type=click.IntRange(1))
@click.option("--run-prompts", default=4, show_default=True, type=click.IntRange(1),
              help="Requests per timed run.")
@click.option("--run-tokens", default=32, show_default=True, type=click.IntRange(1),
              help="Tokens generated per request in a timed run.")
@click.option("--batch", default=1, show_default=True, type=click.IntRange(1),
              help="Serving batch of the stock system.")
@click.option("--candidate-batch", default=None, type=click.IntRange(1),
              help="Serving batch of the candidate (default: --batch).")
@click.option("--context", default=512, show_default=True, type=click.IntRange(1),
              help="Cached tokens at the step the cost model profiles.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("w12-tune"),
              show_default=True, help="Folder for the controller and sealed-split logs.")
@click.option("--force-final", is_flag=True,
              help="Open the final set even if this split's final set was opened before.")
@_source
@device
@compile_ops
@_seed
@json_out
def prove_command(model_bf16, candidate, candidate_mode, defect, path, prompts,
                  calibration_prompts, tokens, run_prompts, run_tokens, batch, candidate_batch,
                  context, out_dir, force_final, source, device, compile_, seed, json_path):
    """Run all three judges on CANDIDATE against MODEL_BF16 on a sealed prompt split.

    Token forcing and paired runs on the tuning part decide; the candidate's decode step is
    decomposed by the cost model; a candidate that passes both judges is measured once more
    on the held-out final part, whose opening is logged in --out.
    """
    from spec_tuning.prove import prove

    result = prove(model_bf16, candidate, out_dir=out_dir, candidate_mode=candidate_mode,
                   defect=defect, prompts=prompts, tokens=tokens,
                   calibration_prompts=calibration_prompts, run_prompts=run_prompts,
                   run_tokens=run_tokens, batch=batch, candidate_batch=candidate_batch,
                   path=path, source=source, context=context, device=device,
                   compile=compile_default(compile_, device), seed=seed,
                   force_final=force_final, log=_progress)
    click.echo(result.text)
    _write_json(json_path, result.data)


_memory = click.option("--memory", "memory_path", type=click.Path(path_type=Path), default=None,
                       help="The memory file (default: $W12_CACHE/tune/memory.json).")


def _open_memory(path: Path | None):
    from spec_tuning.memory import Memory, default_path

    return Memory(path or default_path())


def _deployment_options(command):
    """The options that make a ``spec_tuning.loop.Deployment`` (``run`` and ``trial``)."""
    for option in reversed((
        click.argument("model"),
        click.option("--drafter", required=True,
                     help="ngram, early-exit:K, random, demo or a block drafter's folder."),
        click.option("--mode", "serving", default="single", show_default=True,
                     help="single (one request at a time) or batch:N (N concurrent requests)."),
        click.option("--prompts", default=32, show_default=True, type=click.IntRange(8),
                     help="Prompts in all: about a fifth are sealed for the final."),
        click.option("--tokens", default=32, show_default=True, type=click.IntRange(1),
                     help="New tokens a request in every run."),
        click.option("--context", default=256, show_default=True, type=click.IntRange(1),
                     help="Cached tokens at the steps the cost model profiles."),
        _source, device, _seed,
    )):
        command = option(command)
    return command


def _deployment(model, drafter, serving, prompts, tokens, context, source, device, seed):
    from spec_tuning.loop import Deployment

    deployment = Deployment(model, drafter, mode=serving, device=device, source=source,
                            prompts=prompts, tokens=tokens, context=context, seed=seed)
    _ = deployment.serving  # (checks the mode before anything loads)
    return deployment


@tune_group.command("run")
@_deployment_options
@click.option("--rounds", default=4, show_default=True, type=click.IntRange(1))
@click.option("--trials", default=3, show_default=True, type=click.IntRange(1),
              help="Proposals judged a round at most.")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), default=Path("w12-tune"),
              show_default=True, help="Report (tune.txt, tune.json, rounds.png) and logs.")
@_memory
@click.option("--agent", default=None, metavar="COMMAND",
              help="Each round without a promotion, run COMMAND in a scratch worktree with the "
                   "brief ($W12_TUNE_BRIEF) and judge the mechanism its patch adds.")
@click.option("--agent-tests", default="python -m pytest -q -x", show_default=True,
              metavar="COMMAND", help="The tests an agent's patch must pass first.")
def run_command(rounds, trials, out_dir, memory_path, agent, agent_tests, **deployment):
    """Tune speculative decoding of MODEL for one deployment, in rounds.

    Each round measures the current configuration (tau, and the cost model's three ceiling
    factors), tries the options that attack the largest factor (the memory's promoted entries
    first, then the registry's), and promotes the first that the paired-run controller finds
    faster and token forcing finds lossless. Every judgement goes to the memory. The best
    configuration then meets the stock on the sealed prompts, once.
    """
    from spec_tuning.loop import Tuner

    tuner = Tuner(_deployment(**deployment), out_dir=out_dir, memory=_open_memory(memory_path),
                  trials=trials, agent=agent, agent_tests=agent_tests, log=_progress)
    result = tuner.run(rounds)
    click.echo(result.text)
    for path in result.save(out_dir):
        _progress(f"wrote {path}")


@tune_group.command("trial", hidden=True)
@_deployment_options
@click.option("--config", "config_json", required=True, help="The current configuration, JSON.")
@click.option("--option", required=True, help="The option to try (its first value that is "
                                               "not the stock one and fits the deployment).")
@click.option("--out", "out_dir", type=click.Path(path_type=Path), required=True)
@click.option("--result", type=click.Path(path_type=Path), required=True)
def trial_command(config_json, option, out_dir, result, **deployment):
    """One judgement of OPTION on top of --config, written to --result (the tuning loop runs
    this in an agent's worktree, so that the patched code is what runs)."""
    from dataclasses import asdict

    from spec_tuning import registry
    from spec_tuning.loop import Tuner
    from spec_tuning.memory import Memory
    from w12.errors import W12Error

    current = {k: tuple(v) if isinstance(v, list) else v
               for k, v in json.loads(config_json).items()}
    tuner = Tuner(_deployment(**deployment), out_dir=out_dir,
                  memory=Memory(out_dir / "memory.json"), log=_progress)
    mech = registry.mechanism(option)
    values = [v for v in mech.domain if v != mech.stock and tuner.allowed({**current,
                                                                          option: v})]
    if not values:
        raise W12Error(f"option {option}: no value fits this deployment")
    trial = tuner.judge(current, option, values[0], "agent")
    result.write_text(json.dumps(asdict(trial), indent=1, default=str) + "\n")
    click.echo(f"{trial.verdict}: {option}={values[0]}: {trial.reason}")


@tune_group.command("time", hidden=True)
@_deployment_options
@click.option("--config", "config_json", required=True, help="The configuration, JSON.")
@click.option("--repeats", default=3, show_default=True, type=click.IntRange(1))
@click.option("--result", type=click.Path(path_type=Path), required=True)
def time_command(config_json, repeats, result, **deployment):
    """Time --config over the deployment's tuning prompts (one warm-up, then REPEATS runs),
    written to --result as {"tokens", "seconds"} (the tuning loop runs this in the source tree
    and in an agent's worktree, to see whether a patch slows the configuration it beat)."""
    import tempfile

    from spec_tuning.loop import Tuner
    from spec_tuning.memory import Memory
    from w12.errors import W12Error

    current = {k: tuple(v) if isinstance(v, list) else v
               for k, v in json.loads(config_json).items()}
    with tempfile.TemporaryDirectory() as scratch:
        tuner = Tuner(_deployment(**deployment), out_dir=Path(scratch),
                      memory=Memory(Path(scratch) / "memory.json"), log=_progress)
        runner = tuner.systems.runner(current)
        runner.run(tuner.tuning)
        samples = [runner.run(tuner.tuning) for _ in range(repeats)]
    tokens = {s.tokens for s in samples}
    if len(tokens) != 1:
        raise W12Error(f"the configuration generated {sorted(tokens)} tokens in its runs")
    result.write_text(json.dumps({"tokens": samples[0].tokens,
                                  "seconds": [s.seconds for s in samples]}) + "\n")
    click.echo(f"{samples[0].tokens} tokens, {min(s.seconds for s in samples):.3f} s at best")


@tune_group.group("memory", cls=Group)
def memory_group() -> None:
    """The tuning memory: every judged proposal with its evidence, in one JSON file.

    The file (default: the W12_CACHE folder's tune/memory.json) is what a later deployment's
    first round re-measures; export and import share it between machines.
    """


def _gain(entry) -> str:
    gain = entry.evidence.get("gain")
    low = entry.evidence.get("gain_low")
    if gain is None:
        return "-"
    return f"{gain:+.1%}" + (f" (>= {low:+.1%})" if low is not None else "")


@memory_group.command("list")
@_memory
def memory_list(memory_path) -> None:
    """One line per entry: id, verdict, factor, mode, GPU, option=value, gain, date."""
    memory = _open_memory(memory_path)
    if not memory.entries:
        click.echo(f"{memory.path}: no entries")
        return
    for e in memory.entries:
        click.echo(f"{e.id}  {e.verdict:<8}  {e.factor:<8}  {e.mode:<6}  {e.gpu:<24}  "
                   f"{e.option}={e.value!r:<14}  {_gain(e):<20}  {e.date}")


@memory_group.command("show")
@click.argument("entry_id")
@_memory
def memory_show(entry_id, memory_path) -> None:
    """One entry (ENTRY_ID: its id or a unique prefix) as JSON, evidence included."""
    from dataclasses import asdict

    entry = _open_memory(memory_path).find(entry_id)
    click.echo(json.dumps({"id": entry.id, **asdict(entry)}, indent=2, default=str))


@memory_group.command("export")
@click.argument("out", type=click.Path(path_type=Path))
@_memory
@click.option("--factor", type=click.Choice(["acceptance", "kernels", "overhead"]), default=None)
@click.option("--mode", type=click.Choice(["single", "batch"]), default=None)
@click.option("--promoted-only", is_flag=True)
@click.option("--force", is_flag=True, help="Replace OUT if it is a memory file already.")
def memory_export(out, memory_path, factor, mode, promoted_only, force) -> None:
    """Write the entries (those selected) to a new memory file OUT."""
    from spec_tuning.memory import write_entries
    from w12.errors import W12Error

    if out.exists() and not force:
        raise W12Error(f"{out} exists; --force replaces it")
    memory = _open_memory(memory_path)
    chosen = [e for e in memory.entries
              if (factor is None or e.factor == factor) and (mode is None or e.mode == mode)
              and (not promoted_only or e.verdict == "promoted")]
    write_entries(out, chosen)
    click.echo(f"{len(chosen)} of {len(memory.entries)} entries -> {out}")


@memory_group.command("import")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_memory
def memory_import(source, memory_path) -> None:
    """Add the entries of another memory file SOURCE (an entry already there is skipped)."""
    memory = _open_memory(memory_path)
    added = memory.merge(source)
    memory.save()
    click.echo(f"{added} new entries from {source} -> {memory.path} ({len(memory.entries)} in "
               "all)")
