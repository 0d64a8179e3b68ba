"""CPU tests of the W12 GEMM: repack/decode exactness, the torch fallback, the op registration,
and the Triton kernels under the interpreter at small awkward shapes."""

from __future__ import annotations

import interp_harness
import interp_runner
import pytest
import torch
from gemm_helpers import assert_within_budget, encoded, make_weight

from w12.errors import W12Error
from w12_kernels.gemm import decode_weight, prepare_weight, w12_linear
from w12_kernels.gemm.reference import reference_decode, reference_linear

SHAPES = [(1, 1), (1, 64), (37, 101), (70, 515), (130, 300)]


@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_repack_decodes_exactly(n, k):
    t = make_weight(n, k, seed=n * 1000 + k)
    w = encoded(t)
    assert torch.equal(decode_weight(prepare_weight(w)).view(torch.int16), t.view(torch.int16))
    assert torch.equal(reference_decode(w).view(torch.int16), t.view(torch.int16))


@pytest.mark.parametrize("m", [1, 3, 17])
@pytest.mark.parametrize("n,k", SHAPES, ids=[f"{n}x{k}" for n, k in SHAPES])
def test_fallback_matches_reference(m, n, k):
    t = make_weight(n, k, seed=m + n + k)
    w = encoded(t)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
    bias = torch.randn(n).to(torch.bfloat16) if n > 1 else None
    y = w12_linear(x, prepare_weight(w), bias)
    assert y.shape == (m, n) and y.dtype == torch.bfloat16
    # the fallback is torch BF16 on the decoded weight: the same bits
    expected = torch.nn.functional.linear(x, t, bias)
    assert torch.equal(y.view(torch.int16), expected.view(torch.int16))
    assert_within_budget(y, x, t, reference_linear(x, w, bias), bias)


def test_leading_dims_and_errors():
    t = make_weight(16, 40, seed=1)
    pw = prepare_weight(encoded(t))
    x = torch.randn(2, 3, 40).to(torch.bfloat16)
    assert w12_linear(x, pw).shape == (2, 3, 16)
    with pytest.raises(W12Error, match="bfloat16"):
        w12_linear(x.float(), pw)
    with pytest.raises(W12Error, match=r"\[\.\.\., 40\]"):
        w12_linear(x[..., :39], pw)
    with pytest.raises(W12Error, match="prepare_weight"):
        w12_linear(x, encoded(t))
    with pytest.raises(W12Error, match="bias"):
        w12_linear(x, pw, torch.zeros(15, dtype=torch.bfloat16))


def test_op_registration_and_compile():
    t = make_weight(24, 72, seed=2, escapes=False)  # opcheck compares with allclose: no NaN
    pw = prepare_weight(encoded(t))
    x = torch.randn(5, 72).to(torch.bfloat16)
    args = (x, pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row, pw.esc_col, pw.esc_val,
            pw.esc_delta, pw.esc_order, pw.esc_entry, pw.esc_fix, None, pw.n, pw.k)
    torch.library.opcheck(torch.ops.w12.linear.default, args)
    torch.library.opcheck(torch.ops.w12.linear.default, (*args, 64))  # rows kept: 64
    compiled = torch.compile(lambda a: w12_linear(a, pw), backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(x).view(torch.int16), w12_linear(x, pw).view(torch.int16))
    kept = torch.compile(lambda a: w12_linear(a, pw, invariant_rows=64), backend="aot_eager",
                         fullgraph=True)
    assert torch.equal(kept(x).view(torch.int16), w12_linear(x, pw).view(torch.int16))
    # eager calls skip the dispatcher: the same bits as the registered op
    assert torch.equal(w12_linear(x, pw).view(torch.int16),
                       torch.ops.w12.linear(*args).view(torch.int16))
    # fake tensors (shape propagation outside torch.compile) still reach the fake kernel
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        y = w12_linear(mode.from_tensor(x), pw)
    assert y.shape == (5, 24) and y.dtype == torch.bfloat16


