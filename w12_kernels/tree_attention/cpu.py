"""CPU path of tree attention and KV compaction, batch invariant by construction.

Each (request, node, query head) is one loop nest over the positions the node sees, in
position order: a score is the float32 sum of q * k over the head dim in index order, the
softmax takes the exact maximum, a polynomial ``exp2`` made of IEEE adds and multiplies (no
libm, whose vector and scalar versions may differ) and the float32 sum over positions in order,
and the output is the float32 sum of p * v in position order, divided by that sum and rounded
to bf16 (ties to even). No float operation mixes two rows, and every operation is an IEEE
add, multiply, divide or max, whose result does not depend on how the loops are vectorised or
threaded: a row's bits depend on its query and its visible keys and values only, never on T,
B, the other nodes or the number of threads. Numba compiles the loops, reading the bf16
tensors as raw bits (torch's matmul may pick another kernel, with another summation order,
for one row than for many, and elementwise torch with the same guarantee was over 10x slower
on the demo model's shapes).
"""

from __future__ import annotations

import math

import numba
import numpy as np
import torch

_LOG2E = math.log2(math.e)
# 2^f for f in [-0.5, 0.5]: Taylor series of e^(f ln 2) to degree 7 (error < 1e-8 relative)
_C0, _C1, _C2, _C3, _C4, _C5, _C6, _C7 = (np.float32(math.log(2) ** i / math.factorial(i))
                                          for i in range(8))
_HALF = np.float32(0.5)
_LOWEST = np.float32(-126.0)
_POW2 = np.array([2.0**e for e in range(-126, 1)], np.float32)  # 2^n for n in -126..0
NODE_CHUNK = 8  # nodes per job: they share one float32 copy of the prefix keys and values
PARALLEL_WORK = 1 << 22  # multiply-adds of q.k below which threads cost more than they save


@numba.njit(cache=True, inline="always")
def _exp2(x, pow2):
    """2^x for float32 x <= 0 from IEEE operations only (2^-126 at most below -126)."""
    x = max(x, _LOWEST)
    n = np.floor(x + _HALF)
    f = x - n
    y = _C7
    y = y * f + _C6
    y = y * f + _C5
    y = y * f + _C4
    y = y * f + _C3
    y = y * f + _C2
    y = y * f + _C1
    y = y * f + _C0
    return y * pow2[np.int64(n) + 126]


@numba.njit(cache=True, inline="always")
def _widen(bits, scratch, scratch_f32):
    """A bf16 row (int16 bits) as float32, through a uint32 scratch row and its float view."""
    for i in range(bits.shape[0]):
        scratch[i] = np.uint32(np.uint16(bits[i])) << 16
    return scratch_f32


@numba.njit(cache=True)
def _attend_nodes(job, q, k, v, prefix, path, c, pow2, out):
    """The nodes of one (request, KV head, chunk of ``NODE_CHUNK`` nodes)."""
    nb, nt, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    width = path.shape[2]
    chunks = (nt + NODE_CHUNK - 1) // NODE_CHUNK
    b = job // (hkv * chunks)
    h = (job // chunks) % hkv
    first = (job % chunks) * NODE_CHUNK
    scratch = np.empty(d, np.uint32)
    row_f32 = scratch.view(np.float32)
    length = prefix[b]
    kt = np.empty((d, length + width), np.float32)  # keys transposed: scores run along j
    vs = np.empty((length + width, d), np.float32)
    for j in range(length):
        key = _widen(k[b, h, j], scratch, row_f32)
        for i in range(d):
            kt[i, j] = key[i]
        vs[j] = _widen(v[b, h, j], scratch, row_f32)
    s = np.empty(length + width, np.float32)
    acc = np.empty(d, np.float32)
    qf = np.empty(d, np.float32)
    for t in range(first, min(first + NODE_CHUNK, nt)):
        if path[b, t, 0] < 0:
            continue
        depth = 0
        while depth + 1 < width and path[b, t, depth + 1] >= 0:
            depth += 1
        n = length + depth + 1
        for j in range(length, n):
            key = _widen(k[b, h, path[b, t, j - length]], scratch, row_f32)
            for i in range(d):
                kt[i, j] = key[i]
            vs[j] = _widen(v[b, h, path[b, t, j - length]], scratch, row_f32)
        for head in range(h * g, h * g + g):
            qf[:] = _widen(q[b, t, head], scratch, row_f32)
            s[:n] = 0
            for i in range(d):
                qi = qf[i]
                for j in range(n):
                    s[j] += qi * kt[i, j]
            m = s[0]
            for j in range(1, n):
                m = max(m, s[j])
            for j in range(n):
                s[j] = _exp2((s[j] - m) * c, pow2)
            total = np.float32(0.0)
            for j in range(n):
                total += s[j]
            acc[:] = 0
            for j in range(n):
                pj = s[j]
                for i in range(d):
                    acc[i] += pj * vs[j, i]
            for i in range(d):
                acc[i] = acc[i] / total
            bits = acc.view(np.uint32)
            for i in range(d):
                u = bits[i]
                out[b, t, head, i] = np.uint16((u + np.uint32(0x7FFF) + ((u >> 16) & 1)) >> 16)


@numba.njit(cache=True, parallel=True)
def _attend_parallel(jobs, q, k, v, prefix, path, c, pow2, out):
    for job in numba.prange(jobs):
        _attend_nodes(job, q, k, v, prefix, path, c, pow2, out)


@numba.njit(cache=True)
def _attend_serial(jobs, q, k, v, prefix, path, c, pow2, out):
    for job in range(jobs):
        _attend_nodes(job, q, k, v, prefix, path, c, pow2, out)


def tree_attention_cpu(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                       prefix_len: torch.Tensor, path_slots: torch.Tensor,
                       scale: float) -> torch.Tensor:
    """Threads only where the work pays for them (a decode step of a small model runs
    serially); the bits are the same either way. Padding nodes are 0."""
    b, t, hq, d = q.shape
    hkv = k_cache.shape[1]
    out = np.zeros((b, t, hq, d), np.uint16)
    jobs = b * hkv * -(-t // NODE_CHUNK)
    work = b * t * hq * d * (int(prefix_len.max()) + path_slots.shape[2])
    attend = _attend_parallel if work >= PARALLEL_WORK else _attend_serial
    attend(jobs, *(x.view(torch.int16).numpy() for x in (q, k_cache, v_cache)),
           prefix_len.to(torch.int64).numpy(), path_slots.to(torch.int64).numpy(),
           np.float32(scale * _LOG2E), _POW2, out)
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16).view(b, t, hq * d)


def compact_kv_cpu(k_all: torch.Tensor, v_all: torch.Tensor, src_slots: torch.Tensor,
                   dst_start: torch.Tensor, count: torch.Tensor) -> None:
    """Every source row is gathered before any destination is written."""
    i = torch.arange(src_slots.shape[1])
    rows, cols = (i[None, :] < count[:, None]).nonzero(as_tuple=True)
    src = src_slots[rows, cols].long()
    dst = dst_start[rows].long() + cols
    for cache in (k_all, v_all):
        cache[:, rows, :, dst] = cache[:, rows, :, src]
