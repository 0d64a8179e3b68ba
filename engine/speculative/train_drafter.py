"""Training a block drafter by self-distillation from its target (``w12 draft train``).

1. **Data.** The target answers a prompt set itself (batched generation on the engine, greedy
   by default): prompt + response sequences, the distribution the drafter will face.
2. **Targets.** Each step runs the target once over a batch of sequences (teacher forcing):
   the same forward gives the tapped layers' hidden states (the drafter's context) and the
   final states, whose LM-head logits are the soft targets.
3. **Blocks.** Per sequence, random anchors in the response: the anchor token is a block's
   root, the next ``block_size - 1`` positions are mask positions; a block sees the context
   strictly before its anchor and every position of its own block (non-causal), never another
   block. Mask position i is trained toward the target's distribution of the token there
   (KL divergence), weighted by exp(-(i - 1) / gamma): early positions decide acceptance.
4. **Optimisation.** AdamW with warm-up and cosine decay, gradient clipping, seeded anchors,
   batches and initial weights (the drafter's layers start as copies of the target's last
   layers, the fusion as the mean of the taps), so a command reproduces its run.

The result is a drafter folder in BF16 and its W12 copy (``converters.hf.convert_folder``),
a loss curve (PNG) and a JSON log of the run.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionPlan
from engine.generate import Engine, generate
from engine.model import ModelArgs, Transformer, rope_tables
from engine.sampling import Sampling
from engine.speculative.block_drafter import (
    BlockDrafterConfig,
    BlockDrafterModel,
    state_for_folder,
)
from w12.errors import W12Error


@dataclass
class TrainOptions:
    layers: int = 3
    block_size: int = 16
    taps: int = 5
    steps: int = 3000
    minutes: float | None = None  # the optimisation's time: --steps fitted to it (``_fit``)
    batch: int = 16  # sequences per step
    anchors: int = 32  # blocks per sequence
    lr: float = 6e-4
    warmup: int = 100
    weight_decay: float = 0.01
    gamma: float = 7.0  # loss weight exp(-(i - 1) / gamma) at block position i
    seed: int = 0
    max_new_tokens: int = 256  # response length in data generation
    max_prompt_tokens: int = 384
    gen_batch: int = 128
    temperature: float = 0.0  # data generation: greedy by default


@dataclass
class TrainLog:
    options: dict
    target: str
    sequences: int = 0
    data_tokens: int = 0
    generate_seconds: float = 0.0
    train_seconds: float = 0.0
    steps_run: int = 0
    fitted_steps: int | None = None  # the step count --minutes chose (``--steps`` repeats it)
    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)  # top-1 agreement, every position
    first_accuracy: list[float] = field(default_factory=list)  # at block position 1
    stopped_by_time: bool = False


@dataclass
class Sequence:
    tokens: list[int]
    prompt_len: int


# ----------------------------------------------------------------------------- data

def generate_responses(model: Transformer, prompts: list[list[int]], *, options: TrainOptions,
                       stop_ids: frozenset[int], progress: Callable[[int], None] | None = None
                       ) -> list[Sequence]:
    """The target's own responses: ``gen_batch`` prompts at a time (similar lengths together),
    greedy or sampled with keyed noise. Sequences whose response is too short for one block
    position are dropped."""
    if not prompts:
        raise W12Error("draft train: the prompt set is empty")
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batch = min(options.gen_batch, len(prompts))
    longest = max(map(len, prompts))
    engine = Engine(model, batch=batch, max_seq_len=longest + options.max_new_tokens + 1)
    sampling = Sampling(options.temperature, 0.95 if options.temperature else 1.0, options.seed)
    out: dict[int, Sequence] = {}
    for start in range(0, len(order), batch):
        chunk = order[start:start + batch]
        rows = [prompts[i] for i in chunk]
        rows += [rows[-1]] * (batch - len(rows))
        answers = generate(engine, rows, max_new_tokens=options.max_new_tokens,
                           sampling=sampling, stop_ids=stop_ids)
        for i, answer in zip(chunk, answers, strict=False):
            if len(answer) >= 2:
                out[i] = Sequence(prompts[i] + answer, len(prompts[i]))
        if progress is not None:
            progress(len(chunk))
    return [out[i] for i in sorted(out)]


# ----------------------------------------------------------------------------- the model

def init_from_target(net: BlockDrafterModel, target: Transformer, seed: int) -> None:
    """Layers from the target's last layers; the fusion as the mean of the taps; the mask
    embedding drawn at the scale of the target's embedding (seeded)."""
    c = net.config
    if c.n_layers > target.args.n_layers:
        raise W12Error(f"draft train: {c.n_layers} drafter layers start as copies of the target's "
                       f"last layers; the target has {target.args.n_layers}")
    gen = torch.Generator().manual_seed(seed)

    def param(t: torch.Tensor) -> nn.Parameter:
        return nn.Parameter(t.detach().to("cpu", torch.float32).clone())

    for mine, theirs in zip(net.layers, target.layers[-c.n_layers:], strict=True):
        if theirs.attn.wqkv.weight is None:
            raise W12Error("draft train: the target must be loaded with BF16 linears")
        q, kv = theirs.attn.wqkv.weight.split([c.q_size, 2 * c.kv_size])
        mine.wq.weight, mine.wkv.weight = param(q), param(kv)
        mine.wo.weight = param(theirs.attn.wo.weight)
        mine.w13.weight, mine.w2.weight = param(theirs.w13.weight), param(theirs.w2.weight)
        mine.attn_norm, mine.mlp_norm = param(theirs.attn_norm), param(theirs.mlp_norm)
        if c.qk_norm:
            mine.q_norm, mine.k_norm = param(theirs.attn.q_norm), param(theirs.attn.k_norm)
    taps = len(c.target_layers)
    eye = torch.eye(c.dim).repeat(1, taps) / taps
    net.fc.weight = nn.Parameter(eye + torch.randn(eye.shape, generator=gen) * 0.02 / taps)
    net.norm = param(target.norm)
    scale = target.embed.float().std().item()
    net.mask_embedding = nn.Parameter(torch.randn(c.dim, generator=gen) * scale)


