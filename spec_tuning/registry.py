"""The mechanisms the tuning loop may try: every speculative choice the runtime offers, as a
named option with its domain, its stock value, the ceiling factor it attacks and what a trial
costs.

The cost model splits the distance from a decoding speed-up to its ceiling into three factors
(``cost_model.decompose``): ``acceptance`` (tau_best / tau, the acceptance a better draft
tree would reach), ``kernels`` (T_prof / T_floor, the verify step's kernels against the byte
and FLOP floor) and ``overhead`` (T_step / T_prof, the step's time outside the profiled
kernels). A round asks ``proposals(factor, mode, current)`` for the mechanisms that attack the
largest one.

Each option names the runtime parameter it sets (``target``, ``module.Callable:parameter``), so
that nothing here is a knob the runtime lacks: ``check_targets`` resolves every one (a test
runs it). A mechanism is a lead until the controller and token forcing have judged it on a
deployment; the registry holds no result.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass, field

from w12.errors import W12Error

FACTORS = ("acceptance", "kernels", "overhead")  # cost_model.decompose's factors
MODES = ("single", "batch")


@dataclass(frozen=True)
class Mechanism:
    name: str
    domain: tuple  # the values a proposal may set, stock value included
    stock: object  # the stock system's value
    factor: str  # the ceiling factor it attacks (FACTORS)
    target: str  # "module.Callable:parameter" it sets
    cost: float  # a trial's cost in paired runs of one configuration (relative)
    modes: tuple[str, ...] = MODES  # the serving modes it applies to
    requires: dict = field(default_factory=dict)  # other options it needs, name -> value
    devices: tuple[str, ...] = ("cuda", "cpu")  # where it does something
    help: str = ""

    def check(self, value) -> object:
        """``value`` if the domain holds it, else a W12Error naming the domain."""
        if value not in self.domain:
            raise W12Error(f"option {self.name}: {value!r} is not one of "
                           f"{', '.join(map(repr, self.domain))}")
        return value


REGISTRY: dict[str, Mechanism] = {m.name: m for m in (
    Mechanism("tree", (False, True), False, "acceptance",
              "engine.speculative.decode.SpecRunner:tree", 1.0,
              help="a best-first draft tree instead of the drafter's top-1 chain"),
    Mechanism("budget", (4, 8, 16, 32, 64, 128), 16, "acceptance",
              "engine.speculative.decode.SpecRunner:budget", 1.0,
              help="nodes verified per step (root included)"),
    Mechanism("weights", ("bf16", "w12"), "bf16", "kernels",
              "engine.weights.load_model:mode", 2.0,
              help="W12 weights: 12 of 16 bits read per weight, the same outputs only where "
                   "the W12 folder decodes to the BF16 checkpoint"),
    Mechanism("two_level", (None, 4, 8), None, "kernels",
              "engine.serving.Server:two_level", 2.0, modes=("single",),
              requires={"weights": "w12"},
              help="an 8-bit Q pass over the W12 hi byte checks a tree of this many nodes, "
                   "the drafter drafts again from its path, one exact pass verifies the "
                   "budget's nodes (below the budget; single requests: it lost under batching "
                   "in the reference system)"),
    Mechanism("cuda_graph", (True, False), True, "overhead",
              "engine.generate.Engine:cuda_graph", 0.5, devices=("cuda",),
              help="the verify step replayed as one CUDA graph"),
    Mechanism("compile", (False, True), False, "overhead",
              "engine.generate.Engine:compile", 1.0, devices=("cuda",),
              help="torch.compile'd elementwise ops (on a CPU its compile time dwarfs a "
                   "trial)"),
    Mechanism("shared_budget", (None, 32, 64, 128), None, "acceptance",
              "engine.serving.Server:shared_total", 1.0, modes=("batch",),
              requires={"tree": True},
              help="one node budget shared by the running requests, split by draft "
                   "confidence"),
    Mechanism("widths", (None, (4, 8, 16), (8, 12, 16)), None, "acceptance",
              "engine.serving.Server:widths", 1.0, modes=("batch",),
              help="per-request draft widths chosen each step from these"),
    Mechanism("admission", (None, 256, 1024), None, "overhead",
              "engine.serving.Server:admission", 1.0, modes=("batch",),
              help="prompt tokens prefilled between two steps while requests run"),
)}


def mechanism(name: str) -> Mechanism:
    try:
        return REGISTRY[name]
    except KeyError:
        raise W12Error(f"no option {name!r}; options: {', '.join(REGISTRY)}") from None


def stock_config(mode: str = "single") -> dict:
    """The stock system's value of every option that applies to ``mode``."""
    _check_mode(mode)
    return {m.name: m.stock for m in REGISTRY.values() if mode in m.modes}


def check_config(config: dict, mode: str = "single") -> dict:
    """``config`` checked: known options of ``mode``, values in their domains, each option's
    requirements met (after filling the stock values of those not given)."""
    _check_mode(mode)
    full = {**stock_config(mode), **config}
    for name, value in config.items():
        m = mechanism(name)
        if mode not in m.modes:
            raise W12Error(f"option {name} applies to {' and '.join(m.modes)} serving, not "
                           f"{mode}")
        m.check(value)
    for name, value in full.items():
        m = REGISTRY[name]
        if value != m.stock:
            for need, want in m.requires.items():
                if full.get(need) != want:
                    raise W12Error(f"option {name}={value!r} needs {need}={want!r}")
    q = full.get("two_level")
    if q is not None and q >= full["budget"]:
        raise W12Error(f"option two_level={q}: the Q tree must be smaller than the budget "
                       f"{full['budget']}")
    return full


def proposals(factor: str, mode: str, current: dict, only: frozenset[str] | None = None,
              device: str = "cuda") -> list[tuple[str, object]]:
    """(option, value) pairs that attack ``factor`` in ``mode`` on a ``device`` ("cuda" or
    "cpu") and change ``current``: each a single-option step whose result still passes
    ``check_config``, cheapest first; ``only``: the options a caller can apply (default:
    all)."""
    if factor not in FACTORS:
        raise W12Error(f"factor {factor!r}: one of {', '.join(FACTORS)}")
    current = check_config(current, mode)
    out = []
    for m in sorted(REGISTRY.values(), key=lambda m: (m.cost, m.name)):
        if m.factor != factor or mode not in m.modes or device not in m.devices or (
                only is not None and m.name not in only):
            continue
        for value in m.domain:
            if value == current[m.name]:
                continue
            try:
                check_config({**current, m.name: value}, mode)
            except W12Error:
                continue
            out.append((m.name, value))
    return out


def check_targets() -> list[str]:
    """Every mechanism's target resolved: the callable exists and takes that parameter.
    Returns the problems (empty when all resolve)."""
    problems = []
    for m in REGISTRY.values():
        where, _, param = m.target.partition(":")
        module_name, _, attr = where.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            problems.append(f"{m.name}: {where}: {exc}")
            continue
        if param not in inspect.signature(obj).parameters:
            problems.append(f"{m.name}: {where} takes no parameter {param!r}")
    return problems


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise W12Error(f"serving mode {mode!r}: one of {', '.join(MODES)}")
