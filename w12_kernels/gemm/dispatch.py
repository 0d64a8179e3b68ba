"""The op's GPU path: pick the backend and the configuration, then launch.

Up to ``SMALL_M_MAX`` rows the decode-GEMM runs straight from the chunks (the CUDA C kernels
when CuPy can compile them, the Triton kernels otherwise), with one K split per weight shape.
With the CUDA kernels, up to ``SMALL_PASSES * SMALL_M_MAX`` rows run as consecutive passes of
at most ``SMALL_M_MAX`` rows, so every row's bits are those it gets alone (batch invariance up
to 128 rows, which verifying a draft tree of up to 128 nodes needs), or as one pass of the
warpgroup-MMA kernel with the same bits where the table has a schedule for it
(``SmallConfig.one_pass``). Inside ``invariant_rows(64)`` (the engine's prefill, where no row
has to match another call's) 65..128 rows take the large-M path instead, 1.4-1.7x as fast.
Above that (above ``SMALL_M_MAX`` with the Triton kernels) the table (``table.large_config``)
picks per weight shape and M the warpgroup-MMA kernel (``large/``; Hopper, CUDA backend) or
decode to BF16 + cuBLAS; where the chosen kernel cannot run, decode + cuBLAS. So a GPU other
than Hopper, or one without CuPy, runs its large-M rows as decode + cuBLAS.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from w12_kernels.gemm import table
from w12_kernels.gemm.cuda import runtime
from w12_kernels.gemm.large import launcher as large_launcher
from w12_kernels.gemm.small import launcher as small_launcher
from w12_kernels.gemm.table import SMALL_M_MAX

SMALL_PASSES = 2
ONE_PASS_ROWS = SMALL_PASSES * SMALL_M_MAX  # the block rows of ``SmallConfig.one_pass``


@functools.cache
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def small_config(n: int, k: int, device: torch.device) -> table.SmallConfig:
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _small_config(n, k, index)


@functools.cache
def _small_config(n: int, k: int, index: int) -> table.SmallConfig:
    return table.small_config(n, k, _num_sms(index), table.small_rule(table.gpu_key(index)))


def backend() -> str:
    """``"cuda"`` (NVRTC kernels), ``"triton"``, or ``"torch"`` (decode in torch + F.linear)."""
    if runtime.available():
        return "cuda"
    return "triton" if _has_triton() else "torch"


@functools.cache
def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def decode(chunks, scale, e0, esc_rowptr, esc_row, esc_col, esc_val, n, k) -> torch.Tensor:
    """The exact BF16 weight [N, K] on the GPU."""
    kind = backend()
    if kind == "cuda":
        from w12_kernels.gemm.decode import launcher as cuda_decode

        return cuda_decode.decode(chunks, scale, esc_row, esc_col, esc_val, n, k)
    if kind == "triton":
        from w12_kernels.gemm.triton import launcher as triton_launcher

        return triton_launcher.decode(chunks, scale, esc_row, esc_col, esc_val, n, k)
    from w12_kernels.gemm.layout import decode_packed

    return decode_packed(chunks, e0, esc_rowptr, esc_col, esc_val, n, k)


_INVARIANT_ROWS = contextvars.ContextVar("w12_invariant_rows",
                                         default=SMALL_PASSES * SMALL_M_MAX)


def check_invariant_rows(rows: int, where: str = "invariant_rows") -> None:
    if rows not in (SMALL_M_MAX, SMALL_PASSES * SMALL_M_MAX):
        raise ValueError(f"{where}: {rows} rows; batch invariance is kept up to "
                         f"{SMALL_M_MAX} or {SMALL_PASSES * SMALL_M_MAX} rows")


@contextlib.contextmanager
def invariant_rows(rows: int):
    """Within: calls of up to ``rows`` rows (64 or 128; 128 outside) keep batch invariance
    with the CUDA kernels. At 64, 65..128 rows run the large-M table (1.4-1.7x as fast on
    the H200) and their bits depend on the row count: for prefill, not for verification."""
    check_invariant_rows(rows)
    token = _INVARIANT_ROWS.set(rows)
    try:
        yield
    finally:
        _INVARIANT_ROWS.reset(token)


def small_rows_limit() -> int:
    """The most rows the CUDA small-M kernel passes take here (``invariant_rows``)."""
    return _INVARIANT_ROWS.get()


def _small_passes(x, chunks, scale, esc_rowptr, esc_col, esc_delta, bias, n, k, cfg):
    """The CUDA small-M kernel over consecutive blocks of at most ``SMALL_M_MAX`` rows: the
    mma.sync kernel, or where the table's layout names one (``Layout.wg``) and the GPU has it,
    the warpgroup-MMA kernel with the same K split (the same bits). More rows than that take
    one pass of the warpgroup-MMA kernel with 128-row blocks where the table names a schedule
    for it (``SmallConfig.one_pass``): the same bits again, the weight read once."""
    m = x.shape[0]
    if m > SMALL_M_MAX and cfg.one_pass is not None and _wg_fits(cfg.kw, cfg.one_pass,
                                                                ONE_PASS_ROWS):
        from w12_kernels.gemm.wgmma.launcher import gemm_wg

        depth, warpgroups, row_groups, split = cfg.one_pass
        return gemm_wg(x, chunks, scale, esc_rowptr, esc_col, esc_delta, bias, n, k,
                       kw=cfg.kw, depth=depth, n_block=ONE_PASS_ROWS, warpgroups=warpgroups,
                       row_groups=row_groups, split=split)
    out = torch.empty((m, n), dtype=torch.bfloat16, device=x.device)
    for start in range(0, m, SMALL_M_MAX):
        part = x[start : start + SMALL_M_MAX]
        lay = cfg.layout(part.shape[0])
        if lay.wg is not None and _wg_fits(cfg.kw, lay.wg, SMALL_M_MAX):
            from w12_kernels.gemm.wgmma.launcher import gemm_wg

            depth, warpgroups, row_groups, split = lay.wg
            gemm_wg(part, chunks, scale, esc_rowptr, esc_col, esc_delta, bias, n, k,
                    kw=cfg.kw, depth=depth, warpgroups=warpgroups, row_groups=row_groups,
                    split=split, out=out[start : start + part.shape[0]])
            continue
        small_launcher.gemm_small(part, chunks, scale, esc_rowptr, esc_col, esc_delta, bias, n, k,
                                  kw=cfg.kw, **lay.schedule(),
                                  out=out[start : start + part.shape[0]])
    return out


@functools.cache
def _wg_fits(kw: int, wg: tuple[int, int, int, int], rows: int) -> bool:
    """Whether this GPU has the warpgroup-MMA kernel and it has the table's schedule for this
    kw with blocks of ``rows`` activation rows (at most: the largest block up to 64), within
    the shared memory a block may have (otherwise the mma.sync kernel runs: the same bits)."""
    from w12_kernels.gemm.wgmma import launcher as wgmma

    if not wgmma.available():
        return False
    depth, warpgroups, row_groups, split = wg
    try:
        wgmma.check(kw, depth, rows, warpgroups, row_groups, split)
    except ValueError:
        return False
    limit = runtime.shared_memory_limit(torch.cuda.current_device())
    return wgmma.shared_bytes(rows, warpgroups, depth, row_groups) <= limit


@functools.cache
def _has_wgl() -> bool:
    return large_launcher.available()


def linear(x, chunks, scale, e0, esc_rowptr, esc_row, esc_col, esc_val, esc_delta, esc_order,
           esc_entry, esc_fix, bias, n, k, rows_kept=0):
    """``x @ W.T (+ bias)`` for a CUDA ``x`` [M, K] (see module docstring); ``rows_kept``
    (64 or 128) overrides ``invariant_rows`` for this call (0: the context's)."""
    m = x.shape[0]
    kind = backend()
    if kind == "cuda" and m <= (rows_kept or small_rows_limit()):
        cfg = small_config(n, k, x.device)
        return _small_passes(x, chunks, scale, esc_rowptr, esc_col, esc_delta, bias, n, k, cfg)
    if m <= SMALL_M_MAX and kind == "triton":
        cfg = small_config(n, k, x.device)
        from w12_kernels.gemm.triton import launcher as triton_launcher

        return triton_launcher.gemm(x, chunks, scale, esc_rowptr, esc_row, esc_col, esc_delta,
                                    bias, n, k, kw=cfg.kw)
    large = table.large_config(n, k, m, device_index=x.device.index)
    if large is not None and kind == "cuda" and _has_wgl():
        return large_launcher.gemm_wgl(x, chunks, scale, esc_rowptr, esc_col, esc_val,
                                       esc_delta, esc_entry, esc_fix, bias, n, k, large)
    weight = decode(chunks, scale, e0, esc_rowptr, esc_row, esc_col, esc_val, n, k)
    return torch.nn.functional.linear(x, weight, bias)
