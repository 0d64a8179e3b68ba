"""Gated DeltaNet layers for hybrid targets, and the recurrent state they keep per request.

The layer (Qwen3-Next's ``Qwen3NextGatedDeltaNet``, dense MLP around it as in Qwen3.5's dense
hybrids): ``in_proj_qkvz`` gives q, k (``Hk`` heads of ``dk``), v and the output gate z (``Hv``
heads of ``dv``), concatenated in that order; ``in_proj_ba`` gives beta's and the gate's
pre-activations (``Hv`` each). q, k and v go through a depthwise causal convolution of width
``W`` and SiLU; q and k are L2-normalised per head (q scaled by dk^-0.5) and shared by the
``Hv / Hk`` value heads of their group; ``beta = sigmoid(b)``, ``g = -exp(A_log) *
softplus(a + dt_bias)``. The recurrence (``w12_kernels.gated_delta.reference``) runs in float32
per value head over a state [dk, dv]; its output is RMS-normed per head, times ``silu(z)``,
then ``out_proj``. The tensor names are Qwen3-Next's (``linear_attn.in_proj_qkvz``, ...); its
checkpoints group q/k/v/z per key head, an order this module does not read yet (synthetic
presets only).

``RecurrentState`` holds, per GDN layer and request, the state (float32 [Hv, dk, dv]) and the
last ``W - 1`` convolution inputs. A prefill chunk starts from zeros; a one-token step (plain
decoding) advances the state in place; a forward over T > 1 tree nodes computes every node's
output from the committed state along its own path (path verify) and keeps the nodes' inputs,
which ``KVCache.keep`` then replays along the accepted path into the state (commit). Every node
is stepped with the decode step's own operations in the same order, so its output has the bits
a decode step at its position would give. On a GPU a decode step and a commit run the path
kernel of ``w12_kernels.gated_delta`` (one path a request, stepped in place); verify runs the
kernel ``Transformer.gdn`` names: ``walk`` (each tree walked once, a scratch state per branch
level; its plan is a few small launches, a fixed cost), ``path`` (each node's path replayed,
no scratch; its cost grows with nodes x depth), or ``auto`` (the path kernel while no path
has more than ``PATH_VERIFY_DEPTH`` nodes, by the tree's host bound ``levels`` or else its node
count; the walk beyond). All give the same bits. ``wy`` instead solves
every path at once in the WY form on tensor cores (``gdn_wy``): within float32 error of the
others but not their bits, so speculative decoding with it is outside the promise of plain
decoding's tokens bit for bit (a near tie of two logits can turn). On the CPU a torch form
loops over path depth with one state per node while it runs. A prefill chunk runs the
recurrence token by token: on a GPU in one kernel (the chunk walked as a chain,
``gdn_chain``), on the CPU in torch (a chunked, parallel form is still to come).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.w12_backend import (
    gdn_ancestor_mask,
    gdn_chain,
    gdn_path,
    gdn_walk,
    gdn_walk_plan,
    gdn_wy,
)
from w12.errors import W12Error

PATH_VERIFY_DEPTH = 16  # ``auto``: the path kernel for trees whose paths have at most this
# many nodes (its cost follows the paths' lengths, the walk's the node count)
GDN_KERNELS = ("auto", "walk", "path", "wy")


class GatedDeltaNet(nn.Module):
    def __init__(self, args, index: int) -> None:
        super().__init__()
        from engine.model import Linear

        self.args, self.index = args, index  # index: among the model's GDN layers
        hk, hv, dk, dv = args.gdn_shape
        self.channels = 2 * hk * dk + hv * dv  # what the convolution sees: q, k, v
        self.wqkvz = Linear(args.dim, self.channels + hv * dv)
        self.wba = Linear(args.dim, 2 * hv)
        self.wo = Linear(hv * dv, args.dim)
        self.conv: torch.Tensor | None = None  # [C, W]
        self.a_log: torch.Tensor | None = None  # [Hv]
        self.dt_bias: torch.Tensor | None = None  # [Hv]
        self.norm: torch.Tensor | None = None  # [dv]

    def forward(self, x, step):
        a = self.args
        hk, hv, dk, dv = a.gdn_shape
        b, t, _ = x.shape
        qkvz = self.wqkvz(x)
        mixed, z = qkvz[..., :self.channels], qkvz[..., self.channels:]
        beta_pre, gate_pre = self.wba(x).float().split(hv, dim=-1)
        beta = _lanes(torch.sigmoid, beta_pre)
        g = -torch.exp(self.a_log.float()) * _lanes(F.softplus, gate_pre + self.dt_bias.float())
        decay = _lanes(torch.exp, g)
        rec = step.cache.recurrent
        plan = step.plan
        if plan.causal:
            conv_out, tail = _conv_sequence(mixed, self.conv, step.valid)
        else:
            nodes = plan.path_slots - plan.prefix_len[:, None, None]  # node indices, -1 after
            conv_out = _conv_tree(rec.tail[self.index], mixed, self.conv, nodes)
        q, k, v = _heads(F.silu(conv_out.float()), hk, hv, dk, dv)
        if plan.causal:
            if step.valid is not None:  # right-padded rows: padding leaves the state alone
                real = (torch.arange(t, device=x.device)[None, :] < step.valid[:, None])[..., None]
                beta, decay = beta * real, torch.where(real, decay, 1.0)
            state = torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=x.device)
            if x.is_cuda:  # one kernel: the chunk as a chain walked from the zero state
                o = gdn_chain(state, q, k, v.contiguous(), decay.contiguous(),
                              beta.contiguous())
            else:
                outs = []
                for i in range(t):
                    state = advance(state, k[:, i], v[:, i], decay[:, i], beta[:, i])
                    outs.append(read_out(state, q[:, i]))
                o = torch.stack(outs, dim=1)
            rec.state[self.index] = state
            rec.tail[self.index] = tail.to(rec.tail.dtype)
        elif t == 1:  # a decode step: its only node is committed at once
            if x.is_cuda:
                v, decay, beta = v.contiguous(), decay.contiguous(), beta.contiguous()
                o = gdn_path(rec.state[self.index], q, k, v, decay, beta, nodes, store=True)
            else:
                state = advance(rec.state[self.index], k[:, 0], v[:, 0], decay[:, 0],
                                beta[:, 0])
                o = read_out(state, q[:, 0])[:, None]
                rec.state[self.index] = state
            rec.tail[self.index] = torch.cat((rec.tail[self.index][..., 1:],
                                              mixed[:, 0, :, None].to(rec.tail.dtype)), dim=-1)
            rec.pending = False
        else:
            v, decay, beta = v.contiguous(), decay.contiguous(), beta.contiguous()
            if x.is_cuda and step.gdn == "wy":
                if step.gdn_plan is None:  # one mask for every layer: the same trees
                    step.gdn_plan = gdn_ancestor_mask(nodes)
                o = gdn_wy(rec.state[self.index], q, k, v, decay, beta, nodes,
                           anc=step.gdn_plan)
            elif x.is_cuda and walks(step.gdn, t, plan.levels):
                if step.gdn_plan is None:  # one plan for every layer: the same trees
                    step.gdn_plan = gdn_walk_plan(nodes)
                o = gdn_walk(rec.state[self.index], q, k, v, decay, beta, nodes,
                             plan=step.gdn_plan)
            elif x.is_cuda:
                o = gdn_path(rec.state[self.index], q, k, v, decay, beta, nodes)
            else:
                o = _path_verify(rec.state[self.index], q, k, v, decay, beta, nodes)
            rec.stash(self.index, mixed, k, v, decay, beta)
        o = o.to(x.dtype)
        o = step.ops.rms_norm(o, self.norm, a.norm_eps) * F.silu(z.view(b, t, hv, dv))
        return self.wo(o.reshape(b, t, hv * dv))


def walks(kernel: str, nodes: int, levels: int | None = None) -> bool:
    """Whether verify of ``nodes`` tree nodes, no path longer than ``levels`` nodes (None:
    unknown), runs the walk kernel under option ``kernel``."""
    if kernel not in GDN_KERNELS:
        raise W12Error(f"GDN kernel {kernel!r}: one of {', '.join(GDN_KERNELS)}")
    longest = nodes if levels is None else min(levels, nodes)
    return kernel == "walk" or (kernel == "auto" and longest > PATH_VERIFY_DEPTH)


def advance(state, k, v, decay, beta):
    """One token of the recurrence on states [B, H, dk, dv] (float32), ``decay`` = exp(g):
    decay, delta, write. Only multiplications, additions and sums over dk, which round the
    same whatever the batch."""
    state = state * decay[..., None, None]
    u = beta[..., None] * (v - (state * k[..., :, None]).sum(-2))
    return state + k[..., :, None] * u[..., None, :]


def _lanes(fn, x):
    """``fn`` elementwise over the last dim, padded on the CPU to a multiple of 64 elements: a
    vectorised CPU kernel computes a tail shorter than its vector block with scalar code, which
    can round transcendental functions differently, so an element's bits would depend on the
    tensor's size (the number of tree nodes). With every row padded, each element is computed
    by the same vector code. GPU kernels compute every element alike."""
    pad = (-x.shape[-1]) % 64
    if pad == 0 or x.device.type != "cpu":
        return fn(x)
    return fn(F.pad(x, (0, pad)))[..., :x.shape[-1]]


def read_out(state, q):
    """o [B, H, dv] = S^T q."""
    return (state * q[..., :, None]).sum(-2)


def _heads(x, hk, hv, dk, dv):
    """q, k (L2-normalised, q scaled, repeated to the Hv value heads), v: [B, T, Hv, d]."""
    b, t, _ = x.shape
    q, k, v = x.split([hk * dk, hk * dk, hv * dv], dim=-1)
    q = F.normalize(q.view(b, t, hk, dk), dim=-1) * dk**-0.5
    k = F.normalize(k.view(b, t, hk, dk), dim=-1)
    group = hv // hk
    return (q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2),
            v.reshape(b, t, hv, dv))


def _conv_window(inputs, weight):
    """Depthwise convolution of windows [..., C, W] (oldest first) with ``weight`` [C, W],
    summed in window order."""
    acc = inputs[..., 0] * weight[:, 0]
    for w in range(1, weight.shape[1]):
        acc = acc + inputs[..., w] * weight[:, w]
    return acc


def _conv_sequence(x, weight, valid):
    """A chunk from zero history: outputs [B, T, C] and each row's last W - 1 real inputs."""
    b, t, c = x.shape
    width = weight.shape[1]
    padded = torch.cat((x.new_zeros(b, width - 1, c), x), dim=1)  # [B, W-1+T, C]
    windows = padded.unfold(1, width, 1)  # [B, T, C, W]
    out = _conv_window(windows, weight)
    end = (valid if valid is not None else torch.full((b,), t, device=x.device)) + width - 1
    index = end[:, None] - width + 1 + torch.arange(width - 1, device=x.device)
    tail = padded.gather(1, index[:, :, None].expand(b, width - 1, c)).transpose(1, 2)
    return out, tail


