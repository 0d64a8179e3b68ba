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

import torch

from engine.attention import AttentionPlan, resolve_attention
from engine.head import CertifiedHead
from engine.model import Transformer
from engine.ops import OpSet
from engine.sampling import Sampling, choose
from engine.w12_backend import SMALL_M_MAX, invariant_rows
from w12.errors import W12Error

HEADS = ("exact", "int8")


class Engine:
    """A model bound to its own KV cache of ``batch`` rows x ``max_seq_len`` positions.

    The cache is an ``engine.cache.KVCache`` the engine owns (``self.cache``), so engines of
    different models (a target and a drafter) live side by side, and several engines of one
    model with the same options. ``compile`` and ``attention`` set the model's op set and
    attention kind (options of the model instance, not of the process). ``head="int8"`` picks
    tokens with the certified INT8 LM head (``engine.head``: the exact head's tokens, greedy
    or keyed sampling; top-p falls back to the exact head).
    """

    def __init__(
        self, model: Transformer, *, batch: int, max_seq_len: int,
        cuda_graph: bool | None = None, compile: bool = False, attention: str = "auto",
        head: str = "exact",
    ) -> None:
        if head not in HEADS:
            raise W12Error(f"head {head!r}: expected one of {', '.join(HEADS)}")
        self.model, self.batch, self.max_seq_len = model, batch, max_seq_len
        # "int8": the certified INT8 head (engine.head) picks the tokens; the model's forward
        # then stops at the head's input, which prefill and step return instead of logits
        self.head = CertifiedHead(model.lm_head) if head == "int8" else None
        device = model.device
        self.attention = resolve_attention(attention, device, model.dtype)
        model.ops = OpSet(compiled=compile)
        model.attention = self.attention
        self.cache = model.new_cache(batch, max_seq_len)
        self.tokens = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.next_slot = 0  # the cache slot the next step writes for the longest row (host copy)
        self.graph, self.compiled = None, compile
        if cuda_graph if cuda_graph is not None else device.type == "cuda":
            self._capture()

    def _decode(self) -> torch.Tensor:
        """One step: the token of every row at its own position, then every length + 1."""
        lengths = self.cache.lengths
        logits = self.model(self.tokens, lengths[:, None], self.cache,
                            AttentionPlan.decode(lengths), head=self.head is None)
        self.cache.commit(1)
        return logits

    @torch.inference_mode()
    def _capture(self) -> None:
        # Warm up on a side stream (compiles, cuBLAS handles), then record one step; the
        # lengths are put back, so the warm-up leaves nothing behind (every prefill overwrites
        # the slots it wrote).
        saved = self.cache.lengths.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._warm_up()
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):  # the warm-up's stream (w12_kernels)
            self.logits = self._decode()
        self.cache.lengths.copy_(saved)

    def _warm_up(self) -> None:
        try:
            for _ in range(3):
                self.cache.lengths.zero_()
                self._decode()
        except Exception as exc:  # torch.compile can fail on a toolchain mismatch: go eager
            if not self.compiled:
                raise
            warnings.warn(f"torch.compile failed, running eager ops: {' '.join(str(exc).split())}",
                          stacklevel=2)
            self.model.ops = OpSet(compiled=False)
            self.compiled = False
            self._warm_up()

    @torch.inference_mode()
    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Run the prompts (one per row, any lengths) and return each row's last logits [B, V]
        (with the INT8 head, the head's input [B, dim]: ``choose`` takes either)."""
        lengths = self.check_prompts(prompts, new_tokens=1)
        device, longest = self.model.device, max(lengths)
        tokens = torch.zeros(self.batch, longest, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            tokens[row, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        pos = torch.arange(longest).expand(self.batch, longest).to(device)
        last = torch.tensor(lengths) - 1
        with invariant_rows(SMALL_M_MAX):  # no prompt row has to match another call's bits
            logits = self.model(tokens.to(device), pos, self.cache, AttentionPlan.prefill(pos),
                                last=last.to(device), head=self.head is None)
        self.cache.rollback(lengths)
        self.next_slot = longest
        return logits[:, 0]

    @torch.inference_mode()
    def prefill_row(self, row: int, prompt: list[int]) -> torch.Tensor:
        """Prefill one prompt alone into ``row`` (the other rows keep their state) and return
        its last logits [V]: the bits a batch-1 ``prefill`` of the prompt gives. The row's
        length becomes the prompt's; ``next_slot`` is the caller's to keep."""
        if not 0 <= row < self.batch:
            raise W12Error(f"row {row}: the engine has {self.batch} rows")
        if not prompt:
            raise W12Error("empty prompt")
        if len(prompt) >= self.max_seq_len:
            raise W12Error(f"a prompt of {len(prompt)} tokens leaves no room in a cache of "
                           f"{self.max_seq_len} positions")
        device = self.model.device
        tokens = torch.tensor([prompt], dtype=torch.long, device=device)
        pos = torch.arange(len(prompt), device=device)[None, :]
        with invariant_rows(SMALL_M_MAX):  # as ``prefill``: the bits of a batch-1 prefill
            logits = self.model(tokens, pos, self.cache.row(row), AttentionPlan.prefill(pos),
                                last=torch.tensor([len(prompt) - 1], device=device),
                                head=self.head is None)
        self.cache.lengths[row] = len(prompt)
        return logits[0, 0]

    @torch.inference_mode()
    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row ([B], on the device); return the next logits [B, V] (with
        the INT8 head, the head's input [B, dim]).

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
            logits = self._decode()
        self.next_slot += 1
        return logits[:, 0]

    def choose(self, out: torch.Tensor, sampling: Sampling, requests: torch.Tensor,
               positions: torch.Tensor) -> torch.Tensor:
        """The token of every row of ``out`` (what ``prefill``/``step`` returned: logits
        [R, V], or with the INT8 head the head's input [R, dim]), as ``sampling.choose``."""
        if self.head is None:
            return choose(out, sampling, requests, positions)
        return self.head.choose(out, sampling, requests, positions)

    def rewind(self, position: int) -> None:
        """Every row's next step at cache slot ``position`` (the cache past it is then stale and
        is overwritten as the steps advance): for timing loops that re-run steps."""
        if not 0 <= position < self.max_seq_len:
            raise W12Error(f"rewind to slot {position}: the cache holds {self.max_seq_len} "
                           "positions")
        self.cache.rollback([position] * self.batch)
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
GREEDY = Sampling()


def generate(
    engine: Engine, prompts: list[list[int]], *, max_new_tokens: int,
    sampling: Sampling = GREEDY, stop_ids: frozenset[int] = frozenset(),
    stop_check: StopCheck | None = None, on_token: Callable[[int, int], None] | None = None,
    request_ids: list[int] | None = None,
) -> list[list[int]]:
    """New tokens per prompt, each list ending at its first stop token (kept) or stop_check.

    ``stop_check(row, tokens)`` lets the caller stop a row on text (stop strings);
    ``on_token(row, token)`` streams. Sampling draws with noise keyed by (seed, request,
    position) (``engine.sampling``), the request being ``request_ids[row]`` (default: the row),
    so a row's text does not depend on the other rows.
    """
    lengths = engine.check_prompts(prompts, new_tokens=max_new_tokens)
    device = engine.model.device
    if request_ids is not None and len(request_ids) != len(prompts):
        raise W12Error(f"{len(request_ids)} request ids for {len(prompts)} prompts")
    requests = torch.tensor(request_ids if request_ids is not None
                            else list(range(len(prompts))), device=device)
    positions = torch.tensor(lengths, device=device)
    outputs: list[list[int]] = [[] for _ in prompts]
    done = [False] * len(prompts)
    logits = engine.prefill(prompts)
    for step in range(max_new_tokens):
        next_tokens = engine.choose(logits, sampling, requests, positions + step)
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
