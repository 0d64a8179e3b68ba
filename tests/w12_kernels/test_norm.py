"""Row norms (w12_kernels/norm): the torch path and the Triton kernel against the float64
reference, and the kernel's row bits independent of the row count (interpreter and GPU)."""

from __future__ import annotations

import interp_harness
import norm_interp_runner as runner
import pytest
import torch

from w12_kernels.norm import add_rms_norm, rms_norm
from w12_kernels.norm.reference import rms_norm_reference

interpreter_verdicts = interp_harness.verdicts_fixture(__file__, "norm_interp_runner.py")


@pytest.mark.parametrize("case", list(runner.CASES))
def test_interpreted_kernel(interpreter_verdicts, case):
    assert interpreter_verdicts[case] == "ok", interpreter_verdicts[case]


def test_torch_path_is_the_reference_to_rounding():
    x, y, w = runner.inputs(5, 576)
    s, normed = add_rms_norm(x, y, w, 1e-5)
    assert torch.equal(s, x + y)
    ref = rms_norm_reference(s, w, 1e-5)
    assert float((normed.double() - ref).norm() / ref.norm()) < 4e-3
    assert torch.equal(rms_norm(s, w, 1e-5), normed)


def test_the_budget_catches_a_wrong_epsilon():
    x, _, w = runner.inputs(4, 64)
    x = x * 1e-3  # small rows, where epsilon matters
    ref = rms_norm_reference(x, w, 1e-6)
    wrong = rms_norm(x, w, 1e-2)
    assert float((wrong.double() - ref).norm() / ref.norm()) > 0.05


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("d", [64, 576, 4096, 5120])
def test_gpu_rows_do_not_depend_on_the_row_count(d):
    x, y, w = (t.cuda() for t in runner.inputs(160, d, seed=d))
    full_sum, full = add_rms_norm(x, y, w, 1e-6)
    for m in (1, 2, 3, 8, 17, 64, 128):
        s, part = add_rms_norm(x[:m], y[:m], w, 1e-6)
        assert torch.equal(part.view(torch.int16), full[:m].view(torch.int16)), m
        assert torch.equal(s, full_sum[:m])
    ref = rms_norm_reference(full_sum, w, 1e-6)
    eager = w * (full_sum.float() * torch.rsqrt(full_sum.float().pow(2).mean(-1, True) + 1e-6)
                 ).to(torch.bfloat16)
    budget = 2 * float((eager.double() - ref).norm() / ref.norm())
    assert float((full.double() - ref).norm() / ref.norm()) <= budget
