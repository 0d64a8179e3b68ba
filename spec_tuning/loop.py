"""The tuning loop: rounds that find a deployment's largest ceiling factor, try the mechanisms
that attack it behind their options, and promote only what the judges prove.

A *deployment* is a target, a drafter, the GPU it runs on (as detected), a serving mode (one
request at a time, or N concurrent) and a prompt set split into a tuning part and a sealed
final part (``sealed.SealedSplit``). A *configuration* is a value for every registry option
(``registry.check_config``); the loop starts from the stock one.

A round:

1. measures the current configuration on the tuning prompts: tau from a served run, and the
   ceiling tau_best from the same drafter's widest registry tree;
2. profiles its plain step and its verify step (``engine_adapter.profile_decode_step``) and
   splits the remaining speed-up into the cost model's three factors
   (``cost_model.decompose``): acceptance, kernels, overhead;
3. takes the largest factor that has proposals: the memory's promoted entries for it first
   (``memory.Memory.leads``, re-measured here: a lead, not a result), then the registry's
   single-option steps (``registry.proposals``), at most ``trials`` of them;
4. judges each in turn: the paired-run controller against the current configuration on the
   tuning prompts (``controller.Controller``, whose rule no proposal can change), then, for one
   the controller promotes, token forcing of its verify path against plain BF16 decoding
   (``prove.forcing_verdict``); the first that passes both becomes the current configuration;
5. writes every judgement, promoted or rejected, with its evidence to the memory.

After the rounds, the sealed final compares the best configuration with the stock on the held-
out prompts (paired runs and token forcing), opening them once. ``TuneResult`` holds the
rounds, the final and a text report; ``save`` writes them as JSON, text and a PNG chart.

Requests are served by ``engine.serving.Server`` (its continuous batching; batch 1 for one
request at a time), greedy, each for exactly ``tokens`` new tokens (no stop token), so every
run of one configuration does the same work. Each option is applied where its registry target
says (``applicable``); those the server cannot take are left out of the proposals
(``supported``). Two-level verification's Q pass runs on the 8-bit view of the deployment's
model, loaded once (weights mode ``view8``).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from spec_tuning import registry
from spec_tuning.memory import Entry, Memory
from w12.errors import W12Error

WEIGHTS_TARGET = "engine.weights.load_model:mode"
ENGINE = "engine.generate.Engine"
SERVER = "engine.serving.Server"


def _server_params() -> frozenset[str]:
    import inspect

    from engine.serving import Server

    return frozenset(inspect.signature(Server).parameters)


def applicable(mechanism: registry.Mechanism) -> bool:
    """Whether the loop can apply an option: the weights, an ``Engine`` argument, or a
    ``Server`` argument (a ``SpecRunner`` option that the server takes under the same name)."""
    where, _, param = mechanism.target.partition(":")
    if mechanism.target == WEIGHTS_TARGET or where == ENGINE:
        return True
    return where in (SERVER, "engine.speculative.decode.SpecRunner") and \
        param in _server_params()


def supported() -> frozenset[str]:
    """The registry options the loop applies."""
    return frozenset(name for name, m in registry.REGISTRY.items() if applicable(m))

ROW_LIMIT = 128  # verify rows a step (requests x nodes) that keep every GEMM's row bits
CALIBRATION = 4  # tuning prompts kept for token forcing's calibration (never judged)

Log = Callable[[str], None]


def _quiet(_message: str) -> None:
    pass


@dataclass(frozen=True)
class Deployment:
    model: str  # a folder or a synthetic preset
    drafter: str  # engine.speculative.make_drafter's names
    mode: str = "single"  # "single" or "batch:N"
    device: str = "cpu"
    source: str = "auto"  # engine_adapter.prompt_requests's sources
    prompts: int = 32  # tuning and final prompts together
    tokens: int = 32  # new tokens a request, every run
    context: int = 256  # cached tokens at the profiled steps
    seed: int = 0

    @property
    def serving(self) -> tuple[str, int]:
        """("single", 1) or ("batch", N)."""
        if self.mode == "single":
            return "single", 1
        kind, _, n = self.mode.partition(":")
        if kind != "batch" or not n.isdigit() or int(n) < 2:
            raise W12Error(f"serving mode {self.mode!r}: single, or batch:N with N >= 2")
        return "batch", int(n)

    def gpu(self) -> str:
        device = torch.device(self.device)
        if device.type == "cuda":
            return torch.cuda.get_device_name(device)
        return device.type

    def to_dict(self) -> dict:
        return {**self.__dict__, "gpu": self.gpu()}


def _commit() -> str:
    """The source tree's commit where it is a git checkout, else ""."""
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _key(config: dict) -> str:
    return json.dumps(config, sort_keys=True, default=str)


