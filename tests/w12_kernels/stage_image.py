"""CPU statement of the large-M warpgroup-MMA kernel (``w12_kernels/gemm/large/kernels.cu``):
the activation stage images ``w12_permute_x`` writes, and a NumPy emulator of ``wgl_body`` (the
decoded weights as the A operand, here laid out as the K-major core matrices that operand
stands for, both operands read back through matrix descriptors, the K split over the blocks of
a cluster folded in rank order, the epilogue of the other emulators), so that the CPU checks
its index arithmetic. Written from the kernel's comments and the PTX ISA's
description of K-major ``wgmma`` operands with the 128-byte swizzle: row ``r`` of K step ``j``
at linear byte ``start + 32 j + (r // 8) * SBO + (r % 8) * 128 + 2 kk``, bits 4-6 of the
address XORed with bits 7-9 (the buffers are 1024-byte aligned). The 16 products of a K step
and the accumulator are summed in float64 and rounded once to float32, as the other emulators
do; the real tensor core's internal rounding is not specified. Escapes whose value divided by
the row's scale is a BF16 zero or normal number that gives the value back (``patchable``, in
float32 as the kernel computes it) are written over the decoded value of their element; the
epilogue corrects only the others.
"""

from __future__ import annotations

import numpy as np
import torch
from cuda_emulator import _as_words, decode8, f32_to_bf16_bits
from wgmma_emulator import store_rows

SBO = 1024  # large/kernels.cu sw128_desc