def _conv_tree(tail, x, weight, nodes):
    """Every node's convolution: its window is the committed ``tail`` [B, C, W-1] followed by
    its path's inputs (``nodes`` [B, T, P]: node indices root first, then -1)."""
    b, t, c = x.shape
    width = weight.shape[1]
    depth = (nodes >= 0).sum(-1) - 1  # [B, T]
    cols = []
    for w in range(width):  # window slot w holds path index depth - (W - 1 - w)
        at = depth - (width - 1 - w)
        node = nodes.gather(2, at.clamp(min=0)[..., None])[..., 0]
        from_path = x.gather(1, node.clamp(min=0)[..., None].expand(b, t, c))
        from_tail = tail.transpose(1, 2).gather(
            1, (width - 1 + at).clamp(min=0, max=width - 2)[..., None].expand(b, t, c))
        cols.append(torch.where((at >= 0)[..., None], from_path, from_tail.to(x.dtype)))
    return _conv_window(torch.stack(cols, dim=-1), weight)


def _path_verify(state, q, k, v, decay, beta, nodes):
    """Every node's output [B, T, H, dv], its path stepped from ``state`` [B, H, dk, dv]."""
    b, t, p = nodes.shape
    s = state[:, None].expand(b, t, *state.shape[1:])
    depth = (nodes >= 0).sum(-1) - 1

    def pick(x, index):  # x [B, T, ...] at node ``index`` [B, T]
        shape = index.shape + x.shape[2:]
        flat = index.clamp(min=0).view(b, t, *([1] * (x.dim() - 2)))
        return x.gather(1, flat.expand(shape))

    out = torch.zeros(b, t, q.shape[2], v.shape[-1], dtype=s.dtype, device=s.device)
    for d in range(p):
        index = nodes[..., d]
        live = (index >= 0)[..., None, None, None]
        stepped = advance(s, pick(k, index), pick(v, index), pick(decay, index),
                          pick(beta, index))
        s = torch.where(live, stepped, s)
        out = torch.where((depth == d)[..., None, None], read_out(s, q), out)
    return out


