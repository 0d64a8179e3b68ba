"""The large-M W12 GEMM on Hopper's warpgroup MMA (``kernels_large.cu``), for the rows beyond
the small-M path (prefill, large batches).

Decode + cuBLAS pays a BF16 write and re-read of the weight on top of cuBLAS's own time, and
the Triton fused kernel runs one serial chain per step (docs/PERF_GEMM.md). Here a producer
warp bulk-copies each chunk column's words and activations into shared-memory stages, every
warp decodes its 16-row tile into a shared-memory A operand, and the block's warpgroups
multiply it with the activations shared by all of them (``wgmma``, both operands in shared
memory). A small kernel first writes the activations as the images of those stages, in the
K order of the weight fragments, so that one bulk copy per column fills a stage. Escapes that
fit the decoded tile's scale are written into it (``esc_order``: each tile's escapes by chunk),
so that the epilogue corrects only the others (inf, NaN, out-of-range).
Deterministic; with ``splits`` > 1 the K ranges of a thread-block cluster are added in a fixed
order through distributed shared memory. Needs compute capability 9.0 (``sm_90a``). Not
batch-invariant (the launcher uses it above the rows where that is promised). Measured on an
H200 (docs/PERF_GEMM.md #19-#65): 0.68-1.00x of cuBLAS at 256 rows (geomean 0.86; 0.85 at 512,
0.88 at 1024 rows), short of the 0.9x it was built for. ``a_regs`` keeps the decoded weights in
registers as the MMA's A operand (no A buffers): 9-13% faster at 128 activation rows; at 256
rows that needs ``a_regs`` 2, a producer warpgroup that gives its registers to the MMA
warpgroups (the table's choice at 256 rows on most shapes, some with K in two or three ranges or
stream-K); ``a_regs`` 3 (with ``warpgroups`` 1) puts both MMA warpgroups on the block's 64
weight rows, each taking every other column and their sums added in the epilogue, so that a
4096-row layer runs 128 blocks with two warpgroups' MMAs in flight (the table's choice on the
three 4096-wide layers at 256 rows, #65). Copying the activations into the stages from the
producer warpgroup itself (4-byte cp.async, no image pass) was 3-5x slower (docs/PERF_GEMM.md
#57) and was removed. The GEMM is launched with programmatic dependent launch after its image
pass (``PDL``), so that its blocks' start overlaps that pass: 0.741 -> 0.748 at 256 rows (#59).
``persist`` 1 is stream-K: one block per multiprocessor, each a share of all (unit, column)
steps cut by a host model of the blocks' epilogues (``stream_k_cuts``, #78), the units cut
between blocks added in a fixed order through a float32 workspace (``_stream_k_memory``); the
table takes it where it wins (layers of 2-4 waves, #60). A block's
last segment stores its outputs through a BF16 staging tile in the stages' memory
(``PERS_STAGE``, #76). A block's
chunk words of a column come in by one tensor copy (``WEIGHT_MAP``: a tensor map over the
chunks, passed by value; #63, ~6% on the layers of two waves and more), and with one or two K
ranges the epilogue stores 8 rows of one token a thread in 16 bytes (two ranges: each block
keeps its own share of tokens in its accumulators, copies its sums of the other's share into
that block's shared memory and stores through a staging tile, ``OWN_SHARE``, #80, #82). What one
block hands another (that copy, stream-K's pieces) goes as 24-bit truncated floats
(``NARROW``, #81). Layers of several waves may run their partial last wave as a second launch
(``tail``: K in 2-4 ranges, or stream-K; #64). ``xorder`` (a table entry's choice, #83) drops the
image pass: the activations are copied straight from x and each column is summed in x's K
order, the weights' fragments gathered from a swizzled weight stage.
"""

from __future__ import annotations

import functools
import math
import struct
from pathlib import Path

import torch

from w12_kernels.gemm import cuda, wgmma

SOURCE_PATH = Path(__file__).with_name("kernels_large.cu")
BLOCK_M = (64, 128, 192, 256)  # activation rows per block (the wgmma N)
WARPGROUPS = (1, 2)  # 64 weight rows each
SPLITS = (1, 2, 3, 4)  # K ranges, one per block of a cluster


# Whether gemm_wgl launches the GEMM with programmatic dependent launch after the image pass
# (docs/PERF_GEMM.md #59); False restores the plain launch.
PDL = True

# Whether stream-K (``persist``) stores its last segment's outputs through a BF16 staging tile in
# the stages' memory (16-byte stores of whole row segments) rather than straight from the
# accumulators (docs/PERF_GEMM.md #76); False restores the stores from the accumulators. The
# same bits either way.
PERS_STAGE = True

# Whether a block of a two-range cluster keeps its own share of tokens in its accumulators,
# writes only the other block's share to shared memory for the push, and stores through a BF16
# staging tile (docs/PERF_GEMM.md #80), rather than writing its whole partial tile and reading
# both shares back; False restores the partial tile. The same bits either way.
OWN_SHARE = True

# Whether what one block hands another (a stream-K piece; with ``OWN_SHARE``, a two-range
# block's push of the other share) goes as the top 24 bits of each float32, four floats in three
# words (docs/PERF_GEMM.md #81), rather than as float32. The sums differ from float32's by a
# relative error below 2^-15 (the BF16 output's rounding is 2^-9), so the bits differ between
# the two (each deterministic).
NARROW = True
NARROW_BYTES = 0.75  # a narrow hand-over's bytes, of float32's

# Whether stream-K's blocks take steps cut by ``stream_k_cuts``'s model of their epilogues
# (docs/PERF_GEMM.md #78) rather than equal shares; False restores the equal shares. The sums
# of a unit cut elsewhere are added in another grouping, so the bits differ between the two
# (each deterministic).
STREAM_K_WEIGHTED = True

