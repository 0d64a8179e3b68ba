"""The engine's one door to the kernel families of ``w12_kernels``.

``prepare`` turns a ``W12Tensor`` (already on the model's device) into whatever packed object
``w12_kernels.gemm`` runs on; ``w12_matmul`` computes ``x @ W.T + b`` with it;
``invariant_rows(SMALL_M_MAX)`` marks calls (prefill) whose rows need not match other calls'
bits. ``dense_linear`` is a BF16 linear whose rows' bits do not depend on the row count on the
CPU either (``w12_kernels.cpu_linear``). ``rms_norm`` / ``add_rms_norm``
(``w12_kernels.norm``) and ``tree_attention`` / ``compact_kv`` (``w12_kernels.tree_attention``)
are the row norms and the draft-tree attention, each giving a row the same bits whatever else
shares the call. ``view_bf16`` (``w12_kernels.view8``) is the 8-bit view of a W12 weight, the
two-level verifier's Q pass; ``prepare_view`` packs it for the view GEMM, which ``w12_matmul``
runs on such a weight.
``gdn_path`` / ``gdn_walk`` (``w12_kernels.gated_delta``) step a hybrid's GDN state along
draft-tree paths: decode, verify and commit with one kernel, so that their bits agree;
``gdn_wy`` / ``gdn_ancestor_mask`` verify a tree in the WY form instead (float32 accuracy, not
those bits).
``int8_head`` / ``int8_head_candidates`` / ``int8_head_picks`` (``w12_kernels.int8_head``:
the candidates' 16-row tiles of the W12 head recomputed with the whole product's bits) and
``tile_escapes`` make the certified INT8 LM head.
Keeping the kernel packages behind this module means the model code never changes when a
kernel layout does (an import-linter contract in ``pyproject.toml`` holds the rest of the
engine to it).
"""

from __future__ import annotations

import dataclasses

import torch

from w12.tensor import W12Tensor
from w12_kernels.cpu_linear import linear as dense_linear
from w12_kernels.gemm import (
    SMALL_M_MAX,
    decode_weight,
    invariant_rows,
    prepare_weight,
    rows_reproducible,
    w12_linear,
)
from w12_kernels.norm import add_rms_norm, rms_norm
from w12_kernels.view8 import PackedView8, prepare_view, view8_linear, view_bf16

__all__ = ["SMALL_M_MAX", "add_rms_norm", "cat_rows", "compact_kv", "decode_weight",
           "dense_linear", "gdn_ancestor_mask", "gdn_path", "gdn_walk", "gdn_wy", "int8_head",
           "int8_head_candidates", "int8_head_picks", "invariant_rows", "prepare",
           "prepare_view", "rms_norm", "rows_reproducible", "tensor_bytes", "tile_escapes",
           "tree_attention", "view_bf16", "w12_matmul"]


def prepare(w: W12Tensor):
    return prepare_weight(w)


def w12_matmul(x: torch.Tensor, packed, bias: torch.Tensor | None) -> torch.Tensor:
    if isinstance(packed, PackedView8):
        return view8_linear(x, packed, bias)
    return w12_linear(x, packed, bias)


def tree_attention(q, k_cache, v_cache, prefix_len, path_slots):
    from w12_kernels.tree_attention import tree_attention as attend

    return attend(q, k_cache, v_cache, prefix_len, path_slots)


def compact_kv(k_all, v_all, src_slots, dst_start, count) -> None:
    from w12_kernels.tree_attention import compact_kv as compact

    compact(k_all, v_all, src_slots, dst_start, count)


def gdn_path(state, q, k, v, decay, beta, nodes, *, out=True, store=False):
    from w12_kernels.gated_delta import gdn_path as step_paths

    return step_paths(state, q, k, v, decay, beta, nodes, out=out, store=store)


def gdn_walk(state, q, k, v, decay, beta, nodes, *, out=True, commit=False, plan=None):
    from w12_kernels.gated_delta import gdn_walk as walk

    return walk(state, q, k, v, decay, beta, nodes, out=out, commit=commit, plan=plan)


def gdn_chain(state, q, k, v, decay, beta):
    from w12_kernels.gated_delta import gdn_chain as chain

    return chain(state, q, k, v, decay, beta)


def gdn_wy(state, q, k, v, decay, beta, nodes, *, anc=None):
    from w12_kernels.gated_delta import gdn_wy as solve

    return solve(state, q, k, v, decay, beta, nodes, anc=anc)


def gdn_ancestor_mask(nodes):
    from w12_kernels.gated_delta import ancestor_mask

    return ancestor_mask(nodes)


def gdn_walk_plan(nodes):
    from w12_kernels.gated_delta import walk_plan

    return walk_plan(nodes)


def int8_head(weight: torch.Tensor):
    """The certified INT8 head of an LM head's exact weight [V, K] (``DeviceHead``, on the
    weight's device)."""
    from w12_kernels.int8_head import DeviceHead, quantize

    return DeviceHead.of(quantize(weight), weight.device)


def int8_head_candidates(head, h: torch.Tensor, *, temperature: float = 0.0,
                         noise: torch.Tensor | None = None) -> torch.Tensor:
    """[R, V] bool: the vocabulary entries the INT8 product cannot rule out for hidden states
    ``h`` [R, K] under the token rule (greedy, or ``logit / T + noise``)."""
    from w12_kernels.int8_head import approx_logits, bounds32, candidates, greedy_candidates

    if temperature == 0:  # the bounds in the product's epilogue
        return greedy_candidates(h, head)
    lo, hi = bounds32(head, h, approx_logits(h, head.q, head.scale))
    return candidates(lo, hi, temperature=temperature, noise=noise)


def int8_head_picks(h: torch.Tensor, cand: torch.Tensor, packed, tiles: int, escapes: int, *,
                    temperature: float = 0.0, noise: torch.Tensor | None = None):
    """(picks [R], tiles needed []) of the certified choice on the device, fixed shapes
    (``w12_kernels.int8_head.certified_picks``)."""
    from w12_kernels.int8_head import certified_picks

    return certified_picks(h, cand, packed, tiles, escapes, temperature=temperature,
                           noise=noise)


def tile_escapes(packed) -> int:
    """The most escapes a 16-row tile of a packed W12 weight holds."""
    from w12_kernels.gemm import tile_escapes as most

    return most(packed)


def cat_rows(parts: list[W12Tensor]) -> W12Tensor:
    """Stack W12 weights along N (output rows), e.g. q/k/v into one qkv weight.

    Every W12 field is per row, so stacking is a concatenation with the escape row pointers of
    each later part shifted by the escapes before it.
    """
    if len(parts) == 1:
        return parts[0]
    rowptrs, total = [parts[0].esc_rowptr], parts[0].num_escapes
    for part in parts[1:]:
        rowptrs.append(part.esc_rowptr[1:] + total)
        total += part.num_escapes
    fields = ("hi", "lo", "e0", "esc_col", "esc_val")
    stacked = {f: torch.cat([getattr(p, f) for p in parts]) for f in fields}
    return W12Tensor(esc_rowptr=torch.cat(rowptrs), **stacked)


def tensor_bytes(obj) -> int:
    """Bytes of every tensor reachable from ``obj`` (a tensor, dataclass, tuple, list or dict)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(tensor_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj))
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(v) for v in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if hasattr(obj, "__dict__"):
        return sum(tensor_bytes(v) for v in vars(obj).values())
    return 0
