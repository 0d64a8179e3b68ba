"""Tree attention: verify every node of a draft tree in one pass, bit-identical to decoding.

Usage::

    from w12_kernels.tree_attention import compact_kv, tree_attention

    out = tree_attention(q, k_cache, v_cache, prefix_len, path_slots)   # [B, T, Hq * D]
    compact_kv(k_all, v_all, src_slots, dst_start, count)               # after acceptance

``q`` [B, T, Hq, D] bf16 (RoPE applied) holds T tree nodes per request; ``k_cache``/``v_cache``
[B, Hkv, S, D] bf16 one layer's cache (any strides with a contiguous head dim);
``prefix_len`` [B] the committed length L (slot == position below it); ``path_slots``
[B, T, P] int32 the slots of positions L, L+1, ..., L+depth of each node (root first, the node
last, then -1; a row of -1 is a padding node, written as 0). Node t of request b attends over
positions 0..L+depth with KV head ``head // G``, scores and softmax in float32; ``scale``
defaults to D**-0.5. A decode step is T=1 with ``path_slots[b, 0] = [L]``. Any T and P >= 1;
G = Hq / Hkv up to 64; D a power of two in 16..128; every entry after a path's end is -1.

The promise is batch invariance: a node's output has the same bits as a decode step at its
position over the same keys, whatever T, B, S, the tree's shape or the slots its ancestors
use. On a GPU (``kernel.py``) every key block is fixed by absolute position, the split of the
key range by block index, and the launch constants by the model's (G, D) (``launcher``);
without a GPU, ``cpu.py`` runs per-row loops whose order is fixed by position.
``reference.py`` is the float64 reference. ``compact_kv`` moves each request's accepted path
into place in every layer at once ([layers, B, Hkv, S, D] caches, sources increasing and
``src_slots[b, i] >= dst_start[b] + i``, ranges may overlap). Both are CUDA-graph capturable.
"""

from w12_kernels.tree_attention.launcher import (
    TreeAttentionConfig,
    compact_kv,
    default_config,
    tree_attention,
)

__all__ = ["TreeAttentionConfig", "compact_kv", "default_config", "tree_attention"]