def test_triton_path_rejects_bad_arguments():
    from w12_kernels.gemm.triton import launcher as triton_path

    pw = prepare_weight(encoded(make_weight(16, 40, seed=1)))
    x = torch.zeros(2, 40, dtype=torch.bfloat16)
    esc = (pw.esc_rowptr, pw.esc_row, pw.esc_col, pw.esc_delta)
    with pytest.raises(W12Error, match="kw must be >= 1"):
        triton_path.gemm(x, pw.chunks, pw.scale, *esc, None, 16, 40, kw=0)
    with pytest.raises(W12Error, match=r"x must be bfloat16 \[M, 40\]"):
        triton_path.gemm(x[:, :39], pw.chunks, pw.scale, *esc, None, 16, 40, kw=1)
    with pytest.raises(W12Error, match="fewer than the 17 x 40"):
        triton_path.decode(pw.chunks, pw.scale, pw.esc_row, pw.esc_col, pw.esc_val, 17, 40)


# ------------------------------------------------------------------ interpreter
# Triton reads TRITON_INTERPRET when it is imported, so the interpreted runs happen in one
# fresh process (interp_runner.py) and each case checks its own verdict.


interpreter_verdicts = interp_harness.verdicts_fixture(__file__, "interp_runner.py")


@pytest.mark.parametrize("case", interp_runner.CASE_IDS)
def test_interpreted_kernels(interpreter_verdicts, case):
    assert interpreter_verdicts[case] == "ok", interpreter_verdicts[case]


def test_cuda_path_runs_up_to_128_rows_as_passes_of_64(monkeypatch):
    """The dispatch's routing (a GPU is not needed to check it): with the CUDA kernels, 65..128
    rows go to the small kernel in blocks of at most 64 rows written into the right rows of one
    output; more rows go where the large-M table says (the warpgroup kernel where the GPU has
    it, else decode + matmul)."""
    from w12_kernels.gemm import dispatch, table
    from w12_kernels.gemm.large import launcher as large
    from w12_kernels.gemm.layout import decode_packed
    from w12_kernels.gemm.small import launcher as small

    t = make_weight(40, 130, seed=3)
    pw = prepare_weight(encoded(t))
    weight = decode_packed(pw.chunks, pw.e0, pw.esc_rowptr, pw.esc_col, pw.esc_val, 40, 130)
    calls = []

    def fake_small(x, chunks, scale, esc_rowptr, esc_col, esc_delta, bias, n, k, *, out=None,
                   **schedule):
        calls.append((x.shape[0], out.data_ptr()))
        out.copy_(torch.nn.functional.linear(x, weight, bias))
        return out

    monkeypatch.setattr(dispatch, "backend", lambda: "cuda")
    monkeypatch.setattr(dispatch, "small_config",
                        lambda n, k, device: table.small_config(n, k, 132, table.DEFAULT_SMALL))
    monkeypatch.setattr(small, "gemm_small", fake_small)
    args = (pw.chunks, pw.scale, pw.e0, pw.esc_rowptr, pw.esc_row, pw.esc_col, pw.esc_val,
            pw.esc_delta, pw.esc_order, pw.esc_entry, pw.esc_fix, None, 40, 130)
    for m, parts in ((1, [1]), (64, [64]), (65, [64, 1]), (128, [64, 64])):
        calls.clear()
        x = torch.randn(m, 130, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        y = dispatch.linear(x, *args)
        assert [rows for rows, _ in calls] == parts, f"M={m}"
        assert calls[-1][1] == y.data_ptr() + 2 * 40 * 64 * (len(parts) - 1)
        want = torch.cat([torch.nn.functional.linear(x[s : s + 64], weight)
                          for s in range(0, m, 64)])
        assert torch.equal(y.view(torch.int16), want.view(torch.int16)), f"M={m}"
    calls.clear()
    wgl = []
    monkeypatch.setattr(large, "gemm_wgl",
                        lambda x, *a: wgl.append((x.shape[0], a[-1])) or x.new_zeros(1))
    monkeypatch.setattr(dispatch, "decode", lambda *a: weight)
    x = torch.randn(129, 130).to(torch.bfloat16)
    entry = large.WglConfig(block_m=128)
    monkeypatch.setattr(table, "large_config", lambda n, k, m, **_: entry)
    for has_wgl in (True, False):
        monkeypatch.setattr(dispatch, "_has_wgl", lambda h=has_wgl: h)
        y = dispatch.linear(x, *args)
    assert calls == [] and wgl == [(129, entry)]  # decode + matmul the second time
    monkeypatch.setattr(table, "large_config", lambda n, k, m, **_: None)  # decode + cuBLAS
    monkeypatch.setattr(dispatch, "_has_wgl", lambda: True)
    y2 = dispatch.linear(x, *args)
    assert len(wgl) == 1
    want = torch.nn.functional.linear(x, weight)
    for got in (y, y2):
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