# ``stream_k_cuts``'s costs, in main-loop steps (one chunk column of one unit: ~0.6 us at 256
# tokens on an H200): a piece's sums written and flagged, an owner's read and add of one piece,
# a unit's stores through the staging tile (a block's last segment) and straight from the
# accumulators (its other segments), and a block's switch from one segment to the next.
# From the stamps of docs/PERF_GEMM.md #75-#78.
STREAM_K_COST = {"piece": 5.3, "read": 3.0, "staged_store": 3.7, "store": 8.8, "switch": 2.0}
MAX_STREAM_K_BLOCKS = 256  # StreamKCuts in kernels_large.cu

# Whether the token blocks of one tile block read its chunk columns at about the same time
# (docs/PERF_GEMM.md #84, kernels_large.cu's W12_WREUSE): launched next to each other, or in
# stream-K with the units ordered token block outermost, so that with several token blocks a
# layer's weights come from memory about once and from the L2 after. False restores the
# grid's order (tile blocks fastest) and stream-K's units tile block outermost. The same bits
# either way without stream-K; stream-K's units are cut elsewhere, so its bits differ (each
# deterministic). Off for the entries that do not name it: over the whole table a wash at
# 512 and 1024 rows (0.881 -> 0.883, 0.898 -> 0.898 in the same graphs, run 302 on an H100),
# so the large-M table turns it on per entry (its ``wreuse`` key, #85) where it won.
WREUSE = False

# Whether the large-M kernel's bulk copies carry L2 eviction hints (docs/PERF_GEMM.md #91,
# kernels_large.cu's W12_L2HINT): the activation stages evict_last, the chunk words evict_first,
# so that streaming weights do not push out activations that other blocks read again. The same
# bits either way. Off for the entries that do not name it: it gained 3-13% on some stream-K
# entries and lost up to 1% on others (an H100), so the large-M table turns it on per entry (its
# ``l2hint`` key) where an A/B (benchmarks/large_ab.py --toggle l2hint) found it faster.
L2HINT = False

# Whether a warp of the large-M kernel (decoded weights in registers) keeps its next escape
# column, so that a column without escapes costs one compare instead of the batch's vote and
# shuffle (kernels_large.cu's W12_ESCNEXT; the same bits either way). On: faster in the A/Bs
# of docs/PERF_GEMM.md #92 (benchmarks/large_ab.py --toggle escnext: +1% geomean at 256, 512
# and 1024 rows on an H100, up to 5% on the short layers).
ESCNEXT = True

# Whether gemm_wgl copies a block's chunk words of a column by one tensor copy (a tensor map
# over the chunks, ``_weight_map``) rather than one bulk copy a tile (docs/PERF_GEMM.md #63);
# False restores the bulk copies. The same bits either way.
WEIGHT_MAP = True


def available() -> bool:
    return cuda.available() and torch.cuda.get_device_capability()[0] == 9


def kernel_name(block_m: int, warpgroups: int, x_stages: int, w_stages: int,
                splits: int, a_regs: int = 0, persist: int = 0, mcast: int = 0) -> str:
    return (f"w12_wgl_{block_m}_{warpgroups}_{x_stages}_{w_stages}_{splits}"
            + ("", "_r", "_rp", "_ri")[int(a_regs)] + ("_ps" if persist else "")
            + ("_mc" if mcast else ""))


def threads(warpgroups: int, a_regs: int = 0) -> int:
    """The MMA warpgroups plus a producer warp, or (``a_regs`` 2) a producer warpgroup;
    ``a_regs`` 3: two MMA warpgroups on the one group of 64 weight rows, and a producer
    warpgroup."""
    if a_regs == 3:
        return 384
    return 128 * warpgroups + (128 if a_regs == 2 else 32)


def shared_bytes(block_m: int, warpgroups: int, x_stages: int, w_stages: int,
                 a_regs: int = 0, persist: int = 0, splits: int = 1) -> int:
    """The activation stages, the chunk-word stages, three buffers of decoded weights (none
    with ``a_regs``: the A operand in registers) and the stages' full and empty mbarriers
    (``persist``: also a segment's row data, 16 bytes a weight row, its warps' first escape
    batches, 8 bytes an entry and 8 a warp, and their four mbarriers), or (after the main
    loop) the float32 partial tile, with 2 K ranges also the inbox of the other rank's sums of
    this block's share of tokens and its mbarrier, whichever is larger, plus what aligning
    them to 1024 bytes (the swizzle atom) may take."""
    main = (x_stages * block_m * 128 + w_stages * 4 * warpgroups * 1536
            + (0 if a_regs else 3 * warpgroups * 8192) + 16 * (x_stages + w_stages)
            + (64 * warpgroups * 16 + 4 * warpgroups * 36 * 8 + 32 if persist else 0))
    row = (64 * warpgroups + 4) * 4  # bytes of a token's partial sums
    tile = block_m * row
    if splits == 2:
        tile += math.ceil(block_m / 2) * row + 8
    return 1024 + max(main, tile)


def check_config(block_m: int, warpgroups: int, x_stages: int, w_stages: int,
                 splits: int, a_regs: int = 0, persist: int = 0, mcast: int = 0) -> None:
    if (block_m not in BLOCK_M or warpgroups not in WARPGROUPS or splits not in SPLITS
            or not 3 <= x_stages <= 8 or not 2 <= w_stages <= 16 or a_regs not in (0, 1, 2, 3)
            or (a_regs == 2 and warpgroups != 2)  # setmaxnreg's split is made for two
            or (a_regs == 3 and warpgroups != 1)  # two MMA warpgroups on 64 rows
            or persist not in (0, 1) or (persist and (a_regs != 2 or splits != 1))
            or mcast not in (0, 1) or (mcast and (a_regs < 2 or persist))  # pairs: a producer
            # warpgroup, not stream-K
            or shared_bytes(block_m, warpgroups, x_stages, w_stages, a_regs,
                            persist, splits) > 227 * 1024):
        raise ValueError(f"gemm_wgl: bad configuration block_m={block_m} "
                         f"warpgroups={warpgroups} x_stages={x_stages} w_stages={w_stages} "
                         f"splits={splits} a_regs={a_regs} persist={persist} mcast={mcast}")