def describe(config: dict, base: dict | None = None) -> str:
    """The options of ``config`` that differ from ``base`` (default: the stock's)."""
    base = base if base is not None else {}
    diff = {k: v for k, v in config.items() if base.get(k, registry.REGISTRY[k].stock) != v}
    return ", ".join(f"{k}={v}" for k, v in diff.items()) or "stock"


class Systems:
    """The deployment's models (one per weights mode), and one server per configuration, kept
    for the loop's life so that repeated runs reuse their engines and CUDA graphs."""

    def __init__(self, deployment: Deployment) -> None:
        from engine.weights import load_model

        self.deployment = deployment
        self.kind, self.batch = deployment.serving
        self._load = load_model
        self._loaded: dict[str, object] = {}
        self._servers: dict[str, object] = {}
        self.seq_len = 0  # set by ``fit`` before any server is built

    def fit(self, requests: Sequence[dict]) -> None:
        """Size every engine's cache for these requests at the widest budget."""
        longest = max(len(r["ids"]) for r in requests)
        self.seq_len = longest + self.deployment.tokens + max(
            registry.REGISTRY["budget"].domain) + 8

    def rows(self, config: dict) -> int:
        """Verify rows a step of ``config``: requests x nodes, or the shared node budget."""
        rows = self.batch * config["budget"]
        shared = config.get("shared_budget")
        return rows if shared is None else min(rows, shared)

    def loaded(self, weights: str):
        if weights not in self._loaded:
            d = self.deployment
            self._loaded[weights] = self._load(d.model, mode=weights, device=d.device,
                                               seed=d.seed)
        return self._loaded[weights]

    def _server(self, config: dict):
        """The server of ``config``: every option goes where its registry target says (the
        weights, an ``Engine`` argument or a ``Server`` argument), so a new mechanism that
        names such a parameter needs nothing here."""
        from engine.generate import Engine
        from engine.serving import Server
        from engine.speculative import make_drafter

        key = _key(config)
        if key not in self._servers:
            model = self.loaded(config["weights"]).model
            engine_args, server_args = {}, {}
            for name, value in config.items():
                m = registry.REGISTRY.get(name)
                if m is None or m.target == WEIGHTS_TARGET:
                    continue
                where, _, param = m.target.partition(":")
                if not applicable(m):
                    if value != m.stock:
                        raise W12Error(f"option {name}: the loop cannot apply {m.target}")
                    continue
                if name == "two_level" and value is not None:  # the Q pass's model
                    from engine.speculative.two_level import TwoLevel

                    value = TwoLevel(self.loaded("view8").model, value)
                (engine_args if where == ENGINE else server_args)[param] = value
            if model.device.type != "cuda":
                engine_args.pop("cuda_graph", None)  # (no graphs on a CPU)
            engine = Engine(model, batch=self.batch, max_seq_len=self.seq_len, **engine_args)
            self._servers[key] = Server(
                engine, drafter=make_drafter(self.deployment.drafter, model), **server_args)
        return self._servers[key]

    def serve(self, config: dict, requests: Sequence[dict]):
        """Each request's new tokens (exactly ``tokens`` each) and the run's ServeStats."""
        from engine.ops import OpSet

        server = self._server(config)
        # the servers share one model a weights mode, and an Engine sets the model's op set
        # when it is built: put back this configuration's before its run
        server.engine.model.ops = OpSet(compiled=server.engine.compiled)
        ids = [server.submit(list(r["ids"]), max_new_tokens=self.deployment.tokens)
               for r in requests]
        out, stats = server.run()
        return [out[i] for i in ids], stats

    def runner(self, config: dict):
        from spec_tuning.controller import TimedRunner

        device = self.loaded(config["weights"]).model.device

        def sync() -> None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)

        return TimedRunner(lambda requests: self.serve(config, requests)[0], sync=sync)

    def system(self, config: dict):
        """The configuration as a system token forcing drives through its own verify path
        (with two-level verification, the exact pass's: it decides every token, the Q pass
        only chooses which ones it verifies)."""
        from spec_tuning.engine_adapter import System, SystemSpec

        path = f"{'tree' if config['tree'] else 'chain'}:{config['budget']}"
        spec = SystemSpec(self.deployment.model, mode=config["weights"], batch=self.batch,
                          compile=config["compile"], path=path,
                          defect=config.get("defect"))
        return System(spec, self.loaded(config["weights"]))


