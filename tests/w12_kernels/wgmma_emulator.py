"""NumPy emulator of the warpgroup-MMA kernel ``w12_gemm_wg<N, R, KB, S, RG>``
(``w12_kernels/gemm/wgmma/kernels.cu``), so that the CPU checks its index arithmetic: where each
staging item (token, quarter) puts the activations in the image that bulk copies bring to
shared memory (``w12_x_image``), the matrix descriptor (start, leading and stride byte offsets
of the core matrices, no swizzle) through which the warpgroup MMA reads them back, the A
fragments (``decode8`` of the same chunk words as the mma.sync kernel), the split of the chunk
columns over ``split`` blocks of ``KB`` warpgroups with ``S`` accumulator sets each (partial
``q = z KB S + g + KB (i % S)`` for block ``z``'s warpgroup ``g``'s ``i``-th column) and the
fold in order ``q = 0..kw-1``, and the epilogue.

Written from the kernel source and the PTX ISA's description of ``wgmma`` operands: B (K x N,
K-major, no swizzle) is read as 8 x 8 core matrices of 128 contiguous bytes, core matrix
(n group ``ng``, k group ``kg``) at ``start + ng * SBO + kg * LBO``, row ``n % 8`` at 16 bytes
per row, element ``kk % 8`` of the row at 2 bytes each. The 16 products of each K step and the
accumulator are summed in float64 and rounded once to float32, as ``cuda_emulator.py`` does for
``mma.sync``; the real tensor core's internal rounding is not specified.
"""

from __future__ import annotations

import numpy as np
import torch
from cuda_emulator import _A_COL, _A_ROW, _as_words, _elements, _x_words, decode8, f32_to_bf16_bits

LBO, SBO = 128, 256  # wgmma/kernels.cu wg_desc


def _stage(xw: np.ndarray, m: int, tok0: int, n_block: int, chunk: int) -> np.ndarray:
    """``w12_x_image`` of every staging item: the stage as uint32 words
    [N * 32]. Item (n, u) holds words 8u..8u+7 of token tok0 + n (zeros past M) and stores word
    8u + mm at byte (n // 8) 256 + (n % 8) 16 + 4u + (mm // 2) N 32 + (mm % 2) 128."""
    stage = np.zeros(n_block * 32, np.uint32)
    for item in range(4 * n_block):
        n, u = item >> 2, item & 3
        tok = tok0 + n
        w = xw[tok, chunk * 32 + 8 * u : chunk * 32 + 8 * u + 8] if tok < m else np.zeros(
            8, np.uint32)
        base = (n >> 3) * 256 + (n & 7) * 16 + 4 * u
        for mm in range(8):
            stage[(base + (mm >> 1) * n_block * 32 + (mm & 1) * 128) // 4] = w[mm]
    return stage


def _b_matrix(stage: np.ndarray, start: int, n_block: int) -> np.ndarray:
    """B [16, N] as float64, read through the descriptor (start byte, LBO, SBO)."""
    kk = np.arange(16)[:, None]
    n = np.arange(n_block)[None, :]
    byte = start + (n // 8) * SBO + (kk // 8) * LBO + (n % 8) * 16 + 2 * (kk % 8)
    bits = stage.view(np.uint16)[byte // 2].astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32).astype(np.float64)


def gemm_wg(x: torch.Tensor, pw, bias: torch.Tensor | None = None, *, kw: int,
            n_block: int, warpgroups: int | None = None, split: int = 1) -> torch.Tensor:
    """What ``w12_gemm_wg<n_block, R, warpgroups, kw / (warpgroups split), RG>`` on a grid of
    ``split`` blocks per row range writes: BF16 [M, N_rows]. (The row groups per block only
    change which warpgroups share a stage, not a sum.)"""
    kb = warpgroups or min(kw, 4)
    sets = kw // (kb * split)
    kwb = kb * sets
    assert kwb * split == kw
    m = x.shape[0]
    tiles, nchunks = int(pw.chunks.shape[0]), int(pw.chunks.shape[1])
    words = _as_words(pw.chunks).reshape(tiles, nchunks, 96, 4)
    xw = _x_words(x, nchunks * 64)
    rows_total = -(-tiles // 4) * 64
    tok_total = -(-m // n_block) * n_block
    acc = np.zeros((kw, rows_total, tok_total), np.float32)
    for bx in range(rows_total // 64):
        for by in range(tok_total // n_block):
            tok0 = by * n_block
            for z in range(split):
                for g in range(kb):
                    # local column i of warpgroup g: c = z kwb + g + kb (i % S) + kw (i // S)
                    cols = sorted(c for s in range(sets)
                                  for c in range(z * kwb + g + kb * s, nchunks, kw))
                    for i, c in enumerate(cols):
                        q = z * kwb + g + kb * (i % sets)
                        assert q == c % kw
                        d = acc[q, bx * 64 : bx * 64 + 64, tok0 : tok0 + n_block]
                        stage = _stage(xw, m, tok0, n_block, c)
                        for j in range(4):
                            a = np.zeros((64, 16))
                            for w in range(4):
                                tile = min(bx * 4 + w, tiles - 1)
                                lane_words = words[tile, c]  # [96, 4]: Words4 l, l+32, l+64
                                regs = np.stack(decode8(lane_words[0:32, j],
                                                        lane_words[32:64, j],
                                                        lane_words[64:96, j]), axis=-1)
                                block = np.zeros((16, 16))
                                block[_A_ROW, _A_COL] = _elements(regs)
                                a[16 * w : 16 * w + 16] = block
                            b = _b_matrix(stage, j * n_block * 32, n_block)
                            d[...] = (a @ b + d.astype(np.float64)).astype(np.float32)
    v = acc[0].copy()
    for q in range(1, kw):
        v = v + acc[q]  # float32, in order q = 0..kw-1
    return store_rows(v, x, pw, bias)


def store_rows(v: np.ndarray, x: torch.Tensor, pw, bias: torch.Tensor | None,
               skip: np.ndarray | None = None) -> torch.Tensor:
    """The kernels' epilogue (``store_output``) over float32 sums ``v`` [rows >= N, tokens >= M]:
    scale each row, add its escape corrections in list order (leaving out those where ``skip``
    [E] is set) and the bias, round to BF16 [M, N]."""
    m = x.shape[0]
    n_rows = pw.n
    scale = pw.scale.numpy()
    rowptr = pw.esc_rowptr.numpy().astype(np.int64)
    esc_col, esc_delta = pw.esc_col.numpy().astype(np.int64), pw.esc_delta.numpy()
    xf = x.float().numpy()
    y = np.zeros((m, n_rows), np.uint16)
    for row in range(n_rows):
        out = v[row, :m] * scale[row]
        for e in range(rowptr[row], rowptr[row + 1]):
            if skip is not None and skip[e]:
                continue
            with np.errstate(invalid="ignore", over="ignore"):
                out = (out.astype(np.float64) + xf[:, esc_col[e]] * esc_delta[e]).astype(
                    np.float32)
        if bias is not None:
            out = out + bias.float().numpy()[row]
        y[:, row] = f32_to_bf16_bits(out.astype(np.float32))
    return torch.from_numpy(y.view(np.int16)).view(torch.bfloat16)
