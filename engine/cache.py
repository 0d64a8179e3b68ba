"""The KV cache as an object of its own: allocation, per-request lengths, and the operations
that plain and speculative decoding need.

One tensor holds the keys of every layer ([layers, B, Hkv, S, D]) and one the values, so that
an operation over all layers (moving an accepted draft path into place) is one launch. Request
``b`` has committed ``lengths[b]`` tokens: slots ``0 .. lengths[b] - 1`` hold the keys of
positions ``0 .. lengths[b] - 1``. A step writes its new rows at any slots at or past that
length (a verify step writes one row per draft-tree node); ``keep`` then moves the accepted
rows into place and ``commit`` advances the length. Slots past a length are scratch: whatever
they hold is overwritten before it is read.

The lengths live on the device, so a captured CUDA graph can read and advance them; the
engine keeps a host copy where it needs one (to refuse work past the last slot).

A cache may also carry ``hidden`` (``HiddenTaps``): the residual stream after a few chosen
layers, per slot like the keys and values. Every forward over the cache writes it at its
plan's slots and ``keep`` moves it with the keys and values, so after a verify step slots
``0 .. lengths[b] - 1`` hold the hidden states of the committed positions: what a block
drafter conditions on (``engine.speculative.block_drafter``).
"""

from __future__ import annotations

import torch

from engine.w12_backend import compact_kv
from w12.errors import W12Error