def blocks_per_sm(block_m: int, warpgroups: int, x_stages: int, w_stages: int,
                  a_regs: int = 0, splits: int = 1) -> int:
    """2 where the shared memory of two blocks fits a multiprocessor (228 KiB, 1 KiB of it
    reserved per block) and the accumulators (``block_m / 2`` registers per thread) leave room
    under the register cap of two blocks (each of the 4 quarters of a multiprocessor holds
    16,384 registers for its share of the two blocks' warps); the kernel then caps them."""
    if a_regs >= 2:  # the register split of setmaxnreg is made for one block
        return 1
    one = shared_bytes(block_m, warpgroups, x_stages, w_stages, a_regs, splits=splits)
    warps = 2 * threads(warpgroups, a_regs) // 32
    cap = 16384 // (32 * math.ceil(warps / 4)) // 8 * 8
    fits = block_m // 2 + (64 if a_regs else 40) <= cap
    return 2 if fits and 2 * (one + 1024) <= 228 * 1024 else 1


def _entry(block_m: int, warpgroups: int, x_stages: int, w_stages: int, splits: int,
           a_regs: int = 0, persist: int = 0, mcast: int = 0) -> str:
    pair = 2 if mcast else 1
    cluster = f" __cluster_dims__({pair}, 1, {splits})" if splits * pair > 1 else ""
    min_blocks = blocks_per_sm(block_m, warpgroups, x_stages, w_stages, a_regs, splits)
    return (
        f'extern "C" __global__ void __launch_bounds__({threads(warpgroups, a_regs)}, '
        f'{min_blocks})'
        f"{cluster}\n"
        f"{kernel_name(block_m, warpgroups, x_stages, w_stages, splits, a_regs, persist, mcast)}"
        "(\n"
        "    const Words4* __restrict__ chunks, const bf16_t* __restrict__ xp,\n"
        "    const bf16_t* __restrict__ x, int ldx, bf16_t* __restrict__ y,\n"
        "    const float* __restrict__ scale, const int* __restrict__ rowptr,\n"
        "    const int* __restrict__ esc_row, const int* __restrict__ esc_col,\n"
        "    const bf16_t* __restrict__ esc_val, const float* __restrict__ esc_delta,\n"
        "    const int* __restrict__ esc_order, const uint2* __restrict__ esc_entry,\n"
        "    const int* __restrict__ esc_fix, const bf16_t* __restrict__ bias, int M,\n"
        "    int n_rows, int ntiles, int nchunks, float* __restrict__ work,\n"
        "    unsigned* __restrict__ flags, const __grid_constant__ TensorMap wmap,\n"
        "    int wmap_on, const __grid_constant__ TensorMap xmap, int tile_base"
        + (", const __grid_constant__ StreamKCuts cuts" if persist else "") + ") {\n"
        f"  wgl_body<{block_m}, {warpgroups}, {x_stages}, {w_stages}, {splits}, "
        f"{int(a_regs)}, {int(persist)}, {pair}>(\n"
        "      chunks, xp, x, ldx, y, scale, rowptr, esc_row, esc_col, esc_val, esc_delta,\n"
        "      esc_order, esc_entry, esc_fix, bias, M, n_rows, ntiles, nchunks, work, flags,\n"
        "      wmap_on ? (const void*)&wmap : nullptr, tile_base, "
        + ("cuts.q" if persist else "nullptr") + ", &xmap);\n}\n")


def source(block_m: int, warpgroups: int, x_stages: int, w_stages: int, splits: int,
           a_regs: int = 0, persist: int = 0, mcast: int = 0,
           staged: bool | None = None, own: bool | None = None,
           narrow: bool | None = None, xorder: bool = False,
           wreuse: bool | None = None, l2hint: bool | None = None,
           escnext: bool | None = None) -> str:
    """kernels.cu, the wgmma wrappers for ``block_m``, kernels_large.cu and the entry point of
    one configuration (``staged``: stream-K's staged stores, default ``PERS_STAGE``; ``own``:
    the two-range epilogue keeping the own share in registers, default ``OWN_SHARE``;
    ``narrow``: 24-bit partial sums between blocks, default ``NARROW``; ``xorder``: the
    activations straight from x, no image pass, ``xorder_applies``; ``wreuse``: a tile block's
    token blocks together, default ``WREUSE``; ``l2hint``: the copies' L2 eviction hints,
    default ``L2HINT``; ``escnext``: each warp's next escape column kept, default
    ``ESCNEXT``)."""
    staged = PERS_STAGE if staged is None else staged
    own = OWN_SHARE if own is None else own
    narrow = NARROW if narrow is None else narrow
    wreuse = WREUSE if wreuse is None else wreuse
    l2hint = L2HINT if l2hint is None else l2hint
    escnext = ESCNEXT if escnext is None else escnext
    if xorder and (not a_regs or mcast):
        raise ValueError("gemm_wgl: xorder needs the A operand in registers and no multicast")
    return (("#define W12_PERS_STAGE 1\n" if staged else "")
            + ("#define W12_OWN_SHARE 1\n" if own else "")
            + ("#define W12_NARROW 1\n" if narrow else "")
            + ("#define W12_XORDER 1\n" if xorder else "")
            + ("#define W12_WREUSE 1\n" if wreuse else "")
            + ("#define W12_L2HINT 1\n" if l2hint else "")
            + ("#define W12_ESCNEXT 1\n" if escnext else "")
            + _base_source(wgmma.wrapper(block_m, "WgmmaSS", a_shared=True)
                           + wgmma.wrapper(block_m, "WgmmaRS"))
            + _entry(block_m, warpgroups, x_stages, w_stages, splits, a_regs, persist, mcast))