def target_states(target: Transformer, tokens: torch.Tensor, layers: tuple[int, ...]
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher forcing over ``tokens`` [B, T]: the tapped layers' states concatenated
    [B, T, taps * dim] and the final-normed states [B, T, dim] (the LM head's input)."""
    b, t = tokens.shape
    last = target.args.n_layers - 1
    wanted = tuple(sorted(set(layers) | {last}))
    pos = torch.arange(t, device=tokens.device).expand(b, t)
    hidden: list[torch.Tensor] = []
    target(tokens, pos, target.new_cache(b, t), AttentionPlan.prefill(pos),
           last=torch.zeros(b, dtype=torch.long, device=tokens.device), hidden=hidden,
           taps=wanted)
    by_layer = dict(zip(wanted, hidden, strict=True))
    final = target.ops.rms_norm(by_layer[last], target.norm, target.args.norm_eps)
    return torch.cat([by_layer[i] for i in layers], dim=-1), final


def block_visibility(anchors: torch.Tensor, context: int, block: int) -> torch.Tensor:
    """[B, A * block, context + A * block] boolean: a block row sees the context positions
    before its anchor and every row of its own block."""
    b, a = anchors.shape
    ctx = torch.arange(context, device=anchors.device)
    sees_ctx = (ctx < anchors[:, :, None]).repeat_interleave(block, dim=1)
    owner = torch.arange(a, device=anchors.device).repeat_interleave(block)
    sees_block = (owner[:, None] == owner[None, :]).expand(b, -1, -1)
    return torch.cat([sees_ctx, sees_block], dim=2)


def block_loss(net: BlockDrafterModel, target: Transformer, head: torch.Tensor,
               tokens: torch.Tensor, lengths: torch.Tensor, anchors: torch.Tensor,
               gamma: float) -> tuple[torch.Tensor, dict[str, float]]:
    """The decayed KL loss of a batch (``tokens`` [B, T] right-padded to ``lengths``, blocks
    rooted at ``anchors`` [B, A]) and its top-1 agreement."""
    c = net.config
    bk, (b, t), a = c.block_size, tokens.shape, anchors.shape[1]
    dtype = head.dtype
    # the target runs as it does when serving: its own dtypes, no autocast
    with torch.no_grad(), torch.autocast("cuda", enabled=False):
        taps, final = target_states(target, tokens, c.target_layers)
        offsets = torch.arange(1, bk, device=tokens.device)
        predicted = anchors[:, :, None] + offsets  # positions the mask rows predict
        valid = predicted < lengths[:, None, None]
        source = (predicted - 1).clamp(max=t - 1).view(b, -1)
        teacher = F.linear(final.gather(1, source[..., None].expand(-1, -1, c.dim)).to(dtype),
                           head).float().log_softmax(-1).view(b, a, bk - 1, -1)
        roots = F.embedding(tokens.gather(1, anchors), target.embed).to(dtype)
    cos, sin = rope_tables(c.rope_args(), t + bk, torch.float32, tokens.device)
    ctx_pos = torch.arange(t, device=tokens.device)
    states = net.context(taps.to(dtype))
    contexts = [tuple(x.transpose(1, 2) for x in layer.keys_values(
        states, cos[ctx_pos][None, :, None], sin[ctx_pos][None, :, None]))
        for layer in net.layers]
    pos = (anchors[:, :, None] + torch.arange(bk, device=tokens.device)).view(b, -1)
    x = net.block_inputs(roots).view(b, a * bk, c.dim)
    h = net(x, cos[pos].unsqueeze(2), sin[pos].unsqueeze(2), contexts,
            block_visibility(anchors, t, bk))
    h = h.view(b, a, bk, c.dim)[:, :, 1:]
    student = F.linear(h.to(dtype), head).float().log_softmax(-1)
    kl = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    weight = torch.exp(-(offsets - 1).float() / gamma) * valid
    loss = (kl * weight).sum() / weight.sum().clamp(min=1e-6)
    with torch.no_grad():
        agree = (student.argmax(-1) == teacher.argmax(-1)) & valid
        accuracy = agree.sum().item() / max(valid.sum().item(), 1)
        first = agree[:, :, 0].sum().item() / max(valid[:, :, 0].sum().item(), 1)
    return loss, {"loss": loss.item(), "accuracy": accuracy, "first_accuracy": first}


PAD_TO = 64  # batches padded to a multiple of this length: a handful of shapes, not hundreds


def sample_batch(data: list[Sequence], indices: list[int], anchors: int, gen: torch.Generator,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens right-padded to a multiple of ``PAD_TO`` (a few shapes instead of one per length:
    on a GPU new shapes cost fresh allocations, and a pace still climbing when ``_probe``
    times it makes ``--minutes`` fit too few steps), lengths,
    and ``anchors`` random anchors per sequence (in its response, each with at least one
    position after it; the padding is never seen: a block sees the context before its
    anchor)."""
    rows = [data[i] for i in indices]
    longest = -(-max(len(r.tokens) for r in rows) // PAD_TO) * PAD_TO
    tokens = torch.zeros(len(rows), longest, dtype=torch.long)
    for i, r in enumerate(rows):
        tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
    lengths = torch.tensor([len(r.tokens) for r in rows])
    first = torch.tensor([r.prompt_len for r in rows])
    span = (lengths - 1 - first).clamp(min=1)  # anchors in [prompt_len, length - 2]
    picks = first[:, None] + (torch.rand(len(rows), anchors, generator=gen) * span[:, None]).long()
    return tokens.to(device), lengths.to(device), picks.to(device)


def train_drafter(target: Transformer, data: list[Sequence], options: TrainOptions, *,
                  log: TrainLog, progress=None) -> BlockDrafterModel:
    """Train a drafter for ``target`` (BF16 linears) on its own sequences ``data``."""
    if not data:
        raise W12Error("draft train: no sequence with a response to train on")
    device = target.device
    torch.manual_seed(options.seed)
    config = BlockDrafterConfig.for_target(target.args, n_layers=options.layers,
                                           block_size=options.block_size, taps=options.taps)
    net = BlockDrafterModel(config)
    init_from_target(net, target, options.seed)
    net.to(device).train()
    cuda = device.type == "cuda"
    head = (target.lm_head.weight if target.lm_head.weight is not None else target.embed)
    head = head.detach().to(torch.bfloat16 if cuda else torch.float32).clone()
    optimizer = torch.optim.AdamW(net.parameters(), lr=options.lr, betas=(0.9, 0.95),
                                  weight_decay=options.weight_decay)
    factor = _Schedule(options)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
    gen = torch.Generator().manual_seed(options.seed)
    order: list[int] = []
    began = time.perf_counter()
    probe_from, probe_to = _probe(options)
    step = 0
    while step < factor.total:
        if options.minutes is not None:
            now = time.perf_counter()
            if step == probe_from:
                probe_began = now
            if step == probe_to:
                per_step = (now - probe_began) / (probe_to - probe_from)
                factor.total = log.fitted_steps = _fit(options, step, now - began, per_step)
                if step >= factor.total:
                    break
            if now - began > 60 * options.minutes:  # slower than the probe said
                log.stopped_by_time = True
                break
        if len(order) < options.batch:
            order += torch.randperm(len(data), generator=gen).tolist()
        indices, order = order[:options.batch], order[options.batch:]
        tokens, lengths, anchors = sample_batch(data, indices, options.anchors, gen, device)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            loss, stats = block_loss(net, target, head, tokens, lengths, anchors, options.gamma)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        log.loss.append(stats["loss"])
        log.accuracy.append(stats["accuracy"])
        log.first_accuracy.append(stats["first_accuracy"])
        log.steps_run = step = step + 1
        if progress is not None:
            progress(stats)
    log.train_seconds = time.perf_counter() - began
    return net.eval()


class _Schedule:
    """The learning-rate factor: linear warm-up, then cosine decay to 0.1 at step ``total``
    (``--steps``, or the count ``--minutes`` fits before the warm-up ends)."""

    def __init__(self, options: TrainOptions) -> None:
        self.warmup, self.total = options.warmup, options.steps

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        done = (step - self.warmup) / max(1, self.total - self.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(done, 1.0)))


def _probe(options: TrainOptions) -> tuple[int, int]:
    """The steps timed to fit ``--minutes``: the second half of the first 100 (past the first
    steps' one-off costs), ending inside the warm-up, whose factors do not depend on the step
    count: a run with ``--steps`` set to the fitted count then repeats this one exactly."""
    end = max(1, min(100, options.warmup, options.steps))
    return end // 2, end


def _fit(options: TrainOptions, step: int, elapsed: float, per_step: float) -> int:
    """The step count that ends the optimisation within 95% of ``--minutes`` at the probe's
    pace (at most ``--steps``); the rest is room for jitter before the hard stop."""
    left = 0.95 * 60 * options.minutes - elapsed
    return max(step, min(options.steps, step + int(left / max(per_step, 1e-9))))


# ----------------------------------------------------------------------------- output

SHARD_BYTES = 10**7  # W12 shards small enough to keep in a repository


def save_drafter(net: BlockDrafterModel, out: Path, *, extra: dict | None = None,
                 shard_bytes: int = SHARD_BYTES) -> Path:
    """``out/bf16`` (config.json + model.safetensors) and its W12 copy ``out/w12`` (in shards
    of at most ``shard_bytes``); returns the W12 folder."""
    from safetensors.torch import save_file

    from converters.hf import ConvertOptions, convert_folder

    bf16 = out / "bf16"
    bf16.mkdir(parents=True, exist_ok=False)
    config = net.config.to_hf() | ({"training": extra} if extra else {})
    (bf16 / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    save_file(state_for_folder(net), str(bf16 / "model.safetensors"), metadata={"format": "pt"})
    convert_folder(src=bf16, dst=out / "w12", options=ConvertOptions(max_shard_bytes=shard_bytes),
                   progress=False)
    return out / "w12"


def plot_losses(log: TrainLog, path: Path) -> None:
    """The loss curve (and top-1 agreement) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = range(1, len(log.loss) + 1)
    window = max(1, len(log.loss) // 50)
    smooth = [sum(log.loss[max(0, i - window + 1):i + 1]) / len(log.loss[max(0, i - window + 1):
                                                                        i + 1])
              for i in range(len(log.loss))]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    ax.plot(steps, log.loss, color="tab:blue", alpha=0.3, linewidth=0.8, label="loss")
    ax.plot(steps, smooth, color="tab:blue", label=f"loss, mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("decayed KL to the target")
    ax.set_yscale("log")
    other = ax.twinx()
    other.plot(steps, log.first_accuracy, color="tab:orange", alpha=0.5, linewidth=0.8,
               label="top-1 agreement, position 1")
    other.set_ylabel("top-1 agreement")
    other.set_ylim(0, 1)
    ax.set_title(f"block drafter for {log.target}")
    handles = ax.get_legend_handles_labels()
    more = other.get_legend_handles_labels()
    ax.legend(handles[0] + more[0], handles[1] + more[1], loc="upper right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_log(log: TrainLog, path: Path) -> None:
    path.write_text(json.dumps(asdict(log), indent=1) + "\n", encoding="utf-8")


# ----------------------------------------------------------------------------- the command

STDLIB = "stdlib"


def prompt_texts(source: str, count: int, seed: int) -> list[str]:
    """``stdlib`` (the standard library's documented functions) or a JSONL prompt file; never
    HumanEval, the evaluation set."""
    from engine.speculative.api import HUMANEVAL, read_prompts
    from engine.speculative.stdlib_prompts import stdlib_prompts

    if source == HUMANEVAL:
        raise W12Error("draft train: HumanEval is the evaluation set; train on 'stdlib' or a "
                       "JSONL prompt file")
    texts = stdlib_prompts(count, seed=seed) if source == STDLIB else read_prompts(source, count)
    if not texts:
        raise W12Error(f"draft train: the prompt set {source!r} is empty")
    return texts


def train(target_spec: str, out: Path, options: TrainOptions, *, prompts: str = STDLIB,
          count: int = 3072, device: str = "cpu", progress: bool = True,
          echo: Callable[[str], None] = print) -> TrainLog:
    """``w12 draft train``: prompts, the target's responses, training, the drafter folders in
    ``out`` (``bf16/``, ``w12/``), ``loss.png`` and ``train_log.json``."""
    from tqdm import tqdm

    from engine.tokenizer import Tokenizer
    from engine.weights import SYNTHETIC_PREFIX, load_model, read_config

    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise W12Error(f"{out}: exists and is not empty")
    if str(target_spec).startswith(SYNTHETIC_PREFIX):
        raise W12Error(f"{target_spec}: a synthetic model has no tokenizer and says nothing "
                       "worth learning; train on a model folder")
    folder = Path(target_spec)
    if not folder.is_dir():
        raise W12Error(f"{folder}: not a model folder")
    ModelArgs.from_hf_config(read_config(folder), source=f"{folder}/config.json")  # tappable?
    try:
        import matplotlib  # noqa: F401  (checked before any work: the run ends with a plot)
    except ImportError as exc:
        raise W12Error("draft train writes its loss curve with matplotlib "
                       "(pip install 'w12[plot]')") from exc
    texts = prompt_texts(prompts, count, options.seed)
    loaded = load_model(target_spec, mode="bf16", device=device)
    tokenizer = Tokenizer(loaded.folder)
    chat = tokenizer.chat_template is not None
    ids = [p for p in (tokenizer.encode_prompt(t, chat=chat) for t in texts)
           if len(p) <= options.max_prompt_tokens]
    if not ids:
        raise W12Error(f"draft train: every prompt is longer than {options.max_prompt_tokens} "
                       "tokens")
    log = TrainLog(options=asdict(options) | {"prompts": prompts, "count": count},
                   target=loaded.name)
    echo(f"{len(ids)} prompts; the target answers them ({options.max_new_tokens} tokens at most)")
    began = time.perf_counter()
    with tqdm(total=len(ids), desc="generate", unit="prompt", disable=not progress) as bar:
        data = generate_responses(loaded.model, ids, options=options,
                                  stop_ids=tokenizer.stop_ids, progress=bar.update)
    log.generate_seconds = time.perf_counter() - began
    log.sequences, log.data_tokens = len(data), sum(len(s.tokens) - s.prompt_len for s in data)
    with tqdm(total=options.steps, desc="train", unit="step", disable=not progress) as bar:
        def step(stats: dict) -> None:
            if log.fitted_steps is not None:
                bar.total = log.fitted_steps
            bar.set_postfix(loss=f"{stats['loss']:.3f}", top1=f"{stats['first_accuracy']:.2f}",
                            refresh=False)
            bar.update()

        net = train_drafter(loaded.model, data, options, log=log, progress=step)
    out.mkdir(parents=True, exist_ok=True)
    folder = save_drafter(net, out, extra={"target": loaded.name, **log.options})
    plot_losses(log, out / "loss.png")
    write_log(log, out / "train_log.json")
    if log.fitted_steps is not None:
        echo(f"--minutes {options.minutes:g} fitted {log.fitted_steps} steps; --steps "
             f"{log.fitted_steps} without --minutes repeats this run")
    if log.stopped_by_time:
        echo(f"warning: the steps slowed down: stopped by --minutes after {log.steps_run} "
             f"steps (a rerun may stop elsewhere)")
    echo(f"drafter: {folder} (BF16 copy in {out / 'bf16'}); loss curve {out / 'loss.png'}")
    return log