@dataclass
class Trial:
    option: str
    value: object
    config: dict
    source: str  # "memory" or "registry"
    verdict: str  # "promoted" or "rejected"
    judge: str  # which judge decided: "controller", "forcing" or "setup"
    reason: str
    evidence: dict = field(default_factory=dict)


@dataclass
class Round:
    index: int
    config: dict
    tokens_per_s: float
    tau: float
    tau_best: float
    factors: dict
    factor: str | None  # the factor whose proposals were tried
    trials: list[Trial] = field(default_factory=list)

    @property
    def promoted(self) -> Trial | None:
        return next((t for t in self.trials if t.verdict == "promoted"), None)


@dataclass
class TuneResult:
    deployment: Deployment
    stock: dict
    best: dict
    rounds: list[Round]
    final: dict  # the sealed final: the controller's decision and the forcing verdict
    text: str = ""

    def to_dict(self) -> dict:
        def trial(t: Trial) -> dict:
            return {**t.__dict__}

        return {"deployment": self.deployment.to_dict(), "stock": self.stock, "best": self.best,
                "rounds": [{**r.__dict__, "trials": [trial(t) for t in r.trials]}
                           for r in self.rounds],
                "final": self.final}

    def save(self, out_dir: Path) -> list[Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        paths = [out_dir / "tune.json", out_dir / "tune.txt", out_dir / "rounds.png"]
        paths[0].write_text(json.dumps(self.to_dict(), indent=1, default=str) + "\n")
        paths[1].write_text(self.text + "\n")
        _chart(self, paths[2])
        return paths


def _chart(result: TuneResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r.index for r in result.rounds]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    ax1.plot(rounds, [r.tokens_per_s for r in result.rounds], marker="o")
    ax1.set_ylabel("tokens/s (one run)")
    ax1.set_title(f"{result.deployment.model} · {result.deployment.drafter} · "
                  f"{result.deployment.mode}")
    for name in registry.FACTORS:
        ax2.plot(rounds, [r.factors.get(name, float("nan")) for r in result.rounds],
                 marker="o", label=name)
    ax2.set_ylabel("ceiling factor")
    ax2.set_xlabel("round")
    ax2.set_xticks(rounds)
    ax2.legend()
    for r in result.rounds:
        if r.promoted is not None:
            ax1.annotate(f"{r.promoted.option}={r.promoted.value}", (r.index, r.tokens_per_s),
                         fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


class Tuner:
    """One deployment's loop (module docstring). ``compare(incumbent, candidate, requests,
    candidate_config=...)`` and ``forcing(config) -> (accepted, reasons, evidence)`` default to
    the controller and token forcing. ``judge`` takes an option outside the registry too (a
    test fixture such as ``defect``, which only the forced system applies)."""

    def __init__(self, deployment: Deployment, *, out_dir: Path, memory: Memory,
                 trials: int = 3, forcing_prompts: int = 8, forcing_tokens: int | None = None,
                 compare=None, forcing=None, agent: str | None = None,
                 agent_tests: str = "python -m pytest -q -x", log: Log = _quiet) -> None:
        from spec_tuning.engine_adapter import prompt_requests
        from spec_tuning.sealed import SealedSplit

        self.deployment, self.out_dir, self.memory, self.log = deployment, out_dir, memory, log
        self.kind, self.batch = deployment.serving
        if trials < 1:
            raise W12Error(f"trials {trials}: at least 1 a round")
        self.trials = trials
        self.systems = Systems(deployment)
        requests, self.stop_ids, self.source = prompt_requests(
            self.systems.loaded("bf16"), source=deployment.source, count=deployment.prompts,
            seed=deployment.seed)
        requests = requests[:deployment.prompts]
        self.split = SealedSplit(requests, seed=deployment.seed,
                                 log_path=out_dir / "sealed.jsonl")
        self.tuning = self.split.tuning
        if len(self.tuning) < CALIBRATION + 2 or self.split.final_size < 2:
            raise W12Error(f"{len(requests)} prompts leave {len(self.tuning)} to tune on and "
                           f"{self.split.final_size} sealed; give more (--prompts)")
        self.systems.fit(requests)
        self.forcing_prompts = min(forcing_prompts, len(self.tuning) - CALIBRATION)
        self.forcing_tokens = forcing_tokens or deployment.tokens
        self._compare = compare or self._controller_compare
        self._forcing = forcing or self._forcing_verdict
        self._baseline = None
        self._stock_system = None
        self._peaks = None
        self.gpu, self.commit = deployment.gpu(), _commit()
        self.agent, self.agent_tests = agent, agent_tests

    # -- judges ----------------------------------------------------------------------------
    def _controller_compare(self, incumbent, candidate, requests, *, candidate_config):
        from spec_tuning.controller import Controller

        return Controller(self.out_dir / "controller.jsonl").compare(
            incumbent, candidate, requests, candidate_config=candidate_config)

    def _forcing_verdict(self, config: dict) -> tuple[bool, list[str], dict]:
        from spec_tuning.engine_adapter import System, SystemSpec
        from spec_tuning.prove import forcing_verdict, stock_baseline

        judged = self.tuning[:self.forcing_prompts]
        calibration = self.tuning[-CALIBRATION:]
        if self._stock_system is None:  # (the BF16 model the prompts were made with)
            self._stock_system = System(SystemSpec(self.deployment.model, mode="bf16"),
                                        self.systems.loaded("bf16"))
            self._baseline = stock_baseline(self._stock_system, judged, calibration,
                                            tokens=self.forcing_tokens, log=self.log)
        result = forcing_verdict(self._stock_system, self.systems.system(config), judged,
                                 calibration, tokens=self.forcing_tokens,
                                 baseline=self._baseline, log=self.log)
        v = result.verdict
        return v.accepted, list(v.reasons), {
            "accepted": v.accepted, "reasons": list(v.reasons), "prompts": result.prompts,
            "reference_tokens": result.reference_tokens, "excess": v.excess,
            "excess_lower": v.excess_lower, "mismatch_p_holm": v.mismatch_p_holm,
            "margin_p_holm": v.margin_p_holm}

    # -- measuring -------------------------------------------------------------------------
    def _ceiling(self, config: dict) -> tuple[float, float, float, dict]:
        """(one run's tokens/s, tau, tau_best, the cost model's factors) of ``config``."""
        from spec_tuning.cost_model import decompose, measure_peaks
        from spec_tuning.engine_adapter import profile_decode_step

        device = self.systems.loaded(config["weights"]).model.device
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        self.systems.serve(config, self.tuning[:1])  # (a warm-up: engine, graphs)
        sync()
        start = time.perf_counter()
        outputs, stats = self.systems.serve(config, self.tuning)
        sync()
        tokens_per_s = sum(map(len, outputs)) / (time.perf_counter() - start)
        _, best_stats = self.systems.serve(self.widest(config), self.tuning)
        tau, tau_best = stats.tau, max(best_stats.tau, stats.tau)
        model = self.systems.loaded(config["weights"]).model
        if self._peaks is None:
            self._peaks = measure_peaks(model.device)
        d = self.deployment
        plain = profile_decode_step(model, batch=self.batch, n_tokens=1, context=d.context,
                                    compile=config["compile"], seed=d.seed)
        step = profile_decode_step(model, batch=self.batch, n_tokens=config["budget"],
                                   context=d.context, compile=config["compile"], seed=d.seed)
        dec = decompose(step.grouped, tau=tau, tau_best=tau_best,
                        t_ar=plain.profile.step_seconds, peaks=self._peaks,
                        tree_size=config["budget"])
        return tokens_per_s, tau, tau_best, dict(dec.factors)

    def widest(self, config: dict) -> dict:
        """``config`` with the widest best-first tree the row limit allows (its tau is the
        round's tau_best: what the registry's trees could reach with this drafter)."""
        budget = max(b for b in registry.REGISTRY["budget"].domain
                     if self.batch * b <= ROW_LIMIT)
        wide = {**config, "tree": True, "budget": budget}
        if self.kind == "batch":
            wide.update(shared_budget=None, widths=None)
        return registry.check_config(wide, self.kind)

    def allowed(self, config: dict) -> bool:
        try:
            registry.check_config(config, self.kind)
        except W12Error:
            return False
        return self.systems.rows(config) <= ROW_LIMIT

    def _candidates(self, factor: str, current: dict) -> list[tuple[str, object, str]]:
        seen, out = set(), []
        for entry in self.memory.leads(factor, self.kind, self.gpu):
            value = tuple(entry.value) if isinstance(entry.value, list) else entry.value
            if entry.option not in supported() or current.get(entry.option) == value or \
                    torch.device(self.deployment.device).type not in \
                    registry.REGISTRY[entry.option].devices or \
                    not self.allowed({**current, entry.option: value}):
                continue
            if (entry.option, value) not in seen:
                seen.add((entry.option, value))
                out.append((entry.option, value, "memory"))
        device = torch.device(self.deployment.device).type
        for option, value in registry.proposals(factor, self.kind, current, supported(),
                                                device):
            if (option, value) not in seen and self.allowed({**current, option: value}):
                seen.add((option, value))
                out.append((option, value, "registry"))
        return out[:self.trials]

    def judge(self, current: dict, option: str, value, source: str = "proposal") -> Trial:
        """``option``=``value`` on top of ``current``, through the controller and then token
        forcing (module docstring, step 4)."""
        cand = {**current, option: value}
        self.log(f"  trying {option}={value} ({source}) ...")
        try:
            decision = self._compare(self.systems.runner(current), self.systems.runner(cand),
                                     self.tuning, candidate_config=cand)
        except W12Error as exc:
            return Trial(option, value, cand, source, "rejected", "setup", str(exc))
        evidence = {"gain": decision.gain.gain, "gain_low": decision.gain.lower,
                    "noise": decision.noise, "bar": decision.bar,
                    "outputs_differ": decision.outputs_differ}
        if not decision.promote:
            return Trial(option, value, cand, source, "rejected", "controller", decision.reason,
                         evidence)
        try:
            accepted, reasons, forcing = self._forcing(cand)
        except W12Error as exc:
            return Trial(option, value, cand, source, "rejected", "forcing",
                         f"cannot be forced: {exc}", evidence)
        evidence["forcing"] = forcing
        if not accepted:
            return Trial(option, value, cand, source, "rejected", "forcing",
                         "token forcing: " + "; ".join(reasons), evidence)
        return Trial(option, value, cand, source, "promoted", "forcing",
                     f"{decision.reason}; token forcing passed", evidence)

    def _remember(self, factor: str, trial: Trial) -> None:
        self.memory.add(Entry(
            factor=factor, mode=self.kind, gpu=self.gpu, option=trial.option,
            value=trial.value, verdict=trial.verdict, reason=trial.reason,
            evidence={**trial.evidence, "deployment": self.deployment.to_dict(),
                      "config": trial.config, "judge": trial.judge, "source": trial.source},
            date=time.strftime("%Y-%m-%d"), commit=self.commit))
        self.memory.save()

    # -- the loop --------------------------------------------------------------------------
    def run(self, rounds: int) -> TuneResult:
        if rounds < 1:
            raise W12Error(f"rounds {rounds}: at least 1")
        stock = registry.stock_config(self.kind)
        current, history = dict(stock), []
        for index in range(1, rounds + 1):
            self.log(f"round {index}: measuring {describe(current)} ...")
            tps, tau, tau_best, factors = self._ceiling(current)
            record = Round(index, dict(current), tps, tau, tau_best, factors, None)
            history.append(record)
            self.log(f"  {tps:.1f} tokens/s, tau {tau:.3f} (widest tree {tau_best:.3f}); "
                     + ", ".join(f"{k} {v:.3f}" for k, v in factors.items()))
            order = sorted(factors, key=factors.get, reverse=True)
            for factor in order:
                candidates = self._candidates(factor, current)
                if candidates:
                    break
            else:
                if self.agent is None:
                    self.log("  no proposal left for any factor")
                    break
                factor = order[0]  # only the agent's proposal for the largest factor
            record.factor = factor
            for option, value, source in candidates:
                trial = self.judge(current, option, value, source)
                record.trials.append(trial)
                self._remember(factor, trial)
                self.log(f"  {trial.verdict}: {option}={value}: {trial.reason}")
                if trial.verdict == "promoted":
                    current = trial.config
                    break
            if record.promoted is None and self.agent is not None:
                trial = self._agent_trial(record, factor, current)
                record.trials.append(trial)
                self._remember(factor, trial)
                self.log(f"  {trial.verdict}: agent {trial.option}={trial.value}: "
                         f"{trial.reason}")
        final = self._final(stock, current)
        result = TuneResult(self.deployment, stock, current, history, final)
        result.text = report(result)
        return result

    def _agent_trial(self, record: Round, factor: str, current: dict) -> Trial:
        """The external agent's proposal for ``factor``, tested and judged in its worktree."""
        from spec_tuning import agent

        brief = {"deployment": self.deployment.to_dict(), "round": record.index,
                 "factors": record.factors, "factor": factor, "tau": record.tau,
                 "tau_best": record.tau_best, "current": current,
                 "options": sorted(registry.REGISTRY)}
        try:
            proposal = agent.propose(self.agent, brief, log=self.log)
        except agent.Refused as exc:
            return Trial("patch", None, current, "agent", "rejected", "setup", str(exc))
        evidence = {"patch": proposal.sha, "files": proposal.files}
        option = proposal.options[0]
        try:
            self.log(f"  agent patch {proposal.sha} adds {', '.join(proposal.options)}; "
                     "testing ...")
            agent.run_tests(proposal, self.agent_tests)
            got = agent.judge(proposal, option, deployment=self.deployment.to_dict(),
                              current=current, out_dir=self.out_dir)
            if got["verdict"] == "promoted":
                self.log("  promoted in its tree; timing the current configuration in both "
                         "trees ...")
                try:
                    evidence["stock_path"] = agent.stock_path_check(
                        proposal, deployment=self.deployment.to_dict(), current=current,
                        out_dir=self.out_dir, bar=got["evidence"]["bar"])
                except agent.Refused as exc:
                    return Trial(option, got["value"], got["config"], "agent", "rejected",
                                 "stock-path", str(exc), {**got["evidence"], **evidence})
        except agent.Refused as exc:
            return Trial(option, None, current, "agent", "rejected", "setup", str(exc),
                         evidence)
        finally:
            agent.discard(proposal.worktree)
        trial = Trial(option, got["value"], got["config"], "agent", got["verdict"], got["judge"],
                      got["reason"], {**got["evidence"], **evidence})
        if trial.verdict == "promoted":
            saved = self.out_dir / "patches" / f"{proposal.sha}.patch"
            saved.parent.mkdir(parents=True, exist_ok=True)
            saved.write_text(proposal.patch)
            trial.reason += f"; patch saved to {saved} (apply it to build on it)"
        return trial

    def _final(self, stock: dict, best: dict) -> dict:
        if best == stock:
            return {"skipped": "nothing was promoted: the best configuration is the stock"}
        final = self.split.open_final(reason=f"tune final: {describe(best)} against stock")
        self.log(f"sealed final: {describe(best)} against stock on {len(final)} held-out "
                 "prompts ...")
        decision = self._compare(self.systems.runner(stock), self.systems.runner(best), final,
                                 candidate_config=best)
        accepted, reasons, forcing = self._forcing(best)
        return {"prompts": len(final), "gain": decision.gain.gain,
                "gain_low": decision.gain.lower, "noise": decision.noise,
                "promote": decision.promote, "reason": decision.reason,
                "forcing": forcing, "forcing_accepted": accepted}


def report(result: TuneResult) -> str:
    d = result.deployment
    lines = [f"tune: {d.model}, drafter {d.drafter}, {d.mode}, {d.gpu()}, {d.prompts} prompts x "
             f"{d.tokens} tokens"]
    for r in result.rounds:
        lines.append(f"round {r.index}: {describe(r.config)}: {r.tokens_per_s:.1f} tokens/s, "
                     f"tau {r.tau:.3f} (widest tree {r.tau_best:.3f}); factors "
                     + ", ".join(f"{k} {v:.3f}" for k, v in r.factors.items())
                     + (f"; tried for {r.factor}" if r.factor else ""))
        for t in r.trials:
            lines.append(f"  {t.verdict.upper():<8} {t.option}={t.value} ({t.source}, "
                         f"{t.judge}): {t.reason}")
    lines.append(f"best: {describe(result.best)}")
    f = result.final
    if "skipped" in f:
        lines.append(f"sealed final: {f['skipped']}")
    else:
        lines.append(f"sealed final ({f['prompts']} held-out prompts): best/stock "
                     f"{1 + f['gain']:.3f}x, lower bound {1 + f['gain_low']:.3f}x; controller "
                     f"{'promotes' if f['promote'] else 'does not promote'} ({f['reason']}); "
                     f"token forcing {'passed' if f['forcing_accepted'] else 'FAILED'}")
    return "\n".join(lines)
