"""The decode loop: prefill, one-token steps over a static cache, sampling, stopping.

``Engine`` owns a model with a cache for a fixed batch and positions; on a GPU it captures the
decode step once in a ``torch.cuda.CUDAGraph`` (static token and position buffers, the logits
buffer as output) and replays it, so a step costs one launch. Every row keeps its own position,
so prompts of different lengths share a batch: prefill runs them right-padded, and step t of
row b writes and reads cache slot ``len_b + t``. Prefill runs W12 layers with batch invariance
only up to 64 rows (``invariant_rows``): 65..128 prompt rows then take the faster large-M
kernels. ``step`` takes and returns device tensors and
never waits for the device, so a timed loop runs as fast as the GPU does; ``generate`` reads
the sampled tokens back each step to stop on EOS and to stream.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine import ops
from engine.model import Transformer
from w12.errors import W12Error
from w12_kernels.gemm import SMALL_M_MAX, invariant_rows


@dataclass(frozen=True)
class Sampling:
    """``temperature == 0`` is greedy; otherwise softmax(logits / T) cut to the top-p mass."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0


def sample(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None):
    """Next token per row of ``logits`` [B, V] (fp32), as a [B] int64 tensor on its device."""
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits / sampling.temperature, dim=-1)
    if sampling.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > sampling.top_p
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs.masked_fill(outside, 0))
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# how a decode step attends over the cache (ops.py); "auto" is the Triton kernel on a CUDA device
# where Triton imports (faster than the torch ops at every size timed on the H200,
# docs/PERF_ENGINE.md), the torch ops otherwise
ATTENTION_KINDS = ("auto", "torch", "triton")


def resolve_attention(attention: str, device: torch.device) -> str:
    """``attention`` with ``"auto"`` made concrete for ``device``; a clear error if unknown."""
    if attention not in ATTENTION_KINDS:
        raise W12Error(f"attention must be one of {', '.join(ATTENTION_KINDS)}, "
                       f"got {attention!r}")
    if attention == "auto":
        if device.type != "cuda":
            return "torch"
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch"
        return "triton"
    if attention == "triton" and device.type != "cuda":
        raise W12Error(f"attention 'triton' needs a CUDA device; the model is on {device}")
    return attention


