"""The large-M W12 GEMM on Hopper's warpgroup MMA (``kernels.cu``), for the rows beyond the
small-M path (prefill, large batches).

Decode + cuBLAS pays a BF16 write and re-read of the weight on top of cuBLAS's own time. Here
a producer copies each chunk column's words (one tensor copy a stage) and activations into
shared-memory stages, every warp decodes its 16-row tile straight into the registers of the
MMA's A operand, and the block's warpgroups multiply them with the activations shared by all
of them (``wgmma``). A small kernel first writes the activations as the images of those stages,
in the K order of the weight fragments, so that one bulk copy per column fills a stage; the
GEMM is launched with programmatic dependent launch after it, so that its blocks' start
overlaps that pass. Escapes that fit the decoded tile's scale are written into the fragments
(``esc_entry``), so that the epilogue corrects only the others (inf, NaN, out-of-range).
Deterministic; not batch-invariant (the dispatch uses it above the rows where that is
promised). Compute capability 9.0 (``sm_90a``) only.

A launch configuration is a ``WglConfig`` (one per table entry): block shape and stages, K
ranges of a thread-block cluster (``splits``, added in a fixed order through distributed
shared memory, the two-range case with each block keeping its own share of tokens), the A
operand's mode (``a_regs``), stream-K (``persist``, ``stream_k.py``), a tail launch for the
partial last wave (``tail``), and three options a table entry turns on where it measured a
win: ``xorder`` (the activations copied straight from x, no image pass), ``wreuse`` (the
token blocks of one tile block launched together) and ``l2hint`` (L2 eviction hints on the
copies). Partial sums handed from one block to another (stream-K's pieces, the two-range
push) go as 24-bit truncated floats.
"""

from __future__ import annotations

import ctypes
import functools
import math
import struct
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from w12_kernels.gemm.cuda import runtime
from w12_kernels.gemm.large.stream_k import MAX_STREAM_K_BLOCKS, stream_k_cuts

SOURCE_PATH = Path(__file__).with_name("kernels.cu")
BLOCK_M = (64, 128, 192, 256)  # activation rows per block (the wgmma N)
WARPGROUPS = (1, 2)  # 64 weight rows each
SPLITS = (1, 2, 3, 4)  # K ranges, one per block of a cluster
A_REGS = (1, 2, 3)
SHARED_LIMIT = 227 * 1024  # the shared memory a block may have on Hopper


