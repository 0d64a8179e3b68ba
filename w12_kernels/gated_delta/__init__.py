"""Gated DeltaNet (the gated delta rule) for hybrid targets, and its draft-tree forms.

``reference.py`` holds the readable references every kernel here is tested against: the
recurrence, path verify (each node's path replayed from the committed state), per-node state
snapshots (the baseline), the WY form of a whole tree (one triangular solve under the ancestor
mask), commit of an accepted path, the exact three-piece BF16 split of a float32 state, and
the layer's short causal convolution over a tree. ``gdn_path`` (``launcher.py``, ``kernel.py``)
is the Triton kernel that steps states along paths: a decode step, path verify of every node
of a tree, and commit of the accepted path are the same code, so their bits agree.

Usage::

    from w12_kernels.gated_delta import gdn_path

    o = gdn_path(state, q, k, v, decay, beta, nodes)              # [B, N, H, DV], verify
    gdn_path(state, q, k, v, decay, beta, path, out=False, store=True)   # commit, in place
"""

from w12_kernels.gated_delta.launcher import gdn_path

__all__ = ["gdn_path"]
