"""Gated DeltaNet (the gated delta rule) for hybrid targets, and its draft-tree forms.

``reference.py`` holds the readable references every kernel here is tested against: the
recurrence, path verify (each node's path replayed from the committed state), per-node state
snapshots (the baseline), the WY form of a whole tree (one triangular solve under the ancestor
mask), commit of an accepted path, the exact three-piece BF16 split of a float32 state, and
the layer's short causal convolution over a tree. ``gdn_path`` (``launcher.py``, ``kernel.py``)
replays every node's path from the committed state (no scratch, N x depth steps); ``gdn_walk``
walks each tree once in depth-first order (N steps, a scratch state per branch level that is
still needed); ``gdn_wy`` solves every path at once in the WY form on tensor cores, the
state cut in three BF16 pieces (float32 accuracy, not decode's bits). For the first two, a
decode step, the verify of every node of a tree and the commit of the accepted path are the
same code, so their bits agree.

Usage::

    from w12_kernels.gated_delta import gdn_path

    o = gdn_path(state, q, k, v, decay, beta, nodes)              # [B, N, H, DV], verify
    gdn_path(state, q, k, v, decay, beta, path, out=False, store=True)   # commit, in place
    o = gdn_walk(state, q, k, v, decay, beta, nodes)              # the same outputs, one walk
    o = gdn_chain(state, q, k, v, decay, beta)                    # a prefill chunk, in place
    o = gdn_wy(state, q, k, v, decay, beta, nodes)                # verify in the WY form
"""

from w12_kernels.gated_delta.launcher import (
    ancestor_mask,
    gdn_chain,
    gdn_path,
    gdn_walk,
    gdn_wy,
    walk_plan,
)

__all__ = ["ancestor_mask", "gdn_chain", "gdn_path", "gdn_walk", "gdn_wy", "walk_plan"]