@dataclass(frozen=True)
class WglConfig:
    """One launch configuration of ``gemm_wgl``."""

    block_m: int = 256  # activation rows per block (the wgmma N)
    warpgroups: int = 2  # MMA warpgroups of 64 weight rows each
    x_stages: int = 5  # activation stages in shared memory
    w_stages: int = 5  # chunk-word stages in shared memory
    splits: int = 1  # K ranges, one per block of a cluster (1, 1, splits)
    # the decoded weights as the MMA's register operand, with 1: a producer warp; 2: a
    # producer warpgroup that gives its registers to the two MMA warpgroups; 3: that, with
    # warpgroups 1: two MMA warpgroups on the 64 rows, every other column each
    a_regs: int = 2
    persist: bool = False  # stream-K (a_regs 2, one K range): one block a multiprocessor
    tail: int = 0  # one K range, not persist: the tile blocks past the last whole wave run in
    # a second launch with K in this many ranges (1: as stream-K)
    xorder: bool = False  # the activations straight from x, no image pass (where x allows)
    wreuse: bool = False  # a tile block's token blocks launched next to each other
    l2hint: bool = False  # L2 eviction hints: activations kept, weights evicted first

    @property
    def threads(self) -> int:
        """The MMA warpgroups plus a producer warp, or (``a_regs`` 2, 3) warpgroup."""
        if self.a_regs == 3:
            return 384
        return 128 * self.warpgroups + (128 if self.a_regs == 2 else 32)

    @property
    def shared_bytes(self) -> int:
        """The activation stages, the chunk-word stages and the stages' full and empty
        mbarriers (``persist``: also a segment's row data, 16 bytes a weight row, its warps'
        first escape batches, 8 bytes an entry and 8 a warp, and their four mbarriers), or
        (after the main loop) the float32 partial tile, with 2 K ranges also the inbox of the
        other rank's sums of this block's share of tokens and its mbarrier, whichever is
        larger, plus what aligning them to 1024 bytes (the swizzle atom) may take."""
        main = (self.x_stages * self.block_m * 128 + self.w_stages * 4 * self.warpgroups * 1536
                + 16 * (self.x_stages + self.w_stages)
                + (64 * self.warpgroups * 16 + 4 * self.warpgroups * 36 * 8 + 32
                   if self.persist else 0))
        row = (64 * self.warpgroups + 4) * 4  # bytes of a token's partial sums
        tile = self.block_m * row
        if self.splits == 2:
            tile += math.ceil(self.block_m / 2) * row + 8
        return 1024 + max(main, tile)

    @property
    def blocks_per_sm(self) -> int:
        """2 where the shared memory of two blocks fits a multiprocessor (228 KiB, 1 KiB of it
        reserved per block) and the accumulators (``block_m / 2`` registers per thread) leave
        room under the register cap of two blocks (each of the 4 quarters of a multiprocessor
        holds 16,384 registers for its share of the two blocks' warps); the kernel then caps
        them."""
        if self.a_regs >= 2:  # the register split of setmaxnreg is made for one block
            return 1
        one = replace(self, persist=False).shared_bytes
        warps = 2 * self.threads // 32
        cap = 16384 // (32 * math.ceil(warps / 4)) // 8 * 8
        fits = self.block_m // 2 + 64 <= cap
        return 2 if fits and 2 * (one + 1024) <= 228 * 1024 else 1

    @property
    def kernel_name(self) -> str:
        return (f"w12_wgl_{self.block_m}_{self.warpgroups}_{self.x_stages}_{self.w_stages}_"
                f"{self.splits}" + ("_r", "_rp", "_ri")[self.a_regs - 1]
                + ("_ps" if self.persist else "") + ("_xo" if self.xorder else "")
                + ("_wr" if self.wreuse else "") + ("_l2" if self.l2hint else ""))

    def tail_config(self) -> WglConfig:
        """The configuration of the tail launch: K in ``tail`` ranges, or (1) stream-K."""
        if self.tail == 1:
            return replace(self, persist=True, tail=0)
        return replace(self, splits=self.tail, tail=0)

    def check(self) -> None:
        """ValueError unless the kernel has this configuration (and its tail's)."""
        if (self.block_m not in BLOCK_M or self.warpgroups not in WARPGROUPS
                or self.splits not in SPLITS or not 3 <= self.x_stages <= 8
                or not 2 <= self.w_stages <= 16 or self.a_regs not in A_REGS
                or (self.a_regs == 2 and self.warpgroups != 2)  # setmaxnreg's split: for two
                or (self.a_regs == 3 and self.warpgroups != 1)  # two MMA warpgroups on 64 rows
                or (self.persist and (self.a_regs != 2 or self.splits != 1))
                or self.shared_bytes > SHARED_LIMIT
                or (self.tail and (self.splits != 1 or self.persist or self.tail not in SPLITS))):
            raise ValueError(f"gemm_wgl: bad configuration {self}")
        if self.tail:
            self.tail_config().check()


def available() -> bool:
    return runtime.available() and torch.cuda.get_device_capability()[0] == 9