def _base_source(wrappers: str = "") -> str:
    """kernels.cu and kernels_large.cu (w12_permute_x, and wgl_body uninstantiated)."""
    return (cuda.SOURCE_PATH.read_text()
            + "\ntemplate <int N> struct WgmmaSS;\ntemplate <int N> struct WgmmaRS;\n"
            + wrappers + "\n" + SOURCE_PATH.read_text() + "\n")


@functools.cache
def _module(device_index: int, config: tuple[int, ...] | None, staged: bool = False,
            own: bool = False, narrow: bool = False, xorder: bool = False,
            wreuse: bool = False, l2hint: bool = False, escnext: bool = False):
    """One configuration's module, or (``None``) the module of w12_permute_x alone."""
    import cupy

    major, minor = torch.cuda.get_device_capability(device_index)
    code = (_base_source() if config is None
            else source(*config, staged=staged, own=own, narrow=narrow, xorder=xorder,
                        wreuse=wreuse, l2hint=l2hint, escnext=escnext))
    with cupy.cuda.Device(device_index):
        return cupy.RawModule(code=code,
                              options=("--std=c++17", f"--gpu-architecture=sm_{major}{minor}a"))


def permute_x(x: torch.Tensor, nchunks: int, block_m: int) -> torch.Tensor:
    """The activations as stage images (see kernels_large.cu): ``ceil(M / block_m) * nchunks``
    images of ``block_m * 128`` bytes, zeros past M and past K."""
    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    blocks = math.ceil(m / block_m)
    out = torch.empty(blocks * nchunks * block_m * 64, dtype=torch.bfloat16, device=x.device)
    if out.numel() == 0:
        return out
    func = _function(cuda._index(x.device), None)
    pairs = int(x.stride(0) % 2 == 0 and x.data_ptr() % 4 == 0)
    cuda.launch(func, (nchunks, blocks, block_m // 32), (256,),
                (cuda._ptr(x), cuda._ptr(out), m, k, x.stride(0), nchunks, block_m, pairs),
                x.device)
    return out


def _function(device_index: int, config: tuple[int, ...] | None, xorder: bool = False,
              wreuse: bool | None = None, l2hint: bool | None = None,
              escnext: bool | None = None):
    """The kernel of a configuration (``None``: w12_permute_x) on GPU ``device_index``, with the
    shared memory it launches with allowed once (stream-K's stores as ``PERS_STAGE`` says
    now, the two-range epilogue as ``OWN_SHARE`` does, the partial sums as ``NARROW``, the
    blocks' order as ``wreuse``, default ``WREUSE``, does; ``xorder``: its form that copies
    the activations straight from x; ``l2hint``: the copies' L2 hints, default ``L2HINT``;
    ``escnext``: the next escape column kept, default ``ESCNEXT``)."""
    return _function_of(device_index, config,
                        bool(PERS_STAGE) and config is not None and bool(config[6]),
                        bool(OWN_SHARE) and config is not None and _own_applies(config),
                        bool(NARROW) and config is not None and _narrow_applies(config,
                                                                               OWN_SHARE),
                        xorder, _wreuse_applies(config, WREUSE if wreuse is None else wreuse),
                        bool(L2HINT if l2hint is None else l2hint) and config is not None,
                        bool(ESCNEXT if escnext is None else escnext) and config is not None
                        and bool(config[5]))


def _wreuse_applies(config: tuple[int, ...] | None, wreuse: bool) -> bool:
    """Whether ``wreuse`` changes a configuration's kernel: not with multicast (its pairs are
    neighbouring tile blocks)."""
    return bool(wreuse) and config is not None and not config[7]


def _own_applies(config: tuple[int, ...]) -> bool:
    """Whether ``OWN_SHARE``'s epilogue exists for a configuration: two K ranges, no
    multicast."""
    return config[4] == 2 and not config[7]


def _narrow_applies(config: tuple[int, ...], own: bool) -> bool:
    """Whether ``NARROW`` changes a configuration's kernel: stream-K, or the own-share
    epilogue."""
    return bool(config[6]) or (bool(own) and _own_applies(config))


@functools.cache
def _function_of(device_index: int, config: tuple[int, ...] | None, staged: bool,
                 own: bool = False, narrow: bool = False, xorder: bool = False,
                 wreuse: bool = False, l2hint: bool = False, escnext: bool = False):
    import cupy

    if config is None:
        return _module(device_index, None).get_function("w12_permute_x")
    func = _module(device_index, config, staged, own, narrow, xorder, wreuse,
                   l2hint, escnext).get_function(
        kernel_name(*config))
    with cupy.cuda.Device(device_index):
        cuda.allow_shared_memory(func, shared_bytes(*config[:4], *config[5:7],
                                                     splits=config[4]))
    return func


# (address, tiles, columns, tiles a box) -> the encoded tensor map (the map depends on nothing
# else, so a later tensor at the same address and shape may share it)
_MAPS: dict[tuple[int, int, int, int], bytes] = {}
_NO_MAP = bytes(128)


def _encode_tiled(address: int, dims: tuple[int, ...], strides: tuple[int, ...],
                  box: tuple[int, ...], element: int = 8, swizzle: bool = False) -> bytes:
    """A CUtensorMap (128 bytes) from the driver's cuTensorMapEncodeTiled: unsigned elements of
    ``element`` bytes (8 or 2), ``dims`` innermost first, ``strides`` in bytes for dims 1.., no
    interleave, the 128-byte swizzle if ``swizzle`` (else none), 256-byte L2 promotion,
    out-of-range elements read as zeros."""
    import ctypes

    rank = len(dims)
    out = (ctypes.c_uint8 * 128)()
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    rc = cuda.driver().cuTensorMapEncodeTiled(
        ctypes.byref(out), {8: 4, 2: 1}[element], rank, ctypes.c_void_p(address),
        (u64 * rank)(*dims), (u64 * (rank - 1))(*strides), (u32 * rank)(*box),
        (u32 * rank)(*([1] * rank)), 0, 3 if swizzle else 0, 3, 0)  # L2 256 B, zeros
    if rc != 0:
        raise RuntimeError(f"gemm_wgl: cuTensorMapEncodeTiled failed ({rc}) for dims {dims}, "
                           f"strides {strides}, box {box}")
    return bytes(out)


def _weight_map(chunks: torch.Tensor, tiles: int, swizzled: bool = False) -> bytes:
    """The tensor map of ``chunks`` (int32 [tiles, columns, 384], contiguous) as 8-byte words,
    192 a chunk x columns x tiles, whose box is one chunk column of ``tiles`` tiles: the bytes
    one weight stage of a block holds, in its order. ``swizzled`` (``xorder``): the same bytes
    as 16 words x 12 rows a chunk x columns x tiles with the 128-byte swizzle, so that 128-byte
    row q of the stage holds its 16-byte unit u at u ^ (q % 8)."""
    ntiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    key = (chunks.data_ptr(), ntiles, nchunks, tiles) + ((1,) if swizzled else ())
    hit = _MAPS.get(key)
    if hit is None:
        if not chunks.is_contiguous() or chunks.data_ptr() % 16:
            raise ValueError("gemm_wgl: the chunks must be contiguous and 16-byte aligned")
        if swizzled:
            hit = _encode_tiled(chunks.data_ptr(), (16, 12, nchunks, ntiles),
                                (128, 1536, nchunks * 1536), (16, 12, 1, tiles), swizzle=True)
        else:
            hit = _encode_tiled(chunks.data_ptr(), (192, nchunks, ntiles),
                                (1536, nchunks * 1536), (192, 1, tiles))
        _MAPS[key] = hit
    return hit


def xorder_applies(x: torch.Tensor, a_regs: int, mcast: int) -> bool:
    """Whether ``gemm_wgl(xorder=True)`` can copy the activations straight from ``x`` (the
    tensor copy's rules: a 16-byte aligned start and row stride, unit column stride): the A
    operand in registers, no multicast, weight stages by tensor copy (``WEIGHT_MAP``).
    Elsewhere the call takes the image pass."""
    return (bool(a_regs) and not mcast and bool(WEIGHT_MAP) and x.dtype == torch.bfloat16
            and x.dim() == 2 and x.stride(1) == 1 and (x.stride(0) * 2) % 16 == 0
            and x.data_ptr() % 16 == 0)


@functools.lru_cache(maxsize=64)
def _x_map_at(address: int, m: int, k: int, ld: int, block_m: int) -> bytes:
    return _encode_tiled(address, (k, m), (ld * 2,), (64, block_m), element=2, swizzle=True)


def _x_map(x: torch.Tensor, block_m: int) -> bytes:
    """The tensor map of x (BF16 [M, K] as 2-byte elements) whose box is 64 columns of
    ``block_m`` rows with the 128-byte swizzle: one activation stage, in the layout the image
    pass writes (kernels_large.cu), but in x's own K order (``xorder``)."""
    return _x_map_at(x.data_ptr(), int(x.shape[0]), int(x.shape[1]), int(x.stride(0)), block_m)


def tail_config(config: tuple[int, ...], tail: int) -> tuple[int, ...]:
    """The configuration (``kernel_name``'s arguments) of the tail launch of ``config`` (one K
    range, not persistent): the same with K in ``tail`` ranges, or (``tail`` 1) stream-K."""
    return (*config[:6], 1, *config[7:]) if tail == 1 else (*config[:4], int(tail), *config[5:])


def tail_plan(tile_blocks: int, token_blocks: int, wave: int, tail: int) -> int | None:
    """Where a ``tail`` launch starts (``gemm_wgl``): the tile blocks before it fill whole waves
    of ``wave`` blocks (one K range, every token block), the ones from it on run with ``tail``
    K ranges so that their blocks fit one wave (``tail`` 1: as stream-K over the whole wave);
    None where that does not apply (no whole wave, no partial one, or a partial wave too large
    to split ``tail`` ways in one wave)."""
    units = tile_blocks * token_blocks
    first = (units // wave) * wave // token_blocks  # tile blocks of the whole waves
    rest = (tile_blocks - first) * token_blocks
    if tail < 1 or first == 0 or rest == 0 or rest * tail > wave:
        return None
    return first


def tail_start(ntiles: int, m: int, block_m: int, warpgroups: int, x_stages: int,
               w_stages: int, a_regs: int, tail: int, sms: int,
               wave: int | None = None) -> int | None:
    """``tail_plan`` for a one-range configuration on ``ntiles`` 16-row tiles and ``m`` rows,
    a wave being ``sms`` multiprocessors' blocks (``wave`` if given)."""
    wave = wave or sms * blocks_per_sm(block_m, warpgroups, x_stages, w_stages, a_regs)
    return tail_plan(math.ceil(ntiles / (4 * warpgroups)), math.ceil(m / block_m), wave, tail)


def _segment_ends(b: int, cuts: list[int], nchunks: int, ready: list[float],
                  cost: dict, staged: bool) -> tuple[float, float | None]:
    """The model's end of stream-K block ``b`` (steps ``cuts[b]`` .. ``cuts[b + 1]`` - 1, the
    kernel's segments: a piece, whole units, an owner's unit) in steps from its start, and when
    its piece is ready (None: it has none). An owner reads its unit's pieces (blocks b + 1 ..,
    whose ``ready`` is known) in block order, each once ready."""
    q0, q1 = cuts[b], cuts[b + 1]
    u0, ul = q0 // nchunks, (q1 - 1) // nchunks
    t, ready_at = 0.0, None
    for u in range(u0, ul + 1):
        lo = q0 - u * nchunks if u == u0 else 0
        hi = q1 - u * nchunks if u == ul else nchunks
        t += (cost["switch"] if u > u0 else 0.0) + (hi - lo)
        if lo > 0:  # a piece (only ever the first segment)
            t += cost["piece"]
            ready_at = t
        elif hi < nchunks:  # the owner of a unit cut after this block (the last segment)
            bb = b
            while True:
                bb += 1
                t = max(t, ready[bb]) + cost["read"]
                if cuts[bb + 1] >= (u + 1) * nchunks:
                    break
            t += cost["staged_store"] if staged else cost["store"]
        else:  # a whole unit
            t += cost["staged_store"] if (u == ul and staged) else cost["store"]
    return t, ready_at


def stream_k_model(cuts: list[int] | tuple[int, ...], nchunks: int, cost: dict | None = None,
                   staged: bool = True) -> list[float]:
    """The modelled end, in main-loop steps from the start, of each block of a stream-K launch
    cut at ``cuts`` (``stream_k_cuts``'s model; ``cost``: default ``STREAM_K_COST``)."""
    cost = STREAM_K_COST if cost is None else cost
    cuts = list(cuts)
    blocks = len(cuts) - 1
    ready, ends = [0.0] * (blocks + 1), [0.0] * blocks
    for b in range(blocks - 1, -1, -1):
        ends[b], r = _segment_ends(b, cuts, nchunks, ready, cost, staged)
        ready[b] = 0.0 if r is None else r
    return ends


def _cuts_within(limit: float, steps: int, nchunks: int, blocks: int, cost: dict,
                 staged: bool) -> list[int] | None:
    """Cuts under which every block ends by ``limit`` in the model, or None: from the last
    block back, each takes the most steps that keep it, and the owner that will read its piece
    (its later pieces of the unit read after it), within the limit."""
    cuts = [0] * (blocks + 1)
    cuts[blocks] = steps
    ready = [0.0] * (blocks + 1)
    for b in range(blocks - 1, -1, -1):
        q1 = cuts[b + 1]
        first = 0 if b == 0 else max(b, q1 - int(limit))  # (blocks before it: a step each)
        last = 0 if b == 0 else q1 - 1
        for q0 in range(first, last + 1):
            cuts[b] = q0
            end, r = _segment_ends(b, cuts, nchunks, ready, cost, staged)
            if r is not None:  # its unit's owner reads it, then the later pieces, then stores
                uend = (q0 // nchunks + 1) * nchunks
                later = next((j for j in range(b + 1, blocks) if cuts[j] >= uend), blocks) - b - 1
                end = max(end, r + cost["read"] * (1 + later)
                          + (cost["staged_store"] if staged else cost["store"]))
            if end <= limit:
                ready[b] = 0.0 if r is None else r
                break
        else:
            return None
    return cuts


@functools.cache
def _stream_k_cuts(steps: int, nchunks: int, blocks: int, weighted: bool, staged: bool,
                   cost: tuple) -> tuple[int, ...]:
    equal = [steps * b // blocks for b in range(blocks + 1)]
    if not weighted:
        return tuple(equal)
    costs = dict(cost)
    lo, hi = steps / blocks, max(stream_k_model(equal, nchunks, costs, staged))
    best = None
    while hi - lo > 0.05:  # the least limit that the backward pass meets
        mid = (lo + hi) / 2
        cuts = _cuts_within(mid, steps, nchunks, blocks, costs, staged)
        if cuts is None:
            lo = mid
        else:
            hi, best = mid, cuts
    return tuple(equal if best is None else best)


def stream_k_cuts(steps: int, nchunks: int, blocks: int, weighted: bool | None = None,
                  staged: bool | None = None, cost: dict | None = None,
                  narrow: bool | None = None) -> tuple[int, ...]:
    """Where a stream-K launch of ``blocks`` blocks cuts its ``steps`` (unit, chunk column)
    steps, units of ``nchunks``: block b takes ``cuts[b]`` .. ``cuts[b + 1]`` - 1. Equal shares
    (``weighted`` False), or (default ``STREAM_K_WEIGHTED``) the cuts that minimise the latest
    block's end in ``stream_k_model``, found by bisecting on that end: from the last block
    back, each takes the most steps that keep both it and the owner that will read its piece
    (then the unit's later pieces, then its stores) within that end. Increasing, every block
    at least one step; cached. ``narrow`` (default ``NARROW``): the pieces are 24-bit sums, so
    their write and read cost ``NARROW_BYTES`` of the costs' float32 ones."""
    if not 1 <= blocks <= min(steps, MAX_STREAM_K_BLOCKS):
        raise ValueError(f"stream_k_cuts: {blocks} blocks for {steps} steps (1 .. "
                         f"min(steps, {MAX_STREAM_K_BLOCKS}))")
    if steps >= 2**31:  # (the kernel counts steps in 32-bit integers)
        raise ValueError(f"stream_k_cuts: {steps} steps, more than a stream-K launch counts")
    weighted = STREAM_K_WEIGHTED if weighted is None else weighted
    staged = PERS_STAGE if staged is None else staged
    cost = dict(STREAM_K_COST if cost is None else cost)
    if NARROW if narrow is None else narrow:
        cost["piece"] *= NARROW_BYTES
        cost["read"] *= NARROW_BYTES
    return _stream_k_cuts(steps, nchunks, blocks, bool(weighted), bool(staged),
                          tuple(sorted(cost.items())))


@functools.cache
def _cuts_param(cuts: tuple[int, ...]) -> bytes:
    """``cuts`` as the kernel's StreamKCuts (int32, padded to MAX_STREAM_K_BLOCKS + 1)."""
    return struct.pack(f"<{MAX_STREAM_K_BLOCKS + 1}i",
                       *cuts, *([0] * (MAX_STREAM_K_BLOCKS + 1 - len(cuts))))


# (device index, stream, blocks, floats a block) -> stream-K's work memory and flags; kept for
# the process's life, as a CUDA graph that captured a call holds their addresses
_STREAM_K: dict[tuple[int, int, int, int], tuple[torch.Tensor, torch.Tensor]] = {}


def _stream_k_memory(device: torch.device, blocks: int,
                     floats: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 partial sums (``floats`` a block) and the piece flags of ``blocks`` blocks
    of the stream-K kernel on the current stream: the flags start at zero and every call
    leaves them at zero (each owner clears those it waited on). One set per stream, so that
    calls on two streams at once do not share them."""
    index = cuda._index(device)
    stream = torch.cuda.current_stream(index).cuda_stream
    key = (index, stream, blocks, floats)
    if key not in _STREAM_K:
        _STREAM_K[key] = (torch.empty(blocks * floats, dtype=torch.float32, device=device),
                          torch.zeros(blocks, dtype=torch.int32, device=device))
    return _STREAM_K[key]


def gemm_wgl(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor,
             esc_rowptr: torch.Tensor, esc_row: torch.Tensor, esc_col: torch.Tensor,
             esc_val: torch.Tensor, esc_delta: torch.Tensor, esc_order: torch.Tensor,
             esc_entry: torch.Tensor, esc_fix: torch.Tensor,
             bias: torch.Tensor | None, n: int, k: int, *, block_m: int = 128,
             warpgroups: int = 2, x_stages: int = 4, w_stages: int = 6, splits: int = 1,
             a_regs: int = 0, persist: int = 0, tail: int = 0, mcast: int = 0,
             out: torch.Tensor | None = None, pdl: bool | None = None,
             grid_cap: int | None = None, wave: int | None = None,
             staged: bool | None = None, weighted: bool | None = None,
             cuts: tuple[int, ...] | None = None, own: bool | None = None,
             narrow: bool | None = None, xorder: bool = False,
             wreuse: bool | None = None, l2hint: bool | None = None,
             escnext: bool | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for BF16 ``x [M, K]``, any M: blocks of ``64 * warpgroups`` weight
    rows x ``block_m`` activation rows, ``x_stages`` activation and ``w_stages`` chunk-word
    stages in shared memory, ``splits`` K ranges per cluster, the decoded weights as the MMA's
    register operand with ``a_regs`` 1 (else from shared memory), and with ``a_regs`` 2 also a
    producer warpgroup that gives its registers to the MMA warpgroups; ``a_regs`` 3 (with
    ``warpgroups`` 1): that producer warpgroup and two MMA warpgroups on the block's 64 rows,
    every other column each, their sums added in a fixed order. ``persist`` 1 (with
    ``a_regs`` 2 and one K range): stream-K, one block a multiprocessor (``grid_cap`` blocks if
    given), each taking the share of all (unit, chunk column) steps that ``stream_k_cuts`` cuts
    (``weighted``, ``cuts`` below), the units cut between
    blocks added in a fixed order (see kernels_large.cu). ``pdl`` (default ``PDL``): the GEMM
    launched with programmatic dependent launch after its image pass, so that its start
    (barriers, escape ranges, the first weight copies) overlaps that pass; the same bits either
    way. ``tail`` S (with one K range, not persistent): where the blocks fill some whole waves
    and part of one more (``tail_plan``), the tile blocks of that last part run in a second
    launch with K in S ranges (clusters of S), so that its blocks spread over the
    multiprocessors the first launch leaves idle (docs/PERF_GEMM.md #64); ``tail`` 1 (with
    ``a_regs`` 2): that launch is stream-K over those tile blocks' units. Elsewhere it changes
    nothing. Deterministic either way; the tail's rows are summed in S ranges, so their bits
    differ from the one-launch kernel's. ``wave``: the blocks a wave holds (default: the
    multiprocessors times ``blocks_per_sm``; the tests set it to split small shapes).
    ``mcast`` 1 (with ``a_regs`` 2 or 3, not stream-K, no tail): the blocks of neighbouring
    tile blocks in pairs, each block copying half of every activation stage into both
    (multicast), so that a multiprocessor receives half the activation bytes per MMA; the same
    bits as without with ``narrow`` off (its blocks hand over float32; an odd last tile block
    gets a partner that stores nothing).
    ``staged`` (default ``PERS_STAGE``; stream-K launches only): a block's last segment stores
    its outputs through a BF16 staging tile in shared memory; the same bits either way.
    ``own`` (default ``OWN_SHARE``; launches with two K ranges, not ``mcast``): each block
    keeps its share of tokens in its accumulators and stores it through a BF16 staging tile,
    where the partial tile is otherwise written whole and read back; the same bits either
    way. ``narrow`` (default ``NARROW``; stream-K, and the two-range launches
    ``own`` applies to): the partial sums one block hands another as 24-bit truncated floats;
    the bits differ from float32's (each deterministic, within the error budget).
    ``weighted`` (default ``STREAM_K_WEIGHTED``; stream-K launches only): the blocks' shares
    from ``stream_k_cuts``'s model rather than equal; ``cuts`` (tests): the first stream-K
    launch's cuts as given (increasing from 0 to all its steps, one entry a block and one
    more). ``xorder`` (where ``xorder_applies``; elsewhere the image pass): the activations
    copied straight from x, no image pass, each chunk column summed in x's K order (so the bits
    differ from the image pass's; each deterministic, within the error budget), the GEMM then
    launched without programmatic dependent launch (no pass before it). ``wreuse`` (default
    ``WREUSE``; not with ``mcast``): the token blocks of one tile block launched next to each
    other, and stream-K's units ordered token block outermost, so that they read the tile
    block's columns at about the same time (the same bits as without, except stream-K's).
    ``l2hint`` (default ``L2HINT``): the bulk copies with L2 eviction hints, activations kept,
    weights evicted first (the same bits either way). ``escnext`` (default ``ESCNEXT``; the
    decoded weights in registers): each warp keeps its next escape column, so that a column
    without escapes skips the escape check (the same bits either way).
    """
    config = (block_m, warpgroups, x_stages, w_stages, splits, int(a_regs), int(persist),
              int(mcast))
    check_config(*config)
    if tail and (splits != 1 or persist or mcast or tail not in SPLITS):
        raise ValueError(f"gemm_wgl: tail={tail} needs one K range, no stream-K, no multicast "
                         "and 1-4 ranges for the tail")
    tail_cfg = tail_config(config, tail)
    if tail:
        check_config(*tail_cfg)
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    ntiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    xo = bool(xorder) and xorder_applies(x, a_regs, mcast)
    xp = x if xo else permute_x(x, nchunks, block_m)
    args = (cuda._ptr(chunks), cuda._ptr(xp), cuda._ptr(x), x.stride(0),
            cuda._ptr(out), cuda._ptr(scale), cuda._ptr(esc_rowptr), cuda._ptr(esc_row),
            cuda._ptr(esc_col), cuda._ptr(esc_val), cuda._ptr(esc_delta), cuda._ptr(esc_order),
            cuda._ptr(esc_entry), cuda._ptr(esc_fix),
            cuda._ptr(bias), m, n, ntiles, nchunks)
    extra = (0, 0)  # stream-K's work and flags (persist)
    tile_blocks, token_blocks = math.ceil(ntiles / (4 * warpgroups)), math.ceil(m / block_m)
    grid = (tile_blocks + (tile_blocks % 2 if mcast else 0), token_blocks, splits)
    sms = (torch.cuda.get_device_properties(x.device).multi_processor_count
           if persist or tail else 0)
    stores = PERS_STAGE if staged is None else bool(staged)  # (stream-K's, for the model)

    def schedule(units: int, blocks: int) -> bytes:  # a stream-K launch's cuts (cached)
        steps = units * nchunks
        if cuts is None or not persist:  # (stream_k_cuts' cuts are valid by construction)
            return _cuts_param(stream_k_cuts(steps, nchunks, blocks, weighted, stores,
                                             narrow=narrow))
        sched = tuple(cuts)
        if (len(sched) != blocks + 1 or sched[0] != 0 or sched[-1] != steps
                or any(b <= a for a, b in zip(sched[:-1], sched[1:], strict=True))):
            raise ValueError(f"gemm_wgl: cuts {sched} do not cut {steps} steps for {blocks} "
                             "blocks (increasing from 0, one step a block at least)")
        return _cuts_param(sched)

    if persist:
        grid = (min(grid[0] * grid[1] * nchunks, min(grid_cap or sms, sms),
                    MAX_STREAM_K_BLOCKS), 1, 1)
        work, flags = _stream_k_memory(x.device, grid[0], block_m * 64 * warpgroups)
        extra = (cuda._ptr(work), cuda._ptr(flags))
    wmap = (_weight_map(chunks, 4 * warpgroups, xo), 1) if WEIGHT_MAP else (_NO_MAP, 0)
    wmap += (_x_map(x, block_m) if xo else _NO_MAP,)  # (then the kernel's xmap)
    pdl = (PDL if pdl is None else pdl) and not xo
    first = None
    if tail:
        first = tail_start(ntiles, m, block_m, warpgroups, x_stages, w_stages, a_regs, tail,
                           sms, wave)
    launches = [(config, grid, extra + wmap + (0,)
                 + ((schedule(tile_blocks * token_blocks, grid[0]),) if persist else ()))]
    if first is not None:
        rest = (tile_blocks - first, token_blocks, tail)
        tail_extra = (0, 0) + wmap + (first,)
        if tail == 1:  # stream-K over the units of the tile blocks from ``first`` on
            units = rest[0] * token_blocks
            rest = (min(units * nchunks, sms, MAX_STREAM_K_BLOCKS), 1, 1)
            work, flags = _stream_k_memory(x.device, rest[0], block_m * 64 * warpgroups)
            tail_extra = ((cuda._ptr(work), cuda._ptr(flags)) + wmap + (first,)
                          + (schedule(units, rest[0]),))
        launches = [(config, (first, token_blocks, 1), extra + wmap + (0,)),
                    (tail_cfg, rest, tail_extra)]
    wr = WREUSE if wreuse is None else wreuse
    hint = bool(L2HINT if l2hint is None else l2hint)
    enx = bool(ESCNEXT if escnext is None else escnext)
    for cfg, grd, ext in launches:
        index = cuda._index(x.device)
        if _wreuse_applies(cfg, wr) and not cfg[6]:  # (the kernel's SWAP: token blocks as x)
            grd = (grd[1], grd[0], grd[2])
        if staged is None and own is None and narrow is None:
            func = _function(index, cfg, xo, wr, hint, enx)
        else:
            st = PERS_STAGE if staged is None else staged
            ow = OWN_SHARE if own is None else own
            nw = NARROW if narrow is None else narrow
            func = _function_of(index, cfg, bool(st) and bool(cfg[6]),
                                bool(ow) and _own_applies(cfg),
                                bool(nw) and _narrow_applies(cfg, bool(ow)), xo,
                                _wreuse_applies(cfg, wr), hint, enx and bool(cfg[5]))
        smem = shared_bytes(*cfg[:4], *cfg[5:7], splits=cfg[4])
        cuda.launch(func, grd, (threads(warpgroups, a_regs),), args + ext, x.device, smem,
                    pdl=pdl)
    return out
