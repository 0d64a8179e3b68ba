"""Gated DeltaNet (the gated delta rule) for hybrid targets, and its draft-tree forms.

``reference.py`` holds the readable references every kernel here is tested against: the
recurrence, path verify (each node's path replayed from the committed state), per-node state
snapshots (the baseline), the WY form of a whole tree (one triangular solve under the ancestor
mask), commit of an accepted path, the exact three-piece BF16 split of a float32 state, and
the layer's short causal convolution over a tree.
"""