def _entry(cfg: WglConfig) -> str:
    """The kernel's entry point for ``cfg``: its launch bounds, its cluster and its
    parameters, calling ``wgl_body`` with the configuration as template arguments."""
    cluster = f" __cluster_dims__(1, 1, {cfg.splits})" if cfg.splits > 1 else ""
    flags = ", ".join("true" if v else "false" for v in (cfg.xorder, cfg.wreuse, cfg.l2hint))
    return (
        f'extern "C" __global__ void __launch_bounds__({cfg.threads}, {cfg.blocks_per_sm})'
        f"{cluster}\n{cfg.kernel_name}(\n"
        "    const Words4* __restrict__ chunks, const bf16_t* __restrict__ xp,\n"
        "    const bf16_t* __restrict__ x, int ldx, bf16_t* __restrict__ y,\n"
        "    const float* __restrict__ scale, const int* __restrict__ rowptr,\n"
        "    const int* __restrict__ esc_col, const bf16_t* __restrict__ esc_val,\n"
        "    const float* __restrict__ esc_delta, const uint2* __restrict__ esc_entry,\n"
        "    const int* __restrict__ esc_fix, const bf16_t* __restrict__ bias, int M,\n"
        "    int n_rows, int ntiles, int nchunks, float* __restrict__ work,\n"
        "    unsigned* __restrict__ flags, const __grid_constant__ TensorMap wmap,\n"
        "    const __grid_constant__ TensorMap xmap, int tile_base"
        + (", const __grid_constant__ StreamKCuts cuts" if cfg.persist else "") + ") {\n"
        f"  wgl_body<{cfg.block_m}, {cfg.warpgroups}, {cfg.x_stages}, {cfg.w_stages}, "
        f"{cfg.splits}, {cfg.a_regs}, {int(cfg.persist)}, {flags}>(\n"
        "      chunks, xp, x, ldx, y, scale, rowptr, esc_col, esc_val, esc_delta, esc_entry,\n"
        "      esc_fix, bias, M, n_rows, ntiles, nchunks, work, flags, &wmap, tile_base, "
        + ("cuts.q" if cfg.persist else "nullptr") + ", &xmap);\n}\n")


def source(cfg: WglConfig) -> str:
    """``kernels.cu`` and the entry point of one configuration (the tail of an entry is its
    own configuration, ``WglConfig.tail_config``)."""
    return SOURCE_PATH.read_text() + "\n" + _entry(replace(cfg, tail=0))


@functools.cache
def _function(device_index: int, cfg: WglConfig | None):
    """The kernel of a configuration (``None``: w12_permute_x) on GPU ``device_index``, with the
    shared memory it launches with allowed once."""
    import cupy

    if cfg is None:
        module = runtime.module(device_index, SOURCE_PATH.read_text(), arch_suffix="a")
        return module.get_function("w12_permute_x")
    func = runtime.module(device_index, source(cfg), arch_suffix="a").get_function(
        cfg.kernel_name)
    with cupy.cuda.Device(device_index):
        runtime.allow_shared_memory(func, cfg.shared_bytes)
    return func