class KVCache:
    def __init__(self, n_layers: int, batch: int, n_kv_heads: int, seq_len: int, head_dim: int,
                 *, dtype: torch.dtype, device: torch.device) -> None:
        shape = (n_layers, batch, n_kv_heads, seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.hidden: HiddenTaps | None = None
        self.recurrent = None  # a hybrid's GDN layers' state (engine.gated_delta)

    @classmethod
    def for_model(cls, args, batch: int, seq_len: int, *, dtype: torch.dtype,
                  device: torch.device) -> KVCache:
        """A cache shaped for ``args`` (an ``engine.model.ModelArgs``): its attention layers."""
        return cls(len(args.attention_layers), batch, args.n_kv_heads, seq_len, args.head_dim,
                   dtype=dtype, device=device)

    @property
    def n_layers(self) -> int:
        return self.k.shape[0]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    @property
    def seq_len(self) -> int:
        return self.k.shape[3]

    @property
    def device(self) -> torch.device:
        return self.k.device

    @property
    def nbytes(self) -> int:
        extra = 0 if self.recurrent is None else self.recurrent.nbytes
        return 2 * self.k.numel() * self.k.element_size() + extra

    def row(self, index: int) -> KVCache:
        """A batch-1 cache over row ``index``: its keys, values, length and hidden taps are
        views of this cache's, so a forward over it (one request's prefill) writes here."""
        view = KVCache.__new__(KVCache)
        view.k, view.v = self.k[:, index:index + 1], self.v[:, index:index + 1]
        view.lengths = self.lengths[index:index + 1]
        view.hidden = None if self.hidden is None else self.hidden.row(index)
        view.recurrent = None if self.recurrent is None else self.recurrent.row(index)
        return view

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one layer, [B, Hkv, S, D] views."""
        return self.k[index], self.v[index]

    def write(self, index: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Rows ``k``, ``v`` [B, T, Hkv, D] of layer ``index`` into slots ``slots`` [B, T].

        No host synchronisation, so it can run inside a captured CUDA graph; the slots of one
        request must be distinct (the caller's plan guarantees it)."""
        k_cache, v_cache = self.layer(index)
        if k.is_cuda:
            from engine.attention_triton import kv_write_fits
            from engine.attention_triton import write_kv as triton_write_kv

            if kv_write_fits(k_cache, k) and kv_write_fits(v_cache, v):
                triton_write_kv(k_cache, v_cache, slots, k, v)
                return
        rows = torch.arange(k.shape[0], device=k.device)[:, None]
        k_cache.transpose(1, 2)[rows, slots] = k  # [B, S, Hkv, D] view, rows (b, slots[b, t])
        v_cache.transpose(1, 2)[rows, slots] = v

    def keep(self, src_slots: torch.Tensor, count: torch.Tensor) -> None:
        """For each request ``b``, move the rows at ``src_slots[b, :count[b]]`` (increasing,
        each at or past its destination) to slots ``lengths[b], lengths[b] + 1, ...`` in
        every layer: the accepted path of a verified draft tree into place. ``lengths`` does
        not change (``commit`` advances it). Overlapping moves are safe: every source is read
        before its destination is written. One launch on a GPU."""
        compact_kv(self.k, self.v, src_slots, self.lengths, count)
        if self.hidden is not None:
            self.hidden.keep(src_slots, self.lengths, count)
        if self.recurrent is not None:  # the accepted path replayed into the GDN state
            self.recurrent.keep(src_slots - self.lengths[:, None], count)

    def tap(self, layers: tuple[int, ...], dim: int) -> HiddenTaps:
        """Keep the residual stream after ``layers`` (width ``dim``) per slot from now on; the
        same buffer again when the layers are the ones already tapped."""
        if self.hidden is None or self.hidden.layers != tuple(layers):
            self.hidden = HiddenTaps(tuple(layers), self.batch, self.seq_len, dim,
                                     dtype=self.k.dtype, device=self.device)
        return self.hidden

    def commit(self, counts: torch.Tensor) -> None:
        """Advance every request's length by ``counts`` [B] (device tensor or int)."""
        self.lengths += counts

    def rollback(self, lengths: torch.Tensor | list[int]) -> None:
        """Set every request's committed length (a shorter one drops the tokens past it)."""
        lengths = torch.as_tensor(lengths, dtype=torch.long)
        if lengths.shape != self.lengths.shape:
            raise W12Error(f"rollback: {tuple(lengths.shape)} lengths for a cache of batch "
                           f"{self.batch}")
        if lengths.min() < 0 or lengths.max() > self.seq_len:
            raise W12Error(f"rollback to lengths {lengths.tolist()}: the cache holds "
                           f"{self.seq_len} positions")
        self.lengths.copy_(lengths)


class HiddenTaps:
    """The residual stream after chosen layers, [B, S, layers, dim], addressed by cache slot.

    Writes and moves are indexing with device tensors of fixed shapes (no host reads), so they
    run inside captured CUDA graphs."""

    def __init__(self, layers: tuple[int, ...], batch: int, seq_len: int, dim: int, *,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.layers = layers
        self.index = {layer: i for i, layer in enumerate(layers)}
        self.states = torch.zeros(batch, seq_len, len(layers), dim, dtype=dtype, device=device)

    def row(self, index: int) -> HiddenTaps:
        """These taps for row ``index`` alone, a view (see ``KVCache.row``)."""
        view = HiddenTaps.__new__(HiddenTaps)
        view.layers, view.index = self.layers, self.index
        view.states = self.states[index:index + 1]
        return view

    def write(self, layer: int, slots: torch.Tensor, x: torch.Tensor) -> None:
        """Rows ``x`` [B, T, dim], the output of ``layer``, at slots ``slots`` [B, T]."""
        rows = torch.arange(x.shape[0], device=x.device)[:, None]
        self.states[rows, slots, self.index[layer]] = x.to(self.states.dtype)

    def read(self, slots: torch.Tensor) -> torch.Tensor:
        """[B, T, layers * dim]: every tapped layer's state at ``slots`` [B, T], concatenated
        in the order of ``layers``."""
        rows = torch.arange(slots.shape[0], device=slots.device)[:, None]
        return self.states[rows, slots.clamp(0, self.states.shape[1] - 1)].flatten(2)

    def keep(self, src_slots: torch.Tensor, start: torch.Tensor, count: torch.Tensor) -> None:
        """``KVCache.keep`` for these states: ``src_slots[b, :count[b]]`` to ``start[b] + 0, 1,
        ...``; every source is read before any destination is written."""
        b, n = src_slots.shape
        last = self.states.shape[1] - 1
        steps = torch.arange(n, device=src_slots.device)
        dst = start[:, None] + steps
        src = torch.where(steps < count[:, None], src_slots, dst).clamp(0, last)
        rows = torch.arange(b, device=src_slots.device)[:, None]
        self.states[rows, dst.clamp(max=last)] = self.states[rows, src]