def _tail_after(tail, mixed, path, count):
    """The last W - 1 convolution inputs [B, C, W-1] after the accepted ``path`` [B, n] (node
    indices, ``count`` [B] of them) of inputs ``mixed`` [B, T, C]: slot j holds accepted input
    count - (W - 1) + j, or the old tail's where that is before the path."""
    b, c, keep = tail.shape
    at = count[:, None] - keep + torch.arange(keep, device=path.device)  # [B, W-1]
    node = path.gather(1, at.clamp(min=0))
    new = mixed.gather(1, node.clamp(min=0)[..., None].expand(b, keep, c)).transpose(1, 2)
    old = tail.gather(2, (keep + at).clamp(min=0, max=keep - 1)[:, None, :].expand(b, c, keep))
    return torch.where((at >= 0)[:, None, :], new.to(tail.dtype), old)


class RecurrentState:
    """Per GDN layer and request: the float32 state [Hv, dk, dv] and the last W - 1 convolution
    inputs [C, W-1]; plus the inputs of the last tree forward's nodes until ``keep``."""

    def __init__(self, layers: int, batch: int, args, *, dtype: torch.dtype,
                 device: torch.device) -> None:
        hk, hv, dk, dv = args.gdn_shape
        channels = 2 * hk * dk + hv * dv
        self.state = torch.zeros(layers, batch, hv, dk, dv, dtype=torch.float32, device=device)
        self.tail = torch.zeros(layers, batch, channels, args.gdn_conv - 1, dtype=dtype,
                                device=device)
        self.nodes: dict[int, tuple[torch.Tensor, ...]] = {}
        self.pending = False

    @property
    def nbytes(self) -> int:
        return sum(x.numel() * x.element_size() for x in (self.state, self.tail))

    def row(self, index: int) -> RecurrentState:
        view = RecurrentState.__new__(RecurrentState)
        view.state = self.state[:, index:index + 1]
        view.tail = self.tail[:, index:index + 1]
        view.nodes, view.pending = {}, False
        return view

    def stash(self, layer: int, mixed, k, v, decay, beta) -> None:
        self.nodes[layer] = (mixed, k, v, decay, beta)
        self.pending = True

    def keep(self, nodes: torch.Tensor, count: torch.Tensor) -> None:
        """Commit each request's accepted path (``nodes`` [B, n] node indices, ``count`` [B]
        of them) of the last tree forward, in every GDN layer: the decode step over them."""
        if not self.pending:
            return
        if len(self.nodes) != self.state.shape[0]:
            raise W12Error("a tree forward that skipped GDN layers cannot be committed")
        b, n = nodes.shape
        rows = torch.arange(b, device=nodes.device)
        path = torch.where(torch.arange(n, device=nodes.device) < count[:, None], nodes, -1)
        for layer, (mixed, k, v, decay, beta) in self.nodes.items():
            state = self.state[layer]
            if state.is_cuda:  # the accepted path as one path a request, stepped in place
                gdn_path(state, k, k, v, decay, beta, path[:, None], out=False, store=True)
            else:
                for i in range(n):
                    at = nodes[:, i].clamp(min=0)
                    stepped = advance(state, k[rows, at], v[rows, at], decay[rows, at],
                                      beta[rows, at])
                    state = torch.where((i < count)[:, None, None, None], stepped, state)
                self.state[layer] = state
            self.tail[layer] = _tail_after(self.tail[layer], mixed, path, count)
        self.nodes.clear()
        self.pending = False