class Engine:
    """A model bound to a static cache of ``batch`` rows x ``max_seq_len`` positions.

    The cache lives in the model, so one engine per model is live at a time: a new engine
    re-allocates the cache that an older one (and its graph) pointed to.
    """

    def __init__(
        self, model: Transformer, *, batch: int, max_seq_len: int,
        cuda_graph: bool | None = None, compile: bool = False, attention: str = "auto",
    ) -> None:
        self.model, self.batch, self.max_seq_len = model, batch, max_seq_len
        device = model.device
        attention = resolve_attention(attention, device)
        ops.use_compiled(compile)
        ops.use_triton_attention(attention == "triton")
        self.attention = attention
        model.setup_caches(batch, max_seq_len)
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.next_slot = 0  # the cache slot the next step writes for the longest row (host copy)
        self.graph, self.compiled = None, compile
        if cuda_graph if cuda_graph is not None else device.type == "cuda":
            self._capture()

    @torch.inference_mode()
    def _capture(self) -> None:
        # Warm up on a side stream (compiles, cuBLAS handles), then record one step. Both write
        # cache slot 0, which every prefill overwrites.
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._warm_up()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.model(self.tokens, self.pos)

    def _warm_up(self) -> None:
        try:
            for _ in range(3):
                self.model(self.tokens, self.pos)
        except Exception as exc:  # torch.compile can fail on a toolchain mismatch: go eager
            if not self.compiled:
                raise
            warnings.warn(f"torch.compile failed, running eager ops: {' '.join(str(exc).split())}",
                          stacklevel=2)
            ops.use_compiled(False)
            self.compiled = False
            self._warm_up()

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Run the prompts (one per row, any lengths) and return each row's last logits [B, V]."""
        lengths = self.check_prompts(prompts, new_tokens=1)
        device, longest = self.model.device, max(lengths)
        tokens = torch.zeros(self.batch, longest, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            tokens[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        pos = torch.arange(longest).expand(self.batch, longest)
        last = torch.tensor(lengths) - 1
        with invariant_rows(SMALL_M_MAX):  # no prompt row has to match another call's bits
            logits = self.model(
                tokens.to(device), pos.to(device), prefill=True, last=last.to(device)
            )
        self.pos.copy_(torch.tensor(lengths)[:, None])
        self.next_slot = longest
        return logits[:, 0]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row ([B], on the device); return the next logits [B, V].

        Under a CUDA graph the result is a view of the graph's output buffer: read it (or
        clone it) before the next step. A step past the cache's last slot is refused (a
        ``W12Error``) before anything is written.
        """
        if self.next_slot >= self.max_seq_len:
            raise W12Error(f"decode step {self.next_slot + 1} would write cache slot "
                           f"{self.next_slot}; the cache holds {self.max_seq_len} positions")
        self.tokens.copy_(tokens.view(-1, 1))
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self.model(self.tokens, self.pos)
        self.pos += 1
        self.next_slot += 1
        return logits[:, 0]

    def rewind(self, position: int) -> None:
        """Every row's next step at cache slot ``position`` (the cache past it is then stale and
        is overwritten as the steps advance): for timing loops that re-run steps."""
        if not 0 <= position < self.max_seq_len:
            raise W12Error(f"rewind to slot {position}: the cache holds {self.max_seq_len} "
                           "positions")
        self.pos.fill_(position)
        self.next_slot = position

    def check_prompts(self, prompts: list[list[int]], *, new_tokens: int) -> list[int]:
        if len(prompts) != self.batch:
            raise W12Error(f"got {len(prompts)} prompts for an engine of batch {self.batch}")
        lengths = [len(p) for p in prompts]
        if min(lengths) == 0:
            raise W12Error(f"prompt {lengths.index(0)} is empty")
        vocab = self.model.args.vocab_size
        for row, prompt in enumerate(prompts):
            bad = [t for t in prompt if not 0 <= t < vocab]
            if bad:
                raise W12Error(f"prompt {row}: token id {bad[0]} outside the vocabulary "
                               f"[0, {vocab})")
        need = max(lengths) + new_tokens
        if need > self.max_seq_len:
            raise W12Error(
                f"a prompt of {max(lengths)} tokens plus {new_tokens} new tokens needs {need} "
                f"cache positions; the cache holds {self.max_seq_len}"
            )
        return lengths


StopCheck = Callable[[int, list[int]], bool]


def generate(
    engine: Engine, prompts: list[list[int]], *, max_new_tokens: int,
    sampling: Sampling = Sampling(), stop_ids: frozenset[int] = frozenset(),
    stop_check: StopCheck | None = None, on_token: Callable[[int, int], None] | None = None,
) -> list[list[int]]:
    """New tokens per prompt, each list ending at its first stop token (kept) or stop_check.

    ``stop_check(row, tokens)`` lets the caller stop a row on text (stop strings);
    ``on_token(row, token)`` streams.
    """
    engine.check_prompts(prompts, new_tokens=max_new_tokens)
    generator = None
    if sampling.temperature > 0:
        generator = torch.Generator(device=engine.model.device).manual_seed(sampling.seed)
    outputs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    logits = engine.prefill(prompts)
    for step in range(max_new_tokens):
        next_tokens = sample(logits, sampling, generator)
        for row, token in enumerate(next_tokens.tolist()):
            if done[row]:
                continue
            outputs[row].append(token)
            if on_token is not None:
                on_token(row, token)
            done[row] = token in stop_ids or bool(stop_check and stop_check(row, outputs[row]))
        if all(done) or step == max_new_tokens - 1:
            break
        logits = engine.step(next_tokens)
    return outputs