def stage_images(x: torch.Tensor, nchunks: int, block_m: int) -> torch.Tensor:
    """BF16 [ceil(M / block_m) * nchunks * block_m * 64]: for token block ``tb`` and chunk
    ``c``, byte ``n * 128 + ((2 * j + h) ^ (n % 8)) * 16 + 4 * t + 2 * e`` holds column
    ``c * 64 + 16 * t + 4 * j + 2 * h + e`` of token ``tb * block_m + n``."""
    m, k = x.shape
    blocks = -(-m // block_m)
    bits = np.zeros((blocks * block_m, nchunks * 64), np.uint16)
    bits[:m, :k] = x.view(torch.int16).numpy().view(np.uint16)
    out = np.zeros(blocks * nchunks * block_m * 64, np.uint16)
    for tb in range(blocks):
        for c in range(nchunks):
            base = (tb * nchunks + c) * block_m * 64  # in BF16 elements
            for n in range(block_m):
                for j in range(4):
                    for h in range(2):
                        for t in range(4):
                            for e in range(2):
                                byte = (n * 128 + ((2 * j + h) ^ (n % 8)) * 16 + 4 * t
                                        + 2 * e)
                                out[base + byte // 2] = bits[tb * block_m + n,
                                                             c * 64 + 16 * t + 4 * j + 2 * h + e]
    return torch.from_numpy(out.view(np.int16)).view(torch.bfloat16)


def _read(image: np.ndarray, start: int, rows: int) -> np.ndarray:
    """A K-major operand [rows, 16] as float64, read through a descriptor at byte ``start``
    of a 1024-byte aligned buffer."""
    r = np.arange(rows)[:, None]
    kk = np.arange(16)[None, :]
    linear = start + (r // 8) * SBO + (r % 8) * 128 + 2 * kk
    byte = linear ^ (((linear >> 7) & 7) << 4)
    bits = image[byte // 2].astype(np.uint32) << np.uint32(16)
    return bits.view(np.float32).astype(np.float64)


def _bits_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def patchable(pw) -> tuple[np.ndarray, np.ndarray]:
    """Per escape: whether the kernel writes it into the decoded tile, and the BF16 bits it
    writes (the value divided by the row's scale, in float32, rounded to BF16)."""
    vf = _bits_f32(pw.esc_val.numpy().view(np.uint16))
    sc = pw.scale.numpy()[pw.esc_row.numpy().astype(np.int64)]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        a = f32_to_bf16_bits(vf * (np.float32(1.0) / sc))
        back = _bits_f32(a) * sc
    mag, expo = a & 0x7FFF, a & 0x7F80
    ok = ((mag == 0) | ((expo != 0) & (expo != 0x7F80))) & (back == vf)
    return ok, a


def _a_buffer(words: np.ndarray, tiles: list[int], col: int,
              patches: dict[tuple[int, int], int]) -> np.ndarray:
    """The A buffer of one warpgroup for chunk column ``col`` as BF16 bits [64 * 64]: what its
    four warps store after ``decode8`` (lane (g, t), step j, register r at byte row * 128 +
    ((2 j + r // 2) ^ g) * 16 + t * 4, row = 16 warp + g + 8 (r % 2)), element e of a register
    being column 16 t + 4 j + 2 (r // 2) + e of the chunk (layout.py), with ``patches``
    ((row, column) of the weight -> BF16 bits) written over their elements."""
    buf = np.zeros(64 * 64, np.uint16)
    for warp, tile in enumerate(tiles):
        lw = words[tile, col]  # [96, 4]: Words4 lane, lane + 32, lane + 64
        for j in range(4):
            regs = decode8(lw[0:32, j], lw[32:64, j], lw[64:96, j])
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                for r in range(4):
                    row = 16 * warp + g + 8 * (r % 2)
                    byte = row * 128 + ((2 * j + r // 2) ^ g) * 16 + t * 4
                    word = int(regs[r][lane])
                    for e in range(2):
                        weight = (16 * tile + g + 8 * (r % 2), 64 * col + 16 * t + 4 * j
                                  + 2 * (r // 2) + e)
                        buf[byte // 2 + e] = patches.get(weight, (word >> (16 * e)) & 0xFFFF)
    return buf


def gemm_wgl(x: torch.Tensor, pw, bias: torch.Tensor | None = None, *, block_m: int,
             warpgroups: int, splits: int) -> torch.Tensor:
    """What ``wgl_body<block_m, warpgroups, S, splits>`` writes: BF16 [M, N]."""
    m = x.shape[0]
    ntiles, nchunks = int(pw.chunks.shape[0]), int(pw.chunks.shape[1])
    words = _as_words(pw.chunks).reshape(ntiles, nchunks, 96, 4)
    ok, bits = patchable(pw)
    rows, cols = pw.esc_row.numpy(), pw.esc_col.numpy()
    patches = {(int(rows[e]), int(cols[e])): int(bits[e]) for e in np.flatnonzero(ok)}
    images = stage_images(x, nchunks, block_m).view(torch.int16).numpy().view(np.uint16)
    rows_per_block = 64 * warpgroups
    row_blocks = -(-ntiles // (4 * warpgroups))
    per = -(-nchunks // splits)
    v = np.zeros((row_blocks * rows_per_block, -(-m // block_m) * block_m), np.float32)
    for bx in range(row_blocks):
        for by in range(-(-m // block_m)):
            partials = []
            for rank in range(splits):
                c0 = min(nchunks, rank * per)
                acc = np.zeros((rows_per_block, block_m), np.float32)
                for col in range(c0, min(nchunks, c0 + per)):
                    image = images[(by * nchunks + col) * block_m * 64:][: block_m * 64]
                    for wg in range(warpgroups):
                        tiles = [min((bx * warpgroups + wg) * 4 + w, ntiles - 1)
                                 for w in range(4)]
                        abuf = _a_buffer(words, tiles, col, patches)
                        d = acc[wg * 64 : wg * 64 + 64]
                        for j in range(4):
                            a = _read(abuf, 32 * j, 64)
                            b = _read(image, 32 * j, block_m)
                            d = (a @ b.T + d.astype(np.float64)).astype(np.float32)
                        acc[wg * 64 : wg * 64 + 64] = d
                partials.append(acc)
            total = partials[0].copy()
            for q in range(1, splits):
                total = total + partials[q]  # float32, rank order
            v[bx * rows_per_block : (bx + 1) * rows_per_block,
              by * block_m : (by + 1) * block_m] = total
    return store_rows(v, x, pw, bias, skip=ok)
