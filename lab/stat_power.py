"""Power and false-reject rates of the tuning judges, by simulation.

Prints, for the settings shown, how often each rule fires at its H0 boundary (must be at or
below 5%) and against planted shifts: a +1.5 pp mismatch excess for the forcing mismatch rule,
the planted logits defect on the simulated model for the whole forcing verdict, and a 2%
throughput gain at 0.5% run-to-run noise for the controller. Seeds are fixed, so the output is
reproducible. Run: python lab/stat_power.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
from scipy import stats as sps

from spec_tuning import controller as ctl
from spec_tuning import forcing
from spec_tuning.forcing import NearTieSwap, PlantedDefect, build_reference, calibrate, judge
from spec_tuning.simulate import (
    SimulatedLM,
    SimulatedSystem,
    clustered_paired_counts,
    paired_log_ratios,
)
from spec_tuning.stats import paired_excess_arrays

STOCK_RATE, SHARED_RATE = 0.01, 0.003  # stock mismatch rate; both-mismatch rate
CLUSTERINGS = {"independent": (0.0, 1.0), "clustered": (1.0, 4.0)}  # dispersion, run length
SIZES = [(32, 128), (64, 256), (128, 256)]  # prompts x positions


def _naive_reject(cand, stock, positions, margin, alpha):
    """Position-level paired z test (McNemar-style variance), for contrast only."""
    n = cand.shape[-1] * positions
    diff = (cand - stock).sum(-1) / n
    discordant = (cand + stock).sum(-1) / n - 2 * SHARED_RATE
    z = (diff - margin) / np.sqrt(np.maximum(discordant - diff**2, 1e-12) / n)
    return z > sps.norm.ppf(1 - alpha)


def mismatch_rule(sims: int, rng) -> list[dict]:
    rows = []
    for cname, (dispersion, burst) in CLUSTERINGS.items():
        for prompts, positions in SIZES:
            row = {"clustering": cname, "prompts": prompts, "positions": positions}
            for label, excess in (("h0", forcing.MISMATCH_MARGIN), ("shift", 0.015)):
                cand, stock = clustered_paired_counts(
                    rng, sims=sims, prompts=prompts, positions=positions,
                    stock_rate=STOCK_RATE, excess=excess, shared_rate=SHARED_RATE,
                    dispersion=dispersion, burst=burst)
                rej = paired_excess_arrays(cand, stock, positions,
                                           margin=forcing.MISMATCH_MARGIN, alpha=forcing.ALPHA)[4]
                row[label] = float(rej.mean())
                if label == "h0":
                    row["naive_h0"] = float(_naive_reject(
                        cand, stock, positions, forcing.MISMATCH_MARGIN, forcing.ALPHA).mean())
            rows.append(row)
    return rows


def forcing_verdicts(trials: int, prompts: int, new_tokens: int,
                     calibration_prompts: int) -> list[dict]:
    """Whole verdicts on the simulated model: lossless candidates and planted defects. Each
    trial draws a model, a reference on the judged prompts and one on disjoint calibration
    prompts (delta); the stock and the candidate are forced along both."""
    rows = []
    cases = [("lossless (other numerics)", ()), ("logit bias P=0", (PlantedDefect(0),)),
             ("logit bias P=64", (PlantedDefect(64),)),
             ("logit bias P=120", (PlantedDefect(120),)),
             ("logit bias P=126", (PlantedDefect(126),)), ("near-tie swap 0.2",
                                                           (NearTieSwap(0.2),))]
    for name, transforms in cases:
        rejects = {"any": 0, "mismatch": 0, "margin": 0}
        for k in range(trials):
            lm = SimulatedLM(seed=100 + k)
            bf16 = SimulatedSystem(lm, noise=0.0, seed=0)
            ref = build_reference(bf16, lm.random_prompts(prompts, 8, seed=k), new_tokens)
            cal = build_reference(bf16, lm.random_prompts(calibration_prompts, 8,
                                                          seed=10_000 + k), new_tokens)
            stock = SimulatedSystem(lm, noise=0.02, seed=1)
            cand = SimulatedSystem(lm, noise=0.02, seed=2, transforms=transforms)
            v = judge(ref, stock.trace(ref), cand.trace(ref), calibrate(cal, stock.trace(cal)))
            rejects["any"] += not v.accepted
            rejects["mismatch"] += v.mismatch_p_holm < forcing.ALPHA
            rejects["margin"] += v.margin_p_holm < forcing.ALPHA
        rows.append({"case": name, **{key: n / trials for key, n in rejects.items()}})
    return rows


def _per_run_noise_promote(ab, aa, differ=False):
    """The alternative reading 'noise = one run's relative noise', for comparison only."""
    floor = ctl.MIN_GAIN_CHANGED_OUTPUT if differ else ctl.MIN_GAIN
    noise = float(np.std(aa, ddof=1) / math.sqrt(2))
    lower = ab.mean() - sps.t.ppf(ctl.CONFIDENCE, ab.size - 1) * ab.std(ddof=1) / math.sqrt(ab.size)
    return math.expm1(lower) > floor + ctl.NOISE_FACTOR * noise


