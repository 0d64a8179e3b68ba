"""Where a step's rows go in the KV cache, what each of them sees, and the kernel that attends.

An ``AttentionPlan`` addresses the cache for one forward pass of T rows per request:

- ``slots`` [B, T]: the cache slot each new key/value row is written to;
- ``prefix_len`` [B]: the committed length L_b, whose slots 0..L_b-1 every row sees
  (``None`` for a prefill chunk, which attends causally over itself);
- ``path_slots`` [B, T, P]: for each row, the slots of its path at positions L_b, L_b+1, ...
  (a draft tree's root first, the row itself last), then -1.

A plain decode step is the one-row case (path = its own slot), a chain of drafted tokens the
case of paths L_b..L_b+t, a draft tree the general one. ``attend`` runs the plan: causal SDPA
for prefill; otherwise the tree-attention kernel family (``w12_kernels.tree_attention``), which
gives a row the same bits whether it is a decode step's only row or one node of a tree (or,
``attention="torch"``, masked matmuls over the cache).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine import ops
from engine.w12_backend import tree_attention
from w12.errors import W12Error

ATTENTION_KINDS = ("auto", "tree", "torch")


@dataclass
class AttentionPlan:
    slots: torch.Tensor
    prefix_len: torch.Tensor | None = None
    path_slots: torch.Tensor | None = None
    levels: int | None = None  # a host bound on the nodes of any path (``DraftTree.levels``)

    @property
    def causal(self) -> bool:
        return self.prefix_len is None

    @classmethod
    def prefill(cls, pos: torch.Tensor) -> AttentionPlan:
        """A chunk at positions ``pos`` [B, T] = 0..T-1 of a fresh cache, written slot = pos."""
        return cls(slots=pos)

    @classmethod
    def decode(cls, lengths: torch.Tensor) -> AttentionPlan:
        """One new row per request at slot and position ``lengths[b]``."""
        slots = lengths[:, None]
        return cls(slots=slots, prefix_len=lengths, path_slots=slots[:, :, None])

    @classmethod
    def chain(cls, lengths: torch.Tensor, t: int) -> AttentionPlan:
        """``t`` consecutive tokens per request at positions (and slots) ``lengths + 0..t-1``,
        each seeing the committed prefix and the chain up to itself."""
        steps = torch.arange(t, device=lengths.device)
        paths = torch.where(steps[None, :] <= steps[:, None], steps[None, :], -1)
        return cls.tree(lengths, paths.expand(lengths.shape[0], t, t))

    @classmethod
    def tree(cls, lengths: torch.Tensor, paths: torch.Tensor,
             levels: int | None = None) -> AttentionPlan:
        """The nodes of a draft tree per request, node ``t`` written at slot ``lengths + t``;
        ``paths`` [B, T, P] holds each node's ancestors' node indices from the root (node 0)
        down to itself, then -1; ``levels``: a bound on any path's nodes, if known."""
        t = paths.shape[1]
        slots = lengths[:, None] + torch.arange(t, device=lengths.device)
        path_slots = torch.where(paths >= 0, paths + lengths[:, None, None], -1)
        return cls(slots=slots, prefix_len=lengths, path_slots=path_slots, levels=levels)


def resolve_attention(attention: str, device: torch.device,
                      dtype: torch.dtype = torch.bfloat16) -> str:
    """``attention`` with ``"auto"`` made concrete for ``device`` and the activation ``dtype``;
    a clear error if unknown.

    ``tree`` (the default for bfloat16 models): the tree-attention kernels, Triton on a CUDA
    device where Triton imports, per-row loops on the CPU; a row's bits never depend on the
    other rows. ``torch`` (the default otherwise): masked matmuls over the whole cache, a
    reference path without that promise."""
    if attention not in ATTENTION_KINDS:
        raise W12Error(f"attention must be one of {', '.join(ATTENTION_KINDS)}, "
                       f"got {attention!r}")
    if attention == "torch" or (attention == "auto" and dtype != torch.bfloat16):
        return "torch"
    if dtype != torch.bfloat16:
        raise W12Error(f"attention 'tree' runs bfloat16 activations, not {dtype}")
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError as exc:
            if attention == "tree":
                raise W12Error("attention 'tree' on a CUDA device needs Triton") from exc
            return "torch"
    return "tree"


def visible_slots(plan: AttentionPlan, seq_len: int) -> torch.Tensor:
    """[B, T, S] boolean: which cache slots each row of a (non-prefill) plan sees."""
    slots = torch.arange(seq_len, device=plan.slots.device)
    prefix = slots < plan.prefix_len[:, None, None]
    on_path = (plan.path_slots[..., None] == slots).any(dim=-2)
    return prefix | on_path


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
           v_cache: torch.Tensor, plan: AttentionPlan, kind: str,
           op_set: ops.OpSet) -> torch.Tensor:
    """Attention of the rows ``q`` [B, T, Hq, D] (their own keys/values ``k``, ``v`` already
    written into the cache [B, Hkv, S, D] at ``plan.slots``), as [B, T, Hq * D]."""
    if plan.causal:
        return ops.causal_attention(q, k, v)
    if kind == "tree":
        return tree_attention(q, k_cache, v_cache, plan.prefix_len, plan.path_slots)
    visible = visible_slots(plan, k_cache.shape[2])
    return ops.cached_attention(q, k_cache, v_cache, visible, op_set.masked_softmax)