def permute_x(x: torch.Tensor, nchunks: int, block_m: int) -> torch.Tensor:
    """The activations as stage images (see kernels.cu): ``ceil(M / block_m) * nchunks``
    images of ``block_m * 128`` bytes, zeros past M and past K."""
    m, k = x.shape
    if x.stride(1) != 1:
        x = x.contiguous()
    blocks = math.ceil(m / block_m)
    out = torch.empty(blocks * nchunks * block_m * 64, dtype=torch.bfloat16, device=x.device)
    if out.numel() == 0:
        return out
    func = _function(runtime.device_index(x.device), None)
    pairs = int(x.stride(0) % 2 == 0 and x.data_ptr() % 4 == 0)
    runtime.launch(func, (nchunks, blocks, block_m // 32), (256,),
                   (runtime.ptr(x), runtime.ptr(out), m, k, x.stride(0), nchunks, block_m,
                    pairs), x.device)
    return out


# (address, tiles, columns, tiles a box) -> the encoded tensor map (the map depends on nothing
# else, so a later tensor at the same address and shape may share it)
_MAPS: dict[tuple[int, ...], bytes] = {}
_NO_MAP = bytes(128)


def _encode_tiled(address: int, dims: tuple[int, ...], strides: tuple[int, ...],
                  box: tuple[int, ...], element: int = 8, swizzle: bool = False) -> bytes:
    """A CUtensorMap (128 bytes) from the driver's cuTensorMapEncodeTiled: unsigned elements of
    ``element`` bytes (8 or 2), ``dims`` innermost first, ``strides`` in bytes for dims 1.., no
    interleave, the 128-byte swizzle if ``swizzle`` (else none), 256-byte L2 promotion,
    out-of-range elements read as zeros."""
    rank = len(dims)
    out = (ctypes.c_uint8 * 128)()
    u64, u32 = ctypes.c_uint64, ctypes.c_uint32
    rc = runtime.driver().cuTensorMapEncodeTiled(
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


def xorder_applies(x: torch.Tensor) -> bool:
    """Whether an ``xorder`` configuration can copy the activations straight from ``x`` (the
    tensor copy's rules: a 16-byte aligned start and row stride, unit column stride);
    elsewhere the call takes the image pass."""
    return (x.dtype == torch.bfloat16 and x.dim() == 2 and x.stride(1) == 1
            and (x.stride(0) * 2) % 16 == 0 and x.data_ptr() % 16 == 0)


@functools.lru_cache(maxsize=64)
def _x_map_at(address: int, m: int, k: int, ld: int, block_m: int) -> bytes:
    return _encode_tiled(address, (k, m), (ld * 2,), (64, block_m), element=2, swizzle=True)


def _x_map(x: torch.Tensor, block_m: int) -> bytes:
    """The tensor map of x (BF16 [M, K] as 2-byte elements) whose box is 64 columns of
    ``block_m`` rows with the 128-byte swizzle: one activation stage, in the layout the image
    pass writes, but in x's own K order (``xorder``)."""
    return _x_map_at(x.data_ptr(), int(x.shape[0]), int(x.shape[1]), int(x.stride(0)), block_m)


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


def tail_start(ntiles: int, m: int, cfg: WglConfig, sms: int,
               wave: int | None = None) -> int | None:
    """``tail_plan`` for a one-range configuration on ``ntiles`` 16-row tiles and ``m`` rows,
    a wave being ``sms`` multiprocessors' blocks (``wave`` if given)."""
    wave = wave or sms * replace(cfg, splits=1, persist=False).blocks_per_sm
    return tail_plan(math.ceil(ntiles / (4 * cfg.warpgroups)), math.ceil(m / cfg.block_m), wave,
                     cfg.tail)


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
    index = runtime.device_index(device)
    stream = torch.cuda.current_stream(index).cuda_stream
    key = (index, stream, blocks, floats)
    if key not in _STREAM_K:
        runtime.check_not_capturing("W12 GEMM stream-K flags")
        _STREAM_K[key] = (torch.empty(blocks * floats, dtype=torch.float32, device=device),
                          torch.zeros(blocks, dtype=torch.int32, device=device))
    return _STREAM_K[key]


def _schedule(steps: int, nchunks: int, blocks: int, cuts: tuple[int, ...] | None) -> bytes:
    """A stream-K launch's cuts as the kernel's parameter: ``stream_k_cuts``'s, or ``cuts``
    (tests) checked."""
    if cuts is None:
        return _cuts_param(stream_k_cuts(steps, nchunks, blocks))
    sched = tuple(cuts)
    if (len(sched) != blocks + 1 or sched[0] != 0 or sched[-1] != steps
            or any(b <= a for a, b in zip(sched[:-1], sched[1:], strict=True))):
        raise ValueError(f"gemm_wgl: cuts {sched} do not cut {steps} steps for {blocks} "
                         "blocks (increasing from 0, one step a block at least)")
    return _cuts_param(sched)


def gemm_wgl(x: torch.Tensor, chunks: torch.Tensor, scale: torch.Tensor,
             esc_rowptr: torch.Tensor, esc_col: torch.Tensor, esc_val: torch.Tensor,
             esc_delta: torch.Tensor, esc_entry: torch.Tensor, esc_fix: torch.Tensor,
             bias: torch.Tensor | None, n: int, k: int, cfg: WglConfig, *,
             out: torch.Tensor | None = None, grid_cap: int | None = None,
             wave: int | None = None, cuts: tuple[int, ...] | None = None) -> torch.Tensor:
    """``x @ W.T (+ bias)`` for BF16 ``x [M, K]``, any M, with launch configuration ``cfg``:
    blocks of ``64 * warpgroups`` weight rows x ``block_m`` activation rows.

    ``persist``: one block a multiprocessor (``grid_cap`` blocks if given), each taking the
    share of all (unit, chunk column) steps that ``stream_k_cuts`` cuts (``cuts``, for tests:
    the first stream-K launch's cuts as given, increasing from 0 to all its steps), the units
    cut between blocks added in a fixed order. ``tail`` S: where the blocks fill some whole
    waves and part of one more (``tail_plan``), the tile blocks of that last part run in a
    second launch with K in S ranges (clusters of S; 1: stream-K over them), so that its
    blocks spread over the multiprocessors the first launch leaves idle; elsewhere it changes
    nothing. The tail's rows are summed in S ranges, so their bits differ from the one-launch
    kernel's (each deterministic). ``wave`` (tests): the blocks a wave holds (default: the
    multiprocessors times ``blocks_per_sm``). ``xorder`` (where ``xorder_applies``; elsewhere
    the image pass): each chunk column summed in x's K order (so the bits differ from the
    image pass's; each deterministic, within the error budget), launched without
    programmatic dependent launch (no pass before it). ``wreuse`` and ``l2hint`` change no bits
    (``wreuse``: except stream-K's, whose units are cut elsewhere).
    """
    cfg.check()
    m = x.shape[0]
    if out is None:
        out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    if m == 0 or n == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    ntiles, nchunks = int(chunks.shape[0]), int(chunks.shape[1])
    xo = cfg.xorder and xorder_applies(x)
    cfg = replace(cfg, xorder=xo)
    xp = x if xo else permute_x(x, nchunks, cfg.block_m)
    ptr = runtime.ptr
    args = (ptr(chunks), ptr(xp), ptr(x), x.stride(0), ptr(out), ptr(scale), ptr(esc_rowptr),
            ptr(esc_col), ptr(esc_val), ptr(esc_delta), ptr(esc_entry), ptr(esc_fix),
            ptr(bias), m, n, ntiles, nchunks)
    maps = (_weight_map(chunks, 4 * cfg.warpgroups, xo), _x_map(x, cfg.block_m) if xo
            else _NO_MAP)
    tile_blocks = math.ceil(ntiles / (4 * cfg.warpgroups))
    token_blocks = math.ceil(m / cfg.block_m)
    sms = (torch.cuda.get_device_properties(x.device).multi_processor_count
           if cfg.persist or cfg.tail else 0)
    floats = cfg.block_m * 64 * cfg.warpgroups  # a stream-K block's partial sums

    def stream_k(units: int, tile_base: int, cap: int, first_cuts) -> tuple:
        blocks = min(units * nchunks, cap, MAX_STREAM_K_BLOCKS)
        work, flags = _stream_k_memory(x.device, blocks, floats)
        return (blocks, 1, 1), (ptr(work), ptr(flags), *maps, tile_base,
                                _schedule(units * nchunks, nchunks, blocks, first_cuts))

    if cfg.persist:
        launches = [(cfg, *stream_k(tile_blocks * token_blocks, 0, min(grid_cap or sms, sms),
                                    cuts))]
    else:
        launches = [(cfg, (tile_blocks, token_blocks, cfg.splits), (0, 0, *maps, 0))]
    first = tail_start(ntiles, m, cfg, sms, wave) if cfg.tail else None
    if first is not None:
        tail_cfg = cfg.tail_config()
        if tail_cfg.persist:  # stream-K over the units of the tile blocks from ``first`` on
            grid, extra = stream_k((tile_blocks - first) * token_blocks, first, sms, None)
        else:
            grid, extra = (tile_blocks - first, token_blocks, cfg.tail), (0, 0, *maps, first)
        launches = [(cfg, (first, token_blocks, 1), (0, 0, *maps, 0)), (tail_cfg, grid, extra)]
    index = runtime.device_index(x.device)
    for launch_cfg, grid, extra in launches:
        if launch_cfg.wreuse and not launch_cfg.persist:  # (the kernel's SWAP)
            grid = (grid[1], grid[0], grid[2])
        func = _function(index, replace(launch_cfg, tail=0))
        runtime.launch(func, grid, (launch_cfg.threads,), args + extra, x.device,
                       launch_cfg.shared_bytes, pdl=not xo)
    return out