def controller_rule(sims: int, rng) -> list[dict]:
    rows = []
    cases = [(0.01, 0.005, False), (0.015, 0.005, False), (0.02, 0.005, False),
             (0.02, 0.0025, False), (0.02, 0.01, False), (0.03, 0.005, False),
             (0.03, 0.005, True), (0.04, 0.005, True)]
    for gain, noise, differ in cases:
        ab = paired_log_ratios(rng, sims=sims, pairs=ctl.ROUNDS, gain=gain, noise=noise)
        aa = paired_log_ratios(rng, sims=sims, pairs=ctl.ROUNDS, gain=0.0, noise=noise)
        promote = [ctl.decide(x, y, outputs_differ=differ).promote
                   for x, y in zip(ab, aa, strict=True)]
        alt = [_per_run_noise_promote(x, y, differ) for x, y in zip(ab, aa, strict=True)]
        rows.append({"gain": gain, "noise": noise, "outputs_differ": differ,
                     "promoted": float(np.mean(promote)), "per_run_noise_reading": float(
                         np.mean(alt))})
    return rows


def _print_tables(mismatch, verdicts, control, settings):
    print(f"settings: {json.dumps(settings)}")
    print("\nmismatch rule (H0: p_cand - p_stock <= 0.5 pp; stock rate 1%, both-miss 0.3%)")
    print(f"{'clustering':<12}{'prompts x pos':>14}{'FR at H0':>10}{'naive FR':>10}"
          f"{'power +1.5pp':>14}")
    for r in mismatch:
        print(f"{r['clustering']:<12}{r['prompts']:>6} x {r['positions']:<5}"
              f"{r['h0']:>10.4f}{r['naive_h0']:>10.4f}{r['shift']:>14.4f}")
    print("\nforcing verdict on the simulated model (reject rates)")
    print(f"{'case':<28}{'rejected':>10}{'mismatch':>10}{'margin':>10}  (Holm-adjusted)")
    for r in verdicts:
        print(f"{r['case']:<28}{r['any']:>10.3f}{r['mismatch']:>10.3f}{r['margin']:>10.3f}")
    print(f"\ncontroller ({ctl.ROUNDS} rounds of A B A A; promote rates)")
    print(f"{'gain':>6}{'noise':>7}{'outputs':>9}{'promoted':>10}{'(per-run noise reading)':>25}")
    for r in control:
        print(f"{100 * r['gain']:>5.1f}%{100 * r['noise']:>6.2f}%"
              f"{'differ' if r['outputs_differ'] else 'same':>9}{r['promoted']:>10.4f}"
              f"{r['per_run_noise_reading']:>25.4f}")
    head = next(r for r in mismatch if (r["clustering"], r["prompts"]) == ("clustered", 64))
    gain2 = next(r for r in control if (r["gain"], r["noise"]) == (0.02, 0.005))
    print(f"\npower, mismatch rule, +1.5 pp, 64x256 clustered: {head['shift']:.3f}")
    print(f"power, controller, 2% gain at 0.5% noise: {gain2['promoted']:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer simulations")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    settings = {"mismatch_sims": 2000 if args.quick else 20000,
                "verdict_trials": 5 if args.quick else 40, "verdict_prompts": 32,
                "verdict_new_tokens": 128, "verdict_calibration_prompts": 8,
                "controller_sims": 500 if args.quick else 4000, "seed": 2024}
    rng = np.random.default_rng(settings["seed"])
    start = time.perf_counter()
    mismatch = mismatch_rule(settings["mismatch_sims"], rng)
    verdicts = forcing_verdicts(settings["verdict_trials"], settings["verdict_prompts"],
                                settings["verdict_new_tokens"],
                                settings["verdict_calibration_prompts"])
    control = controller_rule(settings["controller_sims"], rng)
    _print_tables(mismatch, verdicts, control, settings)
    print(f"({time.perf_counter() - start:.0f} s)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "mismatch_rule": mismatch,
                       "forcing_verdicts": verdicts, "controller": control}, f, indent=1)


if __name__ == "__main__":
    main()
